//! Sending what queues: a check waits in its queue for the next script
//! call (`batch.rs`). A lone check goes out from its caller's future; a
//! drain, in a task of its own, sends the queue's batches until it is empty,
//! then hands every check its answer.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::batch::{Batcher, Queued, Slot, Turn, gives_back};
use super::encode::{Batch, SlotOf, Spend};
use super::store::{RedisStore, STORE};
use crate::decision::Decision;
use crate::error::Error;
use crate::observe;
use crate::policy::Policy;
use crate::store::breaker::ProbeGuard;
use crate::store::deny_cache::DenyCache;

/// A decision and its wait, or why there is none.
type CheckResult = Result<(Decision, u64), Error>;

impl RedisStore {
    /// Queues a check for the next script call of `queue` (see `batch.rs`;
    /// `spread`: the queue of a cluster node, see `cluster/nodes.rs`) and waits for
    /// its answer, at most the store timeout. A check alone with a call free
    /// is sent from here (`inline`).
    pub(super) async fn batched(
        &self,
        queue: Arc<Batcher>,
        spread: bool,
        keys: Vec<String>,
        policy: &Policy,
        spend: Spend,
    ) -> CheckResult {
        // A cluster node's own breaker (see `batch.rs`): open, the check
        // fails at once; when its probe is due, this check is it, sent on
        // its own in a task that owns the probe, so a caller that goes away
        // never leaves the node's breaker waiting for an answer.
        match queue.admit() {
            Ok(None) => {}
            // Boxed: rare, and kept out of every check's future.
            Ok(Some(probe)) => return Box::pin(self.probe(probe, keys, policy, spend)).await,
            Err(retry_in) => {
                let err = Error::CircuitOpen { retry_in };
                observe::store_error(STORE, &err, &self.inner.errors);
                return Err(err);
            }
        }
        let (reply, answered) = oneshot::channel();
        let sent = Instant::now();
        let check = Queued {
            keys,
            policy: policy.clone(),
            spend,
            sent,
            reply,
        };
        // The deadline from the clock already read for `sent` (one read of
        // the clock per check, not two); the timeout is at most 60 s (checked
        // when the store is built), so this cannot overflow.
        let deadline = sent + self.inner.timeout;
        let answered = match queue.enqueue(check) {
            Turn::Own(check) => {
                let handoff = Handoff {
                    store: self,
                    slot: Some(Slot::new(queue)),
                    spread,
                };
                // The call ends at `deadline` on its own (see `call.rs`):
                // no second timer around it. Boxed, as the call holds
                // redis-rs's futures (kilobytes), which every queued check's
                // future would otherwise carry too (see the size test in
                // `layer/service.rs`).
                let outcome = Box::pin(self.inline(handoff, check, deadline)).await;
                return self.heard(sent, Ok(Ok(outcome)));
            }
            Turn::Batch(checks) => {
                // The in-flight slot `enqueue` handed out is owned by the
                // drain's future from here on: a task dropped before it first
                // runs (a runtime shutting down) gives it back too, so the
                // queue never stalls.
                let slot = Slot::new(queue);
                let store = self.clone();
                tokio::spawn(async move { store.drain(slot, checks, spread).await });
                answered
            }
            Turn::Wait => answered,
        };
        self.heard(sent, tokio::time::timeout_at(deadline, answered).await)
    }

    /// A check that is a cluster node's probe: sent on its own, in a task
    /// that owns the `probe` and settles it by the answer (or fails it,
    /// dropped), whatever becomes of the caller; the caller waits for the
    /// answer at most the store timeout.
    async fn probe(
        &self,
        probe: ProbeGuard,
        keys: Vec<String>,
        policy: &Policy,
        spend: Spend,
    ) -> CheckResult {
        let (reply, answered) = oneshot::channel();
        let sent = Instant::now();
        let check = Queued {
            keys,
            policy: policy.clone(),
            spend,
            sent,
            reply,
        };
        let store = self.clone();
        tokio::spawn(async move { probe.done(store.alone(check).await) });
        let deadline = sent + self.inner.timeout;
        self.heard(sent, tokio::time::timeout_at(deadline, answered).await)
    }

