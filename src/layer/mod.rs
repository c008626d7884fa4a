//! Tower middleware for HTTP and gRPC: [`RateLimitLayer`] and its [`RateLimit`]
//! service.
//!
//! Works with axum's `Router::layer` and `Router::route_layer`, with tonic's
//! `Server::builder().layer` (see [gRPC](#grpc-tonic)), with hyper services and
//! with anything built on tower. The response body type stays the
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
//! | [`on_missing_key`](RateLimitLayer::on_missing_key) | [`MissingKey::reject`]: 400 (gRPC `INVALID_ARGUMENT`) | allow, or fall back to another extractor |
//! | [`on_store_error`](RateLimitLayer::on_store_error) | [`OnStoreError::Allow`]: forward | [`OnStoreError::Deny`]: 503 (gRPC `UNAVAILABLE`) |
//! | [`headers`](RateLimitLayer::headers) | [`HeaderStyle::Ietf`] | legacy `X-RateLimit-*`, none |
//! | [`rejection`](RateLimitLayer::rejection) | [`Rejection::text`]: 429 `text/plain` | RFC 9457 problem+json, your own (HTTP only: gRPC calls get [gRPC statuses](#grpc-tonic)) |
//! | [`bodies`](RateLimitLayer::bodies) | [`TextBody`]: needs `From<Bytes>` | [`EmptyBody`] for tonic's server |
//!
//! The default key is the socket peer address, because a rate limit is almost
//! always meant per client, and one bucket silently shared by every client is
//! the classic misconfiguration. The server must put the address in the request
//! extensions:
//!
//! - axum: enable tollgate's `axum` feature and serve with
//!   `app.into_make_service_with_connect_info::<SocketAddr>()`;
//! - tonic: keep the `tonic` feature (on by default; tonic inserts
//!   `TcpConnectInfo` itself);
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
//!   spent its tokens even if an inner layer then answers 429, and its item keeps
//!   the admitted form (`t` until its next token), so "`Retry-After` is never
//!   earlier than any `t`" holds for the items of the layer that answered.
//!   Give nested layers different [names](RateLimitLayer::name) (see Keys).
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
//! type is the inner service's. gRPC calls get gRPC statuses instead of these;
//! see below.
//!
//! ## gRPC (tonic)
//!
//! The same layer limits tonic services. A request is a gRPC call when its
//! `content-type` starts with `application/grpc` (any case; this includes
//! `application/grpc+proto` and gRPC-Web), as [`is_grpc`] tells. gRPC clients
//! read `grpc-status`, not the HTTP status (tonic turns a bare 429 into
//! `UNAVAILABLE` and loses the wait), so the layer never answers a gRPC call with
//! an HTTP error: it answers **HTTP 200 "trailers-only"**, one header block that
//! ends the stream, with `content-type: application/grpc` (`application/grpc-web`
//! or `application/grpc-web-text` for gRPC-Web calls), `grpc-status` and a
//! percent-encoded `grpc-message`.
//!
//! | outcome | HTTP answer | gRPC status | `grpc-retry-pushback-ms` | `grpc-status-details-bin` (feature `tonic`) |
//! | --- | --- | --- | --- | --- |
//! | over the limit | 429, `Retry-After` | `RESOURCE_EXHAUSTED` (8) | the wait in ms, rounded up, never 0 | `RetryInfo` (the same wait) and `QuotaFailure` |
//! | cost above a capacity | 429 without `Retry-After` | `RESOURCE_EXHAUSTED` (8) | `-1`: do not retry | `QuotaFailure` only |
//! | no key, [`MissingKey::reject`] | 400 | `INVALID_ARGUMENT` (3) | none | none |
//! | store failed, [`OnStoreError::Deny`] | 503, `Retry-After: 1` | `UNAVAILABLE` (14) | `1000` | `RetryInfo` of 1 s |
//!
//! - **Statuses.** Rate limited is `RESOURCE_EXHAUSTED`, as gRPC and Google's
//!   API guidelines define it (a per-user quota), not `UNAVAILABLE`, which
//!   clients read as "server down, retry anywhere". A cost above a capacity is a
//!   quota problem too, so it is `RESOURCE_EXHAUSTED` as well, like the HTTP 429
//!   without `Retry-After`; it carries no `RetryInfo`, and a negative pushback,
//!   which gRPC retry policies take as "do not retry" (gRFC A6, "Pushback"). A
//!   missing key is `INVALID_ARGUMENT`, like the HTTP 400: the call lacks
//!   something it must carry. `UNAUTHENTICATED` would claim the key is a
//!   credential, which the layer cannot know (it may be a tenant header or the
//!   peer address).
//! - **Messages** name the policy and the wait (`rate limit exceeded: policy
//!   api, retry in 250 ms`) or the missing key kind; never a client's key.
//! - **Retry hints.** `grpc-retry-pushback-ms` is the metadata gRPC retry
//!   policies read (ASCII integer milliseconds). With the `tonic` feature,
//!   `grpc-status-details-bin` holds a `google.rpc.Status` built with
//!   tonic-types: `RetryInfo.retry_delay` is exactly the pushback, and
//!   `QuotaFailure` has one violation per quota the call did not fit in, with
//!   `subject` the key kind (`ip`, `header:x-api-key`; never the key itself),
//!   `quota_id` the item name of the `RateLimit` headers (`api`, `api.0`),
//!   `quota_value` the capacity and a `description` such as `policy api: 10 per
//!   1s, bursts of 20 exhausted`. Clients read them with
//!   `tonic_types::StatusExt::get_details_retry_info` and
//!   `get_details_quota_failure`. Without the feature the answers are the same
//!   except for this header.
//! - **Rate limit headers** are HTTP headers, so gRPC clients see them as
//!   metadata: initial metadata on admitted calls (`response.metadata()`), and
//!   metadata of the `Status` on limited ones. They are kept, so clients can
//!   watch their budget; [`HeaderStyle::None`] turns them off.
//!   `Retry-After` and `Cache-Control` are not sent to gRPC calls.
//! - **[`Rejection`]** (text, problem+json, custom) shapes HTTP answers only.
//! - **Streaming** calls are checked once, when the call starts, from the
//!   request head: the messages of an admitted stream are not counted, and a
//!   long stream holds no tokens. To limit messages, call a
//!   [`RateLimiter`](crate::RateLimiter) inside the handler.
//! - **Per-method policies**: the [`policy`](RateLimitLayer::policy) closure
//!   sees the path `/package.Service/Method`; [`grpc_method`] splits it.
//! - **Keys**: [`PeerIp`](crate::key::PeerIp) (the default) and
//!   [`ClientIp`](crate::key::ClientIp) read tonic's `TcpConnectInfo` with the
//!   `tonic` feature; [`Header`](crate::key::Header) reads ASCII metadata such
//!   as `x-api-key`.
//! - **Shadow mode** forwards gRPC calls as it forwards HTTP requests.
//!
//! ### Bodies and tonic's server
//!
//! tonic's `Body` has only `Default`, so on `Server::builder().layer(...)` the
//! layer needs [`bodies::<EmptyBody>()`](RateLimitLayer::bodies); nothing is
//! lost, since gRPC answers have no body. (The default [`TextBody`] cannot
//! cover tonic's `Body`: see [`MakeBody`].) Forgetting it shows at compile time
//! as ``the trait bound `tonic::body::Body: From<Bytes>` is not satisfied``.
//!
//! ```no_run
//! use tollgate::layer::{Choice, EmptyBody, Policy, RateLimitLayer, grpc_method};
//! use tollgate::{Quota, RedisStore};
//! use tonic::transport::Server;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::from_url("redis://127.0.0.1:6379")?;
//! // 20 calls a second per client address; health checks (as an example of a
//! // method) exempt.
//! let limit = RateLimitLayer::new(store, Quota::per_second(20)?)
//!     .policy(|parts| match grpc_method(parts) {
//!         Some(("grpc.health.v1.Health", _)) => Choice::Exempt,
//!         _ => Choice::Default,
//!     })
//!     .bodies::<EmptyBody>();
//! let (_reporter, health) = tonic_health::server::health_reporter();
//! Server::builder()
//!     .layer(limit)
//!     .add_service(health)
//!     .serve("0.0.0.0:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! HTTP routes and tonic services in one axum router share one layer with the
//! default bodies (axum's `Body` has `From<Bytes>`): HTTP requests get 429,
//! gRPC calls `RESOURCE_EXHAUSTED`. Serve it with HTTP/2 enabled (axum's
//! `http2` feature) and connect info for the peer address:
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{Router, routing::get};
//! use tollgate::{Quota, RateLimitLayer, RedisStore};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::from_url("redis://127.0.0.1:6379")?;
//! let (_reporter, health) = tonic_health::server::health_reporter();
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .merge(tonic::service::Routes::new(health).into_axum_router())
//!     .layer(RateLimitLayer::new(store, Quota::per_second(10)?));
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! ## Keys
//!
//! The storage key of a request is `policy:kind:value`, for example
//! `default:header:x-api-key:k-1`, so policies with different names, or two
//! extractors, never share a bucket. The policy name is the bucket's namespace:
//! layers (or policies) with the same name, key kind and quota share their
//! buckets, which is how several routes can share one budget, and also why two
//! nested layers that both keep the default name `default` and the same quota
//! would spend twice from one bucket: name them. The value is made safe with [`safe_key`](crate::store::safe_key), and
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

/// In [shadow mode](RateLimitLayer::shadow), what the layer would have answered
/// to a request it forwarded without a decision: put into the request and
/// response extensions, so a rollout shows these requests too. (Requests over the
/// limit carry their [`Decision`](crate::Decision), with `allowed() == false`.)
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShadowRejection {
    /// No key (400 / `INVALID_ARGUMENT`); `kind` names the key kinds looked for.
    MissingKey {
        /// The key kinds that were looked for.
        kind: String,
    },
    /// The cost exceeds a capacity of the policy (429 that no wait would help).
    CostTooHigh {
        /// The request's cost.
        cost: u64,
        /// The smallest capacity of the chosen policy.
        capacity: u64,
    },
}

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
