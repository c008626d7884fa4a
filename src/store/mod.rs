//! Where buckets live: [`RedisStore`] shared by every instance,
//! or [`MemoryStore`] in one process; [`AnyStore`] holds either, chosen at runtime.
//!
//! Both run the same exact algorithm (`lua/token_bucket.lua` and its Rust twin):
//! time from one clock (Redis `TIME` for Redis), integer arithmetic in units of a
//! fraction of a token so no token is lost to rounding, several quotas decided
//! all-or-nothing, denied calls spend nothing.
//!
//! ```
//! use tollgate::{MemoryStore, Policy, Quota, Store};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new();
//! let policy = Policy::new("api", [Quota::per_second(10)?, Quota::per_hour(1000)?])?;
//! let decision = store.check("user:42", &policy, 1).await?;
//! assert!(decision.allowed());
//! assert_eq!(decision.states().len(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! # Choosing a store at runtime
//!
//! [`RateLimiter`](crate::RateLimiter) and
//! [`RateLimitLayer`](crate::RateLimitLayer) take any store and do not carry
//! its type, so a store picked from the environment needs no generics:
//!
//! ```
//! use tollgate::{AnyStore, MemoryStore, Quota, RateLimitLayer, RedisStore};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store: AnyStore = match std::env::var("REDIS_URL") {
//!     Ok(url) => RedisStore::from_url(&url)?.into(),
//!     Err(_) => MemoryStore::new().into(),
//! };
//! let layer = RateLimitLayer::new(store, Quota::per_second(10)?);
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! # Why [`Store`] is sealed
//!
//! `Store` can be named and called, but not implemented outside this crate (for
//! 0.1). A store must reproduce the exact arithmetic of `src/store/bucket.rs`
//! (the model tests check both stores against an independent model), and the
//! trait is still growing: reservations, batched checks and cached denials need
//! new methods, which would break every outside implementation. Sealing it now
//! keeps those additions compatible; it can be opened later without breaking
//! anyone.
//!
//! # What else is public here, and why
//!
//! - The key helpers: [`safe_key`] (and [`MAX_RAW_KEY_LEN`], where it starts
//!   hashing) gives the storage form of a key, so an operator can find or
//!   reset a client's bucket by name; [`safe_key_bytes`] is the same for a
//!   raw header value a custom extractor reads; [`hashed_key`] keeps a
//!   credential (an API key) unreadable in the store whatever its form.
//! - The `DEFAULT_*` constants are the values the builders document, so code
//!   and configuration can say "the default" instead of repeating a number.
#![doc = include_str!("../docs/redis.md")]

mod any;
#[cfg(feature = "redis")]
mod breaker;
pub(crate) mod bucket;
mod clock;
mod contract;
#[cfg(feature = "redis")]
mod deny_cache;
mod held_keys;
mod key;
mod memory;
#[cfg(feature = "redis")]
mod redis;
mod sealed;
mod table;

pub use any::AnyStore;
pub(crate) use any::Unsent;
#[cfg(feature = "redis")]
pub use breaker::{
    CircuitBreaker, DEFAULT_BREAKER_FAILURES, DEFAULT_FIRST_PROBE, DEFAULT_MAX_COOLDOWN,
};
pub use contract::Store;
#[cfg(feature = "redis")]
pub use deny_cache::DEFAULT_DENY_CACHE;
pub(crate) use held_keys::HeldKeys;
pub use key::{MAX_RAW_KEY_LEN, hashed_key, safe_key, safe_key_bytes};
pub use memory::{DEFAULT_MAX_KEYS, MemoryStore};
#[cfg(feature = "redis")]
pub use redis::{
    BucketHold, BucketScan, BucketState, DEFAULT_CONNECT_TIMEOUT, DEFAULT_LEASE_KEYS,
    DEFAULT_LEASE_PERIOD, DEFAULT_MAX_BATCH, DEFAULT_PREFIX, DEFAULT_TIMEOUT, LeaseStats,
    RedisStore, RedisStoreBuilder,
};