    /// What the caller of a check sent at `sent` heard: its outcome, the
    /// end of the drain that held it, or its own timeout (waiting in the
    /// queue or in the call). Each check counts towards the breaker by what
    /// its caller saw, once.
    fn heard(
        &self,
        sent: Instant,
        heard: Result<Result<CheckResult, oneshot::error::RecvError>, tokio::time::error::Elapsed>,
    ) -> CheckResult {
        match heard {
            Ok(Ok(Ok(outcome))) => {
                self.inner.breaker.success(sent);
                Ok(outcome)
            }
            Ok(Ok(Err(err))) => {
                if !matches!(err, Error::CircuitOpen { .. }) {
                    self.inner.breaker.failure(sent);
                }
                Err(err)
            }
            Ok(Err(_)) => {
                // The drain that held this check ended without answering it
                // (its task was dropped with its runtime, or panicked): not
                // Redis's doing, so the breaker does not count it.
                let err = Error::store(
                    crate::ErrorKind::Server,
                    "the batch of this check was dropped",
                );
                observe::store_error(STORE, &err, &self.inner.errors);
                Err(err)
            }
            Err(_) => {
                // The caller waited the whole timeout (in the queue or in the
                // call): for the breaker, as for the caller, a timeout.
                self.inner.breaker.failure(sent);
                let err = Error::Timeout(self.inner.timeout);
                observe::store_error(STORE, &err, &self.inner.errors);
                Err(err)
            }
        }
    }

    /// Sends the caller's `check` alone, from the caller's future: one round
    /// of [`drain`](Self::drain) that answers the caller directly, without a
    /// task or a channel. The call ends at the caller's `deadline` (a timeout
    /// there still tells the connection, see `call.rs`); the checks that
    /// queued meanwhile go to a drain when it ends, or when this future is
    /// dropped before (`handoff`).
    async fn inline(
        &self,
        mut handoff: Handoff<'_>,
        check: Queued,
        deadline: Instant,
    ) -> CheckResult {
        let once = gives_back(&check.spend);
        let mut checks = [check];
        // One check: no spread call and nothing apart, on a cluster node's
        // queue too; the production script decides it, routed by its slot,
        // and never answers that the node does not serve it.
        let mut batch = batch_of(&mut checks, None);
        let script = &self.inner.script;
        let call = &batch;
        let started = Instant::now();
        // Never the breaker's probe, as in a drain.
        let outcome = self
            .admitted_reading(
                self.inner.breaker.admit_without_probe(),
                0,
                Some(deadline),
                |conn| async move { call.run(&mut conn.for_call(once)?, script).await },
                |reply| self.read_one(call, &reply),
            )
            .await;
        let round_trip = outcome.is_ok().then(|| started.elapsed());
        if let (Some(slot), Some(ok)) = (&handoff.slot, node_ok(&outcome)) {
            slot.queue().heard(started, ok);
        }
        if outcome.is_err() {
            // A failover or a replaced connection may have moved slots:
            // read the map again.
            self.refresh_slots();
        }
        let [check] = checks;
        if let (Ok((decision, _)), Some(cache), Some(keys)) = (
            &outcome,
            self.inner.denials.as_ref(),
            batch.take_keys().pop(),
        ) {
            remember(cache, keys, check.spend, decision, check.sent);
        }
        handoff.pass(round_trip);
        outcome
    }

    /// Sends `checks`, then whatever queued meanwhile, until `queue` is
    /// empty. `spread`: a cluster node's queue, whose batches may hold
    /// clients of several slots.
    async fn drain(&self, mut slot: Slot, mut checks: Vec<Queued>, spread: bool) {
        let nodes = self.inner.nodes.as_deref().filter(|_| spread);
        loop {
            if let Some(nodes) = nodes {
                for check in nodes.apart(&mut checks) {
                    let store = self.clone();
                    tokio::spawn(async move { store.alone(check).await });
                }
            }
            // One check needs no spread call: the production script decides
            // it, routed by its own slot.
            // The node's breaker opened meanwhile: what queued fails at once.
            if let Some(retry_in) = slot.queue().refusing() {
                answer(
                    checks,
                    Err(Error::CircuitOpen { retry_in }),
                    self.inner.denials.as_ref(),
                );
                match slot.next(None) {
                    Some(next) => {
                        checks = next;
                        continue;
                    }
                    None => return,
                }
            }
            let spread = nodes.filter(|_| checks.len() > 1).map(|n| n.spread());
            // Refunds are batched apart (see `batch.rs`).
            let once = checks.first().is_some_and(|c| gives_back(&c.spend));
            let mut batch = batch_of(&mut checks, spread.map(|(_, slot_of)| slot_of));
            let script = spread.map_or(&self.inner.script, |(script, _)| script);
            let call = &batch;
            let started = Instant::now();
            // A batch never takes the breaker's probe: its checks would all
            // wait for it. `None`: the node does not serve every key.
            let reply = self
                .admitted_reading(
                    self.inner.breaker.admit_without_probe(),
                    0,
                    None,
                    |conn| async move { call.run(&mut conn.for_call(once)?, script).await },
                    |reply| {
                        if call.not_local(&reply) {
                            Ok(None)
                        } else {
                            self.read(call, &reply).map(Some)
                        }
                    },
                )
                .await;
            // What the call took, for the queue's in-flight limit; a failed
            // call teaches nothing about round trips.
            let round_trip = reply.is_ok().then(|| started.elapsed());
            if let Some(ok) = node_ok(&reply) {
                slot.queue().heard(started, ok);
            }
            // The checks' keys back, for the deny cache and for checks sent
            // on their own.
            for (check, keys) in checks.iter_mut().zip(batch.take_keys()) {
                check.keys = keys;
            }
            match reply {
                Ok(None) => {
                    // The node does not serve every key (the slot map is
                    // stale); nothing was written.
                    for check in checks {
                        let store = self.clone();
                        tokio::spawn(async move { store.alone(check).await });
                    }
                    self.refresh_slots();
                }
                Ok(Some(outcomes)) => answer(checks, Ok(outcomes), self.inner.denials.as_ref()),
                Err(err) => {
                    // A failover or a replaced connection may have moved
                    // slots: read the map again.
                    self.refresh_slots();
                    answer(checks, Err(err), self.inner.denials.as_ref());
                }
            }
            match slot.next(round_trip) {
                Some(next) => checks = next,
                None => return,
            }
        }
    }

