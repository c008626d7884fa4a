//! The test-clock API of [`MemoryStore`] (cargo feature `test-util`): checks,
//! reservations and adjustments at a microsecond clock the test chooses.

use std::time::Duration;

use super::MemoryStore;
use crate::decision::Decision;
use crate::decision::Reservation;
use crate::error::Error;
use crate::policy::Policy;
use crate::quota::micros;
impl MemoryStore {
    /// `check` at an explicit microsecond clock (counted from the store's
    /// creation), for tests that control time (cargo feature `test-util`).
    /// Production code uses [`Store::check`](crate::Store::check), whose clock is the store's own (tokio's `Instant` with this feature).
    pub fn check_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        now_us: u64,
    ) -> Result<Decision, Error> {
        self.decide_at(key, policy, cost, now_us)
    }

    /// `reserve` at an explicit microsecond clock (counted from the store's
    /// creation), for tests that control time (cargo feature `test-util`), as
    /// `RedisStore::reserve_at` is for Redis.
    pub fn reserve_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        max_wait: Duration,
        now_us: u64,
    ) -> Result<Reservation, Error> {
        let (decision, wait) = self.spend_at(key, policy, cost, now_us, micros(max_wait))?;
        Ok(Reservation::new(decision, wait))
    }

    /// A refund (`delta` below 0) or a charge of `key`'s buckets at an
    /// explicit microsecond clock (cargo feature `test-util`), as the layer's
    /// `settle` and `RateLimiter::refund` and `charge` make them.
    pub fn adjust_at(&self, key: &str, policy: &Policy, delta: i64, now_us: u64) {
        self.adjust_on(key, policy, delta, now_us);
    }
}
