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
//!   exactly, check by check; and at most half of the room left under its
//!   cap on all holds (half the capacity), so the instances sharing a key
//!   end up with like shares.
//! - **Renewal:** the next lease is asked for (in the background) when
//!   what is held falls under an eighth of a period's demand (under a
//!   roomy lease: two periods'), the newest hold is in the last quarter of
//!   its life, or the server's epoch is due for a confirmation (the
//!   request confirms it). It carries the report of a hold spent whole and
//!   a partial one of the live hold that spent most.
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

use std::collections::VecDeque;
use std::hash::{BuildHasher, DefaultHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;

use super::encode::{ROOMY, Spend};
use super::epoch::ServerEpoch;
use crate::decision::{Decision, QuotaState, States};
use crate::observe;
use crate::policy::Policy;
use crate::quota::{ceil_div, micros};
use crate::store::key::{MAX_RAW_KEY_LEN, is_safe_tail, safe_key};

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

/// A key not checked for this many lease periods has gone quiet: its holds
/// are given back by the next sweep ([`Leases::sweep`]).
const QUIET_PERIODS: u64 = 2;

/// What a report of a hold spent whole says it spent: more than any hold
/// (the script debits at most the hold), and below 2^53.
pub(crate) const WHOLE: u64 = 1 << 52;

/// Where a check names the layer's keys in the lease map (see
/// [`Leases::check_held`]): the keys' start (`policy:kind:`, a safe key's),
/// hashed once with the map's seed.
#[derive(Clone)]
pub(crate) struct LeaseStart {
    text: Box<str>,
    state: DefaultHasher,
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

/// One hold of this instance on a key's buckets, whole: as it comes into
/// an entry and leaves it (an entry keeps what a check reads of it apart
/// from the rest, see [`Entry`]). Times are microseconds of the map's clock.
struct Hold {
    id: u64,
    granted: u64,
    left: u64,
    /// Its life in Redis.
    life: u64,
    /// Used here until then (Redis debits it some time after).
    until: u64,
}

/// What a check reads of a hold.
#[derive(Clone, Copy, Default)]
struct Spendable {
    left: u64,
    until: u64,
}

/// The rest of a hold, read when it leaves.
#[derive(Clone, Copy, Default)]
struct HoldRest {
    id: u64,
    granted: u64,
    life: u64,
}

/// The longest name held in its entry; a longer one is kept in the
/// entry's cold part, a block of its own.
const SHORT_NAME: usize = 32;

/// The name length of an entry whose name is in its cold part.
const LONG: u8 = u8::MAX;

/// One key under one policy: its name, holds, demand, and whether a lease is
/// being asked for.
///
/// What a check reads fills two cache lines (`repr(C)`, aligned to them,
/// 128 bytes: const-asserted): the name when it fits (32 bytes in all, a
/// `policy:kind:` start and the value: a short verbatim value such as an
/// IP address fits, a hashed one does not), the holds' tokens
/// and ends, the demand and the times. What only a lease request, a report
/// or an eviction reads is in `cold`, so the table of a busy instance's
/// keys stays in a core's cache longer (it took 312 bytes a key).
///
/// The map is keyed by the name (the key's storage-safe form) and the
/// policy's key tails: the same key under two policies with different
/// quotas is two entries (with the same quotas, one: they share buckets).
#[repr(C, align(64))]
struct Entry {
    /// The name's length, or [`LONG`] (in `cold`).
    name_len: u8,
    /// Holds in use: the first `holds` of `spendable`, oldest first.
    holds: u8,
    asking: bool,
    /// The last lease got its roomy size and life (every bucket was at
    /// least 3/4 free besides its cost): renewed when under two periods'
    /// demand is held, not half of one.
    roomy: bool,
    /// The server epoch's generation its holds were granted in (its low
    /// 32 bits; see `epoch.rs`).
    generation: u32,
    name: [u8; SHORT_NAME],
    spendable: [Spendable; MAX_HOLDS],
    /// A quarter of the newest hold's life: renewed when it has less left.
    quarter: u64,
    /// Tokens asked for, decayed by `exp(-age / period)`.
    demand: f64,
    seen: u64,
    /// When the key was first seen: a young key's count covers less than
    /// a period, and is scaled up (4x at most).
    born: u64,
    /// No lease is asked for before then (after a grant of nothing); 0:
    /// none.
    quiet_until: u64,
    policy: Policy,
    cold: Box<Cold>,
}

const _: () = assert!(size_of::<Entry>() == 128);

/// What an entry keeps out of a check's way.
struct Cold {
    /// The name, when longer than [`SHORT_NAME`].
    long_name: Box<str>,
    /// The rest of each hold, as `spendable`.
    rest: [HoldRest; MAX_HOLDS],
    /// Holds spent whole, by id and size, whose reports wait to ride with
    /// the next lease request (a report of a hold spent whole changes only
    /// when Redis debits it: now, or at its expiry).
    spent: VecDeque<(u64, u64)>,
    /// This entry among those the name has had: a lease answered for an
    /// earlier one (forgotten by a reset, or evicted, while the lease was
    /// under way) is not this entry's to use.
    serial: u64,
    /// The storage keys of its buckets, for lease requests and reports.
    keys: Vec<String>,
    /// The hold whose partial report rides with the lease under way: a
    /// refund is not given back to it until the answer says what Redis
    /// debited.
    partial: Option<u64>,
}

impl Entry {
    fn new(name: &str, policy: &Policy, serial: u64, keys: Vec<String>, now: u64) -> Self {
        let given = name.as_bytes();
        let mut bytes = [0; SHORT_NAME];
        let (name_len, long_name) = match (bytes.get_mut(..given.len()), u8::try_from(given.len()))
        {
            (Some(held), Ok(len)) => {
                held.copy_from_slice(given);
                (len, Box::default())
            }
            _ => (LONG, name.into()),
        };
        Entry {
            name_len,
            holds: 0,
            asking: false,
            roomy: false,
            generation: 0,
            name: bytes,
            spendable: [Spendable::default(); MAX_HOLDS],
            quarter: 0,
            demand: 0.0,
            seen: now,
            born: now,
            quiet_until: 0,
            policy: policy.clone(),
            cold: Box::new(Cold {
                long_name,
                rest: [HoldRest::default(); MAX_HOLDS],
                spent: VecDeque::new(),
                serial,
                keys,
                partial: None,
            }),
        }
    }

    fn name(&self) -> &[u8] {
        if self.name_len == LONG {
            self.cold.long_name.as_bytes()
        } else {
            self.name
                .get(..usize::from(self.name_len))
                .unwrap_or_default()
        }
    }

    fn name_boxed(&self) -> Box<str> {
        String::from_utf8_lossy(self.name()).into()
    }

    /// Whether this is the entry of `name` under `policy`.
    #[inline]
    fn is(&self, name: &[u8], policy: &Policy) -> bool {
        self.name() == name && self.policy.same_counting(policy)
    }

    /// Whether this is the entry of the name `start` + `value` under
    /// `policy`, compared a piece at a time.
    #[inline]
    fn is_split(&self, start: &[u8], value: &[u8], policy: &Policy) -> bool {
        let name = self.name();
        name.len() == start.len() + value.len()
            && name.get(..start.len()) == Some(start)
            && name.get(start.len()..) == Some(value)
            && self.policy.same_counting(policy)
    }

    /// The holds in use, oldest first.
    fn holds(&self) -> &[Spendable] {
        self.spendable
            .get(..usize::from(self.holds))
            .unwrap_or_default()
    }

    fn holds_mut(&mut self) -> &mut [Spendable] {
        self.spendable
            .get_mut(..usize::from(self.holds))
            .unwrap_or_default()
    }

    /// Takes the `i`th hold out, the later ones moving up.
    fn remove_hold(&mut self, i: usize) -> Option<Hold> {
        let n = usize::from(self.holds);
        if i >= n {
            return None;
        }
        let (spendable, rest) = (self.spendable.get_mut(i..n)?, self.cold.rest.get_mut(i..n)?);
        let (Spendable { left, until }, HoldRest { id, granted, life }) =
            (*spendable.first()?, *rest.first()?);
        spendable.rotate_left(1);
        rest.rotate_left(1);
        self.holds -= 1;
        self.quarter = self.newest_quarter();
        Some(Hold {
            id,
            granted,
            left,
            life,
            until,
        })
    }

    /// Adds `hold` as the newest, or gives it back when the key has
    /// [`MAX_HOLDS`] already.
    fn push_hold(&mut self, hold: Hold) -> Result<(), Hold> {
        let i = usize::from(self.holds);
        match (self.spendable.get_mut(i), self.cold.rest.get_mut(i)) {
            (Some(spendable), Some(rest)) => {
                *spendable = Spendable {
                    left: hold.left,
                    until: hold.until,
                };
                *rest = HoldRest {
                    id: hold.id,
                    granted: hold.granted,
                    life: hold.life,
                };
                self.holds += 1;
                self.quarter = hold.life / 4;
                Ok(())
            }
            _ => Err(hold),
        }
    }

    /// Hold `id` reported `spent` of its tokens as spent, keeping the
    /// rest: it holds that many fewer. True when the hold is still held
    /// here; one used up while the report was under way waits in the queue
    /// of spent holds, whose report then debits only the rest (its tokens
    /// already left the held count).
    fn reported_part(&mut self, id: u64, spent: u64) -> bool {
        let n = usize::from(self.holds);
        if let Some(rest) = self
            .cold
            .rest
            .get_mut(..n)
            .and_then(|r| r.iter_mut().find(|r| r.id == id))
        {
            rest.granted = rest.granted.saturating_sub(spent);
            return true;
        }
        if let Some((_, granted)) = self.cold.spent.iter_mut().find(|(i, _)| *i == id) {
            *granted = granted.saturating_sub(spent);
        }
        false
    }

    /// A quarter of the newest hold's life (0 without holds).
    fn newest_quarter(&self) -> u64 {
        usize::from(self.holds)
            .checked_sub(1)
            .and_then(|i| self.cold.rest.get(i))
            .map_or(0, |r| r.life / 4)
    }

    /// Every hold, taken out.
    fn take_holds(&mut self) -> Vec<Hold> {
        let mut out = Vec::with_capacity(usize::from(self.holds));
        while let Some(hold) = self.remove_hold(0) {
            out.push(hold);
        }
        out
    }
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
    /// A call that confirms the server's epoch (see `epoch.rs`), taken by
    /// [`ServerEpoch::verify_due`]: holds are spent only while one came
    /// back within a second.
    pub(crate) verify: bool,
    /// The holds of keys gone quiet are due to be given back
    /// ([`Leases::sweep`]).
    pub(crate) sweep: bool,
}

impl Errand {
    /// Whether there is nothing to send.
    pub(crate) fn is_empty(&self) -> bool {
        self.lease.is_none() && self.reports.is_empty() && !self.verify && !self.sweep
    }
}

/// A lease to ask for.
pub(crate) struct Ask {
    /// Whose lease it is.
    pub(crate) asked: Asked,
    /// The most tokens wanted.
    pub(crate) want: u64,
    /// A hold spent whole (its id), to report with it.
    pub(crate) carried: Option<u64>,
    /// How long it lives in Redis.
    pub(crate) life: Duration,
    /// The size asked for instead (0: none), for [`ROOMY`] times the life,
    /// when every bucket is at least 3/4 free besides the cost (the reply
    /// says which it got).
    pub(crate) roomy_want: u64,
}

/// Whose lease was asked for: a key's entry, and the keys and policy of its
/// buckets. Answered with [`Leases::answered`].
pub(crate) struct Asked {
    /// The key's name in the map.
    pub(crate) name: Box<str>,
    /// The entry's serial (see [`Entry`]).
    pub(crate) serial: u64,
    pub(crate) keys: Vec<String>,
    pub(crate) policy: Policy,
    /// The lease's id (0 until it is sent).
    pub(crate) id: u64,
    /// The server epoch's generation when it was asked for (see
    /// `epoch.rs`): a hold granted in another is never spent.
    pub(crate) generation: u64,
    /// A live hold's id and what it had spent, reported with the lease
    /// (partly: the rest stays held), so that a bucket's holds count what
    /// is left to spend rather than what was ever granted.
    pub(crate) partial: Option<(u64, u64)>,
}

/// What Redis answered a lease: `granted` tokens (0: none), held for
/// `life` from a request sent at `sent`; `roomy` when the script granted
/// the roomy size and life; `found` when the report it carried found its
/// hold.
#[derive(Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) granted: u64,
    pub(crate) sent: Instant,
    pub(crate) life: Duration,
    pub(crate) roomy: bool,
    pub(crate) found: bool,
}

/// The leases of one store (see the module docs).
pub(crate) struct Leases {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
    config: LeaseConfig,
    /// The lease period in microseconds.
    period_us: u64,
    /// The map's clock starts here: times in entries are microseconds
    /// since (tokio's clock, so tests can pause it).
    epoch: Instant,
    /// Where this instance's lease ids start.
    instance: u64,
    next_id: AtomicU64,
    /// The next entry's serial.
    next_serial: AtomicU64,
    pub(crate) counters: Counters,
    /// The `store` label of the metrics.
    label: &'static str,
    /// The server's epoch (`None` on a cluster): holds are spent only
    /// while it confirms the one they were granted in.
    server: Option<Arc<ServerEpoch>>,
    /// No sweep of quiet keys' holds before then (map clock).
    next_sweep: AtomicU64,
}

impl Leases {
    pub(crate) fn new(
        config: LeaseConfig,
        label: &'static str,
        server: Option<Arc<ServerEpoch>>,
    ) -> Self {
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
            period_us: micros(config.period).max(1),
            config,
            // The server epoch's clock, when there is one: times compare
            // without another reading.
            epoch: server.as_ref().map_or_else(Instant::now, |s| s.base()),
            instance,
            next_id: AtomicU64::new(1),
            next_serial: AtomicU64::new(0),
            counters: Counters::default(),
            label,
            server,
            next_sweep: AtomicU64::new(0),
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
    ///
    /// A policy with a lock-out takes no leases either: a hold's tokens stay
    /// spendable by its holder after another instance's refusal locked the
    /// key out, and a lock-out must hold for every instance at once.
    pub(crate) fn pays_on(&self, policy: &Policy) -> bool {
        let period_us = self.config.period.as_micros();
        policy.quotas().iter().all(|q| {
            q.lockout_us() == 0
                && u128::from(q.num()) * period_us >= u128::from(MIN_LEASE) * u128::from(q.den())
        })
    }

    /// `start` (a safe key's) as [`check_held`](Self::check_held) takes it.
    pub(crate) fn start(&self, start: &str) -> LeaseStart {
        let mut state = self.hasher.build_hasher();
        state.write(start.as_bytes());
        LeaseStart {
            text: start.into(),
            state,
        }
    }

    /// `name`'s hash: its bytes alone, with this map's random seed (so a
    /// name written in pieces hashes the same, see `check_held`).
    fn hash(&self, name: &[u8]) -> u64 {
        let mut state = self.hasher.build_hasher();
        state.write(name);
        state.finish()
    }

    /// The shard of the name hashed to `hash`, locked.
    fn shard_of(&self, hash: u64) -> MutexGuard<'_, Shard> {
        match self
            .shards
            .get(self.shard_index(hash))
            .or(self.shards.first())
        {
            Some(shard) => lock(shard),
            None => unreachable!("a lease map has at least one shard"),
        }
    }

    /// The index of the shard of the name hashed to `hash`.
    fn shard_index(&self, hash: u64) -> usize {
        // Bits 25 to 56 pick the shard, as `bits x len / 2^32` (an even
        // spread below `len`, without a division): the table inside it
        // indexes by the low bits and tags each slot with the top 7, and
        // neither may be the same for all of a shard's keys (the top bits
        // would leave a shard's tags a few values of 128, so a probe would
        // compare many more names than it finds).
        let bits = (hash >> 25) & 0xFFFF_FFFF;
        usize::try_from((bits * self.shards.len() as u64) >> 32).unwrap_or(0)
    }

    /// Now, on the map's clock (microseconds since `epoch`).
    fn now(&self) -> u64 {
        micros(self.epoch.elapsed())
    }

    /// `at` on the map's clock.
    fn at(&self, at: Instant) -> u64 {
        micros(at.saturating_duration_since(self.epoch))
    }

    /// Used here until `sent + life - margin`; the margin (a tenth of the
    /// life) covers a Redis clock that runs a little faster than ours.
    fn until(sent: u64, life: u64) -> u64 {
        sent.saturating_add(life - life / 10)
    }

    /// A plain check of `cost` on the buckets of the storage-safe key
    /// `name` under `policy`: decided here from a hold when one has the
    /// tokens (`Some`), else `None` (ask Redis). Either way, what to send in
    /// the background is added to `errand`. `keys` makes the storage keys
    /// of the buckets, for a key seen for the first time: a check decided
    /// from a hold allocates nothing.
    pub(crate) fn check(
        &self,
        name: &str,
        keys: impl FnOnce() -> Vec<String>,
        policy: &Policy,
        cost: u64,
        errand: &mut Errand,
    ) -> Option<Decision> {
        let now = self.now();
        let hash = self.hash(name.as_bytes());
        let mut guard = self.shard_of(hash);
        let (table, counts) = guard.parts();
        let entry = match table.find_entry(hash, |e| e.is(name.as_bytes(), policy)) {
            Ok(found) => found.into_mut(),
            Err(absent) => {
                let table = absent.into_table();
                if table.len() >= self.per_shard {
                    self.evict(table, counts.outstanding, errand);
                }
                let serial = self.next_serial.fetch_add(1, Ordering::Relaxed);
                let entry = Entry::new(name, policy, serial, keys(), now);
                table
                    .insert_unique(hash, entry, |e| self.hash(e.name()))
                    .into_mut()
            }
        };
        self.spend_from(entry, now, policy, cost, counts, errand)
    }

    /// [`check`](Self::check) of the key `start` + `value` (`start` from
    /// [`start`](Self::start)) when this map holds it with a hold that
    /// pays for `cost` now (the common case, for a key with room to
    /// spare): the same decision (`Some`), found without writing the key
    /// out. `None`, having changed nothing, for any other key (one that is
    /// not its own storage-safe form among them): check it with `check`.
    /// `cost` must be at least 1.
    pub(crate) fn check_held(
        &self,
        start: &LeaseStart,
        value: &str,
        policy: &Policy,
        cost: u64,
        errand: &mut Errand,
    ) -> Option<Decision> {
        // `start` + `value` is its own safe form (so `check` names it the
        // same) when `value`'s bytes are all safe and the whole is not too
        // long: `start` is a safe key's, so it is not empty and starts with
        // no `#`.
        if cost == 0
            || start.text.len() + value.len() > MAX_RAW_KEY_LEN
            || !is_safe_tail(value.as_bytes())
        {
            return None;
        }
        let now = self.now();
        // SipHash over bytes written in pieces is the hash of the pieces
        // written at once (std's, today; were it not, a held key would
        // only never be found here: `is_split` compares the bytes, and the
        // check goes the general way, see the test of every split).
        let mut state = start.state.clone();
        state.write(value.as_bytes());
        let hash = state.finish();
        let mut guard = self.shard_of(hash);
        let (table, counts) = guard.parts();
        let entry = table.find_mut(hash, |e| {
            e.is_split(start.text.as_bytes(), value.as_bytes(), policy)
        })?;
        // A hold that pays is kept by `spend_from`'s reports (it has tokens
        // left and time, in a confirmed epoch) and then spent from: it
        // decides.
        if !self.spendable(entry, now)
            || !entry
                .holds()
                .iter()
                .any(|h| h.left >= cost && now < h.until)
        {
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
        now: u64,
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
        #[expect(
            clippy::cast_precision_loss,
            reason = "microseconds below 2^53 (285 years) are exact"
        )]
        let (age, period) = (now.saturating_sub(entry.seen) as f64, self.period_us as f64);
        // What the key asked for before this check, decayed to now.
        let prior = entry.demand * decay(age / period);
        entry.demand = prior + cost as f64;
        entry.seen = now;
        self.renew_generation(entry, now, outstanding, &mut errand.reports);
        // Holds used up or past their time here are reported: one spent
        // whole with the next lease request, others at once.
        let mut i = 0;
        while let Some(hold) = entry.holds().get(i) {
            if hold.left > 0 && now < hold.until {
                i += 1;
                continue;
            }
            let Some(hold) = entry.remove_hold(i) else {
                break;
            };
            let granted = hold.granted;
            let report = self.report(&entry.cold.keys, &entry.policy, hold, now, outstanding);
            if report.left == 0 && !report.expired && entry.cold.spent.len() < MAX_HOLDS {
                entry.cold.spent.push_back((report.id, granted));
            } else {
                errand.reports.push(report);
            }
        }
        // Spent from the hold that ends here first: a plain lease asked for
        // under a roomy one ends long before it, and would otherwise expire
        // unspent (debited whole).
        let mut decided = None;
        let spendable = self.spendable(entry, now);
        if let Some(hold) = entry
            .holds_mut()
            .iter_mut()
            .filter(|h| spendable && h.left >= cost && now < h.until)
            .min_by_key(|h| h.until)
        {
            hold.left -= cost;
            *local += 1;
            *spent += cost;
            *outstanding -= cost;
            decided = Some(local_decision(policy, hold.left));
            // Spending keeps the epoch confirmed; a check that goes to
            // Redis confirms it by its reply.
            errand.verify = self.server.as_ref().is_some_and(|s| s.verify_due(now));
        }
        errand.sweep = self.sweep_due(now);
        // Ask for the next lease when what is held runs low (see `low`),
        // or the newest hold is in its last quarter.
        // A key that was not checked within about a period before this
        // check (a decayed demand under half of this check's cost: no
        // check in the last 0.7 periods, or a sparse trickle) gets no
        // lease: a hold it would not spend before its expiry is debited
        // whole, and a client seen once an hour would lose a lease's
        // worth of tokens for every request.
        if entry.asking
            || entry.holds().len() >= MAX_HOLDS
            || now < entry.quiet_until
            || prior < cost.max(1) as f64 / 2.0
        {
            return decided;
        }
        let held: u64 = entry.holds().iter().map(|h| h.left).sum();
        let aging = entry
            .holds()
            .last()
            .is_none_or(|h| h.until.saturating_sub(now) < entry.quarter);
        // Not low either, without working out how low is (the common case
        // under a roomy lease): low is under twice a period's demand at
        // most, and a period's demand under 4 x `demand` + 1 (`young` is
        // at least 1/4).
        // A confirmation of the epoch is due (this check took the turn): a
        // lease request confirms it as well, and tops the holds up.
        let aging = aging || errand.verify;
        #[expect(
            clippy::cast_precision_loss,
            reason = "a bound with room to spare: rounding cannot cross it"
        )]
        if !aging && held as f64 >= 8.0 * entry.demand + 2.0 {
            return decided;
        }
        #[expect(
            clippy::cast_precision_loss,
            reason = "microseconds below 2^53 (285 years) are exact"
        )]
        let age = now.saturating_sub(entry.born) as f64 / period;
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
        // Low: under an eighth of a period's demand left (a lease of one
        // period; asked for late, so that a key shared by several
        // instances, whose holds the script caps at half the bucket, asks
        // for more at a time),
        // or, under a roomy lease, under two periods' (or half of it, if
        // it covers less than four): enough to last while the next is
        // asked for, without asking again each time a young key's count
        // moves.
        let low = if entry.roomy {
            held < (roomy_wanted / 2).min(per_period.saturating_mul(2))
        } else {
            8 * held < per_period
        };
        // Enough for a period and a half (a roomy lease: `ROOMY` of them),
        // less what is still held: asked for when under an eighth of a
        // period is left, a lease lasts over a period. It lives two. The script
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
            let carried = entry.cold.spent.pop_front().map(|(id, _)| id);
            // Besides a hold spent whole, the live one that spent most
            // reports that much, keeping the rest: what was spent leaves the
            // holds' share of the bucket (at most half of it, see
            // "Epochs" in the script) to the instances sharing the key.
            let partial = entry
                .holds()
                .iter()
                .zip(&entry.cold.rest)
                .map(|(h, r)| (r.id, r.granted - h.left))
                .filter(|&(_, spent)| spent > 0)
                .max_by_key(|&(_, spent)| spent);
            entry.cold.partial = partial.map(|(id, _)| id);
            errand.lease = Some(Ask {
                asked: Asked {
                    name: entry.name_boxed(),
                    serial: entry.cold.serial,
                    keys: entry.cold.keys.clone(),
                    policy: entry.policy.clone(),
                    id: 0,
                    generation: self.generation(),
                    partial,
                },
                want: if want >= MIN_LEASE { want } else { 0 },
                life: 2 * self.config.period,
                roomy_want: if roomy_want >= MIN_LEASE {
                    roomy_want
                } else {
                    0
                },
                carried,
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
            .find(|e| e.holds == 0 && !e.asking)
            .or_else(|| table.iter().next())
            .map(|e| (e.name_boxed(), e.cold.serial));
        if let Some((name, serial)) = victim
            && let Ok(found) = table.find_entry(self.hash(name.as_bytes()), |e| {
                e.name() == name.as_bytes() && e.cold.serial == serial
            })
        {
            let (entry, _) = found.remove();
            errand.reports.extend(self.leaving(entry, outstanding));
        }
    }

    /// The reports of a key leaving the map: its holds, and those spent
    /// whole that wait for a lease request.
    fn leaving(&self, mut entry: Entry, outstanding: &mut u64) -> Vec<Report> {
        self.leaving_holds(&mut entry, self.now(), outstanding)
    }

    /// The reports of `entry`'s holds, taken out at `now`, and of those
    /// spent whole that wait for a lease request.
    fn leaving_holds(&self, entry: &mut Entry, now: u64, outstanding: &mut u64) -> Vec<Report> {
        let holds = entry.take_holds();
        let mut out: Vec<Report> = entry
            .cold
            .spent
            .drain(..)
            .map(|(id, _)| Report {
                keys: entry.cold.keys.clone(),
                policy: entry.policy.clone(),
                id,
                spent: WHOLE,
                left: 0,
                expired: false,
            })
            .collect();
        for hold in holds {
            out.push(self.report(&entry.cold.keys, &entry.policy, hold, now, outstanding));
        }
        out
    }

    /// The report of `hold`, which leaves its shard (whose unspent held
    /// tokens are `outstanding`) at `now`.
    fn report(
        &self,
        keys: &[String],
        policy: &Policy,
        hold: Hold,
        now: u64,
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

    /// The lease `asked` for answered: `grant`, or `None` when the call
    /// failed. A hold whose key's entry was evicted or forgotten meanwhile
    /// (a later entry of the same name never gets it: after a reset, Redis
    /// may have deleted the hold with its buckets), or that was granted in
    /// another epoch than the one it was asked in, comes back to be
    /// reported, with any holds of an epoch that is gone.
    pub(crate) fn answered(&self, asked: &Asked, grant: Option<Grant>) -> Vec<Report> {
        let hash = self.hash(asked.name.as_bytes());
        let mut guard = self.shard_of(hash);
        let shard = &mut *guard;
        let mut out = Vec::new();
        let now = self.now();
        let found = shard.table.find_mut(hash, |e| {
            e.name() == asked.name.as_bytes() && e.cold.serial == asked.serial
        });
        let same_epoch = asked.generation == self.generation();
        let Some(entry) = found else {
            if let Some(grant) = grant.filter(|g| g.granted > 0) {
                out.push(self.unused(asked, grant.granted));
            }
            return out;
        };
        entry.asking = false;
        entry.roomy = grant.is_some_and(|g| g.roomy);
        entry.cold.partial = None;
        self.renew_generation(entry, now, &mut shard.outstanding, &mut out);
        // The partial report found its hold: Redis debited what it said
        // was spent, and holds the rest. (A report whose answer is lost
        // leaves the hold as it was here: its final report then debits at
        // most what Redis still holds, so too much at worst.)
        if let (Some((id, spent)), Some(grant)) = (asked.partial, grant)
            && grant.found
            && same_epoch
            && entry.reported_part(id, spent)
        {
            let held = self.counters.held.fetch_sub(spent, Ordering::Relaxed);
            observe::lease_held(self.label, held.saturating_sub(spent));
        }
        match grant {
            Some(grant) if grant.granted > 0 && !same_epoch => {
                out.push(self.unused(asked, grant.granted));
            }
            Some(grant) if grant.granted > 0 => {
                self.counters
                    .granted
                    .fetch_add(grant.granted, Ordering::Relaxed);
                shard.outstanding += grant.granted;
                let held = self
                    .counters
                    .held
                    .fetch_add(grant.granted, Ordering::Relaxed);
                observe::lease_held(self.label, held.saturating_add(grant.granted));
                let life = micros(grant.life);
                let hold = Hold {
                    id: asked.id,
                    granted: grant.granted,
                    left: grant.granted,
                    life,
                    until: Self::until(self.at(grant.sent), life),
                };
                // Never more than `MAX_HOLDS` (a lease is asked for only
                // below it, one at a time); one past them goes back.
                if let Err(hold) = entry.push_hold(hold) {
                    out.push(self.report(
                        &asked.keys,
                        &asked.policy,
                        hold,
                        now,
                        &mut shard.outstanding,
                    ));
                }
            }
            // Nothing to spare (or no answer): not asked again for a period.
            _ => entry.quiet_until = now.saturating_add(self.period_us),
        }
        out
    }

    /// The report giving back a hold of `granted` tokens that `asked` got
    /// and nobody will spend.
    fn unused(&self, asked: &Asked, granted: u64) -> Report {
        Report {
            keys: asked.keys.clone(),
            policy: asked.policy.clone(),
            id: asked.id,
            spent: 0,
            left: granted,
            expired: false,
        }
    }

    /// The generation of the server's epoch (0 without one).
    pub(crate) fn generation(&self) -> u64 {
        self.server.as_ref().map_or(0, |s| s.generation())
    }

    /// Whether `entry`'s holds may be spent at `now`: their epoch is the
    /// server's, confirmed within the last second (always, on a cluster).
    #[inline]
    fn spendable(&self, entry: &Entry, now: u64) -> bool {
        self.server.as_ref().is_none_or(|s| {
            #[expect(
                clippy::cast_possible_truncation,
                reason = "generations are compared by their low 32 bits"
            )]
            let current = s.generation() as u32;
            entry.generation == current && s.spendable(s.generation(), now)
        })
    }

    /// Moves `entry` to the server's current epoch: holds granted in an
    /// earlier one are never spent, and are reported to `reports` (a report
    /// finds nothing where the data went; where it did not, it releases
    /// them).
    fn renew_generation(
        &self,
        entry: &mut Entry,
        now: u64,
        outstanding: &mut u64,
        reports: &mut Vec<Report>,
    ) {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "generations are compared by their low 32 bits"
        )]
        let current = self.generation() as u32;
        if entry.generation == current {
            return;
        }
        entry.generation = current;
        for hold in entry.take_holds() {
            reports.push(self.report(&entry.cold.keys, &entry.policy, hold, now, outstanding));
        }
        entry.cold.spent.clear();
    }

    /// Whether the holds of keys gone quiet are due to be swept now (at
    /// most once a lease period; this call takes the turn).
    fn sweep_due(&self, now: u64) -> bool {
        let next = self.next_sweep.load(Ordering::Relaxed);
        now >= next
            && self
                .next_sweep
                .compare_exchange(
                    next,
                    now.saturating_add(self.period_us),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// The holds of keys not checked for [`QUIET_PERIODS`] lease periods,
    /// taken out to be reported: what they did not spend goes back to the
    /// bucket now, not at their expiry (a roomy hold lives 64 periods).
    pub(crate) fn sweep(&self) -> Vec<Report> {
        let now = self.now();
        let quiet = self.period_us.saturating_mul(QUIET_PERIODS);
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut guard = lock(shard);
            let Shard {
                table, outstanding, ..
            } = &mut *guard;
            for entry in table.iter_mut() {
                if now.saturating_sub(entry.seen) < quiet
                    || (entry.holds == 0 && entry.cold.spent.is_empty())
                {
                    continue;
                }
                out.extend(self.leaving_holds(entry, now, outstanding));
            }
        }
        out
    }

    /// Gives `tokens` back to the key `name` (its storage-safe form) under
    /// `policy` from what this instance spent of its holds and has not
    /// reported yet: a hold's spent tokens become its own again (its
    /// report then debits fewer), and a hold spent whole is reported at once
    /// for what is left spent. What a refund gives back here is exact where
    /// Redis could only clamp it (the bucket counts those tokens as still
    /// there until the report). Returns the tokens given back here, and
    /// the reports to send.
    pub(crate) fn refund(&self, name: &str, policy: &Policy, tokens: u64) -> (u64, Vec<Report>) {
        let now = self.now();
        let hash = self.hash(name.as_bytes());
        let mut guard = self.shard_of(hash);
        let shard = &mut *guard;
        let mut reports = Vec::new();
        let Some(entry) = shard
            .table
            .find_mut(hash, |e| e.is(name.as_bytes(), policy))
        else {
            return (0, reports);
        };
        self.renew_generation(entry, now, &mut shard.outstanding, &mut reports);
        let mut given = 0;
        let rests: Vec<HoldRest> = entry.cold.rest.to_vec();
        let partial = entry.cold.partial;
        for (hold, rest) in entry.holds_mut().iter_mut().zip(rests) {
            if partial == Some(rest.id) {
                continue;
            }
            let back = (rest.granted - hold.left).min(tokens - given);
            hold.left += back;
            given += back;
        }
        shard.outstanding += given;
        while given < tokens
            && let Some((id, granted)) = entry.cold.spent.pop_front()
        {
            let back = granted.min(tokens - given);
            given += back;
            reports.push(Report {
                keys: entry.cold.keys.clone(),
                policy: entry.policy.clone(),
                id,
                spent: granted - back,
                left: back,
                expired: false,
            });
        }
        (given, reports)
    }

    /// Forgets the holds on the buckets of `key` under `policy` (they were
    /// reset): the entry of that policy, whose holds went with its buckets,
    /// and those of the key's other policies that share a bucket with it
    /// (same quota), whose reports go to `errand` (they debit and release
    /// the holds' other buckets). Looks through the whole map: a reset is
    /// rare, the map bounded.
    ///
    /// A reset forgets twice: before its `DEL`, and after it (`after`),
    /// when an entry made meanwhile may hold a lease Redis granted on the
    /// buckets just before they went. After the `DEL`, every hold is
    /// reported, the reset policy's too: a report of a hold the `DEL` took
    /// finds nothing, one granted after it releases it.
    pub(crate) fn forget(&self, key: &str, policy: &Policy, after: bool, errand: &mut Errand) {
        let name = safe_key(key);
        for shard in &self.shards {
            let mut guard = lock(shard);
            let Shard {
                table, outstanding, ..
            } = &mut *guard;
            let ours = |e: &Entry| {
                e.name() == name.as_bytes()
                    && e.policy
                        .key_tails()
                        .iter()
                        .any(|t| policy.key_tails().contains(t))
            };
            let gone: Vec<Entry> = table.extract_if(|e| ours(e)).collect();
            for entry in gone {
                let same = entry.policy.same_counting(policy);
                let reports = self.leaving(entry, outstanding);
                // The reset policy's own holds went with its buckets:
                // their reports would find nothing.
                if !same || after {
                    errand.reports.extend(reports);
                }
            }
        }
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

/// `exp(-x)` for `x >= 0`: for the small `x` of a key checked often (the
/// time since its last check, in lease periods), by its Taylor series to
/// `x^6` (off by under `x^7 / 5040`, 6e-15 below 1/32), without a call
/// to the math library on every check.
#[inline]
fn decay(x: f64) -> f64 {
    if x < 1.0 / 32.0 {
        1.0 - x
            * (1.0
                - x / 2.0 * (1.0 - x / 3.0 * (1.0 - x / 4.0 * (1.0 - x / 5.0 * (1.0 - x / 6.0)))))
    } else {
        (-x).exp()
    }
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
        Leases::new(config, "test", None)
    }

    fn grant(granted: u64, life: Duration) -> Grant {
        Grant {
            granted,
            sent: Instant::now(),
            life,
            roomy: false,
            found: false,
        }
    }

    fn policy(quotas: &[Quota]) -> Policy {
        Policy::new("p", quotas.iter().copied()).unwrap()
    }

    /// One check of `key` under `policy`: decided here or not, and the
    /// errand it leaves.
    fn check(leases: &Leases, key: &str, policy: &Policy) -> (Option<Decision>, Errand) {
        let mut errand = Errand::default();
        let name = safe_key(key);
        let decided = leases.check(&name, || vec![format!("{key}:k")], policy, 1, &mut errand);
        (decided, errand)
    }

    /// Checks `key` until it asks for a lease, and answers it with a hold
    /// of `granted` (id `id`).
    fn held(leases: &Leases, key: &str, policy: &Policy, id: u64, granted: u64) {
        let ask = (0..4)
            .find_map(|_| check(leases, key, policy).1.lease)
            .expect("a key checked again within a period asks for a lease");
        let back = leases.answered(
            &Asked { id, ..ask.asked },
            Some(grant(granted, Duration::from_secs(60))),
        );
        assert!(back.is_empty(), "the hold is the key's");
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
                leases.forget("c", &p, false, &mut Errand::default());
                // A check of the fresh bucket makes a fresh entry.
                assert!(check(&leases, "c", &p).0.is_none());
            }
            let back = leases.answered(
                &Asked { id: 7, ..ask.asked },
                Some(grant(10, Duration::from_secs(60))),
            );
            let decided = check(&leases, "c", &p).0;
            if reset {
                let [back] = &back[..] else {
                    panic!("the hold comes back to be reported")
                };
                assert_eq!((back.id, back.spent, back.left), (7, 0, 10));
                assert!(decided.is_none(), "the fresh entry spends no old hold");
                assert_eq!(leases.stats().outstanding, 0);
            } else {
                assert!(back.is_empty());
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
            let asked = Asked {
                id,
                name: ask.asked.name.clone(),
                keys: ask.asked.keys.clone(),
                policy: ask.asked.policy.clone(),
                ..ask.asked
            };
            leases.answered(&asked, Some(grant(granted, life)))
        };
        // A roomy hold, then a plain one behind it that ends much sooner.
        assert!(answer(1, 10, Duration::from_secs(60)).is_empty());
        assert!(answer(2, 5, Duration::from_secs(2)).is_empty());
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
        let apart = policy(&[Quota::per_minute(20).unwrap()]);
        // Other figures over the same period: the same bucket.
        let changed = policy(&[Quota::per_second(20).unwrap()]);
        held(&leases, "c", &reset, 1, 5);
        held(&leases, "c", &sharing, 2, 5);
        held(&leases, "c", &apart, 3, 5);
        held(&leases, "c", &changed, 5, 5);
        // Another key whose name starts with this one's.
        held(&leases, "c2", &sharing, 4, 5);
        let mut errand = Errand::default();
        leases.forget("c", &reset, false, &mut errand);
        // The reset policy's hold went with its buckets; the sharing
        // policy's is reported, for its other bucket, and so is the changed
        // policy's (held under other figures).
        let mut ids: Vec<u64> = errand.reports.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, [2, 5]);
        assert!(check(&leases, "c", &reset).0.is_none());
        assert!(check(&leases, "c", &changed).0.is_none());
        assert!(check(&leases, "c", &sharing).0.is_none());
        assert!(check(&leases, "c", &apart).0.is_some());
        assert!(check(&leases, "c2", &sharing).0.is_some());
    }

    /// A reset forgets a key's holds before its `DEL` and again after it:
    /// a lease asked for by a check in between, and granted by Redis on the
    /// old buckets just before the `DEL` deleted them (its answer coming
    /// before the `DEL`'s), is never spent, and is reported (a report of a
    /// hold the `DEL` took finds nothing).
    #[test]
    fn a_lease_granted_between_a_resets_forget_and_its_del_is_not_spent() {
        let leases = leases();
        let p = policy(&[Quota::per_second(100).unwrap()]);
        held(&leases, "c", &p, 1, 10);
        // The reset: forgotten before the DEL is sent.
        leases.forget("c", &p, false, &mut Errand::default());
        // Checks meanwhile make a fresh entry, which asks for a lease;
        // Redis grants it on the old buckets, and the answer arrives.
        held(&leases, "c", &p, 2, 10);
        // The DEL ran; the reset ends by forgetting again.
        let mut errand = Errand::default();
        leases.forget("c", &p, true, &mut errand);
        let ids: Vec<u64> = errand.reports.iter().map(|r| r.id).collect();
        assert_eq!(ids, [2], "the hold granted meanwhile is reported");
        assert!(
            check(&leases, "c", &p).0.is_none(),
            "a hold the DEL took was spent"
        );
    }

    /// A hold used up while the lease request carrying its partial report
    /// is under way: the answer finding that report leaves the held count
    /// right (it once took the partial tokens off a second time, which
    /// wrapped the count and made the next grant panic on overflow in a
    /// debug build), and the hold's final report debits only the rest.
    #[test]
    fn a_partial_report_answered_after_its_hold_was_used_up_counts_once() {
        let leases = leases();
        let p = policy(&[Quota::per_second(10).unwrap()]);
        held(&leases, "c", &p, 1, 20);
        // Spend until a lease is asked for; it carries a partial report.
        let mut ask = None;
        let mut spent = 0;
        while ask.is_none() {
            let (decided, errand) = check(&leases, "c", &p);
            assert!(decided.is_some(), "decided from the hold");
            spent += 1;
            ask = errand.lease;
        }
        let ask = ask.unwrap();
        assert_eq!(ask.asked.partial, Some((1, spent)));
        // Spend the rest of the hold while the request is under way.
        while spent < 20 {
            let (decided, _) = check(&leases, "c", &p);
            assert!(decided.is_some(), "decided from the hold");
            spent += 1;
        }
        // The next check finds it used up: it waits, spent whole, to be
        // reported.
        assert!(check(&leases, "c", &p).0.is_none());
        assert_eq!(leases.stats().held, 0);
        let partial = ask.asked.partial.unwrap().1;
        let back = leases.answered(
            &Asked { id: 2, ..ask.asked },
            Some(Grant {
                found: true,
                ..grant(5, Duration::from_secs(60))
            }),
        );
        assert!(back.is_empty());
        assert_eq!(
            leases.stats().held,
            5,
            "the new hold's 5 tokens, and no more"
        );
        // A refund taken from the used-up hold: its report says it spent
        // what the partial report did not debit, less the refund (Redis
        // holds 20 - partial of it, and would clamp a larger figure there,
        // losing the refund).
        let (given, reports) = leases.refund(&safe_key("c"), &p, 3);
        assert_eq!(given, 3);
        let [first] = &reports[..] else {
            panic!("one report: {}", reports.len())
        };
        assert_eq!((first.id, first.spent), (1, 20 - partial - 3));
    }

    /// Every shard gets keys, and within a shard the tags the table gives
    /// its slots (a hash's top 7 bits) still take most of their 128
    /// values: the shard is not chosen by the same bits.
    #[test]
    fn shards_spread_keys_without_narrowing_their_tags() {
        let leases = Leases::new(
            LeaseConfig {
                period: Duration::from_secs(1),
                max_keys: DEFAULT_LEASE_KEYS,
            },
            "test",
            None,
        );
        let shards = leases.shards.len();
        assert_eq!(shards, 16);
        let mut tags = vec![std::collections::HashSet::new(); shards];
        for i in 0..16_000 {
            let hash = leases.hash(format!("p:header:x-client:c{i}").as_bytes());
            tags[leases.shard_index(hash)].insert(hash >> 57);
        }
        for (i, tags) in tags.iter().enumerate() {
            assert!(tags.len() >= 100, "shard {i}: {} tags of 128", tags.len());
        }
    }

    /// `decay` is `exp(-x)` to within 1e-14 on both sides of where its
    /// series gives way to the library's.
    #[test]
    fn decay_is_exp() {
        for i in 0..=4096 {
            let x = f64::from(i) / 65536.0;
            assert!((decay(x) - (-x).exp()).abs() < 1e-14, "{x}");
        }
        assert_eq!(decay(0.0), 1.0);
        assert_eq!(decay(1.0), (-1.0f64).exp());
    }

    /// A name is found whole (`check`) or from a start and a value
    /// (`check_held`, split anywhere), held in its entry or, longer than
    /// [`SHORT_NAME`], beside it; under another policy's tails it is
    /// another key; a value that would not be its own safe form is
    /// declined.
    #[test]
    fn names_of_every_length_are_found_in_pieces() {
        let leases = leases();
        let p = policy(&[Quota::per_second(100).unwrap()]);
        let other = Policy::new("p", [Quota::per_second(200).unwrap()]).unwrap();
        let start = "p:header:";
        let lens = [1, SHORT_NAME - start.len(), SHORT_NAME + 1 - start.len()];
        for (id, len) in (1..).zip(lens.into_iter().chain([MAX_RAW_KEY_LEN - start.len()])) {
            let value = "v".repeat(len);
            let key = format!("{start}{value}");
            held(&leases, &key, &p, id, 10);
            let mut left = 10;
            for split in [0, 1, start.len(), key.len() - 1] {
                let (head, tail) = key.split_at(split.max(1));
                let mut errand = Errand::default();
                let decided = leases.check_held(&leases.start(head), tail, &p, 1, &mut errand);
                left -= 1;
                assert_eq!(decided.map(|d| d.remaining()), Some(left), "{len} {split}");
            }
            let mut errand = Errand::default();
            let s = leases.start(start);
            assert!(
                leases
                    .check_held(&s, &value, &other, 1, &mut errand)
                    .is_none()
            );
            assert!(
                leases
                    .check_held(&s, &format!("{value} "), &p, 1, &mut errand)
                    .is_none()
            );
            let long = "v".repeat(MAX_RAW_KEY_LEN + 1 - start.len());
            assert!(leases.check_held(&s, &long, &p, 1, &mut errand).is_none());
            assert_eq!(
                check(&leases, &key, &p).0.map(|d| d.remaining()),
                Some(left - 1)
            );
        }
    }
}
