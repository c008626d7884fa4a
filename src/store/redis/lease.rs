//! Leases ([`Leases`]): tokens of a shared bucket held for this instance, so
//! that checks with room to spare are decided in process, exactly.
//!
//! A lease is a hold on the bucket in Redis, not a debit: the script sets
//! `h` tokens of the bucket's level aside for this instance until an expiry
//! (Redis time), and other instances may spend only what is not held. This
//! instance spends its held tokens here, one admission at a time, and
//! reports what it spent (batched with the checks in flight); the report
//! debits the spent tokens and releases the rest. A hold that expires
//! unreported is debited whole. Every admission made here is backed by a
//! token that is in the bucket at that moment and that nobody else can
//! take, so the bucket's bound holds in every window, as without leases.
//! What leases cost is under-admission, bounded by the holds outstanding.
//!
//! - **Size:** a decayed count of the key's local demand (tokens asked for
//!   over about one lease period), minus what is still held. Every lease
//!   also names a roomy size and life ([`ROOMY`] periods, counted as at
//!   most an eighth of the smallest capacity), which the script grants
//!   instead when every bucket is at least 3/4 free besides the cost, so a
//!   key with room to spare gets a lease for half a minute or so from its
//!   first one. The script grants at most half of what the bucket has
//!   free, so a key near its limit gets no lease and is decided in Redis,
//!   exactly, check by check.
//! - **Renewal:** the next lease is asked for (in the background) when
//!   what is held falls under half a period's demand (under a roomy
//!   lease: two periods'), or the newest hold is in the last quarter of
//!   its life.
//! - **Expiry:** a hold is used here until its life, counted from when its
//!   request was *sent*, less a margin; Redis counts it from when it ran
//!   the call, later.
//! - **Retries:** every lease has an id unique to this instance; a lease
//!   sent again is answered as the first time, a report sent again does
//!   nothing.
//! - **Bounded:** the map holds at most a fixed number of keys; an evicted
//!   key's holds are reported, and so are all holds when the store is
//!   dropped.
//! - **Outages:** held tokens are spent until their expiry whatever the
//!   breaker says; then checks go to Redis, and to the fallback.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;

use super::encode::{ROOMY, Spend};
use crate::decision::{Decision, QuotaState, States};
use crate::observe;
use crate::policy::Policy;
use crate::quota::ceil_div;
use crate::store::in_scratch;
use crate::store::key::{is_safe, safe_key};

/// The default lease period: a lease holds about this long's worth of a
/// key's local demand.
pub const DEFAULT_LEASE_PERIOD: Duration = Duration::from_secs(1);

/// The keys whose leases a store keeps by default.
pub const DEFAULT_LEASE_KEYS: usize = 100_000;

/// The fewest tokens worth a lease: below it, checks go to Redis.
const MIN_LEASE: u64 = 2;

/// The share of the smallest capacity a lease covering [`ROOMY`] periods
/// holds at most: 1 / this. What such a lease covers is at most that (or
/// one period's demand, if more); it asks for one and a half times that,
/// less what is held, so a key that goes idle leaves at most 3/16 of the
/// capacity held.
const ROOMY_SHARE: u64 = 8;

/// Holds a key has at once, at most: the one in use and the next.
const MAX_HOLDS: usize = 2;

/// What a report of a hold spent whole says it spent: more than any hold
/// (the script debits at most the hold), and below 2^53.
pub(crate) const WHOLE: u64 = 1 << 52;

thread_local! {
    /// Where [`lease_name`] writes a key's name in the lease map: one buffer
    /// per thread, so a check decided from a hold allocates nothing.
    static NAME: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Runs `f` on the name of `key`'s buckets under `policy` in the lease map:
/// the key's storage-safe form, then the key tails of the policy's quotas
/// (each `}:` and a quota id; a safe key holds no `}`). It names the same
/// buckets as the storage keys, without the store's prefix, which is the
/// same for every key of a store.
pub(crate) fn lease_name<R>(key: &str, policy: &Policy, f: impl FnOnce(&str) -> R) -> R {
    let write = |name: &mut String| {
        name.push_str(&safe_key(key));
        for tail in policy.key_tails() {
            name.push_str(tail);
        }
    };
    in_scratch(&NAME, write, f)
}

/// Runs `f` on the name in the lease map of the key `start` + `value`
/// under `policy`, when that key is its own storage-safe form (so
/// [`lease_name`] names it the same); `None` otherwise.
pub(crate) fn held_name<R>(
    start: &str,
    value: &str,
    policy: &Policy,
    f: impl FnOnce(&str) -> Option<R>,
) -> Option<R> {
    let key_len = start.len() + value.len();
    let write = |name: &mut String| {
        name.push_str(start);
        name.push_str(value);
        for tail in policy.key_tails() {
            name.push_str(tail);
        }
    };
    in_scratch(&NAME, write, |name| {
        if !is_safe(name.as_bytes().get(..key_len)?) {
            return None;
        }
        f(name)
    })
}

/// What a store's leases have done so far (all counts since the store was
/// built): see [`RedisStore::lease_stats`](crate::RedisStore::lease_stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Checks decided in process from held tokens.
    pub local_decisions: u64,
    /// Leases asked for (each one decision of a script call).
    pub requests: u64,
    /// Tokens granted in holds.
    pub granted: u64,
    /// Held tokens spent in process.
    pub spent: u64,
    /// Held tokens given back unspent by a report that found its hold.
    pub returned: u64,
    /// Held tokens not spent whose report found no hold (Redis had debited
    /// it whole at its expiry) or got no answer.
    pub expired: u64,
    /// Held tokens not yet spent, now.
    pub outstanding: u64,
    /// Tokens in holds not yet reported (spent or not), now: what this
    /// instance keeps from the others at most.
    pub held: u64,
}

