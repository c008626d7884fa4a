//! Opportunistic batching: checks that arrive while calls are in flight on the
//! store's connection wait for the next call and go together, in one script
//! call that decides them in order.
//!
//! - **No added latency at low load.** With fewer calls under way than the
//!   queue's in-flight limit, a check goes out at once, with whatever is
//!   queued.
//! - **Under load**, checks queue while the limit's calls are in flight; when
//!   a call ends, the queue (up to the batch size) goes out as the next call.
//! - **The limit follows the round trip** (`window.rs`), as a congestion
//!   window follows the bandwidth-delay product. Every call's round trip is
//!   measured, from sending to its reply read back in this process. The
//!   *base* is the least round trip of the last 5 to 10 s (the least of this
//!   epoch and the one before, epochs of 5 s): the network's share, with
//!   nothing queued. The base holds `base / 50 µs` calls at what a call
//!   costs (`CALL_COST`: a few µs of Redis, some tens in this process), the
//!   *fit*, between the floor (2 on one node) and 64. When a call ends:
//!   - round trip above **4 x base** (calls queue: Redis or this process is
//!     saturated, however far Redis is): the limit halves, down to the
//!     floor, so checks batch;
//!   - else a limit above the fit (the base fell) falls to it;
//!   - else it rises by the checks that waited for a call meanwhile, at most
//!     doubling (slow start), up to the fit: checks that arrive together
//!     wait together, and need not take a round trip each to spread out;
//!     with none waiting it holds.
//!
//!   On loopback (round trips of tens of µs, mostly calls' own
//!   work) the fit is the floor: under load checks go several to a call and
//!   Redis runs fewer calls, as before. With Redis 0.2 ms away the fit is
//!   4, at 2.5 ms 50: a check under moderate concurrency finds a free call
//!   and is sent at once, rather than wait for a call and then for its own.
//!   A ratio to the base alone (TCP Vegas) cannot tell these apart: on a
//!   busy machine a far round trip swings to 2 or 3 times its least, as a
//!   loopback one does under load; what differs is how many calls' work the
//!   round trip is worth. A sample costs a few comparisons under the queue's
//!   lock, which the call's end takes anyway; a failed call teaches nothing.
//! - **A lone check goes out from its caller's future.** When a call may
//!   start and no other check waits, the check comes back to its caller
//!   (`Turn::Own`), which sends it itself: no task to spawn and no answer
//!   handed across threads, the common case at low load. A call that
//!   carries other checks is sent from a task of its own (a drain), so a
//!   caller that gives up (a client that went away) never strands the
//!   checks batched with its own. Checks that queue behind a lone check's
//!   call go out in a drain started when that call ends, so its caller
//!   returns its answer at once, or when its caller's future is dropped
//!   mid-call (timed out, went away), so they never wait for a call that no
//!   one will end (see `drain.rs`; with no runtime to start a drain on, the
//!   slot is given back and they go with the next call that starts).
//! - **Same answers.** The script decides the batch's checks in order, each
//!   seeing the buckets as the ones before it left them, all with one Redis
//!   `TIME`: the same answers as the checks sent one by one at that instant.
//! - **Redis Cluster** runs every key of one script call on one node, so a
//!   store on a cluster keeps one queue like this per primary and batches the
//!   checks of the slots that primary serves (see `cluster/nodes.rs`); each queue has
//!   its own window, whose floor is 1 with several primaries.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::encode::Spend;
use super::window::Window;
use crate::decision::Decision;
use crate::error::Error;
use crate::policy::Policy;
use crate::store::breaker::{Admit, Breaker, ProbeGuard};

/// One check waiting for its call.
pub(crate) struct Queued {
    pub(crate) keys: Vec<String>,
    pub(crate) policy: Policy,
    pub(crate) spend: Spend,
    /// When the check was queued: before Redis decides it.
    pub(crate) sent: Instant,
    pub(crate) reply: oneshot::Sender<Result<(Decision, u64), Error>>,
}

/// Whether `spend` gives tokens back (a refund): its call is never sent
/// twice (see [`Batch::run`](super::encode::Batch::run)), by the store or by
/// the client under it (see `Conn::for_call`).
pub(crate) fn gives_back(spend: &Spend) -> bool {
    matches!(spend, Spend::Adjust(delta) if *delta < 0)
}

