//! How big the next lease of a key is, and when to ask for it: the decayed
//! demand, the young key's scaling, the roomy size (see the module docs).

use std::time::Duration;

use super::entry::Entry;
use super::errand::{Asked, LeaseRequest};
use super::{DEMAND_TO_LEASE, MAX_HOLDS, MIN_LEASE, ROOMY_SHARE};
use crate::store::redis::encode::ROOMY;

/// What sizing a lease needs to know of the map: its lease period, and
/// where an entry's serial comes from when it first asks.
pub(super) struct Sizing<'a> {
    pub(super) period: Duration,
    pub(super) period_us: u64,
    pub(super) serial: &'a dyn Fn() -> u64,
}

impl Sizing<'_> {
    /// The lease `entry` asks for after a check of `cost` at `now`, if one
    /// is due: when what is held runs low, the newest hold is in its last
    /// quarter, or a confirmation of the epoch is due (`verify`). `prior` is
    /// the key's demand before this check, decayed to now. The caller sets
    /// the epoch's generation it is asked in, and the storage keys.
    pub(super) fn next_lease(
        &self,
        entry: &mut Entry,
        now: u64,
        prior: f64,
        cost: u64,
        verify: bool,
    ) -> Option<LeaseRequest> {
        // LeaseRequest for the next lease when what is held runs low (see `low`),
        // or the newest hold is in its last quarter.
        // A key that has not shown demand gets no lease: one whose decayed
        // demand before this check is under `DEMAND_TO_LEASE` times this
        // check's cost (fewer than three checks like it within about a
        // period, or a sparse trickle). A hold it would not spend before
        // its expiry is debited whole, so a client seen once an hour would
        // lose a lease's worth of tokens for every request; and a key
        // checked once or a few times would cost a lease request, a report
        // and its holds' room in Redis for the lease's life, where without
        // leases its bucket is gone once full again.
        if entry.asking
            || entry.holds().len() >= MAX_HOLDS
            || prior < cost.max(1) as f64 * DEMAND_TO_LEASE
        {
            return None;
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
        let aging = aging || verify;
        #[expect(
            clippy::cast_precision_loss,
            reason = "a bound with room to spare: rounding cannot cross it"
        )]
        if !aging && held as f64 >= 8.0 * entry.demand + 2.0 {
            return None;
        }
        #[expect(
            clippy::cast_precision_loss,
            reason = "microseconds below 2^53 (285 years) are exact"
        )]
        let age = now.saturating_sub(entry.born) as f64 / self.period_us as f64;
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
        // Nor while quiet after a grant of nothing (read last: it is in the
        // entry's cold part, which only a lease request needs).
        let quiet = entry.cold.as_ref().is_some_and(|c| now < c.quiet_until);
        if want.max(roomy_want) >= MIN_LEASE && (low || aging) && !quiet {
            entry.asking = true;
            // Besides a hold spent whole, the live one that spent most
            // reports that much, keeping the rest: what was spent leaves the
            // holds' share of the bucket (at most half of it, see
            // "Epochs" in the script) to the instances sharing the key.
            // (An entry without a cold part has no holds.)
            let partial = entry.cold.as_ref().and_then(|cold| {
                entry
                    .holds()
                    .iter()
                    .zip(&cold.rest)
                    .map(|(h, r)| (r.id, r.granted - h.left))
                    .filter(|&(_, spent)| spent > 0)
                    .max_by_key(|&(_, spent)| spent)
            });
            let cold = entry.cold_mut(self.serial);
            let carried = cold.spent.pop_front().map(|(id, _)| id);
            cold.partial = partial.and_then(|(id, _)| std::num::NonZeroU64::new(id));
            let serial = cold.serial;
            return Some(LeaseRequest {
                asked: Asked {
                    // The caller writes it out.
                    name: Box::default(),
                    serial,
                    keys: Vec::new(),
                    policy: entry.policy.clone(),
                    id: 0,
                    generation: 0,
                    partial,
                },
                want: if want >= MIN_LEASE { want } else { 0 },
                life: 2 * self.period,
                roomy_want: if roomy_want >= MIN_LEASE {
                    roomy_want
                } else {
                    0
                },
                carried,
            });
        }
        None
    }
}

/// `exp(-x)` for `x >= 0`: for the small `x` of a key checked often (the
/// time since its last check, in lease periods), by its Taylor series to
/// `x^6` (off by under `x^7 / 5040`, 6e-15 below 1/32), without a call
/// to the math library on every check. Its coefficients are constants, so
/// it multiplies and adds: a division each (they were `x / 3` and so on)
/// made a chain of five divisions, a tenth of a held check's time.
#[inline]
pub(super) fn decay(x: f64) -> f64 {
    /// `(-1)^k / k!`, `k` from 6 down to 1 (the constant term is 1).
    const C: [f64; 6] = [
        1.0 / 720.0,
        -1.0 / 120.0,
        1.0 / 24.0,
        -1.0 / 6.0,
        1.0 / 2.0,
        -1.0,
    ];
    if x < 1.0 / 32.0 {
        C.iter().fold(0.0, |p, c| (p + c) * x) + 1.0
    } else {
        (-x).exp()
    }
}
