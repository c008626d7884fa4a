//! The layer's public options: per-request policy choice, missing keys,
//! store errors, header style, rejections and delay mode.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tokio::sync::Semaphore;

use super::dyn_key::Extractor;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::key::KeyExtractor;
use crate::policy::Policy;

/// Builds the body and headers of a custom 429 from the decision.
pub(crate) type RejectFn = dyn Fn(&Decision) -> Response<Bytes> + Send + Sync;

/// What the [`select_policy`](crate::layer::RateLimitLayer::select_policy) closure decides for
/// one request.
#[derive(Clone, Debug)]
#[non_exhaustive]
#[must_use]
pub enum Choice {
    /// Limit by the layer's own policy (the one given to
    /// [`RateLimitLayer::new`](crate::layer::RateLimitLayer::new)).
    Default,
    /// Limit by this policy.
    Policy(Policy),
    /// Do not limit this request: no key is extracted, the store is not asked and
    /// no rate limit header is added (health checks, internal callers).
    Exempt,
}

impl From<Policy> for Choice {
    fn from(policy: Policy) -> Self {
        Choice::Policy(policy)
    }
}

/// What a request is limited by, as the layer's policy closure or its
/// [`PolicyTable`](crate::layer::PolicyTable) chose: a [`Choice`], or a
/// policy with a key of its own (a table rule's).
pub(crate) enum Selected {
    Default,
    Policy(Policy),
    Keyed(Policy, Extractor),
    Exempt,
}

impl From<Choice> for Selected {
    fn from(choice: Choice) -> Self {
        match choice {
            Choice::Default => Selected::Default,
            Choice::Policy(policy) => Selected::Policy(policy),
            Choice::Exempt => Selected::Exempt,
        }
    }
}

/// What the layer does when its key extractor finds no key in a request (no API
/// key header, no peer address). Set with
/// [`RateLimitLayer::on_missing_key`](crate::layer::RateLimitLayer::on_missing_key).
///
/// The default is [`MissingKey::reject`]: a limit keyed on a header that clients
/// could simply leave out would otherwise be no limit at all.
#[derive(Clone, Debug)]
#[must_use]
pub struct MissingKey(pub(crate) Missing);

#[derive(Clone, Debug)]
pub(crate) enum Missing {
    Reject,
    Allow,
    Fallback(Extractor),
}

impl MissingKey {
    /// Answer `400 Bad Request` with a short plain-text body naming the missing
    /// key (for example `header:x-api-key`); gRPC calls get `INVALID_ARGUMENT`
    /// with the same words. The inner service is not called.
    pub fn reject() -> Self {
        MissingKey(Missing::Reject)
    }

    /// Forward the request without limiting it (no headers, no decision).
    pub fn allow() -> Self {
        MissingKey(Missing::Allow)
    }

    /// Use another extractor instead, for example the client IP when no API key
    /// was sent. Its [`kind`](KeyExtractor::kind) goes into the storage key, so
    /// fallback keys never share a bucket with primary ones. When the fallback
    /// finds no key either, the request is rejected as with [`MissingKey::reject`].
    pub fn fallback(key: impl KeyExtractor) -> Self {
        MissingKey(Missing::Fallback(Extractor::new(key)))
    }
}

impl Default for MissingKey {
    fn default() -> Self {
        Self::reject()
    }
}

/// What the layer does when the store cannot decide (Redis down or slow beyond
/// its timeout, its circuit breaker open, or any other error a store returns,
/// except [`Error::CostExceedsCapacity`](crate::Error::CostExceedsCapacity),
/// which is answered as a request that can never be admitted).
///
/// Whatever the policy, the failure is put into the request and response
/// extensions as a [`StoreFailure`](crate::layer::StoreFailure) and reported to
/// `tracing` and `metrics` (with those features), so an outage never goes
/// unnoticed just because requests still pass.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
#[must_use]
pub enum OnStoreError {
    /// Forward the request unlimited (fail open). The default: a rate limiter
    /// should not take the service down with it, as in Envoy, Kong and Spring.
    #[default]
    Allow,
    /// Answer `503 Service Unavailable` with `Retry-After: 1` (fail closed), for
    /// services that the limit protects from overload. gRPC calls get
    /// `UNAVAILABLE` with a pushback of 1000 ms (see the
    /// [module docs](crate::layer#grpc-tonic)).
    Deny,
    /// Decide with an in-process [`Fallback`](crate::Fallback) store, so limits
    /// keep holding (per instance) through the outage; requests it decides
    /// carry a [`Decision`](crate::Decision) with
    /// [`is_fallback`](crate::Decision::is_fallback) and the usual headers. If
    /// the fallback cannot decide either, the request is forwarded as with
    /// `Allow`. See [`Fallback`](crate::Fallback) for the trade-offs.
    ///
    /// Set it with [`RateLimitLayer::fallback`](crate::layer::RateLimitLayer::fallback),
    /// the one way to give a layer or a [`RateLimiter`](crate::RateLimiter)
    /// a fallback.
    #[deprecated(since = "0.1.0", note = "use `RateLimitLayer::fallback(fallback)`")]
    Fallback(crate::Fallback),
}

