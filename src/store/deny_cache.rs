//! The local deny cache: when the store denies a client, remember until when
//! the same cost (or any larger one) cannot be admitted, and deny locally until
//! then, without asking the store.
//!
//! What holds, and why:
//!
//! - **A client that waits the `Retry-After` it was told is never denied
//!   here.** A denial is kept for at most the wait the store gave, counted
//!   from when the check was sent, which is before the store decided and
//!   before the client heard the answer. The waits the cache tells are
//!   counted down from when the answer arrived instead, which is after the
//!   store decided: they may overstate by the reply's travel time, never
//!   understate.
//! - **It denies only what the store would deny, while the store's clock
//!   runs at most 0.1 % faster than this process's monotonic clock, and no
//!   other instance refunds tokens.** Checks of other instances can only
//!   spend tokens from a bucket, never add them, so a bucket that lacked the
//!   cost until some time lacks it at least as long. A refund (a layer's
//!   [`settle`](crate::layer::RateLimitLayer::settle),
//!   [`RateLimiter::refund`](crate::RateLimiter::refund)) made on this
//!   instance forgets the denials it remembered for those buckets; one made
//!   on another instance is not seen here, so this instance may go on
//!   denying until the wait it remembered is over: it limits more, never
//!   less. Set the deny cache off (`deny_cache(0)`) for limits whose
//!   refunds matter to the second.
//!   But the store's waits are counted by its clock (Redis `TIME`, the wall
//!   clock of the Redis host) and this cache counts them down by the local
//!   monotonic clock, so a denial is kept for the store's wait less 0.1 %
//!   (`DRIFT_DIVISOR`): twice the most ntpd slews a clock (0.05 %), so both
//!   hosts' clocks may be slewed at that rate in opposite directions. If
//!   the store's clock runs faster than that (chrony may slew faster while
//!   it corrects a large offset), or is stepped forward by `s` while a
//!   denial is cached, the cache can deny for up to `s` plus the excess
//!   rate times the wait after the store would admit, and never past the
//!   wait the store told.
//! - **`Retry-After` is never understated** (as far as this instance can
//!   know: spends by other instances make any wait longer, Redis's own
//!   answers included). The same cost is answered with the store's wait,
//!   counted down. A larger cost `c'` than the cached `c` waits longer: for
//!   a bucket that lacked `c` by a wait `w`, lacking `c'` takes at most
//!   `w + ceil((c' - c) / rate)` microseconds, which is what the cache
//!   answers (at most 1 µs more than the true wait, exact when `c' - c`
//!   tokens refill in a whole number of microseconds). A bucket of a
//!   multi-quota denial that held `c` gives no such bound, so a larger cost
//!   asks the store unless that bucket's remaining tokens cover it. A
//!   smaller cost always asks the store.
//!
//! Spending on this instance (an admitted check or reservation with the same
//! keys) forgets the cached denial of those buckets: its wait would no longer
//! count the tokens spent. (With two calls in flight, an admission the store
//! decided after a denial can be seen here before that denial is cached;
//! the cached wait then misses that admission's tokens until the next answer
//! from the store, as it misses spends on other instances. It never admits
//! because of it.) Spends on other instances are not seen, and
//! lengthen the true wait beyond any told, Redis's own answers included. A
//! charge made here forgets the cached denial too. Three events add tokens
//! and the cache does not see them on other instances: a `reset` and a
//! refund (each seen at once on the instance that made it; after a reset,
//! a denial of a check sent before it and answered late is not cached), and the store
//! losing its data (a Redis restart or failover without the key). Either
//! way a denied client waits at most the wait it was told.
//!
//! Memory is bounded: at most `capacity` entries, spread over shards by a
//! hash seeded at random per cache, each behind its own short-held lock; when
//! a shard is full, expired entries make room, and if none has expired the new
//! denial is simply not cached.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;

use super::table::{self, Table};
use crate::decision::{Decision, QuotaState, States};
use crate::lock::lock;
use crate::quota::{Quota, micros};

/// Default number of denials a store keeps.
pub const DEFAULT_DENY_CACHE: usize = 10_000;

const SHARDS: usize = 16;

