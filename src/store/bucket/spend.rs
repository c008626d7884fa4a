//! A check or a reservation decided against every quota of a policy at
//! once (all or nothing), and what it leaves in each bucket: spent tokens,
//! debt, a lock-out.

use super::level::{Level, signed};
use crate::decision::{Decision, QuotaState, States};
use crate::quota::{MAX_EXACT, MAX_REPORTED_US, Quota, ceil_div};

/// The debt (in level units) a reservation that may wait `max_wait_us` can
/// take on in a bucket of `quota`: `max_wait x num`, so that the wait
/// `ceil(debt / num)` is at most `max_wait`. Capped to stay exact.
pub(crate) fn debt_for(quota: &Quota, max_wait_us: u64) -> u64 {
    max_wait_us.saturating_mul(quota.num()).min(MAX_EXACT)
}

/// The debt (in level units, negative: a shortfall) a check may take on in
/// bucket `l` of `q` at `now`, given the `debt` it was allowed
/// ([`debt_for`]). A bucket stamped after `now` refills nothing until the
/// clock reaches its stamp, so its waits start from the stamp and the time
/// ahead comes off the debt. For a quota without a lock-out, that is a
/// clock that went backwards (a failover), and the time ahead takes off at
/// most the debt: a plain check spends what the bucket holds. For a quota
/// with a lock-out, a stamp ahead is also a lock-out's end, so nothing is
/// admitted before it: only a reservation that may wait that long and more,
/// with the time ahead off its debt (else no level is enough).
#[inline]
fn room(q: &Quota, l: &Level, now: u64, debt: u64) -> i64 {
    let ahead = l.stamp.saturating_sub(now).saturating_mul(q.num());
    match q.lockout_units() {
        0 => signed(debt.saturating_sub(ahead)),
        _ if ahead > debt => i64::MIN / 2,
        _ => signed(debt - ahead),
    }
}

/// Decides `cost` against every quota at once: all or nothing. `levels` must be
/// brought up to date to `now` already; they are spent only when every quota
/// admits. `debts` (one per quota, or empty for a plain check) let a
/// reservation take the level that far below zero.
///
/// Returns the decision and, for an admitted reservation, the wait until every
/// debt is paid (0 for a plain check).
///
/// A bucket stamped after `now` (a clock that went backwards) refills nothing
/// until the clock reaches its stamp, so its waits start from the stamp, and
/// a reservation there may take on only the debt that the rest of its
/// `max_wait` pays: an admitted reservation never waits longer than that.
pub(crate) fn spend(
    quotas: &[Quota],
    levels: &mut [Level],
    cost: u64,
    now: u64,
    debts: &[u64],
) -> (Decision, u64) {
    if let ([q], [l], []) = (quotas, &mut *levels, debts) {
        return (spend_one(q, l, cost, now), 0);
    }
    // A bucket stamped ahead of `now` owes its wait from the stamp, so the
    // time ahead comes off the debt: the wait stays within `max_wait`.
    let debt = |i: usize, q: &Quota, l: &Level| room(q, l, now, debts.get(i).copied().unwrap_or(0));
    let allowed = quotas
        .iter()
        .zip(levels.iter())
        .enumerate()
        .all(|(i, (q, l))| l.level - signed(cost * q.den()) >= -debt(i, q, l));
    let mut wait_us = 0;
    // One quota's state stays inline (no allocation); several are collected.
    if let ([q], [l]) = (quotas, &mut *levels) {
        let debt = debt(0, q, l);
        let decision = spent(q, l, cost, now, allowed, debt, &mut wait_us).decision(q);
        return (decision, wait_us);
    }
    let states: Vec<QuotaState> = quotas
        .iter()
        .zip(levels.iter_mut())
        .enumerate()
        .map(|(i, (q, l))| {
            let debt = debt(i, q, l);
            spent(q, l, cost, now, allowed, debt, &mut wait_us).state(q)
        })
        .collect();
    (Decision::new(allowed, states), wait_us)
}

/// [`spend`] for a plain check of one quota (no debt: an admitted check
/// never waits), the common case, without the slices.
#[inline]
pub(crate) fn spend_one(q: &Quota, l: &mut Level, cost: u64, now: u64) -> Decision {
    spend_one_figures(q, l, cost, now).decision(q)
}

