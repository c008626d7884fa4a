//! Buckets in this process: for single instances, tests, and as a fallback.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
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
/// store for 100 keys evict at its second key; with at least this many per
/// shard, stores of fewer than `2 * MIN_PER_SHARD` keys have one shard and an
/// exact bound, and large stores fill evenly (the fullest of 64 shards of 1024
/// or more fills when the store is about 95% full).
const MIN_PER_SHARD: usize = 1024;

/// Token buckets in memory, with the same semantics as
/// [`RedisStore`](crate::RedisStore) for one process.
///
/// - **Thread-safe without one global lock:** keys are spread over up to 64
///   shards (by a hash seeded at random per store, so clients cannot aim at
///   one), each behind its own short-held mutex; the quotas of one key live in
///   one shard, so a multi-quota check is atomic.
/// - **Bounded memory:** a key is at most [`MAX_RAW_KEY_LEN`](crate::store::MAX_RAW_KEY_LEN)
///   bytes (longer keys are hashed), and the store holds at most `max_keys` keys
///   (default [`DEFAULT_MAX_KEYS`]). Stores for fewer than 2048 keys use one
///   shard and hold exactly `max_keys`; larger ones split them evenly over the
///   shards, so a shard can be full a little before the whole store is.
/// - **A full store keeps serving new clients.** When a new key arrives at a
///   full shard, the shard forgets the one key whose buckets will be full again
///   soonest: a key that has already refilled completely if there is one
///   (forgetting it changes no decision), else the key closest to full (on a
///   tie, the oldest). Each shard keeps its keys ordered by that time, so this
///   costs a logarithmic step per check, never a scan, however hard a flood of
///   new keys pushes.
/// - **What eviction can cost, exactly.** A forgotten client starts over with
///   full buckets when it comes back, so it may be admitted what it would
///   otherwise still have waited for: per quota, the tokens its bucket was
///   missing when it was forgotten. That is never more than one capacity per
///   quota per eviction, there is at most one eviction per new key arriving at
///   a full shard, and the forgotten key is the one of its shard that would have
///   been full again soonest, so it was missing no more refill time than any
///   other key there. Over any interval, then, the store admits at most
///   `capacity x (new keys that arrived at full shards)` more tokens per quota
///   than an unbounded store would. A flood of fresh keys, each one spend
///   away from full, therefore evicts its own earlier keys before a client that
///   has drained its bucket: limited clients stay limited, and every new client
///   is served and limited from its first request. Clients limited by the same
///   store under policies of very different rates compare by time: a key a
///   few seconds from full goes before one hours from full.
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
    hasher: RandomState,
    epoch: Instant,
}

/// One key's buckets, the microsecond at which all of them are full again, and
/// the key's number in its shard (its place in `order` among equal times).
#[derive(Debug)]
struct Entry {
    buckets: Vec<(Quota, Level)>,
    full_at: u64,
    id: u64,
}

/// One shard's keys, also ordered by when they are full again (then by age).
///
/// Invariant: `order` maps exactly `(entry.full_at, entry.id)` to the key of
/// every entry of `map`, so both have the same length, at most the shard's
/// share of `max_keys`. The order is keyed by two integers, so moving a key in
/// it compares integers and touches no reference count.
#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Arc<str>, Entry>,
    order: BTreeMap<(u64, u64), Arc<str>>,
    next_id: u64,
    /// Keys forgotten to make room before they had refilled.
    #[cfg(test)]
    evicted: u64,
    /// Keys forgotten because they had refilled (free to forget).
    #[cfg(test)]
    forgotten: u64,
}

impl Shard {
    /// Forgets the key that is full again soonest (first of `order`).
    fn forget_first(&mut self, now: u64) {
        if let Some(((full_at, _), key)) = self.order.pop_first() {
            self.map.remove(&key);
            self.count(full_at <= now);
        }
    }

    #[cfg(test)]
    fn count(&mut self, refilled: bool) {
        if refilled {
            self.forgotten += 1;
        } else {
            self.evicted += 1;
        }
    }

    #[cfg(not(test))]
    fn count(&mut self, _refilled: bool) {}

    /// Forgets every key whose buckets are full at `now`.
    fn sweep(&mut self, now: u64) {
        while self
            .order
            .first_key_value()
            .is_some_and(|((at, _), _)| *at <= now)
        {
            self.forget_first(now);
        }
    }