/// A cached denial lasts the store's wait less `1 / DRIFT_DIVISOR` of it
/// (0.1 %): the store's clock may run that much faster than the local
/// monotonic clock that counts the wait down (see the module docs).
const DRIFT_DIVISOR: u32 = 1_000;

/// How long a reset's fence is kept: twice the longest store timeout. A
/// check's caller waits at most its timeout; an answer later than this
/// (its caller gone, its batch stuck behind others) is rare, and caching it
/// would only repeat a denial the old bucket gave.
const FENCE_LIFE: Duration = Duration::from_secs(120);

/// The resets of a cache: when each bucket key (by its hash) was last reset.
#[derive(Debug, Default)]
struct Fences {
    at: HashMap<u64, Instant>,
    /// With too many fences at once, one for every key.
    all: Option<Instant>,
}

/// What one cached denial remembers.
#[derive(Debug)]
struct Entry {
    /// The hash of `keys`: the table holds one entry a hash.
    hash: u64,
    /// The storage keys of the buckets, to tell a hash collision from a hit.
    keys: Box<[String]>,
    cost: u64,
    decision: Decision,
    /// When the store's answer arrived: the waits told count down from here.
    told: Instant,
    /// Until when the same cost cannot be admitted, by the local clock: the
    /// store's wait from when the check was sent, less the drift allowed for.
    until: Instant,
}

#[derive(Debug, Default)]
struct Shard {
    /// One entry a hash of its keys (a denial of other keys with the same
    /// hash takes its place).
    entries: HashTable<Entry>,
    /// No entry of this shard expires before this: a full shard does not
    /// rescan until then.
    quiet_until: Option<Instant>,
}

/// Cached denials of one store.
#[derive(Debug)]
pub(crate) struct DenyCache {
    table: Table<Shard>,
    /// When the cache was made; [`latest`](Self::latest) counts from here.
    base: Instant,
    /// The latest `until` of every denial ever cached, in microseconds after
    /// `base`, rounded up; it only grows. Once the clock has passed it, every
    /// entry has expired, so a lookup answers at once, without hashing the
    /// keys (no client denied for a while, or none yet). A lookup that reads
    /// it while another thread caches a denial acts as if it came just
    /// before: it asks the store.
    latest: AtomicU64,
    /// When buckets were reset here: a denial of a check sent before, of any
    /// of its buckets, is the old bucket's and is not cached. Kept for
    /// [`FENCE_LIFE`], at most as many as the cache's entries. Locked after
    /// a shard (never the other way round).
    fences: Mutex<Fences>,
    /// Whether any fence was ever set: until then, caching a denial does
    /// not look at them.
    fenced: std::sync::atomic::AtomicBool,
    /// The most fences kept: as many as the cache's entries.
    max_fences: usize,
}

impl table::Shard for Shard {
    fn len(&self) -> usize {
        self.entries.len()
    }
}

impl Shard {
    fn get(&self, hash: u64) -> Option<&Entry> {
        self.entries.find(hash, |e| e.hash == hash)
    }

    fn remove(&mut self, hash: u64) {
        if let Ok(found) = self.entries.find_entry(hash, |e| e.hash == hash) {
            found.remove();
        }
    }

    /// Puts `entry` in place of any of its hash.
    fn put(&mut self, entry: Entry) {
        let hash = entry.hash;
        match self.entries.find_entry(hash, |e| e.hash == hash) {
            Ok(mut found) => *found.get_mut() = entry,
            Err(absent) => {
                absent.into_table().insert_unique(hash, entry, |e| e.hash);
            }
        }
    }
}

