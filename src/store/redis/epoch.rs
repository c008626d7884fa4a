//! The server's epoch ([`ServerEpoch`]): which state of data a standalone or
//! Sentinel store's server is in, as its replies say, so that holds granted
//! in a state that is gone are never spent.
//!
//! Redis can lose a bucket with the holds in it: `FLUSHALL`, a restart
//! without persistence, a failover to a replica that missed the last writes.
//! The script keeps an epoch key that changes whenever that may have happened
//! (see "Epochs" in `lua/token_bucket.lua`) and ends every reply with the
//! epoch. A store sends the epoch it knows with every call, and its calls on
//! a new connection check the server's identity too, until one is answered.
//! Holds are spent only while the epoch they were granted in is the current
//! one, a reply sent within [`CONFIRMED_FOR`] confirmed it (past
//! [`VERIFY_AFTER`] without one, a check from a hold asks for a confirmation
//! in the background), no connection broke since, and, on a store that keeps
//! one, while its watch on the server is up (`watch.rs`). A holder cut off
//! from a server that then lost its data stops within [`CONFIRMED_FOR`]; the
//! script covers that second (twice over) with stand-in holds on every
//! bucket it reads after a loss, including when the first call after it is
//! a newcomer's, as long as a watcher tells it holds exist.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::quota::micros;
use crate::store::clock::Clock;

/// A hold is spent only within this long of sending a call whose reply
/// confirmed the epoch it was granted in. The script's stand-in holds after a
/// loss last twice as long (`LEARNING_US`).
pub(crate) const CONFIRMED_FOR: Duration = Duration::from_secs(1);

/// A check decided from a hold asks for a confirmation when the last one was
/// sent longer ago than this (its key's next lease request, sent early, or
/// a call of no decisions): a busy key's holds lapse only if the
/// confirmation takes longer than the rest of [`CONFIRMED_FOR`] (250 ms) to
/// come back, and a store whose lease requests come more often sends none.
pub(crate) const VERIFY_AFTER: Duration = Duration::from_millis(750);

/// Whether a clock that reads `now` lost time against the OS's monotonic
/// clock, which reads `monotonic` (microseconds since both started): it is
/// behind by over a second and a hundredth of the time since. A time-stamp
/// counter calibrated against the OS's clock keeps within that of it; one
/// that a suspend reset to 0 reads 0 until it passes the count it started
/// at, then falls behind by the whole time it had run.
fn behind(now: u64, monotonic: u64) -> bool {
    now.saturating_add(1_000_000 + monotonic / 100) < monotonic
}

/// What a store knows of its server's epoch.
pub(crate) struct ServerEpoch {
    /// The epoch key (`{prefix}epoch`).
    key: String,
    /// Times below are microseconds of this clock (the lease map's too).
    clock: Clock,
    /// The OS's monotonic clock, started with `clock` (tokio's `Instant`,
    /// as `clock` under `test-util`): see [`behind`].
    reference: Instant,
    known: Mutex<Known>,
    /// Bumped whenever the known epoch changes: holds remember the
    /// generation they were granted in.
    generation: AtomicU64,
    /// When the last call whose reply confirmed the known epoch was sent,
    /// plus one (0: never).
    confirmed: AtomicU64,
    /// When a connection last broke, plus one (0: never): only a reply to
    /// a call sent after it confirms the epoch again.
    broken: AtomicU64,
    /// A confirmation is under way.
    verifying: AtomicBool,
    /// Connections made so far, and how many of them a call that checked
    /// the server's identity was answered on: until then, every call checks
    /// it (see [`argument`](Self::argument)).
    connections: AtomicU64,
    identified: AtomicU64,
    /// The watch (see `watch.rs`): whether this store keeps one (it can
    /// open a subscription to its server), whether it was asked for (a
    /// reply said holds were granted on the server) and whether it is up.
    /// A store that keeps one spends holds only while it is up.
    watch_kept: AtomicBool,
    watch_wanted: AtomicBool,
    watching: AtomicBool,
}

#[derive(Default)]
struct Known {
    /// What the last reply ended with: twice the epoch plus 1, or 0 while
    /// the server has none (no hold was ever granted there) or none was
    /// heard yet. Sent back as it is.
    heard: u64,
    /// When the call that told it was sent: a reply to an earlier call that
    /// names another epoch is older news.
    told_at: u64,
    /// Microseconds the clock lost against the OS's monotonic clock (see
    /// `heard_at`).
    lost: u64,
}

