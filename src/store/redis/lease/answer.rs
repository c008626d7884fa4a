//! What Redis answers the lease map: a lease granted (or not), a report
//! that found its hold (or not); and refunds given back to holds here.

use std::sync::atomic::Ordering;

use super::entry::{Hold, HoldRest};
use super::errand::{Asked, Grant, HoldReport};
use super::map::Leases;
use crate::observe;
use crate::policy::Policy;
use crate::quota::micros;

impl Leases {
    /// The lease `asked` for answered: `grant`, or `None` when the call
    /// failed. A hold whose key's entry was evicted or forgotten meanwhile
    /// (a later entry of the same name never gets it: after a reset, Redis
    /// may have deleted the hold with its buckets), or that was granted in
    /// another epoch than the one it was asked in, comes back to be
    /// reported, with any holds of an epoch that is gone.
    pub(crate) fn answered(&self, asked: &Asked, grant: Option<Grant>) -> Vec<HoldReport> {
        let hash = self.hash(asked.name.as_bytes());
        let mut guard = self.table.shard(hash);
        let shard = &mut *guard;
        let mut out = Vec::new();
        let now = self.now();
        let found = shard.entries.find_mut(hash, |e| {
            e.is_named(asked.name.as_bytes(), &self.starts) && e.has_serial(asked.serial)
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
        if let Some(cold) = entry.cold.as_mut() {
            cold.partial = None;
        }
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
                    until: Self::until(grant.sent, life),
                };
                // Never more than `MAX_HOLDS` (a lease is asked for only
                // below it, one at a time); one past them goes back.
                if let Err(hold) = entry.push_hold(hold) {
                    out.push(self.report(
                        asked.keys.clone(),
                        &asked.policy,
                        hold,
                        now,
                        &mut shard.outstanding,
                    ));
                }
            }
            // Nothing to spare (or no answer): not asked again for a period.
            // (The entry asked, so it has its cold part.)
            _ => {
                if let Some(cold) = entry.cold.as_mut() {
                    cold.quiet_until = now.saturating_add(self.period_us);
                }
            }
        }
        out
    }

    /// The report giving back a hold of `granted` tokens that `asked` got
    /// and nobody will spend.
    fn unused(&self, asked: &Asked, granted: u64) -> HoldReport {
        HoldReport {
            keys: asked.keys.clone(),
            policy: asked.policy.clone(),
            id: asked.id,
            spent: 0,
            left: granted,
            expired: false,
        }
    }

    /// Gives `tokens` back to the key `name` (its storage-safe form) under
    /// `policy` from what this instance spent of its holds and has not
    /// reported yet: a hold's spent tokens become its own again (its
    /// report then debits fewer), and a hold spent whole is reported at once
    /// for what is left spent. What a refund gives back here is exact where
    /// Redis could only clamp it (the bucket counts those tokens as still
    /// there until the report). Returns the tokens given back here, and
    /// the reports to send.
    pub(crate) fn refund(
        &self,
        name: &str,
        policy: &Policy,
        tokens: u64,
    ) -> (u64, Vec<HoldReport>) {
        let now = self.now();
        let hash = self.hash(name.as_bytes());
        let mut guard = self.table.shard(hash);
        let shard = &mut *guard;
        let mut reports = Vec::new();
        let Some(entry) = shard
            .entries
            .find_mut(hash, |e| e.is(name.as_bytes(), policy, &self.starts))
        else {
            return (0, reports);
        };
        self.renew_generation(entry, now, &mut shard.outstanding, &mut reports);
        let mut given = 0;
        let (rests, partial): (Vec<HoldRest>, _) = entry
            .cold
            .as_ref()
            .map(|c| (c.rest.to_vec(), c.partial))
            .unwrap_or_default();
        for (hold, rest) in entry.holds_mut().iter_mut().zip(rests) {
            if partial.is_some_and(|p| p.get() == rest.id) {
                continue;
            }
            let back = (rest.granted - hold.left).min(tokens - given);
            hold.left += back;
            given += back;
        }
        shard.outstanding += given;
        while given < tokens
            && let Some((id, granted)) = entry.cold.as_mut().and_then(|c| c.spent.pop_front())
        {
            let back = granted.min(tokens - given);
            given += back;
            reports.push(HoldReport {
                keys: self.keys(entry),
                policy: entry.policy.clone(),
                id,
                spent: granted - back,
                left: back,
                expired: false,
            });
        }
        (given, reports)
    }

    /// A report answered: whether its hold was still there.
    pub(crate) fn reported(&self, report: &HoldReport, found: Option<bool>) {
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
