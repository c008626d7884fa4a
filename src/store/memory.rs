//! Buckets in this process: for single instances, tests, and as a fallback.

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::collections::{BTreeMap, btree_map};

use hashbrown::HashTable;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;

use super::bucket::{Level, adjust, debt_for, spend, spend_one};
use super::contract::{Store, validate};
use super::key::{MAX_RAW_KEY_LEN, is_safe, safe_key};
use super::sealed::Sealed;
use std::time::Duration;

use crate::decision::Decision;
use crate::decision::Reservation;
use crate::error::{ConfigError, Error};
use crate::policy::Policy;
use crate::quota::Quota;
use crate::quota::micros;
mod entry;
#[cfg(feature = "test-util")]
mod test_clock;

use entry::{Entry, Known, MAX_KNOWN};

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
    shards: Box<[Padded<Mutex<Shard>>]>,
    per_shard: usize,
    hasher: RandomState,
    epoch: Instant,
    /// The key starts numbered (see [`MemoryStore::key_prefix`]): every
    /// shard's `known` starts, in the same order.
    starts: Mutex<Vec<Arc<str>>>,
}

/// Writes the `levels` of `quotas` into `entry`'s buckets (`hash` its
/// hash), and files it again in `order` (its shard's) if it is now full
/// sooner than where it is filed.
fn store(
    entry: &mut Entry,
    order: &mut Order,
    known: &mut Known,
    hash: u64,
    (quotas, carries): (&[Quota], bool),
    levels: &[Level],
) {
    entry.set(known, quotas, carries, levels);
    let full_at = entry.full_at(known);
    if full_at < entry.filed_at {
        // Never from an admission (see `Shard`); kept exact anyway.
        unfile(order, entry.filed_at, hash);
        entry.filed_at = full_at;
        file(order, full_at, hash);
    }
}

/// Keys by the time they are filed under, then by hash: how many keys of
/// the shard are filed so (two keys share a place only when their hashes
/// are equal, which a random seed makes a matter of chance, and then either
/// may go first).
type Order = BTreeMap<(u64, u64), usize>;

/// Files one more key at `(at, hash)`.
fn file(order: &mut Order, at: u64, hash: u64) {
    *order.entry((at, hash)).or_insert(0) += 1;
}

/// Takes one key filed at `(at, hash)` out of `order`.
fn unfile(order: &mut Order, at: u64, hash: u64) {
    if let btree_map::Entry::Occupied(mut place) = order.entry((at, hash)) {
        if *place.get() > 1 {
            *place.get_mut() -= 1;
        } else {
            place.remove();
        }
    }
}

/// Whether a check of `cost` decided `decision` changed its buckets: an
/// admission of something, or a refusal that locked a bucket out (one more
/// of `levels` stamped ahead of `now` than the `ahead` before it). A peek, or
/// another refusal, changes nothing.
fn writes(decision: &Decision, cost: u64, levels: &[Level], now: u64, ahead: usize) -> bool {
    cost != 0 && (decision.allowed() || stamped_ahead(levels, now) > ahead)
}

/// Whether a check found its key stored, and whether a bucket of it was
/// kept under other figures of its quota's period and carried into them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Found {
    New,
    Stored,
    Carried,
}

/// What an update of a key's buckets stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    /// Nothing: the buckets stay as they were.
    No,
    /// The buckets, under the update's quotas.
    Yes,
    /// The buckets, each under the figures it was kept under (an adjustment
    /// under a policy that may be stale, carried back).
    Kept,
}

/// How many of `levels` are stamped after `now`: locked out, or by a clock
/// that went back.
fn stamped_ahead(levels: &[Level], now: u64) -> usize {
    levels.iter().filter(|l| l.stamp > now).count()
}

