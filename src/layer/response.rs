//! What the layer answers and which headers it adds.
//!
//! Everything here builds `Response<Bytes>`; the service converts the body into
//! the inner service's body type. [`Answer::render`] is the one place that turns
//! an outcome into a response: HTTP statuses here, gRPC statuses in
//! [`super::grpc`] for gRPC calls.

use std::fmt::Write;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use super::check::After;
use super::config::{HeaderStyle, Reject};
use super::grpc::{self, Grpc};
use super::policy::Policy;
use super::{ShadowRejection, StoreFailure};
use crate::{Decision, QuotaState};

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit`: capacity of the most restrictive quota.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`: tokens left in the most restrictive quota.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`: seconds until the most restrictive quota is full again.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The `Retry-After` of a store failure answered with 503.
pub const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// A duration in whole seconds, rounded up: a client told `0` retries at once.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// `Retry-After` of a 429: the decision's wait rounded up, never 0.
pub(crate) fn retry_after_secs(decision: &Decision) -> u64 {
    ceil_secs(decision.retry_after()).max(1)
}

/// Seconds until `state`'s `remaining` grows by one token (`None` when full).
///
/// The store reports the time until the bucket is full; every missing token
/// beyond the next one takes `period / tokens`, so the next one is due that much
/// earlier. Rounded up, this is never earlier than the real refill.
fn next_token(state: &QuotaState) -> Option<Duration> {
    let q = state.quota();
    let missing = q
        .capacity()
        .checked_sub(state.remaining())?
        .checked_sub(1)?;
    let per_token_us = q.period().as_micros() / u128::from(q.tokens().max(1));
    let later = per_token_us.saturating_mul(u128::from(missing));
    let full = state.reset_after().as_micros();
    let us = u64::try_from(full.saturating_sub(later)).unwrap_or(u64::MAX);
    Some(Duration::from_micros(us.max(1)))
}

/// RFC 9651 integers have at most 15 digits; a quota may count up to 2^52
/// tokens, so larger values are reported as the largest integer the syntax has.
pub(crate) fn sf_integer(v: u64) -> u64 {
    v.min(999_999_999_999_999)
}

/// The `t` of one `RateLimit` item. On an admission: seconds until one more token
/// is available (omitted when the bucket is full). On a denial: seconds until this
/// quota holds the request's cost (omitted for quotas that already hold it), so
/// `Retry-After`, the longest of these, is never earlier than any `t`.
fn item_t(decision: &Decision, state: &QuotaState) -> Option<u64> {
    if decision.allowed() {
        next_token(state).map(ceil_secs)
    } else {
        let wait = state.retry_after();
        (!wait.is_zero()).then(|| ceil_secs(wait))
    }
}

/// The `RateLimit` field value: one item per quota, in the policy's order.
pub(crate) fn ratelimit_value(policy: &Policy, decision: &Decision) -> String {
    let mut out = String::new();
    for (item, state) in policy.items().iter().zip(decision.states()) {
        if !out.is_empty() {
            out.push_str(", ");
        }
        // Writing to a String cannot fail.
        let _ = write!(out, "{item};r={}", sf_integer(state.remaining()));
        if let Some(t) = item_t(decision, state) {
            let _ = write!(out, ";t={t}");
        }
    }
    out
}

/// The rate limit headers describing `decision` under `policy`.
pub(crate) fn report(style: HeaderStyle, policy: &Policy, decision: &Decision) -> HeaderMap {
    let mut headers = HeaderMap::new();
    match style {
        HeaderStyle::Ietf => {
            headers.insert(RATELIMIT_POLICY, policy.header().clone());
            if let Ok(v) = HeaderValue::from_str(&ratelimit_value(policy, decision)) {
                headers.insert(RATELIMIT, v);
            }
        }
        HeaderStyle::Legacy => {
            headers.insert(X_RATELIMIT_LIMIT, decision.limit().into());
            headers.insert(X_RATELIMIT_REMAINING, decision.remaining().into());
            headers.insert(X_RATELIMIT_RESET, ceil_secs(decision.reset_after()).into());
        }
        HeaderStyle::None => {}
    }
    headers
}

/// Adds `report` to a response's headers. The draft's fields are lists, so
/// nested layers (a global and a per-route limit) append their items; the legacy
/// single-value fields keep the innermost layer's values.
pub(crate) fn apply_report(target: &mut HeaderMap, report: HeaderMap) {
    let mut last = None;
    for (name, value) in report {
        let Some(name) = name.or(last.take()) else {
            continue;
        };
        if name == RATELIMIT || name == RATELIMIT_POLICY {
            target.append(name.clone(), value);
        } else if !target.contains_key(&name) {
            target.insert(name.clone(), value);
        }
        last = Some(name);
    }
}

/// An outcome the layer answers itself instead of calling the inner service.
pub(crate) enum Answer {
    /// Over the limit: 429. `kind` is the kind of key the bucket belongs to.
    TooMany {
        policy: Policy,
        decision: Decision,
        kind: String,
    },
    /// The request's cost exceeds a capacity of its policy: it can never pass.
    CostTooHigh {
        cost: u64,
        policy: Policy,
        kind: String,
    },
    /// No key to limit by.
    MissingKey { kind: String },
    /// The store failed and the layer is configured to deny.
    StoreDown(StoreFailure),
}

impl Answer {
    /// The response for this outcome. This is the one place that chooses a
    /// response's shape: a gRPC call (`grpc` is `Some`) gets a trailers-only gRPC
    /// status whatever `reject` says, because gRPC clients read no HTTP error.
    pub(crate) fn render(
        self,
        style: HeaderStyle,
        reject: &Reject,
        grpc: Option<Grpc>,
    ) -> Response<Bytes> {
        if let Some(grpc) = grpc {
            return self.render_grpc(grpc, style);
        }
        match self {
            Answer::TooMany {
                policy, decision, ..
            } => too_many(&policy, decision, style, reject),
            Answer::CostTooHigh { cost, policy, .. } => plain(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "Too Many Requests: this request costs {cost}, more than the limit of \
                     {}; it can never be admitted\n",
                    policy.max_cost()
                ),
            ),
            Answer::MissingKey { kind } => plain(
                StatusCode::BAD_REQUEST,
                format!("Bad Request: no rate limit key ({kind}) in this request\n"),
            ),
            Answer::StoreDown(failure) => {
                let mut res = plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Service Unavailable: rate limit store unavailable, retry shortly\n".into(),
                );
                res.headers_mut()
                    .insert(RETRY_AFTER, ceil_secs(STORE_RETRY_AFTER).into());
                res.extensions_mut().insert(failure);
                res
            }
        }
    }

    fn render_grpc(self, grpc: Grpc, style: HeaderStyle) -> Response<Bytes> {
        match self {
            Answer::TooMany {
                policy,
                decision,
                kind,
            } => grpc::too_many(grpc, &policy, decision, &kind, style),
            Answer::CostTooHigh { cost, policy, kind } => {
                grpc::cost_too_high(grpc, &policy, cost, &kind)
            }
            Answer::MissingKey { kind } => grpc::missing_key(grpc, &kind),
            Answer::StoreDown(failure) => grpc::store_down(grpc, failure),
        }
    }

    /// What shadow mode forwards instead of this answer: the report and the
    /// decision or failure, without the response.
    pub(crate) fn into_report(self, style: HeaderStyle) -> After {
        match self {
            Answer::TooMany {
                policy, decision, ..
            } => After {
                headers: report(style, &policy, &decision),
                decision: Some(decision),
                ..After::default()
            },
            Answer::StoreDown(failure) => After {
                failure: Some(failure),
                ..After::default()
            },
            Answer::CostTooHigh { cost, policy, .. } => After {
                shadow: Some(ShadowRejection::CostTooHigh {
                    cost,
                    capacity: policy.max_cost(),
                }),
                ..After::default()
            },
            Answer::MissingKey { kind } => After {
                shadow: Some(ShadowRejection::MissingKey { kind }),
                ..After::default()
            },
        }
    }
}

fn too_many(
    policy: &Policy,
    decision: Decision,
    style: HeaderStyle,
    reject: &Reject,
) -> Response<Bytes> {
    let retry = retry_after_secs(&decision);
    let mut res = match reject {
        Reject::Text => plain(
            StatusCode::TOO_MANY_REQUESTS,
            format!("Too Many Requests: retry in {retry} s\n"),
        ),
        Reject::Problem => problem(policy, &decision, retry),
        Reject::Custom(f) => f(&decision),
    };
    let headers = res.headers_mut();
    if !headers.contains_key(RETRY_AFTER) {
        headers.insert(RETRY_AFTER, retry.into());
    }
    if !headers.contains_key(CACHE_CONTROL) {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    apply_report(headers, report(style, policy, &decision));
    res.extensions_mut().insert(decision);
    res
}

fn problem(policy: &Policy, decision: &Decision, retry: u64) -> Response<Bytes> {
    // Item names are `"name"` or `"name.i"` with name in [A-Za-z0-9_-]: valid JSON
    // strings as they are, so no escaping is needed.
    let violated = policy
        .items()
        .iter()
        .zip(decision.states())
        .filter(|(_, s)| !s.retry_after().is_zero())
        .map(|(item, _)| item.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let body = format!(
        "{{\"type\":\"{QUOTA_EXCEEDED}\",\
         \"title\":\"Request cannot be satisfied as assigned quota has been exceeded\",\
         \"status\":429,\"detail\":\"Retry in {retry} s\",\"violated-policies\":[{violated}]}}"
    );
    let mut res = plain(StatusCode::TOO_MANY_REQUESTS, body);
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

/// A short `text/plain` answer that no cache may store.
fn plain(status: StatusCode, body: String) -> Response<Bytes> {
    let mut res = Response::new(Bytes::from(body));
    *res.status_mut() = status;
    let headers = res.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryStore, Quota, Store};

    fn policy(quotas: &[Quota]) -> Policy {
        Policy::new("p", quotas.iter().copied()).unwrap()
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_micros(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
    }

    #[tokio::test]
    async fn admitted_items_report_the_next_token() {
        // 1 per 10 s, burst 5: after two spends, one more token in 10 s, full in 20 s.
        let q = Quota::new(1, Duration::from_secs(10))
            .unwrap()
            .burst(5)
            .unwrap();
        let store = MemoryStore::new();
        let p = policy(&[q]);
        let mut d = store.check_at("k", &[q], 1, 0).unwrap();
        assert_eq!(ratelimit_value(&p, &d), "\"p\";r=4;t=10");
        d = store.check_at("k", &[q], 1, 0).unwrap();
        assert_eq!(d.reset_after(), Duration::from_secs(20));
        assert_eq!(ratelimit_value(&p, &d), "\"p\";r=3;t=10");
        // Halfway to the next token.
        d = store.check_at("k", &[q], 0, 5_000_000).unwrap();
        assert_eq!(ratelimit_value(&p, &d), "\"p\";r=3;t=5");
        // A full bucket has nothing more to come: no t.
        let fresh = store.check("other", &[q], 0).await.unwrap();
        assert_eq!(ratelimit_value(&p, &fresh), "\"p\";r=5");
        assert_eq!(sf_integer(1 << 52), 999_999_999_999_999);
        assert_eq!(sf_integer(42), 42);
    }

    #[test]
    fn denied_items_never_point_later_than_retry_after() {
        let fast = Quota::per_second(2).unwrap();
        let slow = Quota::per_hour(100).unwrap();
        let store = MemoryStore::new();
        let p = policy(&[fast, slow]);
        store.check_at("k", &[fast, slow], 2, 0).unwrap();
        let d = store.check_at("k", &[fast, slow], 1, 100_000).unwrap();
        assert!(!d.allowed());
        // Only the exhausted quota has a t; the hourly one still has tokens.
        assert_eq!(ratelimit_value(&p, &d), "\"p.0\";r=0;t=1, \"p.1\";r=98");
        assert_eq!(retry_after_secs(&d), 1);
        let res = Answer::TooMany {
            policy: p,
            decision: d,
            kind: "ip".into(),
        }
        .render(HeaderStyle::Ietf, &Reject::Problem, None);
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()[RETRY_AFTER], "1");
        assert_eq!(res.headers()[CACHE_CONTROL], "no-store");
        let body = std::str::from_utf8(res.body()).unwrap();
        assert!(body.contains("\"violated-policies\":[\"p.0\"]"), "{body}");
    }

    #[test]
    fn legacy_headers_use_the_binding_quota() {
        let q = Quota::per_minute(6).unwrap();
        let store = MemoryStore::new();
        let d = store.check_at("k", &[q], 1, 0).unwrap();
        let h = report(HeaderStyle::Legacy, &policy(&[q]), &d);
        assert_eq!(h[X_RATELIMIT_LIMIT], "6");
        assert_eq!(h[X_RATELIMIT_REMAINING], "5");
        assert_eq!(h[X_RATELIMIT_RESET], "10");
        assert!(report(HeaderStyle::None, &policy(&[q]), &d).is_empty());
    }

    #[test]
    fn nested_reports_append_list_fields() {
        let q = Quota::per_second(3).unwrap();
        let store = MemoryStore::new();
        let d = store.check_at("k", &[q], 1, 0).unwrap();
        let mut target = report(HeaderStyle::Ietf, &policy(&[q]), &d);
        let outer = Policy::new("outer", [q]).unwrap();
        apply_report(&mut target, report(HeaderStyle::Ietf, &outer, &d));
        assert_eq!(target.get_all(RATELIMIT).iter().count(), 2);
        assert_eq!(target.get_all(RATELIMIT_POLICY).iter().count(), 2);
    }
}
