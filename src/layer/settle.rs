//! Settling a request's cost by its response: [`Settle`], [`ResponseHead`],
//! and the settlement an admitted request carries until its response is
//! known.

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue, StatusCode};

use super::media::{Grpc, media_type};
use crate::decision::Decision;
use crate::limiter::RateLimiter;
use crate::observe;
use crate::policy::Policy;
use crate::quota::MAX_EXACT;
/// What a response does to the cost its request was charged (see
/// [`RateLimitLayer::settle`](super::RateLimitLayer::settle)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// The cost stands (nothing is sent to the store).
    Keep,
    /// The request's cost is given back: it does not count. Each bucket is
    /// filled up to its capacity at most, so the limit admits no more than
    /// if the request had never come.
    Refund,
    /// This many tokens more are spent, whatever the buckets hold: a bucket
    /// may go into debt, down to minus its capacity at most (the most one
    /// request may cost), and later requests wait until it is refilled.
    Charge(u64),
}

/// The response as [`RateLimitLayer::settle`](super::RateLimitLayer::settle)
/// sees it: its status and headers, and for gRPC its `grpc-status`, from the
/// headers of a trailers-only answer or from the trailers after the body.
#[derive(Debug)]
pub struct ResponseHead<'a> {
    status: StatusCode,
    headers: &'a HeaderMap,
    trailers: Option<&'a HeaderMap>,
    grpc: bool,
}

impl<'a> ResponseHead<'a> {
    pub(crate) fn new(
        status: StatusCode,
        headers: &'a HeaderMap,
        trailers: Option<&'a HeaderMap>,
    ) -> Self {
        ResponseHead {
            status,
            headers,
            trailers,
            grpc: is_grpc_response(headers),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The response headers.
    pub fn headers(&self) -> &HeaderMap {
        self.headers
    }

    /// The trailers, for a gRPC response settled when they came after its
    /// body (`None` otherwise).
    pub fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers
    }

    /// Whether the response is a gRPC one (`content-type: application/grpc`,
    /// with or without a suffix, or gRPC-Web).
    pub fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// The gRPC status code (`0` is `OK`), from the trailers or, for a
    /// trailers-only answer, the headers. `None` for a response that is not
    /// gRPC or whose status is not a valid code.
    pub fn grpc_status(&self) -> Option<u16> {
        if !self.grpc {
            return None;
        }
        let value = match self.trailers {
            Some(trailers) => trailers.get("grpc-status"),
            None => self.headers.get("grpc-status"),
        };
        value.and_then(grpc_code)
    }

    /// Whether the request succeeded: a gRPC status of `OK`, or an HTTP
    /// status below 400.
    pub fn is_success(&self) -> bool {
        if self.grpc {
            self.grpc_status() == Some(0)
        } else {
            self.status.as_u16() < 400
        }
    }
}

/// A `grpc-status` value: a decimal code of 0 to 16 (anything else is not a
/// status a gRPC peer may send; it reads as none).
fn grpc_code(value: &HeaderValue) -> Option<u16> {
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > 2 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let code = bytes.iter().fold(0u16, |n, b| n * 10 + u16::from(b - b'0'));
    (code <= 16).then_some(code)
}

fn is_grpc_response(headers: &HeaderMap) -> bool {
    grpc_kind(headers).is_some()
}

/// gRPC over HTTP/2, or gRPC-Web.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GrpcKind {
    Grpc,
    Web,
}

/// The gRPC kind of a response, by its `content-type`, read as a request's
/// is (`application/grpc` with an optional `+codec` or parameters, or
/// `application/grpc-web` and `-web-text`, in any case), or, without one
/// that says so, by a `grpc-status` in its headers (a trailers-only answer
/// that names no content type is still a gRPC status).
fn grpc_kind(headers: &HeaderMap) -> Option<GrpcKind> {
    let named = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|ct| media_type(ct.as_bytes()));
    match named {
        Some(Grpc::Native) => Some(GrpcKind::Grpc),
        Some(Grpc::Web | Grpc::WebText) => Some(GrpcKind::Web),
        None if headers.contains_key("grpc-status") => Some(GrpcKind::Grpc),
        None => None,
    }
}

