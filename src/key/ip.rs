//! IP addresses as client keys: canonical form, IPv6 prefixes, trusted networks, and
//! the socket peer address from request extensions. Shared by
//! [`PeerIp`](super::PeerIp) and [`ClientIp`](super::ClientIp) so both key one
//! client the same way.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use http::Extensions;
use http::request::Parts;

use crate::error::ConfigError;
/// The IPv6 prefix length clients are keyed by unless configured otherwise: a
/// customer usually holds at least a /64, so keying single addresses would let one
/// client rotate through 2^64 buckets.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// How an IP address becomes a key: IPv4 as it is, IPv6 by its network prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IpKeying {
    ipv6_prefix: u8,
}

impl Default for IpKeying {
    fn default() -> Self {
        IpKeying {
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

impl IpKeying {
    /// Keys IPv6 clients by their first `prefix` bits (1..=128).
    pub(crate) fn with_ipv6_prefix(prefix: u8) -> Result<Self, ConfigError> {
        if (1..=128).contains(&prefix) {
            Ok(IpKeying {
                ipv6_prefix: prefix,
            })
        } else {
            Err(ConfigError::key(format!(
                "IPv6 prefix length {prefix} is out of range: use 1 to 128 (64 is usual)"
            )))
        }
    }

    /// The key of `ip`: `203.0.113.7`, or `2001:db8:1:2::/64` for IPv6. An
    /// IPv6 address that carries an IPv4 client (see [`embedded_ipv4`]) is
    /// that client.
    pub(crate) fn key(&self, ip: IpAddr) -> String {
        match canonical(ip) {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => match embedded_ipv4(v6) {
                Some(v4) => v4.to_string(),
                None => {
                    let net = Ipv6Addr::from(u128::from(v6) & mask(self.ipv6_prefix, 128));
                    format!("{net}/{}", self.ipv6_prefix)
                }
            },
        }
    }
}

/// The IPv4 client an IPv6 address stands for, where its prefix says so: a
/// NAT64 translator's well-known prefix `64:ff9b::/96` (RFC 6052) puts every
/// IPv4 client it translates in one /64, and 6to4 (`2002::/16`, RFC 3056)
/// gives each IPv4 host a /48 of its own (65 536 /64s). Keyed by prefix,
/// the first would share one bucket among all of them, the second give one
/// host 65 536.
fn embedded_ipv4(v6: Ipv6Addr) -> Option<std::net::Ipv4Addr> {
    let bits = u128::from(v6);
    let v4 = |shift: u32| std::net::Ipv4Addr::from((bits >> shift) as u32);
    match v6.segments() {
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(v4(0)),
        [0x2002, ..] => Some(v4(80)),
        _ => None,
    }
}

/// IPv4-mapped IPv6 (`::ffff:203.0.113.7`, what a dual-stack socket reports for an
/// IPv4 client) is the IPv4 client, so it must share that client's bucket.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// The top `prefix` bits of a `bits`-wide address set; shifts are checked so no
/// prefix length can overflow.
fn mask(prefix: u8, bits: u32) -> u128 {
    let keep = u32::from(prefix).min(bits);
    let ones = u128::MAX.checked_shl(128 - keep).unwrap_or(0);
    // Only the low `bits` bits exist in the address.
    ones >> (128 - bits)
}

/// A network in CIDR notation, such as a trusted proxy range.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

impl Cidr {
    /// Whether `ip` (canonicalised first) lies in this network.
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let m = mask(self.prefix, 32);
                u128::from(u32::from(ip)) & m == u128::from(u32::from(net))
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                u128::from(ip) & mask(self.prefix, 128) == u128::from(net)
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = ConfigError;

    /// `10.0.0.0/8`, `2001:db8::/32`, or a single address (`10.0.0.7`, a /32 or
    /// /128). Host bits must be zero: `10.1.2.3/8` is most likely a typo, and
    /// silently widening or narrowing a trusted range is worse than refusing it.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let invalid = |why: &str| ConfigError::key(format!("{s:?} is not a valid CIDR: {why}"));
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((addr, len)) => (addr, Some(len)),
            None => (s.trim(), None),
        };
        let net = IpAddr::from_str(addr)
            .map_err(|_| invalid("expected an address such as 10.0.0.0/8 or 2001:db8::/32"))?;
        let net = canonical(net);
        let bits: u8 = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(len) => len
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(|| invalid(&format!("the prefix length must be 0 to {bits}")))?,
        };
        let cidr = Cidr { net, prefix };
        let masked = cidr.masked();
        if masked != net {
            return Err(invalid(&format!(
                "host bits are set; did you mean {masked}/{prefix}?"
            )));
        }
        Ok(cidr)
    }
}

