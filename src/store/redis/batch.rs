//! Opportunistic batching: checks that arrive while calls are in flight on the
//! store's connection wait for the next call and go together, in one script
//! call that decides them in order.
//!
//! - **No added latency at low load.** With fewer than [`MAX_IN_FLIGHT`] calls
//!   under way (one per primary on a cluster of several), a check goes out at
//!   once, with whatever is queued.
//! - **Under load**, checks queue while calls are in flight; when a call ends,
//!   the queue (up to the batch size) goes out as the next call.
//! - Calls are sent from a task of their own, so a caller that gives up (a
//!   client that went away) never strands the checks batched with its own.
//! - **Bounded waits without a timer per check.** A check's deadline is when
//!   it was queued plus the store timeout. The task sending a call answers
//!   each of its checks whose deadline passes first with a timeout, and
//!   answers a check that waited in the queue past its deadline without
//!   sending it; a check never waits in the queue for longer than the call
//!   before it, which is bounded from its start. So no caller waits longer
//!   than the timeout, with one timer per call instead of one per check.
//! - **Same answers.** The script decides the batch's checks in order, each
//!   seeing the buckets as the ones before it left them, all with one Redis
//!   `TIME`: the same answers as the checks sent one by one at that instant.
//! - **Redis Cluster** runs every key of one script call on one node, so a
//!   store on a cluster keeps one queue like this per primary and batches the
//!   checks of the slots that primary serves (see `nodes.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::script::Batch;
use crate::error::Error;
use crate::store::deny_cache::DenyCache;
use crate::{Decision, Policy};

/// Script calls of one store in flight at once before checks start to queue:
/// two, so Redis never waits for the next batch while one's reply travels.
pub(crate) const MAX_IN_FLIGHT: usize = 2;

/// What a check's caller receives: the decision and its wait, or why there
/// is none.
pub(crate) type Answer = Result<(Decision, u64), Error>;

/// One check waiting for its call.
pub(crate) struct Pending {
    pub(crate) keys: Vec<String>,
    pub(crate) policy: Policy,
    pub(crate) cost: u64,
    pub(crate) max_wait_us: u64,
    /// When the check was queued: before Redis decides it. Its deadline is
    /// this plus the store timeout.
    pub(crate) sent: Instant,
    /// Where the answer goes; `None` once answered (a check can be answered
    /// with a timeout while its call goes on).
    pub(crate) reply: Option<oneshot::Sender<Answer>>,
}

impl Pending {
    /// True while the check has no answer and its caller still listens.
    pub(crate) fn waiting(&self) -> bool {
        self.reply.as_ref().is_some_and(|reply| !reply.is_closed())
    }

    /// Answers the check, once; a caller that went away no longer listens.
    pub(crate) fn respond(&mut self, answer: Answer) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(answer);
        }
    }
}

/// The queue of one store.
#[derive(Default)]
pub(crate) struct Queue {
    pending: Vec<Pending>,
    in_flight: usize,
}

/// Queues and sends the checks of one store.
pub(crate) struct Batcher {
    queue: Mutex<Queue>,
    max_batch: usize,
    /// Calls at once: [`MAX_IN_FLIGHT`], or fewer (see `nodes.rs`).
    max_in_flight: AtomicUsize,
}

impl Batcher {
    pub(crate) fn new(max_batch: usize) -> Self {
        Batcher {
            queue: Mutex::new(Queue::default()),
            max_batch: max_batch.max(1),
            max_in_flight: AtomicUsize::new(MAX_IN_FLIGHT),
        }
    }

