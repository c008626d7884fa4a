//! Deciding a check for [`RateLimiter::check`] and the layer: the store
//! first, its fallback while it fails, each decision reported; and the
//! named future of a check sent to the store ([`Pending`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;

use super::decided::{Decided, fell_back, report};
use super::{RateLimiter, ToSend};
use crate::decision::{Decision, Reservation};
use crate::error::Error;
use crate::fallback::Fallback;
use crate::observe::{self, Outcome};
use crate::policy::Policy;
use crate::store::Store;

/// Deciding a check for [`RateLimiter::check`] and the layer: the store
/// first, its fallback while it fails, each decision reported.
impl RateLimiter {
    /// A check under `policy` (the layer chooses one per request), falling back
    /// when the store fails, and reported to tracing and metrics under
    /// `key_kind` (never the key itself).
    pub(crate) async fn decide(
        &self,
        key: &str,
        key_kind: &str,
        policy: &Policy,
        cost: u64,
    ) -> Decided {
        match self.decide_now(key, key_kind, policy, cost) {
            Ok(decided) => decided,
            // Boxed: a Redis call's future would otherwise grow every
            // check's future, the memory store's too.
            Err(unsent) => Box::pin(self.send(unsent, key, key_kind, policy, cost)).await,
        }
    }

    /// [`decide`](Self::decide) as far as it goes without waiting: the
    /// decision when the store has it at once (a memory store; a Redis
    /// store's deny cache), else what is left to [`send`](Self::send).
    /// Nothing has been sent then.
    pub(crate) fn decide_now(
        &self,
        key: &str,
        key_kind: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decided, ToSend> {
        let result = self.store.check_now(key, policy, cost).map_err(ToSend)?;
        // A decision made at once by a store that has to be asked otherwise is
        // a remembered denial: the store did not answer, so a fallback that
        // decides while it fails goes on deciding.
        let fresh = self.store.as_memory().is_some();
        Ok(self.conclude(result, fresh, key, key_kind, policy, cost))
    }

    /// What [`decide_now`](Self::decide_now) left, as one named future that
    /// owns the rest of the check: the store's own future (nothing sent
    /// until it is polled), then the fallback and the reports. The layer
    /// boxes this for a request it could not decide in `call`; a named
    /// future keeps no copy of the arguments beside the store's.
    pub(crate) fn send<'a>(
        &'a self,
        ToSend(unsent): ToSend,
        key: &'a str,
        key_kind: &'a str,
        policy: &'a Policy,
        cost: u64,
    ) -> Pending<'a, impl Future<Output = Result<(Decision, u64), Error>> + Send + 'a> {
        Pending {
            sent: self.store.send_unsent(unsent, policy, cost),
            limiter: self,
            key,
            key_kind,
            policy,
            cost,
        }
    }

    /// What [`conclude`](Self::conclude) does with a decision a store made at
    /// once for the layer: a decision `fresh` from the store (a memory
    /// store's, not a Redis store's from a hold) ends the fallback's
    /// outage, and every decision is reported.
    #[inline]
    pub(crate) fn answered(&self, allowed: bool, policy: &Policy, key_kind: &str, fresh: bool) {
        self.store_answered(fresh);
        let outcome = if allowed {
            Outcome::Allowed
        } else {
            Outcome::Limited
        };
        observe::decision(policy.name(), policy.decision_keys(), key_kind, outcome);
    }

    /// The store itself answered (`fresh`: not a denial it remembered, not
    /// a hold): a fallback that was deciding stops.
    #[inline]
    fn store_answered(&self, fresh: bool) {
        if fresh && let Some(fallback) = &self.fallback {
            fallback.store_answered();
        }
    }

    /// The fallback that decides for a store that failed with `error`:
    /// `None` without one, or for an error that is not the store's (such as
    /// a cost no bucket can ever hold).
    fn fallback_for(&self, error: &Error) -> Option<&Fallback> {
        self.fallback.as_ref().filter(|_| error.is_store_error())
    }

    /// The store's answer, with the fallback deciding when the store failed,
    /// reported to tracing and metrics. `fresh`: the store itself answered
    /// (not a denial it remembered), so a fallback that was deciding stops.
    fn conclude(
        &self,
        result: Result<Decision, Error>,
        fresh: bool,
        key: &str,
        key_kind: &str,
        policy: &Policy,
        cost: u64,
    ) -> Decided {
        let decided = match result {
            Ok(decision) => {
                self.store_answered(fresh);
                Decided::Store(decision)
            }
            Err(error) => match self.fallback_for(&error) {
                Some(fallback) => fell_back(fallback.check(key, policy, cost, &error), error),
                None => Decided::Failed(error),
            },
        };
        report(policy, key_kind, &decided);
        decided
    }

    /// A reservation under `policy` that may wait up to `max_wait` (the
    /// layer's delay mode), falling back and reported like
    /// [`decide`](Self::decide). The wait comes back with the decision: how
    /// long until the reserved tokens are due when admitted, zero otherwise.
    pub(crate) async fn decide_within(
        &self,
        key: &str,
        key_kind: &str,
        policy: &Policy,
        cost: u64,
        max_wait: Duration,
    ) -> (Decided, Duration) {
        // How long until the reserved tokens are due, when admitted.
        let mut wait = Duration::ZERO;
        let mut due = |reservation: Reservation| {
            if reservation.admitted() {
                wait = reservation.wait();
            }
            reservation.into_decision()
        };
        let decided = match self.store.reserve(key, policy, cost, max_wait).await {
            Ok(reservation) => {
                // A reservation that may wait (a microsecond or more, as the
                // store counts) is never answered from the deny cache: the
                // store answered.
                self.store_answered(crate::quota::micros(max_wait) != 0);
                Decided::Store(due(reservation))
            }
            Err(error) => match self.fallback_for(&error) {
                Some(fallback) => {
                    let answer = fallback.reserve(key, policy, cost, max_wait, &error).await;
                    fell_back(answer.map(|(r, policy)| (due(r), policy)), error)
                }
                None => Decided::Failed(error),
            },
        };
        report(policy, key_kind, &decided);
        (decided, wait)
    }
}

pin_project! {
    /// A check on its way to the store, and then settled by its limiter
    /// (see [`RateLimiter::send`]).
    pub(crate) struct Pending<'a, F> {
        #[pin]
        sent: F,
        limiter: &'a RateLimiter,
        key: &'a str,
        key_kind: &'a str,
        policy: &'a Policy,
        cost: u64,
    }
}

impl<F> Future for Pending<'_, F>
where
    F: Future<Output = Result<(Decision, u64), Error>>,
{
    type Output = Decided;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decided> {
        let this = self.project();
        let result = std::task::ready!(this.sent.poll(cx));
        Poll::Ready(this.limiter.conclude(
            result.map(|(decision, _)| decision),
            true,
            this.key,
            this.key_kind,
            this.policy,
            *this.cost,
        ))
    }
}
