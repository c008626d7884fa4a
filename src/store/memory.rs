//! Buckets in this process: for single instances, tests, and as a fallback.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;

use super::bucket::{Level, debt_for, spend};
use super::contract::{Store, validate};
use super::key::safe_key;
use super::sealed::Sealed;
use std::time::Duration;

use crate::decision::Reservation;
use crate::{ConfigError, Decision, Error, Policy, Quota};

/// The default key limit of [`MemoryStore::new`].
pub const DEFAULT_MAX_KEYS: usize = 100_000;

const MAX_SHARDS: usize = 64;

/// The fewest keys a shard is built for. With one key per shard (the old
/// `max_keys.clamp(1, 64)` shards) two keys hashing to the same shard made a
/// store for 100 keys refuse its second key; with at least this many per shard,
/// stores of fewer than `2 * MIN_PER_SHARD` keys have one shard and an exact
/// bound, and large stores fill evenly (the fullest of 64 shards of 1024 or more
/// fills when the store is about 95% full).
const MIN_PER_SHARD: usize = 1024;

/// Token buckets in memory, with the same semantics as
/// [`RedisStore`](crate::RedisStore) for one process.
///
/// - **Thread-safe without one global lock:** keys are spread over up to 64
///   shards, each behind its own short-held mutex; the quotas of one key live in
///   one shard, so a multi-quota check is atomic.
/// - **Bounded memory:** a key is at most [`MAX_RAW_KEY_LEN`](crate::store::MAX_RAW_KEY_LEN)
///   bytes (longer keys are hashed), and the store holds at most `max_keys` keys
///   (default [`DEFAULT_MAX_KEYS`]). Stores for fewer than 2048 keys use one
///   shard and hold exactly `max_keys`; larger ones split them evenly over the
///   shards, so a new key can be refused a little before the whole store is
///   full, when its shard is. When a key
///   arrives at a full shard, the shard first forgets every key whose buckets have
///   refilled completely (forgetting them changes no decision). If none has, the
///   check fails with [`Error::StoreFull`], a store error: the HTTP layer then
///   applies its store-error policy. Existing keys keep being limited; a flood of
///   new keys cannot evict a limited client and so reset its bucket.
/// - **Clock:** tokio's [`Instant`], so tests can pause and advance time.
///
/// Clones share the same buckets.
///
/// ```
/// use tollgate::{MemoryStore, Quota, RateLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RateLimiter::new(MemoryStore::with_max_keys(10_000)?, Quota::per_second(5)?);
/// assert!(limiter.check("job-queue", 5).await?.allowed());
/// assert!(!limiter.check("job-queue", 1).await?.allowed());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    max_keys: usize,
    hasher: RandomState,
    epoch: Instant,
}

/// One shard's keys, and when sweeping it can next free anything.
#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Box<str>, Vec<(Quota, Level)>>,
    /// No key of this shard is forgettable before this microsecond: a full
    /// shard under a flood of new keys answers `StoreFull` without rescanning.
    /// A sweep sets it to the earliest time a kept key is full; every write
    /// lowers it to the written key's (spending only moves a key's time later).
    quiet_until: u64,
    #[cfg(test)]
    sweeps: u64,
}

