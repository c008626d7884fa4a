//! Where a check goes ([`RedisStore::send`]: into a queue, or in a call of
//! its own) and [`Sending`], the future of a check on its way to Redis.
//!
//! A named future instead of an `async fn`: a check that the layer could not
//! decide in `call` is boxed with everything it awaits, and every `async fn`
//! between the layer and the batch keeps its own copy of its arguments for as
//! long as the check waits. With the route chosen before the future is made,
//! the box holds the batched wait itself and nothing around it (see the size
//! test in `layer/service.rs`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::sync::Arc;

use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::batch::gives_back;
use super::connection::RESENDS;
use super::drain::remember;
use super::encode::{Batch, Spend};
use super::store::{RedisStore, STORE};
use crate::decision::Decision;
use crate::error::Error;
use crate::observe;
use crate::policy::Policy;
use crate::store::breaker::Admit;
/// A boxed future of a decision and its wait.
pub(crate) type Boxed<'a> =
    Pin<Box<dyn Future<Output = Result<(Decision, u64), Error>> + Send + 'a>>;

pin_project! {
    /// A check queued for the next batched call (`B`), or anything else,
    /// boxed: a call of its own (its redis-rs futures are kilobytes, and
    /// rare) or an answer known before anything was sent.
    #[project = SendingProj]
    pub(crate) enum Sending<'a, B> {
        Batched { #[pin] future: B },
        Alone { future: Boxed<'a> },
    }
}

impl<B> Sending<'_, B> {
    /// A future that answers `error` at once (a path no check should take).
    pub(crate) fn failed(error: Error) -> Self {
        Sending::Alone {
            future: Box::pin(std::future::ready(Err(error))),
        }
    }
}

impl<B> Future for Sending<'_, B>
where
    B: Future<Output = Result<(Decision, u64), Error>>,
{
    type Output = Result<(Decision, u64), Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            SendingProj::Batched { future } => future.poll(cx),
            SendingProj::Alone { future } => future.as_mut().poll(cx),
        }
    }
}

impl RedisStore {
    /// Sends a validated check or reservation on `keys` (batched when it
    /// can be) and remembers a denial of a plain check in the deny cache.
    /// A check that [`check_now`](Self::check_now) could not answer is sent
    /// with `max_wait_us` 0 and no `clock`.
    ///
    /// The route is chosen here, before anything is awaited (see the module
    /// docs); nothing is sent until the future is polled.
    pub(crate) fn send<'a>(
        &'a self,
        keys: Vec<String>,
        policy: &'a Policy,
        spend: Spend,
        clock: Option<u64>,
    ) -> Sending<'a, impl Future<Output = Result<(Decision, u64), Error>> + Send + 'a> {
        // Refused before anything is sent or counted: no client under the
        // store would send it once at most.
        if gives_back(&spend) && self.inner.link.resends() {
            let err = Error::store(
                crate::ErrorKind::Server,
                format!("Redis at {}: {RESENDS}", self.inner.link.host()),
            );
            observe::store_error(STORE, &err, &self.inner.errors);
            return Sending::failed(err);
        }
        // Batch only while the breaker is closed: when it is open, a check is
        // answered at once (or is the probe) instead of queueing behind calls
        // that may hang.
        let may_batch = clock.is_none() && self.inner.breaker.is_closed();
        if may_batch && let Some(batcher) = &self.inner.batcher {
            let queue = Arc::clone(batcher);
            return Sending::Batched {
                future: self.batched(queue, false, keys, policy, spend),
            };
        }
        // On a cluster, into the queue of the node that serves the client's
        // slot; sent on its own until the store has a slot map.
        if may_batch && let Some(nodes) = &self.inner.nodes {
            match keys.first().and_then(|key| nodes.queue_for(key)) {
                Some(queue) => {
                    return Sending::Batched {
                        future: self.batched(queue, true, keys, policy, spend),
                    };
                }
                None => self.refresh_slots(),
            }
        }
        // Boxed: the call on its own holds redis-rs's futures, about 2 KB,
        // which would otherwise be part of every batched check's future too.
        Sending::Alone {
            future: Box::pin(self.send_alone(keys, policy, spend, clock)),
        }
    }

    /// A check or reservation in a script call of its own: batching is off,
    /// the breaker is not closed, a cluster store has no slot map yet, or
    /// `clock` is set (tests).
    async fn send_alone(
        &self,
        keys: Vec<String>,
        policy: &Policy,
        spend: Spend,
        clock: Option<u64>,
    ) -> Result<(Decision, u64), Error> {
        // The deny cache learns from checks and reservations that may spend
        // or be denied, and from refunds; a test clock's decisions never
        // touch it.
        let once = gives_back(&spend);
        let learns = clock.is_none()
            && !matches!(spend, Spend::Take { cost: 0, .. })
            && self.inner.denials.is_some();
        let remembered = learns.then(|| keys.clone());
        let sent = Instant::now();
        let mut batch = Batch::new(clock);
        batch.push(keys, policy, &spend);
        let outcome = match self.inner.breaker.admit() {
            Admit::Probe(probe) => self.send_probe(probe, Arc::new(batch), clock, once).await?,
            admit => {
                let script = self.script_for(clock);
                let call = &batch;
                self.admitted_reading(
                    admit,
                    1,
                    None,
                    |conn| async move { call.run(&mut conn.for_call(once)?, script).await },
                    |reply| self.read_one(call, &reply),
                )
                .await?
            }
        };
        if let (Some(cache), Some(keys)) = (&self.inner.denials, remembered) {
            remember(cache, keys, spend, &outcome.0, sent);
        }
        Ok(outcome)
    }
}
