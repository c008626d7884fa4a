//! [`Buckets`]: one key's buckets, a quota's level each, the one bucket of a
//! single-quota policy (the common case) held in the key's entry itself.

use std::num::NonZeroU64;

use crate::quota::Quota;
use crate::store::bucket::Level;

/// One key's buckets. A single bucket is kept inline, under the three
/// numbers that name its quota (24 bytes where a [`Quota`] takes 40), so a
/// key's entry fits one cache line and a check reads the shard's table and
/// the key's name and nothing else (no block of its own to fetch, nor to
/// allocate for a new key).
#[derive(Debug)]
pub(super) enum Buckets {
    One(Named, Level),
    Many(Vec<(Quota, Level)>),
}

/// A quota as a bucket names it: tokens per period and capacity, which
/// determine it (its refill rate is the first two reduced). Tokens are never
/// zero, which leaves [`Buckets`] the room to tell its two kinds apart
/// without a word of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Named {
    tokens: NonZeroU64,
    period_us: u64,
    capacity: u64,
}

impl Named {
    fn of(quota: &Quota) -> Self {
        Named {
            tokens: NonZeroU64::new(quota.tokens()).unwrap_or(NonZeroU64::MIN),
            period_us: quota.period_us(),
            capacity: quota.capacity(),
        }
    }

    /// Whether this names `quota`.
    #[inline]
    pub(super) fn is(&self, quota: &Quota) -> bool {
        self.tokens.get() == quota.tokens()
            && self.period_us == quota.period_us()
            && self.capacity == quota.capacity()
    }

    /// The quota named, found in `known` or else built again.
    fn quota(&self, known: &[Quota]) -> Quota {
        known
            .iter()
            .find(|q| self.is(q))
            .copied()
            .unwrap_or_else(|| Quota::from_parts(self.tokens.get(), self.period_us, self.capacity))
    }
}

impl Buckets {
    /// The `levels` of `quotas`, one bucket each.
    pub(super) fn new(quotas: &[Quota], levels: &[Level]) -> Self {
        match (quotas, levels) {
            ([quota], [level]) => Buckets::One(Named::of(quota), *level),
            _ => Buckets::Many(quotas.iter().copied().zip(levels.iter().copied()).collect()),
        }
    }

    /// Every bucket with its quota (a test's view: the quota of a single
    /// bucket is built again).
    #[cfg(test)]
    pub(super) fn to_vec(&self) -> Vec<(Quota, Level)> {
        match self {
            Buckets::One(named, level) => vec![(named.quota(&[]), *level)],
            Buckets::Many(many) => many.clone(),
        }
    }

    /// The level of `quota`'s bucket, if the key has one.
    #[inline]
    pub(super) fn get(&self, quota: &Quota) -> Option<&Level> {
        match self {
            Buckets::One(named, level) => named.is(quota).then_some(level),
            Buckets::Many(many) => many.iter().find(|(q, _)| q == quota).map(|(_, l)| l),
        }
    }

    /// Sets the `levels` of `quotas`: the buckets they have, and new ones
    /// for the others.
    pub(super) fn set(&mut self, quotas: &[Quota], levels: &[Level]) {
        for (q, &level) in quotas.iter().zip(levels) {
            match self {
                Buckets::One(named, stored) if named.is(q) => *stored = level,
                Buckets::One(named, stored) => {
                    let first = (named.quota(quotas), *stored);
                    *self = Buckets::Many(vec![first, (*q, level)]);
                }
                Buckets::Many(many) => match many.iter_mut().find(|(bq, _)| bq == q) {
                    Some(slot) => slot.1 = level,
                    None => many.push((*q, level)),
                },
            }
        }
    }

    /// Forgets the buckets of `quotas`; true when none is left.
    pub(super) fn remove(&mut self, quotas: &[Quota]) -> bool {
        match self {
            Buckets::One(named, _) => quotas.iter().any(|q| named.is(q)),
            Buckets::Many(many) => {
                many.retain(|(q, _)| !quotas.contains(q));
                many.is_empty()
            }
        }
    }

    /// When every bucket is full again, so forgetting the key changes no
    /// decision. `known` are quotas at hand (a single bucket's quota is
    /// built again when it is not among them).
    pub(super) fn full_at(&self, known: &[Quota]) -> u64 {
        match self {
            Buckets::One(named, level) => level.full_at(&named.quota(known)),
            Buckets::Many(many) => many.iter().map(|(q, l)| l.full_at(q)).max().unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_quota_moves_the_buckets_out_of_line() {
        let a = Quota::per_second(1).unwrap();
        let b = Quota::per_hour(1).unwrap();
        let level = |n| Level { level: n, stamp: 0 };
        let mut buckets = Buckets::new(&[a], &[level(1)]);
        assert!(matches!(buckets, Buckets::One(..)));
        buckets.set(&[b, a], &[level(2), level(3)]);
        assert_eq!(buckets.to_vec(), [(a, level(3)), (b, level(2))]);
        assert_eq!(buckets.get(&b), Some(&level(2)));
        assert!(!buckets.remove(&[a]));
        assert_eq!(buckets.to_vec(), [(b, level(2))]);
        assert!(buckets.remove(&[b]));
        let mut one = Buckets::new(&[a], &[level(1)]);
        assert!(!one.remove(&[b]));
        assert!(one.remove(&[a]));
    }

    /// A single bucket's quota, built again from the numbers that name it,
    /// is the quota it was stored under, for quotas of every shape; a
    /// different quota is not named by it.
    #[test]
    fn a_named_quota_is_the_quota() {
        let quotas = [
            Quota::per_second(1).unwrap(),
            Quota::per_second(7).unwrap().burst(3).unwrap(),
            Quota::new(5, std::time::Duration::from_secs(3))
                .unwrap()
                .burst(9)
                .unwrap(),
            Quota::new(3, std::time::Duration::from_micros(1_234_567)).unwrap(),
            Quota::per_hour(1_000_000).unwrap(),
            Quota::new(2, std::time::Duration::from_secs(2)).unwrap(),
        ];
        for q in quotas {
            let named = Named::of(&q);
            assert_eq!(named.quota(&[]), q);
            for other in quotas {
                assert_eq!(named.is(&other), other == q, "{q} against {other}");
            }
        }
        assert_eq!(std::mem::size_of::<Buckets>(), 40, "no word for the kind");
    }
}
