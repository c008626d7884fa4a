//! [`Entry`]: one key of a shard's table, its name and buckets in one cache
//! line; [`Known`]: the quotas and key starts a shard's entries refer to by
//! number.
//!
//! A key checked under one quota (the common case) is held in its slot of
//! the table whole: its bucket, the quota's number, and its name after a
//! start the store knows (a layer's `name:kind:`, given when the layer is
//! built) when the rest is at most [`INLINE`] bytes. A check of such a key
//! reads the table and nothing else: no name to fetch from elsewhere (one
//! cache line less per check, the one a busy server's other work evicts
//! first), no block to allocate for a new key. Other keys keep their name
//! on the heap, and keys of several quotas (or of a quota the shard has no
//! number left for) their buckets too.

use std::sync::Arc;

use crate::quota::Quota;
use crate::store::bucket::Level;
use crate::store::table::{Seed, same_bytes, same_pieces as same};

/// The most bytes of a name, after its known start, an entry holds itself.
pub(super) const INLINE: usize = 36;

/// The most quotas, and key starts, a shard numbers: a number is one byte,
/// and [`WHOLE`] is none of them.
pub(super) const MAX_KNOWN: usize = 255;

/// No start: the name is held whole.
const WHOLE: u8 = u8::MAX;

/// The quotas and key starts a shard's entries refer to by number. Both
/// only grow, up to [`MAX_KNOWN`] each (a quota numbered for one key stays
/// numbered; past the bound keys keep their quotas themselves), so a number
/// means the same for as long as the shard lives. Starts are numbered the
/// same in every shard of a store (see `MemoryStore::key_start`).
/// `repr(C)`: the quotas, which every check reads, first.
#[derive(Debug, Default)]
#[repr(C)]
pub(super) struct Known {
    quotas: Vec<Quota>,
    starts: Vec<Arc<str>>,
}

impl Known {
    fn quota(&self, number: u8) -> Option<&Quota> {
        self.quotas.get(usize::from(number))
    }

    fn start(&self, number: u8) -> &str {
        self.starts.get(usize::from(number)).map_or("", |s| s)
    }

    /// `quota`'s number, given now if it has none and there is room.
    fn number(&mut self, quota: &Quota) -> Option<u8> {
        let at = match self.quotas.iter().position(|q| q.same_bucket(quota)) {
            Some(at) => at,
            None if self.quotas.len() < MAX_KNOWN => {
                self.quotas.push(*quota);
                self.quotas.len() - 1
            }
            None => return None,
        };
        u8::try_from(at).ok()
    }

    /// Numbers one more start (the next number: the caller keeps every
    /// shard's starts the same).
    pub(super) fn add_start(&mut self, start: Arc<str>) {
        self.starts.push(start);
    }
}

/// One key: its buckets, its name and the time under which it is filed in
/// its shard's order (never later than the microsecond at which all of its
/// buckets are full again, see `Shard`). One cache line: the slots of a
/// shard's table are aligned to it, so a check reads and writes one line of
/// the table, not two shared with other keys.
#[derive(Debug)]
#[repr(align(64))]
pub(super) struct Entry {
    /// The single bucket's level (a key of several buckets keeps them in
    /// [`Body::Many`]).
    level: Level,
    pub(super) filed_at: u64,
    body: Body,
}

const _: () = assert!(
    std::mem::size_of::<Entry>() == 64,
    "an entry is one cache line"
);

#[derive(Debug)]
enum Body {
    /// One bucket, under the shard's quota `quota`; the name is the start
    /// numbered `start` (nothing for [`WHOLE`]) and the first `len` bytes
    /// of `rest`.
    Short {
        quota: u8,
        start: u8,
        len: u8,
        rest: [u8; INLINE],
    },
    /// One bucket, under the shard's quota `quota`; the name, too long to
    /// hold here.
    Long { quota: u8, name: Box<str> },
    /// Any buckets, each with its quota.
    Many(Box<Many>),
}

#[derive(Debug)]
struct Many {
    name: Box<str>,
    buckets: Vec<(Quota, Level)>,
}

