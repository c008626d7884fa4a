//! [`RateLimiter`]: the engine without tower, for queues, jobs and databases.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{MemoryStore, Quota, RateLimiter};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate::Error> {
//! // 10 per second and 1000 per hour for each key, decided together.
//! let limiter = RateLimiter::with_quotas(
//!     MemoryStore::new(),
//!     [Quota::per_second(10)?, Quota::per_hour(1000)?],
//! )?;
//! let d = limiter.check("tenant-7", 1).await?;
//! assert!(d.allowed());
//! // Wait (up to 2 s) for 10 more tokens instead of failing.
//! limiter.acquire("tenant-7", 10, Duration::from_secs(2)).await?;
//! limiter.reset("tenant-7").await?;
//! assert_eq!(limiter.peek("tenant-7").await?.remaining(), 10);
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Decision, Error, Quota, Store};

/// Checks keys against one or more quotas in a [`Store`]. See the
/// [module example](crate::limiter).
///
/// Keys are yours to choose: two limiters on the same store that check the same
/// key with the same quota share its bucket (with different quotas they never
/// do). Give each use its own key prefix (`login:user:42`, `search:user:42`) or
/// its own store prefix ([`RedisStore::with_prefix`](crate::RedisStore::with_prefix)).
///
/// Cheap to clone: clones share the store and quotas.
#[derive(Debug)]
pub struct RateLimiter<S> {
    store: Arc<S>,
    quotas: Arc<[Quota]>,
}

impl<S> Clone for RateLimiter<S> {
    fn clone(&self) -> Self {
        RateLimiter {
            store: Arc::clone(&self.store),
            quotas: Arc::clone(&self.quotas),
        }
    }
}

impl<S: Store> RateLimiter<S> {
    /// A limiter with one quota.
    pub fn new(store: S, quota: Quota) -> Self {
        RateLimiter {
            store: Arc::new(store),
            quotas: Arc::from([quota]),
        }
    }

    /// A limiter that checks several quotas at once, all or nothing. Fails when the
    /// list is empty or names the same quota twice.
    pub fn with_quotas(store: S, quotas: impl IntoIterator<Item = Quota>) -> Result<Self, Error> {
        let quotas = check_quotas(quotas)?;
        Ok(RateLimiter {
            store: Arc::new(store),
            quotas,
        })
    }

    /// The quotas this limiter checks.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }

    /// The store behind this limiter.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Spends `cost` tokens from `key`'s buckets if every quota has them; a denied
    /// check spends nothing. A cost of 0 only looks.
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.store.check(key, &self.quotas, cost).await
    }

    /// Like [`check`](Self::check), but waits until `cost` is admitted, as Guava's
    /// `RateLimiter.acquire` does. Gives up with [`Error::WaitTooLong`] as soon as
    /// the wait the store reports would end after `max_wait` from the call: it
    /// never sleeps for a wait it already knows is too long. Other clients of the
    /// same key may take the tokens first; it then waits again, within the same
    /// deadline.
    pub async fn acquire(
        &self,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        // A max_wait too long to represent (Duration::MAX) means no deadline.
        let deadline = Instant::now().checked_add(max_wait);
        loop {
            let decision = self.check(key, cost).await?;
            if decision.allowed() {
                return Ok(decision);
            }
            let retry_after = decision.retry_after().max(Duration::from_micros(1));
            if deadline.is_some_and(|d| Instant::now() + retry_after > d) {
                return Err(Error::WaitTooLong { retry_after });
            }
            tokio::time::sleep(retry_after).await;
        }
    }

    /// The state of `key`'s buckets, spending nothing.
    pub async fn peek(&self, key: &str) -> Result<Decision, Error> {
        self.check(key, 0).await
    }

    /// Forgets `key`'s buckets: the next check finds them full.
    pub async fn reset(&self, key: &str) -> Result<(), Error> {
        self.store.reset(key, &self.quotas).await
    }
}

/// A non-empty list of distinct quotas.
pub(crate) fn check_quotas(quotas: impl IntoIterator<Item = Quota>) -> Result<Arc<[Quota]>, Error> {
    let quotas: Vec<Quota> = quotas.into_iter().collect();
    if quotas.is_empty() {
        return Err(Error::InvalidConfig("at least one quota is needed".into()));
    }
    for (i, q) in quotas.iter().enumerate() {
        if quotas.iter().skip(i + 1).any(|other| other == q) {
            return Err(Error::InvalidConfig(format!("quota {q} is listed twice")));
        }
    }
    Ok(quotas.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    #[tokio::test(start_paused = true)]
    async fn acquire_waits_for_the_refill() {
        let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_second(2).unwrap());
        limiter.check("k", 2).await.unwrap();
        let start = Instant::now();
        let d = limiter
            .acquire("k", 1, Duration::from_secs(1))
            .await
            .unwrap();
        assert!(d.allowed());
        assert_eq!(start.elapsed(), Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_gives_up_without_sleeping_past_max_wait() {
        let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_minute(1).unwrap());
        limiter.check("k", 1).await.unwrap();
        let start = Instant::now();
        let err = limiter
            .acquire("k", 1, Duration::from_secs(59))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::WaitTooLong { retry_after } if retry_after == Duration::from_secs(60))
        );
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_without_a_representable_deadline_waits_as_long_as_needed() {
        let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_minute(1).unwrap());
        limiter.check("k", 1).await.unwrap();
        let d = limiter.acquire("k", 1, Duration::MAX).await.unwrap();
        assert!(d.allowed());
    }

    #[tokio::test]
    async fn cost_above_capacity_is_impossible_not_a_wait() {
        let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_second(5).unwrap());
        let err = limiter.check("k", 6).await.unwrap_err();
        assert!(matches!(
            err,
            Error::CostExceedsCapacity {
                cost: 6,
                capacity: 5
            }
        ));
        let err = limiter
            .acquire("k", 6, Duration::from_secs(60))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::CostExceedsCapacity { .. }));
    }

    #[test]
    fn quota_lists_are_checked() {
        let q = Quota::per_second(1).unwrap();
        assert!(RateLimiter::with_quotas(MemoryStore::new(), []).is_err());
        assert!(RateLimiter::with_quotas(MemoryStore::new(), [q, q]).is_err());
    }
}
