//! [`Entry`]: one key under one policy in the lease map: its name, its
//! holds, its demand, and whether a lease is being asked for.

use std::collections::VecDeque;
use std::num::NonZeroU64;
use std::sync::{Mutex, OnceLock};

use super::MAX_HOLDS;
use crate::policy::Policy;
use crate::store::table::{KeyStart, same_bytes, same_pieces};

/// One hold of this instance on a key's buckets, whole: as it comes into
/// an entry and leaves it (an entry keeps what a check reads of it apart
/// from the rest, see [`Entry`]). Times are microseconds of the map's clock.
pub(super) struct Hold {
    pub(super) id: u64,
    pub(super) granted: u64,
    pub(super) left: u64,
    /// Its life in Redis.
    pub(super) life: u64,
    /// Used here until then (Redis debits it some time after).
    pub(super) until: u64,
}

/// What a check reads of a hold.
#[derive(Clone, Copy, Default)]
pub(super) struct Spendable {
    pub(super) left: u64,
    pub(super) until: u64,
}

/// The rest of a hold, read when it leaves.
#[derive(Clone, Copy, Default)]
pub(super) struct HoldRest {
    pub(super) id: u64,
    pub(super) granted: u64,
    pub(super) life: u64,
}

/// The longest name held in its entry, less a numbered start it begins
/// with (see [`Starts`]); a longer one is kept in the entry's cold part, a
/// block of its own.
pub(super) const SHORT_NAME: usize = 39;

/// The name length of an entry whose name is in its cold part.
pub(super) const LONG: u8 = u8::MAX;

/// One key under one policy: its name, holds, demand, and whether a lease is
/// being asked for.
///
/// What a check reads fills two cache lines (`repr(C)`, aligned to them,
/// 128 bytes: const-asserted): the name when it fits (39 bytes, less a
/// `policy:kind:` start a layer or limiter of the map checks from holds,
/// kept once for the map and numbered, see [`Starts`]: a verbatim value
/// such as an IP address or a hashed one fits), the holds' tokens and
/// ends, the demand and the times. What only a lease request, a report or an eviction reads is in
/// `cold`, so the table of a busy instance's keys stays in a core's cache
/// longer (it took 312 bytes a key); a longer name is there too, and every
/// look-up of its key follows it (in process, the layer's own cost of a
/// `Header` key checked from a hold about doubled at 10 000 keys).
///
/// The map is keyed by the name (the key's storage-safe form) and the
/// policy's key tails: the same key under two policies with different
/// quotas is two entries (with the same quotas, one: they share buckets).
#[repr(C, align(64))]
pub(super) struct Entry {
    /// The name's length, or [`LONG`] (in `cold`).
    pub(super) name_len: u8,
    /// Holds in use: the first `holds` of `spendable`, oldest first.
    pub(super) holds: u8,
    pub(super) asking: bool,
    /// The last lease got its roomy size and life (every bucket was at
    /// least 3/4 free besides its cost): renewed when under two periods'
    /// demand is held, not half of one.
    pub(super) roomy: bool,
    /// The server epoch's generation its holds were granted in (its low
    /// 32 bits; see `epoch.rs`).
    pub(super) generation: u32,
    /// The number of the start the name begins with, kept in [`Starts`]
    /// (`name` holds the rest); 0: none, `name` holds it all (or, for a
    /// long name, the cold part does).
    pub(super) start: u8,
    pub(super) name: [u8; SHORT_NAME],
    pub(super) spendable: [Spendable; MAX_HOLDS],
    /// A quarter of the newest hold's life: renewed when it has less left.
    pub(super) quarter: u64,
    /// Tokens asked for, decayed by `exp(-age / period)`.
    pub(super) demand: f64,
    pub(super) seen: u64,
    /// When the key was first seen: a young key's count covers less than
    /// a period, and is scaled up (4x at most).
    pub(super) born: u64,
    pub(super) policy: Policy,
    /// Made when the key first asks for a lease (or has a long name): a
    /// key checked a few times, never leased (most keys of an API keyed
    /// by client address), takes the 128 bytes of its line pair alone.
    pub(super) cold: Option<Box<Cold>>,
}

