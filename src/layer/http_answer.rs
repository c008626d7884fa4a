//! The layer's own answers to HTTP requests: 429, 503 and 400. gRPC calls get
//! theirs from `grpc/`; neither imports the other.

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use super::headers::{STORE_RETRY_AFTER, ceil_secs};
use super::options::{HeaderStyle, Reject};
use super::outcome::Answer;
use super::report::{add_report, items, retry_after_secs};
use crate::decision::Decision;
use crate::policy::Policy;
const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The HTTP response for `answer`.
pub(crate) fn render(answer: Answer, style: HeaderStyle, reject: &Reject) -> Response<Bytes> {
    match answer {
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

fn too_many(
    policy: &Policy,
    decision: Decision,
    style: HeaderStyle,
    reject: &Reject,
) -> Response<Bytes> {
    let retry = retry_after_secs(&decision);
    let mut res = match reject {
        Reject::Text => {
            // Built to its exact length: the body's bytes are then handed to
            // `Bytes` without another allocation.
            let mut digits = itoa::Buffer::new();
            let digits = digits.format(retry);
            let (head, tail) = ("Too Many Requests: retry in ", " s\n");
            let mut body = String::with_capacity(head.len() + digits.len() + tail.len());
            body.push_str(head);
            body.push_str(digits);
            body.push_str(tail);
            plain(StatusCode::TOO_MANY_REQUESTS, body)
        }
        Reject::Problem => problem(policy, &decision, retry),
        Reject::Custom(f) => f(&decision),
    };
    let headers = res.headers_mut();
    if !headers.contains_key(RETRY_AFTER) {
        headers.insert(RETRY_AFTER, seconds(retry));
    }
    if !headers.contains_key(CACHE_CONTROL) {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    add_report(headers, style, policy, &decision);
    res.extensions_mut().insert(decision);
    res
}

fn problem(policy: &Policy, decision: &Decision, retry: u64) -> Response<Bytes> {
    // Item names are `"name"` or `"name.i"` with name in [A-Za-z0-9_-]: valid JSON
    // strings as they are, so no escaping is needed.
    let violated = items(policy)
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

/// A number of seconds as a header value (one allocation: `From<u64>` makes
/// two).
fn seconds(n: u64) -> HeaderValue {
    let mut digits = itoa::Buffer::new();
    match HeaderValue::from_str(digits.format(n)) {
        Ok(value) => value,
        // Digits are always a valid header value.
        Err(_) => HeaderValue::from_static("0"),
    }
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
    use crate::quota::Quota;
    use crate::store::MemoryStore;
    #[test]
    fn problem_json_lists_the_exhausted_quotas() {
        let fast = Quota::per_second(2).unwrap();
        let slow = Quota::per_hour(100).unwrap();
        let store = MemoryStore::new();
        let p = Policy::new("p", [fast, slow]).unwrap();
        let _ = store.decide_at("k", &p, 2, 0).unwrap();
        let d = store.decide_at("k", &p, 1, 100_000).unwrap();
        let res = render(
            Answer::TooMany {
                policy: p,
                decision: d,
                kind: "ip".into(),
            },
            HeaderStyle::Ietf,
            &Reject::Problem,
        );
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()[RETRY_AFTER], "1");
        assert_eq!(res.headers()[CACHE_CONTROL], "no-store");
        let body = std::str::from_utf8(res.body()).unwrap();
        assert!(body.contains("\"violated-policies\":[\"p.0\"]"), "{body}");
    }
}
