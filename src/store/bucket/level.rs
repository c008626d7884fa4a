//! One bucket's state ([`Level`]): refilled up to a moment, and carried
//! into a quota changed to other figures.

use crate::quota::{MAX_EXACT, Quota, ceil_div, gcd};

/// One bucket's stored state. The level is signed: a reservation may leave it
/// below zero (tokens spent ahead of their refill), by at most the debt the
/// reservation was allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Level {
    pub(crate) level: i64,
    pub(crate) stamp: u64,
}

/// `v` as a signed number: quotas keep every level, cost and debt within
/// 2^52 of zero (saturating, should one ever not be).
#[inline]
pub(crate) fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Level {
    /// A placeholder, overwritten before it is read.
    pub(crate) const EMPTY: Level = Level { level: 0, stamp: 0 };

    /// A bucket seen for the first time (or forgotten after refilling) is full.
    pub(crate) fn full(quota: &Quota, now: u64) -> Self {
        Level {
            level: signed(quota.full()),
            stamp: now,
        }
    }

    /// This bucket brought up to `now`. A clock that went backwards (a failover to
    /// a server whose clock is behind) refills nothing and keeps the later stamp.
    #[inline]
    pub(crate) fn refilled(self, quota: &Quota, now: u64) -> Self {
        self.refilled_by(quota.full(), quota.num(), now)
    }

    /// [`refilled`](Self::refilled) for a quota whose full bucket is `full`
    /// units, refilling `num` units a microsecond.
    #[inline]
    pub(crate) fn refilled_by(self, full: u64, num: u64, now: u64) -> Self {
        let full = signed(full);
        let level = self.level.min(full);
        if now <= self.stamp {
            return Level {
                level,
                stamp: self.stamp,
            };
        }
        let elapsed = now - self.stamp;
        let missing = (full - level).unsigned_abs();
        // Full when `elapsed >= ceil(missing / num)`, that is when
        // `elapsed x num >= missing`: compared in 128 bits (no division, and
        // no overflow), so the product added below stays below `missing`,
        // under 2^53 (Lua compares with the division instead, to stay exact
        // in doubles).
        let level = if u128::from(elapsed) * u128::from(num) >= u128::from(missing) {
            full
        } else {
            level + signed(elapsed * num)
        };
        Level { level, stamp: now }
    }

    /// This bucket, kept under a quota whose full bucket is `from` units and
    /// refilled under it, carried into one whose full bucket is `to` units
    /// (a quota changed to other figures over the same period): the same
    /// share of the capacity spent, so a client that had spent its burst has
    /// none of the new one, rounded down to a unit (never more than the
    /// share). The stamp is kept. As `carry` in `lua/token_bucket.lua`,
    /// number for number: exact where `level x to / gcd` is within 2^52 of
    /// zero, else the same double arithmetic Lua does, less two units (more
    /// than its rounding can add).
    pub(crate) fn carried(self, from: u64, to: u64) -> Self {
        if from == to || from == 0 {
            return self;
        }
        let level = self.level.min(signed(from));
        let g = gcd(from, to);
        let (n, d) = (to / g, from / g);
        let product = i128::from(level) * i128::from(n);
        let limit = i128::from(MAX_EXACT);
        let carried = if (-limit..=limit).contains(&product) {
            product.div_euclid(i128::from(d))
        } else {
            #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
            let approx = ((level as f64) * (n as f64) / (d as f64)).floor() - 2.0;
            approx as i128
        };
        let level = carried.clamp(-limit, i128::from(to));
        Level {
            level: i64::try_from(level).unwrap_or(0),
            stamp: self.stamp,
        }
    }

    /// Time until this bucket is full, in microseconds.
    #[inline]
    pub(crate) fn until_full_us(&self, quota: &Quota) -> u64 {
        let missing = (signed(quota.full()) - self.level).max(0).unsigned_abs();
        ceil_div(missing, quota.num())
    }

    /// The first microsecond at which the bucket is full, so forgetting it
    /// changes nothing: counted from its stamp, so a full bucket stamped
    /// ahead (locked out until then, [`Quota::lockout`]) is not free to
    /// forget before its stamp, whatever lock-out `quota` has.
    pub(crate) fn full_at(&self, quota: &Quota) -> u64 {
        self.stamp + self.until_full_us(quota)
    }
}