/// What a check of one quota decided, as figures: the [`Decision`] it makes
/// with its quota ([`Spent::decision`]), kept apart from the quota until
/// the caller needs it, so that a fast path moves four words, not a whole
/// decision, until it answers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spent {
    pub(crate) allowed: bool,
    remaining: u64,
    retry_us: u64,
    reset_us: u64,
}

impl Spent {
    /// An admission that leaves `remaining` tokens, full again in
    /// `reset_us` (a lease hold's).
    #[cfg(feature = "redis")]
    #[inline]
    pub(crate) fn admitted(remaining: u64, reset_us: u64) -> Self {
        Spent {
            allowed: true,
            remaining,
            retry_us: 0,
            reset_us,
        }
    }

    /// The decision of `q` (the quota these figures were spent from).
    #[inline]
    pub(crate) fn decision(self, q: &Quota) -> Decision {
        Decision::new(self.allowed, States::One(self.state(q)))
    }

    /// `q`'s state in the decision.
    #[inline]
    pub(crate) fn state(self, q: &Quota) -> QuotaState {
        QuotaState::new(*q, self.remaining, self.retry_us, self.reset_us)
    }
}

/// [`spend_one`], as figures.
#[inline]
pub(crate) fn spend_one_figures(q: &Quota, l: &mut Level, cost: u64, now: u64) -> Spent {
    let debt = match q.lockout_units() {
        0 => 0,
        _ => room(q, l, now, 0),
    };
    let allowed = l.level - signed(cost * q.den()) >= -debt;
    let mut wait_us = 0;
    spent(q, l, cost, now, allowed, debt, &mut wait_us)
}