    /// Writes the `levels` of `quotas` into `key`'s buckets (a new key when it
    /// has none yet) and moves the key to its place in `order`.
    fn write(&mut self, key: &str, quotas: &[Quota], levels: Vec<Level>) {
        if let Some(entry) = self.map.get_mut(key) {
            set_levels(&mut entry.buckets, quotas, levels);
            let new = full_at(&entry.buckets);
            if new != entry.full_at {
                let place = (entry.full_at, entry.id);
                entry.full_at = new;
                if let Some(name) = self.order.remove(&place) {
                    self.order.insert((new, entry.id), name);
                }
            }
            return;
        }
        let mut buckets = Vec::with_capacity(quotas.len());
        set_levels(&mut buckets, quotas, levels);
        let entry = Entry {
            full_at: full_at(&buckets),
            buckets,
            id: self.next_id,
        };
        self.next_id += 1;
        let name: Arc<str> = Arc::from(key);
        self.order
            .insert((entry.full_at, entry.id), Arc::clone(&name));
        self.map.insert(name, entry);
    }

    /// Forgets the buckets of `quotas` for `key`, and the key when it has no
    /// bucket left.
    fn reset(&mut self, key: &str, quotas: &[Quota]) {
        let Some(entry) = self.map.get_mut(key) else {
            return;
        };
        entry.buckets.retain(|(q, _)| !quotas.contains(q));
        let place = (entry.full_at, entry.id);
        if entry.buckets.is_empty() {
            self.order.remove(&place);
            self.map.remove(key);
            return;
        }
        let new = full_at(&entry.buckets);
        entry.full_at = new;
        if let Some(name) = self.order.remove(&place) {
            self.order.insert((new, entry.id), name);
        }
    }
}

