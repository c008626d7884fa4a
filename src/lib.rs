//! # tollgate
//!
//! Distributed rate limiting for tower services (axum, hyper, tonic): an exact
//! token bucket kept in Redis and updated atomically by one Lua script, or kept in
//! memory for a single instance.
//!
//! - [`Quota`]: a bucket capacity and a refill rate (`Quota::per_second(10)` means
//!   ten tokens a second).
//! - [`Store`]: where buckets live: [`RedisStore`] (shared by every instance,
//!   time from Redis `TIME`, one round trip per decision, and checks with
//!   room to spare decided in process from tokens Redis holds for this
//!   instance: [leases](crate::store#leases)) or [`MemoryStore`].
//! - [`RateLimiter`]: `check`, `reserve` and `acquire` (wait for tokens in one
//!   store call), `peek` and `reset` over a store.
//! - [`Decision`]: what a check answers: allowed, limit, remaining, retry-after,
//!   reset-after.
//! - [`RateLimitLayer`]: tower middleware for axum, hyper and tonic: 429 with
//!   `Retry-After` and the IETF `RateLimit` headers for HTTP, `RESOURCE_EXHAUSTED`
//!   with retry hints for gRPC, per-route and per-method policies, a delay
//!   mode that shapes bursts instead of refusing them, and policy tables read
//!   from configuration files (feature `serde`) and swapped while serving; see
//!   [`layer`] for the axum quick start.
//! - [`key`]: which bucket a request spends from (peer IP, client IP behind
//!   trusted proxies, API key header, auth extension, closures, combinations).
//!
//! ## Quick start
//!
//! ```
//! use tollgate::{MemoryStore, Quota, RateLimiter};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Use RedisStore::from_url("redis://127.0.0.1:6379")? to share the limit
//! // between instances; MemoryStore keeps it in this process.
//! let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_second(5)?.burst(10)?);
//!
//! let decision = limiter.check("user:42", 1).await?;
//! if decision.allowed() {
//!     println!("admitted, {} left", decision.remaining());
//! } else {
//!     println!("limited, retry in {:?}", decision.retry_after());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! ## Conventions
//!
//! - Builders take `self` by value and return it, and are `#[must_use]`: a
//!   builder call whose result is dropped configures nothing, and the compiler
//!   says so.
//! - `with_*` is always an alternative constructor (`MemoryStore::with_max_keys`);
//!   setters have plain names (`RedisStore::builder().prefix(..).timeout(..)`).
//! - Mistakes in configuration are a [`ConfigError`], returned while building;
//!   a check only ever returns an [`Error`].
//! - Every type is defined in one place: the crate root, or the module of its
//!   kind ([`key`], [`layer`], [`store`]); the most used of those (the stores,
//!   [`RateLimitLayer`], [`RateLimit`]) are also re-exported at the root.
//!   Public constants are of three kinds, each kept for a reason a user has:
//!   the limits a constructor checks
//!   ([`MAX_PERIOD`], [`MIN_PERIOD`], [`MAX_POLICY_NAME_LEN`],
//!   [`key::MAX_HOPS`], [`store::MAX_RAW_KEY_LEN`]), so input can be checked
//!   before it is refused; the defaults a builder documents (`DEFAULT_*`), so
//!   code can name "the default"; and the header names the layer writes
//!   ([`layer::RATELIMIT`] and the others), so tests and proxies can read
//!   them without spelling them again.
//!
//! ## Guarantees
//!
//! - Time comes from one clock per store (Redis `TIME` with microseconds for
//!   [`RedisStore`]); the application's clock never decides.
//! - Refills are exact integers (levels are counted in fractions of a token), so
//!   one token an hour and seven a second both refill exactly on schedule.
//! - A denied check spends nothing; several quotas are decided all or nothing.
//! - A cost above the capacity is [`Error::CostExceedsCapacity`], not a wait.
//! - A store problem never makes a request wait longer than the store timeout,
//!   never becomes a service error, and always shows: in `tracing` and
//!   `metrics` when those features are on, on stderr when neither is (see
//!   below).
//! - Every number the script handles stays below 2^53, exact in Lua; quotas that
//!   could break this are refused when built.
#![doc = include_str!("docs/resilience.md")]
#![doc = include_str!("docs/observability.md")]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// Modules of one type (and its constants) are private: each type has one
// path, at the crate root. The modules of several types a user picks from
// (keys, the layer's options, the stores and their builders) are public.
mod decision;
mod error;
mod fallback;
pub mod key;
pub mod layer;
mod limiter;
mod lock;
mod observe;
mod policy;
mod quota;
pub mod store;

#[cfg(test)]
mod hostile_input;

pub use decision::{Decision, QuotaState, Reservation};
pub use error::{ConfigError, ConfigErrorKind, Error, ErrorKind};
pub use fallback::Fallback;
pub use layer::{RateLimit, RateLimitLayer};
pub use limiter::RateLimiter;
pub use policy::{DEFAULT_POLICY_NAME, MAX_POLICY_NAME_LEN, Policy};
pub use quota::{MAX_PERIOD, MIN_PERIOD, Quota};
#[cfg(feature = "redis")]
pub use store::RedisStore;
pub use store::{AnyStore, MemoryStore, Store};

/// The deadpool-redis crate tollgate is built against, for building a pool.
#[cfg(feature = "redis")]
pub use deadpool_redis;

/// Every Rust code block of the README, compiled and run as a doc-test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