/// The counts that change only with a lease request or a report; those
/// that change with every check decided here are kept per shard
/// ([`Shard`]), under the lock the check takes anyway.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    granted: AtomicU64,
    returned: AtomicU64,
    expired: AtomicU64,
    held: AtomicU64,
}

/// How a store's leases are sized.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseConfig {
    /// A lease holds about this long's worth of local demand.
    pub(crate) period: Duration,
    /// The most keys with leases (or demand counts) kept.
    pub(crate) max_keys: usize,
}

/// One hold of this instance on a key's buckets.
struct Hold {
    id: u64,
    granted: u64,
    left: u64,
    /// Its life in Redis.
    life: Duration,
    /// Used here until then (Redis debits it some time after).
    until: Instant,
}

/// The longest name held in its entry.
const SHORT_NAME: usize = 62;

/// A key's name in the map: held in its entry when it fits (most do), so a
/// check compares it where it reads the key's holds, without a block of
/// its own to fetch.
enum Name {
    Short { len: u8, bytes: [u8; SHORT_NAME] },
    Long(Box<str>),
}

impl Name {
    fn new(name: &str) -> Self {
        let given = name.as_bytes();
        let mut bytes = [0; SHORT_NAME];
        match (bytes.get_mut(..given.len()), u8::try_from(given.len())) {
            (Some(held), Ok(len)) => {
                held.copy_from_slice(given);
                Name::Short { len, bytes }
            }
            _ => Name::Long(name.into()),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Name::Short { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or_default(),
            Name::Long(name) => name.as_bytes(),
        }
    }

    #[inline]
    fn is(&self, name: &str) -> bool {
        self.bytes() == name.as_bytes()
    }

    fn to_boxed(&self) -> Box<str> {
        String::from_utf8_lossy(self.bytes()).into()
    }
}

/// A key's holds, oldest first, at most [`MAX_HOLDS`]: kept in its entry,
/// so a check reads them with the key's name (no block of their own to
/// fetch). The slots in use come first.
#[derive(Default)]
struct Holds([Option<Hold>; MAX_HOLDS]);

impl Holds {
    fn iter(&self) -> impl Iterator<Item = &Hold> {
        self.0.iter().flatten()
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut Hold> {
        self.0.iter_mut().flatten()
    }

    fn get(&self, i: usize) -> Option<&Hold> {
        self.0.get(i)?.as_ref()
    }

    fn len(&self) -> usize {
        self.iter().count()
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    /// The newest hold.
    fn back(&self) -> Option<&Hold> {
        self.iter().last()
    }

    /// Takes the `i`th hold out, the later ones moving up.
    fn remove(&mut self, i: usize) -> Option<Hold> {
        let hold = self.0.get_mut(i)?.take()?;
        if let Some(rest) = self.0.get_mut(i..) {
            rest.rotate_left(1);
        }
        Some(hold)
    }

    /// Adds `hold` as the newest, or gives it back when the key has
    /// [`MAX_HOLDS`] already.
    fn push_back(&mut self, hold: Hold) -> Result<(), Hold> {
        match self.0.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => {
                *slot = Some(hold);
                Ok(())
            }
            None => Err(hold),
        }
    }
}

impl IntoIterator for Holds {
    type Item = Hold;
    type IntoIter = std::iter::Flatten<std::array::IntoIter<Option<Hold>, MAX_HOLDS>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter().flatten()
    }
}

/// One key: its demand, its holds, and whether a lease is being asked for.
///
/// `repr(C)`, in the order a check reads it: its name, its holds and its
/// demand first, together.
#[repr(C)]
struct Entry {
    /// The key's name in the map: its storage-safe form followed by the
    /// key tails of its policy (see `leasing.rs`), one string per set of
    /// buckets.
    name: Name,
    holds: Holds,
    /// Tokens asked for, decayed by `exp(-age / period)`.
    demand: f64,
    seen: Instant,
    /// When the key was first seen: a young key's count covers less than
    /// a period, and is scaled up (4x at most).
    born: Instant,
    /// No lease is asked for before then (after a grant of nothing).
    quiet_until: Option<Instant>,
    asking: bool,
    /// The last lease got its roomy size and life (every bucket was at
    /// least 3/4 free besides its cost): renewed when under two periods'
    /// demand is held, not half of one.
    roomy: bool,
    /// Holds spent whole, whose reports wait to ride with the next lease
    /// request (a report of a hold spent whole changes only when Redis
    /// debits it: now, or at its expiry).
    spent: VecDeque<u64>,
    policy: Policy,
    /// This entry among those the name has had: a lease answered for an
    /// earlier one (forgotten by a reset, or evicted, while the lease was
    /// under way) is not this entry's to use.
    serial: u64,
    /// The storage keys of its buckets, for lease requests and reports.
    keys: Vec<String>,
}

/// A part of the map, with the counts of the checks decided from its
/// holds.
#[derive(Default)]
struct Shard {
    table: HashTable<Entry>,
    /// Checks decided here from holds.
    local: u64,
    /// Held tokens spent here.
    spent: u64,
    /// Held tokens not yet spent, in this shard's holds.
    outstanding: u64,
}

impl Shard {
    /// The table, and the counts a check updates beside it.
    fn parts(&mut self) -> (&mut HashTable<Entry>, Counts<'_>) {
        let Shard {
            table,
            local,
            spent,
            outstanding,
        } = self;
        let counts = Counts {
            local,
            spent,
            outstanding,
        };
        (table, counts)
    }
}

/// A shard's counts, as one check updates them.
struct Counts<'a> {
    local: &'a mut u64,
    spent: &'a mut u64,
    outstanding: &'a mut u64,
}