/// One bucket of a check decided `allowed`: spends `cost` from it if so,
/// and tells its state. An admitted reservation's wait grows to this
/// bucket's debt, paid back from `now` (or from a stamp ahead of it).
/// `debt` is what [`room`] gave.
///
/// A refused check that this bucket refuses locks it out if its quota has a
/// lock-out ([`Quota::lockout`]) and it is not locked out already (its stamp
/// is not ahead of `now`): the stamp moves to the lock-out's end and the
/// level to the refused cost, so nothing refills before the end and the
/// cost is back exactly at it. Only when the lock-out ends no sooner than
/// the cost would have been back anyway: a lock-out never gives tokens
/// early. (So a refusal whose wait is longer than the lock-out did not
/// lock; the deny cache relies on it.)
/// As `lock_out` in `lua/token_bucket.lua`.
#[inline]
fn spent(
    q: &Quota,
    l: &mut Level,
    cost: u64,
    now: u64,
    allowed: bool,
    debt: i64,
    wait_us: &mut u64,
) -> Spent {
    let need = signed(cost * q.den());
    let locks = q.lockout_units() > 0;
    if locks
        && !allowed
        && need > 0
        && l.stamp <= now
        && l.level - need < -debt
        && need - l.level <= signed(q.lockout_units())
    {
        l.level = need.min(signed(q.full()));
        l.stamp = now + q.lockout_us();
    }
    let ahead = l.stamp.saturating_sub(now);
    // A lock-out quota's bucket stamped ahead holds nothing until the stamp.
    let waits = locks && ahead > 0;
    let mut retry_us = 0;
    if allowed {
        l.level -= need;
        if l.level < 0 || waits {
            let due = ahead + ceil_div(l.level.min(0).unsigned_abs(), q.num());
            *wait_us = (*wait_us).max(due.min(MAX_REPORTED_US));
        }
    } else if l.level < need || waits {
        retry_us = (ahead + ceil_div((need - l.level).max(0).unsigned_abs(), q.num()))
            .min(MAX_REPORTED_US);
    }
    // Waits and resets are reported up to `MAX_REPORTED_US`, as the script
    // reports them.
    let reset_us = match l.until_full_us(q) {
        0 if !waits => 0,
        to_full => (ahead + to_full).min(MAX_REPORTED_US),
    };
    let units = match waits {
        true => 0,
        false => l.level.max(0).unsigned_abs(),
    };
    // A quota of a token or more per microsecond counts whole tokens: no
    // division.
    let remaining = if q.den() == 1 { units } else { units / q.den() };
    Spent {
        allowed,
        remaining,
        retry_us,
        reset_us,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_per_hour_refills_exactly_on_the_hour() {
        let q = Quota::per_hour(1).unwrap();
        let mut l = [Level::full(&q, 0)];
        assert!(spend(&[q], &mut l, 1, 0, &[]).0.allowed());
        let hour = 3_600_000_000;
        // Many small steps must add up to exactly one token, no earlier, no later.
        for t in (1..hour).step_by(7_777_777) {
            l[0] = l[0].refilled(&q, t);
        }
        l[0] = l[0].refilled(&q, hour - 1);
        let d = spend(&[q], &mut l, 1, hour - 1, &[]).0;
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_micros(1));
        l[0] = l[0].refilled(&q, hour);
        assert!(spend(&[q], &mut l, 1, hour, &[]).0.allowed());
    }

    #[test]
    fn seven_per_second_refills_on_schedule() {
        let q = Quota::per_second(7).unwrap();
        let mut l = [Level::full(&q, 0)];
        assert!(spend(&[q], &mut l, 7, 0, &[]).0.allowed());
        // Token k is due at ceil(k * 1e6 / 7) microseconds.
        for k in 1..=7u64 {
            let due = (k * 1_000_000).div_ceil(7);
            l[0] = l[0].refilled(&q, due - 1);
            assert!(
                !spend(&[q], &mut l, 1, due - 1, &[]).0.allowed(),
                "token {k} early"
            );
            l[0] = l[0].refilled(&q, due);
            assert!(
                spend(&[q], &mut l, 1, due, &[]).0.allowed(),
                "token {k} late"
            );
        }
    }

    #[test]
    fn denial_spends_nothing_in_any_quota() {
        let a = Quota::per_second(10).unwrap();
        let b = Quota::per_hour(3).unwrap();
        let mut l = [Level::full(&a, 0), Level::full(&b, 0)];
        for _ in 0..3 {
            assert!(spend(&[a, b], &mut l, 1, 0, &[]).0.allowed());
        }
        let before = l;
        let (d, _) = spend(&[a, b], &mut l, 1, 0, &[]);
        assert!(!d.allowed());
        assert_eq!(l, before);
        assert_eq!(d.quota(), Some(&b));
        assert_eq!(d.states()[0].remaining(), 7);
    }

    #[test]
    fn a_clock_behind_the_stamp_waits_from_the_stamp() {
        let q = Quota::per_second(10).unwrap();
        let mut l = [Level::full(&q, 5_000_000)];
        assert!(spend(&[q], &mut l, 10, 5_000_000, &[]).0.allowed());
        // Two seconds earlier nothing refills; a token is 2.1 s away, full 3 s.
        l[0] = l[0].refilled(&q, 3_000_000);
        let (d, _) = spend(&[q], &mut l, 1, 3_000_000, &[]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_millis(2_100));
        assert_eq!(d.reset_after(), Duration::from_secs(3));
    }
}

#[cfg(test)]
mod lockout_tests {
    use super::*;
    use std::time::Duration;

    fn login() -> Quota {
        // 5 attempts per 15 minutes, then 15 minutes locked out.
        Quota::new(5, Duration::from_secs(900))
            .unwrap()
            .lockout(Duration::from_secs(900))
            .unwrap()
    }