const _: () = assert!(size_of::<Entry>() == 128);

/// What an entry keeps out of a check's way, once it has asked for a
/// lease (or from the start, for a long name).
#[derive(Default)]
pub(super) struct Cold {
    /// The whole name, when what follows the longest numbered start it
    /// begins with (or all of it) is longer than [`SHORT_NAME`].
    pub(super) long_name: Box<str>,
    /// The rest of each hold, as `spendable`.
    pub(super) rest: [HoldRest; MAX_HOLDS],
    /// Holds spent whole, by id and size, whose reports wait to ride with
    /// the next lease request (a report of a hold spent whole changes only
    /// when Redis debits it: now, or at its expiry).
    pub(super) spent: VecDeque<(u64, u64)>,
    /// This entry among those the name has had (given with the cold part,
    /// from the map's count): a lease answered for an earlier one
    /// (forgotten by a reset, or evicted, while the lease was under way)
    /// is not this entry's to use. An entry without a cold part never
    /// asked.
    pub(super) serial: u64,
    /// The hold whose partial report rides with the lease under way: a
    /// refund is not given back to it until the answer says what Redis
    /// debited. (Lease ids are never 0: no room is lost to the `None`.)
    pub(super) partial: Option<NonZeroU64>,
    /// No lease is asked for before then (after a grant of nothing); 0:
    /// none. Read only when a lease is about to be asked for.
    pub(super) quiet_until: u64,
}

/// A cold part fills a 128-byte block of the allocator (with its 8 bytes
/// of header: one more byte, and it takes 144).
const _: () = assert!(size_of::<Cold>() <= 120);

impl Entry {
    /// The entry of a key first seen at `now`, its name held less the
    /// longest of `starts` it begins with; `serial` gives its serial if it
    /// needs a cold part at once (a long name).
    pub(super) fn new(
        name: &str,
        policy: &Policy,
        now: u64,
        starts: &Starts,
        serial: impl FnOnce() -> u64,
    ) -> Self {
        let whole = name.as_bytes();
        let (start, given) = match starts.longest(whole, SHORT_NAME) {
            Some((number, len)) => (number, whole.get(len..).unwrap_or_default()),
            None => (0, whole),
        };
        let mut bytes = [0; SHORT_NAME];
        let (start, name_len, cold) =
            match (bytes.get_mut(..given.len()), u8::try_from(given.len())) {
                (Some(held), Ok(len)) => {
                    held.copy_from_slice(given);
                    (start, len, None)
                }
                _ => (
                    0,
                    LONG,
                    Some(Box::new(Cold {
                        long_name: name.into(),
                        serial: serial(),
                        ..Cold::default()
                    })),
                ),
            };
        Entry {
            name_len,
            holds: 0,
            asking: false,
            roomy: false,
            generation: 0,
            start,
            name: bytes,
            spendable: [Spendable::default(); MAX_HOLDS],
            quarter: 0,
            demand: 0.0,
            seen: now,
            born: now,
            policy: policy.clone(),
            cold,
        }
    }

    /// The cold part, made now (its serial from `serial`) if the entry has
    /// none yet.
    pub(super) fn cold_mut(&mut self, serial: impl FnOnce() -> u64) -> &mut Cold {
        self.cold.get_or_insert_with(|| {
            Box::new(Cold {
                serial: serial(),
                ..Cold::default()
            })
        })
    }

    /// Whether this entry asked for the lease `serial` was asked with.
    pub(super) fn has_serial(&self, serial: u64) -> bool {
        self.cold.as_ref().is_some_and(|c| c.serial == serial)
    }

    /// Holds spent whole whose reports wait for a lease request.
    pub(super) fn spent_waiting(&self) -> usize {
        self.cold.as_ref().map_or(0, |c| c.spent.len())
    }