/// One shard's keys, also ordered by when they are full again (then by hash).
///
/// Invariant: `order` counts one `(entry.filed_at, hash)` for every entry of
/// `map` (`hash` the entry's), so its counts add up to the map's length, at
/// most the shard's share of `max_keys`; and `filed_at <= full_at`, the time
/// the key's buckets are all full again (computed, not stored). An admission
/// only ever moves a key's `full_at` later (spending empties, and a bucket
/// that refilled to full while idle was full before `now`), so it updates
/// the buckets alone and leaves the key where it is filed: a check touches
/// the map once and `order` not at all. The order is brought up to date
/// where it is read: a key found first whose `full_at` moved on is filed
/// again under it, so the first key whose filed time is current is the one
/// full again soonest (every other key's `full_at` is at least its filed
/// time, which is at least this one's). Each admission leaves at most one key
/// to refile, so the reads cost a logarithmic step per admission, amortised.
///
/// `map` is keyed by the key's hash, computed once per check with the store's
/// random seed; the same hash picks the shard.
///
/// `repr(C)`, in the order a check reads it: the lock, the table and the
/// quotas by number share the shard's first cache line.
#[derive(Debug, Default)]
#[repr(C)]
struct Shard {
    map: HashTable<Entry>,
    /// What the entries of `map` refer to by number.
    known: Known,
    order: Order,
    /// Keys forgotten to make room before they had refilled.
    #[cfg(test)]
    evicted: u64,
    /// Keys forgotten because they had refilled (free to forget).
    #[cfg(test)]
    forgotten: u64,
}

const _: () = assert!(
    std::mem::offset_of!(Shard, known) + std::mem::size_of::<Vec<Quota>>() <= 56,
    "the table and the numbered quotas fit the lock's cache line"
);

impl Shard {
    #[cfg(test)]
    fn get(&self, hash: u64, key: &str) -> Option<&Entry> {
        self.map.find(hash, |e| e.is(&self.known, key))
    }

    /// Files the first key of `order` under its current `full_at` until the
    /// first one is current, and returns its place: `(filed_at, hash)`, its
    /// `filed_at` its `full_at` now.
    fn first_current(&mut self, hasher: &RandomState) -> Option<(u64, u64)> {
        loop {
            let (&(filed_at, hash), _) = self.order.first_key_value()?;
            let known = &self.known;
            let full_at = match self
                .map
                .find_mut(hash, filed_as(hasher, known, filed_at, hash))
            {
                Some(entry) => {
                    let full_at = entry.full_at(known);
                    if full_at <= filed_at {
                        return Some((filed_at, hash));
                    }
                    entry.filed_at = full_at;
                    full_at
                }
                None => return Some((filed_at, hash)),
            };
            unfile(&mut self.order, filed_at, hash);
            file(&mut self.order, full_at, hash);
        }
    }