/// Which rate limit headers the layer adds to responses. Set with
/// [`RateLimitLayer::headers`](crate::layer::RateLimitLayer::headers).
///
/// See the [module docs](crate::layer#response-headers) for the exact values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit`, as in
    /// draft-ietf-httpapi-ratelimit-headers-10 (the default).
    #[default]
    Ietf,
    /// The de facto `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (reset in delay seconds, not an epoch time).
    Legacy,
    /// No rate limit headers (`Retry-After` is still sent on 429 and 503).
    None,
}

/// How the layer answers an HTTP request over its limit. Set with
/// [`RateLimitLayer::rejection`](crate::layer::RateLimitLayer::rejection).
///
/// gRPC calls never get these: they always get the trailers-only
/// `RESOURCE_EXHAUSTED` described in the [module docs](crate::layer#grpc-tonic),
/// because gRPC clients do not read HTTP errors.
#[derive(Clone)]
#[must_use]
pub struct Rejection(pub(crate) Reject);

#[derive(Clone)]
pub(crate) enum Reject {
    Text,
    Problem,
    Custom(Arc<RejectFn>),
}

impl Rejection {
    /// `429 Too Many Requests` with a short `text/plain` body (the default).
    pub fn text() -> Self {
        Rejection(Reject::Text)
    }

    /// `429` with an RFC 9457 `application/problem+json` body of the draft's type
    /// `https://iana.org/assignments/http-problem-types#quota-exceeded`, listing
    /// the exhausted quotas in `violated-policies`.
    pub fn problem_json() -> Self {
        Rejection(Reject::Problem)
    }

    /// A response of your own. Its status is kept as you set it (normally 429);
    /// the layer then adds the rate limit headers, `Retry-After` (unless you set
    /// one) and `Cache-Control: no-store` (unless you set one).
    pub fn custom<F>(f: F) -> Self
    where
        F: Fn(&Decision) -> Response<Bytes> + Send + Sync + 'static,
    {
        Rejection(Reject::Custom(Arc::new(f)))
    }
}

impl Default for Rejection {
    fn default() -> Self {
        Self::text()
    }
}

impl fmt::Debug for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Reject::Text => "Rejection::text",
            Reject::Problem => "Rejection::problem_json",
            Reject::Custom(_) => "Rejection::custom",
        })
    }
}

/// How many requests a layer in [delay mode](crate::layer#delay-mode) holds at
/// once unless [`Delay::max_waiting`] says otherwise.
pub const DEFAULT_MAX_WAITING: usize = 1_000;

/// Delay mode: requests that can be admitted within `max_wait` are held until
/// their tokens are due, then forwarded, instead of being refused. Set with
/// [`RateLimitLayer::delay`](crate::layer::RateLimitLayer::delay); a
/// [`Duration`] converts into a `Delay` with the default bound. See the
/// [module docs](crate::layer#delay-mode).
///
/// ```
/// use std::time::Duration;
/// use tollgate::layer::{Delay, RateLimitLayer};
/// use tollgate::{MemoryStore, Quota};
///
/// # fn main() -> Result<(), tollgate::ConfigError> {
/// // Smooth bursts to 10 a second, holding a request up to 2 s, at most 200
/// // requests held at once.
/// let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(10)?)
///     .delay(Delay::new(Duration::from_secs(2)).max_waiting(200)?);
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Delay {
    max_wait: Duration,
    max_waiting: usize,
}

impl Delay {
    /// Holds requests up to `max_wait`, at most [`DEFAULT_MAX_WAITING`] at once.
    pub fn new(max_wait: Duration) -> Self {
        Delay {
            max_wait,
            max_waiting: DEFAULT_MAX_WAITING,
        }
    }

    /// Holds at most `requests` requests at once (per layer, shared by its
    /// clones): the memory that held requests take is bounded by it.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when `requests` is 0 (use no delay mode instead) or
    /// above tokio's semaphore limit (`usize::MAX >> 3`).
    pub fn max_waiting(self, requests: usize) -> Result<Self, ConfigError> {
        if requests == 0 || requests > Semaphore::MAX_PERMITS {
            return Err(ConfigError::layer(format!(
                "Delay::max_waiting({requests}): the number of requests held at once must be \
                 1 to {}; without delay mode, leave .delay(..) out",
                Semaphore::MAX_PERMITS
            )));
        }
        Ok(Delay {
            max_waiting: requests,
            ..self
        })
    }

    /// The longest a request is held.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// The most requests held at once.
    pub fn waiting_limit(&self) -> usize {
        self.max_waiting
    }
}

impl From<Duration> for Delay {
    fn from(max_wait: Duration) -> Self {
        Delay::new(max_wait)
    }
}
