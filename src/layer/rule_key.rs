//! [`RuleKey`]: the keys a [`PolicyTable`](super::PolicyTable) rule may use.
//! Only built-in extractors, described as data (so a table can be written to
//! a configuration file and read back), and none that believes a forwarding
//! header from any peer.

use std::fmt;

use super::dyn_key::Extractor;
use crate::error::ConfigError;
use crate::key::{ClientIp, Global, Header, KeyExtractor, PeerIp};

/// Which client a [`PolicyRule`](super::PolicyRule) counts a request against:
/// one of the built-in key extractors, described as data, so that a
/// [`PolicyTable`](super::PolicyTable) can live in a configuration file.
///
/// Only keys that are safe to take from a file: the socket peer, the client
/// behind proxies *you name*, a header (always hashed), one bucket for all, or
/// the route. Nothing here believes a forwarding header from any peer
/// ([`ClientIpBuilder::trust_any_peer`](crate::key::ClientIpBuilder::trust_any_peer)
/// has no counterpart): every `client_ip` key lists the networks of the
/// proxies whose headers it believes. For anything else, set the layer's own
/// [`key`](super::RateLimitLayer::key) in code; rules without a key use it.
///
/// | constructor | file form | extractor |
/// | --- | --- | --- |
/// | [`peer_ip`](Self::peer_ip) | `"peer_ip"` | [`PeerIp`] |
/// | [`client_ip_trusted_proxies`](Self::client_ip_trusted_proxies) | `{ kind = "client_ip", trusted_proxies = ["10.0.0.0/8"] }` | [`ClientIp::trusted_proxies`] |
/// | [`client_ip_hops`](Self::client_ip_hops) | `{ kind = "client_ip", hops = 2, only_from = ["10.1.0.0/16"] }` | [`ClientIp::hops`], `only_from` |
/// | [`client_ip_header`](Self::client_ip_header) | `{ kind = "client_ip", header = "cf-connecting-ip", only_from = ["173.245.48.0/20"] }` | [`ClientIp::header`], `only_from` |
/// | [`header`](Self::header) | `{ kind = "header", name = "x-tenant" }` | [`Header`], hashed |
/// | [`global`](Self::global) | `"global"` | [`Global`] |
/// | [`route`](Self::route) (feature `axum`) | `"route"` | [`Route`](crate::key::Route) |
///
/// `ipv6_prefix = 56` applies to `peer_ip` and `client_ip` keys
/// ([`ipv6_prefix`](Self::ipv6_prefix)), `forwarded = true` to `client_ip`
/// keys that read a list ([`forwarded`](Self::forwarded)).
///
/// A header key is whatever the client sends: a new value is a new bucket
/// (see [the key recipes](crate::key#recipes-who-gets-a-bucket)). Keep a limit
/// per address in front of it.
///
/// ```
/// use tollgate::layer::RuleKey;
///
/// # fn main() -> Result<(), tollgate::ConfigError> {
/// let behind_lb = RuleKey::client_ip_trusted_proxies(["10.0.0.0/8"])?.ipv6_prefix(56)?;
/// assert_eq!(behind_lb.kind(), "client-ip");
/// assert!(RuleKey::client_ip_header("x-real-ip", Vec::<&str>::new()).is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct RuleKey {
    spec: KeySpec,
    extractor: Extractor,
}

/// A key as data: what the file says, and what `RuleKey` is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeySpec {
    PeerIp {
        ipv6_prefix: Option<u8>,
    },
    ClientIp {
        from: ClientIpFrom,
        /// The networks whose headers are believed (never empty).
        trusted: Vec<String>,
        forwarded: bool,
        ipv6_prefix: Option<u8>,
    },
    Header {
        name: String,
    },
    Global,
    // Made by `RuleKey::route` (feature `axum`) or read from a file.
    #[cfg_attr(not(any(feature = "axum", feature = "serde")), allow(dead_code))]
    Route,
}

/// Where a `client_ip` key reads the client from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ClientIpFrom {
    TrustedProxies,
    Hops(usize),
    Header(String),
}