    /// What the entry holds of its name: all of it (a long one, in the
    /// cold part), or what follows its start.
    fn held_name(&self) -> &[u8] {
        if self.name_len == LONG {
            self.cold
                .as_ref()
                .map_or(&[][..], |c| c.long_name.as_bytes())
        } else {
            self.name
                .get(..usize::from(self.name_len))
                .unwrap_or_default()
        }
    }

    /// The name, in two pieces: its start (of `starts`; empty if none)
    /// and the rest.
    pub(super) fn name<'a>(&'a self, starts: &'a Starts) -> (&'a [u8], &'a [u8]) {
        (starts.text(self.start), self.held_name())
    }

    pub(super) fn name_boxed(&self, starts: &Starts) -> Box<str> {
        let (start, rest) = self.name(starts);
        String::from_utf8_lossy(&[start, rest].concat()).into()
    }

    /// Whether this entry's name is `name`.
    pub(super) fn is_named(&self, name: &[u8], starts: &Starts) -> bool {
        same_pieces(self.name(starts), (name, &[]))
    }

    /// Whether this is the entry of `name` under `policy`.
    #[inline]
    pub(super) fn is(&self, name: &[u8], policy: &Policy, starts: &Starts) -> bool {
        self.is_named(name, starts) && self.policy.same_counting(policy)
    }

    /// Whether this is the entry of the name `start` + `value` under
    /// `policy`, compared a piece at a time: the value alone when the
    /// entry holds its name after the same numbered start.
    #[inline]
    pub(super) fn is_split(
        &self,
        start: &KeyStart,
        value: &[u8],
        policy: &Policy,
        starts: &Starts,
    ) -> bool {
        let same = if self.start != 0 && start.number() == Some(self.start) {
            let held = self.held_name();
            held.len() == value.len() && same_bytes(held, value)
        } else {
            same_pieces(self.name(starts), (start.text().as_bytes(), value))
        };
        same && self.policy.same_counting(policy)
    }

    /// The holds in use, oldest first.
    pub(super) fn holds(&self) -> &[Spendable] {
        self.spendable
            .get(..usize::from(self.holds))
            .unwrap_or_default()
    }

    pub(super) fn holds_mut(&mut self) -> &mut [Spendable] {
        self.spendable
            .get_mut(..usize::from(self.holds))
            .unwrap_or_default()
    }

    /// Takes the `i`th hold out, the later ones moving up.
    pub(super) fn remove_hold(&mut self, i: usize) -> Option<Hold> {
        let n = usize::from(self.holds);
        if i >= n {
            return None;
        }
        let cold = self.cold.as_mut()?;
        let (spendable, rest) = (self.spendable.get_mut(i..n)?, cold.rest.get_mut(i..n)?);
        let (Spendable { left, until }, HoldRest { id, granted, life }) =
            (*spendable.first()?, *rest.first()?);
        spendable.rotate_left(1);
        rest.rotate_left(1);
        self.holds -= 1;
        self.quarter = self.newest_quarter();
        Some(Hold {
            id,
            granted,
            left,
            life,
            until,
        })
    }

    /// Adds `hold` as the newest, or gives it back when the key has
    /// [`MAX_HOLDS`] already.
    pub(super) fn push_hold(&mut self, hold: Hold) -> Result<(), Hold> {
        let i = usize::from(self.holds);
        let rest = self.cold.as_mut().and_then(|c| c.rest.get_mut(i));
        match (self.spendable.get_mut(i), rest) {
            (Some(spendable), Some(rest)) => {
                *spendable = Spendable {
                    left: hold.left,
                    until: hold.until,
                };
                *rest = HoldRest {
                    id: hold.id,
                    granted: hold.granted,
                    life: hold.life,
                };
                self.holds += 1;
                self.quarter = hold.life / 4;
                Ok(())
            }
            _ => Err(hold),
        }
    }

    /// Hold `id` reported `spent` of its tokens as spent, keeping the
    /// rest: it holds that many fewer. True when the hold is still held
    /// here; one used up while the report was under way waits in the queue
    /// of spent holds, whose report then debits only the rest (its tokens
    /// already left the held count).
    pub(super) fn reported_part(&mut self, id: u64, spent: u64) -> bool {
        let n = usize::from(self.holds);
        let Some(cold) = self.cold.as_mut() else {
            return false;
        };
        if let Some(rest) = cold
            .rest
            .get_mut(..n)
            .and_then(|r| r.iter_mut().find(|r| r.id == id))
        {
            rest.granted = rest.granted.saturating_sub(spent);
            return true;
        }
        if let Some((_, granted)) = cold.spent.iter_mut().find(|(i, _)| *i == id) {
            *granted = granted.saturating_sub(spent);
        }
        false
    }

    /// A quarter of the newest hold's life (0 without holds).
    pub(super) fn newest_quarter(&self) -> u64 {
        usize::from(self.holds)
            .checked_sub(1)
            .and_then(|i| self.cold.as_ref()?.rest.get(i))
            .map_or(0, |r| r.life / 4)
    }

    /// Every hold, taken out.
    pub(super) fn take_holds(&mut self) -> Vec<Hold> {
        let mut out = Vec::with_capacity(usize::from(self.holds));
        while let Some(hold) = self.remove_hold(0) {
            out.push(hold);
        }
        out
    }
}

