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
//!
//! ## Extractors
//!
//! | Extractor | Source | Kind | Example key |
//! |---|---|---|---|
//! | [`Global`] | nothing: one bucket for all | `global` | `global` |
//! | [`Header`] | one request header (API key, gRPC metadata), hashed unless [`verbatim`](Header::verbatim) | `header:x-api-key` | `#3f0c…` (33 bytes), `k-123` verbatim |
//! | [`PeerIp`] | the socket peer address (axum `ConnectInfo`, tonic `TcpConnectInfo`, `SocketAddr`) | `ip` | `203.0.113.7`, `2001:db8:1:2::/64` |
//! | [`ClientIp`] | the client behind trusted proxies (`X-Forwarded-For`, `Forwarded`, `X-Real-IP`, ...) | `client-ip` | `198.51.100.4`, `2001:db8:1:2::/64` |
//! | [`Extension`] | a value an auth layer put in the request extensions | `ext:user` | `42` |
//! | [`from_fn`] | a closure over the request head | as given | as returned |
//! | [`And`] (`a.and(b)`) | both keys: a bucket per pair | `route+client-ip` | `7:/orders:203.0.113.7` |
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
//! let path = from_fn("path", |parts| Some(parts.uri.path().to_owned()));
//! assert_eq!(path.extract(&parts).await.as_deref(), Some("/orders"));
//! # }
//! ```
//!
//! Behind a load balancer in `10.0.0.0/8`, with an API key bucket for callers
//! that send one:
//!
//! ```
//! use tollgate::key::{ClientIp, Header, KeyExtractorExt};
//!
//! # fn main() -> Result<(), tollgate::Error> {
//! let key = Header::try_new("x-api-key")?.or(ClientIp::trusted_proxies(["10.0.0.0/8"])?);
//! # let _ = key;
//! # Ok(())
//! # }
//! ```

use std::borrow::Cow;
use std::fmt;
use std::future::Future;

use http::HeaderName;
use http::request::Parts;

use crate::store::{hashed_key, safe_key_bytes};

mod client_ip;
mod combine;
mod extension;
mod forwarded;
mod ip;
mod peer;

pub use client_ip::ClientIp;
pub(crate) use combine::present;
pub use combine::{And, KeyExtractorExt, Or};
pub use extension::Extension;
pub use forwarded::MAX_HOPS;
pub use ip::DEFAULT_IPV6_PREFIX;
pub use peer::PeerIp;

/// Takes a client key from a request head. See the [module docs](crate::key).
pub trait KeyExtractor: Send + Sync + 'static {
    /// A short name for this kind of key (`"ip"`, `"header:x-api-key"`), put in
    /// front of every key it extracts so keys of different kinds never collide.
    fn kind(&self) -> Cow<'static, str>;

    /// The client key of this request, or `None` when it has none.
    fn extract(&self, parts: &Parts) -> impl Future<Output = Option<String>> + Send;
}

/// One bucket for everything: every request gets the key `global`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Global;

impl KeyExtractor for Global {
    fn kind(&self) -> Cow<'static, str> {
        Cow::Borrowed("global")
    }

    async fn extract(&self, _parts: &Parts) -> Option<String> {
        Some("global".to_owned())
    }
}

/// The value of one request header, such as an API key or a gRPC metadata entry.
///
/// - **Hashed by default.** Header keys are often credentials, so the value is
///   stored as `#` and 128 bits of its SHA-256: an API key never appears in
///   `KEYS`, `MONITOR` or the slow log. [`Header::verbatim`] keeps short, plain
///   values readable (for non-secret headers such as a tenant id); long, binary
///   or unsafe values are hashed either way, so the stored key is bounded
///   whatever the client sends.
/// - **One value.** An empty value, or a header sent more than once, counts as
///   missing: with several lines a client could pair the value an auth layer
///   checks with a fresh one for every request, and so a fresh bucket.
/// - For an identity established by authentication, prefer keying on what the
///   auth layer stored ([`Extension`]).
#[derive(Clone, Debug)]
pub struct Header {
    name: HeaderName,
    verbatim: bool,
}