/// The queue of one store.
pub(crate) struct Queue {
    pending: Vec<Queued>,
    in_flight: usize,
    window: Window,
}

/// Queues and sends the checks of one store (or of one cluster node).
pub(crate) struct Batcher {
    queue: Mutex<Queue>,
    max_batch: usize,
    /// A cluster node's own circuit breaker: calls to one node that hangs
    /// fail while the others answer, so the store's breaker, which their
    /// answers keep closed, would never open for it. Set by the cluster's
    /// slot map (`cluster/nodes.rs`).
    pub(super) node: Option<Arc<Breaker>>,
}

impl Batcher {
    pub(crate) fn new(max_batch: usize) -> Self {
        Batcher {
            queue: Mutex::new(Queue {
                pending: Vec::new(),
                in_flight: 0,
                window: Window::new(),
            }),
            max_batch: max_batch.max(1),
            node: None,
        }
    }

    /// Whether a check may join this queue, by the node's breaker (a
    /// cluster node's queue): `Err(retry_in)` while it is open; `Ok(Some)`
    /// when its probe is due: the check is the probe, sent on its own by
    /// whoever holds the guard (its outcome, or the guard dropped, settles
    /// it).
    pub(crate) fn admit(&self) -> Result<Option<ProbeGuard>, Duration> {
        match self.node.as_ref().map(Breaker::admit) {
            Some(Admit::Reject(retry_in)) => Err(retry_in),
            Some(Admit::Probe(guard)) => Ok(Some(guard)),
            Some(Admit::Go) | None => Ok(None),
        }
    }

    /// Whether a call of this queue may go, by the node's breaker: `Some`
    /// (the wait until its next probe) while it is not closed.
    pub(crate) fn refusing(&self) -> Option<Duration> {
        let node = self.node.as_ref()?;
        if node.is_closed() {
            return None;
        }
        Some(node.refusing().unwrap_or(Duration::ZERO))
    }

    /// A call of this queue (not the probe) sent at `sent` was answered
    /// (`ok`) or failed: the node's breaker counts it.
    pub(crate) fn heard(&self, sent: Instant, ok: bool) {
        if let Some(node) = &self.node {
            if ok {
                node.success(sent);
            } else {
                node.failure(sent);
            }
        }
    }

    /// Sets the fewest calls at once (at least one) and restarts the window
    /// from there if that changed; calls already in flight go on.
    #[allow(
        dead_code,
        reason = "only a cluster store's queues (cluster/nodes.rs) change it"
    )]
    pub(crate) fn set_min_in_flight(&self, calls: usize) {
        self.lock().window.set_floor(calls);
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        crate::lock::lock(&self.queue)
    }

    /// Queues `check`, or hands it back alone; with a call that may start
    /// (see [`Turn`]) the caller then owns one in-flight slot.
    pub(crate) fn enqueue(&self, check: Queued) -> Turn {
        let mut queue = self.lock();
        if queue.in_flight >= queue.window.limit() {
            queue.pending.push(check);
            return Turn::Wait;
        }
        queue.in_flight += 1;
        forget_abandoned(&mut queue);
        if queue.pending.is_empty() {
            return Turn::Own(check);
        }
        queue.pending.push(check);
        Turn::Batch(self.take(&mut queue))
    }

    /// After a call ends, having taken `round_trip` if it succeeded: the next
    /// batch, keeping the slot, or `None`, giving it back (also when the
    /// limit fell below the calls in flight: another call is under way and
    /// takes what queues).
    pub(crate) fn next(&self, round_trip: Option<Duration>) -> Option<Vec<Queued>> {
        let mut queue = self.lock();
        if let Some(round_trip) = round_trip {
            let waiting = queue.pending.len();
            queue.window.sample(round_trip, Instant::now(), waiting);
        }
        if queue.in_flight > queue.window.limit() {
            queue.in_flight -= 1;
            return None;
        }
        forget_abandoned(&mut queue);
        let batch = self.take(&mut queue);
        if batch.is_empty() {
            queue.in_flight -= 1;
            return None;
        }
        Some(batch)
    }

    /// Gives back the slot of a call whose drain ended without
    /// [`next`](Self::next) (its task panicked or was dropped with its
    /// runtime), so the queue does not stall.
    pub(crate) fn give_back(&self) {
        let mut queue = self.lock();
        queue.in_flight = queue.in_flight.saturating_sub(1);
    }

    /// The next batch, from the front of the queue: refunds apart from
    /// everything else. A call that gives tokens back is never sent twice
    /// (see [`Batch::run`](super::encode::Batch::run)), so a check batched
    /// with a refund could not be resent after a broken connection either;
    /// refunds go in calls of their own (several together).
    fn take(&self, queue: &mut Queue) -> Vec<Queued> {
        let n = queue.pending.len().min(self.max_batch);
        let refund = |p: &Queued| gives_back(&p.spend);
        let first = queue.pending.first().is_some_and(refund);
        let run = queue
            .pending
            .iter()
            .take(n)
            .take_while(|p| refund(p) == first)
            .count();
        queue.pending.drain(..run).collect()
    }
}

