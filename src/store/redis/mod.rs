//! [`RedisStore`]: buckets in Redis, shared by every instance of the
//! application.
//!
//! Files, bottom up: `failure.rs` (what a Redis error means), `script.rs` (the
//! Lua script, its arguments and its reply), `connection.rs` (the held
//! connection and its lifecycle), `store.rs` (the store: breaker, timeouts,
//! retries), `builder.rs` (configuration).

mod batch;
mod builder;
mod connection;
mod failure;
mod script;
mod store;

pub use builder::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_BATCH, DEFAULT_PREFIX, DEFAULT_TIMEOUT, RedisStoreBuilder,
};
pub use store::RedisStore;
