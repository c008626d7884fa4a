//! Holds leaving the lease map, to be reported: a key evicted to make
//! room, keys gone quiet (swept), a reset's keys, and every hold when the
//! store is dropped.

use std::sync::atomic::Ordering;

use hashbrown::HashTable;

use super::QUIET_PERIODS;
use super::WHOLE;
use super::entry::{Entry, Hold};
use super::errand::{Errand, HoldReport};
use super::map::{Leases, Shard};
use crate::observe;
use crate::policy::Policy;
use crate::store::key::safe_key;

impl Leases {
    /// A key's entry goes to make room: one without holds if the first few
    /// looked at have one, else the first.
    pub(super) fn evict(
        &self,
        table: &mut HashTable<Entry>,
        outstanding: &mut u64,
        errand: &mut Errand,
    ) {
        // The victim's place in the table's order, which does not change
        // until it is taken out.
        let place = table
            .iter()
            .take(8)
            .position(|e| e.holds == 0 && !e.asking)
            .unwrap_or(0);
        let mut seen = 0;
        let victim = table
            .extract_if(|_| {
                seen += 1;
                seen == place + 1
            })
            .next();
        if let Some(entry) = victim {
            errand.reports.extend(self.leaving(entry, outstanding));
        }
    }

    /// The reports of a key leaving the map: its holds, and those spent
    /// whole that wait for a lease request.
    pub(super) fn leaving(&self, mut entry: Entry, outstanding: &mut u64) -> Vec<HoldReport> {
        self.leaving_holds(&mut entry, self.now(), outstanding)
    }

    /// The reports of `entry`'s holds, taken out at `now`, and of those
    /// spent whole that wait for a lease request.
    pub(super) fn leaving_holds(
        &self,
        entry: &mut Entry,
        now: u64,
        outstanding: &mut u64,
    ) -> Vec<HoldReport> {
        let holds = entry.take_holds();
        let keys = self.keys(entry);
        let mut out: Vec<HoldReport> = entry
            .cold
            .as_mut()
            .map(|c| std::mem::take(&mut c.spent))
            .unwrap_or_default()
            .into_iter()
            .map(|(id, _)| HoldReport {
                keys: keys.clone(),
                policy: entry.policy.clone(),
                id,
                spent: WHOLE,
                left: 0,
                expired: false,
            })
            .collect();
        for hold in holds {
            out.push(self.report(self.keys(entry), &entry.policy, hold, now, outstanding));
        }
        out
    }

    /// The report of `hold`, which leaves its shard (whose unspent held
    /// tokens are `outstanding`) at `now`.
    pub(super) fn report(
        &self,
        keys: Vec<String>,
        policy: &Policy,
        hold: Hold,
        now: u64,
        outstanding: &mut u64,
    ) -> HoldReport {
        *outstanding = outstanding.saturating_sub(hold.left);
        let held = self
            .counters
            .held
            .fetch_sub(hold.granted, Ordering::Relaxed);
        observe::lease_held(self.label, held.saturating_sub(hold.granted));
        HoldReport {
            keys,
            policy: policy.clone(),
            id: hold.id,
            spent: hold.granted - hold.left,
            left: hold.left,
            expired: now >= hold.until,
        }
    }

    /// The holds of keys not checked for [`QUIET_PERIODS`] lease periods,
    /// taken out to be reported: what they did not spend goes back to the
    /// bucket now, not at their expiry (a roomy hold lives 64 periods).
    pub(crate) fn sweep(&self) -> Vec<HoldReport> {
        let now = self.now();
        let quiet = self.period_us.saturating_mul(QUIET_PERIODS);
        let mut out = Vec::new();
        for mut guard in self.table.shards() {
            let Shard {
                entries,
                outstanding,
                ..
            } = &mut *guard;
            for entry in entries.iter_mut() {
                if now.saturating_sub(entry.seen) < quiet
                    || (entry.holds == 0 && entry.spent_waiting() == 0)
                {
                    continue;
                }
                out.extend(self.leaving_holds(entry, now, outstanding));
            }
        }
        out
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
        for mut guard in self.table.shards() {
            let Shard {
                entries,
                outstanding,
                ..
            } = &mut *guard;
            let ours = |e: &Entry| {
                e.is_named(name.as_bytes(), &self.starts)
                    && e.policy
                        .key_tails()
                        .iter()
                        .any(|t| policy.key_tails().contains(t))
            };
            let gone: Vec<Entry> = entries.extract_if(|e| ours(e)).collect();
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
    pub(crate) fn drain(&self) -> Vec<HoldReport> {
        let mut out = Vec::new();
        for mut guard in self.table.shards() {
            let shard = &mut *guard;
            for entry in shard.entries.drain() {
                out.extend(self.leaving(entry, &mut shard.outstanding));
            }
        }
        out
    }
}