    /// Forgets the key that is full again soonest.
    fn forget_first(&mut self, hasher: &RandomState, now: u64) {
        let Some((at, hash)) = self.first_current(hasher) else {
            return;
        };
        unfile(&mut self.order, at, hash);
        if let Ok(entry) = self
            .map
            .find_entry(hash, filed_as(hasher, &self.known, at, hash))
        {
            entry.remove();
        }
        self.count(at <= now);
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
    fn sweep(&mut self, hasher: &RandomState, now: u64) {
        while self
            .first_current(hasher)
            .is_some_and(|(full_at, _)| full_at <= now)
        {
            self.forget_first(hasher, now);
        }
    }

    /// Runs `update` on `key`'s buckets brought up to `now_us` (`levels`
    /// holds them meanwhile) and stores them if it says so: one probe of the
    /// table, the buckets updated where they are. `update` comes back when
    /// the shard does not hold `key` (in its storage form, `hash` its hash).
    fn update_found<T, U>(
        &mut self,
        hash: u64,
        key: &str,
        policy: &Policy,
        now_us: u64,
        levels: &mut [Level],
        update: U,
    ) -> Result<T, U>
    where
        U: FnOnce(&[Quota], &mut [Level], Found) -> (T, Write),
    {
        let (quotas, carries) = (policy.quotas(), policy.carries());
        let Shard {
            map, order, known, ..
        } = self;
        let Some(entry) = map.find_mut(hash, |e| e.is(known, key)) else {
            return Err(update);
        };
        let found = match entry.levels(known, quotas, carries, now_us, levels) {
            true => Found::Carried,
            false => Found::Stored,
        };
        let (out, write) = update(quotas, levels, found);
        match write {
            Write::No => {}
            Write::Yes => store(entry, order, known, hash, (quotas, carries), levels),
            Write::Kept if found == Found::Carried => {
                // Each bucket carried back into the figures it was kept
                // under, and kept under them.
                let mut kept = Vec::with_capacity(quotas.len());
                let mut back = Vec::with_capacity(quotas.len());
                for (q, level) in quotas.iter().zip(levels.iter()) {
                    let k = entry.kept(known, q, carries).unwrap_or(*q);
                    back.push(level.carried(q.full(), k.full()));
                    kept.push(k);
                }
                store(entry, order, known, hash, (&kept, carries), &back);
            }
            Write::Kept => store(entry, order, known, hash, (quotas, carries), levels),
        }
        Ok(out)
    }

    /// A check of `cost` against `quota` for the key `prefix` + `value`
    /// (`hash` its hash), when this shard holds it as it is with `quota`'s
    /// bucket alone: as [`update_found`](Self::update_found) with
    /// [`spend`] would decide it. `None`, having changed nothing, otherwise.
    fn check_held(
        &mut self,
        hash: u64,
        prefix: &KeyPrefix,
        value: &str,
        quota: &Quota,
        cost: u64,
        now_us: u64,
    ) -> Option<Decision> {
        let known = &self.known;
        let entry = self.map.find_mut(hash, |e| {
            e.is_held(known, prefix.number, &prefix.text, value)
        })?;
        let filed_at = entry.filed_at;
        let stored = entry.held_level(known, quota)?;
        let mut level = stored.refilled(quota, now_us);
        let ahead = usize::from(level.stamp > now_us);
        let decision = spend_one(quota, &mut level, cost, now_us);
        if writes(&decision, cost, std::slice::from_ref(&level), now_us, ahead) {
            // An admission (or a lock-out) only moves the key's `full_at`
            // later (see `Shard`): it stays where it is filed.
            debug_assert!(
                level.full_at(quota) >= filed_at,
                "an admission filed a key earlier"
            );
            *stored = level;
        }
        Some(decision)
    }

    /// Stores the `levels` of `quotas` as the buckets of `key`, a key this
    /// shard does not hold yet (`hash` is the key's).
    fn insert(
        &mut self,
        hasher: &RandomState,
        hash: u64,
        key: &str,
        quotas: &[Quota],
        levels: &[Level],
    ) {
        let full_at = quotas
            .iter()
            .zip(levels)
            .map(|(q, l)| l.full_at(q))
            .max()
            .unwrap_or(0);
        file(&mut self.order, full_at, hash);
        let entry = Entry::new(&mut self.known, key, quotas, levels, full_at);
        let known = &self.known;
        self.map
            .insert_unique(hash, entry, |e| e.hash(hasher, known));
    }

    /// Forgets the buckets of `quotas` for `key`, and the key when it has no
    /// bucket left.
    fn reset(&mut self, hash: u64, key: &str, policy: &Policy) {
        let quotas = policy.quotas();
        let known = &self.known;
        let Ok(mut found) = self.map.find_entry(hash, |e| e.is(known, key)) else {
            return;
        };
        let entry = found.get_mut();
        let emptied = entry.remove(known, quotas, policy.carries());
        let filed_at = entry.filed_at;
        unfile(&mut self.order, filed_at, hash);
        if emptied {
            found.remove();
            return;
        }
        let full_at = entry.full_at(known);
        entry.filed_at = full_at;
        file(&mut self.order, full_at, hash);
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
                shards: (0..shards)
                    .map(|_| Padded(Mutex::new(Shard::default())))
                    .collect(),
                per_shard: max_keys / shards,
                hasher: RandomState::new(),
                epoch: Instant::now(),
                starts: Mutex::new(Vec::new()),
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
            lock(shard).sweep(&self.inner.hasher, now);
        }
    }