/// A hold to report: the keys and policy of its buckets, its id, what was
/// spent of it and what it held.
pub(crate) struct Report {
    pub(crate) keys: Vec<String>,
    pub(crate) policy: Policy,
    pub(crate) id: u64,
    pub(crate) spent: u64,
    left: u64,
    expired: bool,
}

/// What the in-process path asks to be sent after a check, in the
/// background.
#[derive(Default)]
pub(crate) struct Errand {
    pub(crate) lease: Option<Ask>,
    pub(crate) reports: Vec<Report>,
}

/// A lease to ask for.
pub(crate) struct Ask {
    /// The key's name in the map.
    pub(crate) name: Box<str>,
    /// The entry's serial (see [`Entry`]).
    pub(crate) serial: u64,
    pub(crate) keys: Vec<String>,
    pub(crate) policy: Policy,
    /// The most tokens wanted.
    pub(crate) want: u64,
    /// A hold spent whole, to report with it.
    pub(crate) carried: Option<u64>,
    /// How long it lives in Redis.
    pub(crate) life: Duration,
    /// The size asked for instead (0: none), for [`ROOMY`] times the life,
    /// when every bucket is at least 3/4 free besides the cost (the reply
    /// says which it got).
    pub(crate) roomy_want: u64,
}

/// The leases of one store (see the module docs).
pub(crate) struct Leases {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
    config: LeaseConfig,
    /// Where this instance's lease ids start.
    instance: u64,
    next_id: AtomicU64,
    /// The next entry's serial.
    next_serial: AtomicU64,
    pub(crate) counters: Counters,
    /// The `store` label of the metrics.
    label: &'static str,
}

impl Leases {
    pub(crate) fn new(config: LeaseConfig, label: &'static str) -> Self {
        let shards = config.max_keys.clamp(1, 16);
        let hasher = RandomState::new();
        // Ids start at a random point of [0, 2^63) (a fresh random seed per
        // map) and count up: two instances' ids meet only if their starting
        // points are closer than the leases they take.
        let instance = hasher.hash_one(std::process::id()) >> 1;
        Leases {
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard: config.max_keys.div_ceil(shards).max(1),
            hasher,
            config,
            instance,
            next_id: AtomicU64::new(1),
            next_serial: AtomicU64::new(0),
            counters: Counters::default(),
            label,
        }
    }

    /// A lease holds about this long's worth of a key's local demand.
    pub(crate) fn period(&self) -> Duration {
        self.config.period
    }