/// Stores each of `levels` in the bucket of its quota, adding the buckets a
/// key did not have yet.
fn set_levels(buckets: &mut Vec<(Quota, Level)>, quotas: &[Quota], levels: Vec<Level>) {
    for (q, level) in quotas.iter().zip(levels) {
        match buckets.iter_mut().find(|(bq, _)| bq == q) {
            Some(slot) => slot.1 = level,
            None => buckets.push((*q, level)),
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

    /// Forgets every key whose buckets have refilled completely (forgetting
    /// them changes no decision). A full shard forgets such keys first anyway
    /// when it needs room; call this to release memory sooner.
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
        self.spend_at(key, policy, cost, now_us, 0).map(|(d, _)| d)
    }

    /// `reserve` at an explicit microsecond clock (counted from the store's
    /// creation), for tests that control time (cargo feature `test-util`), as
    /// `RedisStore::reserve_at` is for Redis.
    #[cfg(feature = "test-util")]
    pub fn reserve_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        max_wait: Duration,
        now_us: u64,
    ) -> Result<Reservation, Error> {
        let max_wait_us = u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX);
        let (decision, wait) = self.spend_at(key, policy, cost, now_us, max_wait_us)?;
        Ok(Reservation::new(decision, wait))
    }

    /// A reservation at `now_us` that may wait up to `max_wait_us` (0 for a
    /// plain check): the decision and, when admitted, the wait until the
    /// tokens are due.
    fn spend_at(
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
        let stored = shard.map.get(key.as_ref()).map(|e| e.buckets.as_slice());
        let mut levels: Vec<Level> = quotas
            .iter()
            .map(
                |q| match stored.and_then(|b| b.iter().find(|(bq, _)| bq == q)) {
                    Some((_, level)) => level.refilled(q, now_us),
                    None => Level::full(q, now_us),
                },
            )
            .collect();
        let (decision, wait) = spend(quotas, &mut levels, cost, now_us, &debts);
        // A denial or a peek changes nothing, and a peek at an unknown key
        // stores nothing.
        if !decision.allowed() || cost == 0 {
            return Ok((decision, wait));
        }
        if !shard.map.contains_key(key.as_ref()) && shard.map.len() >= self.inner.per_shard {
            shard.forget_first(now_us);
        }
        shard.write(&key, quotas, levels);
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
        let (decision, wait) = self.spend_at(key, policy, cost, self.now(), max_wait_us)?;
        Ok(Reservation::new(decision, wait))
    }

    async fn reset(&self, key: &str, policy: &Policy) -> Result<(), Error> {
        let key = safe_key(key);
        self.shard(&key).reset(&key, policy.quotas());
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

    /// (evicted, forgotten after refilling), summed over the shards.
    fn counts(store: &MemoryStore) -> (u64, u64) {
        store.inner.shards.iter().fold((0, 0), |(e, f), s| {
            let s = lock(s);
            assert_eq!(s.map.len(), s.order.len(), "map and order out of step");
            (e + s.evicted, f + s.forgotten)
        })
    }

    #[test]
    fn a_full_store_forgets_refilled_keys_first_then_the_nearest_to_full() {
        let store = MemoryStore::with_max_keys(2).unwrap();
        let q = Policy::from(Quota::per_second(1).unwrap());
        // A small store is one shard: exactly two keys fit.
        let _ = store.decide_at("k0", &q, 1, 0).unwrap();
        let _ = store.decide_at("k1", &q, 1, 500_000).unwrap();
        // k0 is full again at 1 s, k1 at 1.5 s. At 1.2 s k0 is free to forget.
        assert!(store.decide_at("k2", &q, 1, 1_200_000).unwrap().allowed());
        assert_eq!(counts(&store), (0, 1));
        // Now k1 (full at 1.5 s) is nearer to full than k2 (2.2 s): it goes.
        assert!(store.decide_at("k3", &q, 1, 1_300_000).unwrap().allowed());
        assert_eq!(counts(&store), (1, 1));
        assert_eq!(store.len(), 2);
        // k2 is still known and empty; k1 comes back full, with the 0.2 s of
        // refill it was still missing (less than one token) given back.
        assert!(!store.decide_at("k2", &q, 1, 1_300_000).unwrap().allowed());
        assert!(store.decide_at("k1", &q, 1, 1_300_000).unwrap().allowed());
    }

    #[test]
    fn a_flood_of_new_keys_costs_one_step_each_and_spares_drained_clients() {
        let store = MemoryStore::with_max_keys(100).unwrap();
        let q = Policy::from(Quota::per_hour(100).unwrap());
        // 100 clients, each drained (full again in an hour).
        for i in 0..100 {
            let _ = store.decide_at(&format!("client{i}"), &q, 100, i).unwrap();
        }
        // 10 000 new keys, one request each (each full again 36 s later).
        for i in 0..10_000 {
            let d = store
                .decide_at(&format!("flood{i}"), &q, 1, 1_000 + i)
                .unwrap();
            assert!(d.allowed(), "new clients are served");
        }
        // One key forgotten per new key and no more: no scan, no sweep. The
        // first flood key took the place of the client nearest to full; every
        // later one took the place of the previous flood key.
        assert_eq!(counts(&store), (10_000, 0));
        assert_eq!(store.len(), 100);
        let still_limited = (0..100)
            .filter(|i| {
                !store
                    .decide_at(&format!("client{i}"), &q, 1, 20_000)
                    .unwrap()
                    .allowed()
            })
            .count();
        assert_eq!(still_limited, 99);
        assert!(store.decide_at("client0", &q, 1, 20_000).unwrap().allowed());
    }

    #[test]
    fn reset_keeps_the_order_in_step() {
        let store = MemoryStore::with_max_keys(4).unwrap();
        let a = Quota::per_second(1).unwrap();
        let b = Quota::per_hour(1).unwrap();
        let both = Policy::new("p", [a, b]).unwrap();
        let _ = store.decide_at("k", &both, 1, 0).unwrap();
        let _ = store.decide_at("other", &Policy::from(a), 1, 0).unwrap();
        let shard_full_at = |store: &MemoryStore| {
            let s = store.shard("k");
            s.map.get("k").map(|e| e.full_at)
        };
        assert_eq!(shard_full_at(&store), Some(3_600_000_000));
        // Forgetting the hourly bucket leaves the per-second one, full at 1 s.
        reset_blocking(&store, "k", &Policy::from(b));
        assert_eq!(shard_full_at(&store), Some(1_000_000));
        reset_blocking(&store, "k", &Policy::from(a));
        assert_eq!(shard_full_at(&store), None);
        assert_eq!(store.len(), 1);
        assert_eq!(counts(&store), (0, 0));
    }

    fn reset_blocking(store: &MemoryStore, key: &str, policy: &Policy) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(store.reset(key, policy)).unwrap();
    }

    #[test]
    fn sweep_forgets_only_refilled_keys() {
        let store = MemoryStore::new();
        let fast = Policy::from(Quota::per_second(1_000).unwrap());
        let slow = Policy::from(Quota::per_hour(1).unwrap());
        for i in 0..50 {
            let _ = store.decide_at(&format!("f{i}"), &fast, 1, 0).unwrap();
        }
        let _ = store.decide_at("s", &slow, 1, 0).unwrap();
        for shard in store.inner.shards.iter() {
            lock(shard).sweep(1_000);
        }
        assert_eq!(store.len(), 1);
        assert_eq!(counts(&store), (0, 50));
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