    /// Sets the calls at once (at least one); calls already in flight go on.
    #[cfg(feature = "cluster")]
    pub(crate) fn set_max_in_flight(&self, calls: usize) {
        self.max_in_flight.store(calls.max(1), Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `check`; returns the batch to send now if a call may start, the
    /// caller then owning one in-flight slot.
    pub(crate) fn enqueue(&self, check: Pending) -> Option<Vec<Pending>> {
        let mut queue = self.lock();
        queue.pending.push(check);
        if queue.in_flight >= self.max_in_flight.load(Ordering::Relaxed) {
            return None;
        }
        queue.in_flight += 1;
        Some(self.take(&mut queue))
    }

    /// After a call ends: the next batch, keeping the slot, or `None`, giving
    /// it back (also when the limit fell below the calls in flight: another
    /// call is under way and takes what queues).
    pub(crate) fn next(&self) -> Option<Vec<Pending>> {
        let mut queue = self.lock();
        if queue.in_flight > self.max_in_flight.load(Ordering::Relaxed) {
            queue.in_flight -= 1;
            return None;
        }
        let batch = self.take(&mut queue);
        if batch.is_empty() {
            queue.in_flight -= 1;
            return None;
        }
        Some(batch)
    }

    /// Gives back the slot of a call whose drain ended without
    /// [`next`](Self::next) (its task panicked or was dropped with its
    /// runtime), so the queue does not stall. With no other call left to
    /// take them, the queued checks are dropped: their callers get an error
    /// at once instead of waiting for a drain that will not come (a drain
    /// answers its checks' deadlines; nothing else does).
    pub(crate) fn give_back(&self) {
        let stranded = {
            let mut queue = self.lock();
            queue.in_flight = queue.in_flight.saturating_sub(1);
            if queue.in_flight == 0 {
                std::mem::take(&mut queue.pending)
            } else {
                Vec::new()
            }
        };
        // Dropped outside the lock: dropping a reply wakes its caller.
        drop(stranded);
    }

    /// The next batch: checks whose caller went away are dropped rather
    /// than sent, so they spend nothing.
    fn take(&self, queue: &mut Queue) -> Vec<Pending> {
        queue.pending.retain(Pending::waiting);
        let n = queue.pending.len().min(self.max_batch);
        queue.pending.drain(..n).collect()
    }
}

/// The in-flight slot a drain holds in its queue: given back when the drain
/// ends early (a panic, its task dropped), or by [`Batcher::next`].
pub(crate) struct Slot {
    queue: Arc<Batcher>,
    held: bool,
}

impl Slot {
    /// The slot that [`Batcher::enqueue`] handed out with a batch.
    pub(crate) fn new(queue: Arc<Batcher>) -> Self {
        Slot { queue, held: true }
    }

    /// The next batch for this slot, or `None` with the slot given back.
    pub(crate) fn next(&mut self) -> Option<Vec<Pending>> {
        let next = self.queue.next();
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

/// The script call for `checks`, in order; `spread` for clients in several
/// slots of one cluster node (see `nodes.rs`). The checks' keys move into
/// the batch: [`Batch::take_keys`] hands them back after the call.
pub(crate) fn batch_of(checks: &mut [Pending], spread: bool) -> Batch {
    let mut batch = Batch::with_capacity(checks.len(), spread);
    for c in checks {
        batch.push(
            std::mem::take(&mut c.keys),
            &c.policy,
            c.cost,
            c.max_wait_us,
        );
    }
    batch
}

/// Hands every check its answer: `outcomes` in order, or a copy of `error`;
/// denials of plain checks go into `denials` first.
pub(crate) fn answer(
    checks: Vec<Pending>,
    outcomes: Result<Vec<(Decision, u64)>, Error>,
    denials: Option<&DenyCache>,
) {
    match outcomes {
        Ok(outcomes) => {
            for (mut check, outcome) in checks.into_iter().zip(outcomes) {
                let reply = check.reply.take();
                // Redis decided, even for a check already answered with a
                // timeout: its denial is as true as any.
                if let Some(cache) = denials
                    && !outcome.0.allowed()
                    && check.max_wait_us == 0
                {
                    cache.insert(check.keys, check.cost, &outcome.0, check.sent);
                }
                if let Some(reply) = reply {
                    let _ = reply.send(Ok(outcome));
                }
            }
        }
        Err(error) => {
            for mut check in checks {
                check.respond(Err(copy(&error)));
            }
        }
    }
}

/// The same failure again, for the next check of a failed batch.
fn copy(error: &Error) -> Error {
    match error {
        Error::Timeout(t) => Error::Timeout(*t),
        Error::CircuitOpen { retry_in } => Error::CircuitOpen {
            retry_in: *retry_in,
        },
        Error::CostExceedsCapacity { cost, capacity } => Error::CostExceedsCapacity {
            cost: *cost,
            capacity: *capacity,
        },
        Error::Store(inner) => Error::store(error.kind(), inner.to_string()),
        other => Error::store(other.kind(), other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A check and where its answer would go.
    fn pending() -> (Pending, oneshot::Receiver<Answer>) {
        let (reply, answered) = oneshot::channel();
        let check = Pending {
            keys: vec!["{a}".into()],
            policy: Policy::from(crate::Quota::per_second(1).unwrap()),
            cost: 1,
            max_wait_us: 0,
            sent: Instant::now(),
            reply: Some(reply),
        };
        (check, answered)
    }

    /// Checks have no timer of their own: a drain that dies (a panic, its
    /// task dropped) with no other call in flight must not leave queued
    /// checks waiting for a drain that will never come.
    #[test]
    fn checks_queued_when_the_last_drain_dies_are_answered_at_once() {
        let queue = Arc::new(Batcher::new(8));
        let mut sent = Vec::new();
        let mut queued = Vec::new();
        for i in 0..4 {
            let (check, answered) = pending();
            let batch = queue.enqueue(check);
            if i < MAX_IN_FLIGHT {
                sent.push((batch.expect("a call starts"), answered));
            } else {
                assert!(batch.is_none(), "queued behind the calls in flight");
                queued.push(answered);
            }
        }
        // One drain dies: the other call is still in flight and will take
        // the queued checks, so they stay.
        drop(Slot::new(Arc::clone(&queue)));
        for answered in &mut queued {
            assert!(matches!(
                answered.try_recv(),
                Err(oneshot::error::TryRecvError::Empty)
            ));
        }
        // The last one dies too: nobody is left to send them.
        drop(Slot::new(Arc::clone(&queue)));
        for answered in &mut queued {
            assert!(
                matches!(
                    answered.try_recv(),
                    Err(oneshot::error::TryRecvError::Closed)
                ),
                "a queued check still waits"
            );
        }
        // The queue works again.
        let (check, _answered) = pending();
        assert!(queue.enqueue(check).is_some());
        drop(sent);
    }

    #[test]
    fn a_check_answered_early_is_answered_once() {
        let (mut check, mut answered) = pending();
        assert!(check.waiting());
        check.respond(Err(Error::Timeout(std::time::Duration::from_millis(5))));
        assert!(!check.waiting());
        answer(
            vec![check],
            Err(Error::store(crate::ErrorKind::Server, "late")),
            None,
        );
        assert!(matches!(answered.try_recv(), Ok(Err(Error::Timeout(_)))));
    }
}