impl KeySpec {
    /// The extractor this describes, or why it cannot be built.
    pub(crate) fn build(&self) -> Result<Extractor, ConfigError> {
        Ok(match self {
            KeySpec::PeerIp { ipv6_prefix } => Extractor::new(match ipv6_prefix {
                Some(bits) => PeerIp::new().ipv6_prefix(*bits)?,
                None => PeerIp::new(),
            }),
            KeySpec::ClientIp {
                from,
                trusted,
                forwarded,
                ipv6_prefix,
            } => {
                let mut key = match from {
                    ClientIpFrom::TrustedProxies => ClientIp::trusted_proxies(trusted)?,
                    ClientIpFrom::Hops(count) => ClientIp::hops(*count)?.only_from(trusted)?,
                    ClientIpFrom::Header(name) => ClientIp::header(name)?.only_from(trusted)?,
                };
                if *forwarded {
                    if let ClientIpFrom::Header(name) = from {
                        return Err(ConfigError::key(format!(
                            "`forwarded` reads the Forwarded header instead of X-Forwarded-For; \
                             a client_ip key that reads {name:?} reads neither"
                        )));
                    }
                    key = key.forwarded();
                }
                if let Some(bits) = ipv6_prefix {
                    key = key.ipv6_prefix(*bits)?;
                }
                Extractor::new(key)
            }
            KeySpec::Header { name } => Extractor::new(Header::new(name)?),
            KeySpec::Global => Extractor::new(Global),
            KeySpec::Route => route()?,
        })
    }
}

#[cfg(feature = "axum")]
fn route() -> Result<Extractor, ConfigError> {
    Ok(Extractor::new(crate::key::Route))
}

#[cfg(not(feature = "axum"))]
fn route() -> Result<Extractor, ConfigError> {
    Err(ConfigError::key(
        "the key `route` reads axum's MatchedPath: it needs tollgate's `axum` feature",
    ))
}

impl RuleKey {
    pub(crate) fn from_spec(spec: KeySpec) -> Result<Self, ConfigError> {
        let extractor = spec.build()?;
        Ok(RuleKey { spec, extractor })
    }

    fn infallible(spec: KeySpec, extractor: impl KeyExtractor) -> Self {
        RuleKey {
            spec,
            extractor: Extractor::new(extractor),
        }
    }

    /// The socket peer's address ([`PeerIp`]), as the layer's default key.
    pub fn peer_ip() -> Self {
        Self::infallible(KeySpec::PeerIp { ipv6_prefix: None }, PeerIp::new())
    }

    /// The client behind proxies in `cidrs`
    /// ([`ClientIp::trusted_proxies`]).
    ///
    /// # Errors
    ///
    /// As for [`ClientIp::trusted_proxies`]: an empty list, an entry that is
    /// not a network, or a /0.
    pub fn client_ip_trusted_proxies<I, S>(cidrs: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::from_spec(KeySpec::ClientIp {
            from: ClientIpFrom::TrustedProxies,
            trusted: strings(cidrs),
            forwarded: false,
            ipv6_prefix: None,
        })
    }

    /// The client `count` proxies from the right, believed only from a peer
    /// in `only_from` ([`ClientIp::hops`] then
    /// [`only_from`](crate::key::ClientIpBuilder::only_from)).
    ///
    /// # Errors
    ///
    /// As for those two: a count outside 1 to
    /// [`MAX_HOPS`](crate::key::MAX_HOPS), an empty or invalid `only_from`.
    pub fn client_ip_hops<I, S>(count: usize, only_from: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::from_spec(KeySpec::ClientIp {
            from: ClientIpFrom::Hops(count),
            trusted: strings(only_from),
            forwarded: false,
            ipv6_prefix: None,
        })
    }

    /// The client from the single-address header `name` (`x-real-ip`,
    /// `cf-connecting-ip`), believed only from a peer in `only_from`
    /// ([`ClientIp::header`] then
    /// [`only_from`](crate::key::ClientIpBuilder::only_from)).
    ///
    /// # Errors
    ///
    /// As for those two: an invalid header name, an empty or invalid
    /// `only_from`.
    pub fn client_ip_header<I, S>(name: &str, only_from: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::from_spec(KeySpec::ClientIp {
            from: ClientIpFrom::Header(name.to_owned()),
            trusted: strings(only_from),
            forwarded: false,
            ipv6_prefix: None,
        })
    }

    /// The value of the request header `name`, hashed ([`Header`]). The
    /// client writes it: see the warning in the [type docs](Self).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when `name` is not a valid header name.
    pub fn header(name: &str) -> Result<Self, ConfigError> {
        Self::from_spec(KeySpec::Header {
            name: name.to_owned(),
        })
    }

    /// One bucket for every request ([`Global`]).
    pub fn global() -> Self {
        Self::infallible(KeySpec::Global, Global)
    }

