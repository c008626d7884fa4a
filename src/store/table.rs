//! [`Table`]: the sharded, seeded table that the memory store, the lease map
//! and the deny cache keep their entries in.
//!
//! The table owns what the three have in common: the seed every name is
//! hashed with, the shard a hash picks, each shard's poison-tolerant lock,
//! and the bound on how many entries a shard holds. What an entry is, and
//! which one goes when a full shard needs room, is each user's own: a shard
//! is any [`Shard`] (its entries in a `hashbrown::HashTable` keyed by the
//! table's hash, with whatever else it keeps beside them).
//!
//! A name is hashed once per call, by its bytes alone with the table's
//! random [`Seed`] (aHash, keyed at random per table, so that a client cannot
//! aim its keys at one shard or one probe sequence). A [`KeyStart`] is a
//! start kept beside the seed (a layer's `policy:kind:`, when the layer is
//! built): a check hashes the start and the rest of its key as one name,
//! and finds the same shard and slot as the whole key written out.

use std::hash::{BuildHasher, Hasher};
use std::sync::{Mutex, MutexGuard};

use crate::lock::lock;

/// What a table's shard holds: its entries, and whatever its user keeps
/// beside them.
pub(crate) trait Shard: Default {
    /// How many entries the shard holds.
    fn len(&self) -> usize;
}

/// Shards of `S` behind a lock each, picked by a name's seeded hash.
#[derive(Debug)]
pub(crate) struct Table<S> {
    shards: Box<[Padded<Mutex<S>>]>,
    per_shard: usize,
    seed: Seed,
}

/// A table's random key for hashing names (aHash: a keyed hash made to
/// resist collisions chosen by clients, several times faster than SipHash
/// on short names).
///
/// A name is hashed in two pieces, split after its last `:` (the whole name
/// after an empty piece when it has none): `policy:kind:` and the client's
/// value, for the keys a layer makes. aHash, unlike SipHash, hashes bytes
/// written in pieces apart from the same bytes written at once; so a start
/// hashed once ([`KeyStart`]) goes on with the rest of a name only when the
/// split falls between them, and the pieces are written out together
/// otherwise.
#[derive(Clone, Debug, Default)]
pub(crate) struct Seed(ahash::RandomState);

/// Names up to this long are written out from two pieces on the stack.
const PAIR_ON_STACK: usize = 128;

/// Where `name` is split for hashing: after its last `:`, or at 0.
#[inline]
fn split(name: &[u8]) -> usize {
    name.iter().rposition(|&b| b == b':').map_or(0, |i| i + 1)
}

impl Seed {
    /// `name`'s hash (its bytes alone, in its two pieces).
    #[inline]
    pub(crate) fn hash(&self, name: &[u8]) -> u64 {
        let (start, rest) = name.split_at(split(name));
        let mut state = self.0.build_hasher();
        state.write(start);
        state.write(rest);
        state.finish()
    }

    /// The hash of the name `a` + `b`: what [`hash`](Self::hash) gives it
    /// written out.
    #[inline]
    pub(crate) fn hash_pair(&self, a: &[u8], b: &[u8]) -> u64 {
        let len = a.len() + b.len();
        if b.is_empty() {
            self.hash(a)
        } else if a.is_empty() {
            self.hash(b)
        } else if a.ends_with(b":") && !b.contains(&b':') {
            // Split between them.
            let mut state = self.0.build_hasher();
            state.write(a);
            state.write(b);
            state.finish()
        } else if len <= PAIR_ON_STACK {
            // The rare case: a start not ending in `:`, or a value with one.
            let mut name = [0u8; PAIR_ON_STACK];
            for (to, from) in name.iter_mut().zip(a.iter().chain(b)) {
                *to = *from;
            }
            self.hash(name.get(..len).unwrap_or_default())
        } else {
            self.hash(&[a, b].concat())
        }
    }

    /// `value`'s hash by its `Hash`, with this seed.
    #[cfg(feature = "redis")]
    pub(crate) fn hash_one<T: std::hash::Hash>(&self, value: T) -> u64 {
        self.0.hash_one(value)
    }
}

/// The start of names (`policy:kind:`), kept with one table's seed: see
/// [`Table::start`].
#[derive(Clone, Debug)]
pub(crate) struct KeyStart {
    text: Box<str>,
    seed: Seed,
    /// The start hashed as the first piece of a name, when it is one (it
    /// ends with `:`).
    state: Option<ahash::AHasher>,
    /// The start's number, in a table whose entries refer to starts by
    /// number (the memory store's, or the lease map's), if it has one
    /// there.
    number: Option<u8>,
}

