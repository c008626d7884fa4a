//! [`Leases`]: the lease map of one store, and a check decided from a hold.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hashbrown::HashTable;

use super::entry::{Entry, Starts};
use super::errand::{Errand, HoldReport};
use super::sizing::{Sizing, decay};
use super::{Counters, LeaseConfig, LeaseStats, MAX_HOLDS, MIN_LEASE};
use crate::decision::Decision;
use crate::policy::Policy;
use crate::quota::{ceil_div, micros};
use crate::store::bucket::Spent;
use crate::store::clock::Clock;
use crate::store::key::{MAX_RAW_KEY_LEN, is_safe_tail};
use crate::store::redis::epoch::ServerEpoch;
use crate::store::redis::keys::storage_key;
use crate::store::table::{self, KeyStart, Table};

/// A part of the map, with the counts of the checks decided from its
/// holds.
#[derive(Default)]
pub(super) struct Shard {
    pub(super) entries: HashTable<Entry>,
    /// Checks decided here from holds.
    local: u64,
    /// Held tokens spent here.
    spent: u64,
    /// Held tokens not yet spent, in this shard's holds.
    pub(super) outstanding: u64,
}

impl table::Shard for Shard {
    fn len(&self) -> usize {
        self.entries.len()
    }
}

impl Shard {
    /// The table, and the counts a check updates beside it.
    fn parts(&mut self) -> (&mut HashTable<Entry>, Counts<'_>) {
        let Shard {
            entries,
            local,
            spent,
            outstanding,
        } = self;
        let counts = Counts {
            local,
            spent,
            outstanding,
        };
        (entries, counts)
    }
}

/// A shard's counts, as one check updates them.
struct Counts<'a> {
    local: &'a mut u64,
    spent: &'a mut u64,
    outstanding: &'a mut u64,
}

/// The leases of one store (see the module docs).
pub(crate) struct Leases {
    pub(super) table: Table<Shard>,
    pub(super) config: LeaseConfig,
    /// The lease period in microseconds.
    pub(super) period_us: u64,
    /// The map's clock: times in entries are its microseconds.
    clock: Clock,
    /// Where this instance's lease ids start.
    instance: u64,
    next_id: AtomicU64,
    /// The next cold part's serial (see `Cold::serial`).
    next_serial: AtomicU64,
    pub(crate) counters: Counters,
    /// The `store` label of the metrics.
    pub(super) label: &'static str,
    /// The server's epoch (`None` on a cluster): holds are spent only
    /// while it confirms the one they were granted in.
    server: Option<Arc<ServerEpoch>>,
    /// The store's key prefix: a key's storage keys are written out from
    /// it, its name and its policy when a lease request or a report needs
    /// them (kept in every entry, they took about a fifth of its bytes).
    prefix: Arc<str>,
    /// No sweep of quiet keys' holds before then (map clock).
    next_sweep: AtomicU64,
    /// The starts of names its layers and limiters check, by number.
    pub(super) starts: Starts,
}

impl Leases {
    pub(crate) fn new(
        config: LeaseConfig,
        label: &'static str,
        server: Option<Arc<ServerEpoch>>,
        prefix: Arc<str>,
    ) -> Self {
        let shards = config.max_keys.clamp(1, 16);
        let table = Table::new(shards, config.max_keys.div_ceil(shards));
        // Ids start at a random point of [0, 2^63) (a fresh random seed per
        // map) and count up: two instances' ids meet only if their starting
        // points are closer than the leases they take.
        let instance = table.hasher().hash_one(std::process::id()) >> 1;
        Leases {
            table,
            period_us: micros(config.period).max(1),
            config,
            // The server epoch's clock, when there is one: times compare
            // without another reading.
            clock: server
                .as_ref()
                .map_or_else(Clock::new, |s| s.clock().clone()),
            instance,
            next_id: AtomicU64::new(1),
            next_serial: AtomicU64::new(0),
            counters: Counters::default(),
            label,
            server,
            prefix,
            next_sweep: AtomicU64::new(0),
            starts: Starts::default(),
        }
    }

