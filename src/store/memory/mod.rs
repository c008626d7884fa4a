//! Buckets in this process: for single instances, tests, and as a fallback.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::bucket::{Level, Spent, adjust, debt_for, spend};
use super::contract::{Store, validate};
use super::key::{MAX_RAW_KEY_LEN, is_safe, safe_key};
use super::sealed::Sealed;
use super::table::{KeyStart, Table};
use crate::decision::{Decision, Reservation};
use crate::error::{ConfigError, Error};
use crate::lock::lock;
use crate::policy::Policy;
use crate::quota::{Quota, micros};

mod entry;
mod shard;
#[cfg(feature = "test-util")]
mod test_clock;

use super::clock::Clock;
use entry::MAX_KNOWN;
use shard::{Found, Shard, Write, stamped_ahead, writes};

/// The default key limit of [`MemoryStore::new`].
pub const DEFAULT_MAX_KEYS: usize = 100_000;

const MAX_SHARDS: usize = 64;

/// The fewest keys a shard is built for: stores of fewer than
/// `2 * MIN_PER_SHARD` keys have one shard and an exact bound (with few keys
/// per shard, two keys hashing to one shard would make a small store evict
/// early), and large stores fill evenly (the fullest of 64 shards of 1024 or
/// more fills when the store is about 95% full).
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
///   shards, so a shard can be full a little before the whole store is. A key
///   with one quota's bucket takes one 64-byte slot of its shard's table and a
///   place in the shard's eviction order; its name is held in the slot when it
///   is at most 36 bytes, or when what follows the `policy:kind:` start of a
///   layer keyed by a [`Header`](crate::key::Header) is (a UUID, a
///   32-character API key; the store numbers such starts as layers over it
///   are built, up to 255), else on the heap. A shard numbers up to 255
///   quotas; a key under another keeps its quota on the heap.
/// - **A full store keeps serving new clients.** When a new key arrives at a
///   full shard, the shard forgets the one key whose buckets will be full again
///   soonest: a key that has already refilled completely if there is one
///   (forgetting it changes no decision), else the key closest to full (on a
///   tie, either). Each shard keeps its keys ordered by that time, so this
///   costs a logarithmic step per admission, amortised, however hard a flood of
///   new keys pushes. The order is brought up to date when a key must be
///   forgotten, so one check can pay for many admissions before it: at worst
///   every key of its shard (about `max_keys / 64` for large stores), once:
///   after 200 000 admissions to a single shard, one eviction takes tens of
///   milliseconds (the next a few microseconds); at the default 100 000 keys
///   a shard holds about 1 600 keys, and the worst case shrinks with it.
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
/// - **Clock:** the CPU's time-stamp counter where it is reliable (as
///   governor's), the OS's monotonic clock elsewhere: reading
///   `clock_gettime` would be a third of a check's cost. With the
///   `test-util` feature, tokio's `Instant`, so tests can pause and advance
///   time (`tokio::time::pause`).
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
    table: Table<Shard>,
    clock: Clock,
    /// The key starts numbered (see [`MemoryStore::key_start`]): every
    /// shard's `known` starts, in the same order.
    starts: Mutex<Vec<Arc<str>>>,
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
                table: Table::new(shards, max_keys / shards),
                clock: Clock::new(),
                starts: Mutex::new(Vec::new()),
            }),
        }
    }

    /// How many keys the store holds now.
    pub fn len(&self) -> usize {
        self.inner.table.len()
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
        let table = &self.inner.table;
        for mut shard in table.shards() {
            shard.sweep(table.hasher(), now);
        }
    }

    #[inline]
    fn now(&self) -> u64 {
        self.inner.clock.now_us()
    }

    /// The key's hash (computed once per check) and its shard, locked.
    fn shard(&self, key: &str) -> (u64, MutexGuard<'_, Shard>) {
        let hash = self.inner.table.hash(key.as_bytes());
        (hash, self.inner.table.shard(hash))
    }

    /// `start` hashed as the start of keys, and its number in the shards,
    /// for [`check_held`](Self::check_held): `None` for a start no key held
    /// as it is begins with.
    pub(crate) fn key_start(&self, start: &str) -> Option<KeyStart> {
        if start.starts_with('#') || start.len() > MAX_RAW_KEY_LEN {
            return None;
        }
        let number = self.number_start(start);
        Some(self.inner.table.start(start).numbered(number))
    }

    /// `start`'s number in every shard's `known`, given now if it has none
    /// and there is room (keys starting with it are then held in their
    /// slots after it, see `entry`). One lock orders the numbering, so the
    /// shards number starts alike.
    fn number_start(&self, start: &str) -> Option<u8> {
        let mut starts = lock(&self.inner.starts);
        let at = match starts.iter().position(|s| **s == *start) {
            Some(at) => at,
            None if starts.len() < MAX_KNOWN => {
                let start: Arc<str> = Arc::from(start);
                for mut shard in self.inner.table.shards() {
                    shard.known.add_start(Arc::clone(&start));
                }
                starts.push(start);
                starts.len() - 1
            }
            None => return None,
        };
        u8::try_from(at).ok()
    }

    /// A check of the key `start` + `value` at once, when this store holds
    /// the key as it is (a key seen before: the common case) with one bucket,
    /// `quota`'s: the decision [`check_now`](Self::check_now) would make, as
    /// its figures ([`Spent::decision`] builds it with `quota`), for less (no
    /// key written out, the start hashed once). `None`, having changed
    /// nothing, for any other key: check it with `check_now`.
    /// `start` must come from this store's [`key_start`](Self::key_start),
    /// and `cost` must be at most `quota`'s capacity.
    #[inline]
    pub(crate) fn check_held(
        &self,
        start: &KeyStart,
        value: &str,
        quota: &Quota,
        cost: u64,
    ) -> Option<Spent> {
        self.check_held_at(start, value, quota, cost, self.now())
    }

    /// [`check_held`](Self::check_held) at the microsecond `now_us` of this
    /// store's clock.
    #[inline]
    fn check_held_at(
        &self,
        start: &KeyStart,
        value: &str,
        quota: &Quota,
        cost: u64,
        now_us: u64,
    ) -> Option<Spent> {
        // As `update_at`: only a key of at most `MAX_RAW_KEY_LEN` bytes is
        // looked up as it is.
        if start.text().len() + value.len() > MAX_RAW_KEY_LEN {
            return None;
        }
        let hash = start.hash(value.as_bytes());
        self.inner
            .table
            .shard(hash)
            .check_held(hash, start, value, quota, cost, now_us)
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
        let debts: Vec<u64> = if max_wait_us == 0 {
            Vec::new()
        } else {
            policy
                .quotas()
                .iter()
                .map(|q| debt_for(q, max_wait_us))
                .collect()
        };
        // A denial or a peek changes nothing, and a peek at an unknown key
        // stores nothing.
        Ok(
            self.update_at(key, policy, now_us, |quotas, levels, found| {
                let ahead = stamped_ahead(levels, now_us);
                let (decision, wait) = spend(quotas, levels, cost, now_us, &debts);
                // A bucket carried into changed figures is kept under them from
                // its first check on, refused or not (as the script writes it).
                let write = writes(decision.allowed(), cost, levels, now_us, ahead)
                    || (found == Found::Carried && cost != 0);
                ((decision, wait), if write { Write::Yes } else { Write::No })
            }),
        )
    }

    /// [`adjust`]s `key`'s buckets by `delta` tokens at `now_us` (a charge,
    /// or when negative a refund).
    pub(crate) fn adjust_on(&self, key: &str, policy: &Policy, delta: i64, now_us: u64) {
        if delta == 0 {
            return;
        }
        self.update_at(key, policy, now_us, |quotas, levels, found| {
            adjust(quotas, levels, delta);
            // A key not stored (never spent from, or forgotten full) that
            // ends full changes nothing: storing it could only make room by
            // forgetting another client.
            let full = quotas
                .iter()
                .zip(levels.iter())
                .all(|(q, l)| l.until_full_us(q) == 0);
            // Settled under figures that may have changed since (a request
            // decided before a swap): the buckets stay under the figures they
            // were kept under, so a stale policy's rate never comes back.
            let write = match (found, full) {
                (Found::New, true) => Write::No,
                (Found::New, false) => Write::Yes,
                _ => Write::Kept,
            };
            ((), write)
        });
    }

    /// Runs `update` on `key`'s buckets brought up to `now_us` (and whether
    /// the key is stored), and stores them if it says so.
    ///
    /// Every stored name is a safe key, and a safe key that does not start
    /// with `#` is stored as it is. So a key of at most [`MAX_RAW_KEY_LEN`]
    /// bytes, not starting with `#`, that the store holds as it is, is that
    /// key: a client seen before (the common case) is found without the scan
    /// [`safe_key`] makes. A key not found so is scanned, and, when it is not
    /// safe, looked up again in its hashed form.
    fn update_at<T, U>(&self, key: &str, policy: &Policy, now_us: u64, update: U) -> T
    where
        U: FnOnce(&[Quota], &mut [Level], Found) -> (T, Write),
    {
        let quotas = policy.quotas();
        // Levels on the stack for policies of up to four quotas (all the
        // common ones), so a check allocates nothing here.
        let mut inline = [Level::EMPTY; 4];
        let mut spilled = Vec::new();
        let levels: &mut [Level] = match inline.get_mut(..quotas.len()) {
            Some(levels) => levels,
            None => {
                spilled.resize(quotas.len(), Level::EMPTY);
                &mut spilled
            }
        };
        let mut update = update;
        if key.len() <= MAX_RAW_KEY_LEN && !key.starts_with('#') {
            let (hash, mut shard) = self.shard(key);
            match shard.update_found(hash, key, policy, now_us, levels, update) {
                Ok(out) => return out,
                Err(back) if is_safe(key.as_bytes()) => {
                    return self.update_new(&mut shard, hash, key, quotas, now_us, levels, back);
                }
                Err(back) => update = back,
            }
        }
        let key = safe_key(key);
        let (hash, mut shard) = self.shard(&key);
        match shard.update_found(hash, &key, policy, now_us, levels, update) {
            Ok(out) => out,
            Err(back) => self.update_new(&mut shard, hash, &key, quotas, now_us, levels, back),
        }
    }

    /// Runs `update` on full buckets for `key`, a key `shard` does not hold
    /// (in its storage form, `hash` its hash), and stores them if it says so.
    #[expect(clippy::too_many_arguments, reason = "one check's state, passed on")]
    fn update_new<T, U>(
        &self,
        shard: &mut Shard,
        hash: u64,
        key: &str,
        quotas: &[Quota],
        now_us: u64,
        levels: &mut [Level],
        update: U,
    ) -> T
    where
        U: FnOnce(&[Quota], &mut [Level], Found) -> (T, Write),
    {
        for (level, q) in levels.iter_mut().zip(quotas) {
            *level = Level::full(q, now_us);
        }
        let (out, write) = update(quotas, levels, Found::New);
        if write == Write::No {
            return out;
        }
        let table = &self.inner.table;
        if table.is_full(shard) {
            shard.forget_first(table.hasher(), now_us);
        }
        shard.insert(table.hasher(), hash, key, quotas, levels);
        out
    }
}