impl Shard {
    /// Forgets every key whose buckets are full at `now`.
    fn sweep(&mut self, now: u64) {
        let mut next = u64::MAX;
        self.map.retain(|_, buckets| {
            let at = full_at(buckets);
            next = if at <= now { next } else { next.min(at) };
            at > now
        });
        self.quiet_until = next;
        #[cfg(test)]
        {
            self.sweeps += 1;
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store for up to [`DEFAULT_MAX_KEYS`] keys.
    pub fn new() -> Self {
        Self::build(DEFAULT_MAX_KEYS)
    }

    /// A store for up to `max_keys` keys (at least 1).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when `max_keys` is 0.
    pub fn with_max_keys(max_keys: usize) -> Result<Self, ConfigError> {
        if max_keys == 0 {
            return Err(ConfigError::store(
                "MemoryStore needs room for at least one key",
            ));
        }
        Ok(Self::build(max_keys))
    }

    fn build(max_keys: usize) -> Self {
        let shards = (max_keys / MIN_PER_SHARD).clamp(1, MAX_SHARDS);
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
                per_shard: max_keys / shards,
                max_keys,
                hasher: RandomState::new(),
                epoch: Instant::now(),
            }),
        }
    }

    /// How many keys the store holds now.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// True when the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every key whose buckets have refilled completely. Checks do this by
    /// themselves when a shard fills up; call it to release memory sooner.
    pub fn sweep(&self) {
        let now = self.now();
        for shard in self.inner.shards.iter() {
            lock(shard).sweep(now);
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.inner.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let shards = &self.inner.shards;
        let hash = self.inner.hasher.hash_one(key);
        // `shards` is never empty; the modulo keeps the index in range.
        let index = usize::try_from(hash % shards.len() as u64).unwrap_or(0);
        match shards.get(index).or(shards.first()) {
            Some(shard) => lock(shard),
            None => unreachable_empty(),
        }
    }

    /// `check` at an explicit microsecond clock (counted from the store's
    /// creation), for tests that control time (cargo feature `test-util`).
    /// Production code uses [`Store::check`], whose clock is tokio's `Instant`.
    #[cfg(feature = "test-util")]
    pub fn check_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        now_us: u64,
    ) -> Result<Decision, Error> {
        self.decide_at(key, policy, cost, now_us)
    }

    /// A check at the microsecond `now_us` of this store's clock.
    pub(crate) fn decide_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        now_us: u64,
    ) -> Result<Decision, Error> {
        self.reserve_at(key, policy, cost, now_us, 0)
            .map(|(d, _)| d)
    }

    /// A reservation at `now_us` that may wait up to `max_wait_us` (0 for a
    /// plain check): the decision and, when admitted, the wait until the
    /// tokens are due.
    pub(crate) fn reserve_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        now_us: u64,
        max_wait_us: u64,
    ) -> Result<(Decision, u64), Error> {
        validate(policy, cost)?;
        let quotas = policy.quotas();
        let debts: Vec<u64> = if max_wait_us == 0 {
            Vec::new()
        } else {
            quotas.iter().map(|q| debt_for(q, max_wait_us)).collect()
        };
        let key = safe_key(key);
        let mut shard = self.shard(&key);
        if !shard.map.contains_key(key.as_ref()) {
            if cost == 0 {
                // A peek at an unknown key sees full buckets and stores nothing.
                let mut levels: Vec<Level> =
                    quotas.iter().map(|q| Level::full(q, now_us)).collect();
                return Ok(spend(quotas, &mut levels, 0, now_us, &debts));
            }
            if shard.map.len() >= self.inner.per_shard {
                if now_us >= shard.quiet_until {
                    shard.sweep(now_us);
                }
                if shard.map.len() >= self.inner.per_shard {
                    return Err(Error::StoreFull {
                        max_keys: self.inner.max_keys,
                    });
                }
            }
        }
        let buckets = shard.map.entry(Box::from(key.as_ref())).or_default();
        let mut levels: Vec<Level> = quotas
            .iter()
            .map(|q| match buckets.iter().find(|(bq, _)| bq == q) {
                Some((_, level)) => level.refilled(q, now_us),
                None => Level::full(q, now_us),
            })
            .collect();
        let (decision, wait) = spend(quotas, &mut levels, cost, now_us, &debts);
        if decision.allowed() && cost > 0 {
            for (q, level) in quotas.iter().zip(levels) {
                match buckets.iter_mut().find(|(bq, _)| bq == q) {
                    Some(slot) => slot.1 = level,
                    None => buckets.push((*q, level)),
                }
            }
            let at = full_at(buckets);
            shard.quiet_until = shard.quiet_until.min(at);
        }
        Ok((decision, wait))
    }
}

impl Sealed for MemoryStore {}

impl Store for MemoryStore {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, Error> {
        self.decide_at(key, policy, cost, self.now())
    }