impl DenyCache {
    /// A cache of at most `capacity` denials (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        DenyCache {
            table: Table::new(SHARDS, capacity.div_ceil(SHARDS)),
            base: Instant::now(),
            latest: AtomicU64::new(0),
            fences: Mutex::new(Fences::default()),
            fenced: std::sync::atomic::AtomicBool::new(false),
            max_fences: capacity.div_ceil(SHARDS).max(1) * SHARDS,
        }
    }

    /// Whether one of `keys` was reset after `sent`. Called with a shard
    /// locked, which a reset's [`fence`](Self::fence) waits for before it
    /// looks through that shard.
    fn fenced(&self, keys: &[String], sent: Instant) -> bool {
        if !self.fenced.load(Ordering::Acquire) {
            return false;
        }
        let fences = lock(&self.fences);
        fences.all.is_some_and(|at| sent < at)
            || keys.iter().any(|key| {
                fences
                    .at
                    .get(&self.table.hasher().hash_one(key))
                    .is_some_and(|at| sent < *at)
            })
    }

    fn hash(&self, keys: &[String]) -> u64 {
        self.table.hasher().hash_one(keys)
    }

    /// The denial of `cost` on these buckets, if one is cached and still holds:
    /// the cached decision (for a larger cost than the cached one, with its
    /// waits made longer, see `for_larger_cost`) with its waits counted down
    /// to now. Only a decision made for `quotas` themselves: the buckets of
    /// quotas that differ only in their lock-outs have the same keys, and a
    /// denial under one lock-out is not the store's answer under another.
    pub(crate) fn lookup(&self, keys: &[String], quotas: &[Quota], cost: u64) -> Option<Decision> {
        let now = Instant::now();
        if micros(now.saturating_duration_since(self.base)) >= self.latest.load(Ordering::Relaxed) {
            return None;
        }
        let hash = self.hash(keys);
        let mut shard = self.table.shard(hash);
        let entry = shard.get(hash)?;
        if *entry.keys != *keys
            || !entry
                .decision
                .states()
                .iter()
                .map(QuotaState::quota)
                .eq(quotas.iter())
        {
            return None;
        }
        // Read again under the lock: this entry may have been cached after
        // the first read (from a check sent after it), and its wait is
        // counted down from when that check was sent.
        let now = Instant::now();
        if now >= entry.until {
            shard.remove(hash);
            return None;
        }
        let elapsed = now.saturating_duration_since(entry.told);
        if cost == entry.cost {
            return Some(counted_down(&entry.decision, elapsed));
        }
        if cost < entry.cost {
            return None;
        }
        // A larger cost lacks its tokens at least as long as the cached one
        // (so it is denied until `until` too), but its wait may be longer.
        let larger = for_larger_cost(&entry.decision, cost - entry.cost, cost)?;
        Some(counted_down(&larger, elapsed))
    }

    /// Remembers that the store denied `cost` on these buckets with `decision`,
    /// for a check sent at `sent`.
    pub(crate) fn insert(&self, keys: Vec<String>, cost: u64, decision: &Decision, sent: Instant) {
        let wait = exact_for(decision);
        if wait.is_zero() || cost == 0 {
            return;
        }
        let now = Instant::now();
        let trusted = wait - wait / DRIFT_DIVISOR;
        let Some(until) = sent.checked_add(trusted).filter(|until| *until > now) else {
            return;
        };
        let hash = self.hash(&keys);
        let mut shard = self.table.shard(hash);
        // Sent before a reset of one of these buckets: the denial is the
        // old bucket's.
        if self.fenced(&keys, sent) {
            return;
        }
        if shard.get(hash).is_none() && self.table.is_full(&shard) {
            if shard.quiet_until.is_some_and(|q| now < q) {
                return;
            }
            let mut next = None::<Instant>;
            shard.entries.retain(|e| {
                let keep = e.until > now;
                if keep {
                    next = Some(next.map_or(e.until, |n| n.min(e.until)));
                }
                keep
            });
            shard.quiet_until = next;
            if self.table.is_full(&shard) {
                return;
            }
        }
        shard.put(Entry {
            hash,
            keys: keys.into_boxed_slice(),
            cost,
            decision: decision.clone(),
            told: now,
            until,
        });
        // Rounded up: a clock read at or past it is at or past `until`.
        let since = until.saturating_duration_since(self.base);
        let until_us = micros(since).saturating_add(u64::from(since.subsec_nanos() % 1_000 != 0));
        self.latest.fetch_max(until_us, Ordering::Relaxed);
        shard.quiet_until = Some(shard.quiet_until.map_or(until, |q| q.min(until)));
    }

    /// Forgets the denial of these buckets after this instance spent from
    /// them (an admitted check or reservation): the wait it holds no longer
    /// counts the tokens just spent, and would be told short.
    pub(crate) fn spent(&self, keys: &[String]) {
        // Nothing cached is still live (the common case): nothing to forget,
        // without hashing the keys.
        let now = micros(Instant::now().saturating_duration_since(self.base));
        if now >= self.latest.load(Ordering::Relaxed) {
            return;
        }
        self.forget(keys);
    }

    /// After a `reset` of these buckets: forgets every cached denial that
    /// holds one of them (also another policy's, sharing a bucket), and
    /// refuses to cache a denial of one of them for a check sent before now
    /// (answered late, from the old bucket). Looks through the whole cache:
    /// a reset is rare, the cache bounded.
    pub(crate) fn fence(&self, keys: &[String]) {
        let now = Instant::now();
        {
            let mut fences = lock(&self.fences);
            fences
                .at
                .retain(|_, at| now.saturating_duration_since(*at) < FENCE_LIFE);
            if fences.at.len() + keys.len() > self.max_fences {
                fences.at.clear();
                fences.all = Some(now);
            } else {
                for key in keys {
                    fences.at.insert(self.table.hasher().hash_one(key), now);
                }
            }
            self.fenced.store(true, Ordering::Release);
        }
        for mut shard in self.table.shards() {
            shard
                .entries
                .retain(|e| !e.keys.iter().any(|k| keys.contains(k)));
        }
    }

    /// Forgets the denial of these buckets (a refund or a charge made here).
    pub(crate) fn forget(&self, keys: &[String]) {
        let hash = self.hash(keys);
        let mut shard = self.table.shard(hash);
        if shard.get(hash).is_some_and(|e| *e.keys == *keys) {
            shard.remove(hash);
        }
    }

    /// How many denials are cached (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