impl Header {
    /// Keys requests by the header `name`.
    ///
    /// # Panics
    ///
    /// When `name` is not a valid header name: a configuration mistake, caught at
    /// start-up. Use [`Header::try_new`] to handle it instead.
    pub fn new(name: &str) -> Self {
        match Self::try_new(name) {
            Ok(header) => header,
            Err(e) => panic!("{e}"),
        }
    }

    /// Keys requests by the header `name`, or explains why the name is invalid.
    pub fn try_new(name: &str) -> Result<Self, crate::Error> {
        HeaderName::from_bytes(name.as_bytes())
            .map(|name| Header {
                name,
                verbatim: false,
            })
            .map_err(|_| {
                crate::Error::InvalidConfig(format!("{name:?} is not a valid header name"))
            })
    }

    /// Keeps values that are short and plain (see [`safe_key`](crate::store::safe_key))
    /// readable in the store instead of hashing them. Only for headers that are
    /// not secrets.
    pub fn verbatim(mut self) -> Self {
        self.verbatim = true;
        self
    }
}

impl KeyExtractor for Header {
    fn kind(&self) -> Cow<'static, str> {
        Cow::Owned(format!("header:{}", self.name.as_str()))
    }

    async fn extract(&self, parts: &Parts) -> Option<String> {
        let mut values = parts.headers.get_all(&self.name).iter();
        let value = values.next()?.as_bytes();
        if value.is_empty() || values.next().is_some() {
            return None;
        }
        Some(if self.verbatim {
            safe_key_bytes(value)
        } else {
            hashed_key(value)
        })
    }
}

/// A key from a closure over the request head; see [`from_fn`].
#[derive(Clone)]
pub struct FromFn<F> {
    kind: Cow<'static, str>,
    f: F,
}

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromFn").field("kind", &self.kind).finish()
    }
}

/// A key extractor from a closure: `from_fn("tenant", |parts| ...)`. `kind` names
/// the key family (see [`KeyExtractor::kind`]). For an asynchronous lookup,
/// implement [`KeyExtractor`] directly.
pub fn from_fn<F>(kind: impl Into<Cow<'static, str>>, f: F) -> FromFn<F>
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    FromFn {
        kind: kind.into(),
        f,
    }
}

impl<F> KeyExtractor for FromFn<F>
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn kind(&self) -> Cow<'static, str> {
        self.kind.clone()
    }

    async fn extract(&self, parts: &Parts) -> Option<String> {
        (self.f)(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(req: http::request::Builder) -> Parts {
        req.body(()).unwrap().into_parts().0
    }

    #[tokio::test]
    async fn header_values_are_hashed_unless_verbatim() {
        let p = parts(Request::get("/").header("x-api-key", "sk_live_abc123"));
        let hashed = Header::new("x-api-key").extract(&p).await.unwrap();
        assert!(
            hashed.starts_with('#') && !hashed.contains("abc123"),
            "{hashed}"
        );
        let plain = Header::new("x-api-key").verbatim().extract(&p).await;
        assert_eq!(plain.as_deref(), Some("sk_live_abc123"));
    }

    #[tokio::test]
    async fn a_header_sent_twice_is_missing() {
        let p = parts(
            Request::get("/")
                .header("x-api-key", "a")
                .header("x-api-key", "b"),
        );
        assert_eq!(Header::new("x-api-key").extract(&p).await, None);
    }

    #[tokio::test]
    async fn header_values_are_bounded_and_safe() {
        let h = Header::new("x-api-key").verbatim();
        let long = "a".repeat(64 * 1024);
        let p = parts(Request::get("/").header("x-api-key", long.as_str()));
        assert_eq!(h.extract(&p).await.unwrap().len(), 33);
        let p = parts(Request::get("/").header("x-api-key", &b"\xff{}"[..]));
        assert!(h.extract(&p).await.unwrap().starts_with('#'));
        let p = parts(Request::get("/").header("x-api-key", ""));
        assert_eq!(h.extract(&p).await, None);
        assert_eq!(h.extract(&parts(Request::get("/"))).await, None);
    }

    #[test]
    fn bad_header_names_are_configuration_errors() {
        assert!(Header::try_new("bad header").is_err());
    }
}
