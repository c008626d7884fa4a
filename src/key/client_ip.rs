//! [`ClientIp`]: the client's address behind reverse proxies, taken from forwarding
//! headers only as far as they can be trusted.

use std::net::IpAddr;

use http::HeaderName;
use http::request::Parts;

use super::extractor::{KeyExtractor, Kind};
use super::forwarded::{self, Hop, ListHeader, MAX_HOPS};
use super::ip::{Cidr, IpKeying, parse_cidrs, request_peer_ip};
use crate::error::ConfigError;
/// The client's IP address behind reverse proxies and load balancers.
///
/// Forwarding headers are written by whoever sent the request, so the leftmost
/// `X-Forwarded-For` entry is whatever the client wanted it to be. `ClientIp`
/// believes a header only as far as your own proxies wrote it. Pick the strategy
/// that matches your deployment:
///
/// | Constructor | Deployment | Client taken from |
/// |---|---|---|
/// | [`trusted_proxies`](Self::trusted_proxies) | proxies in known networks | the rightmost `X-Forwarded-For` entry that is not a trusted proxy, if the socket peer is trusted |
/// | [`hops`](Self::hops), then [`only_from`](ClientIpBuilder::only_from) | a fixed number of proxies | the entry that many hops from the right, if the socket peer is trusted |
/// | [`header`](Self::header), then [`only_from`](ClientIpBuilder::only_from) | a proxy that sets one header (`X-Real-IP`, `CF-Connecting-IP`) | that header, if the socket peer is trusted |
///
/// Trust is always explicit. `trusted_proxies` takes the networks it trusts;
/// `hops` and `header` give a [`ClientIpBuilder`] that is no key extractor
/// until it is told whose headers to believe: the proxies' networks
/// ([`only_from`](ClientIpBuilder::only_from)), or, deliberately, any peer
/// ([`trust_any_peer`](ClientIpBuilder::trust_any_peer)). Without that, a client
/// that reaches the service directly and sends a new `CF-Connecting-IP` with
/// every request would never be limited.
///
/// [`forwarded`](Self::forwarded) reads the RFC 7239 `Forwarded` header instead
/// of `X-Forwarded-For`.
///
/// # Rules
///
/// - **The peer** comes from the same request extensions as
///   [`PeerIp`](super::PeerIp). Whenever trusted networks are configured and the
///   peer is not in them, the key is the peer and no header is read. Without a
///   peer address the key is missing (so the layer's missing-key policy applies),
///   except that `hops` and `header` trusting any peer do not need one when the
///   header answers.
/// - **All header lines** are read in order, as one list; empty list elements are
///   ignored (RFC 9110 section 5.6.1).
/// - **Opaque hops are never skipped.** An entry that is `unknown`, obfuscated
///   (`_hidden`), a `Forwarded` element without `for=`, or unparsable says that a
///   trusted proxy did not know its client. The key is then the nearest trusted
///   hop to its right whose address is known (the proxy that reported it),
///   finally the peer: all such requests share that proxy's bucket rather than
///   escaping the limit.
/// - **Bounded work:** only the rightmost [`MAX_HOPS`] entries are looked at. In
///   `trusted_proxies` mode, when every entry looked at is a trusted proxy, the
///   leftmost of them is the client (a request from inside your network).
/// - **Canonical keys**, as for `PeerIp`: IPv4-mapped IPv6 becomes IPv4, IPv6 zone
///   ids are dropped, IPv6 is keyed by its /64 ([`ipv6_prefix`](Self::ipv6_prefix)),
///   except an address that carries an IPv4 client (NAT64's `64:ff9b::/96`,
///   6to4's `2002::/16`), keyed as that IPv4 address.
///   Trusted networks are matched against the full canonical address.
///
/// # Trust only your proxies
///
/// List the addresses of your own proxies, as narrowly as you can: a load
/// balancer subnet, not all of `10.0.0.0/8`. Any host inside a trusted range
/// (a pod, a VPN user, an internal caller) can send `X-Forwarded-For: 1.2.3.4`;
/// its proxy appends the host's own address, the walk passes over it as trusted,
/// and the forged entry becomes the key. Read the header your proxies actually
/// write: behind a proxy that appends only `X-Forwarded-For`, a `Forwarded`
/// header is written by the client alone (and the other way round).
///
/// The kind is `client-ip`.
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate::key::{ClientIp, KeyExtractor};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::ConfigError> {
/// let client_ip = ClientIp::trusted_proxies(["10.0.0.0/8", "2001:db8:ffff::/48"])?;
///
/// // The load balancer 10.0.0.2 forwards a request that went through 10.0.0.1.
/// let (mut parts, ()) = Request::get("/")
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.0.0.1")
///     .body(()).unwrap().into_parts();
/// parts.extensions.insert(SocketAddr::from(([10, 0, 0, 2], 443)));
/// assert_eq!(client_ip.extract(&parts).await.as_deref(), Some("203.0.113.7"));
///
/// // The same header from a client that connects directly is ignored.
/// parts.extensions.insert(SocketAddr::from(([198, 51, 100, 9], 443)));
/// assert_eq!(client_ip.extract(&parts).await.as_deref(), Some("198.51.100.9"));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct ClientIp {
    strategy: Strategy,
    /// Peers whose headers are believed; empty means any peer, which only
    /// `trust_any_peer` can ask for (`trusted_proxies` and `only_from` refuse an
    /// empty list).
    trusted: Vec<Cidr>,
    keying: IpKeying,
}