/// The settling function of a layer.
pub(crate) type SettleFn = dyn Fn(&ResponseHead<'_>, &Decision) -> Settle + Send + Sync;

/// The layer's settling function, shared by its clones.
#[derive(Clone)]
pub(crate) struct Settler(pub(crate) Arc<SettleFn>);

impl fmt::Debug for Settler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Settler")
    }
}

/// Who made the decision a settlement adjusts.
pub(crate) enum By {
    /// The store.
    Store,
    /// The fallback, under this instance's share of the policy.
    Fallback(Policy),
}

/// What an admitted request needs to settle its cost once its response is
/// known: carried from the check to the response (boxed, only when the layer
/// settles).
pub(crate) struct Ticket {
    settle: Arc<SettleFn>,
    limiter: RateLimiter,
    key: String,
    policy: Policy,
    cost: u64,
    by: By,
    decision: Decision,
}

impl Ticket {
    pub(crate) fn new(
        settler: &Settler,
        limiter: &RateLimiter,
        key: String,
        policy: Policy,
        cost: u64,
        by: By,
        decision: Decision,
    ) -> Box<Self> {
        Box::new(Ticket {
            settle: Arc::clone(&settler.0),
            limiter: limiter.clone(),
            key,
            policy,
            cost,
            by,
            decision,
        })
    }

    /// Asks the layer's function what `head` does to the cost, and applies
    /// it: nothing for [`Settle::Keep`]. Returns the tokens charged (0
    /// unless a charge), for the headers still to be written.
    pub(crate) fn settle(self, head: &ResponseHead<'_>) -> u64 {
        let delta = match (self.settle)(head, &self.decision) {
            Settle::Keep => return 0,
            Settle::Refund if self.cost == 0 => return 0,
            Settle::Refund => -signed(self.cost),
            Settle::Charge(0) => return 0,
            Settle::Charge(n) => signed(n.min(MAX_EXACT)),
        };
        if !self.apply(delta) {
            return 0;
        }
        u64::try_from(delta).unwrap_or(0)
    }

    /// `delta` tokens spent (or given back) where the decision was made: in
    /// the fallback's share, in a memory store at once, or sent to Redis in a
    /// task of its own (batched with the checks in flight), so the response
    /// never waits for it. A store that fails keeps the tokens spent; the
    /// failure is reported as any store failure. Each settlement is counted
    /// once made, in that task for Redis. False when it could not be made at
    /// all (Redis, without a tokio runtime to send it from).
    fn apply(self, delta: i64) -> bool {
        let Ticket {
            limiter,
            key,
            policy,
            by,
            ..
        } = self;
        match by {
            By::Fallback(scaled) => match limiter.configured_fallback() {
                Some(fallback) => {
                    fallback.adjust_scaled(&key, &scaled, delta);
                    observe::settled(policy.name(), delta);
                    true
                }
                None => false,
            },
            By::Store => {
                if limiter.store().adjust_at_once(&key, &policy, delta) {
                    observe::settled(policy.name(), delta);
                    return true;
                }
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    return false;
                };
                runtime.spawn(async move {
                    // Store failures are reported by the store itself.
                    if limiter.store().adjust(&key, &policy, delta).await.is_ok() {
                        observe::settled(policy.name(), delta);
                    }
                });
                true
            }
        }
    }
}

/// A gRPC response's settlement, waiting for the status in the trailers.
/// Settled only when they come: a body that ends without them, fails, or is
/// dropped first (a client that reset the stream) leaves the cost as it
/// stands, whatever `settle` would have said.
pub(crate) struct Trailing {
    ticket: Box<Ticket>,
    status: StatusCode,
    headers: HeaderMap,
}

