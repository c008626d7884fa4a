//! The decision for one request: choose the policy, extract the key, ask the
//! store. Runs as one boxed future that owns the request head, so the request
//! body (`Send` but not `Sync`) is never borrowed across an `.await`.

use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Response};

use super::config::{Config, Cost, Extractor, Missing};
use super::grpc::flavor;
use super::policy::{Choice, Policy};
use super::response::{Answer, report};
use super::{OnStoreError, ShadowRejection, StoreFailure};
use crate::key::present;
use crate::store::safe_key;
use crate::{Decision, Error, Store};

/// The request head back, and what to do with the request.
pub(crate) struct Checked {
    pub(crate) parts: Parts,
    pub(crate) verdict: Verdict,
}

pub(crate) enum Verdict {
    /// Call the inner service, then add `After` to its response.
    Forward(After),
    /// Answer without calling the inner service.
    Respond(Response<Bytes>),
}

/// What is added to the inner service's response.
#[derive(Default)]
pub(crate) struct After {
    pub(crate) headers: HeaderMap,
    pub(crate) decision: Option<Decision>,
    pub(crate) failure: Option<StoreFailure>,
    pub(crate) shadow: Option<ShadowRejection>,
}

pub(crate) async fn check<St: Store>(config: Arc<Config<St>>, mut parts: Parts) -> Checked {
    let after = match decide(&config, &parts).await {
        Ok(after) => after,
        // Shadow mode reports everything but never stands between client and
        // service: what would have been answered is forwarded with its report.
        Err(answer) if config.shadow => answer.into_report(config.headers),
        Err(answer) => {
            let grpc = flavor(&parts.headers);
            let res = answer.render(config.headers, &config.rejection, grpc);
            return Checked {
                parts,
                verdict: Verdict::Respond(res),
            };
        }
    };
    if let Some(decision) = &after.decision {
        parts.extensions.insert(decision.clone());
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

/// `Ok` to forward the request, `Err` to answer it without the inner service.
async fn decide<St: Store>(config: &Config<St>, parts: &Parts) -> Result<After, Answer> {
    let policy = match &config.select {
        None => config.policy.clone(),
        Some(select) => match select(parts) {
            Choice::Default => config.policy.clone(),
            Choice::Policy(p) => p,
            Choice::Exempt => return Ok(After::default()),
        },
    };
    let (kind, value) = match present(config.key.extract(parts).await) {
        Some(value) => (config.key.kind(), value),
        None => match &config.missing {
            Missing::Allow => return Ok(After::default()),
            Missing::Reject => return Err(missing(&config.key)),
            Missing::Fallback(other) => match present(other.extract(parts).await) {
                Some(value) => (other.kind(), value),
                None => {
                    return Err(Answer::MissingKey {
                        kind: format!("{} or {}", config.key.kind(), other.kind()),
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
    let key = format!("{}:{kind}:{}", policy.name(), safe_key(&value));
    match config.store.check(&key, policy.quotas(), cost).await {
        Ok(decision) if decision.allowed() => Ok(After {
            headers: report(config.headers, &policy, &decision),
            decision: Some(decision),
            ..After::default()
        }),
        Ok(decision) => Err(Answer::TooMany {
            policy,
            decision,
            kind: kind.to_owned(),
        }),
        Err(Error::CostExceedsCapacity { .. }) => Err(too_costly(cost, policy, kind)),
        // Every other error means no decision could be made; the layer never
        // turns it into a service error.
        Err(err) => {
            // A full MemoryStore is a bound, not an outage: letting the new key
            // through would let a flood of fresh keys pass unlimited.
            let full = matches!(err, Error::StoreFull { .. });
            let failure = StoreFailure(Arc::new(err));
            if full {
                return Err(Answer::StoreDown(failure));
            }
            match config.on_store_error {
                OnStoreError::Allow => Ok(After {
                    failure: Some(failure),
                    ..After::default()
                }),
                OnStoreError::Deny => Err(Answer::StoreDown(failure)),
            }
        }
    }
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
