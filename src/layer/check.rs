//! The decision for one request: choose the policy, extract the key, ask the
//! store. Runs as one boxed future that owns the request head, so the request
//! body (`Send` but not `Sync`) is never borrowed across an `.await`.

use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Response};

use super::config::{Config, Cost, Missing};
use super::policy::{Choice, Policy};
use super::response::{Answer, report};
use super::{OnStoreError, StoreFailure};
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
}

pub(crate) async fn check<St: Store>(config: Arc<Config<St>>, mut parts: Parts) -> Checked {
    let verdict = decide(&config, &mut parts).await;
    // Shadow mode reports everything but never stands between client and service.
    let verdict = match verdict {
        Verdict::Respond(res) if config.shadow => Verdict::Forward(After {
            headers: shadow_headers(&res),
            decision: res.extensions().get::<Decision>().cloned(),
            failure: res.extensions().get::<StoreFailure>().cloned(),
        }),
        other => other,
    };
    if let Verdict::Forward(after) = &verdict {
        if let Some(decision) = &after.decision {
            parts.extensions.insert(decision.clone());
        }
        if let Some(failure) = &after.failure {
            parts.extensions.insert(failure.clone());
        }
    }
    Checked { parts, verdict }
}

async fn decide<St: Store>(config: &Config<St>, parts: &mut Parts) -> Verdict {
    let policy = match &config.select {
        None => config.policy.clone(),
        Some(select) => match select(parts) {
            Choice::Default => config.policy.clone(),
            Choice::Policy(p) => p,
            Choice::Exempt => return Verdict::Forward(After::default()),
        },
    };
    let (kind, value) = match config.key.extract(parts).await {
        Some(value) => (config.key.kind(), value),
        None => match &config.missing {
            Missing::Allow => return Verdict::Forward(After::default()),
            Missing::Reject => return missing(config.key.kind()),
            Missing::Fallback(other) => match other.extract(parts).await {
                Some(value) => (other.kind(), value),
                None => return missing(config.key.kind()),
            },
        },
    };
    let cost = match &config.cost {
        Cost::Fixed(n) => *n,
        Cost::Dynamic(f) => f(parts),
    };
    if cost > policy.max_cost() {
        return too_costly(cost, &policy);
    }
    // Policy name first: two policies never share a bucket. The value is made
    // safe here too: `from_fn` extractors return whatever their closure built.
    let key = format!("{}:{kind}:{}", policy.name(), safe_key(&value));
    match config.store.check(&key, policy.quotas(), cost).await {
        Ok(decision) => judge(config, &policy, decision),
        Err(Error::CostExceedsCapacity { .. }) => too_costly(cost, &policy),
        Err(err) => store_failed(config, err),
    }
}

fn judge<St>(config: &Config<St>, policy: &Policy, decision: Decision) -> Verdict {
    if decision.allowed() {
        return Verdict::Forward(After {
            headers: report(config.headers, policy, &decision),
            decision: Some(decision),
            failure: None,
        });
    }
    Verdict::Respond(
        Answer::TooMany {
            policy,
            decision,
            style: config.headers,
            reject: &config.rejection,
        }
        .render(),
    )
}

fn store_failed<St>(config: &Config<St>, err: Error) -> Verdict {
    // Every error left here means no decision could be made; the layer never
    // turns it into a service error.
    let failure = StoreFailure(Arc::new(err));
    match config.on_store_error {
        OnStoreError::Allow => Verdict::Forward(After {
            failure: Some(failure),
            ..After::default()
        }),
        OnStoreError::Deny => {
            let mut res = Answer::StoreDown.render();
            res.extensions_mut().insert(failure);
            Verdict::Respond(res)
        }
    }
}

fn missing(kind: &str) -> Verdict {
    Verdict::Respond(Answer::MissingKey { kind }.render())
}

fn too_costly(cost: u64, policy: &Policy) -> Verdict {
    Verdict::Respond(
        Answer::CostTooHigh {
            cost,
            capacity: policy.max_cost(),
        }
        .render(),
    )
}

/// The rate limit headers of an answer the shadow layer did not send.
fn shadow_headers(res: &Response<Bytes>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for name in [
        super::response::RATELIMIT_POLICY,
        super::response::RATELIMIT,
        super::response::X_RATELIMIT_LIMIT,
        super::response::X_RATELIMIT_REMAINING,
        super::response::X_RATELIMIT_RESET,
    ] {
        for value in res.headers().get_all(&name) {
            headers.append(name.clone(), value.clone());
        }
    }
    headers
}