    fn now(&self) -> u64 {
        micros(self.inner.epoch.elapsed())
    }

    /// The key's hash (computed once per check) and its shard, locked.
    fn shard(&self, key: &str) -> (u64, MutexGuard<'_, Shard>) {
        let hash = hash_key(&self.inner.hasher, key);
        (hash, self.shard_of(hash))
    }

    /// The shard of the key hashed to `hash`, locked.
    fn shard_of(&self, hash: u64) -> MutexGuard<'_, Shard> {
        let shards = &self.inner.shards;
        // Bits 25 to 56 pick the shard, as `bits x len / 2^32` (an even
        // spread below `len`, without a division): the table inside a shard
        // indexes by the low bits and tags each slot with the top 7, and
        // neither may be the same for all of a shard's keys (shards chosen
        // by the top bits left the tags two values of 128 with 64 shards,
        // so a probe compared about half the names it met).
        let bits = (hash >> 25) & 0xFFFF_FFFF;
        let index = usize::try_from((bits * shards.len() as u64) >> 32).unwrap_or(0);
        match shards.get(index).or(shards.first()) {
            Some(shard) => lock(shard),
            None => unreachable_empty(),
        }
    }

    /// `prefix` hashed as the start of keys, for [`check_held`](Self::check_held):
    /// `None` for a prefix no key held as it is starts with.
    pub(crate) fn key_prefix(&self, prefix: String) -> Option<KeyPrefix> {
        if prefix.starts_with('#') || prefix.len() > MAX_RAW_KEY_LEN {
            return None;
        }
        let mut state = self.inner.hasher.build_hasher();
        state.write(prefix.as_bytes());
        let number = self.number_start(&prefix);
        Some(KeyPrefix {
            text: prefix.into_boxed_str(),
            state,
            number,
        })
    }

    /// `start`'s number in every shard's `known`, given now if it has none
    /// and there is room (keys starting with it are then held in their
    /// slots after it, see `entry`). One lock orders the numbering, so the
    /// shards number starts alike.
    fn number_start(&self, start: &str) -> Option<u8> {
        let mut starts = self
            .inner
            .starts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let at = match starts.iter().position(|s| **s == *start) {
            Some(at) => at,
            None if starts.len() < MAX_KNOWN => {
                let start: Arc<str> = Arc::from(start);
                for shard in self.inner.shards.iter() {
                    lock(shard).known.add_start(Arc::clone(&start));
                }
                starts.push(start);
                starts.len() - 1
            }
            None => return None,
        };
        u8::try_from(at).ok()
    }

    /// A check of the key `prefix` + `value` at once, when this store holds
    /// the key as it is (a key seen before: the common case) with one bucket,
    /// `quota`'s: the decision [`check_now`](Self::check_now) would make, for
    /// less (no key written out, the prefix hashed once). `None`, having
    /// changed nothing, for any other key: check it with `check_now`.
    /// `prefix` must come from this store's [`key_prefix`](Self::key_prefix),
    /// and `cost` must be at most `quota`'s capacity.
    pub(crate) fn check_held(
        &self,
        prefix: &KeyPrefix,
        value: &str,
        quota: &Quota,
        cost: u64,
    ) -> Option<Decision> {
        self.check_held_at(prefix, value, quota, cost, self.now())
    }

    /// [`check_held`](Self::check_held) at the microsecond `now_us` of this
    /// store's clock.
    fn check_held_at(
        &self,
        prefix: &KeyPrefix,
        value: &str,
        quota: &Quota,
        cost: u64,
        now_us: u64,
    ) -> Option<Decision> {
        // As `update_at`: only a key of at most `MAX_RAW_KEY_LEN` bytes is
        // looked up as it is.
        if prefix.text.len() + value.len() > MAX_RAW_KEY_LEN {
            return None;
        }
        // The hash of the whole key: SipHash over bytes written in pieces
        // is the hash of the pieces written at once.
        let mut state = prefix.state.clone();
        state.write(value.as_bytes());
        let hash = state.finish();
        self.shard_of(hash)
            .check_held(hash, prefix, value, quota, cost, now_us)
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
                let write = writes(&decision, cost, levels, now_us, ahead)
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
        let hasher = &self.inner.hasher;
        if shard.map.len() >= self.inner.per_shard {
            shard.forget_first(hasher, now_us);
        }
        shard.insert(hasher, hash, key, quotas, levels);
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

/// The start of keys, hashed with one store's seed: see
/// [`MemoryStore::check_held`].
#[derive(Clone, Debug)]
pub(crate) struct KeyPrefix {
    text: Box<str>,
    state: DefaultHasher,
    /// The start's number in the store's shards, if it has one.
    number: Option<u8>,
}

/// An entry filed at `at` whose key hashes to `hash` (the table's probe
/// meets keys of other hashes too; only those filed at `at` are hashed).
fn filed_as<'a>(
    hasher: &'a RandomState,
    known: &'a Known,
    at: u64,
    hash: u64,
) -> impl Fn(&Entry) -> bool + 'a {
    move |e| e.filed_at == at && e.hash(hasher, known) == hash
}