/// The starts (`policy:kind:`) of the names a map's layers and limiters
/// check from holds, numbered 1 to 255 in the order they came (0 is none):
/// an entry whose name begins with one keeps only the rest, so the name of
/// a long policy, header and value fits its line pair. Kept once for the
/// map (a start is a few bytes, every layer's names begin with its own)
/// and read without a lock: a number, once given, never changes, and is
/// never given back (a program that builds over 255 layers or limiters of
/// distinct starts on one store keeps the later ones' names whole: as
/// exact, a little slower past 39 bytes).
pub(crate) struct Starts {
    texts: Box<[OnceLock<Box<str>>]>,
    adding: Mutex<()>,
}

impl Default for Starts {
    fn default() -> Self {
        Starts {
            texts: (0..u8::MAX).map(|_| OnceLock::new()).collect(),
            adding: Mutex::new(()),
        }
    }
}

impl Starts {
    /// `start`'s number, given now if it has none (`None` once 255 are
    /// given: its names are held whole).
    pub(super) fn number(&self, start: &str) -> Option<u8> {
        let _adding = crate::lock::lock(&self.adding);
        for (number, slot) in (1..=u8::MAX).zip(self.texts.iter()) {
            match slot.get() {
                Some(text) if **text == *start => return Some(number),
                Some(_) => {}
                None => {
                    return slot.set(start.into()).is_ok().then_some(number);
                }
            }
        }
        None
    }

    /// The start numbered `number`: empty for 0, or a number not given.
    pub(super) fn text(&self, number: u8) -> &[u8] {
        usize::from(number)
            .checked_sub(1)
            .and_then(|i| self.texts.get(i)?.get())
            .map_or(&[][..], |text| text.as_bytes())
    }

    /// The longest start `name` begins with that leaves at most `rest`
    /// bytes after it: its number and length.
    fn longest(&self, name: &[u8], rest: usize) -> Option<(u8, usize)> {
        let mut best: Option<(u8, usize)> = None;
        for (number, slot) in (1..=u8::MAX).zip(self.texts.iter()) {
            // Numbers are given in order: none after the first not given.
            let Some(text) = slot.get() else {
                break;
            };
            let len = text.len();
            if len > 0
                && name.starts_with(text.as_bytes())
                && name.len() - len <= rest
                && best.is_none_or(|(_, longest)| len > longest)
            {
                best = Some((number, len));
            }
        }
        best
    }
}
