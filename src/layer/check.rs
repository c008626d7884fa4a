//! The decision for one request: choose the policy, extract the key, ask the
//! store, and render the layer's own answer if there is one. Runs as one boxed
//! future that owns the request head, so the request body (`Send` but not
//! `Sync`) is never borrowed across an `.await`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http::request::Parts;
use tokio::sync::OwnedSemaphorePermit;

use super::config::{Config, Cost, Extractor, Missing, OnStoreError, Selected};
use super::grpc;
use super::http_answer;
use super::outcome::{After, Answer, Delayed, StoreFailure};
use super::report::{report, shadow_report};
use crate::key::present;
use crate::limiter::Decided;
use crate::store::safe_key;
use crate::{Error, Policy};

/// The request head back, and what to do with the request.
pub(crate) struct Checked {
    pub(crate) parts: Parts,
    pub(crate) verdict: Verdict,
}

#[expect(
    clippy::large_enum_variant,
    reason = "moved once per request; boxing `After` would allocate on every admitted request"
)]
pub(crate) enum Verdict {
    /// Call the inner service, then add `After` to its response.
    Forward(After),
    /// Answer without calling the inner service.
    Respond(Response<Bytes>),
}

/// A request admitted ahead of its tokens (delay mode): held for `wait`,
/// taking one of the layer's slots until it is forwarded, or until the
/// request is dropped (a client that went away), whichever comes first.
struct Hold {
    wait: Duration,
    _slot: OwnedSemaphorePermit,
}

pub(crate) async fn check(config: Arc<Config>, mut parts: Parts) -> Checked {
    let (after, hold) = match decide(&config, &parts).await {
        Ok(admitted) => admitted,
        // Shadow mode reports everything but never stands between client and
        // service: what would have been answered is forwarded with its report.
        Err(answer) if config.shadow => (shadow_report(answer, config.headers), None),
        Err(answer) => {
            let res = match grpc::flavor(&parts) {
                Some(kind) => grpc::render(answer, kind, config.headers),
                None => http_answer::render(answer, config.headers, &config.rejection),
            };
            return Checked {
                parts,
                verdict: Verdict::Respond(res),
            };
        }
    };
    // Delay mode: forward when the reserved tokens are due. Waiting here, in
    // the check, keeps the response future's states as they are: it polls the
    // check until the request may go on. Shadow mode never holds a request.
    if let Some(hold) = hold
        && !config.shadow
    {
        tokio::time::sleep(hold.wait).await;
    }
    if let Some(decision) = &after.decision {
        parts.extensions.insert(decision.clone());
    }
    if let Some(delayed) = after.delayed {
        parts.extensions.insert(delayed);
    }
    if let Some(failure) = &after.failure {
        parts.extensions.insert(failure.clone());
    }
    if let Some(shadow) = &after.shadow {
        parts.extensions.insert(shadow.clone());
    }
    Checked {
        parts,
        verdict: Verdict::Forward(after),
    }
}