impl Cidr {
    fn masked(&self) -> IpAddr {
        match self.net {
            IpAddr::V4(v4) => {
                let m = mask(self.prefix, 32);
                // The mask of a 32-bit width fits in u32.
                let m = u32::try_from(m).unwrap_or(u32::MAX);
                IpAddr::V4((u32::from(v4) & m).into())
            }
            IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & mask(self.prefix, 128)).into()),
        }
    }
}

/// Parses trusted networks. An empty list is refused, since trusting nothing
/// would make a trusted-proxy extractor silently behave like
/// [`PeerIp`](super::PeerIp); so is a /0, since trusting every address means
/// believing the leftmost, client-written forwarding entry.
pub(crate) fn parse_cidrs<I, S>(cidrs: I) -> Result<Vec<Cidr>, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let cidrs = cidrs
        .into_iter()
        .map(|c| c.as_ref().parse())
        .collect::<Result<Vec<Cidr>, _>>()?;
    if let Some(all) = cidrs.iter().find(|c| c.prefix == 0) {
        return Err(ConfigError::key(format!(
            "trusting {all:?} would trust every address, so any client could pick its \
             own key; list your proxies' networks"
        )));
    }
    if cidrs.is_empty() {
        return Err(ConfigError::key(
            "the list of trusted proxy networks is empty",
        ));
    }
    Ok(cidrs)
}

/// The socket peer's IP, canonicalised, from whichever connection info the server
/// put in the request extensions: axum's `ConnectInfo<SocketAddr>`, tonic's
/// `TcpConnectInfo` or `TlsConnectInfo<TcpConnectInfo>`, or a plain `SocketAddr`. The port and any IPv6 scope id are
/// dropped: neither identifies a client.
pub(crate) fn peer_ip(extensions: &Extensions) -> Option<IpAddr> {
    peer_socket(extensions).map(|addr| canonical(addr.ip()))
}

/// [`peer_ip`] of a request head. A gRPC request without one gets the one-time
/// hint that tonic's connection info needs the `tonic` feature.
pub(crate) fn request_peer_ip(parts: &Parts) -> Option<IpAddr> {
    let ip = peer_ip(&parts.extensions);
    if ip.is_none() {
        super::tonic_hint::peer_missing(parts);
    }
    ip
}

fn peer_socket(extensions: &Extensions) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) =
        extensions.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*addr);
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|info| info.remote_addr())
    {
        return Some(addr);
    }
    if let Some(addr) = extensions.get::<SocketAddr>() {
        return Some(*addr);
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = tonic_tls_peer(extensions) {
        return Some(addr);
    }
    None
}

