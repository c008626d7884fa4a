//! An adjustment after the fact: tokens spent from a policy's buckets (a
//! charge) or given back (a refund), whatever their level.

use super::level::{Level, signed};
use crate::quota::Quota;

/// An adjustment after the fact (the layer's `settle`, [`RateLimiter::refund`]
/// and [`RateLimiter::charge`](crate::RateLimiter::charge)): `delta` tokens
/// spent from every bucket (a charge) or, when negative, given back (a
/// refund), whatever their level. A refund fills a bucket up to full at most,
/// so it never admits more than if the refunded request had never come; a
/// charge takes it into debt down to minus its capacity at most (the most one
/// request may cost), which later checks wait to see refilled. The bounds
/// never move a level against the adjustment: a bucket deeper in debt than
/// that (reservations wait out more) keeps its debt through a charge, and a
/// bucket above full stays where it is through a refund. `levels` must be
/// brought up to `now` already. As `adjust` in `lua/token_bucket.lua`.
///
/// [`RateLimiter::refund`]: crate::RateLimiter::refund
pub(crate) fn adjust(quotas: &[Quota], levels: &mut [Level], delta: i64) {
    for (q, l) in quotas.iter().zip(levels.iter_mut()) {
        let full = i128::from(signed(q.full()));
        let units = i128::from(delta) * i128::from(signed(q.den()));
        let old = i128::from(l.level);
        let moved = old - units;
        let level = if units > 0 {
            moved.max(-full).min(old)
        } else {
            moved.min(full).max(old)
        };
        l.level = i64::try_from(level).unwrap_or(l.level);
    }
}

#[cfg(test)]
mod adjust_tests {
    use super::super::spend;
    use super::*;
    use crate::quota::{MAX_EXACT, gcd};
    use std::time::Duration;

    #[test]
    fn a_refund_gives_back_up_to_full_and_a_charge_takes_down_to_minus_full() {
        let q = Quota::per_second(10).unwrap();
        let mut l = [Level::full(&q, 0)];
        assert!(spend(&[q], &mut l, 3, 0, &[]).0.allowed());
        adjust(&[q], &mut l, -2);
        assert_eq!(l[0].level, signed(9 * q.den()));
        // Never above full: a refund admits no more than if the request had
        // never come.
        adjust(&[q], &mut l, -5);
        assert_eq!(l[0].level, signed(q.full()));
        // A charge may go into debt, by one bucket at most.
        adjust(&[q], &mut l, 15);
        assert_eq!(l[0].level, -signed(5 * q.den()));
        adjust(&[q], &mut l, 1_000);
        assert_eq!(l[0].level, -signed(q.full()));
        // The next check waits for the debt and its own token: 1.1 s.
        let (d, _) = spend(&[q], &mut l, 1, 0, &[]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_millis(1_100));
    }

    #[test]
    fn a_changed_quota_carries_the_share_spent() {
        let at = |level: i64| Level { level, stamp: 7 };
        // Raised from 10 to 20 tokens of one unit each: a spent burst stays
        // spent, half stays half, full stays full; the stamp is kept.
        assert_eq!(at(0).carried(10, 20), at(0));
        assert_eq!(at(5).carried(10, 20), at(10));
        assert_eq!(at(10).carried(10, 20), at(20));
        // Lowered: rounded down, never more than the share.
        assert_eq!(at(5).carried(20, 10), at(2));
        assert_eq!(at(3).carried(9, 6), at(2));
        // Debt carries as a share too, rounded towards more debt.
        assert_eq!(at(-3).carried(20, 10), at(-2));
        // Above full (a kept level is capped first) and the same figures.
        assert_eq!(at(30).carried(10, 20), at(20));
        assert_eq!(at(4).carried(10, 10), at(4));
        // Past 2^52: the approximation, two units under the exact share.
        let (from, to) = ((1 << 52) - 1, (1 << 52) - 3);
        let exact = i64::try_from(
            (i128::from((1i64 << 52) - 5) * i128::from(to)).div_euclid(i128::from(from)),
        )
        .unwrap();
        let carried = at((1 << 52) - 5).carried(from, to).level;
        assert!(
            carried <= exact && carried >= exact - 3,
            "{carried} {exact}"
        );
    }

    proptest::proptest! {
        /// Carrying never gives more than the exact share of the new full
        /// bucket, and loses at most three units of it (one exactly).
        #[test]
        fn carrying_keeps_the_share_within_units(
            from in 1u64..=MAX_EXACT,
            to in 1u64..=MAX_EXACT,
            share in 0.0f64..=1.0,
            debt in proptest::bool::weighted(0.2),
        ) {
            #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
            let mut level = (from as f64 * share) as i64;
            if debt {
                level = -level;
            }
            let carried = Level { level, stamp: 0 }.carried(from, to).level;
            let exact = (i128::from(level) * i128::from(to)).div_euclid(i128::from(from));
            let exact = exact.max(-i128::from(MAX_EXACT));
            proptest::prop_assert!(i128::from(carried) <= exact, "{carried} > {exact}");
            let slack = if (i128::from(level) * i128::from(to / gcd(from, to))).abs()
                <= i128::from(MAX_EXACT) { 0 } else { 3 };
            proptest::prop_assert!(i128::from(carried) >= exact - slack, "{carried} << {exact}");
        }
    }
}