impl Trailing {
    pub(crate) fn new(ticket: Box<Ticket>, status: StatusCode, headers: HeaderMap) -> Box<Self> {
        Box::new(Trailing {
            ticket,
            status,
            headers,
        })
    }

    /// Settles by `trailers`, the end of the response.
    pub(crate) fn finish(self, trailers: &HeaderMap) {
        let Trailing {
            ticket,
            status,
            headers,
        } = self;
        let _ = (*ticket).settle(&ResponseHead::new(status, &headers, Some(trailers)));
    }
}

/// Settles `ticket` by the response `status` and `headers` now, or, for a
/// gRPC response whose status comes in the trailers, hands back what waits
/// for them in the body. A gRPC-Web response without its status in the
/// headers keeps its cost: its trailers are a frame of the body, which the
/// layer does not parse.
pub(crate) fn settle_now(
    ticket: Box<Ticket>,
    status: StatusCode,
    headers: &HeaderMap,
) -> (Option<Box<Trailing>>, u64) {
    if !headers.contains_key("grpc-status") {
        match grpc_kind(headers) {
            Some(GrpcKind::Grpc) => {
                return (Some(Trailing::new(ticket, status, headers.clone())), 0);
            }
            Some(GrpcKind::Web) => return (None, 0),
            None => {}
        }
    }
    let charged = (*ticket).settle(&ResponseHead::new(status, headers, None));
    (None, charged)
}

