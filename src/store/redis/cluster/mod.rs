//! A store on a Redis Cluster (cargo feature `cluster`).

mod nodes;
mod per_node;
mod refresh;
mod slots;
mod spread;
mod target;
#[cfg(feature = "test-util")]
mod test_clock;