    /// The route template axum matched ([`Route`](crate::key::Route)): one
    /// bucket per route, shared by every client.
    #[cfg(feature = "axum")]
    pub fn route() -> Self {
        Self::infallible(KeySpec::Route, crate::key::Route)
    }

    /// For a `client_ip` key reading `X-Forwarded-For` (trusted proxies or
    /// hops): read the RFC 7239 `Forwarded` header instead
    /// ([`ClientIp::forwarded`]).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for any other key.
    pub fn forwarded(self) -> Result<Self, ConfigError> {
        match self.spec {
            KeySpec::ClientIp {
                from,
                trusted,
                ipv6_prefix,
                ..
            } => Self::from_spec(KeySpec::ClientIp {
                from,
                trusted,
                forwarded: true,
                ipv6_prefix,
            }),
            other => Err(ConfigError::key(format!(
                "`forwarded` applies to client_ip keys, not to {}",
                other.kind_name()
            ))),
        }
    }

    /// For a `peer_ip` or `client_ip` key: key IPv6 clients by their first
    /// `bits` bits instead of 64.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for other keys, or unless `bits` is 1 to 128.
    pub fn ipv6_prefix(self, bits: u8) -> Result<Self, ConfigError> {
        let spec = match self.spec {
            KeySpec::PeerIp { .. } => KeySpec::PeerIp {
                ipv6_prefix: Some(bits),
            },
            KeySpec::ClientIp {
                from,
                trusted,
                forwarded,
                ..
            } => KeySpec::ClientIp {
                from,
                trusted,
                forwarded,
                ipv6_prefix: Some(bits),
            },
            other => {
                return Err(ConfigError::key(format!(
                    "`ipv6_prefix` applies to peer_ip and client_ip keys, not to {}",
                    other.kind_name()
                )));
            }
        };
        Self::from_spec(spec)
    }

    /// The kind of the extractor, as it appears in storage keys (`ip`,
    /// `client-ip`, `header:x-tenant`).
    pub fn kind(&self) -> &str {
        self.extractor.kind()
    }

    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn spec(&self) -> &KeySpec {
        &self.spec
    }

    pub(crate) fn extractor(&self) -> &Extractor {
        &self.extractor
    }
}

impl KeySpec {
    /// The name of the kind in configuration files.
    pub(crate) fn kind_name(&self) -> &'static str {
        match self {
            KeySpec::PeerIp { .. } => "peer_ip",
            KeySpec::ClientIp { .. } => "client_ip",
            KeySpec::Header { .. } => "header",
            KeySpec::Global => "global",
            KeySpec::Route => "route",
        }
    }
}

fn strings<I, S>(items: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    items.into_iter().map(|s| s.as_ref().to_owned()).collect()
}

impl PartialEq for RuleKey {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec
    }
}

impl Eq for RuleKey {}

impl fmt::Debug for RuleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RuleKey").field(&self.spec).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_names_whom_it_trusts() {
        assert_eq!(RuleKey::peer_ip().kind(), "ip");
        assert_eq!(RuleKey::global().kind(), "global");
        assert_eq!(
            RuleKey::header("x-tenant").unwrap().kind(),
            "header:x-tenant"
        );
        let lb = RuleKey::client_ip_trusted_proxies(["10.0.0.0/8"]).unwrap();
        assert_eq!(lb.clone().forwarded().unwrap().kind(), "client-ip");
        let none: [&str; 0] = [];
        assert!(RuleKey::client_ip_trusted_proxies(none).is_err());
        assert!(RuleKey::client_ip_hops(2, none).is_err());
        assert!(RuleKey::client_ip_hops(2, ["0.0.0.0/0"]).is_err());
        assert!(RuleKey::client_ip_hops(0, ["10.0.0.0/8"]).is_err());
        assert!(RuleKey::client_ip_header("x-real-ip", ["10.0.0.0/8"]).is_ok());
        assert!(
            RuleKey::client_ip_header("x-real-ip", ["10.0.0.0/8"])
                .unwrap()
                .forwarded()
                .is_err()
        );
        assert!(RuleKey::header("bad header").is_err());
        assert!(RuleKey::global().ipv6_prefix(48).is_err());
        assert!(RuleKey::peer_ip().ipv6_prefix(0).is_err());
        assert_eq!(
            RuleKey::peer_ip().ipv6_prefix(56).unwrap(),
            RuleKey::from_spec(KeySpec::PeerIp {
                ipv6_prefix: Some(56)
            })
            .unwrap()
        );
    }
}
