//! The local deny cache: when the store denies a client, remember until when
//! the same cost (or any larger one) cannot be admitted, and deny locally until
//! then, without asking the store.
//!
//! It cannot deny what the store would admit: other instances can only spend
//! tokens from the bucket, never add them, so a bucket that lacked the cost
//! until some time lacks it at least as long. The wait is counted from when the
//! check was sent, which is before the store decided, so the cache's deadline
//! is never later than the store's (counting from the reply's arrival would
//! deny for the reply's travel time after the token is due). Two events do add tokens,
//! and the cache does not see them on other instances: a `reset` (seen at once
//! on the instance that made it), and the store losing its data (a Redis
//! restart or failover without the key). Either way a denied client waits at
//! most the wait it was told.
//!
//! Memory is bounded: at most `capacity` entries, spread over shards by a
//! hash seeded at random per cache, each behind its own short-held lock; when
//! a shard is full, expired entries make room, and if none has expired the new
//! denial is simply not cached.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::decision::{Decision, QuotaState, States};
use crate::quota::micros;

/// Default number of denials a store keeps.
pub const DEFAULT_DENY_CACHE: usize = 10_000;

const SHARDS: usize = 16;

/// What one cached denial remembers.
#[derive(Debug)]
struct Entry {
    /// The storage keys of the buckets, to tell a hash collision from a hit.
    keys: Box<[String]>,
    cost: u64,
    decision: Decision,
    /// When the check that was denied was sent.
    at: Instant,
    /// Until when the same cost cannot be admitted.
    until: Instant,
}

/// A shard's entries are keyed by their keys' hash, already a SipHash seeded
/// at random per cache: the table indexes by it as it is, instead of hashing
/// it again.
#[derive(Debug, Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here (`write_u64`); anything else is
        // folded in, never dropped.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<u64, Entry, BuildHasherDefault<Prehashed>>,
    /// No entry of this shard expires before this: a full shard does not
    /// rescan until then.
    quiet_until: Option<Instant>,
}

/// Cached denials of one store.
#[derive(Debug)]
pub(crate) struct DenyCache {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
    /// When the cache was made; [`latest`](Self::latest) counts from here.
    base: Instant,
    /// The latest `until` of every denial ever cached, in microseconds after
    /// `base`, rounded up; it only grows. Once the clock has passed it, every
    /// entry has expired, so a lookup answers at once, without hashing the
    /// keys (no client denied for a while, or none yet). A lookup that reads
    /// it while another thread caches a denial acts as if it came just
    /// before: it asks the store.
    latest: AtomicU64,
}

impl DenyCache {
    /// A cache of at most `capacity` denials (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        DenyCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard,
            hasher: RandomState::new(),
            base: Instant::now(),
            latest: AtomicU64::new(0),
        }
    }

    fn hash(&self, keys: &[String]) -> u64 {
        self.hasher.hash_one(keys)
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard> {
        // The high half picks the shard: the shard's table indexes by the
        // low bits, which must not be the same for all of its entries.
        let index = usize::try_from((hash >> 32) % SHARDS as u64).unwrap_or(0);
        let shard = match self.shards.get(index).or(self.shards.first()) {
            Some(shard) => shard,
            // `new` always makes SHARDS shards.
            None => unreachable!("deny cache without shards"),
        };
        shard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The denial of `cost` on these buckets, if one is cached and still holds:
    /// the cached decision with its waits counted down to now.
    pub(crate) fn lookup(&self, keys: &[String], cost: u64) -> Option<Decision> {
        let now = Instant::now();
        if micros(now.saturating_duration_since(self.base)) >= self.latest.load(Ordering::Relaxed) {
            return None;
        }
        let hash = self.hash(keys);
        let mut shard = self.shard(hash);
        let entry = shard.entries.get(&hash)?;
        if *entry.keys != *keys {
            return None;
        }
        // Read again under the lock: this entry may have been cached after
        // the first read (from a check sent after it), and its wait is
        // counted down from when that check was sent.
        let now = Instant::now();
        if now >= entry.until {
            shard.entries.remove(&hash);
            return None;
        }
        if cost < entry.cost {
            return None;
        }
        Some(counted_down(&entry.decision, now - entry.at))
    }

    /// Remembers that the store denied `cost` on these buckets with `decision`,
    /// for a check sent at `sent`.
    pub(crate) fn insert(&self, keys: Vec<String>, cost: u64, decision: &Decision, sent: Instant) {
        let wait = decision.retry_after();
        if wait.is_zero() || cost == 0 {
            return;
        }
        let now = Instant::now();
        let Some(until) = sent.checked_add(wait).filter(|until| *until > now) else {
            return;
        };
        let hash = self.hash(&keys);
        let mut shard = self.shard(hash);
        if !shard.entries.contains_key(&hash) && shard.entries.len() >= self.per_shard {
            if shard.quiet_until.is_some_and(|q| now < q) {
                return;
            }
            let mut next = None::<Instant>;
            shard.entries.retain(|_, e| {
                let keep = e.until > now;
                if keep {
                    next = Some(next.map_or(e.until, |n| n.min(e.until)));
                }
                keep
            });
            shard.quiet_until = next;
            if shard.entries.len() >= self.per_shard {
                return;
            }
        }
        shard.entries.insert(
            hash,
            Entry {
                keys: keys.into_boxed_slice(),
                cost,
                decision: decision.clone(),
                at: sent,
                until,
            },
        );
        // Rounded up: a clock read at or past it is at or past `until`.
        let since = until.saturating_duration_since(self.base);
        let until_us = micros(since).saturating_add(u64::from(since.subsec_nanos() % 1_000 != 0));
        self.latest.fetch_max(until_us, Ordering::Relaxed);
        shard.quiet_until = Some(shard.quiet_until.map_or(until, |q| q.min(until)));
    }

    /// Forgets the denial of these buckets (after a `reset`).
    pub(crate) fn forget(&self, keys: &[String]) {
        let hash = self.hash(keys);
        let mut shard = self.shard(hash);
        if shard.entries.get(&hash).is_some_and(|e| *e.keys == *keys) {
            shard.entries.remove(&hash);
        }
    }

    /// How many denials are cached (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |s| s.entries.len()))
            .sum()
    }
}