    #[test]
    fn a_refusal_locks_the_key_out_for_exactly_the_lockout() {
        let q = login();
        let mut l = [Level::full(&q, 0)];
        for _ in 0..5 {
            assert!(spend(&[q], &mut l, 1, 0, &[]).0.allowed());
        }
        // The sixth attempt, a minute later, is refused and locks the key
        // out until 16 minutes (without the lock-out a token would be back
        // at 3 minutes).
        let t = 60_000_000;
        l[0] = l[0].refilled(&q, t);
        let (d, _) = spend(&[q], &mut l, 1, t, &[]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_secs(900));
        // Refused again 10 minutes on: the end stays where it was.
        let t2 = t + 600_000_000;
        l[0] = l[0].refilled(&q, t2);
        let (d, _) = spend(&[q], &mut l, 1, t2, &[]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_secs(300));
        // A microsecond before the end: still refused; at the end, admitted,
        // with nothing left over (the key does not come back full).
        let end = t + 900_000_000;
        let mut before = l;
        before[0] = before[0].refilled(&q, end - 1);
        let (d, _) = spend(&[q], &mut before, 1, end - 1, &[]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_micros(1));
        l[0] = l[0].refilled(&q, end);
        let (d, _) = spend(&[q], &mut l, 1, end, &[]);
        assert!(d.allowed());
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn a_peek_and_an_admission_never_lock() {
        let q = login();
        let mut l = [Level::full(&q, 0)];
        let before = l;
        // A peek (cost 0) of an empty-or-not bucket changes nothing.
        assert!(spend(&[q], &mut l, 0, 0, &[]).0.allowed());
        assert_eq!(l, before);
        // A reservation that may wait takes the debt instead of locking.
        let (d, wait) = spend(&[q], &mut l, 6, 0, &[debt_for(&q, 180_000_000)]);
        assert!(d.allowed());
        assert_eq!(wait, 180_000_000);
        assert_eq!(l[0].level, -signed(q.den()));
    }

    #[test]
    fn a_reservation_waits_out_a_lockout_and_a_short_one_gives_nothing_early() {
        let q = login();
        let mut l = [Level::full(&q, 0)];
        for _ in 0..5 {
            assert!(spend(&[q], &mut l, 1, 0, &[]).0.allowed());
        }
        assert!(!spend(&[q], &mut l, 1, 0, &[]).0.allowed());
        // Ten minutes in, a reservation that may wait 5 minutes is admitted
        // for the lock-out's end; one that may wait 4 is refused.
        let t = 600_000_000;
        l[0] = l[0].refilled(&q, t);
        let (d, _) = spend(&[q], &mut l, 1, t, &[debt_for(&q, 240_000_000)]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_secs(300));
        let (d, wait) = spend(&[q], &mut l, 1, t, &[debt_for(&q, 300_000_000)]);
        assert!(d.allowed());
        assert_eq!(wait, 300_000_000);
        // A lock-out shorter than the refill: the refusal waits the refill.
        let short = Quota::new(5, Duration::from_secs(900))
            .unwrap()
            .lockout(Duration::from_secs(60))
            .unwrap();
        let mut l = [Level::full(&short, 0)];
        for _ in 0..5 {
            assert!(spend(&[short], &mut l, 1, 0, &[]).0.allowed());
        }
        let before = l;
        let (d, _) = spend(&[short], &mut l, 1, 0, &[]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_secs(180));
        assert_eq!(l, before);
    }

    #[test]
    fn only_the_refusing_quota_locks() {
        let q = login();
        let plain = Quota::per_second(100).unwrap();
        // After 3 of 5, a cost of 3: the plain quota has it, the lock-out
        // quota does not and locks (3 tokens back at the end); the plain one
        // is untouched.
        let mut l = [Level::full(&plain, 0), Level::full(&q, 0)];
        assert!(spend(&[plain, q], &mut l, 3, 0, &[]).0.allowed());
        let before = l[0];
        let (d, _) = spend(&[plain, q], &mut l, 3, 0, &[]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_secs(900));
        assert_eq!(l[0], before);
        let end = 900_000_000;
        assert_eq!(
            l[1],
            Level {
                level: signed(3 * q.den()),
                stamp: end
            }
        );
        let mut at_end = l;
        at_end[0] = at_end[0].refilled(&plain, end);
        at_end[1] = at_end[1].refilled(&q, end);
        assert!(spend(&[plain, q], &mut at_end, 3, end, &[]).0.allowed());
        // A check the lock-out quota could pay, refused by the other quota
        // alone, locks nothing.
        let mut l = [Level::full(&q, 0), Level { level: 0, stamp: 0 }];
        let (d, _) = spend(&[q, plain], &mut l, 1, 0, &[]);
        assert!(!d.allowed());
        assert_eq!(l[0], Level::full(&q, 0));
    }
}

#[cfg(test)]
mod reservation_tests {
    use super::super::adjust;
    use super::*;
    use std::time::Duration;