/// A [`ClientIp`] made by [`ClientIp::hops`] or [`ClientIp::header`] that does
/// not yet know whose headers to believe. It is no [`KeyExtractor`]: finish it
/// with [`only_from`](Self::only_from) or, deliberately,
/// [`trust_any_peer`](Self::trust_any_peer).
#[derive(Clone, Debug)]
#[must_use = "a ClientIpBuilder limits nothing: finish it with only_from or trust_any_peer"]
pub struct ClientIpBuilder {
    strategy: Strategy,
}

impl ClientIpBuilder {
    /// Believes the header only when the socket peer (the last proxy) is in one
    /// of `cidrs`; from any other peer the key is the peer itself, whatever it
    /// sent. `["10.0.0.0/8"]`, `["2001:db8::/32", "192.0.2.7"]`.
    ///
    /// # Errors
    ///
    /// a [`ConfigError`] when the list is empty, an entry is not a network or
    /// has host bits set, or an entry is a /0, as for
    /// [`ClientIp::trusted_proxies`].
    pub fn only_from<I, S>(self, cidrs: I) -> Result<ClientIp, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(ClientIp {
            strategy: self.strategy,
            trusted: parse_cidrs(cidrs)?,
            keying: IpKeying::default(),
        })
    }

    /// Believes the header from every peer.
    ///
    /// # Warning
    ///
    /// Only when nothing but your proxies can connect to the service (a private
    /// network, a firewall that admits the proxies alone), and know that this is
    /// what the limit rests on. A client that reaches the service any other way
    /// writes the header itself: with a new address in every request it gets a
    /// new bucket every time and is never limited, and each of those buckets
    /// takes room in the store. Prefer [`only_from`](Self::only_from).
    pub fn trust_any_peer(self) -> ClientIp {
        ClientIp {
            strategy: self.strategy,
            trusted: Vec::new(),
            keying: IpKeying::default(),
        }
    }
}

#[derive(Clone, Debug)]
enum Strategy {
    TrustedProxies(ListHeader),
    Hops(usize, ListHeader),
    Single(HeaderName),
}

impl ClientIp {
    /// Trusts forwarding headers from proxies in `cidrs` (`"10.0.0.0/8"`,
    /// `"2001:db8::/32"`, or single addresses).
    ///
    /// If the socket peer is not in `cidrs`, the key is the peer. Otherwise the
    /// `X-Forwarded-For` entries are walked from the right, passing over trusted
    /// proxies; the first address that is not one is the client. An opaque entry
    /// stops the walk (see the [rules](Self#rules)); a trusted peer that sent no
    /// header is itself the client.
    ///
    /// # Errors
    ///
    /// a [`ConfigError`] when the list is empty, an entry is not a
    /// network or has host bits set (`10.1.2.3/8`), or an entry is a /0 (trusting
    /// every address would let any client choose its key).
    pub fn trusted_proxies<I, S>(cidrs: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(ClientIp {
            strategy: Strategy::TrustedProxies(ListHeader::XForwardedFor),
            trusted: parse_cidrs(cidrs)?,
            keying: IpKeying::default(),
        })
    }