/// `decision`, a denial of some cost, as the answer to a check of `extra`
/// tokens more (`cost` in all) at the same instant, or `None` when the cache
/// cannot answer it without understating its wait: a bucket that held the
/// cached cost may lack `cost` by a wait nothing cached tells.
///
/// A bucket that lacked the cached cost by a wait of `w` microseconds lacks
/// `cost` by at most `w + ceil(d / num)`, `d = extra x den` the extra units:
/// with `x` the units it lacked, `w = ahead + ceil(x / num)` (`ahead` while
/// the store's clock is behind the bucket's stamp), and the wait for `cost`
/// is `ahead + ceil((x + d) / num) <= w + ceil(d / num)`. It is at least
/// `w - 1 + ceil((d + 1) / num)`, so the answer overstates by 1 µs at most
/// (not at all when `num` divides `d`).
fn for_larger_cost(decision: &Decision, extra: u64, cost: u64) -> Option<Decision> {
    let more = |s: &QuotaState| -> Option<QuotaState> {
        let q = *s.quota();
        let wait = micros(s.retry_after());
        if wait == 0 {
            // It held the cached cost; it holds `cost` for sure only if its
            // remaining tokens cover it.
            return (s.remaining() >= cost).then_some(*s);
        }
        let units = u128::from(extra) * u128::from(q.den());
        let longer = units.div_ceil(u128::from(q.num()));
        let wait = u64::try_from(u128::from(wait) + longer).unwrap_or(u64::MAX);
        Some(QuotaState::new(
            q,
            s.remaining(),
            wait,
            micros(s.reset_after()),
        ))
    };
    match decision.states() {
        [one] => Some(Decision::new(false, States::One(more(one)?))),
        many => {
            let states = many.iter().map(more).collect::<Option<Vec<_>>>()?;
            Some(Decision::new(false, states))
        }
    }
}

/// How long the store would deny as `decision` did, as far as the decision
/// tells: its wait, but for a bucket of a quota with a lock-out that refused
/// without locking out (its wait is longer than the lock-out, see `spent` in
/// `bucket.rs`), only until its wait is down to the lock-out, when a check the
/// store refuses locks the key out. A bucket of such a quota that waits no
/// longer than the lock-out is locked out until a time the decision does not
/// tell (its wait may include a shortfall to refill after the end, when a
/// refusal locks again): such a denial is not kept at all.
fn exact_for(decision: &Decision) -> Duration {
    decision
        .states()
        .iter()
        .fold(decision.retry_after(), |wait, s| {
            match s.quota().lockout_time() {
                Some(lockout) if s.retry_after() > lockout => wait.min(s.retry_after() - lockout),
                Some(_) if !s.retry_after().is_zero() => Duration::ZERO,
                _ => wait,
            }
        })
}