impl KeyStart {
    /// The start as text.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// The start's number in its table, if it has one.
    pub(crate) fn number(&self) -> Option<u8> {
        self.number
    }

    /// The start, numbered `number` in its table.
    pub(crate) fn numbered(self, number: Option<u8>) -> Self {
        KeyStart { number, ..self }
    }

    /// The hash of the name `self` + `rest`: the hash [`Table::hash`] gives
    /// it written out.
    #[inline]
    pub(crate) fn hash(&self, rest: &[u8]) -> u64 {
        match &self.state {
            Some(state) if !rest.contains(&b':') => {
                let mut state = state.clone();
                state.write(rest);
                state.finish()
            }
            _ => self.seed.hash_pair(self.text.as_bytes(), rest),
        }
    }
}

impl<S: Shard> Table<S> {
    /// A table of `shards` shards (at least one) of up to `per_shard`
    /// entries each (at least one), seeded at random.
    pub(crate) fn new(shards: usize, per_shard: usize) -> Self {
        Table {
            shards: (0..shards.max(1))
                .map(|_| Padded(Mutex::new(S::default())))
                .collect(),
            per_shard: per_shard.max(1),
            seed: Seed::default(),
        }
    }

    /// The seed names are hashed with.
    pub(crate) fn hasher(&self) -> &Seed {
        &self.seed
    }

    /// `name`'s hash: its bytes alone, with the table's seed (without the
    /// end marker `str`'s `Hash` adds, so a name hashed in pieces hashes the
    /// same).
    #[inline]
    pub(crate) fn hash(&self, name: &[u8]) -> u64 {
        self.seed.hash(name)
    }

    /// `start`, for names that begin with it (hashed once, when it ends
    /// with `:`).
    pub(crate) fn start(&self, start: &str) -> KeyStart {
        let state = start.ends_with(':').then(|| {
            let mut state = self.seed.0.build_hasher();
            state.write(start.as_bytes());
            state
        });
        KeyStart {
            text: start.into(),
            seed: self.seed.clone(),
            state,
            number: None,
        }
    }

    /// The shard of the name hashed to `hash`, locked.
    #[inline]
    pub(crate) fn shard(&self, hash: u64) -> MutexGuard<'_, S> {
        match self.shards.get(self.shard_index(hash)) {
            Some(shard) => lock(&shard.0),
            None => unreachable_empty(),
        }
    }

    /// The index of the shard of the name hashed to `hash`: the table's one
    /// rule for picking a shard.
    #[inline]
    pub(crate) fn shard_index(&self, hash: u64) -> usize {
        // Bits 25 to 56 pick the shard, as `bits x len / 2^32` (an even
        // spread below `len`, without a division): the table inside a shard
        // indexes by the low bits and tags each slot with the top 7, and
        // neither may be the same for all of a shard's entries (shards
        // picked by the top bits left a shard's tags a few values of 128, so
        // a probe compared many more names than it found).
        let bits = (hash >> 25) & 0xFFFF_FFFF;
        usize::try_from((bits * self.shards.len() as u64) >> 32).unwrap_or(0)
    }

    /// Every shard, each locked in turn while the caller holds it.
    pub(crate) fn shards(&self) -> impl Iterator<Item = MutexGuard<'_, S>> {
        self.shards.iter().map(|s| lock(&s.0))
    }

    /// Whether `shard` holds its share of entries: one more needs room made
    /// first.
    #[inline]
    pub(crate) fn is_full(&self, shard: &S) -> bool {
        shard.len() >= self.per_shard
    }

    /// How many entries the table holds now.
    pub(crate) fn len(&self) -> usize {
        self.shards().map(|s| s.len()).sum()
    }

    /// How many shards the table has.
    #[cfg(test)]
    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }
}

/// A shard on cache lines of its own, so that locking it never takes a line
/// of its neighbour's from the other core.
#[derive(Debug)]
#[repr(align(128))]
struct Padded<T>(T);

/// Whether two names, each in two pieces, are the same bytes (compared as
/// slices, a piece at a time).
pub(crate) fn same_pieces(a: (&[u8], &[u8]), b: (&[u8], &[u8])) -> bool {
    if a.0.len() + a.1.len() != b.0.len() + b.1.len() {
        return false;
    }
    // Order the pair so that `short.0` is the shorter first piece: it
    // matches the start of `long.0`, and `short.1` the rest of `long.0`
    // followed by `long.1`.
    let (short, long) = if a.0.len() <= b.0.len() {
        (a, b)
    } else {
        (b, a)
    };
    let Some((head, tail)) = long.0.split_at_checked(short.0.len()) else {
        return false;
    };
    let Some((middle, end)) = short.1.split_at_checked(tail.len()) else {
        return false;
    };
    short.0 == head && middle == tail && end == long.1
}

