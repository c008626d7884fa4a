//! [`PeerIp`]: the address of the connected socket.

use http::request::Parts;

use super::extractor::{KeyExtractor, Kind};
use super::ip::{IpKeying, request_peer_ip};

/// The IP address of the connected socket (the TCP peer), ignoring every header.
///
/// Right when clients connect directly; behind a proxy or load balancer every
/// request would share the proxy's bucket, so use [`ClientIp`](super::ClientIp)
/// there.
///
/// The address comes from the request extensions, where the server puts it:
/// axum's `ConnectInfo<SocketAddr>` (cargo feature `axum`; serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`), tonic's
/// `TcpConnectInfo` or, on a TLS server, `TlsConnectInfo<TcpConnectInfo>`
/// (cargo feature `tonic`; tollgate turns on none of tonic's TLS features, it
/// reads the TLS info through tonic whenever your server has them on), or a
/// plain [`std::net::SocketAddr`] that a bare hyper service inserts itself.
/// With none of them the key is missing and the layer's missing-key policy
/// applies.
///
/// Keys are canonical: IPv4-mapped IPv6 becomes IPv4 (`203.0.113.7`), and IPv6
/// clients are keyed by their /64 network (`2001:db8:1:2::/64`), since one
/// customer usually holds a whole /64; see [`PeerIp::ipv6_prefix`]. An IPv6
/// address that carries an IPv4 client (NAT64's `64:ff9b::/96`, 6to4's
/// `2002::/16`) is keyed as that IPv4 address. The kind is `ip`.
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate::key::{KeyExtractor, PeerIp};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::ConfigError> {
/// let (mut parts, ()) = Request::get("/").body(()).unwrap().into_parts();
/// parts.extensions.insert(SocketAddr::from(([203, 0, 113, 7], 51000)));
/// assert_eq!(PeerIp::new().extract(&parts).await.as_deref(), Some("203.0.113.7"));
///
/// parts.extensions.insert("[2001:db8:1:2::99]:443".parse::<SocketAddr>().unwrap());
/// let by_56 = PeerIp::new().ipv6_prefix(56)?;
/// assert_eq!(by_56.extract(&parts).await.as_deref(), Some("2001:db8:1::/56"));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
#[must_use]
pub struct PeerIp {
    keying: IpKeying,
}

impl PeerIp {
    /// Keys requests by the socket peer's IP, IPv6 by its /64.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keys IPv6 peers by their first `prefix` bits instead of 64 (56 is another
    /// common allocation; 128 keys single addresses).
    ///
    /// # Errors
    ///
    /// a [`ConfigError`](crate::ConfigError) unless `prefix` is 1
    /// to 128.
    pub fn ipv6_prefix(self, prefix: u8) -> Result<Self, crate::ConfigError> {
        Ok(PeerIp {
            keying: IpKeying::with_ipv6_prefix(prefix)?,
        })
    }
}

impl KeyExtractor for PeerIp {
    fn kind(&self) -> Kind {
        Kind::reserved("ip")
    }

    async fn extract(&self, parts: &Parts) -> Option<String> {
        request_peer_ip(parts).map(|ip| self.keying.key(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;
    use std::net::SocketAddr;

    fn with_peer(addr: &str) -> Parts {
        let (mut parts, ()) = Request::get("/").body(()).unwrap().into_parts();
        parts.extensions.insert(addr.parse::<SocketAddr>().unwrap());
        parts
    }

    #[tokio::test]
    async fn keys_by_canonical_peer_ip() {
        let p = PeerIp::new();
        assert_eq!(p.kind(), "ip");
        let key = |a: &str| {
            let parts = with_peer(a);
            async move { p.extract(&parts).await }
        };
        assert_eq!(key("203.0.113.7:1").await.as_deref(), Some("203.0.113.7"));
        assert_eq!(
            key("[::ffff:203.0.113.7]:1").await.as_deref(),
            Some("203.0.113.7")
        );
        assert_eq!(
            key("[2001:db8:1:2::1]:1").await,
            key("[2001:db8:1:2:ffff::2]:9").await
        );
        assert_ne!(
            key("[2001:db8:1:2::1]:1").await,
            key("[2001:db8:1:3::1]:1").await
        );
        assert_eq!(key("[fe80::1%7]:1").await.as_deref(), Some("fe80::/64"));
    }

    #[tokio::test]
    async fn ipv6_prefix_is_configurable_and_validated() {
        let p = PeerIp::new().ipv6_prefix(56).unwrap();
        let a = p.extract(&with_peer("[2001:db8:1:201::1]:1")).await;
        let b = p.extract(&with_peer("[2001:db8:1:2ff::1]:1")).await;
        assert_eq!(a.as_deref(), Some("2001:db8:1:200::/56"));
        assert_eq!(a, b);
        assert!(PeerIp::new().ipv6_prefix(0).is_err());
        assert!(PeerIp::new().ipv6_prefix(129).is_err());
    }

    #[tokio::test]
    async fn no_peer_means_no_key() {
        let (parts, ()) = Request::get("/").body(()).unwrap().into_parts();
        assert_eq!(PeerIp::new().extract(&parts).await, None);
    }
}