/// Whether a bucket kept under `kept` is the bucket of `quota`: one of its
/// period in a policy that carries buckets over (`Policy::carries`), one of
/// its figures otherwise.
fn holds_for(kept: &Quota, quota: &Quota, carries: bool) -> bool {
    match carries {
        true => kept.same_period(quota),
        false => kept.same_bucket(quota),
    }
}

impl Entry {
    /// `key` with the `levels` of `quotas`, filed at `filed_at`.
    pub(super) fn new(
        known: &mut Known,
        key: &str,
        quotas: &[Quota],
        levels: &[Level],
        filed_at: u64,
    ) -> Self {
        let single = match (quotas, levels) {
            ([quota], [level]) => known.number(quota).map(|number| (number, *level)),
            _ => None,
        };
        let Some((quota, level)) = single else {
            let buckets = quotas.iter().copied().zip(levels.iter().copied());
            return Entry {
                level: Level::EMPTY,
                filed_at,
                body: Body::Many(Box::new(Many {
                    name: Box::from(key),
                    buckets: buckets.collect(),
                })),
            };
        };
        let body = match short(known, key) {
            Some((start, len, rest)) => Body::Short {
                quota,
                start,
                len,
                rest,
            },
            None => Body::Long {
                quota,
                name: Box::from(key),
            },
        };
        Entry {
            level,
            filed_at,
            body,
        }
    }