    /// A charge or refund on a bucket deeper in debt than one capacity (as
    /// reservations leave it) never forgives the debt: the reservations'
    /// tokens stay spent.
    #[test]
    fn an_adjustment_never_forgives_a_reservations_debt() {
        let q = Quota::per_second(1).unwrap();
        let mut l = [Level::full(&q, 0)];
        for _ in 0..11 {
            let (d, _) = spend(&[q], &mut l, 1, 0, &[debt_for(&q, 10_000_000)]);
            assert!(d.allowed());
        }
        let deep = l;
        adjust(&[q], &mut l, 1);
        assert_eq!(l, deep, "a charge never raises the level");
        adjust(&[q], &mut l, -1);
        assert_eq!(
            l[0].level,
            deep[0].level + signed(q.den()),
            "a refund gives one back"
        );
        // The next reservation still waits behind all of them: 10 s.
        let (d, wait) = spend(&[q], &mut l, 1, 0, &[debt_for(&q, 60_000_000)]);
        assert!(d.allowed());
        assert_eq!(wait, 10_000_000);
        // Within the bounds, as before: a charge down to minus one
        // capacity, a refund up to full.
        let mut l = [Level::full(&q, 0)];
        adjust(&[q], &mut l, 5);
        assert_eq!(l[0].level, -signed(q.full()));
        adjust(&[q], &mut l, -5);
        assert_eq!(l[0].level, signed(q.full()));
    }

    #[test]
    fn a_reservation_takes_tokens_ahead_and_says_when_they_are_due() {
        // 10 a second: one token every 100 ms.
        let q = Quota::per_second(10).unwrap();
        let mut l = [Level::full(&q, 0)];
        assert!(spend(&[q], &mut l, 10, 0, &[]).0.allowed());
        // 3 tokens now, waiting up to 250 ms: too long (300 ms), nothing spent.
        let before = l;
        let (d, wait) = spend(&[q], &mut l, 3, 0, &[debt_for(&q, 250_000)]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_millis(300));
        assert_eq!((wait, l), (0, before));
        // Waiting up to 300 ms: admitted, due in 300 ms, the level 3 below zero.
        let (d, wait) = spend(&[q], &mut l, 3, 0, &[debt_for(&q, 300_000)]);
        assert!(d.allowed());
        assert_eq!(wait, 300_000);
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.reset_after(), Duration::from_millis(1_300));
        // The next reservation queues behind it: due 100 ms later.
        let (d, wait) = spend(&[q], &mut l, 1, 0, &[debt_for(&q, 1_000_000)]);
        assert!(d.allowed());
        assert_eq!(wait, 400_000);
        // A plain check waits for the debt to be paid first.
        let (d, _) = spend(&[q], &mut l, 1, 0, &[]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_millis(500));
        l[0] = l[0].refilled(&q, 500_000);
        assert!(spend(&[q], &mut l, 1, 500_000, &[]).0.allowed());
    }

    #[test]
    fn a_reservation_behind_the_stamp_never_waits_past_max_wait() {
        // 1 a second, drained at 10 s; then a clock 0.5 s behind (a failover).
        let q = Quota::per_second(1).unwrap();
        let mut l = [Level::full(&q, 10_000_000)];
        assert!(spend(&[q], &mut l, 1, 10_000_000, &[]).0.allowed());
        let behind = 9_500_000;
        l[0] = l[0].refilled(&q, behind);
        // The token is due 1 s after the stamp: 1.5 s away. Waiting up to 1 s
        // is too little, and spends nothing.
        let before = l;
        let (d, wait) = spend(&[q], &mut l, 1, behind, &[debt_for(&q, 1_000_000)]);
        assert!(!d.allowed(), "admitted with a wait of {wait} us");
        assert_eq!(d.retry_after(), Duration::from_millis(1_500));
        assert_eq!(l, before);
        // Waiting up to 1.5 s is enough, and the wait is exactly that.
        let (d, wait) = spend(&[q], &mut l, 1, behind, &[debt_for(&q, 1_500_000)]);
        assert!(d.allowed());
        assert_eq!(wait, 1_500_000);
    }
}