    /// The storage keys of `entry`'s buckets, one per quota of its policy:
    /// what `RedisStore::bucket_keys` gives the key whose storage-safe form
    /// is the entry's name.
    pub(super) fn keys(&self, entry: &Entry) -> Vec<String> {
        self.keys_named(&entry.name_boxed(&self.starts), &entry.policy)
    }

    /// [`keys`](Self::keys) of the entry named `name` under `policy`.
    fn keys_named(&self, name: &str, policy: &Policy) -> Vec<String> {
        policy
            .key_tails()
            .iter()
            .map(|tail| storage_key(&self.prefix, name, tail))
            .collect()
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

    /// `start` (a safe key's) as [`check_held`](Self::check_held) takes it,
    /// numbered: entries of names that begin with it keep only the rest.
    pub(crate) fn start(&self, start: &str) -> KeyStart {
        self.table.start(start).numbered(self.starts.number(start))
    }

    /// `name`'s hash, with this map's seed.
    pub(super) fn hash(&self, name: &[u8]) -> u64 {
        self.table.hash(name)
    }

    /// Now, on the map's clock.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.clock.now_us()
    }

    /// Used here until `sent + life - margin`; the margin (a tenth of the
    /// life) covers a Redis clock that runs a little faster than ours.
    pub(super) fn until(sent: u64, life: u64) -> u64 {
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
        policy: &Policy,
        cost: u64,
        errand: &mut Errand,
    ) -> Option<Decision> {
        let now = self.now();
        let hash = self.hash(name.as_bytes());
        let mut guard = self.table.shard(hash);
        let full = self.table.is_full(&guard);
        let (entries, counts) = guard.parts();
        let starts = &self.starts;
        let entry = match entries.find_entry(hash, |e| e.is(name.as_bytes(), policy, starts)) {
            Ok(found) => found.into_mut(),
            Err(absent) => {
                let entries = absent.into_table();
                if full {
                    self.evict(entries, counts.outstanding, errand);
                }
                let entry = Entry::new(name, policy, now, starts, || self.serial());
                let seed = self.table.hasher();
                entries
                    .insert_unique(hash, entry, |e| {
                        let (start, rest) = e.name(starts);
                        seed.hash_pair(start, rest)
                    })
                    .into_mut()
            }
        };
        self.spend_from(entry, now, cost, counts, errand)
            .map(|left| local_decision(policy, left))
    }