    /// The name, in two pieces (a known start and the rest).
    fn pieces<'a>(&'a self, known: &'a Known) -> (&'a [u8], &'a [u8]) {
        match &self.body {
            Body::Short {
                start, len, rest, ..
            } => (
                known.start(*start).as_bytes(),
                rest.get(..usize::from(*len)).unwrap_or_default(),
            ),
            Body::Long { name, .. } => (name.as_bytes(), &[]),
            Body::Many(many) => (many.name.as_bytes(), &[]),
        }
    }

    /// The name, written out.
    pub(super) fn name(&self, known: &Known) -> String {
        let (a, b) = self.pieces(known);
        String::from_utf8_lossy(&[a, b].concat()).into_owned()
    }

    /// Whether this is the key `key`.
    #[inline]
    pub(super) fn is(&self, known: &Known, key: &str) -> bool {
        same(self.pieces(known), (key.as_bytes(), &[]))
    }

    /// Whether this is the key `start` + `value`, `start` numbered `number`
    /// when it has a number.
    #[inline]
    pub(super) fn is_held(
        &self,
        known: &Known,
        number: Option<u8>,
        start: &str,
        value: &str,
    ) -> bool {
        match &self.body {
            Body::Short {
                start: held,
                len,
                rest,
                ..
            } if Some(*held) == number => rest
                .get(..usize::from(*len))
                .is_some_and(|rest| same_bytes(rest, value.as_bytes())),
            _ => same(self.pieces(known), (start.as_bytes(), value.as_bytes())),
        }
    }

    /// The name's hash, with the store's seed (as the table hashes it
    /// written out).
    pub(super) fn hash(&self, seed: &Seed, known: &Known) -> u64 {
        let (a, b) = self.pieces(known);
        seed.hash_pair(a, b)
    }

    /// The number of the single bucket's quota, for a key of one bucket.
    fn single(&self) -> Option<u8> {
        match &self.body {
            Body::Short { quota, .. } | Body::Long { quota, .. } => Some(*quota),
            Body::Many(_) => None,
        }
    }

    /// The bucket of `quota`'s period, if the key has one, with the quota it
    /// was kept under.
    fn get<'a>(
        &'a self,
        known: &'a Known,
        quota: &Quota,
        carries: bool,
    ) -> Option<(&'a Quota, &'a Level)> {
        match (&self.body, self.single()) {
            (Body::Many(many), _) => many
                .buckets
                .iter()
                .find(|(q, _)| holds_for(q, quota, carries))
                .map(|(q, l)| (q, l)),
            (_, Some(number)) => known
                .quota(number)
                .filter(|q| holds_for(q, quota, carries))
                .map(|q| (q, &self.level)),
            (_, None) => None,
        }
    }

    /// The level of this key's bucket, when it has one bucket alone and
    /// that is `quota`'s.
    #[inline]
    pub(super) fn held_level(&mut self, known: &Known, quota: &Quota) -> Option<&mut Level> {
        let number = self.single()?;
        known
            .quota(number)
            .is_some_and(|q| q.same_bucket(quota))
            .then_some(&mut self.level)
    }

    /// The levels of `quotas` at `now_us`: this key's buckets brought up to
    /// date, full for a quota it has no bucket of. A bucket kept under other
    /// figures of its quota's period (a changed quota) is refilled under
    /// them, then carried into the quota's; true when one was carried into
    /// other units (another full bucket or refill a microsecond: `5/min`
    /// and `60/min` count their buckets alike, so one kept under either is
    /// the other's as it is, and the script, which keeps a bucket's units
    /// and not its quota, finds nothing to carry).
    pub(super) fn levels(
        &self,
        known: &Known,
        quotas: &[Quota],
        carries: bool,
        now_us: u64,
        levels: &mut [Level],
    ) -> bool {
        let mut carried = false;
        for (level, q) in levels.iter_mut().zip(quotas) {
            *level = match self.get(known, q, carries) {
                Some((kept, stored)) if kept.same_bucket(q) => stored.refilled(q, now_us),
                Some((kept, stored)) => {
                    carried |= kept.full() != q.full() || kept.num() != q.num();
                    stored.refilled(kept, now_us).carried(kept.full(), q.full())
                }
                None => Level::full(q, now_us),
            };
        }
        carried
    }

    /// Sets the `levels` of `quotas`: the buckets of their periods the key
    /// has, now kept under them, and new ones for the others (which moves a
    /// single bucket out of line).
    pub(super) fn set(
        &mut self,
        known: &mut Known,
        quotas: &[Quota],
        carries: bool,
        levels: &[Level],
    ) {
        for (q, &level) in quotas.iter().zip(levels) {
            if let Body::Many(many) = &mut self.body {
                match many
                    .buckets
                    .iter_mut()
                    .find(|(bq, _)| holds_for(bq, q, carries))
                {
                    Some(slot) => *slot = (*q, level),
                    None => many.buckets.push((*q, level)),
                }
                continue;
            }
            let first = self.single().and_then(|n| known.quota(n)).copied();
            if first.is_some_and(|f| f.same_bucket(q)) {
                self.level = level;
                continue;
            }
            // A quota changed to other figures of the period: the bucket is
            // kept under the new ones from now on.
            if first.is_some_and(|f| holds_for(&f, q, carries))
                && let Some(number) = known.number(q)
                && let Body::Short { quota, .. } | Body::Long { quota, .. } = &mut self.body
            {
                *quota = number;
                self.level = level;
                continue;
            }
            let mut buckets = Vec::with_capacity(2);
            buckets.extend(
                first
                    .filter(|f| !holds_for(f, q, carries))
                    .map(|f| (f, self.level)),
            );
            buckets.push((*q, level));
            self.body = Body::Many(Box::new(Many {
                name: self.name(known).into_boxed_str(),
                buckets,
            }));
            self.level = Level::EMPTY;
        }
    }

    /// Forgets the buckets of `quotas`; true when none is left.
    pub(super) fn remove(&mut self, known: &Known, quotas: &[Quota], carries: bool) -> bool {
        match &mut self.body {
            Body::Many(many) => {
                many.buckets
                    .retain(|(q, _)| !quotas.iter().any(|r| holds_for(q, r, carries)));
                many.buckets.is_empty()
            }
            _ => {
                let quota = self.single().and_then(|n| known.quota(n));
                quotas
                    .iter()
                    .any(|q| quota.is_some_and(|k| holds_for(k, q, carries)))
            }
        }
    }

    /// The quota `quota`'s bucket was kept under, if the key has one.
    pub(super) fn kept(&self, known: &Known, quota: &Quota, carries: bool) -> Option<Quota> {
        self.get(known, quota, carries).map(|(q, _)| *q)
    }

    /// When every bucket is full again, so forgetting the key changes no
    /// decision.
    pub(super) fn full_at(&self, known: &Known) -> u64 {
        match &self.body {
            Body::Many(many) => many
                .buckets
                .iter()
                .map(|(q, l)| l.full_at(q))
                .max()
                .unwrap_or(0),
            _ => self
                .single()
                .and_then(|n| known.quota(n))
                .map_or(0, |q| self.level.full_at(q)),
        }
    }

    /// Every bucket with its quota (a test's view).
    #[cfg(test)]
    pub(super) fn to_vec(&self, known: &Known) -> Vec<(Quota, Level)> {
        match &self.body {
            Body::Many(many) => many.buckets.clone(),
            _ => self
                .single()
                .and_then(|n| known.quota(n))
                .map(|q| vec![(*q, self.level)])
                .unwrap_or_default(),
        }
    }

    /// Whether the name is held in the slot (a test's view).
    #[cfg(test)]
    pub(super) fn is_short(&self) -> bool {
        matches!(self.body, Body::Short { .. })
    }
}

