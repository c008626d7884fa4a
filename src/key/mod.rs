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
//! | [`Extension`] | a value an auth layer put in the request extensions | `ext:user` | `42` |
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
//! # async fn main() {
//! let (parts, ()) = Request::get("/orders?tenant=7").header("x-api-key", "k-123")
//!     .body(()).unwrap().into_parts();
//! assert_eq!(Header::new("x-api-key").verbatim().extract(&parts).await.as_deref(), Some("k-123"));
//! // By default the value is hashed: API keys never reach the store in clear.
//! assert_eq!(Header::new("x-api-key").extract(&parts).await.map(|k| k.len()), Some(33));
//! assert_eq!(Global.extract(&parts).await.as_deref(), Some("global"));
//! // A closure: here the HTTP method, a small fixed set of values.
//! let method = from_fn("method", |parts| Some(parts.method.to_string()));
//! assert_eq!(method.extract(&parts).await.as_deref(), Some("GET"));
//! # }
//! ```
//!
//! Behind a load balancer in `10.0.0.0/8`, with an API key bucket for callers
//! that send one:
//!
//! ```
//! use tollgate::key::{ClientIp, Header, KeyExtractorExt};
//!
//! # fn main() -> Result<(), tollgate::ConfigError> {
//! let key = Header::try_new("x-api-key")?.or(ClientIp::trusted_proxies(["10.0.0.0/8"])?);
//! # let _ = key;
//! # Ok(())
//! # }
//! ```

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

pub use client_ip::{ClientIp, ClientIpBuilder};
pub(crate) use combine::present;
pub use combine::{And, KeyExtractorExt, Or};
pub use extension::Extension;
pub use extractor::{KeyExtractor, Kind};
pub use forwarded::MAX_HOPS;
pub use from_fn::{FromFn, from_fn};
pub use global::Global;
pub use header::Header;
pub use ip::DEFAULT_IPV6_PREFIX;
pub use peer::PeerIp;
#[cfg(feature = "axum")]
pub use route::Route;
