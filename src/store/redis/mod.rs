//! [`RedisStore`]: buckets in Redis, shared by every instance of the
//! application.
//!
//! Files, bottom up: `failure.rs` (what a Redis error means), `script.rs` (the
//! Lua script, its arguments and its reply), `connection.rs` (the held
//! connection and its lifecycle, for one server, a cluster or the primary that
//! sentinels name), `window.rs` (how many calls of a queue may be in flight),
//! `batch.rs` (checks queued for one script call), `nodes.rs` (on a cluster:
//! the slot map and a queue per primary), `sending.rs` (the future of a check
//! on its way), `probe.rs` (the circuit breaker's probe, in a task of its
//! own), `store.rs` (the store: breaker, timeouts, retries, batching),
//! `target.rs` (where connections come from, TLS, checked at build time),
//! `builder.rs` (configuration).

mod batch;
mod builder;
mod call;
#[cfg(feature = "cluster")]
mod cluster;
mod connection;
mod decode;
mod drain;
mod encode;
mod failure;
mod probe;
mod script;
mod sending;
#[cfg(feature = "sentinel")]
mod sentinel;
mod store;
mod target;
#[cfg(feature = "test-util")]
mod test_clock;
mod window;

pub use builder::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_BATCH, DEFAULT_PREFIX, DEFAULT_TIMEOUT, RedisStoreBuilder,
};
pub(crate) use sending::Sending;
pub use store::RedisStore;