    async fn reserve(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Reservation, Error> {
        let max_wait_us = u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX);
        let (decision, wait) = self.reserve_at(key, policy, cost, self.now(), max_wait_us)?;
        Ok(Reservation::new(decision, wait))
    }

    async fn reset(&self, key: &str, policy: &Policy) -> Result<(), Error> {
        let quotas = policy.quotas();
        let key = safe_key(key);
        let mut shard = self.shard(&key);
        if let Some(buckets) = shard.map.get_mut(key.as_ref()) {
            buckets.retain(|(q, _)| !quotas.contains(q));
            if buckets.is_empty() {
                shard.map.remove(key.as_ref());
            }
        }
        Ok(())
    }
}

/// When every bucket of a key is full again, so forgetting the key changes no
/// decision.
fn full_at(buckets: &[(Quota, Level)]) -> u64 {
    buckets.iter().map(|(q, l)| l.full_at(q)).max().unwrap_or(0)
}

/// A poisoned shard only means another thread panicked mid-update of plain
/// integers; the data is still usable, so keep limiting rather than panic.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cold]
fn unreachable_empty() -> ! {
    // `build` always creates at least one shard.
    unreachable!("MemoryStore has no shards")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_store_forgets_refilled_keys_then_refuses() {
        let store = MemoryStore::with_max_keys(2).unwrap();
        let q = Policy::from(Quota::per_second(1).unwrap());
        // A small store is one shard: exactly two keys fit.
        let _ = store.decide_at("k0", &q, 1, 0).unwrap();
        let _ = store.decide_at("k1", &q, 1, 0).unwrap();
        let refused = store.decide_at("k2", &q, 1, 0);
        assert!(matches!(refused, Err(Error::StoreFull { max_keys: 2 })));
        assert_eq!(store.len(), 2);
        // A second after each spend every bucket is full again: new keys fit.
        for i in 1..10 {
            let _ = store
                .decide_at(&format!("new{i}"), &q, 1, i * 1_000_000)
                .unwrap();
        }
        assert!(store.len() <= 2);
    }

    #[test]
    fn a_flood_of_new_keys_into_a_full_shard_sweeps_once_until_something_refills() {
        let store = MemoryStore::with_max_keys(3).unwrap();
        let q = Policy::from(Quota::per_second(1).unwrap());
        for i in 0..3 {
            let _ = store
                .decide_at(&format!("k{i}"), &q, 1, i * 100_000)
                .unwrap();
        }
        // k0 is full again at 1 s: until then no sweep can free anything.
        for i in 0..1_000 {
            let refused = store.decide_at(&format!("flood{i}"), &q, 1, 300_000 + i);
            assert!(matches!(refused, Err(Error::StoreFull { .. })));
        }
        let sweeps = |store: &MemoryStore| -> u64 {
            store.inner.shards.iter().map(|s| lock(s).sweeps).sum()
        };
        assert_eq!(sweeps(&store), 1, "one sweep for the whole flood");
        assert!(store.decide_at("late", &q, 1, 999_999).is_err());
        // At 1 s k0 is forgettable: the next new key sweeps and fits.
        let _ = store.decide_at("late", &q, 1, 1_000_000).unwrap();
        assert_eq!(sweeps(&store), 2);
        assert_eq!(store.len(), 3);
    }

    #[test]
    fn peek_of_unknown_key_stores_nothing() {
        let store = MemoryStore::new();
        let q = Policy::from(Quota::per_second(3).unwrap());
        let d = store.decide_at("x", &q, 0, 0).unwrap();
        assert_eq!(d.remaining(), 3);
        assert!(store.is_empty());
    }

    #[test]
    fn long_keys_are_stored_hashed() {
        let store = MemoryStore::new();
        let q = Policy::from(Quota::per_second(3).unwrap());
        let _ = store.decide_at(&"k".repeat(1 << 16), &q, 1, 0).unwrap();
        let shard_keys: Vec<String> = store
            .inner
            .shards
            .iter()
            .flat_map(|s| {
                lock(s)
                    .map
                    .keys()
                    .map(|k| k.to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(shard_keys.len(), 1);
        assert!(shard_keys[0].len() <= 33);
    }
}