/// A shard on cache lines of its own, so that locking it never takes a line
/// of its neighbour's from the other core.
#[derive(Debug)]
#[repr(align(128))]
struct Padded<T>(T);

/// `key`'s hash, with the store's random seed: its bytes alone, without the
/// end marker `str`'s `Hash` adds (no other value is hashed with it).
fn hash_key(hasher: &RandomState, key: &str) -> u64 {
    let mut state = hasher.build_hasher();
    state.write(key.as_bytes());
    state.finish()
}

/// A poisoned shard only means another thread panicked mid-update of plain
/// integers; the data is still usable, so keep limiting rather than panic.
fn lock(shard: &Padded<Mutex<Shard>>) -> MutexGuard<'_, Shard> {
    shard
        .0
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
            let prefix = held.key_prefix("p:k:".to_owned()).unwrap();
            let mut stored = std::collections::HashSet::new();
            let mut now: u64 = 10_000_000;
            for (key, cost, step) in steps {
                now = now.saturating_add_signed(step);
                let cost = cost.min(quota.capacity());
                let value = format!("c{key}");
                let full = format!("p:k:{value}");
                let expected = plain.decide_at(&full, &policy, cost, now).unwrap();
                let got = match held.check_held_at(&prefix, &value, &quota, cost, now) {
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
        let prefix = store.key_prefix("p:k:".to_owned()).unwrap();
        assert!(
            store
                .decide_at("p:k:v", &Policy::from(b), 1, 0)
                .unwrap()
                .allowed()
        );
        assert_eq!(store.check_held_at(&prefix, "v", &a, 1, 0), None);
        let d = store.check_held_at(&prefix, "v", &b, 1, 0).unwrap();
        assert_eq!(d.remaining(), 3);
        // A key too long to be held as it is is stored hashed: declined.
        let long = "x".repeat(MAX_RAW_KEY_LEN);
        assert!(
            store
                .decide_at(&format!("p:k:{long}"), &Policy::from(a), 1, 0)
                .unwrap()
                .allowed()
        );
        assert_eq!(store.check_held_at(&prefix, &long, &a, 1, 0), None);
        // And a prefix no raw key can start with is refused.
        assert!(store.key_prefix("#p:".to_owned()).is_none());
    }

    /// (evicted, forgotten after refilling), summed over the shards.
    fn counts(store: &MemoryStore) -> (u64, u64) {
        store.inner.shards.iter().fold((0, 0), |(e, f), s| {
            let s = lock(s);
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
        for shard in store.inner.shards.iter() {
            lock(shard).sweep(&store.inner.hasher, 1_000);
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
            .shards
            .iter()
            .flat_map(|s| {
                let s = lock(s);
                s.map.iter().map(|e| e.name(&s.known)).collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(shard_keys.len(), 1);
        assert!(shard_keys[0].len() <= 33);
    }
}