    /// Whether leases may pay on `policy`: every quota refills at least
    /// [`MIN_LEASE`] tokens per lease period. A slower quota admits so few
    /// requests that their round trips cost little, while a hold would keep
    /// a large share of it from the other instances, and from this one's
    /// checks racing its lease (a burst at `5 per 15 minutes` would find
    /// tokens held that it could not spend): its checks go to Redis.
    pub(crate) fn pays_on(&self, policy: &Policy) -> bool {
        let period_us = self.config.period.as_micros();
        policy
            .quotas()
            .iter()
            .all(|q| u128::from(q.num()) * period_us >= u128::from(MIN_LEASE) * u128::from(q.den()))
    }

    /// `name`'s hash: its bytes alone, with this map's random seed.
    fn hash(&self, name: &[u8]) -> u64 {
        let mut state = self.hasher.build_hasher();
        state.write(name);
        state.finish()
    }

    /// `name`'s hash (computed once per check) and its shard, locked.
    fn shard(&self, name: &str) -> (u64, MutexGuard<'_, Shard>) {
        let hash = self.hash(name.as_bytes());
        // The high half picks the shard: the table inside it indexes by the
        // low bits. `shards` is never empty; the modulo keeps the index in
        // range.
        let i = usize::try_from((hash >> 32) % self.shards.len() as u64).unwrap_or(0);
        let shard = self.shards.get(i).or(self.shards.first());
        match shard {
            Some(shard) => (hash, lock(shard)),
            None => unreachable!("a lease map has at least one shard"),
        }
    }

    /// Used here until `sent + life - margin`; the margin (a tenth of the
    /// life) covers a Redis clock that runs a little faster than ours.
    fn until(sent: Instant, life: Duration) -> Instant {
        sent + life - life / 10
    }

    /// A plain check of `cost` on the buckets named `name` (see [`Entry`]):
    /// decided here from a hold when one has the tokens (`Some`), else
    /// `None` (ask Redis). Either way, what to send in the background is
    /// added to `errand`. `keys` makes the storage keys of the buckets, for
    /// a key seen for the first time: a check decided from a hold allocates
    /// nothing.
    pub(crate) fn check(
        &self,
        name: &str,
        keys: impl FnOnce() -> Vec<String>,
        policy: &Policy,
        cost: u64,
        errand: &mut Errand,
    ) -> Option<Decision> {
        let now = Instant::now();
        let (hash, mut guard) = self.shard(name);
        let (table, counts) = guard.parts();
        let entry = match table.find_entry(hash, |e| e.name.is(name)) {
            Ok(found) => found.into_mut(),
            Err(absent) => {
                let table = absent.into_table();
                if table.len() >= self.per_shard {
                    self.evict(table, counts.outstanding, errand);
                }
                let entry = Entry {
                    name: Name::new(name),
                    serial: self.next_serial.fetch_add(1, Ordering::Relaxed),
                    keys: keys(),
                    policy: policy.clone(),
                    demand: 0.0,
                    seen: now,
                    born: now,
                    holds: Holds::default(),
                    spent: VecDeque::new(),
                    asking: false,
                    quiet_until: None,
                    roomy: false,
                };
                table
                    .insert_unique(hash, entry, |e| self.hash(e.name.bytes()))
                    .into_mut()
            }
        };
        self.spend_from(entry, now, policy, cost, counts, errand)
    }

    /// [`check`](Self::check) of a key this map holds with a hold that
    /// pays for `cost` now (the common case, for a key with room to spare):
    /// the same decision (`Some`), found without writing the key's storage
    /// keys. `None`, having changed nothing, for any other key: check it
    /// with `check`. `cost` must be at least 1.
    pub(crate) fn check_held(
        &self,
        name: &str,
        policy: &Policy,
        cost: u64,
        errand: &mut Errand,
    ) -> Option<Decision> {
        let now = Instant::now();
        let (hash, mut guard) = self.shard(name);
        let (table, counts) = guard.parts();
        let entry = table.find_mut(hash, |e| e.name.is(name))?;
        // A hold that pays is kept by `spend_from`'s reports (it has tokens
        // left and time) and then spent from: it decides.
        if cost == 0 || !entry.holds.iter().any(|h| h.left >= cost && now < h.until) {
            return None;
        }
        self.spend_from(entry, now, policy, cost, counts, errand)
    }