    /// Sends one check of a batch on its own, routed by its slot; whether
    /// the store answered it (for a node's probe).
    async fn alone(&self, check: Queued) -> bool {
        if check.reply.is_closed() {
            return false;
        }
        let once = gives_back(&check.spend);
        let mut checks = vec![check];
        let mut batch = batch_of(&mut checks, None);
        let script = &self.inner.script;
        let call = &batch;
        // Sent on its own, but for the checks of a batch: never the probe.
        let outcomes = self
            .admitted_reading(
                self.inner.breaker.admit_without_probe(),
                0,
                None,
                |conn| async move { call.run(&mut conn.for_call(once)?, script).await },
                |reply| self.read(call, &reply),
            )
            .await;
        for (check, keys) in checks.iter_mut().zip(batch.take_keys()) {
            check.keys = keys;
        }
        let answered = !matches!(&outcomes, Err(e) if e.is_store_error());
        answer(checks, outcomes, self.inner.denials.as_ref());
        answered
    }

    /// On a cluster, reads the slot map again in the background (at most one
    /// read at a time, spaced; see `cluster/`); elsewhere nothing.
    pub(super) fn refresh_slots(&self) {
        if let Some(nodes) = &self.inner.nodes {
            nodes.refresh(self);
        }
    }
}

/// What a call's outcome (its reply, read) tells a cluster node's breaker:
/// `None` when the call was not made (the store's breaker refused it). A
/// reply that does not read is a failure, as for the store's breaker.
fn node_ok<T>(outcome: &Result<T, Error>) -> Option<bool> {
    match outcome {
        Ok(_) => Some(true),
        Err(Error::CircuitOpen { .. }) => None,
        Err(e) => Some(!e.is_store_error()),
    }
}

/// The in-flight slot of a lone check's call, held by its caller's future:
/// when the call ends, or when that future is dropped before (its caller
/// went away or timed out), the checks queued behind the call go out in a
/// drain of their own rather than wait for a call that never ends.
struct Handoff<'a> {
    store: &'a RedisStore,
    slot: Option<Slot>,
    spread: bool,
}

impl Handoff<'_> {
    /// Hands the slot to a drain of what queued meanwhile, or gives it back
    /// if nothing did; `round_trip`: what the call took, if it succeeded.
    fn pass(&mut self, round_trip: Option<Duration>) {
        let Some(mut slot) = self.slot.take() else {
            return;
        };
        // Without a runtime no drain can start: the slot goes back, and what
        // queued goes out with the next call that starts.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if let Some(checks) = slot.next(round_trip) {
            let (store, spread) = (self.store.clone(), self.spread);
            runtime.spawn(async move { store.drain(slot, checks, spread).await });
        }
    }
}

impl Drop for Handoff<'_> {
    fn drop(&mut self) {
        self.pass(None);
    }
}

/// The script call for `checks`, in order; `spread` for clients in several
/// slots of one cluster node (see `cluster/nodes.rs`). The checks' keys move into
/// the batch: [`Batch::take_keys`] hands them back after the call.
pub(crate) fn batch_of(checks: &mut [Queued], spread: Option<SlotOf>) -> Batch {
    let mut batch = Batch::with_capacity(checks.len(), None, spread);
    for c in checks {
        batch.push(std::mem::take(&mut c.keys), &c.policy, &c.spend);
    }
    batch
}