/// `Ok` to forward the request (in delay mode, once its hold is over), `Err`
/// to answer it without the inner service.
async fn decide(config: &Config, parts: &Parts) -> Result<(After, Option<Hold>), Answer> {
    let (policy, own_key) = match &config.select {
        None => (config.limiter.policy().clone(), None),
        Some(select) => match select(parts) {
            Selected::Default => (config.limiter.policy().clone(), None),
            Selected::Policy(p) => (p, None),
            Selected::Keyed(p, key) => (p, Some(key)),
            Selected::Exempt => return Ok((After::default(), None)),
        },
    };
    // A table rule with a key of its own uses it; everything else the layer's.
    let key = own_key.as_ref().unwrap_or(&config.key);
    let (kind, value) = match present(key.extract(parts).await) {
        Some(value) => (key.kind(), value),
        None => match &config.missing {
            Missing::Allow => return Ok((After::default(), None)),
            Missing::Reject => return Err(missing(key)),
            Missing::Fallback(other) => match present(other.extract(parts).await) {
                Some(value) => (other.kind(), value),
                None => {
                    return Err(Answer::MissingKey {
                        kind: format!("{} or {}", key.kind(), other.kind()),
                    });
                }
            },
        },
    };
    let cost = match &config.cost {
        Cost::Fixed(n) => *n,
        Cost::Dynamic(f) => f(parts),
    };
    if cost > policy.max_cost() {
        return Err(too_costly(cost, policy, kind));
    }
    // Policy name first: policies with different names never share a bucket.
    // The value is made safe here too: `from_fn` extractors return whatever
    // their closure built.
    let key = bucket_key(policy.name(), kind, &safe_key(&value));
    let (decided, hold) = ask(config, &key, kind, &policy, cost).await;
    let delayed = hold.as_ref().map(|h| Delayed::new(h.wait));
    let after = match decided {
        Decided::Store(decision) if decision.allowed() => After {
            headers: report(config.headers, &policy, &decision),
            decision: Some(decision),
            delayed,
            ..After::default()
        },
        Decided::Store(decision) => {
            return Err(Answer::TooMany {
                policy,
                decision,
                kind: kind.to_owned(),
            });
        }
        // The fallback decided under this instance's share of the quotas:
        // the headers describe that share.
        Decided::Fallback {
            decision,
            policy,
            error,
        } if decision.allowed() => After {
            headers: report(config.headers, &policy, &decision),
            decision: Some(decision),
            failure: Some(StoreFailure::new(error)),
            delayed,
            ..After::default()
        },
        Decided::Fallback {
            decision, policy, ..
        } => {
            return Err(Answer::TooMany {
                policy,
                decision,
                kind: kind.to_owned(),
            });
        }
        Decided::Failed(Error::CostExceedsCapacity { .. }) => {
            return Err(too_costly(cost, policy, kind));
        }
        // Every other error means no decision could be made; the layer never
        // turns it into a service error. (A full MemoryStore no longer refuses
        // new keys, it evicts: no error needs to be answered differently.)
        Decided::Failed(err) => {
            let failure = StoreFailure::new(err);
            match config.on_store_error {
                OnStoreError::Allow | OnStoreError::Fallback(_) => After {
                    failure: Some(failure),
                    ..After::default()
                },
                OnStoreError::Deny => return Err(Answer::StoreDown(failure)),
            }
        }
    };
    Ok((after, hold))
}

/// Asks the store: a check or, in delay mode, a reservation that may wait up
/// to the layer's `max_wait`, holding one of its slots while it waits.
///
/// A request that finds every slot taken is checked as if delay mode were
/// off: admitted if it needs no wait, refused (429) otherwise. So the bound
/// never refuses a request its bucket admits now, and never holds more. A
/// free request (cost 0) only looks, and is never held.
async fn ask(
    config: &Config,
    key: &str,
    kind: &str,
    policy: &Policy,
    cost: u64,
) -> (Decided, Option<Hold>) {
    let slot = match &config.delay {
        Some(holding) if cost > 0 => Arc::clone(&holding.slots)
            .try_acquire_owned()
            .ok()
            .map(|slot| (holding.delay.max_wait(), slot)),
        _ => None,
    };
    let Some((max_wait, slot)) = slot else {
        return (config.limiter.decide(key, kind, policy, cost).await, None);
    };
    // Boxed: delay mode's future is large, and would otherwise be part of
    // every request's check future.
    let (decided, wait) = Box::pin(
        config
            .limiter
            .decide_within(key, kind, policy, cost, max_wait),
    )
    .await;
    // Admitted with tokens due now: nothing to hold, the slot goes back.
    let hold = (!wait.is_zero()).then_some(Hold { wait, _slot: slot });
    (decided, hold)
}

/// `name:kind:value`, built without the formatting machinery (once per
/// request).
fn bucket_key(name: &str, kind: &str, value: &str) -> String {
    let mut key = String::with_capacity(name.len() + kind.len() + value.len() + 2);
    key.push_str(name);
    key.push(':');
    key.push_str(kind);
    key.push(':');
    key.push_str(value);
    key
}

fn missing(key: &Extractor) -> Answer {
    Answer::MissingKey {
        kind: key.kind().to_owned(),
    }
}

fn too_costly(cost: u64, policy: Policy, kind: &str) -> Answer {
    Answer::CostTooHigh {
        cost,
        policy,
        kind: kind.to_owned(),
    }
}
