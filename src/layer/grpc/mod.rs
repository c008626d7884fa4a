//! gRPC calls: how the layer recognises them, and the answers it gives them.
//!
//! A request is a gRPC call when its `content-type` starts with
//! `application/grpc` (`application/grpc`, `application/grpc+proto`, gRPC-Web's
//! `application/grpc-web...`). gRPC clients read the outcome of a call from
//! `grpc-status`, not from the HTTP status: tonic maps a bare HTTP 429 to
//! `UNAVAILABLE` and drops the retry hint. So every answer the layer gives a gRPC
//! call by itself is HTTP 200 "trailers-only": one header block holding the status,
//! and no body. Without tollgate's `tonic` feature the headers are built by hand;
//! with it, `grpc-status-details-bin` adds the `google.rpc` error details (see
//! `details.rs`).

use std::fmt::Write;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Response};

use super::StoreFailure;
use super::config::HeaderStyle;
use super::policy::Policy;
use super::response::{STORE_RETRY_AFTER, apply_report, report};
use crate::Decision;

#[cfg(feature = "tonic")]
mod details;

/// Without tonic-types there is nothing to encode `google.rpc` details with:
/// answers carry the status, the message and the pushback only.
#[cfg(not(feature = "tonic"))]
mod details {
    use std::time::Duration;

    use http::HeaderMap;

    use super::Code;
    use crate::Decision;
    use crate::layer::policy::Policy;

    pub(super) enum Violation {}

    pub(super) fn insert(
        _: &mut HeaderMap,
        _: Code,
        _: &str,
        _: Option<Duration>,
        _: Vec<Violation>,
    ) {
    }

    pub(super) fn exhausted(_: &Policy, _: &Decision, _: &str) -> Vec<Violation> {
        Vec::new()
    }

    pub(super) fn too_costly(_: &Policy, _: u64, _: &str) -> Vec<Violation> {
        Vec::new()
    }
}

/// `grpc-retry-pushback-ms`: the metadata through which a server tells gRPC
/// clients with a retry policy how long to wait before retrying (gRFC A6,
/// "Pushback"). The value is ASCII integer milliseconds; a negative value tells
/// the client not to retry at all.
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// True when `parts` is a gRPC call: its `content-type` starts with
/// `application/grpc` (any case), which covers `application/grpc+proto` and
/// gRPC-Web. The layer answers such calls with gRPC statuses instead of HTTP
/// errors.
///
/// ```
/// use http::Request;
/// use tollgate::layer::is_grpc;
///
/// let (parts, ()) = Request::post("/grpc.health.v1.Health/Check")
///     .header("content-type", "application/grpc+proto")
///     .body(()).unwrap().into_parts();
/// assert!(is_grpc(&parts));
/// ```
pub fn is_grpc(parts: &Parts) -> bool {
    flavor(&parts.headers).is_some()
}

/// The service and method a gRPC path names: `/package.Service/Method` gives
/// `Some(("package.Service", "Method"))`; any other path gives `None`.
///
/// Only the path is read, not the `content-type`: a client must not dodge a
/// per-method policy by sending the same call with another content type. Use it
/// in the [`policy`](crate::layer::RateLimitLayer::policy) closure, for example
/// for a stricter quota on writes:
///
/// ```
/// use tollgate::layer::{Choice, Policy, RateLimitLayer, grpc_method};
/// use tollgate::{MemoryStore, Quota};
///
/// # fn main() -> Result<(), tollgate::Error> {
/// let writes = Policy::new("writes", [Quota::per_minute(10)?])?;
/// let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(50)?)
///     .policy(move |parts| match grpc_method(parts) {
///         Some(("shop.v1.Orders", "Create" | "Cancel")) => writes.clone().into(),
///         Some(("grpc.health.v1.Health", _)) => Choice::Exempt,
///         _ => Choice::Default,
///     });
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
pub fn grpc_method(parts: &Parts) -> Option<(&str, &str)> {
    let (service, method) = parts.uri.path().strip_prefix('/')?.split_once('/')?;
    let valid = !service.is_empty() && !method.is_empty() && !method.contains('/');
    valid.then_some((service, method))
}

/// Which kind of gRPC call a request is, so the answer carries a `content-type`
/// its client accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Grpc {
    /// `application/grpc...`
    Native,
    /// `application/grpc-web` and `application/grpc-web+proto`.
    Web,
    /// `application/grpc-web-text...`: base64 bodies, but the answer has none.
    WebText,
}

impl Grpc {
    fn content_type(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Grpc::Native => "application/grpc",
            Grpc::Web => "application/grpc-web",
            Grpc::WebText => "application/grpc-web-text",
        })
    }
}

