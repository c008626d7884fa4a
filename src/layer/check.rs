//! The decision for one request: choose the policy, extract the key, ask the
//! store, and render the layer's own answer if there is one. Runs as one boxed
//! future that owns the request head, so the request body (`Send` but not
//! `Sync`) is never borrowed across an `.await`.

use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use http::request::Parts;

use super::config::{Choice, Config, Cost, Extractor, Missing, OnStoreError};
use super::grpc;
use super::http_answer;
use super::outcome::{After, Answer, StoreFailure};
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

pub(crate) enum Verdict {
    /// Call the inner service, then add `After` to its response.
    Forward(After),
    /// Answer without calling the inner service.
    Respond(Response<Bytes>),
}

pub(crate) async fn check(config: Arc<Config>, mut parts: Parts) -> Checked {
    let after = match decide(&config, &parts).await {
        Ok(after) => after,
        // Shadow mode reports everything but never stands between client and
        // service: what would have been answered is forwarded with its report.
        Err(answer) if config.shadow => shadow_report(answer, config.headers),
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
async fn decide(config: &Config, parts: &Parts) -> Result<After, Answer> {
    let policy = match &config.select {
        None => config.limiter.policy().clone(),
        Some(select) => match select(parts) {
            Choice::Default => config.limiter.policy().clone(),
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
    match config.limiter.decide(&key, kind, &policy, cost).await {
        Decided::Store(decision) if decision.allowed() => Ok(After {
            headers: report(config.headers, &policy, &decision),
            decision: Some(decision),
            ..After::default()
        }),
        Decided::Store(decision) => Err(Answer::TooMany {
            policy,
            decision,
            kind: kind.to_owned(),
        }),
        // The fallback decided under this instance's share of the quotas:
        // the headers describe that share.
        Decided::Fallback {
            decision,
            policy,
            error,
        } if decision.allowed() => Ok(After {
            headers: report(config.headers, &policy, &decision),
            decision: Some(decision),
            failure: Some(StoreFailure::new(error)),
            ..After::default()
        }),
        Decided::Fallback {
            decision, policy, ..
        } => Err(Answer::TooMany {
            policy,
            decision,
            kind: kind.to_owned(),
        }),
        Decided::Failed(Error::CostExceedsCapacity { .. }) => Err(too_costly(cost, policy, kind)),
        // Every other error means no decision could be made; the layer never
        // turns it into a service error. (A full MemoryStore no longer refuses
        // new keys, it evicts: no error needs to be answered differently.)
        Decided::Failed(err) => {
            let failure = StoreFailure::new(err);
            match config.on_store_error {
                OnStoreError::Allow | OnStoreError::Fallback(_) => Ok(After {
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
