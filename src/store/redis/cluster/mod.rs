//! A store on a Redis Cluster (cargo feature `cluster`): checks batched per
//! primary, each batch one call of the spread script.
//!
//! Files, bottom up, one job each:
//! - `slots.rs`: a key's hash slot (CRC16 of its `{hash tag}`), and which
//!   checks of a batch share the first one's slot.
//! - `spread.rs`: the script for a batch over several slots of one node.
//! - `nodes.rs`: the slot map, and a queue per primary.
//! - `refresh.rs`: reading the slot map again (`CLUSTER SLOTS`).
//! - `test_clock.rs`: `check_batch_at` per node (cargo feature
//!   `test-util`).
//! - `per_node.rs`: all of the above as the store's `PerNode`.
//! - `connection.rs`: where cluster connections come from (the store's
//!   clients or the application's cluster pool) and how calls use them:
//!   routed by slot, refunds on a connection that never resends.
//! - `target.rs`: `RedisStore::from_cluster_urls` and `from_cluster_pool`,
//!   the builder's `cluster` and `cluster_pool`, and the cluster client.
//!
//! Without the feature, `absent.rs` stands in for this module: the types
//! that the store's generic code names, none of which can be made.

mod connection;
mod nodes;
mod per_node;
mod refresh;
mod slots;
mod spread;
mod target;

pub(crate) use connection::{ClusterConn, ClusterSource};
#[cfg(feature = "test-util")]
mod test_clock;
