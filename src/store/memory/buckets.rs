//! [`Buckets`]: one key's buckets, a quota's level each, the one bucket of a
//! single-quota policy (the common case) held in the key's entry itself.

use crate::quota::Quota;
use crate::store::bucket::Level;

/// One key's buckets. A single bucket is kept inline, so a check reads the
/// shard's table and the key's name and nothing else (no block of its own to
/// fetch, nor to allocate for a new key).
#[derive(Debug)]
pub(super) enum Buckets {
    One([(Quota, Level); 1]),
    Many(Vec<(Quota, Level)>),
}

impl Buckets {
    /// The `levels` of `quotas`, one bucket each.
    pub(super) fn new(quotas: &[Quota], levels: &[Level]) -> Self {
        match (quotas, levels) {
            ([quota], [level]) => Buckets::One([(*quota, *level)]),
            _ => Buckets::Many(quotas.iter().copied().zip(levels.iter().copied()).collect()),
        }
    }

    pub(super) fn as_slice(&self) -> &[(Quota, Level)] {
        match self {
            Buckets::One(one) => one,
            Buckets::Many(many) => many,
        }
    }

    /// The level of `quota`'s bucket, if the key has one.
    pub(super) fn get(&self, quota: &Quota) -> Option<&Level> {
        self.as_slice()
            .iter()
            .find(|(q, _)| q == quota)
            .map(|(_, level)| level)
    }

    /// Sets the `levels` of `quotas`: the buckets they have, and new ones
    /// for the others.
    pub(super) fn set(&mut self, quotas: &[Quota], levels: &[Level]) {
        for (q, &level) in quotas.iter().zip(levels) {
            let slots = match self {
                Buckets::One(one) => &mut one[..],
                Buckets::Many(many) => &mut many[..],
            };
            match slots.iter_mut().find(|(bq, _)| bq == q) {
                Some(slot) => slot.1 = level,
                None => self.push((*q, level)),
            }
        }
    }

    fn push(&mut self, bucket: (Quota, Level)) {
        match self {
            Buckets::One([first]) => {
                let first = *first;
                *self = Buckets::Many(vec![first, bucket]);
            }
            Buckets::Many(many) => many.push(bucket),
        }
    }

    /// Forgets the buckets of `quotas`; true when none is left.
    pub(super) fn remove(&mut self, quotas: &[Quota]) -> bool {
        match self {
            Buckets::One([(q, _)]) => quotas.contains(q),
            Buckets::Many(many) => {
                many.retain(|(q, _)| !quotas.contains(q));
                many.is_empty()
            }
        }
    }

    /// When every bucket is full again, so forgetting the key changes no
    /// decision.
    pub(super) fn full_at(&self) -> u64 {
        self.as_slice()
            .iter()
            .map(|(q, l)| l.full_at(q))
            .max()
            .unwrap_or(0)
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
        assert!(matches!(buckets, Buckets::One(_)));
        buckets.set(&[b, a], &[level(2), level(3)]);
        assert_eq!(buckets.as_slice(), [(a, level(3)), (b, level(2))]);
        assert_eq!(buckets.get(&b), Some(&level(2)));
        assert!(!buckets.remove(&[a]));
        assert_eq!(buckets.as_slice(), [(b, level(2))]);
        assert!(buckets.remove(&[b]));
        let mut one = Buckets::new(&[a], &[level(1)]);
        assert!(!one.remove(&[b]));
        assert!(one.remove(&[a]));
    }
}