/// The gRPC kind of a request, or `None` for other HTTP requests.
pub(crate) fn flavor(headers: &HeaderMap) -> Option<Grpc> {
    let value = headers.get(CONTENT_TYPE)?.as_bytes();
    // Media types are case-insensitive (RFC 9110 section 8.3.1).
    let starts = |prefix: &[u8]| {
        value
            .get(..prefix.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
    };
    if starts(b"application/grpc-web-text") {
        Some(Grpc::WebText)
    } else if starts(b"application/grpc-web") {
        Some(Grpc::Web)
    } else if starts(b"application/grpc") {
        Some(Grpc::Native)
    } else {
        None
    }
}

/// The gRPC status codes the layer answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    InvalidArgument = 3,
    ResourceExhausted = 8,
    Unavailable = 14,
}

/// A duration in whole milliseconds, rounded up: a client told `0` retries at once.
pub(crate) fn ceil_millis(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// The wait a limited call is told, in milliseconds: the decision's wait rounded
/// up, never 0. `grpc-retry-pushback-ms` and `RetryInfo` both carry this value.
pub(crate) fn retry_millis(decision: &Decision) -> u64 {
    ceil_millis(decision.retry_after()).max(1)
}

/// What `grpc-retry-pushback-ms` says.
enum Pushback {
    /// Retry after this many milliseconds.
    After(u64),
    /// Do not retry: no wait would help (gRFC A6: a negative pushback).
    Never,
}

/// Over the limit: `RESOURCE_EXHAUSTED` with the wait in the pushback metadata
/// and in `RetryInfo`, and the exhausted quotas in `QuotaFailure`.
pub(crate) fn too_many(
    grpc: Grpc,
    policy: &Policy,
    decision: Decision,
    kind: &str,
    style: HeaderStyle,
) -> Response<Bytes> {
    let retry = retry_millis(&decision);
    let message = format!(
        "rate limit exceeded: policy {}, retry in {retry} ms",
        policy.name()
    );
    let mut res = trailers_only(
        grpc,
        Code::ResourceExhausted,
        &message,
        Some(Pushback::After(retry)),
    );
    details::insert(
        res.headers_mut(),
        Code::ResourceExhausted,
        &message,
        Some(Duration::from_millis(retry)),
        details::exhausted(policy, &decision, kind),
    );
    apply_report(res.headers_mut(), report(style, policy, &decision));
    res.extensions_mut().insert(decision);
    res
}

/// The call costs more than a capacity of its policy: `RESOURCE_EXHAUSTED`, but
/// with a pushback telling retry policies not to retry and no `RetryInfo`.
pub(crate) fn cost_too_high(grpc: Grpc, policy: &Policy, cost: u64, kind: &str) -> Response<Bytes> {
    let message = format!(
        "rate limit exceeded: this call costs {cost}, more than policy {} ever admits at once \
         ({}); it can never be admitted",
        policy.name(),
        policy.max_cost()
    );
    let mut res = trailers_only(
        grpc,
        Code::ResourceExhausted,
        &message,
        Some(Pushback::Never),
    );
    details::insert(
        res.headers_mut(),
        Code::ResourceExhausted,
        &message,
        None,
        details::too_costly(policy, cost, kind),
    );
    res
}

/// No key to limit by: `INVALID_ARGUMENT`, naming the kind of key (never a value).
pub(crate) fn missing_key(grpc: Grpc, kind: &str) -> Response<Bytes> {
    let message = format!("no rate limit key ({kind}) in this call");
    trailers_only(grpc, Code::InvalidArgument, &message, None)
}

/// The store failed and the layer denies: `UNAVAILABLE`, retry in a second.
pub(crate) fn store_down(grpc: Grpc, failure: StoreFailure) -> Response<Bytes> {
    let message = "rate limit store unavailable, retry shortly";
    let retry = ceil_millis(STORE_RETRY_AFTER);
    let mut res = trailers_only(
        grpc,
        Code::Unavailable,
        message,
        Some(Pushback::After(retry)),
    );
    details::insert(
        res.headers_mut(),
        Code::Unavailable,
        message,
        Some(STORE_RETRY_AFTER),
        Vec::new(),
    );
    res.extensions_mut().insert(failure);
    res
}

/// HTTP 200 with the status in the only header block and an empty body, which
/// ends the stream: a gRPC "trailers-only" response.
fn trailers_only(
    grpc: Grpc,
    code: Code,
    message: &str,
    pushback: Option<Pushback>,
) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, grpc.content_type());
    headers.insert(GRPC_STATUS, HeaderValue::from(code as u16));
    if let Ok(message) = HeaderValue::try_from(percent_encode(message)) {
        headers.insert(GRPC_MESSAGE, message);
    }
    match pushback {
        Some(Pushback::After(ms)) => {
            headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
        }
        Some(Pushback::Never) => {
            headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
        }
        None => {}
    }
    res
}