    /// The rest of a check of `cost` at `now` for `entry`: its demand
    /// counted, its holds used up or past their time reported, a hold spent
    /// from if one pays, and the next lease asked for when it is due.
    fn spend_from(
        &self,
        entry: &mut Entry,
        now: Instant,
        policy: &Policy,
        cost: u64,
        counts: Counts<'_>,
        errand: &mut Errand,
    ) -> Option<Decision> {
        let Counts {
            local,
            spent,
            outstanding,
        } = counts;
        let period = self.config.period.as_secs_f64();
        let age = now.saturating_duration_since(entry.seen).as_secs_f64();
        // What the key asked for before this check, decayed to now.
        let prior = entry.demand * (-age / period).exp();
        entry.demand = prior + cost as f64;
        entry.seen = now;
        // Holds used up or past their time here are reported: one spent
        // whole with the next lease request, others at once.
        let mut i = 0;
        while let Some(hold) = entry.holds.get(i) {
            if hold.left > 0 && now < hold.until {
                i += 1;
                continue;
            }
            let Some(hold) = entry.holds.remove(i) else {
                break;
            };
            let report = self.report(&entry.keys, &entry.policy, hold, now, outstanding);
            if report.left == 0 && !report.expired && entry.spent.len() < MAX_HOLDS {
                entry.spent.push_back(report.id);
            } else {
                errand.reports.push(report);
            }
        }
        // Spent from the hold that ends here first: a plain lease asked for
        // under a roomy one ends long before it, and would otherwise expire
        // unspent (debited whole).
        let mut decided = None;
        if let Some(hold) = entry
            .holds
            .iter_mut()
            .filter(|h| h.left >= cost && now < h.until)
            .min_by_key(|h| h.until)
        {
            hold.left -= cost;
            *local += 1;
            *spent += cost;
            *outstanding -= cost;
            decided = Some(local_decision(policy, hold.left));
        }
        // Ask for the next lease when what is held runs low (see `low`),
        // or the newest hold is in its last quarter.
        // A key that was not checked within about a period before this
        // check (a decayed demand under half of this check's cost: no
        // check in the last 0.7 periods, or a sparse trickle) gets no
        // lease: a hold it would not spend before its expiry is debited
        // whole, and a client seen once an hour would lose a lease's
        // worth of tokens for every request.
        if entry.asking
            || entry.holds.len() >= MAX_HOLDS
            || entry.quiet_until.is_some_and(|t| now < t)
            || prior < cost.max(1) as f64 / 2.0
        {
            return decided;
        }
        let held: u64 = entry.holds.iter().map(|h| h.left).sum();
        let age = now.saturating_duration_since(entry.born).as_secs_f64() / period;
        // A steady rate r since `born` counts r x period x (1 - e^-age),
        // the age in periods; past 4 periods that is within 2% of r x
        // period.
        let young = if age < 4.0 {
            (1.0 - (-age).exp()).max(0.25)
        } else {
            1.0
        };
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a decayed count of tokens, non-negative and far below 2^64"
        )]
        let per_period = (entry.demand / young).ceil() as u64;
        // A roomy lease covers `ROOMY` periods, at most an eighth of the
        // smallest capacity (or one period, if more).
        let cap = (entry.policy.max_cost() / ROOMY_SHARE).max(per_period);
        let roomy_wanted = per_period.saturating_mul(u64::from(ROOMY)).min(cap);
        let aging = entry
            .holds
            .back()
            .is_none_or(|h| h.until.saturating_duration_since(now) < h.life / 4);
        // Low: under half a period's demand left (a lease of one period),
        // or, under a roomy lease, under two periods' (or half of it, if
        // it covers less than four): enough to last while the next is
        // asked for, without asking again each time a young key's count
        // moves.
        let low = if entry.roomy {
            held < (roomy_wanted / 2).min(per_period.saturating_mul(2))
        } else {
            2 * held < per_period
        };
        // Enough for a period and a half (a roomy lease: `ROOMY` of them),
        // less what is still held: asked for when under half a period is
        // left, a lease lasts about a period. It lives two. The script
        // grants the roomy size and life when every bucket is at least 3/4
        // free besides the cost, the plain ones otherwise.
        let want = per_period
            .saturating_add(per_period / 2)
            .saturating_sub(held);
        let roomy_want = roomy_wanted
            .saturating_add(roomy_wanted / 2)
            .saturating_sub(held);
        if want.max(roomy_want) >= MIN_LEASE && (low || aging) {
            entry.asking = true;
            errand.lease = Some(Ask {
                name: entry.name.to_boxed(),
                serial: entry.serial,
                keys: entry.keys.clone(),
                policy: entry.policy.clone(),
                want: if want >= MIN_LEASE { want } else { 0 },
                life: 2 * self.config.period,
                roomy_want: if roomy_want >= MIN_LEASE {
                    roomy_want
                } else {
                    0
                },
                carried: entry.spent.pop_front(),
            });
        }
        decided
    }

    /// A key's entry goes to make room: one without holds if the first few
    /// looked at have one, else the first.
    fn evict(&self, table: &mut HashTable<Entry>, outstanding: &mut u64, errand: &mut Errand) {
        let victim = table
            .iter()
            .take(8)
            .find(|e| e.holds.is_empty() && !e.asking)
            .or_else(|| table.iter().next())
            .map(|e| e.name.to_boxed());
        if let Some(name) = victim
            && let Ok(found) = table.find_entry(self.hash(name.as_bytes()), |e| e.name.is(&name))
        {
            let (entry, _) = found.remove();
            errand.reports.extend(self.leaving(entry, outstanding));
        }
    }

    /// The reports of a key leaving the map: its holds, and those spent
    /// whole that wait for a lease request.
    fn leaving(&self, entry: Entry, outstanding: &mut u64) -> Vec<Report> {
        let now = Instant::now();
        let mut out: Vec<Report> = entry
            .spent
            .iter()
            .map(|&id| Report {
                keys: entry.keys.clone(),
                policy: entry.policy.clone(),
                id,
                spent: WHOLE,
                left: 0,
                expired: false,
            })
            .collect();
        for hold in entry.holds {
            out.push(self.report(&entry.keys, &entry.policy, hold, now, outstanding));
        }
        out
    }

    /// The report of `hold`, which leaves its shard (whose unspent held
    /// tokens are `outstanding`).
    fn report(
        &self,
        keys: &[String],
        policy: &Policy,
        hold: Hold,
        now: Instant,
        outstanding: &mut u64,
    ) -> Report {
        *outstanding = outstanding.saturating_sub(hold.left);
        let held = self
            .counters
            .held
            .fetch_sub(hold.granted, Ordering::Relaxed);
        observe::lease_held(self.label, held.saturating_sub(hold.granted));
        Report {
            keys: keys.to_vec(),
            policy: policy.clone(),
            id: hold.id,
            spent: hold.granted - hold.left,
            left: hold.left,
            expired: now >= hold.until,
        }
    }

    /// A fresh lease id.
    pub(crate) fn id(&self) -> u64 {
        loop {
            let n = self.next_id.fetch_add(1, Ordering::Relaxed);
            // Never 0: a lease request's "no report" (see `encode.rs`).
            let id = self.instance.wrapping_add(n) & (u64::MAX >> 1);
            if id != 0 {
                return id;
            }
        }
    }

    /// A lease on the buckets named `name` (storage keys `keys`) for
    /// `policy` answered: `granted` tokens (0: none) held for `life` from a
    /// request sent at `sent`, or `None` when the call failed; `roomy`:
    /// whether the script granted the roomy size and life. A hold whose
    /// key's entry (`serial`) was evicted or forgotten meanwhile comes back
    /// to be reported: a later entry of the same name never gets it (after
    /// a reset, Redis may have deleted the hold with its buckets).
    #[allow(clippy::too_many_arguments, reason = "one answer, read apart")]
    pub(crate) fn answered(
        &self,
        name: &str,
        serial: u64,
        keys: &[String],
        policy: &Policy,
        id: u64,
        granted: Option<u64>,
        sent: Instant,
        life: Duration,
        roomy: bool,
    ) -> Option<Report> {
        let (hash, mut guard) = self.shard(name);
        let shard = &mut *guard;
        let found = shard
            .table
            .find_mut(hash, |e| e.name.is(name))
            .filter(|e| e.serial == serial);
        let Some(entry) = found else {
            let granted = granted.filter(|&g| g > 0)?;
            return Some(Report {
                keys: keys.to_vec(),
                policy: policy.clone(),
                id,
                spent: 0,
                left: granted,
                expired: false,
            });
        };
        entry.asking = false;
        entry.roomy = roomy;
        match granted {
            Some(granted) if granted > 0 => {
                self.counters.granted.fetch_add(granted, Ordering::Relaxed);
                shard.outstanding += granted;
                let held = self.counters.held.fetch_add(granted, Ordering::Relaxed);
                observe::lease_held(self.label, held + granted);
                let hold = Hold {
                    id,
                    granted,
                    left: granted,
                    life,
                    until: Self::until(sent, life),
                };
                // Never more than `MAX_HOLDS` (a lease is asked for only
                // below it, one at a time); one past them goes back.
                if let Err(hold) = entry.holds.push_back(hold) {
                    return Some(self.report(
                        keys,
                        policy,
                        hold,
                        Instant::now(),
                        &mut shard.outstanding,
                    ));
                }
            }
            // Nothing to spare (or no answer): not asked again for a period.
            _ => entry.quiet_until = Some(Instant::now() + self.config.period),
        }
        None
    }

    /// Forgets the holds on the buckets of `key` under `policy` (they were
    /// reset): the entry of that policy, whose holds went with its buckets,
    /// and those of the key's other policies that share a bucket with it
    /// (same quota), whose reports go to `errand` (they debit and release
    /// the holds' other buckets). Looks through the whole map: a reset is
    /// rare, the map bounded.
    pub(crate) fn forget(&self, key: &str, policy: &Policy, errand: &mut Errand) {
        let safe = safe_key(key);
        lease_name(key, policy, |name| {
            for shard in &self.shards {
                let mut guard = lock(shard);
                let Shard {
                    table, outstanding, ..
                } = &mut *guard;
                // A name is the safe key, then its policy's tails, each
                // starting with `}` (which no safe key holds).
                let ours = |e: &Entry| {
                    e.name
                        .bytes()
                        .strip_prefix(safe.as_bytes())
                        .is_some_and(|rest| {
                            rest.first() == Some(&b'}')
                                && e.policy
                                    .key_tails()
                                    .iter()
                                    .any(|t| policy.key_tails().contains(t))
                        })
                };
                let gone: Vec<Entry> = table.extract_if(|e| ours(e)).collect();
                for entry in gone {
                    let same = entry.name.is(name);
                    let reports = self.leaving(entry, outstanding);
                    // The reset policy's own holds went with its buckets:
                    // their reports would find nothing.
                    if !same {
                        errand.reports.extend(reports);
                    }
                }
            }
        });
    }

    /// Every hold, to report (the store is going away).
    pub(crate) fn drain(&self) -> Vec<Report> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut guard = lock(shard);
            let shard = &mut *guard;
            for entry in shard.table.drain() {
                out.extend(self.leaving(entry, &mut shard.outstanding));
            }
        }
        out
    }

    pub(crate) fn stats(&self) -> LeaseStats {
        let c = &self.counters;
        let (mut local, mut spent, mut outstanding) = (0, 0, 0);
        for shard in &self.shards {
            let shard = lock(shard);
            local += shard.local;
            spent += shard.spent;
            outstanding += shard.outstanding;
        }
        LeaseStats {
            local_decisions: local,
            requests: c.requests.load(Ordering::Relaxed),
            granted: c.granted.load(Ordering::Relaxed),
            spent,
            returned: c.returned.load(Ordering::Relaxed),
            expired: c.expired.load(Ordering::Relaxed),
            outstanding,
            held: c.held.load(Ordering::Relaxed),
        }
    }

    /// A report answered: whether its hold was still there.
    pub(crate) fn reported(&self, report: &Report, found: Option<bool>) {
        let c = &self.counters;
        if found == Some(true) {
            c.returned.fetch_add(report.left, Ordering::Relaxed);
            observe::lease_tokens(self.label, "returned", report.left);
        } else {
            c.expired.fetch_add(report.left, Ordering::Relaxed);
            observe::lease_tokens(self.label, "expired", report.left);
        }
    }
}

