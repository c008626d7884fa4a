//! [`RedisStore`]: buckets in Redis, shared by every instance of the
//! application.
//!
//! Files, bottom up, one job each:
//! - `failure.rs`: what a Redis error means, and what the store reports.
//! - `script.rs`: the Lua script's source and its variants (test clock),
//!   made from the lines the Lua files mark.
//! - `decode.rs`: the script's reply: its packed numbers, and the decisions
//!   they make.
//! - `encode.rs`: one script call (`Batch`): what each decision asks
//!   (`Spend`: take tokens, or adjust after the fact), its keys and
//!   arguments, its command, and how it is sent (`EVALSHA`, then `EVAL`).
//! - `window.rs`: how many calls of a queue may be in flight at once.
//! - `batch.rs`: the queue of checks waiting for the next script call.
//! - `lease/`: leases, tokens held for this instance and spent in
//!   process: the map, its entries, their sizing, what to ask for and to
//!   report.
//! - `probe.rs`: the circuit breaker's probe, in a task of its own.
//! - `connection/`: the held connection and its lifecycle, for one
//!   server, a cluster or the primary that sentinels name.
//! - `store.rs`: the store: what it is made of, its settings and ping,
//!   the `Store` trait's face; `PerNode`, what a cluster adds to batching.
//! - `keys.rs`: the storage keys of a client's buckets.
//! - `decide.rs`: check, reserve and adjust (refunds and charges), as far
//!   as the process answers them, then sent.
//! - `reset.rs`: reset: the `DEL`, and the denials and holds forgotten.
//! - `call.rs`: how one call runs: timeout, one retry on a fresh
//!   connection, the breaker (and its probe), reports.
//! - `drain.rs`: a check queued for a call, or sent alone by its caller,
//!   and the drain that sends the queue and hands every check its answer.
//! - `store_leases.rs`: the store's side of leases: a check decided from
//!   a hold, and the lease requests and reports sent in the background.
//! - `sending.rs`: where a check goes (batched or alone), and the future of
//!   a check on its way.
//! - `test_clock.rs`: `check_at`, `reserve_at`, `adjust_at` and
//!   `check_batch_at` (cargo feature `test-util`).
//! - `target.rs`: where connections come from (a URL, a pool, or a
//!   `Topology`: a cluster or sentinels), TLS, checked at build time.
//! - `builder.rs`: configuration.
//! - `inspect.rs`: buckets read as they are, by storage key, for operators'
//!   tools (`read_buckets`).
//! - `scan.rs`: bucket keys found with a bounded `SCAN` (`scan_buckets`).
//! - `cluster/` (cargo feature `cluster`): the cluster's connections (which
//!   `connection.rs` holds as one of its kinds), hash slots, the slot map
//!   and a queue per primary, the spread script, slot map refreshes, the
//!   cluster target, and `check_batch_at` per node. The one place that
//!   names the feature: without it, `cluster/absent.rs` stands in, with
//!   types that cannot be made, so the rest of the store has no `cfg` for it.
//! - `sentinel.rs` (cargo feature `sentinel`): the sentinel target.

mod batch;
mod builder;
mod call;
#[cfg(feature = "cluster")]
mod cluster;
#[cfg(not(feature = "cluster"))]
#[path = "cluster/absent.rs"]
mod cluster;
mod connection;
mod decide;
mod decode;
mod drain;
mod encode;
mod epoch;
mod failure;
mod inspect;
mod keys;
mod lease;
mod probe;
mod reset;
mod scan;
mod script;
mod sending;
#[cfg(feature = "sentinel")]
mod sentinel;
mod store;
mod store_leases;
mod target;
#[cfg(feature = "test-util")]
mod test_clock;
mod watch;
mod window;

pub use builder::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_BATCH, DEFAULT_PREFIX, DEFAULT_TIMEOUT, RedisStoreBuilder,
};
pub(crate) use encode::Spend;
pub use inspect::{BucketHold, BucketState};
pub use lease::{DEFAULT_LEASE_KEYS, DEFAULT_LEASE_PERIOD, LeaseStats};
pub use scan::BucketScan;
pub(crate) use sending::Sending;
pub use store::RedisStore;