/// `grpc-message` is percent-encoded UTF-8: every byte outside printable ASCII,
/// and `%` itself, becomes `%XX` (gRPC over HTTP/2, "Status-Message"). The
/// messages are the layer's own, but a key kind (from `from_fn`) may hold anything.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryStore, Quota};
    use http::{Request, StatusCode};

    fn parts(path: &str, content_type: Option<&str>) -> Parts {
        let mut req = Request::post(path);
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, ct);
        }
        req.body(()).unwrap().into_parts().0
    }

    #[test]
    fn grpc_calls_are_told_by_their_content_type() {
        let kind = |ct| flavor(&parts("/", Some(ct)).headers);
        assert_eq!(kind("application/grpc"), Some(Grpc::Native));
        assert_eq!(kind("application/grpc+proto"), Some(Grpc::Native));
        assert_eq!(kind("Application/GRPC"), Some(Grpc::Native));
        assert_eq!(kind("application/grpc-web+proto"), Some(Grpc::Web));
        assert_eq!(kind("application/grpc-web-text"), Some(Grpc::WebText));
        assert_eq!(kind("application/json"), None);
        assert_eq!(kind("application/grp"), None);
        assert!(!is_grpc(&parts("/", None)));
        assert!(is_grpc(&parts("/", Some("application/grpc"))));
    }

    #[test]
    fn methods_come_from_the_path_alone() {
        let method = |path: &str| {
            let p = parts(path, None);
            grpc_method(&p).map(|(s, m)| (s.to_owned(), m.to_owned()))
        };
        assert_eq!(
            method("/shop.v1.Orders/Create"),
            Some(("shop.v1.Orders".into(), "Create".into()))
        );
        for bad in ["/", "/x", "/x/", "//m", "/a/b/c", "/shop.v1.Orders"] {
            assert_eq!(method(bad), None, "{bad}");
        }
    }

    #[test]
    fn milliseconds_round_up() {
        assert_eq!(ceil_millis(Duration::ZERO), 0);
        assert_eq!(ceil_millis(Duration::from_micros(1)), 1);
        assert_eq!(ceil_millis(Duration::from_millis(250)), 250);
        assert_eq!(ceil_millis(Duration::from_micros(250_001)), 251);
        assert_eq!(ceil_millis(Duration::MAX), u64::MAX);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("retry in 5 ms"), "retry in 5 ms");
        assert_eq!(percent_encode("100% é\n"), "100%25 %C3%A9%0A");
    }

    fn limited() -> (Policy, Decision) {
        let q = Quota::per_second(4).unwrap();
        let store = MemoryStore::new();
        store.check_at("k", &[q], 4, 0).unwrap();
        // 100 us later the next token is 249.9 ms away.
        let d = store.check_at("k", &[q], 1, 100).unwrap();
        assert!(!d.allowed());
        (Policy::new("api", [q]).unwrap(), d)
    }

    #[test]
    fn limited_calls_are_resource_exhausted_trailers_only() {
        let (policy, decision) = limited();
        let res = too_many(Grpc::Native, &policy, decision, "ip", HeaderStyle::Ietf);
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.body().is_empty());
        let h = res.headers();
        assert_eq!(h[CONTENT_TYPE], "application/grpc");
        assert_eq!(h[GRPC_STATUS], "8");
        assert_eq!(
            h[GRPC_MESSAGE],
            "rate limit exceeded: policy api, retry in 250 ms"
        );
        assert_eq!(h[GRPC_RETRY_PUSHBACK_MS], "250");
        assert_eq!(h["ratelimit"], "\"api\";r=0;t=1");
        assert!(!h.contains_key("retry-after"));
        assert!(res.extensions().get::<Decision>().is_some());
    }

    #[test]
    fn other_answers_have_their_own_codes() {
        let (policy, _) = limited();
        let res = cost_too_high(Grpc::Web, &policy, 9, "ip");
        assert_eq!(res.headers()[CONTENT_TYPE], "application/grpc-web");
        assert_eq!(res.headers()[GRPC_STATUS], "8");
        assert_eq!(res.headers()[GRPC_RETRY_PUSHBACK_MS], "-1");
        let res = missing_key(Grpc::Native, "header:x-api-key");
        assert_eq!(res.headers()[GRPC_STATUS], "3");
        assert_eq!(
            res.headers()[GRPC_MESSAGE],
            "no rate limit key (header:x-api-key) in this call"
        );
        assert!(!res.headers().contains_key(GRPC_RETRY_PUSHBACK_MS));
        let failure = StoreFailure(std::sync::Arc::new(crate::Error::InvalidConfig("x".into())));
        let res = store_down(Grpc::Native, failure);
        assert_eq!(res.headers()[GRPC_STATUS], "14");
        assert_eq!(res.headers()[GRPC_RETRY_PUSHBACK_MS], "1000");
        assert!(res.extensions().get::<StoreFailure>().is_some());
    }
}