/// `key` as a known start's number and the rest, when the rest fits
/// [`INLINE`] (after the longest start `key` begins with, or whole).
fn short(known: &Known, key: &str) -> Option<(u8, u8, [u8; INLINE])> {
    let started = known
        .starts
        .iter()
        .enumerate()
        .filter_map(|(at, s)| Some((u8::try_from(at).ok()?, key.strip_prefix(&**s)?)))
        .min_by_key(|(_, rest)| rest.len());
    let (start, rest) = started.unwrap_or((WHOLE, key));
    let bytes = rest.as_bytes();
    let mut held = [0; INLINE];
    held.get_mut(..bytes.len())?.copy_from_slice(bytes);
    Some((start, u8::try_from(bytes.len()).ok()?, held))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(n: i64) -> Level {
        Level { level: n, stamp: 0 }
    }

    #[test]
    fn a_changed_quota_of_the_period_keeps_the_bucket_in_line_and_carries_it() {
        let a = Quota::per_second(10).unwrap();
        let raised = Quota::per_second(20).unwrap().burst(40).unwrap();
        let mut known = Known::default();
        let mut entry = Entry::new(&mut known, "k", &[a], &[level(0)], 0);
        // 10/s: den 100 000, full 1 000 000; 20/s burst 40: den 50 000, full 2 000 000.
        let mut levels = [Level::EMPTY];
        assert!(
            entry.levels(&known, &[raised], true, 0, &mut levels),
            "carried"
        );
        assert_eq!(levels, [level(0)], "an empty bucket stays empty");
        entry.set(&mut known, &[a], true, &[level(250_000)]);
        assert!(entry.levels(&known, &[raised], true, 0, &mut levels));
        assert_eq!(levels, [level(500_000)], "a quarter stays a quarter");
        entry.set(&mut known, &[raised], true, &levels);
        assert!(entry.is_short());
        assert_eq!(entry.to_vec(&known), [(raised, level(500_000))]);
        // Another period is another bucket.
        let hourly = Quota::per_hour(5).unwrap();
        assert!(!entry.levels(&known, &[hourly], true, 0, &mut levels));
        assert_eq!(levels, [Level::full(&hourly, 0)]);
        // Refilled under the figures it was kept under, then carried: 10/s
        // refills a full bucket (1 000 000 units) in 1 s, where 20/s burst
        // 40 would take 2 s.
        assert!(!entry.levels(&known, &[raised], true, 0, &mut levels));
        entry.set(&mut known, &[a], true, &[level(0)]);
        assert!(entry.levels(&known, &[raised], true, 1_000_000, &mut levels));
        assert_eq!(levels[0].level, 2_000_000, "full under 10/s, so full");
    }

    #[test]
    fn a_second_quota_moves_the_buckets_out_of_line() {
        let a = Quota::per_second(1).unwrap();
        let b = Quota::per_hour(1).unwrap();
        let mut known = Known::default();
        known.add_start(Arc::from("p:k:"));
        let mut entry = Entry::new(&mut known, "p:k:v", &[a], &[level(1)], 0);
        assert!(entry.is_short());
        entry.set(&mut known, &[b, a], true, &[level(2), level(3)]);
        assert!(!entry.is_short());
        assert_eq!(entry.to_vec(&known), [(a, level(3)), (b, level(2))]);
        assert_eq!(entry.get(&known, &b, true).map(|(_, l)| l), Some(&level(2)));
        assert_eq!(entry.name(&known), "p:k:v");
        assert!(entry.is(&known, "p:k:v"));
        assert!(entry.is_held(&known, Some(0), "p:k:", "v"));
        assert!(!entry.remove(&known, &[a], true));
        assert_eq!(entry.to_vec(&known), [(b, level(2))]);
        assert!(entry.remove(&known, &[b], true));
        let mut one = Entry::new(&mut known, "p:k:w", &[a], &[level(1)], 0);
        assert!(!one.remove(&known, &[b], true));
        assert!(one.remove(&known, &[a], true));
    }

    /// A name is the same key however it is held: after the longest start
    /// it begins with, whole, or on the heap; and it is found by its whole
    /// text, by any start and value it is made of, and hashed as written
    /// out, and never taken for another name.
    #[test]
    fn a_name_is_its_key_however_it_is_held() {
        let q = Quota::per_second(1).unwrap();
        let hasher = Seed::default();
        let mut known = Known::default();
        for start in ["a:", "a:b:", "zz:"] {
            known.add_start(Arc::from(start));
        }
        let long = format!("a:b:{}", "x".repeat(INLINE + 1));
        let exact = format!("a:b:{}", "é".repeat(INLINE / 2));
        let names = [
            "a:b:v", "a:v", "q:v", "a:b:", "", "zz", "a:bb", &long, &exact,
        ];
        for name in names {
            let entry = Entry::new(&mut known, name, &[q], &[level(1)], 0);
            assert_eq!(entry.is_short(), name != long, "{name}");
            assert_eq!(entry.name(&known), name);
            assert_eq!(entry.hash(&hasher, &known), hasher.hash(name.as_bytes()));
            for other in names {
                assert_eq!(entry.is(&known, other), other == name, "{name} {other}");
                for (number, start) in
                    [(Some(0), "a:"), (Some(1), "a:b:"), (None, "a:"), (None, "")]
                {
                    if let Some(value) = other.strip_prefix(start) {
                        assert_eq!(
                            entry.is_held(&known, number, start, value),
                            other == name,
                            "{name}: {start} {value}"
                        );
                    }
                }
            }
        }
        // The rest after "a:b:" is held when it fits, in bytes.
        assert_eq!(exact.len() - 4, INLINE);
    }

    /// Two names in pieces are the same exactly when they are written out,
    /// wherever each is split.
    #[test]
    fn names_in_pieces_compare_as_written_out() {
        let words = ["", "a", "ab", "abc", "abd", "b", "bc", "abcabc"];
        for x in words {
            for y in words {
                for i in 0..=x.len() {
                    for j in 0..=y.len() {
                        let (x, y) = (x.as_bytes(), y.as_bytes());
                        let a = (&x[..i], &x[i..]);
                        let b = (&y[..j], &y[j..]);
                        assert_eq!(same(a, b), x == y, "{a:?} {b:?}");
                    }
                }
            }
        }
    }

    /// A shard numbers at most `MAX_KNOWN` quotas; a key under a quota
    /// past them keeps the quota itself, and decides the same.
    #[test]
    fn quotas_past_the_numbered_ones_are_kept_whole() {
        let mut known = Known::default();
        for n in 1..=u64::try_from(MAX_KNOWN).unwrap() {
            let q = Quota::per_second(n).unwrap();
            let entry = Entry::new(&mut known, "k", &[q], &[level(1)], 0);
            assert!(entry.is_short());
        }
        let past = Quota::per_second(1_000).unwrap();
        let entry = Entry::new(&mut known, "k", &[past], &[level(7)], 0);
        assert!(!entry.is_short());
        assert_eq!(entry.to_vec(&known), [(past, level(7))]);
        assert_eq!(known.quotas.len(), MAX_KNOWN);
        // A numbered one is still found by its number.
        let first = Quota::per_second(1).unwrap();
        assert!(Entry::new(&mut known, "k", &[first], &[level(1)], 0).is_short());
    }
}
