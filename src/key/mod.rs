//! Which bucket a request spends from: the [`KeyExtractor`] trait and its
//! implementations.
//!
//! An extractor looks at the request head ([`http::request::Parts`]: method, URI,
//! headers, extensions) and answers a client key, or `None` when the request has
//! none (the layer's missing-key policy decides what happens then). Extraction may
//! be asynchronous, so a key can come from a lookup.
//!
//! Extractors see the head rather than the whole `Request<B>` because request
//! bodies (axum's included) are `Send` but not `Sync`: a future that borrowed the
//! request across an `.await` could not be sent between threads.
//!
//! Keys are hostile data. Whatever an extractor returns is namespaced by its
//! [`kind`](KeyExtractor::kind) and made safe with
//! [`safe_key`](crate::store::safe_key) before it reaches a store, so two
//! extractors never share a bucket by accident and no raw header becomes a Redis key.
//! Kinds are unambiguous ([`Kind`]): the built-in ones are reserved, your own
//! are `custom:NAME` with the name escaped, so `from_fn("ip", ...)` is
//! `custom:ip` and never shares [`PeerIp`]'s buckets.
//!
//! ## Extractors
//!
//! | Extractor | Source | Kind | Example key |
//! |---|---|---|---|
//! | [`Global`] | nothing: one bucket for all | `global` | `global` |
//! | [`Header`] | one request header (API key, gRPC metadata), hashed unless [`verbatim`](Header::verbatim) | `header:x-api-key` | `#3f0c…` (33 bytes), `k-123` verbatim |
//! | [`PeerIp`] | the socket peer address (axum `ConnectInfo`, tonic `TcpConnectInfo` / `TlsConnectInfo`, `SocketAddr`) | `ip` | `203.0.113.7`, `2001:db8:1:2::/64` |
//! | [`ClientIp`] | the client behind trusted proxies (`X-Forwarded-For`, `Forwarded`, `X-Real-IP`, ...) | `client-ip` | `198.51.100.4`, `2001:db8:1:2::/64` |
//! | [`FromExtension`] | a value an auth layer put in the request extensions | `ext:user` | `42` |
//! | `Route` (feature `axum`) | the route template axum matched (`MatchedPath`), never the raw path | `route` | `/login`, `#9a1e…` for `/items/{id}` |
//! | [`from_fn`] | a closure over the request head | `custom:` and the name ([`Kind::custom`]) | as returned |
//! | [`And`] (`a.and(b)`) | both keys: a bucket per pair | `route+client-ip` | `6:/login:203.0.113.7` |
//! | [`Or`] (`a.or(b)`) | the first key present, tagged by which answered | `header:x-api-key/client-ip` | `0:k-123`, `1:203.0.113.7` |
//!
//! IP keys are canonical: IPv4-mapped IPv6 is keyed as IPv4, IPv6 zone ids are
//! dropped, and IPv6 clients are keyed by their /64 network (configurable), since
//! one customer usually holds a whole /64. `PeerIp` needs the cargo feature `axum`
//! or `tonic` to read those frameworks' connection info; a plain `SocketAddr`
//! extension always works.
//!
//! Behind a proxy, [`PeerIp`] sees only the proxy; [`ClientIp`] reads forwarding
//! headers, but only as far as your own proxies wrote them (see its docs).
//!
//! ```
//! use http::Request;
//! use tollgate::key::{Global, Header, KeyExtractor, from_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate::ConfigError> {
//! let (parts, ()) = Request::get("/orders?tenant=7").header("x-api-key", "k-123")
//!     .body(()).unwrap().into_parts();
//! assert_eq!(Header::new("x-api-key")?.verbatim().extract(&parts).await.as_deref(), Some("k-123"));
//! // By default the value is hashed: API keys never reach the store in clear.
//! assert_eq!(Header::new("x-api-key")?.extract(&parts).await.map(|k| k.len()), Some(33));
//! assert_eq!(Global.extract(&parts).await.as_deref(), Some("global"));
//! // A closure: here the HTTP method, a small fixed set of values.
//! let method = from_fn("method", |parts| Some(parts.method.to_string()));
//! assert_eq!(method.extract(&parts).await.as_deref(), Some("GET"));
//! # Ok(())
//! # }
//! ```
//!
//! ## Recipes: who gets a bucket
//!
//! Every distinct key is a fresh, full bucket, and one more entry in the store
//! (in Redis, a key per quota that lives until the bucket is full again; see
//! [what a flood of keys costs](crate::store#what-a-flood-of-keys-costs) in the
//! store docs). So a key the client writes itself is a key the client
//! chooses: keyed on `Header::new("x-api-key")?`, with or without
//! `.or(ClientIp::...)`, a client that sends a new random API key with every
//! request gets a new full bucket every time, is never limited, and fills
//! Redis as it goes. Key only on what the client cannot mint:
//!
//! 1. **Per client address, always**, in the outermost layer: [`PeerIp`] (the
//!    layer's default) or [`ClientIp`] behind your proxies. A bucket then costs
//!    an attacker an address (a /64 for IPv6), and this layer also limits
//!    requests that never authenticate, and the work your auth layer does for
//!    them.
//! 2. **Per identity, only once verified**: a second layer, inside your auth
//!    layer, keyed on what the auth layer stored ([`FromExtension`]). Unknown
//!    credentials are refused by the auth layer before they make a bucket.
//! 3. **Or verify inside the extractor**: a [`KeyExtractor`] of your own that
//!    looks the API key up and answers `None` for unknown keys, with
//!    [`MissingKey::fallback`](crate::layer::MissingKey::fallback) to the
//!    address (`examples/custom_key.rs`).
//!
//! [`Header`] on its own is for values the client cannot vary at will: headers
//! your own proxy or gateway sets, or API keys checked before the rate limit.
//!
//! Recipes 1 and 2 on an axum router behind a load balancer in `10.0.0.0/8`:
//!
//! ```
//! use axum::extract::Request;
//! use axum::http::StatusCode;
//! use axum::middleware::{self, Next};
//! use axum::response::Response;
//! use axum::{Router, routing::get};
//! use tollgate::key::{ClientIp, FromExtension};
//! use tollgate::{MemoryStore, Policy, Quota, RateLimitLayer};
//!
//! /// What the auth layer stores for a verified caller.
//! #[derive(Clone)]
//! struct ApiClient {
//!     id: u64,
//! }
//!
//! /// Your credential check; here a fixed table.
//! async fn auth(mut req: Request, next: Next) -> Result<Response, StatusCode> {
//!     let id = match req.headers().get("x-api-key").map(|k| k.as_bytes()) {
//!         Some(b"k-acme") => 1,
//!         Some(b"k-globex") => 2,
//!         _ => return Err(StatusCode::UNAUTHORIZED),
//!     };
//!     req.extensions_mut().insert(ApiClient { id });
//!     Ok(next.run(req).await)
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new(); // RedisStore::from_url(..)? in production
//! let per_ip = RateLimitLayer::new(store.clone(), Policy::new("per-ip", [Quota::per_second(20)?])?)
//!     .key(ClientIp::trusted_proxies(["10.0.0.0/8"])?);
//! let per_client = RateLimitLayer::new(store, Policy::new("per-client", [Quota::per_hour(1_000)?])?)
//!     .key(FromExtension::new("client", |c: &ApiClient| c.id.to_string()));
//! // The last layer added is the outermost: per_ip sees every request, the
//! // auth layer only what per_ip admitted, per_client only verified callers.
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(per_client)
//!     .layer(middleware::from_fn(auth))
//!     .layer(per_ip);
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! Stacked layers have more to know (names, `route_layer`, what each costs):
//! see [the layer docs](crate::layer#stacked-layers).

mod client_ip;
mod combine;
mod extension;
mod extractor;
mod forwarded;
mod from_fn;
mod global;
mod header;
mod ip;
mod peer;
#[cfg(feature = "axum")]
mod route;
mod tonic_hint;

pub use client_ip::{ClientIp, ClientIpBuilder};
pub use combine::{And, KeyExtractorExt, Or};
#[allow(deprecated)]
pub use extension::Extension;
pub use extension::FromExtension;
pub use extractor::{KeyExtractor, Kind};
pub use forwarded::MAX_HOPS;
pub use from_fn::{FromFn, from_fn};
pub use global::Global;
pub use header::Header;
pub use ip::DEFAULT_IPV6_PREFIX;
pub use peer::PeerIp;
#[cfg(feature = "axum")]
pub use route::Route;
