//! Tower middleware for HTTP: [`RateLimitLayer`] and its [`RateLimit`] service.
//!
//! Works with axum's `Router::layer` and `Router::route_layer`, with hyper
//! services and with anything built on tower. The response body type stays the
//! inner service's. To answer 429, 503 and 400 by itself with a short text, the
//! layer needs that type to be buildable from [`Bytes`](bytes::Bytes) (axum's
//! `Body` and `http_body_util::Full<Bytes>` are); for body types that only have
//! `Default`, [`RateLimitLayer::bodies::<EmptyBody>()`](RateLimitLayer::bodies)
//! sends the same statuses and headers with empty bodies.
//!
//! ## Quick start (axum)
//!
//! ```
//! use axum::{Router, body::Body, http::Request, routing::get};
//! use tollgate::key::Header;
//! use tollgate::layer::{MissingKey, RateLimitLayer};
//! use tollgate::{Decision, MemoryStore, Quota};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Use RedisStore::from_url("redis://127.0.0.1:6379")? to share the limit
//! // between instances. 2 requests a second per API key, bursts of 3.
//! let limit = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(2)?.burst(3)?)
//!     .key(Header::new("x-api-key"))
//!     .on_missing_key(MissingKey::reject());
//!
//! let app = Router::new()
//!     .route("/", get(|decision: axum::Extension<Decision>| async move {
//!         format!("{} left", decision.remaining())
//!     }))
//!     .layer(limit);
//!
//! let request = || Request::get("/").header("x-api-key", "k-1").body(Body::empty());
//! let first = app.clone().oneshot(request()?).await?;
//! assert_eq!(first.status(), 200);
//! assert_eq!(first.headers()["ratelimit-policy"], "\"default\";q=3;w=2");
//! assert_eq!(first.headers()["ratelimit"], "\"default\";r=2;t=1");
//! for _ in 0..2 {
//!     app.clone().oneshot(request()?).await?;
//! }
//! let limited = app.clone().oneshot(request()?).await?;
//! assert_eq!(limited.status(), 429);
//! assert_eq!(limited.headers()["retry-after"], "1");
//! # Ok(())
//! # }
//! ```
//!
//! Serving it for real, keyed by the client's address (the default key; needs
//! tollgate's `axum` feature so it can read axum's `ConnectInfo`):
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{Router, routing::get};
//! use tollgate::{Quota, RateLimitLayer, RedisStore};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::from_url("redis://127.0.0.1:6379")?;
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(store, Quota::per_second(10)?.burst(20)?));
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! ## Defaults
//!
//! | option | default | other choices |
//! | --- | --- | --- |
//! | [`key`](RateLimitLayer::key) | [`PeerIp`](crate::key::PeerIp): a bucket per client address (IPv6 per /64) | [`ClientIp`](crate::key::ClientIp) behind proxies, [`Header`](crate::key::Header), [`Global`](crate::key::Global), any [`KeyExtractor`](crate::key::KeyExtractor) |
//! | [`policy`](RateLimitLayer::policy) | the layer's own policy, named `default` | a [`Policy`] per request, or [`Choice::Exempt`] |
//! | [`cost`](RateLimitLayer::cost) | 1 token per request | any weight; 0 is a peek |
//! | [`on_missing_key`](RateLimitLayer::on_missing_key) | [`MissingKey::reject`]: 400 | allow, or fall back to another extractor |
//! | [`on_store_error`](RateLimitLayer::on_store_error) | [`OnStoreError::Allow`]: forward | [`OnStoreError::Deny`]: 503 |
//! | [`headers`](RateLimitLayer::headers) | [`HeaderStyle::Ietf`] | legacy `X-RateLimit-*`, none |
//! | [`rejection`](RateLimitLayer::rejection) | [`Rejection::text`]: 429 `text/plain` | RFC 9457 problem+json, your own |
//!
//! The default key is the socket peer address, because a rate limit is almost
//! always meant per client, and one bucket silently shared by every client is
//! the classic misconfiguration. The server must put the address in the request
//! extensions:
//!
//! - axum: enable tollgate's `axum` feature and serve with
//!   `app.into_make_service_with_connect_info::<SocketAddr>()`;
//! - tonic: enable the `tonic` feature (tonic inserts `TcpConnectInfo` itself);
//! - a bare hyper server: insert the peer's `SocketAddr` into each request.
//!
//! Without it every request lacks its key and is answered 400 (the default
//! [`MissingKey::reject`]), so the mistake shows at the first request. Behind a
//! reverse proxy every client would share the proxy's address: use
//! [`ClientIp`](crate::key::ClientIp) there.
//!
//! ## Response headers
//!
//! A token bucket has no fixed window, so the IETF fields
//! (draft-ietf-httpapi-ratelimit-headers-10) are mapped as follows, one list item
//! per quota. The item is the policy name, or `name.0`, `name.1`... when the
//! policy has several quotas.
//!
//! - `RateLimit-Policy: "default";q=10;w=1`: `q` is the bucket capacity (the
//!   largest burst) and `w` the seconds an empty bucket takes to refill
//!   completely, rounded up and at least 1. Sustained, that is `q` per `w`.
//! - `RateLimit: "default";r=9;t=1`: `r` is the whole tokens left after this
//!   request. On an admitted request `t` is the seconds until one more token is
//!   available, rounded up, and is left out when the bucket is full. On a 429,
//!   `t` is the seconds until that quota holds the request's cost, and is left out
//!   for quotas that already hold it, so `Retry-After` (the longest such wait) is
//!   never earlier than any `t`.
//! - Nested layers (a global limit and a per-route one) append their items to
//!   the same two fields. The outer layer decides first: a request it admits has
//!   spent its tokens even if an inner layer then answers 429.
//! - [`HeaderStyle::Legacy`] sends `X-RateLimit-Limit` (capacity),
//!   `X-RateLimit-Remaining` and `X-RateLimit-Reset` of the most restrictive quota;
//!   the reset is **delay seconds** until that bucket is full again (rounded up),
//!   not an epoch timestamp as GitHub sends.
//!
//! No partition key (`pk`) is sent: it would echo client keys back.
//!
//! ## Answers the layer gives by itself
//!
//! - **429 Too Many Requests**: the rate limit headers, `Retry-After` in whole
//!   seconds rounded up and never 0, `Cache-Control: no-store` (RFC 6585: 429
//!   must not be cached), and a short body (see [`Rejection`]).
//! - **429 without `Retry-After`**: the request's [cost](RateLimitLayer::cost)
//!   exceeds a capacity of its policy, so no wait would help.
//! - **503 Service Unavailable** with `Retry-After: 1`: the store failed and
//!   [`OnStoreError::Deny`] is set.
//! - **400 Bad Request**: no key and [`MissingKey::reject`]; the body names the
//!   key kind that was missing (`ip`, `header:x-api-key`).
//!
//! A limit or store problem never becomes a service error: the layer's error
//! type is the inner service's.
//!
//! ## Keys
//!
//! The storage key of a request is `policy:kind:value`, for example
//! `default:header:x-api-key:k-1`, so two policies or two extractors never share a
//! bucket. The value is made safe with [`safe_key`](crate::store::safe_key), and
//! the store makes the whole key safe again (hashing it when it is long) and
//! wraps it in the `{hash tag}`: no request data reaches Redis raw or unbounded.
//!
//! ## Extensions
//!
//! The [`Decision`](crate::Decision) goes into the request extensions (handlers
//! read `remaining`, shadow handlers see `allowed() == false`) and into the
//! response extensions. A store failure puts a [`StoreFailure`] in both.
//! Requests that were not limited (exempt, keyless with [`MissingKey::allow`],
//! store failed with [`OnStoreError::Allow`]) carry no `Decision`: handlers that
//! can see them should take `Option<Extension<Decision>>`.

mod body;
mod check;
mod config;
mod future;
mod grpc;
#[allow(clippy::module_inception)]
mod layer;
mod policy;
mod response;
mod service;

use std::fmt;
use std::sync::Arc;

pub use body::{EmptyBody, MakeBody, TextBody};
pub use config::{HeaderStyle, MissingKey, OnStoreError, RejectFn, Rejection};
pub use future::ResponseFuture;
pub use grpc::{GRPC_RETRY_PUSHBACK_MS, grpc_method, is_grpc};
pub use layer::{DEFAULT_POLICY_NAME, RateLimitLayer};
pub use policy::{Choice, MAX_POLICY_NAME_LEN, Policy};
pub use response::{
    RATELIMIT, RATELIMIT_POLICY, STORE_RETRY_AFTER, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET,
};
pub use service::RateLimit;

/// Put into the request and response extensions when the store could not decide
/// (whatever [`OnStoreError`] says), so logging and metrics can count outages.
#[derive(Clone)]
pub struct StoreFailure(pub Arc<crate::Error>);

impl fmt::Debug for StoreFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoreFailure").field(&self.0).finish()
    }
}

impl fmt::Display for StoreFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