/// `decision`, `elapsed` later: every wait shorter by `elapsed`, and each
/// bucket's remaining tokens at least what its shorter time to full implies.
fn counted_down(decision: &Decision, elapsed: Duration) -> Decision {
    let count = |s: &QuotaState| {
        let q = *s.quota();
        let retry = s.retry_after().saturating_sub(elapsed);
        let reset = s.reset_after().saturating_sub(elapsed);
        let reset_us = crate::quota::micros(reset);
        // The level is at least full - reset x num (reset was rounded up),
        // but a bucket locked out refills nothing until its end: nothing is
        // implied for a quota with a lock-out.
        let missing = u128::from(reset_us) * u128::from(q.num());
        let level = u128::from(q.full()).saturating_sub(missing);
        let implied = match q.lockout_time() {
            Some(_) => 0,
            None => u64::try_from(level / u128::from(q.den())).unwrap_or(u64::MAX),
        };
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
    use crate::policy::Policy;
    use crate::store::MemoryStore;
    fn denied(policy: &Policy) -> Decision {
        let store = MemoryStore::new();
        let _ = store.decide_at("k", policy, policy.max_cost(), 0).unwrap();
        let d = store.decide_at("k", policy, 1, 0).unwrap();
        assert!(!d.allowed());
        d
    }

    /// A denial answered after a reset, of a check sent before it, is the
    /// old bucket's: not cached. One sent after it is.
    #[tokio::test(start_paused = true)]
    async fn a_reset_fences_off_denials_of_checks_sent_before_it() {
        let policy = Policy::from(Quota::per_hour(1).unwrap());
        let cache = DenyCache::new(100);
        let keys = vec!["a".to_owned()];
        let before = Instant::now();
        cache.insert(keys.clone(), 1, &denied(&policy), before);
        assert!(cache.lookup(&keys, policy.quotas(), 1).is_some());
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.fence(&keys);
        assert!(
            cache.lookup(&keys, policy.quotas(), 1).is_none(),
            "the reset forgot it"
        );
        cache.insert(keys.clone(), 1, &denied(&policy), before);
        assert!(
            cache.lookup(&keys, policy.quotas(), 1).is_none(),
            "a late answer of the old bucket"
        );
        // Other keys are not fenced; checks sent after the reset are cached.
        let other = vec!["b".to_owned()];
        cache.insert(other.clone(), 1, &denied(&policy), before);
        assert!(cache.lookup(&other, policy.quotas(), 1).is_some());
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.insert(keys.clone(), 1, &denied(&policy), Instant::now());
        assert!(cache.lookup(&keys, policy.quotas(), 1).is_some());
        // Another policy's denial on a reset bucket (with one of its own):
        // forgotten, and fenced off, too.
        let shared = vec!["a".to_owned(), "c".to_owned()];
        let sent = Instant::now();
        cache.insert(shared.clone(), 1, &denied(&policy), sent);
        assert!(cache.lookup(&shared, policy.quotas(), 1).is_some());
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.fence(&keys);
        assert!(
            cache.lookup(&shared, policy.quotas(), 1).is_none(),
            "a reset bucket's denial stayed"
        );
        cache.insert(shared.clone(), 1, &denied(&policy), sent);
        assert!(cache.lookup(&shared, policy.quotas(), 1).is_none());
    }

    /// A lock-out's denial is not cached: its end, and whether a refusal
    /// after it locks again, depend on what the decision does not tell. A
    /// refusal by a lock-out quota that did not lock (its wait longer than
    /// the lock-out) is cached only until its wait is down to the lock-out,
    /// when the store would lock the key out. And a denial answers only
    /// checks of the quotas it was made for, lock-outs included.
    #[tokio::test(start_paused = true)]
    async fn lockout_denials_are_cached_only_while_the_store_would_answer_alike() {
        let cache = DenyCache::new(100);
        let keys = vec!["a".to_owned()];
        // 5 per 15 minutes, 15 minutes out: the refusal locks.
        let locked = Policy::from("5/15min lockout 15min".parse::<Quota>().unwrap());
        let d = denied(&locked);
        assert_eq!(d.retry_after(), Duration::from_secs(900));
        cache.insert(keys.clone(), 1, &d, Instant::now());
        assert!(cache.lookup(&keys, locked.quotas(), 1).is_none());
        // 2 minutes out, a token every 3: the refusal waits 3 minutes and
        // does not lock; from 1 minute on, a refusal would.
        let short = Policy::from("5/15min lockout 2min".parse::<Quota>().unwrap());
        let d = denied(&short);
        assert_eq!(d.retry_after(), Duration::from_secs(180));
        let keys = vec!["b".to_owned()];
        cache.insert(keys.clone(), 1, &d, Instant::now());
        tokio::time::advance(Duration::from_secs(50)).await;
        let cached = cache.lookup(&keys, short.quotas(), 1).expect("cached");
        assert_eq!(cached.remaining(), 0);
        assert_eq!(cached.retry_after(), Duration::from_secs(130));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(
            cache.lookup(&keys, short.quotas(), 1).is_none(),
            "cached past the lock's start"
        );
        // A plain quota's denial does not answer the same buckets' checks
        // under a lock-out (the store would lock), nor the other way round.
        let plain = Policy::from("5/15min".parse::<Quota>().unwrap());
        let keys = vec!["c".to_owned()];
        cache.insert(keys.clone(), 1, &denied(&plain), Instant::now());
        assert!(cache.lookup(&keys, plain.quotas(), 1).is_some());
        assert!(cache.lookup(&keys, locked.quotas(), 1).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_denial_holds_until_the_wait_is_over_for_that_cost_and_more() {
        // 1 a second, burst 2: after 2 spent, 1 token is 1 s away.
        let policy = Policy::from(Quota::per_second(1).unwrap().burst(2).unwrap());
        let cache = DenyCache::new(100);
        let keys = vec!["a".to_owned()];
        cache.insert(keys.clone(), 1, &denied(&policy), Instant::now());
        let d = cache.lookup(&keys, policy.quotas(), 1).unwrap();
        assert_eq!(d.retry_after(), Duration::from_secs(1));
        // A larger cost is denied too, and told the wait for its tokens.
        let d = cache.lookup(&keys, policy.quotas(), 2).unwrap();
        assert_eq!(d.retry_after(), Duration::from_secs(2));
        assert!(
            cache.lookup(&keys, policy.quotas(), 0).is_none(),
            "a peek asks the store"
        );
        assert!(
            cache
                .lookup(&["b".to_owned()], policy.quotas(), 1)
                .is_none()
        );
        tokio::time::advance(Duration::from_millis(600)).await;
        let d = cache.lookup(&keys, policy.quotas(), 1).unwrap();
        assert_eq!(d.retry_after(), Duration::from_millis(400));
        assert_eq!(d.reset_after(), Duration::from_millis(1_400));
        assert_eq!(
            cache
                .lookup(&keys, policy.quotas(), 2)
                .unwrap()
                .retry_after(),
            Duration::from_millis(1_400)
        );
        tokio::time::advance(Duration::from_millis(400)).await;
        assert!(
            cache.lookup(&keys, policy.quotas(), 1).is_none(),
            "due: ask the store"
        );
        assert!(
            cache.lookup(&keys, policy.quotas(), 2).is_none(),
            "ask the store"
        );
    }

    /// The store's wait, less the drift allowed for: when the cache stops
    /// denying after a check sent at 0 that was told `wait`.
    fn deadline(wait: Duration) -> Duration {
        wait - wait / DRIFT_DIVISOR
    }

    #[tokio::test(start_paused = true)]
    async fn waits_told_count_from_the_answer_and_the_denial_from_the_check() {
        // The check was sent 100 ms before its answer (1 s to wait) arrived:
        // the store decided somewhere in between. Told 1 s then (never less
        // than the store would say), denied until 999 ms after the check was
        // sent (never after the store would admit).
        let policy = Policy::from(Quota::per_second(1).unwrap().burst(2).unwrap());
        let cache = DenyCache::new(100);
        let keys = vec!["a".to_owned()];
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(100)).await;
        cache.insert(keys.clone(), 1, &denied(&policy), sent);
        assert_eq!(
            cache
                .lookup(&keys, policy.quotas(), 1)
                .unwrap()
                .retry_after(),
            Duration::from_secs(1)
        );
        assert_eq!(
            cache
                .lookup(&keys, policy.quotas(), 2)
                .unwrap()
                .retry_after(),
            Duration::from_secs(2)
        );
        let d = cache.lookup(&keys, policy.quotas(), 1).unwrap();
        assert_eq!(d.reset_after(), Duration::from_secs(2));
        tokio::time::advance(deadline(Duration::from_secs(1)) - Duration::from_millis(101)).await;
        // 998 ms after the check, 898 ms after the answer.
        let d = cache.lookup(&keys, policy.quotas(), 1).unwrap();
        assert_eq!(d.retry_after(), Duration::from_millis(102));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(cache.lookup(&keys, policy.quotas(), 1).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_denial_ends_before_a_store_clock_running_fast_would_admit() {
        // The store's clock may run 0.1 % faster than this one: its 1 s wait
        // may be over after 999 ms here.
        let policy = Policy::from(Quota::per_second(1).unwrap().burst(2).unwrap());
        let cache = DenyCache::new(100);
        let keys = vec!["a".to_owned()];
        cache.insert(keys.clone(), 1, &denied(&policy), Instant::now());
        assert_eq!(deadline(Duration::from_secs(1)), Duration::from_millis(999));
        tokio::time::advance(Duration::from_micros(998_999)).await;
        assert!(cache.lookup(&keys, policy.quotas(), 1).is_some());
        assert!(cache.lookup(&keys, policy.quotas(), 2).is_some());
        tokio::time::advance(Duration::from_micros(1)).await;
        assert!(
            cache.lookup(&keys, policy.quotas(), 1).is_none(),
            "a fast store clock admits now"
        );
        assert!(cache.lookup(&keys, policy.quotas(), 2).is_none());
    }

    /// `policy`'s buckets after `spent`, then the denial of `cost`, and the
    /// memory store's answer to each of `larger` at that instant (peeks of
    /// nothing: every answer is a denial, which spends nothing).
    fn denial_and_truths(
        policy: &Policy,
        spent: u64,
        cost: u64,
        larger: &[u64],
    ) -> (Decision, Vec<Decision>) {
        let store = MemoryStore::new();
        assert!(store.decide_at("k", policy, spent, 0).unwrap().allowed());
        let d = store.decide_at("k", policy, cost, 0).unwrap();
        assert!(!d.allowed(), "{d:?}");
        let truths = larger
            .iter()
            .map(|&c| store.decide_at("k", policy, c, 0).unwrap())
            .collect();
        (d, truths)
    }

    #[tokio::test(start_paused = true)]
    async fn a_larger_cost_is_told_at_least_its_own_wait() {
        // Refills of a whole number of microseconds per token (1 s, 7 ms)
        // and not (7 tokens every 3 µs, 3 every 1 001 µs).
        let quotas = [
            Quota::per_second(1).unwrap().burst(5).unwrap(),
            Quota::new(7_000, Duration::from_millis(3))
                .unwrap()
                .burst(40)
                .unwrap(),
            Quota::new(3, Duration::from_micros(1_001))
                .unwrap()
                .burst(9)
                .unwrap(),
            Quota::new(1_000, Duration::from_secs(7))
                .unwrap()
                .burst(12)
                .unwrap(),
        ];
        for quota in quotas {
            let policy = Policy::from(quota);
            let max = policy.max_cost();
            for spent in [max, max - 1] {
                for cost in (max - spent + 1)..max {
                    let larger: Vec<u64> = (cost + 1..=max).collect();
                    let (denial, truths) = denial_and_truths(&policy, spent, cost, &larger);
                    let cache = DenyCache::new(100);
                    let keys = vec![format!("{quota:?}")];
                    cache.insert(keys.clone(), cost, &denial, Instant::now());
                    for (c, truth) in larger.iter().zip(&truths) {
                        let told = cache
                            .lookup(&keys, policy.quotas(), *c)
                            .unwrap()
                            .retry_after();
                        let exact = truth.retry_after();
                        assert!(
                            exact <= told && told <= exact + Duration::from_micros(1),
                            "{quota:?}, {spent} spent, {cost} cached, {c} asked: \
                             told {told:?}, the store says {exact:?}"
                        );
                    }
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_larger_cost_asks_the_store_when_a_bucket_that_held_the_cost_may_lack_it() {
        // A: 1 a second, burst 3; B: 4 an hour. After 3 spent, A is empty and
        // B holds 1: a check of 1 is denied by A (1 s), B holding it.
        let a = Quota::per_second(1).unwrap().burst(3).unwrap();
        let b = Quota::per_hour(4).unwrap();
        let policy = Policy::new("ab", [a, b]).unwrap();
        let (denial, truths) = denial_and_truths(&policy, 3, 1, &[2]);
        let cache = DenyCache::new(100);
        let keys = vec!["a".to_owned(), "b".to_owned()];
        cache.insert(keys.clone(), 1, &denial, Instant::now());
        assert_eq!(
            cache
                .lookup(&keys, policy.quotas(), 1)
                .unwrap()
                .retry_after(),
            Duration::from_secs(1)
        );
        // B lacks 2 for 15 minutes, which nothing cached tells: the store
        // answers, not A's 2 s.
        assert_eq!(truths[0].retry_after(), Duration::from_secs(900));
        assert!(cache.lookup(&keys, policy.quotas(), 2).is_none());
        // With B holding 3, a check of 2 waits for A alone, 2 s.
        let policy = Policy::new("ab", [a, Quota::per_hour(6).unwrap()]).unwrap();
        let (denial, truths) = denial_and_truths(&policy, 3, 1, &[2]);
        cache.insert(keys.clone(), 1, &denial, Instant::now());
        let told = cache
            .lookup(&keys, policy.quotas(), 2)
            .unwrap()
            .retry_after();
        assert_eq!(told, truths[0].retry_after());
        assert_eq!(told, Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn lookups_skip_the_cache_once_every_denial_has_expired() {
        let policy = Policy::from(Quota::per_second(1).unwrap().burst(2).unwrap());
        let cache = DenyCache::new(100);
        let (a, b) = (vec!["a".to_owned()], vec!["b".to_owned()]);
        // Nothing cached yet: nothing to find.
        assert!(cache.lookup(&a, policy.quotas(), 1).is_none());
        cache.insert(a.clone(), 1, &denied(&policy), Instant::now());
        tokio::time::advance(Duration::from_millis(500)).await;
        cache.insert(b.clone(), 1, &denied(&policy), Instant::now());
        // At 1 s, a is due and b is not: the cache is read, and a's expired
        // entry dropped.
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(cache.lookup(&a, policy.quotas(), 1).is_none());
        assert_eq!(cache.len(), 1);
        assert!(cache.lookup(&b, policy.quotas(), 1).is_some());
        // One microsecond short of b's deadline (its 1 s wait less the drift
        // allowed for) b still holds; at it, every denial has expired and
        // lookups no longer read the shards (b's entry stays until an insert
        // needs the room).
        let left = deadline(Duration::from_secs(1)) - Duration::from_millis(500);
        tokio::time::advance(left - Duration::from_micros(1)).await;
        assert!(cache.lookup(&b, policy.quotas(), 1).is_some());
        tokio::time::advance(Duration::from_micros(1)).await;
        assert!(cache.lookup(&b, policy.quotas(), 1).is_none());
        assert_eq!(cache.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn spending_on_this_instance_forgets_the_denial() {
        // The cached wait would not count the tokens this instance just
        // spent (a smaller cost admitted, or a reservation): the next check
        // asks the store.
        let policy = Policy::from(Quota::per_second(1).unwrap().burst(2).unwrap());
        let cache = DenyCache::new(100);
        let (a, b) = (vec!["a".to_owned()], vec!["b".to_owned()]);
        cache.spent(&a);
        cache.insert(a.clone(), 2, &denied(&policy), Instant::now());
        cache.insert(b.clone(), 2, &denied(&policy), Instant::now());
        cache.spent(&a);
        assert!(cache.lookup(&a, policy.quotas(), 2).is_none());
        assert!(cache.lookup(&b, policy.quotas(), 2).is_some());
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
        assert!(
            cache
                .lookup(&["late".to_owned()], policy.quotas(), 1)
                .is_some()
        );
        let held = cache.len();
        cache.forget(&["late".to_owned()]);
        assert!(
            cache
                .lookup(&["late".to_owned()], policy.quotas(), 1)
                .is_none()
        );
        assert_eq!(cache.len(), held - 1);
    }
}