/// The peer of a TLS tonic server, which stores `TlsConnectInfo<TcpConnectInfo>`.
///
/// That type can only be named with one of tonic's TLS features, which tollgate
/// does not turn on (they would compile rustls for every tonic user). A TLS
/// server has one on, and cargo builds tonic once with the features of the
/// whole program, so tonic's own `Request::remote_addr` reads the TLS info
/// exactly when a server can insert it. It needs an owned request, hence the
/// clone of the extensions; this runs only when no cheaper peer address was
/// found, that is on TLS tonic servers (or servers that give no peer at all).
#[cfg(feature = "tonic")]
fn tonic_tls_peer(extensions: &Extensions) -> Option<SocketAddr> {
    let metadata = tonic::metadata::MetadataMap::new();
    tonic::Request::from_parts(metadata, extensions.clone(), ()).remote_addr()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_keys_are_the_address() {
        assert_eq!(IpKeying::default().key(ip("203.0.113.7")), "203.0.113.7");
    }

    #[test]
    fn ipv4_mapped_ipv6_is_the_ipv4_client() {
        assert_eq!(
            IpKeying::default().key(ip("::ffff:203.0.113.7")),
            "203.0.113.7"
        );
    }

    #[test]
    fn ipv6_that_carries_an_ipv4_client_is_that_client() {
        let k = IpKeying::default();
        // NAT64: each translated client apart, not one /64 for all.
        assert_eq!(k.key(ip("64:ff9b::203.0.113.7")), "203.0.113.7");
        assert_eq!(k.key(ip("64:ff9b::198.51.100.1")), "198.51.100.1");
        // 6to4: one key per IPv4 host, whatever /64 of its /48.
        assert_eq!(k.key(ip("2002:cb00:7107:1::1")), "203.0.113.7");
        assert_eq!(k.key(ip("2002:cb00:7107:ffff::9")), "203.0.113.7");
        // Neighbours of those prefixes are plain IPv6.
        assert_eq!(k.key(ip("64:ff9b:1::1")), "64:ff9b:1::/64");
        assert_eq!(k.key(ip("2003::1")), "2003::/64");
    }

    #[test]
    fn ipv6_is_keyed_by_prefix() {
        let k = IpKeying::default();
        assert_eq!(k.key(ip("2001:db8:1:2:aaaa::1")), "2001:db8:1:2::/64");
        assert_eq!(k.key(ip("2001:db8:1:2:ffff::9")), "2001:db8:1:2::/64");
        assert_ne!(k.key(ip("2001:db8:1:3::1")), k.key(ip("2001:db8:1:2::1")));
        let k56 = IpKeying::with_ipv6_prefix(56).unwrap();
        assert_eq!(k56.key(ip("2001:db8:1:2ff::1")), "2001:db8:1:200::/56");
        assert_eq!(
            k56.key(ip("2001:db8:1:201::1")),
            k56.key(ip("2001:db8:1:2ff::1"))
        );
        let k128 = IpKeying::with_ipv6_prefix(128).unwrap();
        assert_eq!(k128.key(ip("2001:db8::1")), "2001:db8::1/128");
        let k1 = IpKeying::with_ipv6_prefix(1).unwrap();
        assert_eq!(k1.key(ip("ffff::1")), "8000::/1");
    }

    #[test]
    fn ipv6_prefix_is_validated() {
        for bad in [0, 129, 255] {
            let err = IpKeying::with_ipv6_prefix(bad).unwrap_err().to_string();
            assert!(err.contains("1 to 128"), "{err}");
        }
    }

    #[test]
    fn cidrs_parse_and_match() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains(ip("10.255.0.1")));
        assert!(c.contains(ip("::ffff:10.1.1.1")));
        assert!(!c.contains(ip("11.0.0.1")));
        assert!(!c.contains(ip("::1")));
        let c: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(c.contains(ip("2001:db8:ffff::1")));
        assert!(!c.contains(ip("2001:db9::1")));
        let c: Cidr = "192.0.2.1".parse().unwrap();
        assert!(c.contains(ip("192.0.2.1")) && !c.contains(ip("192.0.2.2")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("8.8.8.8")) && !all.contains(ip("::1")));
        let all6: Cidr = "::/0".parse().unwrap();
        assert!(all6.contains(ip("2001:db8::1")));
    }

    #[test]
    fn bad_cidrs_are_configuration_errors() {
        for bad in [
            "",
            "10.0.0.0/33",
            "::/129",
            "10.0.0/8",
            "10.0.0.0/x",
            "bogus",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        let err = "10.1.2.3/8".parse::<Cidr>().unwrap_err().to_string();
        assert!(err.contains("did you mean 10.0.0.0/8"), "{err}");
        assert!(parse_cidrs(Vec::<String>::new()).is_err());
        for everything in ["0.0.0.0/0", "::/0"] {
            let err = parse_cidrs(["10.0.0.0/8", everything])
                .unwrap_err()
                .to_string();
            assert!(err.contains("every address"), "{err}");
        }
    }

    #[test]
    fn peer_comes_from_a_socket_addr_extension() {
        let mut ext = Extensions::new();
        assert_eq!(peer_ip(&ext), None);
        ext.insert(SocketAddr::from(([192, 0, 2, 1], 4711)));
        assert_eq!(peer_ip(&ext), Some(ip("192.0.2.1")));
        let mut ext = Extensions::new();
        ext.insert("[::ffff:192.0.2.1%3]:80".parse::<SocketAddr>().unwrap());
        assert_eq!(peer_ip(&ext), Some(ip("192.0.2.1")));
    }

    #[cfg(feature = "axum")]
    #[test]
    fn peer_comes_from_axum_connect_info() {
        let mut ext = Extensions::new();
        ext.insert(axum::extract::ConnectInfo(SocketAddr::from((
            [198, 51, 100, 2],
            1,
        ))));
        assert_eq!(peer_ip(&ext), Some(ip("198.51.100.2")));
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn peer_comes_from_tonic_tcp_connect_info() {
        let mut ext = Extensions::new();
        ext.insert(tonic::transport::server::TcpConnectInfo {
            local_addr: None,
            remote_addr: Some(SocketAddr::from(([198, 51, 100, 3], 1))),
        });
        assert_eq!(peer_ip(&ext), Some(ip("198.51.100.3")));
    }
}