/// A poisoned shard only means another thread panicked mid-update; its
/// counts and holds are still usable.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

/// A decision made from a hold with `left` tokens left after it: admitted,
/// and what remains is what this instance can still spend for sure (never
/// more than the bucket holds).
fn local_decision(policy: &Policy, left: u64) -> Decision {
    let state = |q: &crate::quota::Quota| {
        let missing = q.capacity().saturating_sub(left).saturating_mul(q.den());
        QuotaState::new(*q, left, 0, ceil_div(missing, q.num()))
    };
    match policy.quotas() {
        [q] => Decision::new(true, States::One(state(q))),
        quotas => Decision::new(true, quotas.iter().map(state).collect::<Vec<_>>()),
    }
}

impl Report {
    /// The decision that reports this hold, and its keys and policy.
    pub(crate) fn spend(&self) -> (Vec<String>, &Policy, Spend) {
        (
            self.keys.clone(),
            &self.policy,
            Spend::Report {
                spent: self.spent,
                id: self.id,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    fn leases() -> Leases {
        let config = LeaseConfig {
            period: Duration::from_secs(1),
            max_keys: 100,
        };
        Leases::new(config, "test")
    }

    fn policy(quotas: &[Quota]) -> Policy {
        Policy::new("p", quotas.iter().copied()).unwrap()
    }

    /// One check of `key` under `policy`: decided here or not, and the
    /// errand it leaves.
    fn check(leases: &Leases, key: &str, policy: &Policy) -> (Option<Decision>, Errand) {
        let mut errand = Errand::default();
        let decided = lease_name(key, policy, |name| {
            leases.check(name, || vec![format!("{key}:k")], policy, 1, &mut errand)
        });
        (decided, errand)
    }

    /// Checks `key` until it asks for a lease, and answers it with a hold
    /// of `granted` (id `id`).
    fn held(leases: &Leases, key: &str, policy: &Policy, id: u64, granted: u64) {
        let ask = (0..4)
            .find_map(|_| check(leases, key, policy).1.lease)
            .expect("a key checked again within a period asks for a lease");
        let back = leases.answered(
            &ask.name,
            ask.serial,
            &ask.keys,
            policy,
            id,
            Some(granted),
            Instant::now(),
            Duration::from_secs(60),
            false,
        );
        assert!(back.is_none(), "the hold is the key's");
    }

    #[test]
    fn slow_quotas_get_no_leases() {
        let leases = leases();
        // At a 1 s period: 2 tokens a second pays, fewer does not.
        assert!(leases.pays_on(&policy(&[Quota::per_second(2).unwrap()])));
        assert!(leases.pays_on(&policy(&[Quota::per_hour(7_200).unwrap()])));
        assert!(!leases.pays_on(&policy(&[Quota::per_hour(7_199).unwrap()])));
        assert!(!leases.pays_on(&policy(&[Quota::per_hour(100).unwrap()])));
        let both = [
            Quota::per_second(100).unwrap(),
            Quota::per_hour(100).unwrap(),
        ];
        assert!(!leases.pays_on(&policy(&both)), "every quota must pay");
    }

    #[test]
    fn a_key_seen_once_gets_no_lease() {
        let leases = leases();
        let p = policy(&[Quota::per_second(100).unwrap()]);
        let (decided, errand) = check(&leases, "once", &p);
        assert!(decided.is_none());
        assert!(errand.lease.is_none(), "a first check asks for no lease");
        // Checked again at once: now it does.
        assert!(check(&leases, "once", &p).1.lease.is_some());
    }

    #[test]
    fn a_lease_answered_after_a_reset_is_given_back_not_used() {
        let p = policy(&[Quota::per_second(100).unwrap()]);
        for reset in [false, true] {
            let leases = leases();
            check(&leases, "c", &p);
            let ask = check(&leases, "c", &p)
                .1
                .lease
                .expect("a lease is asked for");
            if reset {
                leases.forget("c", &p, &mut Errand::default());
                // A check of the fresh bucket makes a fresh entry.
                assert!(check(&leases, "c", &p).0.is_none());
            }
            let back = leases.answered(
                &ask.name,
                ask.serial,
                &ask.keys,
                &p,
                7,
                Some(10),
                Instant::now(),
                Duration::from_secs(60),
                false,
            );
            let decided = check(&leases, "c", &p).0;
            if reset {
                let back = back.expect("the hold comes back to be reported");
                assert_eq!((back.id, back.spent, back.left), (7, 0, 10));
                assert!(decided.is_none(), "the fresh entry spends no old hold");
                assert_eq!(leases.stats().outstanding, 0);
            } else {
                assert!(back.is_none());
                assert!(decided.is_some(), "without a reset the hold is used");
            }
        }
    }

    #[test]
    fn the_hold_that_ends_first_is_spent_first() {
        let leases = leases();
        let p = policy(&[Quota::per_second(100).unwrap()]);
        let ask = (0..4)
            .find_map(|_| check(&leases, "c", &p).1.lease)
            .expect("a lease is asked for");
        let answer = |id, granted, life| {
            leases.answered(
                &ask.name,
                ask.serial,
                &ask.keys,
                &p,
                id,
                Some(granted),
                Instant::now(),
                life,
                false,
            )
        };
        // A roomy hold, then a plain one behind it that ends much sooner.
        assert!(answer(1, 10, Duration::from_secs(60)).is_none());
        assert!(answer(2, 5, Duration::from_secs(2)).is_none());
        for left in (0..5).rev() {
            let decided = check(&leases, "c", &p).0.expect("decided here");
            assert_eq!(decided.remaining(), left, "spent from the plain hold");
        }
        let decided = check(&leases, "c", &p).0.expect("decided here");
        assert_eq!(decided.remaining(), 9, "then from the roomy one");
    }

    #[test]
    fn a_reset_forgets_the_holds_of_every_policy_on_its_buckets() {
        let leases = leases();
        let per_second = Quota::per_second(10).unwrap();
        let reset = policy(&[per_second]);
        let sharing = policy(&[per_second, Quota::per_hour(1000).unwrap()]);
        let apart = policy(&[Quota::per_second(20).unwrap()]);
        held(&leases, "c", &reset, 1, 5);
        held(&leases, "c", &sharing, 2, 5);
        held(&leases, "c", &apart, 3, 5);
        // Another key whose name starts with this one's.
        held(&leases, "c2", &sharing, 4, 5);
        let mut errand = Errand::default();
        leases.forget("c", &reset, &mut errand);
        // The reset policy's hold went with its buckets; the sharing
        // policy's is reported, for its other bucket.
        let ids: Vec<u64> = errand.reports.iter().map(|r| r.id).collect();
        assert_eq!(ids, [2]);
        assert!(check(&leases, "c", &reset).0.is_none());
        assert!(check(&leases, "c", &sharing).0.is_none());
        assert!(check(&leases, "c", &apart).0.is_some());
        assert!(check(&leases, "c2", &sharing).0.is_some());
    }
}
