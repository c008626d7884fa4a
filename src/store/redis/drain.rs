//! Sending what queues: a check waits in its queue for the next script
//! call (`batch.rs`), and a drain, in a task of its own, sends the queue's
//! batches until it is empty, then hands every check its answer.

use std::sync::Arc;

use tokio::time::Instant;

use super::batch::{Batcher, Pending, Slot};
use super::encode::{Batch, SlotOf, Spend};
use super::store::{RedisStore, STORE};
use crate::decision::Decision;
use crate::error::Error;
use crate::observe;
use crate::policy::Policy;
use crate::store::deny_cache::DenyCache;
impl RedisStore {
    /// Queues a check for the next script call of `queue` (see `batch.rs`;
    /// `spread`: the queue of a cluster node, see `cluster/nodes.rs`) and waits for
    /// its answer, at most the store timeout.
    pub(super) async fn batched(
        &self,
        queue: Arc<Batcher>,
        spread: bool,
        keys: Vec<String>,
        policy: &Policy,
        spend: Spend,
    ) -> Result<(Decision, u64), Error> {
        let (reply, answered) = tokio::sync::oneshot::channel();
        let sent = Instant::now();
        let check = Pending {
            keys,
            policy: policy.clone(),
            spend,
            sent,
            reply,
        };
        if let Some(checks) = queue.enqueue(check) {
            // The in-flight slot `enqueue` handed out is owned by the drain's
            // future from here on: a task dropped before it first runs (a
            // runtime shutting down) gives it back too, so the queue never
            // stalls.
            let slot = Slot::new(queue);
            let store = self.clone();
            tokio::spawn(async move { store.drain(slot, checks, spread).await });
        }
        // Each check counts towards the breaker by what its caller saw: an
        // answer, a failure, or its own timeout (waiting in the queue or in
        // the call), once.
        // The deadline from the clock already read for `sent` (one read of
        // the clock per check, not two); the timeout is at most 60 s (checked
        // when the store is built), so this cannot overflow.
        let deadline = sent + self.inner.timeout;
        match tokio::time::timeout_at(deadline, answered).await {
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

    /// Sends `checks`, then whatever queued meanwhile, until `queue` is
    /// empty. `spread`: a cluster node's queue, whose batches may hold
    /// clients of several slots.
    async fn drain(&self, mut slot: Slot, mut checks: Vec<Pending>, spread: bool) {
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
            let spread = nodes.filter(|_| checks.len() > 1).map(|n| n.spread());
            let mut batch = batch_of(&mut checks, spread.map(|(_, slot_of)| slot_of));
            let script = spread.map_or(&self.inner.script, |(script, _)| script);
            let call = &batch;
            let started = Instant::now();
            // A batch never takes the breaker's probe: its checks would all
            // wait for it.
            let reply = self
                .admitted(
                    self.inner.breaker.admit_without_probe(),
                    0,
                    |mut conn| async move { call.run(&mut conn, script).await },
                )
                .await;
            // What the call took, for the queue's in-flight limit; a failed
            // call teaches nothing about round trips.
            let round_trip = reply.is_ok().then(|| started.elapsed());
            // The checks' keys back, for the deny cache and for checks sent
            // on their own.
            for (check, keys) in checks.iter_mut().zip(batch.take_keys()) {
                check.keys = keys;
            }
            match reply {
                Ok(reply) if batch.not_local(&reply) => {
                    // The node does not serve every key (the slot map is
                    // stale); nothing was written.
                    for check in checks {
                        let store = self.clone();
                        tokio::spawn(async move { store.alone(check).await });
                    }
                    self.refresh_slots();
                }
                Ok(reply) => answer(
                    checks,
                    self.read(&batch, &reply),
                    self.inner.denials.as_ref(),
                ),
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

    /// Sends one check of a batch on its own, routed by its slot.
    async fn alone(&self, check: Pending) {
        if check.reply.is_closed() {
            return;
        }
        let mut checks = vec![check];
        let mut batch = batch_of(&mut checks, None);
        let script = &self.inner.script;
        let call = &batch;
        // Sent on its own, but for the checks of a batch: never the probe.
        let outcomes = self
            .admitted(
                self.inner.breaker.admit_without_probe(),
                0,
                |mut conn| async move { call.run(&mut conn, script).await },
            )
            .await
            .and_then(|reply| self.read(&batch, &reply));
        for (check, keys) in checks.iter_mut().zip(batch.take_keys()) {
            check.keys = keys;
        }
        answer(checks, outcomes, self.inner.denials.as_ref());
    }

    /// On a cluster, reads the slot map again in the background (at most one
    /// read at a time, spaced; see `cluster/`); elsewhere nothing.
    pub(super) fn refresh_slots(&self) {
        if let Some(nodes) = &self.inner.nodes {
            nodes.refresh(self);
        }
    }
}

/// The script call for `checks`, in order; `spread` for clients in several
/// slots of one cluster node (see `cluster/nodes.rs`). The checks' keys move into
/// the batch: [`Batch::take_keys`] hands them back after the call.
pub(crate) fn batch_of(checks: &mut [Pending], spread: Option<SlotOf>) -> Batch {
    let mut batch = Batch::with_capacity(checks.len(), None, spread);
    for c in checks {
        batch.push(std::mem::take(&mut c.keys), &c.policy, c.spend);
    }
    batch
}

/// Hands every check its answer: `outcomes` in order, or a copy of `error`;
/// denials of plain checks go into `denials` first, and a check that spent
/// forgets the denial cached for its buckets.
pub(crate) fn answer(
    checks: Vec<Pending>,
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

    /// A batched check that finds a free call slot takes it and spawns the
    /// task that sends the call. A task dropped before it first runs (its
    /// runtime shut down) must give the slot back: a store keeps two, and
    /// with both lost every later check of the store would wait in the queue
    /// until its timeout, for good.
    #[test]
    fn a_drain_task_dropped_before_it_runs_gives_its_call_slot_back() {
        use std::task::{Context, Waker};
        // Built without connecting: the drain never runs, nothing is sent.
        let store = RedisStore::from_url("redis://127.0.0.1:1").unwrap();
        let policy = Policy::from(Quota::per_second(10).unwrap());
        for _ in 0..super::super::window::MIN_IN_FLIGHT + 1 {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                // One poll: the check is queued and its drain spawned, but the
                // block ends before the runtime runs the drain.
                let mut check = std::pin::pin!(store.check("a", &policy, 1));
                let pending = check
                    .as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
                    .is_pending();
                assert!(pending, "answered without a call");
            });
            // Shutting down drops the drain's task unpolled.
            drop(runtime);
        }
        let batcher = store.inner.batcher.as_ref().unwrap();
        let (reply, _answered) = tokio::sync::oneshot::channel();
        let check = Pending {
            keys: vec!["{a}".into()],
            policy,
            spend: Spend::check(1),
            sent: Instant::now(),
            reply,
        };
        assert!(
            batcher.enqueue(check).is_some(),
            "a new check no longer finds a free call slot"
        );
    }
}