/// Whether `a` and `b` are the same bytes (`a == b`), compared eight at a
/// time in line: a check compares the name it looks for with the one it
/// finds, a few tens of bytes, and a call of the C library's `memcmp` for
/// them was about a twentieth of a check decided in process.
#[inline]
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        return a.iter().zip(b).all(|(x, y)| x == y);
    }
    let word = |s: &[u8], i: usize| {
        s.get(i..i + 8)
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map(u64::from_ne_bytes)
    };
    let mut i = 0;
    while i + 8 < n {
        if word(a, i) != word(b, i) {
            return false;
        }
        i += 8;
    }
    // The last eight, overlapping the words before when `n` is not a
    // multiple of eight.
    word(a, n - 8) == word(b, n - 8)
}

#[cold]
fn unreachable_empty() -> ! {
    // `new` always makes at least one shard.
    unreachable!("a table has at least one shard")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `same_bytes` is `==` for every pair of lengths up to 40 and every
    /// place a byte may differ.
    #[test]
    fn same_bytes_is_equality() {
        for n in 0..=40usize {
            let a: Vec<u8> = (0..n)
                .map(|i| u8::try_from(i % 251).unwrap_or(0) ^ 0x5a)
                .collect();
            assert!(same_bytes(&a, &a.clone()), "{n}");
            for m in [n.saturating_sub(1), n + 1] {
                let b: Vec<u8> = (0..m)
                    .map(|i| u8::try_from(i % 251).unwrap_or(0) ^ 0x5a)
                    .collect();
                assert_eq!(same_bytes(&a, &b), a == b, "{n} {m}");
            }
            for at in 0..n {
                let mut b = a.clone();
                if let Some(byte) = b.get_mut(at) {
                    *byte ^= 1;
                }
                assert!(!same_bytes(&a, &b), "{n} differing at {at}");
            }
        }
    }

    #[derive(Default)]
    struct Count(usize);

    impl Shard for Count {
        fn len(&self) -> usize {
            self.0
        }
    }

    #[test]
    fn a_start_hashes_as_the_whole_name() {
        let table = Table::<Count>::new(4, 10);
        let start = table.start("api:ip:");
        assert_eq!(start.hash(b"10.0.0.1"), table.hash(b"api:ip:10.0.0.1"));
        assert_eq!(start.text(), "api:ip:");
        // Every split of names short and long, on the stack and not, with
        // and without colons, from a start and from pieces.
        let seed = table.hasher();
        let long = format!("p:{}:v", "x".repeat(PAIR_ON_STACK + 9));
        let names = [
            "",
            "a",
            ":",
            "::",
            "api:ip:10.0.0.1",
            "api:ip:::1",
            "ab",
            &long,
        ];
        for name in names {
            let bytes = name.as_bytes();
            for at in 0..=bytes.len() {
                let (a, b) = bytes.split_at(at);
                assert_eq!(seed.hash_pair(a, b), seed.hash(bytes), "{name} at {at}");
                if let (Ok(a), true) = (std::str::from_utf8(a), a.is_ascii()) {
                    assert_eq!(table.start(a).hash(b), table.hash(bytes), "{name} at {at}");
                }
            }
        }
        // Names apart hash apart (with this seed, these do).
        assert_ne!(table.hash(b"a:b"), table.hash(b"a:c"));
        assert_ne!(table.hash(b"a:b"), table.hash(b"ab"));
        // Another table's seed hashes otherwise.
        let other = Table::<Count>::new(4, 10);
        assert_ne!(
            other.hash(b"api:ip:10.0.0.1"),
            table.hash(b"api:ip:10.0.0.1")
        );
    }

    #[test]
    fn shards_spread_names_without_narrowing_their_tags() {
        // The slot tags are the hash's top 7 bits: every shard must see
        // most of the 128 values, and every shard must be used.
        let table = Table::<Count>::new(16, 10);
        let mut tags = vec![std::collections::HashSet::new(); 16];
        for i in 0..20_000 {
            let hash = table.hash(format!("key:{i}").as_bytes());
            tags[table.shard_index(hash)].insert(hash >> 57);
        }
        for (i, seen) in tags.iter().enumerate() {
            assert!(seen.len() > 100, "shard {i} saw {} tags", seen.len());
        }
    }

    #[test]
    fn a_shard_is_full_at_its_share() {
        let table = Table::<Count>::new(2, 3);
        let mut shard = table.shard(0);
        assert!(!table.is_full(&shard));
        shard.0 = 3;
        assert!(table.is_full(&shard));
        drop(shard);
        assert_eq!(table.len(), 3);
        assert_eq!(table.shard_count(), 2);
    }
}
