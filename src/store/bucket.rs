//! The token bucket arithmetic, in Rust. `lua/token_bucket.lua` is the same
//! algorithm for Redis; keep the two in step (the property tests compare both with
//! an independent model).
//!
//! A bucket is `(level, stamp)`: `level` in units of `1 / quota.den()` token,
//! `stamp` the microsecond it was last brought up to date. Refilling adds
//! `elapsed x quota.num()` units, an exact integer, and caps at `quota.full()`.

use crate::decision::{Decision, QuotaState};
use crate::quota::{Quota, ceil_div};

/// One bucket's stored state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Level {
    pub(crate) level: u64,
    pub(crate) stamp: u64,
}

impl Level {
    /// A bucket seen for the first time (or forgotten after refilling) is full.
    pub(crate) fn full(quota: &Quota, now: u64) -> Self {
        Level {
            level: quota.full(),
            stamp: now,
        }
    }

    /// This bucket brought up to `now`. A clock that went backwards (a failover to
    /// a server whose clock is behind) refills nothing and keeps the later stamp.
    pub(crate) fn refilled(self, quota: &Quota, now: u64) -> Self {
        let full = quota.full();
        let level = self.level.min(full);
        if now <= self.stamp {
            return Level {
                level,
                stamp: self.stamp,
            };
        }
        let elapsed = now - self.stamp;
        // Compare before multiplying so the product stays below 2^53 (as in Lua).
        let level = if elapsed >= ceil_div(full - level, quota.num()) {
            full
        } else {
            level + elapsed * quota.num()
        };
        Level { level, stamp: now }
    }

    /// Time until this bucket is full, in microseconds.
    pub(crate) fn until_full_us(&self, quota: &Quota) -> u64 {
        ceil_div(quota.full().saturating_sub(self.level), quota.num())
    }

    /// The first microsecond at which the bucket is full (0 if it is already),
    /// so forgetting it changes nothing.
    pub(crate) fn full_at(&self, quota: &Quota) -> u64 {
        match self.until_full_us(quota) {
            0 => 0,
            wait => self.stamp + wait,
        }
    }
}

/// Decides `cost` against every quota at once: all or nothing. `levels` must be
/// brought up to date to `now` already; they are spent only when every quota
/// admits.
///
/// A bucket stamped after `now` (a clock that went backwards) refills nothing
/// until the clock reaches its stamp, so its waits start from the stamp.
pub(crate) fn spend(quotas: &[Quota], levels: &mut [Level], cost: u64, now: u64) -> Decision {
    let allowed = quotas
        .iter()
        .zip(levels.iter())
        .all(|(q, l)| l.level >= cost * q.den());
    let mut states = Vec::with_capacity(quotas.len());
    for (q, l) in quotas.iter().zip(levels.iter_mut()) {
        let need = cost * q.den();
        let ahead = l.stamp.saturating_sub(now);
        let retry_us = if allowed || l.level >= need {
            0
        } else {
            ahead + ceil_div(need - l.level, q.num())
        };
        if allowed {
            l.level -= need;
        }
        let reset_us = match l.until_full_us(q) {
            0 => 0,
            to_full => ahead + to_full,
        };
        states.push(QuotaState::new(*q, l.level / q.den(), retry_us, reset_us));
    }
    Decision::new(allowed, states)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_per_hour_refills_exactly_on_the_hour() {
        let q = Quota::per_hour(1).unwrap();
        let mut l = [Level::full(&q, 0)];
        assert!(spend(&[q], &mut l, 1, 0).allowed());
        let hour = 3_600_000_000;
        // Many small steps must add up to exactly one token, no earlier, no later.
        for t in (1..hour).step_by(7_777_777) {
            l[0] = l[0].refilled(&q, t);
        }
        l[0] = l[0].refilled(&q, hour - 1);
        let d = spend(&[q], &mut l, 1, hour - 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_micros(1));
        l[0] = l[0].refilled(&q, hour);
        assert!(spend(&[q], &mut l, 1, hour).allowed());
    }

    #[test]
    fn seven_per_second_refills_on_schedule() {
        let q = Quota::per_second(7).unwrap();
        let mut l = [Level::full(&q, 0)];
        assert!(spend(&[q], &mut l, 7, 0).allowed());
        // Token k is due at ceil(k * 1e6 / 7) microseconds.
        for k in 1..=7u64 {
            let due = (k * 1_000_000).div_ceil(7);
            l[0] = l[0].refilled(&q, due - 1);
            assert!(
                !spend(&[q], &mut l, 1, due - 1).allowed(),
                "token {k} early"
            );
            l[0] = l[0].refilled(&q, due);
            assert!(spend(&[q], &mut l, 1, due).allowed(), "token {k} late");
        }
    }

    #[test]
    fn denial_spends_nothing_in_any_quota() {
        let a = Quota::per_second(10).unwrap();
        let b = Quota::per_hour(3).unwrap();
        let mut l = [Level::full(&a, 0), Level::full(&b, 0)];
        for _ in 0..3 {
            assert!(spend(&[a, b], &mut l, 1, 0).allowed());
        }
        let before = l;
        let d = spend(&[a, b], &mut l, 1, 0);
        assert!(!d.allowed());
        assert_eq!(l, before);
        assert_eq!(d.quota(), Some(&b));
        assert_eq!(d.states()[0].remaining(), 7);
    }

    #[test]
    fn a_clock_behind_the_stamp_waits_from_the_stamp() {
        let q = Quota::per_second(10).unwrap();
        let mut l = [Level::full(&q, 5_000_000)];
        assert!(spend(&[q], &mut l, 10, 5_000_000).allowed());
        // Two seconds earlier nothing refills; a token is 2.1 s away, full 3 s.
        l[0] = l[0].refilled(&q, 3_000_000);
        let d = spend(&[q], &mut l, 1, 3_000_000);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_millis(2_100));
        assert_eq!(d.reset_after(), Duration::from_secs(3));
    }
}