    /// Trusts exactly `count` proxies in front of the service, the one that
    /// connects to it (the socket peer) included. Finish it with
    /// [`only_from`](ClientIpBuilder::only_from) (the networks the socket peer,
    /// your last proxy, connects from) or
    /// [`trust_any_peer`](ClientIpBuilder::trust_any_peer).
    ///
    /// Each proxy appends the address it received the request from, so the
    /// client is the entry `count` hops from the right: with `hops(1)`, a single
    /// load balancer, the rightmost entry. Intermediate entries are not checked:
    /// this trusts the network layout, so the service must not be reachable
    /// except through those proxies.
    ///
    /// ```
    /// use tollgate::key::ClientIp;
    ///
    /// # fn main() -> Result<(), tollgate::ConfigError> {
    /// // Two proxies; the last one connects from 10.1.0.0/16.
    /// let key = ClientIp::hops(2)?.only_from(["10.1.0.0/16"])?;
    /// # let _ = key;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// With fewer than `count` entries the request did not come through the
    /// configured chain, and none of its entries can be told apart from forged
    /// ones: the key is then the peer, which cannot be forged. An opaque entry
    /// at the chosen position is handled as the [rules](Self#rules) say.
    ///
    /// # Errors
    ///
    /// a [`ConfigError`] unless `count` is 1 to [`MAX_HOPS`] (with no proxy,
    /// use [`PeerIp`](super::PeerIp)).
    pub fn hops(count: usize) -> Result<ClientIpBuilder, ConfigError> {
        if !(1..=MAX_HOPS).contains(&count) {
            return Err(ConfigError::key(format!(
                "ClientIp::hops({count}): the proxy count must be 1 to {MAX_HOPS}; \
                 without a proxy, use PeerIp"
            )));
        }
        Ok(ClientIpBuilder {
            strategy: Strategy::Hops(count, ListHeader::XForwardedFor),
        })
    }

    /// Takes the client from one header that your proxy sets to a single address,
    /// replacing what the client sent: `x-real-ip`, `cf-connecting-ip`,
    /// `true-client-ip`, `fly-client-ip`. Finish it with
    /// [`only_from`](ClientIpBuilder::only_from) (the proxy's networks, such as
    /// Cloudflare's published ranges) or
    /// [`trust_any_peer`](ClientIpBuilder::trust_any_peer).
    ///
    /// Only use it when the proxy really overwrites the header. Should the header
    /// hold several values after all, the rightmost (last line, last element) is
    /// used, since a proxy that appends writes there. When the header is absent
    /// or unparsable, the key is the peer.
    ///
    /// ```
    /// use tollgate::key::ClientIp;
    ///
    /// # fn main() -> Result<(), tollgate::ConfigError> {
    /// let key = ClientIp::header("cf-connecting-ip")?
    ///     .only_from(["173.245.48.0/20", "2400:cb00::/32"])?;
    /// # let _ = key;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Without a decision about whom to trust it is no key extractor, so this
    /// does not compile:
    ///
    /// ```compile_fail
    /// use tollgate::key::ClientIp;
    /// use tollgate::{MemoryStore, Quota, RateLimitLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(5)?)
    ///     .key(ClientIp::header("cf-connecting-ip")?);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// a [`ConfigError`] when `name` is not a valid header name.
    pub fn header(name: &str) -> Result<ClientIpBuilder, ConfigError> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ConfigError::key(format!("{name:?} is not a valid header name")))?;
        Ok(ClientIpBuilder {
            strategy: Strategy::Single(name),
        })
    }

    /// Believes headers only when the socket peer is in one of `cidrs` (as well
    /// as in the networks already trusted); from any other peer the key is the
    /// peer itself.
    ///
    /// With [`trusted_proxies`](Self::trusted_proxies) the networks are added to
    /// the trusted proxies. After [`trust_any_peer`](ClientIpBuilder::trust_any_peer)
    /// it takes that back: only these networks are trusted.
    ///
    /// # Errors
    ///
    /// a [`ConfigError`] as for [`trusted_proxies`](Self::trusted_proxies).
    pub fn only_from<I, S>(mut self, cidrs: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.trusted.extend(parse_cidrs(cidrs)?);
        Ok(self)
    }

    /// Reads the RFC 7239 `Forwarded` header (`for=192.0.2.43,
    /// for="[2001:db8:cafe::17]:4711"`) instead of `X-Forwarded-For`. No effect
    /// on [`header`](Self::header).
    ///
    /// Only when your proxies append `Forwarded`: otherwise the whole header is
    /// whatever the client sent, and the client chooses its own key.
    pub fn forwarded(mut self) -> Self {
        match &mut self.strategy {
            Strategy::TrustedProxies(h) | Strategy::Hops(_, h) => *h = ListHeader::Forwarded,
            Strategy::Single(_) => {}
        }
        self
    }

    /// Keys IPv6 clients by their first `prefix` bits instead of 64.
    ///
    /// # Errors
    ///
    /// a [`ConfigError`] unless `prefix` is 1 to 128.
    pub fn ipv6_prefix(mut self, prefix: u8) -> Result<Self, ConfigError> {
        self.keying = IpKeying::with_ipv6_prefix(prefix)?;
        Ok(self)
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(ip))
    }

    /// The client's address, before keying.
    fn client(&self, parts: &Parts) -> Option<IpAddr> {
        let peer = request_peer_ip(parts);
        if !self.trusted.is_empty() {
            let peer = peer?;
            if !self.is_trusted(peer) {
                return Some(peer);
            }
        }
        match &self.strategy {
            Strategy::TrustedProxies(header) => {
                let hops = forwarded::hops_from_right(&parts.headers, header);
                Some(self.rightmost_untrusted(&hops, peer?))
            }
            Strategy::Hops(count, header) => {
                let hops = forwarded::hops_from_right(&parts.headers, header);
                // Too few entries: the peer. Otherwise the entry `count` hops
                // from the right or, if that one is opaque, the nearest known
                // proxy to its right, which reported it.
                let Some(proxies_and_client) = hops.get(..*count) else {
                    return peer;
                };
                proxies_and_client
                    .iter()
                    .rev()
                    .find_map(|hop| match hop {
                        Hop::Ip(ip) => Some(*ip),
                        Hop::Opaque => None,
                    })
                    .or(peer)
            }
            Strategy::Single(name) => match forwarded::single(&parts.headers, name) {
                Some(Hop::Ip(ip)) => Some(ip),
                Some(Hop::Opaque) | None => peer,
            },
        }
    }

    /// Walks `hops` (rightmost first) past trusted proxies.
    fn rightmost_untrusted(&self, hops: &[Hop], peer: IpAddr) -> IpAddr {
        let mut reporter = peer;
        for hop in hops {
            match *hop {
                Hop::Ip(ip) if self.is_trusted(ip) => reporter = ip,
                Hop::Ip(ip) => return ip,
                Hop::Opaque => return reporter,
            }
        }
        reporter
    }
}

