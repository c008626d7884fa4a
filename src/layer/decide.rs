//! Asking the store for a prepared request (a check, or in delay mode a
//! reservation that may hold the request), and what its decision means for
//! the request.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use super::config::Config;
use super::options::OnStoreError;
use super::outcome::{After, Answer, Deferred, Delayed, Marks, StoreFailure};
use super::prepare::{KeyedRequest, too_costly};
use super::settle::{By, Ticket};
use crate::decision::Decision;
use crate::error::Error;
use crate::limiter::Decided;
use crate::policy::Policy;

/// What delay mode holds a request admitted ahead of its tokens with: its
/// `wait`, and one of the layer's slots, taken until the request is
/// forwarded or dropped (a client that went away), whichever comes first.
pub(super) struct DelaySlot {
    pub(super) wait: Duration,
    _slot: OwnedSemaphorePermit,
}

/// What the store's decision means for the request: `Ok` to forward it (in
/// delay mode, once its hold is over), `Err` to answer it.
pub(super) fn outcome(
    config: &Config,
    request: KeyedRequest<'_>,
    decided: Decided,
    delayed: Option<Delayed>,
) -> Result<After, Answer> {
    let KeyedRequest {
        policy,
        kind,
        value,
        cost,
    } = request;
    // An admitted request carries what settles its cost by its response,
    // with its storage key.
    let key = config
        .settle
        .is_some()
        .then(|| policy.key_of(&[&kind, &value]));
    let ticket = |decision: &Decision, policy: &Policy, by: By| {
        config.settle.as_ref().zip(key).map(|(settler, key)| {
            Ticket::new(
                settler,
                &config.limiter,
                key,
                policy.clone(),
                cost,
                by,
                decision.clone(),
            )
        })
    };
    let after = match decided {
        Decided::Store(decision) if decision.allowed() => {
            let ticket = ticket(&decision, &policy, By::Store);
            admitted(
                config,
                policy,
                decision,
                ticket,
                Marks::new(None, None, delayed),
            )
        }
        Decided::Store(decision) => {
            return Err(Answer::TooMany {
                policy: policy.into_owned(),
                decision,
                kind: kind.into_owned(),
            });
        }
        // The fallback decided under this instance's share of the quotas:
        // the headers describe that share.
        Decided::Fallback {
            decision,
            policy,
            error,
        } if decision.allowed() => {
            let ticket = ticket(&decision, &policy, By::Fallback(policy.clone()));
            let marks = Marks::new(Some(StoreFailure::new(error)), None, delayed);
            admitted(config, Cow::Owned(policy), decision, ticket, marks)
        }
        Decided::Fallback {
            decision, policy, ..
        } => {
            return Err(Answer::TooMany {
                policy,
                decision,
                kind: Arc::clone(&kind),
            });
        }
        Decided::Failed(Error::CostExceedsCapacity { .. }) => {
            return Err(too_costly(cost, policy.into_owned(), &kind));
        }
        // Every other error means no decision could be made; the layer never
        // turns it into a service error. (A full MemoryStore evicts rather
        // than refuse a new key: no error needs to be answered differently.)
        Decided::Failed(err) => {
            let failure = StoreFailure::new(err);
            #[allow(deprecated, reason = "the variant is how the layer keeps a fallback")]
            match config.on_store_error {
                OnStoreError::Allow | OnStoreError::Fallback(_) => After {
                    marks: Marks::new(Some(failure), None, None),
                    ..After::default()
                },
                OnStoreError::Deny => return Err(Answer::StoreDown(failure)),
            }
        }
    };
    Ok(after)
}

/// What an admitted request's response gets: its rate limit fields from
/// `policy` (in the layer's header style), its `decision`, what settles it
/// and its marks. [`outcome`] builds an admitted request's [`After`] here;
/// the held-key path in `check` builds its own (`held_placed`: no ticket,
/// no marks, the decision built where it goes).
#[inline(always)]
pub(super) fn admitted(
    config: &Config,
    policy: Cow<'_, Policy>,
    decision: Decision,
    ticket: Option<Box<Ticket>>,
    marks: Option<Box<Marks>>,
) -> After {
    After {
        ticket,
        headers: Deferred::new(config.headers, policy),
        decision: Some(decision),
        decision_in_response: false,
        marks,
    }
}

/// Asks the store: a check or, in delay mode, a reservation that may wait up
/// to the layer's `max_wait`, holding one of its slots while it waits.
///
/// A request that finds every slot taken is checked as if delay mode were
/// off: admitted if it needs no wait, refused (429) otherwise. So the bound
/// never refuses a request its bucket admits now, and never holds more. A
/// free request (cost 0) only looks, and is never held.
pub(super) async fn ask_store(
    config: &Config,
    request: &KeyedRequest<'_>,
) -> (Decided, Option<DelaySlot>) {
    let key = &request.key();
    let KeyedRequest {
        policy, kind, cost, ..
    } = request;
    let slot = match &config.delay {
        Some(holding) if *cost > 0 => Arc::clone(&holding.slots)
            .try_acquire_owned()
            .ok()
            .map(|slot| (holding.delay.max_wait(), slot)),
        _ => None,
    };
    let Some((max_wait, permit)) = slot else {
        return (config.limiter.decide(key, kind, policy, *cost).await, None);
    };
    // Boxed: delay mode's future is large, and would otherwise be part of
    // every request's check future.
    let (decided, wait) = Box::pin(
        config
            .limiter
            .decide_within(key, kind, policy, *cost, max_wait),
    )
    .await;
    // Admitted with tokens due now: nothing to hold, the slot goes back.
    let slot = (!wait.is_zero()).then_some(DelaySlot {
        wait,
        _slot: permit,
    });
    (decided, slot)
}