/// `decision`, `elapsed` later: every wait shorter by `elapsed`, and each
/// bucket's remaining tokens at least what its shorter time to full implies.
fn counted_down(decision: &Decision, elapsed: Duration) -> Decision {
    let count = |s: &QuotaState| {
        let q = *s.quota();
        let retry = s.retry_after().saturating_sub(elapsed);
        let reset = s.reset_after().saturating_sub(elapsed);
        let reset_us = crate::quota::micros(reset);
        // The level is at least full - reset x num (reset was rounded up).
        let missing = u128::from(reset_us) * u128::from(q.num());
        let level = u128::from(q.full()).saturating_sub(missing);
        let implied = u64::try_from(level / u128::from(q.den())).unwrap_or(u64::MAX);
        QuotaState::new(
            q,
            s.remaining().max(implied),
            crate::quota::micros(retry),
            reset_us,
        )
    };
    // One quota (the common case) stays inline: a cached denial allocates nothing.
    match decision.states() {
        [one] => Decision::new(false, States::One(count(one))),
        many => Decision::new(false, many.iter().map(count).collect::<Vec<_>>()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryStore, Policy, Quota};

    fn denied(policy: &Policy) -> Decision {
        let store = MemoryStore::new();
        let _ = store.decide_at("k", policy, policy.max_cost(), 0).unwrap();
        let d = store.decide_at("k", policy, 1, 0).unwrap();
        assert!(!d.allowed());
        d
    }

    #[tokio::test(start_paused = true)]
    async fn a_denial_holds_until_the_wait_is_over_for_that_cost_and_more() {
        // 1 a second, burst 2: after 2 spent, 1 token is 1 s away.
        let policy = Policy::from(Quota::per_second(1).unwrap().burst(2).unwrap());
        let cache = DenyCache::new(100);
        let keys = vec!["a".to_owned()];
        cache.insert(keys.clone(), 1, &denied(&policy), Instant::now());
        let d = cache.lookup(&keys, 1).unwrap();
        assert_eq!(d.retry_after(), Duration::from_secs(1));
        assert!(cache.lookup(&keys, 2).is_some(), "a larger cost waits too");
        assert!(cache.lookup(&keys, 0).is_none(), "a peek asks the store");
        assert!(cache.lookup(&["b".to_owned()], 1).is_none());
        tokio::time::advance(Duration::from_millis(600)).await;
        let d = cache.lookup(&keys, 1).unwrap();
        assert_eq!(d.retry_after(), Duration::from_millis(400));
        assert_eq!(d.reset_after(), Duration::from_millis(1_400));
        tokio::time::advance(Duration::from_millis(400)).await;
        assert!(cache.lookup(&keys, 1).is_none(), "due: ask the store");
    }

    #[tokio::test(start_paused = true)]
    async fn lookups_skip_the_cache_once_every_denial_has_expired() {
        let policy = Policy::from(Quota::per_second(1).unwrap().burst(2).unwrap());
        let cache = DenyCache::new(100);
        let (a, b) = (vec!["a".to_owned()], vec!["b".to_owned()]);
        // Nothing cached yet: nothing to find.
        assert!(cache.lookup(&a, 1).is_none());
        cache.insert(a.clone(), 1, &denied(&policy), Instant::now());
        tokio::time::advance(Duration::from_millis(500)).await;
        cache.insert(b.clone(), 1, &denied(&policy), Instant::now());
        // At 1 s, a is due and b is not: the cache is read, and a's expired
        // entry dropped.
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(cache.lookup(&a, 1).is_none());
        assert_eq!(cache.len(), 1);
        assert!(cache.lookup(&b, 1).is_some());
        // One microsecond short of b's deadline b still holds; at it, every
        // denial has expired and lookups no longer read the shards (b's
        // entry stays until an insert needs the room).
        tokio::time::advance(Duration::from_micros(499_999)).await;
        assert!(cache.lookup(&b, 1).is_some());
        tokio::time::advance(Duration::from_micros(1)).await;
        assert!(cache.lookup(&b, 1).is_none());
        assert_eq!(cache.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_bounded_and_expired_entries_make_room() {
        let policy = Policy::from(Quota::per_second(1).unwrap());
        let d = denied(&policy);
        let cache = DenyCache::new(SHARDS);
        for i in 0..1_000 {
            cache.insert(vec![format!("k{i}")], 1, &d, Instant::now());
        }
        assert!(cache.len() <= SHARDS, "{}", cache.len());
        tokio::time::advance(Duration::from_secs(2)).await;
        cache.insert(vec!["late".to_owned()], 1, &d, Instant::now());
        assert!(cache.lookup(&["late".to_owned()], 1).is_some());
        let held = cache.len();
        cache.forget(&["late".to_owned()]);
        assert!(cache.lookup(&["late".to_owned()], 1).is_none());
        assert_eq!(cache.len(), held - 1);
    }
}
