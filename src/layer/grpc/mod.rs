//! gRPC calls: how the layer recognises them, and the answers it gives them.
//!
//! gRPC clients read the outcome of a call from `grpc-status`, not from the HTTP
//! status: tonic maps a bare HTTP 429 to `UNAVAILABLE` and drops the retry hint.
//! So every answer the layer gives a gRPC call by itself is HTTP 200
//! "trailers-only": one header block holding the status, and no body (see
//! `status.rs`). With tollgate's `tonic` feature, `grpc-status-details-bin` adds
//! the `google.rpc` error details (see `details.rs`).

use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http::request::Parts;

use super::headers::{STORE_RETRY_AFTER, ceil_millis};
use super::media::{Grpc, flavor};
use super::options::HeaderStyle;
use super::outcome::{Answer, StoreFailure};
use super::report::add_report;
use crate::decision::Decision;
use crate::policy::Policy;
#[cfg(feature = "tonic")]
mod details;
// Without tonic-types there is nothing to encode `google.rpc` details with.
#[cfg(not(feature = "tonic"))]
#[path = "no_details.rs"]
mod details;
mod status;

pub use status::GRPC_RETRY_PUSHBACK_MS;
use status::{Code, Pushback, trailers_only};

/// True when `parts` is a gRPC call: a `POST` with a gRPC media type,
/// `application/grpc`, `application/grpc-web` or `application/grpc-web-text`
/// (each optionally with `+proto` or another suffix; case and parameters do
/// not matter), over any HTTP version. The layer answers such calls with gRPC
/// statuses (HTTP 200 trailers-only) instead of HTTP errors.
///
/// Anything else is an ordinary HTTP request, whatever its `content-type`: a
/// `GET` that claims `application/grpc` gets the HTTP answer (429 and so on).
/// Otherwise a client could turn a limited `GET /popular` into an empty 200,
/// which a cache in front of the service would keep and serve to every user.
/// The version is not asked for: gRPC-Web runs over HTTP/1.1, and tonic-web
/// hands it on as `application/grpc` in that version; a `POST` answer marked
/// `no-store`, as every answer of the layer is, is not cached.
///
/// ```
/// use http::{Request, Version};
/// use tollgate::layer::is_grpc;
///
/// let call = |method: &str, version, content_type| {
///     let (parts, ()) = Request::builder()
///         .method(method)
///         .version(version)
///         .uri("/grpc.health.v1.Health/Check")
///         .header("content-type", content_type)
///         .body(()).unwrap().into_parts();
///     is_grpc(&parts)
/// };
/// assert!(call("POST", Version::HTTP_2, "application/grpc+proto"));
/// assert!(call("POST", Version::HTTP_11, "application/grpc-web+proto"));
/// assert!(!call("GET", Version::HTTP_2, "application/grpc"));
/// assert!(!call("POST", Version::HTTP_2, "application/json"));
/// ```
pub fn is_grpc(parts: &Parts) -> bool {
    flavor(parts).is_some()
}

/// The service and method a gRPC path names: `/package.Service/Method` gives
/// `Some(("package.Service", "Method"))`; any other path gives `None`.
///
/// Only the path is read, not the `content-type`: a client must not dodge a
/// per-method policy by sending the same call with another content type. Use it
/// in the [`select_policy`](crate::layer::RateLimitLayer::select_policy) closure, for example
/// for a stricter quota on writes:
///
/// ```
/// use tollgate::layer::{Choice, RateLimitLayer, grpc_method};
/// use tollgate::{MemoryStore, Policy, Quota};
///
/// # fn main() -> Result<(), tollgate::ConfigError> {
/// let writes = Policy::new("writes", [Quota::per_minute(10)?])?;
/// let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(50)?)
///     .select_policy(move |parts| match grpc_method(parts) {
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

/// The gRPC answer for `answer`, for a call of kind `grpc`.
pub(crate) fn render(answer: Answer, grpc: Grpc, style: HeaderStyle) -> Response<Bytes> {
    match answer {
        Answer::TooMany {
            policy,
            decision,
            kind,
        } => too_many(grpc, &policy, decision, &kind, style),
        Answer::CostTooHigh { cost, policy, kind } => cost_too_high(grpc, &policy, cost, &kind),
        Answer::MissingKey { kind } => missing_key(grpc, &kind),
        Answer::StoreDown(failure) => store_down(grpc, failure),
    }
}