    /// [`check`](Self::check) of the key `start` + `value` (`start` from
    /// [`start`](Self::start)) when this map holds it with a hold that
    /// pays for `cost` now (the common case, for a key with room to
    /// spare): the same decision (`Some`), as the figures of `policy`'s one
    /// quota, found without writing the key out. `None`, having changed
    /// nothing, for any other key (one that is not its own storage-safe
    /// form among them) and for a policy of several quotas: check it with
    /// `check`. `cost` must be at least 1.
    pub(crate) fn check_held(
        &self,
        start: &KeyStart,
        value: &str,
        policy: &Policy,
        cost: u64,
        errand: &mut Errand,
    ) -> Option<Spent> {
        let [quota] = policy.quotas() else {
            return None;
        };
        // `start` + `value` is its own safe form (so `check` names it the
        // same) when `value`'s bytes are all safe and the whole is not too
        // long: `start` is a safe key's, so it is not empty and starts with
        // no `#`.
        if cost == 0
            || start.text().len() + value.len() > MAX_RAW_KEY_LEN
            || !is_safe_tail(value.as_bytes())
        {
            return None;
        }
        let now = self.now();
        // The start and the value hash as the name written out (see
        // `table::Seed`; were they not, a held key would only never be
        // found here: `is_split` compares the bytes, and the check goes the
        // general way, see the test of every split).
        let hash = start.hash(value.as_bytes());
        let mut guard = self.table.shard(hash);
        let (entries, counts) = guard.parts();
        let entry = entries.find_mut(hash, |e| {
            e.is_split(start, value.as_bytes(), policy, &self.starts)
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
        let left = self.spend_from(entry, now, cost, counts, errand)?;
        Some(local_figures(quota, left))
    }

    /// The rest of a check of `cost` at `now` for `entry`: its demand
    /// counted, its holds used up or past their time reported, a hold spent
    /// from if one pays, and the next lease asked for when it is due. The
    /// tokens left in the hold spent from, if one paid.
    fn spend_from(
        &self,
        entry: &mut Entry,
        now: u64,
        cost: u64,
        counts: Counts<'_>,
        errand: &mut Errand,
    ) -> Option<u64> {
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
            let report = self.report(self.keys(entry), &entry.policy, hold, now, outstanding);
            match entry.cold.as_mut() {
                Some(cold)
                    if report.left == 0 && !report.expired && cold.spent.len() < MAX_HOLDS =>
                {
                    cold.spent.push_back((report.id, granted));
                }
                _ => errand.reports.push(report),
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
            decided = Some(hold.left);
            // Spending keeps the epoch confirmed; a check that goes to
            // Redis confirms it by its reply.
            errand.verify = self.server.as_ref().is_some_and(|s| s.verify_due(now));
        }
        errand.sweep = self.sweep_due(now);
        let sizing = Sizing {
            period: self.config.period,
            period_us: self.period_us,
            serial: &|| self.serial(),
        };
        if let Some(mut ask) = sizing.next_lease(entry, now, prior, cost, errand.verify) {
            ask.asked.generation = self.generation();
            let name = entry.name_boxed(&self.starts);
            ask.asked.keys = self.keys_named(&name, &entry.policy);
            ask.asked.name = name;
            errand.lease = Some(ask);
        }
        decided
    }

    /// A fresh entry serial (see `Cold::serial`).
    pub(super) fn serial(&self) -> u64 {
        self.next_serial.fetch_add(1, Ordering::Relaxed)
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

    /// The generation of the server's epoch (0 without one).
    pub(crate) fn generation(&self) -> u64 {
        self.server.as_ref().map_or(0, |s| s.generation())
    }

    /// Whether `entry`'s holds may be spent at `now`: their epoch is the
    /// server's, confirmed within the last second (always, on a cluster).
    #[inline]
    pub(super) fn spendable(&self, entry: &Entry, now: u64) -> bool {
        self.server
            .as_ref()
            .is_none_or(|s| s.spendable(u64::from(entry.generation), now))
    }

    /// Moves `entry` to the server's current epoch: holds granted in an
    /// earlier one are never spent, and are reported to `reports` (a report
    /// finds nothing where the data went; where it did not, it releases
    /// them).
    pub(super) fn renew_generation(
        &self,
        entry: &mut Entry,
        now: u64,
        outstanding: &mut u64,
        reports: &mut Vec<HoldReport>,
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
            reports.push(self.report(self.keys(entry), &entry.policy, hold, now, outstanding));
        }
        if let Some(cold) = entry.cold.as_mut() {
            cold.spent.clear();
        }
    }

    /// Whether the holds of keys gone quiet are due to be swept now (at
    /// most once a lease period; this call takes the turn).
    pub(super) fn sweep_due(&self, now: u64) -> bool {
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

    pub(crate) fn stats(&self) -> LeaseStats {
        let c = &self.counters;
        let (mut local, mut spent, mut outstanding) = (0, 0, 0);
        for shard in self.table.shards() {
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
}

/// A decision made from a hold with `left` tokens left after it: admitted,
/// and what remains is what this instance can still spend for sure (never
/// more than the bucket holds).
fn local_decision(policy: &Policy, left: u64) -> Decision {
    match policy.quotas() {
        [q] => local_figures(q, left).decision(q),
        quotas => Decision::new(
            true,
            quotas
                .iter()
                .map(|q| local_figures(q, left).state(q))
                .collect::<Vec<_>>(),
        ),
    }
}

/// [`local_decision`]'s figures for quota `q`.
#[inline]
fn local_figures(q: &crate::quota::Quota, left: u64) -> Spent {
    let missing = q.capacity().saturating_sub(left).saturating_mul(q.den());
    Spent::admitted(left, ceil_div(missing, q.num()))
}