impl ServerEpoch {
    /// The epoch of the server whose keys start with `prefix`.
    pub(crate) fn new(prefix: &str) -> Self {
        ServerEpoch {
            key: format!("{prefix}epoch"),
            clock: Clock::new(),
            reference: Instant::now(),
            known: Mutex::new(Known::default()),
            generation: AtomicU64::new(0),
            confirmed: AtomicU64::new(0),
            broken: AtomicU64::new(0),
            verifying: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            identified: AtomicU64::new(0),
            watch_kept: AtomicBool::new(false),
            watch_wanted: AtomicBool::new(false),
            watching: AtomicBool::new(false),
        }
    }

    /// The clock times are counted on.
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The epoch key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// Now, in microseconds of the epoch's clock.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.clock.now_us()
    }

    /// A new connection was made: a restarted server, or another one after
    /// a failover, may be behind it. Calls check the server's identity
    /// until one on it is answered.
    pub(crate) fn reconnected(&self) {
        self.connections.fetch_add(1, Ordering::AcqRel);
    }

    /// This store keeps a watch on its server (see `watch.rs`): from now
    /// on its holds are spent only while the watch is up.
    pub(crate) fn keep_watch(&self) {
        self.watch_kept.store(true, Ordering::Release);
    }

    /// This store cannot keep its watch after all (the ACL forbids it):
    /// holds are spent without one, as on a store that never kept one.
    pub(crate) fn forgo_watch(&self) {
        self.watch_kept.store(false, Ordering::Release);
    }

    /// Whether the watch should be started: this store keeps one, and a
    /// reply said holds were granted on the server.
    pub(crate) fn watch_wanted(&self) -> bool {
        self.watch_wanted.load(Ordering::Acquire) && self.watch_kept.load(Ordering::Acquire)
    }

    /// The watch is up (subscribed), or down.
    pub(crate) fn set_watching(&self, up: bool) {
        self.watching.store(up, Ordering::Release);
    }

    /// A call met a broken connection: the server may have restarted empty,
    /// or another one taken its place, and a newcomer's first call there may
    /// already have begun a new epoch without standing in for these holds
    /// (it cannot know they exist). Holds are not spent until a reply to a
    /// call sent from now on confirms the epoch they were granted in.
    pub(crate) fn disconnected(&self) {
        self.broken.fetch_max(self.now() + 1, Ordering::AcqRel);
    }

    /// The script's first argument for a call sent now: what the last reply
    /// ended with, and, on a connection whose server was not identified
    /// yet, a check of its identity too (`!`). With it, the connection it
    /// identifies, for [`heard`](Self::heard).
    pub(crate) fn argument(&self) -> (String, Option<u64>) {
        let heard = self.lock().heard;
        let connections = self.connections.load(Ordering::Acquire);
        if self.identified.load(Ordering::Acquire) < connections {
            (format!("!{heard}"), Some(connections))
        } else {
            (heard.to_string(), None)
        }
    }

    /// A reply to a call sent at `sent` (see [`now`](Self::now)) ended with
    /// `heard` (twice the epoch, plus 1 once holds were granted): it
    /// confirms the known epoch, or tells a new one (and the holds of the
    /// old one are never spent again).
    /// `identifies`: the connection count the call's identity check was
    /// made for, if it made one.
    pub(crate) fn heard(&self, sent: u64, heard: u64, identifies: Option<u64>) {
        self.heard_at(sent, heard, identifies, || {
            (self.now(), micros(self.reference.elapsed()))
        });
    }

    /// [`heard`](Self::heard) with `read` reading the clock and the OS's
    /// monotonic clock (both since they started), once the known epoch is
    /// locked: a reading taken before (by a thread a suspend stopped) would
    /// be older than what another reply found.
    ///
    /// A clock found [`behind`] the OS's lost time (a time-stamp counter
    /// reset by a suspend): the times of holds and of confirmations were
    /// read before, so they may lie ahead of every reading for a long
    /// while, and the holds would be spent again once the clock caught up
    /// with them. Their generation ends instead, so they never are, and
    /// the connection counts as broken now: only a call sent after this
    /// reading confirms the epoch again (a clock stuck at 0 after a reset
    /// confirms nothing until it moves). A reply to a call sent before the
    /// clock went back (its time ahead of the clock's) confirms nothing.
    /// The time lost is remembered, so the next reply does not find the
    /// clock behind again for it.
    fn heard_at(
        &self,
        sent: u64,
        heard: u64,
        identifies: Option<u64>,
        read: impl FnOnce() -> (u64, u64),
    ) {
        if let Some(connections) = identifies {
            self.identified.fetch_max(connections, Ordering::AcqRel);
        }
        if heard & 1 == 1 && !self.watch_wanted.load(Ordering::Relaxed) {
            self.watch_wanted.store(true, Ordering::Release);
        }
        let mut known = self.lock();
        let (now, monotonic) = read();
        if behind(now, monotonic.saturating_sub(known.lost)) {
            known.lost = monotonic.saturating_sub(now);
            self.generation.fetch_add(1, Ordering::AcqRel);
            self.confirmed.store(0, Ordering::Release);
            self.broken.store(now + 1, Ordering::Release);
            known.told_at = 0;
        }
        if sent > now.saturating_add(micros(CONFIRMED_FOR)) {
            return;
        }
        if heard >> 1 == known.heard >> 1 {
            known.heard |= heard & 1;
            self.confirmed.fetch_max(sent + 1, Ordering::AcqRel);
        } else if sent >= known.told_at {
            // The first epoch heard (the server had none before its first
            // grant, or this store had heard nothing) ends no holds.
            if known.heard != 0 {
                self.generation.fetch_add(1, Ordering::AcqRel);
            }
            known.heard = heard;
            known.told_at = sent;
            self.confirmed.store(sent + 1, Ordering::Release);
        }
    }

    /// The generation of the known epoch.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether holds granted in `generation` (its low 32 bits, as an entry
    /// keeps it) may be spent at `now`: a confirmation after `now` (a clock
    /// that went back) confirms nothing. The generation is read last: a
    /// confirmation or a break written after it ended (`heard_at`) is read
    /// with the generation that ended it.
    pub(crate) fn spendable(&self, generation: u64, now: u64) -> bool {
        let confirmed = self.confirmed.load(Ordering::Acquire);
        let broken = self.broken.load(Ordering::Acquire);
        let current = self.generation();
        #[expect(
            clippy::cast_possible_truncation,
            reason = "generations are compared by their low 32 bits"
        )]
        let same = generation as u32 == current as u32;
        same && confirmed != 0
            && confirmed <= now + 1
            && confirmed > broken
            && (self.watching.load(Ordering::Acquire) || !self.watch_kept.load(Ordering::Acquire))
            && (now + 1).saturating_sub(confirmed) < micros(CONFIRMED_FOR)
    }

    /// Whether a confirmation should be sent now: the last one is older than
    /// [`VERIFY_AFTER`] and none is under way (this call takes the turn;
    /// [`verified`](Self::verified) gives it back).
    pub(crate) fn verify_due(&self, now: u64) -> bool {
        (now + 1).saturating_sub(self.confirmed.load(Ordering::Acquire)) >= micros(VERIFY_AFTER)
            && !self.verifying.swap(true, Ordering::AcqRel)
    }

    /// The confirmation taken by [`verify_due`](Self::verify_due) ended.
    pub(crate) fn verified(&self) {
        self.verifying.store(false, Ordering::Release);
    }

    #[cfg(test)]
    fn confirmed(&self) -> u64 {
        self.confirmed.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        crate::lock::lock(&self.known)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn holds_are_spendable_only_in_a_confirmed_epoch() {
        let epoch = ServerEpoch::new("p:");
        assert_eq!(epoch.key(), "p:epoch");
        assert_eq!(epoch.argument(), ("0".to_owned(), None));
        // A new connection: its calls check the server until one is answered.
        epoch.reconnected();
        assert_eq!(epoch.argument(), ("!0".to_owned(), Some(1)));
        let sent = epoch.now();
        epoch.heard(sent, 42, Some(1));
        let generation = epoch.generation();
        assert_eq!(epoch.argument(), ("42".to_owned(), None));
        // The same epoch, now with holds granted: no new generation.
        epoch.heard(sent, 43, None);
        assert_eq!(epoch.generation(), generation);
        assert_eq!(epoch.argument().0, "43");
        assert!(epoch.spendable(generation, epoch.now()));
        // Unconfirmed for a second: not spendable until a reply confirms.
        tokio::time::advance(CONFIRMED_FOR).await;
        assert!(!epoch.spendable(generation, epoch.now()));
        assert!(epoch.verify_due(epoch.now()));
        assert!(!epoch.verify_due(epoch.now()), "one confirmation at a time");
        epoch.heard(epoch.now(), 43, None);
        epoch.verified();
        assert!(epoch.spendable(generation, epoch.now()));
        // A new epoch: the old generation's holds are never spent again.
        let sent = epoch.now();
        tokio::time::advance(Duration::from_millis(1)).await;
        epoch.heard(sent, 45, None);
        assert!(!epoch.spendable(generation, epoch.now()));
        assert!(epoch.spendable(epoch.generation(), epoch.now()));
        // A late reply to a call sent before the news does not undo it.
        epoch.heard(sent.saturating_sub(1), 43, None);
        assert_eq!(epoch.argument().0, "45");
    }

    /// A clock that goes back (a time-stamp counter reset by a suspend):
    /// confirmations read before it are ahead of it and confirm nothing,
    /// and the first reply that finds the clock behind the OS's ends the
    /// generation of every hold granted before, so none is spent once the
    /// clock has caught up with their times; only a call sent after that
    /// reply confirms again, and a clock stuck at 0 confirms nothing.
    #[test]
    fn a_clock_that_went_back_spends_no_hold_granted_before() {
        let epoch = ServerEpoch::new("p:");
        let (t, day) = (3_600_000_000, 86_400_000_000);
        epoch.heard_at(t, 43, None, || (t, t));
        let generation = epoch.generation();
        assert!(epoch.spendable(generation, t + 1_000));
        // The counter restarted: the clock reads far less than before.
        assert!(!epoch.spendable(generation, 5));
        // The first reply after it: the old generation ends, and the reply
        // (to a call sent before it was found) confirms nothing.
        epoch.heard_at(10, 43, None, || (10, t + 20));
        let after = epoch.generation();
        assert_ne!(after, generation);
        assert!(!epoch.spendable(after, 11));
        // A call sent after it confirms.
        epoch.heard_at(11, 43, None, || (12, t + 22));
        assert!(epoch.spendable(after, 12));
        // A late reply to a call sent before the jump confirms nothing.
        epoch.heard_at(t + 5, 43, None, || (13, t + 23));
        assert_eq!(epoch.confirmed(), 12);
        // Caught up with the times before the jump: holds granted then stay
        // unspent, and the time lost is not found again.
        let later = t + 1_000;
        epoch.heard_at(later, 43, None, || (later, later + t));
        assert_eq!(epoch.generation(), after, "the same loss, found once");
        assert!(!epoch.spendable(generation, later + 1));
        assert!(epoch.spendable(after, later + 1));
        // Stuck at 0 after a reset: found behind, and nothing sent at 0
        // confirms.
        let stuck = ServerEpoch::new("p:");
        stuck.heard_at(t, 43, None, || (t, t));
        stuck.heard_at(0, 43, None, || (0, t + 20));
        stuck.heard_at(0, 43, None, || (0, t + 30));
        assert!(!stuck.spendable(stuck.generation(), 0));
        // A clock that only drifts a little is not behind.
        assert!(!behind(day - day / 200, day));
        assert!(behind(day - day / 50, day));
        assert!(!behind(500_000, 1_400_000));
        assert!(behind(0, 1_100_000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_broken_connection_stops_holds_until_a_later_call_confirms() {
        let epoch = ServerEpoch::new("p:");
        epoch.heard(epoch.now(), 43, None);
        let generation = epoch.generation();
        tokio::time::advance(Duration::from_millis(1)).await;
        let before = epoch.now();
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(epoch.spendable(generation, epoch.now()));
        epoch.disconnected();
        assert!(!epoch.spendable(generation, epoch.now()));
        // A reply to a call sent before the break confirms nothing.
        epoch.heard(before, 43, None);
        assert!(!epoch.spendable(generation, epoch.now()));
        tokio::time::advance(Duration::from_millis(1)).await;
        epoch.heard(epoch.now(), 43, None);
        assert!(epoch.spendable(generation, epoch.now()));
    }
}