/// `v` as a signed count of tokens (at most `i64::MAX`).
fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(status: u16, headers: &[(&'static str, &'static str)]) -> HeaderMap {
        let _ = status;
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn success_is_a_status_below_400_or_grpc_ok() {
        let plain = head(200, &[]);
        assert!(ResponseHead::new(StatusCode::OK, &plain, None).is_success());
        assert!(ResponseHead::new(StatusCode::FOUND, &plain, None).is_success());
        assert!(!ResponseHead::new(StatusCode::UNAUTHORIZED, &plain, None).is_success());
        let grpc = head(200, &[("content-type", "application/grpc+proto")]);
        let ok = head(200, &[("grpc-status", "0")]);
        let denied = head(200, &[("grpc-status", "16")]);
        let r = ResponseHead::new(StatusCode::OK, &grpc, Some(&ok));
        assert_eq!((r.grpc_status(), r.is_success()), (Some(0), true));
        let r = ResponseHead::new(StatusCode::OK, &grpc, Some(&denied));
        assert_eq!((r.grpc_status(), r.is_success()), (Some(16), false));
        // No status: not a success.
        let r = ResponseHead::new(StatusCode::OK, &grpc, None);
        assert_eq!((r.grpc_status(), r.is_success()), (None, false));
        // Trailers-only: the status is in the headers.
        let only = head(
            200,
            &[("content-type", "application/grpc"), ("grpc-status", "7")],
        );
        let r = ResponseHead::new(StatusCode::OK, &only, None);
        assert_eq!(r.grpc_status(), Some(7));
    }

    #[test]
    fn only_valid_grpc_codes_are_read() {
        for (value, code) in [("0", Some(0)), ("16", Some(16)), ("17", None), ("", None)] {
            let v = HeaderValue::from_static(value);
            assert_eq!(grpc_code(&v), code, "{value:?}");
        }
        for value in ["-1", "1 ", "+1", "001", "0x1"] {
            assert_eq!(
                grpc_code(&HeaderValue::from_static(value)),
                None,
                "{value:?}"
            );
        }
        assert!(!is_grpc_response(&head(
            200,
            &[("content-type", "application/grpcx")]
        )));
        assert!(is_grpc_response(&head(
            200,
            &[("content-type", "application/grpc;x=y")]
        )));
    }

    /// A response is told to be gRPC as a request is: its content type in
    /// any case and with spaces, or a `grpc-status` in its headers.
    #[test]
    fn a_grpc_response_is_known_as_a_grpc_request_is() {
        for ct in [
            "Application/gRPC",
            "application/grpc ; x=y",
            "APPLICATION/GRPC+proto",
        ] {
            let h = head(200, &[("content-type", ct)]);
            assert_eq!(grpc_kind(&h), Some(GrpcKind::Grpc), "{ct:?}");
        }
        let web = head(200, &[("content-type", "Application/grpc-web-text")]);
        assert_eq!(grpc_kind(&web), Some(GrpcKind::Web));
        // A trailers-only answer without a content type: settled by its
        // status, not by its HTTP 200.
        let bare = head(200, &[("grpc-status", "16")]);
        let r = ResponseHead::new(StatusCode::OK, &bare, None);
        assert_eq!((r.grpc_status(), r.is_success()), (Some(16), false));
        assert_eq!(
            grpc_kind(&head(200, &[("content-type", "text/plain")])),
            None
        );
    }

    mod through_the_layer {
        use std::collections::VecDeque;
        use std::convert::Infallible;
        use std::pin::Pin;
        use std::task::{Context, Poll};

        use bytes::Bytes;
        use http::{HeaderMap, HeaderValue, Request, Response};
        use http_body::{Body, Frame};
        use http_body_util::BodyExt;
        use tower::{Layer, ServiceExt};

        use crate::key::Global;
        use crate::layer::RateLimitLayer;
        use crate::quota::Quota;
        use crate::store::MemoryStore;

        /// A response body of the given frames, in order.
        struct Frames(VecDeque<Frame<Bytes>>);

        impl Body for Frames {
            type Data = Bytes;
            type Error = Infallible;

            fn poll_frame(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
                Poll::Ready(self.0.pop_front().map(Ok))
            }
        }

        fn trailers(status: &'static str) -> Frame<Bytes> {
            let mut map = HeaderMap::new();
            map.insert("grpc-status", HeaderValue::from_static(status));
            Frame::trailers(map)
        }

        /// A gRPC answer: `content_type`, `head` headers, then the frames.
        fn answer(
            content_type: &'static str,
            head: Option<&'static str>,
            frames: Vec<Frame<Bytes>>,
        ) -> Response<Frames> {
            let mut res = Response::new(Frames(frames.into()));
            res.headers_mut()
                .insert("content-type", HeaderValue::from_static(content_type));
            if let Some(status) = head {
                res.headers_mut()
                    .insert("grpc-status", HeaderValue::from_static(status));
            }
            res
        }

        /// Remaining tokens of a 10-a-day global bucket after one call whose
        /// answer is `make()`, settled by `layer`, with the body read by
        /// `read` (`false`: dropped after its first frame).
        async fn left_after(
            layer: fn(RateLimitLayer) -> RateLimitLayer,
            make: fn() -> Response<Frames>,
            read: bool,
        ) -> u64 {
            let store = MemoryStore::new();
            let quota = Quota::new(10, std::time::Duration::from_secs(86_400)).unwrap();
            let svc = layer(RateLimitLayer::new(store.clone(), quota).key(Global)).layer(
                tower::service_fn(move |_: Request<()>| async move { Ok::<_, Infallible>(make()) }),
            );
            let res = svc.oneshot(Request::new(())).await.unwrap();
            let mut body = res.into_body();
            if read {
                while let Some(frame) = body.frame().await {
                    frame.unwrap();
                }
            } else {
                let _ = body.frame().await;
                drop(body);
            }
            let policy = crate::policy::Policy::from(quota);
            store
                .check_now("default:global:global", &policy, 0)
                .unwrap()
                .remaining()
        }

        fn data() -> Frame<Bytes> {
            Frame::data(Bytes::from_static(b"reply"))
        }

        #[tokio::test]
        async fn a_status_in_the_trailers_settles_when_they_come() {
            let ok = || answer("application/grpc", None, vec![data(), trailers("0")]);
            let denied = || answer("application/grpc", None, vec![data(), trailers("7")]);
            let failures = |l: RateLimitLayer| l.count_only_failures();
            let successes = |l: RateLimitLayer| l.count_only_successes();
            assert_eq!(left_after(failures, ok, true).await, 10);
            assert_eq!(left_after(failures, denied, true).await, 9);
            assert_eq!(left_after(successes, ok, true).await, 9);
            assert_eq!(left_after(successes, denied, true).await, 10);
        }

        #[tokio::test]
        async fn a_trailers_only_answer_settles_by_its_headers() {
            let missing = || answer("application/grpc+proto", Some("5"), vec![]);
            let successes = |l: RateLimitLayer| l.count_only_successes();
            let failures = |l: RateLimitLayer| l.count_only_failures();
            assert_eq!(left_after(successes, missing, true).await, 10);
            assert_eq!(left_after(failures, missing, true).await, 9);
        }

        /// A client that resets the stream before the status cannot have its
        /// call refunded: the cost stands, whatever `settle` says.
        #[tokio::test]
        async fn a_body_dropped_before_its_status_keeps_the_cost() {
            let ok = || answer("application/grpc", None, vec![data(), trailers("0")]);
            let ended = || answer("application/grpc", None, vec![data()]);
            let refund_all = |l: RateLimitLayer| l.settle(|_, _| super::super::Settle::Refund);
            assert_eq!(left_after(refund_all, ok, false).await, 9);
            assert_eq!(left_after(refund_all, ended, true).await, 9);
            assert_eq!(left_after(refund_all, ok, true).await, 10);
        }

        /// gRPC-Web carries its trailers in the body, which the layer does not
        /// parse: a status in the headers settles, none keeps the cost.
        #[tokio::test]
        async fn grpc_web_settles_by_a_status_in_its_headers_only() {
            let in_head = || answer("application/grpc-web+proto", Some("0"), vec![data()]);
            let in_body = || answer("application/grpc-web", None, vec![data()]);
            let failures = |l: RateLimitLayer| l.count_only_failures();
            let successes = |l: RateLimitLayer| l.count_only_successes();
            assert_eq!(left_after(failures, in_head, true).await, 10);
            assert_eq!(left_after(successes, in_body, true).await, 9);
            assert_eq!(left_after(failures, in_body, true).await, 9);
        }

        #[test]
        fn count_only_statuses_refuses_lists_that_refund_everything() {
            let layer = || RateLimitLayer::new(MemoryStore::new(), Quota::per_second(1).unwrap());
            assert!(layer().count_only_statuses([]).is_err());
            let err = layer().count_only_statuses([401, 4010]).unwrap_err();
            assert!(err.to_string().contains("4010"), "{err}");
            assert!(layer().count_only_statuses([99]).is_err());
            assert!(layer().count_only_statuses([401, 403]).is_ok());
        }

        /// A charge settled at the head is in the headers written after it:
        /// they never say more remains than does.
        #[tokio::test]
        async fn a_charge_at_the_head_is_in_the_headers() {
            use crate::layer::HeaderStyle;
            for (style, name) in [
                (HeaderStyle::Ietf, "ratelimit"),
                (HeaderStyle::Legacy, "x-ratelimit-remaining"),
            ] {
                let store = MemoryStore::new();
                let quota = Quota::new(10, std::time::Duration::from_secs(86_400)).unwrap();
                let layer = RateLimitLayer::new(store, quota)
                    .key(Global)
                    .headers(style)
                    .decision_in_response()
                    .settle(|_, _| crate::layer::Settle::Charge(4));
                let svc = layer.layer(tower::service_fn(|_: Request<()>| async {
                    Ok::<_, Infallible>(Response::new(String::new()))
                }));
                let res = svc.oneshot(Request::new(())).await.unwrap();
                let header = res.headers()[name].to_str().unwrap().to_owned();
                // 10 less the request's 1 and the charge's 4.
                let five = if name == "ratelimit" {
                    header.contains(";r=5;")
                } else {
                    header == "5"
                };
                assert!(five, "{name}: {header}");
                let decision = res.extensions().get::<crate::Decision>().unwrap();
                assert_eq!(decision.remaining(), 5);
            }
        }
    }
}