/// Drops the checks whose caller gave up (timed out, went away) rather than
/// send them, so they spend nothing.
fn forget_abandoned(queue: &mut Queue) {
    queue.pending.retain(|p| !p.reply.is_closed());
}

/// What [`Batcher::enqueue`] did with a check.
pub(crate) enum Turn {
    /// Queued: the calls in flight are at the limit, and one of them takes
    /// it into its next batch.
    Wait,
    /// Handed back: a call may start and no other check waits, so its
    /// caller sends it alone, holding the slot.
    Own(Queued),
    /// A call may start and other checks wait: the batch to send now, the
    /// check among them, holding the slot.
    Batch(Vec<Queued>),
}

impl Turn {
    /// Whether a call may start (the caller then holds a slot).
    #[cfg(test)]
    pub(crate) fn starts_a_call(&self) -> bool {
        !matches!(self, Turn::Wait)
    }
}

/// The in-flight slot a call holds in its queue (a drain's, or a lone
/// check's sent by its caller): given back by [`Batcher::next`], or when it
/// is dropped still held (a panic, a task or a caller's future dropped; a
/// caller's future first hands it on to the checks queued behind it, see
/// `drain.rs`).
pub(crate) struct Slot {
    queue: Arc<Batcher>,
    held: bool,
}

impl Slot {
    /// The slot that [`Batcher::enqueue`] handed out with a call to start.
    pub(crate) fn new(queue: Arc<Batcher>) -> Self {
        Slot { queue, held: true }
    }

    /// The queue it is a slot of.
    pub(crate) fn queue(&self) -> &Batcher {
        &self.queue
    }

    /// The next batch for this slot, or `None` with the slot given back;
    /// `round_trip`: what the call that ended took, if it succeeded.
    pub(crate) fn next(&mut self, round_trip: Option<Duration>) -> Option<Vec<Queued>> {
        let next = self.queue.next(round_trip);
        self.held = next.is_some();
        next
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.held {
            self.queue.give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    fn pending(spend: Spend) -> Queued {
        let (reply, _) = oneshot::channel();
        Queued {
            keys: vec!["k".to_owned()],
            policy: Policy::from(Quota::per_second(10).unwrap()),
            spend,
            sent: Instant::now(),
            reply,
        }
    }

    /// Refunds (never resent) and everything else (resent once after a
    /// broken connection) go in calls apart; each kind still batches.
    #[test]
    fn refunds_are_batched_apart_from_checks() {
        let batcher = Batcher::new(10);
        let kinds = [1, 1, -1, -1, 1, -1];
        let mut queue = batcher.lock();
        for delta in kinds {
            queue.pending.push(pending(if delta > 0 {
                Spend::check(1)
            } else {
                Spend::Adjust(-1)
            }));
        }
        let mut sizes = Vec::new();
        while !queue.pending.is_empty() {
            let batch = batcher.take(&mut queue);
            let refunds = batch
                .iter()
                .filter(|p| matches!(p.spend, Spend::Adjust(_)))
                .count();
            assert!(refunds == 0 || refunds == batch.len(), "a mixed batch");
            sizes.push(batch.len());
        }
        assert_eq!(sizes, [2, 2, 1, 1]);
    }
}