impl Sealed for MemoryStore {}

impl MemoryStore {
    /// [`Store::check`] without a future: a memory store never waits.
    pub(crate) fn check_now(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.decide_at(key, policy, cost, self.now())
    }

    /// An adjustment after the fact, at once (see [`adjust`]).
    pub(crate) fn adjust_now(&self, key: &str, policy: &Policy, delta: i64) {
        self.adjust_on(key, policy, delta, self.now());
    }
}

impl Store for MemoryStore {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, Error> {
        self.check_now(key, policy, cost)
    }

    async fn reserve(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Reservation, Error> {
        let (decision, wait) = self.spend_at(key, policy, cost, self.now(), micros(max_wait))?;
        Ok(Reservation::new(decision, wait))
    }

    async fn reset(&self, key: &str, policy: &Policy) -> Result<(), Error> {
        let key = safe_key(key);
        let (hash, mut shard) = self.shard(&key);
        shard.reset(hash, &key, policy);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::hostile_input::config())]

        /// A check of a key the store holds decides as the store's own
        /// check does, and leaves the same buckets behind: one schedule
        /// (three keys, costs up to the capacity, a clock that also steps
        /// back) run on two stores, through `check_held` (and `decide_at`
        /// where it declines) and through `decide_at` alone. It declines
        /// exactly the keys not stored yet.
        #[test]
        fn a_held_check_decides_as_the_store_does(
            which in 0usize..6,
            steps in proptest::collection::vec((0usize..3, 0u64..5, -3_000_000i64..4_000_000), 1..80),
        ) {
            let quotas = [
                Quota::per_second(1).unwrap(),
                Quota::per_second(7).unwrap().burst(3).unwrap(),
                Quota::new(5, Duration::from_secs(3)).unwrap().burst(9).unwrap(),
                Quota::per_second(1_000_000).unwrap(),
                Quota::per_minute(100).unwrap(),
                Quota::new(3, Duration::from_micros(1_234_567)).unwrap(),
            ];
            let quota = quotas[which];
            let policy = Policy::from(quota);
            let held = MemoryStore::new();
            let plain = MemoryStore::new();
            let prefix = held.key_start("p:k:").unwrap();
            let mut stored = std::collections::HashSet::new();
            let mut now: u64 = 10_000_000;
            for (key, cost, step) in steps {
                now = now.saturating_add_signed(step);
                let cost = cost.min(quota.capacity());
                let value = format!("c{key}");
                let full = format!("p:k:{value}");
                let expected = plain.decide_at(&full, &policy, cost, now).unwrap();
                let got = match held
                    .check_held_at(&prefix, &value, &quota, cost, now)
                    .map(|spent| spent.decision(&quota))
                {
                    Some(decision) => {
                        proptest::prop_assert!(stored.contains(&key), "held a key never stored");
                        decision
                    }
                    None => {
                        proptest::prop_assert!(!stored.contains(&key), "declined a stored key");
                        held.decide_at(&full, &policy, cost, now).unwrap()
                    }
                };
                proptest::prop_assert_eq!(&got, &expected);
                if got.allowed() && cost != 0 {
                    stored.insert(key);
                }
                let (hash, shard) = held.shard(&full);
                let (plain_hash, plain_shard) = plain.shard(&full);
                let held_entry = shard.get(hash, &full).map(|e| (e.to_vec(&shard.known), e.filed_at, e.full_at(&shard.known)));
                let plain_entry = plain_shard.get(plain_hash, &full).map(|e| (e.to_vec(&plain_shard.known), e.filed_at, e.full_at(&plain_shard.known)));
                proptest::prop_assert_eq!(held_entry, plain_entry);
            }
        }
    }

    #[test]
    fn a_held_check_declines_a_key_stored_under_another_quota_or_too_long() {
        let store = MemoryStore::new();
        let a = Quota::per_second(1).unwrap();
        let b = Quota::per_minute(5).unwrap();
        let prefix = store.key_start("p:k:").unwrap();
        assert!(
            store
                .decide_at("p:k:v", &Policy::from(b), 1, 0)
                .unwrap()
                .allowed()
        );
        assert!(store.check_held_at(&prefix, "v", &a, 1, 0).is_none());
        let d = store
            .check_held_at(&prefix, "v", &b, 1, 0)
            .unwrap()
            .decision(&b);
        assert_eq!(d.remaining(), 3);
        // A key too long to be held as it is is stored hashed: declined.
        let long = "x".repeat(MAX_RAW_KEY_LEN);
        assert!(
            store
                .decide_at(&format!("p:k:{long}"), &Policy::from(a), 1, 0)
                .unwrap()
                .allowed()
        );
        assert!(store.check_held_at(&prefix, &long, &a, 1, 0).is_none());
        // And a prefix no raw key can start with is refused.
        assert!(store.key_start("#p:").is_none());
    }

    /// (evicted, forgotten after refilling), summed over the shards.
    fn counts(store: &MemoryStore) -> (u64, u64) {
        store.inner.table.shards().fold((0, 0), |(e, f), s| {
            assert_eq!(
                s.map.len(),
                s.order.values().sum::<usize>(),
                "map and order out of step"
            );
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
    fn a_key_that_spent_again_is_not_forgotten_at_its_old_time() {
        let store = MemoryStore::with_max_keys(2).unwrap();
        let q = Policy::from(Quota::per_second(1).unwrap().burst(5).unwrap());
        // k0 is full again at 1 s, k1 at 1.5 s.
        let _ = store.decide_at("k0", &q, 1, 0).unwrap();
        let _ = store.decide_at("k1", &q, 1, 500_000).unwrap();
        // k0 spends 3 more at 0.6 s (4.6 tokens, 1.6 left): full again at 4 s,
        // though it is still filed under 1 s.
        assert!(store.decide_at("k0", &q, 3, 600_000).unwrap().allowed());
        // A new key needs room: k1 (1.5 s) is the one nearest to full.
        assert!(store.decide_at("k2", &q, 1, 700_000).unwrap().allowed());
        assert_eq!(counts(&store), (1, 0));
        // k0 is still known: 1.7 tokens, so 2 are refused.
        assert!(!store.decide_at("k0", &q, 2, 700_000).unwrap().allowed());
        // k1 was forgotten: it comes back full.
        assert_eq!(
            store.decide_at("k1", &q, 0, 700_000).unwrap().remaining(),
            5
        );
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
            let (hash, s) = store.shard("k");
            s.get(hash, "k").map(|e| (e.full_at(&s.known), e.filed_at))
        };
        assert_eq!(shard_full_at(&store), Some((3_600_000_000, 3_600_000_000)));
        // Forgetting the hourly bucket leaves the per-second one, full at 1 s.
        reset_blocking(&store, "k", &Policy::from(b));
        assert_eq!(shard_full_at(&store), Some((1_000_000, 1_000_000)));
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
        for mut shard in store.inner.table.shards() {
            shard.sweep(store.inner.table.hasher(), 1_000);
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

    /// A refund of a key not stored (forgotten full, or never spent from)
    /// stores nothing: it could only make room by forgetting another
    /// client. A charge stores the debt; a refund of a stored key updates it.
    #[test]
    fn a_refund_of_an_unknown_key_stores_nothing() {
        let store = MemoryStore::new();
        let q = Policy::from(Quota::per_second(3).unwrap());
        store.adjust_on("x", &q, -2, 0);
        assert!(store.is_empty());
        store.adjust_on("x", &q, 5, 0);
        assert_eq!(store.len(), 1);
        let d = store.decide_at("x", &q, 0, 0).unwrap();
        assert_eq!((d.allowed(), d.remaining()), (false, 0));
        store.adjust_on("x", &q, -3, 0);
        assert_eq!(store.decide_at("x", &q, 0, 0).unwrap().remaining(), 1);
    }

    /// Keys found as they are skip `safe_key`'s scan: that must never find
    /// a bucket `safe_key` would not. A key that is the hashed form of
    /// another is hashed again (it starts with `#`), and an unsafe key is
    /// found in its hashed form, the first time and the next.
    #[test]
    fn keys_found_as_they_are_are_their_own_storage_form() {
        let store = MemoryStore::new();
        let q = Policy::from(Quota::per_hour(3).unwrap());
        let long = "k".repeat(200);
        let _ = store.decide_at(&long, &q, 3, 0).unwrap();
        let hashed = crate::store::hashed_key(long.as_bytes());
        assert_eq!(store.decide_at(&hashed, &q, 1, 0).unwrap().remaining(), 2);
        assert!(!store.decide_at(&long, &q, 1, 0).unwrap().allowed());
        for left in [2, 1] {
            let d = store.decide_at("a b", &q, 1, 0).unwrap();
            assert_eq!(d.remaining(), left);
        }
        let d = store
            .decide_at(&crate::store::hashed_key(b"a b"), &q, 0, 0)
            .unwrap();
        assert_eq!(
            d.remaining(),
            3,
            "\"a b\" is kept under its hash, as a hash"
        );
        // The long key, its hash hashed again, and "a b" (the peek stored nothing).
        assert_eq!(store.len(), 3);
    }

    #[test]
    fn long_keys_are_stored_hashed() {
        let store = MemoryStore::new();
        let q = Policy::from(Quota::per_second(3).unwrap());
        let _ = store.decide_at(&"k".repeat(1 << 16), &q, 1, 0).unwrap();
        let shard_keys: Vec<String> = store
            .inner
            .table
            .shards()
            .flat_map(|s| s.map.iter().map(|e| e.name(&s.known)).collect::<Vec<_>>())
            .collect();
        assert_eq!(shard_keys.len(), 1);
        assert!(shard_keys[0].len() <= 33);
    }
}
