//! Settling a request's cost by its response: [`Settle`], [`ResponseHead`],
//! and the settlement an admitted request carries until its response is
//! known.

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue, StatusCode};

use crate::decision::Decision;
use crate::limiter::RateLimiter;
use crate::limiter::signed;
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

    /// The trailers, for a gRPC response settled when its body ended (`None`
    /// otherwise, and when the body ended without trailers).
    pub fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers
    }

    /// Whether the response is a gRPC one (`content-type: application/grpc`,
    /// with or without a suffix).
    pub fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// The gRPC status code (`0` is `OK`), from the trailers or, for a
    /// trailers-only answer, the headers. `None` for a response that is not
    /// gRPC, or whose body ended (or was dropped) before a valid status came.
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
    /// status below 400. A gRPC call whose status never came (the client went
    /// away, the stream broke) did not succeed.
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
    headers
        .get(http::header::CONTENT_TYPE)
        .map(HeaderValue::as_bytes)
        .is_some_and(|ct| {
            ct.strip_prefix(b"application/grpc")
                .is_some_and(|rest| matches!(rest.first(), None | Some(b'+' | b';')))
        })
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
    /// it: nothing for [`Settle::Keep`].
    pub(crate) fn settle(self, head: &ResponseHead<'_>) {
        let delta = match (self.settle)(head, &self.decision) {
            Settle::Keep => return,
            Settle::Refund if self.cost == 0 => return,
            Settle::Refund => -signed(self.cost),
            Settle::Charge(0) => return,
            Settle::Charge(n) => signed(n.min(MAX_EXACT)),
        };
        let settlement = if delta < 0 { "refund" } else { "charge" };
        observe::settled(self.policy.name(), settlement, delta.unsigned_abs());
        self.apply(delta);
    }

    /// `delta` tokens spent (or given back) where the decision was made: in
    /// the fallback's share, in a memory store at once, or sent to Redis in a
    /// task of its own (batched with the checks in flight), so the response
    /// never waits for it. A store that fails keeps the tokens spent; the
    /// failure is reported as any store failure.
    fn apply(self, delta: i64) {
        let Ticket {
            limiter,
            key,
            policy,
            by,
            ..
        } = self;
        match by {
            By::Fallback(scaled) => {
                if let Some(fallback) = limiter.fallback_store() {
                    fallback.adjust_scaled(&key, &scaled, delta);
                }
            }
            By::Store => {
                if let Some(memory) = limiter.store().as_memory() {
                    memory.adjust_now(&key, &policy, delta);
                    return;
                }
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    return;
                };
                runtime.spawn(async move {
                    // Store failures are reported by the store itself.
                    let _ = limiter.store().adjust(&key, &policy, delta).await;
                });
            }
        }
    }
}

/// A gRPC response's settlement, waiting for the status in the trailers. A
/// body dropped or ended without one settles with no status.
pub(crate) struct Trailing {
    ticket: Option<Box<Ticket>>,
    status: StatusCode,
    headers: HeaderMap,
}

impl Trailing {
    pub(crate) fn new(ticket: Box<Ticket>, status: StatusCode, headers: HeaderMap) -> Box<Self> {
        Box::new(Trailing {
            ticket: Some(ticket),
            status,
            headers,
        })
    }

    /// Settles with `trailers` (`None`: the body ended without them).
    pub(crate) fn finish(&mut self, trailers: Option<&HeaderMap>) {
        if let Some(ticket) = self.ticket.take() {
            (*ticket).settle(&ResponseHead::new(self.status, &self.headers, trailers));
        }
    }
}

impl Drop for Trailing {
    fn drop(&mut self) {
        self.finish(None);
    }
}

/// Settles `ticket` by the response `status` and `headers` now, or, for a
/// gRPC response whose status comes in the trailers, hands back what waits
/// for them in the body.
pub(crate) fn settle_now(
    ticket: Box<Ticket>,
    status: StatusCode,
    headers: &HeaderMap,
) -> Option<Box<Trailing>> {
    if is_grpc_response(headers) && !headers.contains_key("grpc-status") {
        return Some(Trailing::new(ticket, status, headers.clone()));
    }
    (*ticket).settle(&ResponseHead::new(status, headers, None));
    None
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
        // No status (the body ended without trailers): not a success.
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
}