/// Hands every check its answer: `outcomes` in order, or a copy of `error`;
/// denials of plain checks go into `denials` first, and a check that spent
/// forgets the denial cached for its buckets.
pub(crate) fn answer(
    checks: Vec<Queued>,
    outcomes: Result<Vec<(Decision, u64)>, Error>,
    denials: Option<&DenyCache>,
) {
    match outcomes {
        Ok(outcomes) => {
            for (check, outcome) in checks.into_iter().zip(outcomes) {
                if let Some(cache) = denials {
                    remember(cache, check.keys, check.spend, &outcome.0, check.sent);
                }
                // A caller that gave up (timed out) no longer listens.
                let _ = check.reply.send(Ok(outcome));
            }
        }
        Err(error) => {
            for check in checks {
                let _ = check.reply.send(Err(copy(&error)));
            }
        }
    }
}

/// What the deny cache learns from `decision`, the answer to `spend` on
/// `keys` sent at `sent`: a denied check is remembered; spending forgets
/// what was, and so do a refund (tokens came back) and a charge (the wait
/// it remembered is now longer).
pub(crate) fn remember(
    cache: &DenyCache,
    keys: Vec<String>,
    spend: Spend,
    decision: &Decision,
    sent: Instant,
) {
    match spend {
        // A refund: tokens came back, a remembered denial may be wrong now.
        Spend::Adjust(delta) if delta < 0 => cache.forget(&keys),
        // A charge: a remembered wait would understate the new one.
        Spend::Adjust(_) => cache.spent(&keys),
        Spend::Take { cost, .. } if decision.allowed() => {
            if cost > 0 {
                cache.spent(&keys);
            }
        }
        Spend::Take { cost, max_wait_us } => {
            if max_wait_us == 0 {
                cache.insert(keys, cost, decision, sent);
            }
        }
        // A lease is a check that may also hold tokens.
        Spend::Lease { .. } if decision.allowed() => cache.spent(&keys),
        Spend::Lease { cost, .. } => cache.insert(keys, cost, decision, sent),
        // Held tokens released: a remembered denial may be wrong now.
        Spend::Report { .. } => cache.forget(&keys),
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
    use crate::quota::Quota;
    use crate::store::Store;

    /// A batched check that finds a free call slot takes it: a lone check's
    /// caller sends the call itself, and the checks that queue behind it go
    /// to a drain spawned when that call ends, or when the caller's future
    /// is dropped before. A caller's future dropped mid-call, and a drain
    /// task dropped before it first runs (its runtime shut down), must each
    /// give their slot back: a store keeps two, and with both lost every
    /// later check of the store would wait in the queue until its timeout,
    /// for good.
    #[test]
    fn a_drain_task_dropped_before_it_runs_gives_its_call_slot_back() {
        use std::task::{Context, Waker};
        // Built without connecting: no call ever gets through, nothing is
        // sent.
        let store = RedisStore::from_url("redis://127.0.0.1:1").unwrap();
        let policy = Policy::from(Quota::per_second(10).unwrap());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            // One poll each: the first two take both call slots and wait for
            // the connection, the third queues behind them.
            let mut first = Box::pin(store.check("a", &policy, 1));
            let mut second = std::pin::pin!(store.check("b", &policy, 1));
            let mut queued = std::pin::pin!(store.check("c", &policy, 1));
            for check in [first.as_mut(), second.as_mut(), queued.as_mut()] {
                let pending = check
                    .poll(&mut Context::from_waker(Waker::noop()))
                    .is_pending();
                assert!(pending, "answered without a call");
            }
            // The first caller goes away mid-call: its slot goes to a drain
            // of the queued check, spawned, but the block ends (dropping the
            // other two callers) before the runtime runs it.
            drop(first);
        });
        // Shutting down drops the drain's task unpolled.
        drop(runtime);
        // Both slots are free again: a slot lost on either path would show.
        let batcher = store.inner.batcher.as_ref().unwrap();
        let mut answers = Vec::new();
        for _ in 0..super::super::window::MIN_IN_FLIGHT {
            let (reply, answered) = tokio::sync::oneshot::channel();
            answers.push(answered);
            let check = Queued {
                keys: vec!["{a}".into()],
                policy: policy.clone(),
                spend: Spend::check(1),
                sent: Instant::now(),
                reply,
            };
            assert!(
                batcher.enqueue(check).starts_a_call(),
                "a new check no longer finds a free call slot"
            );
        }
    }
}
