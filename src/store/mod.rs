//! Where buckets live: [`RedisStore`] shared by every instance,
//! or [`MemoryStore`] in one process.
//!
//! Both run the same exact algorithm (`lua/token_bucket.lua` and its Rust twin):
//! time from one clock (Redis `TIME` for Redis), integer arithmetic in units of a
//! fraction of a token so no token is lost to rounding, several quotas decided
//! all-or-nothing, denied calls spend nothing.
//!
//! ```
//! use tollgate::{MemoryStore, Quota, Store};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate::Error> {
//! let store = MemoryStore::new();
//! let quotas = [Quota::per_second(10)?, Quota::per_hour(1000)?];
//! let decision = store.check("user:42", &quotas, 1).await?;
//! assert!(decision.allowed());
//! assert_eq!(decision.states().len(), 2);
//! # Ok(())
//! # }
//! ```

use std::future::Future;

use crate::{Decision, Error, Quota};

pub(crate) mod bucket;
mod key;
mod memory;
#[cfg(feature = "redis")]
mod redis;

pub use key::{MAX_RAW_KEY_LEN, hashed_key, safe_key, safe_key_bytes};
pub use memory::{DEFAULT_MAX_KEYS, MemoryStore};
#[cfg(feature = "redis")]
pub use redis::{DEFAULT_PREFIX, DEFAULT_TIMEOUT, RedisStore};

/// A place that keeps token buckets and decides checks against them atomically.
///
/// `key` is the client key (any string; stores make it safe with [`safe_key`]),
/// `quotas` the limits that apply, all decided at once. Implementations must
/// treat `cost == 0` as a peek that changes nothing, reject a cost above any
/// quota's capacity with [`Error::CostExceedsCapacity`], and keep buckets of
/// different quotas apart.
pub trait Store: Send + Sync + 'static {
    /// Spends `cost` tokens from every quota's bucket for `key`, or none if any
    /// quota lacks them.
    fn check(
        &self,
        key: &str,
        quotas: &[Quota],
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// Forgets `key`'s buckets for these quotas: the next check sees them full.
    fn reset(&self, key: &str, quotas: &[Quota]) -> impl Future<Output = Result<(), Error>> + Send;
}

/// Checks made before any store is asked: a decision needs at least one quota, and
/// a cost above a capacity can never succeed.
pub(crate) fn validate(quotas: &[Quota], cost: u64) -> Result<(), Error> {
    let smallest = quotas
        .iter()
        .map(Quota::capacity)
        .min()
        .ok_or_else(|| Error::InvalidConfig("a check needs at least one quota".into()))?;
    if cost > smallest {
        return Err(Error::CostExceedsCapacity {
            cost,
            capacity: smallest,
        });
    }
    Ok(())
}