/// The wait a limited call is told, in milliseconds: the decision's wait rounded
/// up, never 0. `grpc-retry-pushback-ms` and `RetryInfo` both carry this value.
fn retry_millis(decision: &Decision) -> u64 {
    ceil_millis(decision.retry_after()).max(1)
}

/// Over the limit: `RESOURCE_EXHAUSTED` with the wait in the pushback metadata
/// and in `RetryInfo`, and the exhausted quotas in `QuotaFailure`.
fn too_many(
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
    add_report(res.headers_mut(), style, policy, &decision);
    res.extensions_mut().insert(decision);
    res
}

/// The call costs more than a capacity of its policy: `RESOURCE_EXHAUSTED`, but
/// with a pushback telling retry policies not to retry and no `RetryInfo`.
fn cost_too_high(grpc: Grpc, policy: &Policy, cost: u64, kind: &str) -> Response<Bytes> {
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
fn missing_key(grpc: Grpc, kind: &str) -> Response<Bytes> {
    let message = format!("no rate limit key ({kind}) in this call");
    trailers_only(grpc, Code::InvalidArgument, &message, None)
}

/// The store failed and the layer denies: `UNAVAILABLE`, retry in a second.
fn store_down(grpc: Grpc, failure: StoreFailure) -> Response<Bytes> {
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

#[cfg(test)]
mod tests {
    use super::status::{GRPC_MESSAGE, GRPC_STATUS};
    use super::*;
    use crate::quota::Quota;
    use crate::store::MemoryStore;
    use http::header::CONTENT_TYPE;
    use http::{Request, StatusCode};

    fn parts(path: &str, content_type: Option<&str>) -> Parts {
        let mut req = Request::post(path).version(http::Version::HTTP_2);
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, ct);
        }
        req.body(()).unwrap().into_parts().0
    }

    #[test]
    fn is_grpc_reads_the_content_type() {
        assert!(!is_grpc(&parts("/", None)));
        assert!(is_grpc(&parts("/", Some("application/grpc"))));
        assert!(!is_grpc(&parts("/", Some("application/grpcx"))));
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

    pub(super) fn limited() -> (Policy, Decision) {
        let policy = Policy::new("api", [Quota::per_second(4).unwrap()]).unwrap();
        let store = MemoryStore::new();
        let _ = store.decide_at("k", &policy, 4, 0).unwrap();
        // 100 us later the next token is 249.9 ms away.
        let d = store.decide_at("k", &policy, 1, 100).unwrap();
        assert!(!d.allowed());
        (policy, d)
    }

    #[test]
    fn limited_calls_are_resource_exhausted_trailers_only() {
        let (policy, decision) = limited();
        let res = too_many(Grpc::Native, &policy, decision, "ip", HeaderStyle::Ietf);
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.body().is_empty());
        let h = res.headers();
        assert_eq!(h[CONTENT_TYPE], "application/grpc");
        assert_eq!(h[http::header::CACHE_CONTROL], "no-store");
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
        let failure = StoreFailure::new(crate::Error::Timeout(Duration::from_millis(5)));
        let res = store_down(Grpc::Native, failure);
        assert_eq!(res.headers()[GRPC_STATUS], "14");
        assert_eq!(res.headers()[GRPC_RETRY_PUSHBACK_MS], "1000");
        assert!(res.extensions().get::<StoreFailure>().is_some());
    }

    /// The bytes a URI path may hold, and a path made of them.
    const PATH_BYTES: &[u8] = b"/////abc.XYZ019-_~%:@!$&'()*+,;=";

    proptest::proptest! {
        #![proptest_config(crate::hostile_input::config())]

        #[test]
        fn any_path_splits_into_a_method_or_none_within_budget(
            path in crate::hostile_input::motif(PATH_BYTES, 60 * 1024),
        ) {
            let path = format!("/{}", String::from_utf8(path).unwrap());
            let Ok(uri) = http::Uri::try_from(path.as_str()) else {
                return Ok(());
            };
            let (p, ()) = Request::post(uri).body(()).unwrap().into_parts();
            let method = crate::hostile_input::within_budget("grpc_method", || grpc_method(&p));
            if let Some((service, method)) = method {
                proptest::prop_assert!(!service.is_empty() && !method.is_empty());
                proptest::prop_assert!(!method.contains('/'));
                proptest::prop_assert_eq!(format!("/{service}/{method}"), p.uri.path());
            }
        }
    }
}
