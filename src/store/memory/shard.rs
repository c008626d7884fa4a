//! [`Shard`]: one shard of a memory store's table: its keys, the quotas
//! and key starts they refer to by number, and the order in which a full
//! shard forgets them.

use std::collections::{BTreeMap, btree_map};

use hashbrown::HashTable;

use super::entry::{Entry, Known};
use crate::policy::Policy;
use crate::quota::Quota;
use crate::store::bucket::{Level, Spent, spend_one_figures};
use crate::store::table::{self, KeyStart, Seed};

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

/// Whether a check of `cost` that `allowed` it (or not) changed its
/// buckets: an admission of something, or a refusal that locked a bucket
/// out (one more of `levels` stamped ahead of `now` than the `ahead` before
/// it). A peek, or another refusal, changes nothing.
#[inline]
pub(super) fn writes(allowed: bool, cost: u64, levels: &[Level], now: u64, ahead: usize) -> bool {
    cost != 0 && (allowed || stamped_ahead(levels, now) > ahead)
}

/// Whether a check found its key stored, and whether a bucket of it was
/// kept under other figures of its quota's period and carried into them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Found {
    New,
    Stored,
    Carried,
}

/// What an update of a key's buckets stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Write {
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
#[inline]
pub(super) fn stamped_ahead(levels: &[Level], now: u64) -> usize {
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
pub(super) struct Shard {
    pub(super) map: HashTable<Entry>,
    /// What the entries of `map` refer to by number.
    pub(super) known: Known,
    pub(super) order: Order,
    /// Keys forgotten to make room before they had refilled.
    #[cfg(test)]
    pub(super) evicted: u64,
    /// Keys forgotten because they had refilled (free to forget).
    #[cfg(test)]
    pub(super) forgotten: u64,
}

const _: () = assert!(
    std::mem::offset_of!(Shard, known) + std::mem::size_of::<Vec<Quota>>() <= 56,
    "the table and the numbered quotas fit the lock's cache line"
);

impl Shard {
    #[cfg(test)]
    pub(super) fn get(&self, hash: u64, key: &str) -> Option<&Entry> {
        self.map.find(hash, |e| e.is(&self.known, key))
    }

    /// Files the first key of `order` under its current `full_at` until the
    /// first one is current, and returns its place: `(filed_at, hash)`, its
    /// `filed_at` its `full_at` now.
    fn first_current(&mut self, hasher: &Seed) -> Option<(u64, u64)> {
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
    pub(super) fn forget_first(&mut self, hasher: &Seed, now: u64) {
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
    pub(super) fn sweep(&mut self, hasher: &Seed, now: u64) {
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
    pub(super) fn update_found<T, U>(
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

    /// A check of `cost` against `quota` for the key `start` + `value`
    /// (`hash` its hash), when this shard holds it as it is with `quota`'s
    /// bucket alone: as [`update_found`](Self::update_found) with
    /// [`spend`] would decide it. `None`, having changed nothing, otherwise.
    #[inline]
    pub(super) fn check_held(
        &mut self,
        hash: u64,
        start: &KeyStart,
        value: &str,
        quota: &Quota,
        cost: u64,
        now_us: u64,
    ) -> Option<Spent> {
        let known = &self.known;
        let entry = self.map.find_mut(hash, |e| {
            e.is_held(known, start.number(), start.text(), value)
        })?;
        let filed_at = entry.filed_at;
        let stored = entry.held_level(known, quota)?;
        let mut level = stored.refilled(quota, now_us);
        let ahead = usize::from(level.stamp > now_us);
        let spent = spend_one_figures(quota, &mut level, cost, now_us);
        if writes(
            spent.allowed,
            cost,
            std::slice::from_ref(&level),
            now_us,
            ahead,
        ) {
            // An admission (or a lock-out) only moves the key's `full_at`
            // later (see `Shard`): it stays where it is filed.
            debug_assert!(
                level.full_at(quota) >= filed_at,
                "an admission filed a key earlier"
            );
            *stored = level;
        }
        Some(spent)
    }

    /// Stores the `levels` of `quotas` as the buckets of `key`, a key this
    /// shard does not hold yet (`hash` is the key's).
    pub(super) fn insert(
        &mut self,
        hasher: &Seed,
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
    pub(super) fn reset(&mut self, hash: u64, key: &str, policy: &Policy) {
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

impl table::Shard for Shard {
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// An entry filed at `at` whose key hashes to `hash` (the table's probe
/// meets keys of other hashes too; only those filed at `at` are hashed).
fn filed_as<'a>(
    hasher: &'a Seed,
    known: &'a Known,
    at: u64,
    hash: u64,
) -> impl Fn(&Entry) -> bool + 'a {
    move |e| e.filed_at == at && e.hash(hasher, known) == hash
}