impl KeyExtractor for ClientIp {
    fn kind(&self) -> Kind {
        Kind::reserved("client-ip")
    }

    async fn extract(&self, parts: &Parts) -> Option<String> {
        self.client(parts).map(|ip| self.keying.key(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, Request};
    use std::net::SocketAddr;

    const PROXIES: [&str; 2] = ["10.0.0.0/8", "2001:db8:ffff::/48"];

    fn req(peer: Option<&str>, headers: &[(&str, &[u8])]) -> Parts {
        let (mut parts, ()) = Request::get("/").body(()).unwrap().into_parts();
        if let Some(peer) = peer {
            let addr = peer
                .parse::<SocketAddr>()
                .unwrap_or_else(|_| SocketAddr::new(peer.parse().unwrap(), 1));
            parts.extensions.insert(addr);
        }
        for (name, value) in headers {
            parts.headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        parts
    }

    async fn key(c: &ClientIp, peer: &str, headers: &[(&str, &[u8])]) -> Option<String> {
        c.extract(&req(Some(peer), headers)).await
    }

    fn xff(v: &str) -> (&'static str, &[u8]) {
        ("x-forwarded-for", v.as_bytes())
    }

    fn fwd(v: &str) -> (&'static str, &[u8]) {
        ("forwarded", v.as_bytes())
    }

    #[tokio::test]
    async fn forged_xff_from_an_untrusted_peer_is_ignored() {
        let c = ClientIp::trusted_proxies(PROXIES).unwrap();
        assert_eq!(c.kind(), "client-ip");
        let k = key(&c, "198.51.100.9", &[xff("1.2.3.4")]).await;
        assert_eq!(k.as_deref(), Some("198.51.100.9"));
        // Claiming to be a trusted proxy does not help either.
        let k = key(&c, "198.51.100.9", &[xff("1.2.3.4, 10.0.0.1")]).await;
        assert_eq!(k.as_deref(), Some("198.51.100.9"));
    }

    #[tokio::test]
    async fn xff_from_a_trusted_peer_is_honoured() {
        let c = ClientIp::trusted_proxies(PROXIES).unwrap();
        let k = key(&c, "10.0.0.2", &[xff("203.0.113.7")]).await;
        assert_eq!(k.as_deref(), Some("203.0.113.7"));
        // No header from a trusted proxy: the proxy is the client.
        assert_eq!(key(&c, "10.0.0.2", &[]).await.as_deref(), Some("10.0.0.2"));
    }

    #[tokio::test]
    async fn the_rightmost_untrusted_entry_wins_over_several_proxies() {
        let c = ClientIp::trusted_proxies(PROXIES).unwrap();
        let h = xff("6.6.6.6, 7.7.7.7, 203.0.113.7, 10.1.0.1, 2001:db8:ffff::5");
        let k = key(&c, "[2001:db8:ffff::9]:443", &[h]).await;
        assert_eq!(k.as_deref(), Some("203.0.113.7"));
    }

    #[tokio::test]
    async fn all_xff_lines_are_read_in_order() {
        let c = ClientIp::trusted_proxies(PROXIES).unwrap();
        let k = key(
            &c,
            "10.0.0.2",
            &[xff("6.6.6.6, 203.0.113.7"), xff("10.0.0.1"), xff("")],
        )
        .await;
        assert_eq!(k.as_deref(), Some("203.0.113.7"));
        // Several lines are one list: the last line's entry is the rightmost.
        let k = key(&c, "10.0.0.2", &[xff("10.0.0.1"), xff("203.0.113.8")]).await;
        assert_eq!(k.as_deref(), Some("203.0.113.8"));
    }

    #[tokio::test]
    async fn every_entry_trusted_means_the_leftmost_is_the_client() {
        let c = ClientIp::trusted_proxies(PROXIES).unwrap();
        let k = key(&c, "10.0.0.2", &[xff("10.9.9.9, 10.0.0.1")]).await;
        assert_eq!(k.as_deref(), Some("10.9.9.9"));
    }

    #[tokio::test]
    async fn opaque_hops_stop_at_the_proxy_that_reported_them() {
        let c = ClientIp::trusted_proxies(PROXIES).unwrap();
        let cases = [
            // The proxy 10.0.0.1 did not know its client.
            ("1.2.3.4, garbage, 10.0.0.1", "10.0.0.1"),
            // The peer itself wrote the unparsable entry.
            ("1.2.3.4, 10.0.0.1, not-an-ip", "10.0.0.2"),
            ("1.2.3.4, 10.0.0.1, unknown", "10.0.0.2"),
        ];
        for (header, want) in cases {
            let k = key(&c, "10.0.0.2", &[xff(header)]).await;
            assert_eq!(k.as_deref(), Some(want), "{header}");
        }
        let c = c.forwarded();
        let cases = [
            ("for=1.2.3.4, for=unknown, for=10.0.0.1", "10.0.0.1"),
            (
                "for=1.2.3.4, for=_hidden;proto=https, for=10.0.0.1",
                "10.0.0.1",
            ),
            ("for=1.2.3.4, proto=https", "10.0.0.2"),
            ("for=1.2.3.4, FOR=UNKNOWN", "10.0.0.2"),
        ];
        for (header, want) in cases {
            let k = key(&c, "10.0.0.2", &[fwd(header)]).await;
            assert_eq!(k.as_deref(), Some(want), "{header}");
        }
    }

    #[tokio::test]
    async fn forwarded_with_quoted_ipv6_and_ports() {
        let c = ClientIp::trusted_proxies(PROXIES)
            .unwrap()
            .forwarded()
            .ipv6_prefix(128)
            .unwrap();
        let h = fwd("for=192.0.2.43, for=\"[2001:db8:cafe::17]:4711\"");
        let k = key(&c, "10.0.0.2", &[h]).await;
        assert_eq!(k.as_deref(), Some("2001:db8:cafe::17/128"));
        let h = fwd("For=\"198.51.100.17:8080\";Proto=https;By=10.0.0.1");
        let k = key(&c, "10.0.0.2", &[fwd("for=6.6.6.6"), h]).await;
        assert_eq!(k.as_deref(), Some("198.51.100.17"));
        // X-Forwarded-For is not read in Forwarded mode.
        let k = key(&c, "10.0.0.2", &[xff("203.0.113.7")]).await;
        assert_eq!(k.as_deref(), Some("10.0.0.2"));
    }

    #[tokio::test]
    async fn hop_count_counts_the_peer_as_a_proxy() {
        let one = ClientIp::hops(1).unwrap().trust_any_peer();
        let two = ClientIp::hops(2).unwrap().trust_any_peer();
        let h = [xff("6.6.6.6, 203.0.113.7, 10.0.0.1")];
        assert_eq!(key(&one, "10.0.0.2", &h).await.as_deref(), Some("10.0.0.1"));
        assert_eq!(
            key(&two, "10.0.0.2", &h).await.as_deref(),
            Some("203.0.113.7")
        );
        // Too few entries: the peer, which cannot be forged.
        let k = key(&two, "198.51.100.9", &[xff("203.0.113.7")]).await;
        assert_eq!(k.as_deref(), Some("198.51.100.9"));
        let k = key(&one, "198.51.100.9", &[]).await;
        assert_eq!(k.as_deref(), Some("198.51.100.9"));
        // An opaque entry at the chosen position: the proxy that reported it.
        let k = key(&two, "10.0.0.2", &[xff("unknown, 10.0.0.1")]).await;
        assert_eq!(k.as_deref(), Some("10.0.0.1"));
        let k = key(&two, "10.0.0.2", &[xff("unknown, _x")]).await;
        assert_eq!(k.as_deref(), Some("10.0.0.2"));
        // Obfuscated intermediate proxies do not matter when counting.
        let f = two.clone().forwarded();
        let k = key(&f, "10.0.0.2", &[fwd("for=203.0.113.7, for=_lb1")]).await;
        assert_eq!(k.as_deref(), Some("203.0.113.7"));
        // Counting needs no peer when the header answers; the fallback does.
        let k = two.extract(&req(None, &h)).await;
        assert_eq!(k.as_deref(), Some("203.0.113.7"));
        assert_eq!(two.extract(&req(None, &[])).await, None);
    }

    #[tokio::test]
    async fn hop_count_can_require_a_trusted_peer() {
        let c = ClientIp::hops(1)
            .unwrap()
            .only_from(["10.0.0.0/8"])
            .unwrap();
        let h = [xff("203.0.113.7")];
        assert_eq!(
            key(&c, "10.0.0.2", &h).await.as_deref(),
            Some("203.0.113.7")
        );
        let k = key(&c, "198.51.100.9", &h).await;
        assert_eq!(k.as_deref(), Some("198.51.100.9"));
    }

    #[tokio::test]
    async fn single_header_mode() {
        let c = ClientIp::header("cf-connecting-ip")
            .unwrap()
            .trust_any_peer();
        let h: [(&str, &[u8]); 1] = [("cf-connecting-ip", b"2001:db8:1:2::77")];
        assert_eq!(
            key(&c, "10.0.0.2", &h).await.as_deref(),
            Some("2001:db8:1:2::/64")
        );
        // Absent or unparsable: the peer.
        let k = key(&c, "10.0.0.2", &[("cf-connecting-ip", b"nope")]).await;
        assert_eq!(k.as_deref(), Some("10.0.0.2"));
        assert_eq!(key(&c, "10.0.0.2", &[]).await.as_deref(), Some("10.0.0.2"));
        // Forwarded mode does not apply to a single header.
        let f = c.clone().forwarded();
        assert_eq!(key(&f, "10.0.0.2", &h).await, key(&c, "10.0.0.2", &h).await);
        // With trusted networks, only trusted peers are believed.
        let c = c.only_from(["10.0.0.0/8"]).unwrap();
        assert_eq!(
            key(&c, "10.0.0.2", &h).await.as_deref(),
            Some("2001:db8:1:2::/64")
        );
        assert_eq!(
            key(&c, "198.51.100.9", &h).await.as_deref(),
            Some("198.51.100.9")
        );
        // The peer check needs a peer.
        assert_eq!(c.extract(&req(None, &h)).await, None);
        let x = ClientIp::header("x-real-ip").unwrap().trust_any_peer();
        let k = key(&x, "10.0.0.2", &[("x-real-ip", b"203.0.113.5:3333")]).await;
        assert_eq!(k.as_deref(), Some("203.0.113.5"));
    }

    #[tokio::test]
    async fn no_peer_means_no_key_when_trust_depends_on_it() {
        let c = ClientIp::trusted_proxies(PROXIES).unwrap();
        assert_eq!(c.extract(&req(None, &[xff("203.0.113.7")])).await, None);
    }

    #[tokio::test]
    async fn ipv6_clients_share_a_bucket_per_prefix() {
        let c = ClientIp::trusted_proxies(PROXIES).unwrap();
        let k = |v: &'static str| {
            let c = c.clone();
            async move { key(&c, "10.0.0.2", &[xff(v)]).await }
        };
        assert_eq!(k("2001:db8:1:2::1").await, k("2001:db8:1:2:ffff::2").await);
        assert_ne!(k("2001:db8:1:2::1").await, k("2001:db8:1:3::1").await);
        assert_eq!(
            k("[2001:db8:1:2::1]:99").await.as_deref(),
            Some("2001:db8:1:2::/64")
        );
        let c56 = ClientIp::trusted_proxies(PROXIES)
            .unwrap()
            .ipv6_prefix(56)
            .unwrap();
        let a = key(&c56, "10.0.0.2", &[xff("2001:db8:1:201::1")]).await;
        let b = key(&c56, "10.0.0.2", &[xff("2001:db8:1:2ff::1")]).await;
        assert_eq!(a.as_deref(), Some("2001:db8:1:200::/56"));
        assert_eq!(a, b);
        assert!(
            ClientIp::hops(1)
                .unwrap()
                .trust_any_peer()
                .ipv6_prefix(0)
                .is_err()
        );
    }

    #[tokio::test]
    async fn mapped_addresses_and_zone_ids_are_canonical() {
        let c = ClientIp::trusted_proxies(PROXIES).unwrap();
        // A dual-stack socket reports IPv4 proxies as mapped IPv6: still trusted.
        let k = key(&c, "[::ffff:10.0.0.2]:1", &[xff("::ffff:203.0.113.7")]).await;
        assert_eq!(k.as_deref(), Some("203.0.113.7"));
        let k = key(&c, "10.0.0.2", &[xff("fe80::1%eth0")]).await;
        assert_eq!(k.as_deref(), Some("fe80::/64"));
        let k = key(&c, "10.0.0.2", &[xff("[fe80::1%25eth0]:80")]).await;
        assert_eq!(k.as_deref(), Some("fe80::/64"));
    }

    #[tokio::test]
    async fn hostile_headers_neither_panic_nor_grow_the_key() {
        let big = vec![b'a'; 64 * 1024];
        let binary = vec![0xfe; 64 * 1024];
        let commas = ",".repeat(64 * 1024);
        let trusted_flood = "10.0.0.1,".repeat(7 * 1024);
        let quotes = "for=\"".repeat(10 * 1024);
        let values: [&[u8]; 6] = [
            &big,
            &binary,
            commas.as_bytes(),
            trusted_flood.as_bytes(),
            quotes.as_bytes(),
            b"\x80\x81, 203.0.113.7",
        ];
        let extractors = [
            ClientIp::trusted_proxies(PROXIES).unwrap(),
            ClientIp::trusted_proxies(PROXIES).unwrap().forwarded(),
            ClientIp::hops(3).unwrap().trust_any_peer(),
            ClientIp::hops(MAX_HOPS)
                .unwrap()
                .trust_any_peer()
                .forwarded(),
            ClientIp::header("x-forwarded-for")
                .unwrap()
                .trust_any_peer(),
        ];
        for c in &extractors {
            for v in values {
                for name in ["x-forwarded-for", "forwarded"] {
                    let lines = [(name, v), (name, v)];
                    let k = key(c, "10.0.0.2", &lines).await.unwrap();
                    assert!(k.len() <= 43, "{k}");
                }
            }
        }
        // A flood of trusted entries is cut at MAX_HOPS from the right.
        let c = ClientIp::trusted_proxies(PROXIES).unwrap();
        let mut flood = String::from("203.0.113.7");
        for i in 0..100 {
            flood.push_str(&format!(",10.0.0.{}", i + 1));
        }
        let k = key(&c, "10.0.0.200", &[xff(&flood)]).await;
        assert_eq!(k.as_deref(), Some("10.0.0.37"));
    }

    #[tokio::test]
    async fn a_client_quote_cannot_hide_the_proxy_element() {
        let c = ClientIp::trusted_proxies(PROXIES).unwrap().forwarded();
        let line = "for=1.1.1.1;x=\", for=\"[2001:db8::17]:4711\"";
        let k = key(&c, "10.0.0.2", &[fwd(line)]).await;
        assert_eq!(k.as_deref(), Some("2001:db8::/64"));
    }

    /// Bytes that matter to the parsers, plus some that do not.
    fn hostile_bytes(max: usize) -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        let alphabet = b" ,;=\"\\[]:_.%019afFORunkw\t\xff".to_vec();
        proptest::collection::vec(proptest::sample::select(alphabet), 0..max)
    }

    proptest::proptest! {
        #[test]
        fn forged_prefixes_never_change_the_key(prefix in hostile_bytes(120)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let xff_mode = ClientIp::trusted_proxies(PROXIES).unwrap();
            let fwd_mode = xff_mode.clone().forwarded();
            let hops_mode = ClientIp::hops(2).unwrap().trust_any_peer();
            let cases = [
                (&xff_mode, "x-forwarded-for", &b", 203.0.113.7, 10.0.0.1"[..]),
                (&hops_mode, "x-forwarded-for", b", 203.0.113.7, 10.0.0.1"),
                (&fwd_mode, "forwarded", b", for=\"203.0.113.7:1\", for=10.0.0.1;by=_lb"),
            ];
            for (c, name, suffix) in cases {
                let line = [prefix.as_slice(), suffix].concat();
                let k = rt.block_on(key(c, "10.0.0.2", &[(name, &line)]));
                proptest::prop_assert_eq!(k.as_deref(), Some("203.0.113.7"));
            }
        }

        #[test]
        fn any_header_gives_a_short_key(
            lines in proptest::collection::vec(hostile_bytes(300), 0..4),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let extractors = [
                ClientIp::trusted_proxies(PROXIES).unwrap(),
                ClientIp::trusted_proxies(PROXIES).unwrap().forwarded(),
                ClientIp::hops(2).unwrap().trust_any_peer().forwarded(),
                ClientIp::header("forwarded").unwrap().trust_any_peer(),
            ];
            for c in &extractors {
                for name in ["x-forwarded-for", "forwarded"] {
                    let headers: Vec<_> = lines.iter().map(|l| (name, l.as_slice())).collect();
                    let k = rt.block_on(key(c, "10.0.0.2", &headers)).unwrap();
                    proptest::prop_assert!(k.len() <= 43, "{}", k);
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(crate::hostile_input::config())]

        #[test]
        fn every_strategy_keys_64k_headers_briefly_and_within_budget(
            lines in proptest::collection::vec(crate::hostile_input::header_bytes(), 1..3),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let extractors = [
                ClientIp::trusted_proxies(PROXIES).unwrap(),
                ClientIp::trusted_proxies(PROXIES).unwrap().forwarded(),
                ClientIp::hops(3).unwrap().only_from(PROXIES).unwrap(),
                ClientIp::hops(MAX_HOPS).unwrap().trust_any_peer().forwarded(),
                ClientIp::header("x-forwarded-for").unwrap().trust_any_peer(),
            ];
            for c in &extractors {
                for name in ["x-forwarded-for", "forwarded"] {
                    let headers: Vec<_> = lines.iter().map(|l| (name, l.as_slice())).collect();
                    let k = crate::hostile_input::within_budget(name, || {
                        rt.block_on(key(c, "10.0.0.2", &headers))
                    });
                    let k = k.unwrap_or_default();
                    proptest::prop_assert!(!k.is_empty() && k.len() <= 43, "{}", k);
                }
            }
        }
    }

    #[test]
    fn configuration_mistakes_are_errors() {
        let bad: [Result<ClientIp, ConfigError>; 10] = [
            ClientIp::trusted_proxies(Vec::<&str>::new()),
            ClientIp::trusted_proxies(["10.0.0.0/33"]),
            ClientIp::trusted_proxies(["10.0.0.1/8"]),
            ClientIp::hops(0).map(ClientIpBuilder::trust_any_peer),
            ClientIp::hops(MAX_HOPS + 1).map(ClientIpBuilder::trust_any_peer),
            ClientIp::header("bad header").map(ClientIpBuilder::trust_any_peer),
            ClientIp::hops(1).and_then(|c| c.only_from(["nope"])),
            // Trusting nobody is no trust decision, trusting everybody must be
            // asked for by name.
            ClientIp::hops(1).and_then(|c| c.only_from(Vec::<&str>::new())),
            ClientIp::header("x-real-ip").and_then(|c| c.only_from(Vec::<&str>::new())),
            ClientIp::header("x-real-ip").and_then(|c| c.only_from(["0.0.0.0/0"])),
        ];
        for result in bad {
            assert!(result.is_err(), "{result:?}");
        }
    }
}
