//! A store on a Redis Cluster (cargo feature `cluster`).

mod nodes;
mod per_node;
mod refresh;
mod slots;
mod spread;
#[cfg(feature = "test-util")]
mod test_clock;

pub(crate) use per_node::per_node;
