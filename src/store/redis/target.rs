//! Where a store's connections come from (one server's URL, an application's
//! pool, cluster seeds, sentinels) and how they are secured (TLS), checked
//! when the store is built and turned into a connection source and a label
//! for messages. Nothing here connects.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

use super::connection::Source;
use super::store::MakePerNode;
use crate::error::ConfigError;
/// Where a store gets its connections.
pub(crate) enum Target {
    Url(String),
    Pool(Pool),
    /// A cluster (`cluster/target.rs`) or sentinels (`sentinel.rs`).
    #[allow(
        dead_code,
        reason = "made by the cluster and sentinel targets, and a build may have neither"
    )]
    Topology(Box<dyn Topology>),
}

/// A target that an optional feature adds: a cluster (`cluster/target.rs`)
/// or the primary that sentinels name (`sentinel.rs`).
pub(crate) trait Topology: fmt::Debug + Send + Sync {
    /// The connection source, and the label messages name it by (never with
    /// a password); or the first configuration mistake.
    fn source(
        self: Box<Self>,
        settings: &Settings,
        certificates: Option<Certificates>,
    ) -> Result<(Source, Arc<str>), ConfigError>;

    /// Whether it is the application's own pool, which TLS settings cannot
    /// reach.
    fn is_pool(&self) -> bool {
        false
    }

    /// The per-node queues a store on it batches in (see
    /// [`Target::per_node`]).
    fn per_node(&self) -> Option<MakePerNode> {
        None
    }

    /// Whether it takes the primary's credentials (sentinels).
    #[cfg(feature = "sentinel")]
    fn takes_primary_auth(&self) -> bool {
        false
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Url(url) => write!(f, "{}", redact(url)),
            Target::Pool(_) => write!(f, "application pool"),
            Target::Topology(topology) => fmt::Debug::fmt(topology, f),
        }
    }
}

/// Credentials for the primary that sentinels name.
#[cfg(feature = "sentinel")]
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) username: Option<String>,
    pub(crate) password: String,
}

#[cfg(feature = "sentinel")]
impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}

/// What besides the target decides how connections are made.
pub(crate) struct Settings {
    pub(crate) call_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    #[cfg(feature = "tls")]
    pub(crate) root_certificates: Option<Vec<u8>>,
    #[cfg(feature = "sentinel")]
    pub(crate) primary_auth: Option<Credentials>,
}

impl Target {
    /// The connection source, and the label messages name it by (never with
    /// a password); or the first configuration mistake.
    pub(crate) fn source(self, settings: &Settings) -> Result<(Source, Arc<str>), ConfigError> {
        #[cfg(feature = "sentinel")]
        if settings.primary_auth.is_some() && !self.takes_primary_auth() {
            return Err(ConfigError::store(
                "sentinel_primary_auth applies to a store built with .sentinel(..) only",
            ));
        }
        #[cfg(feature = "tls")]
        let certificates = certificates(settings.root_certificates.as_deref())?;
        #[cfg(not(feature = "tls"))]
        let certificates: Option<Certificates> = None;
        if certificates.is_some() && self.is_pool() {
            return Err(ConfigError::store(
                "tls_root_certificates cannot apply to an application's pool: \
                 configure TLS on the pool itself",
            ));
        }
        match self {
            Target::Url(url) => {
                let info = parse(&url)?;
                let host = host_of(info.addr());
                let client = client(&url, info, certificates)?;
                Ok((Source::Client(client), host))
            }
            Target::Pool(pool) => Ok((Source::Pool(pool), "the application's pool".into())),
            Target::Topology(topology) => topology.source(settings, certificates),
        }
    }

    /// How a store on this target batches: per node on a cluster, where
    /// every declared key of one call must be in one hash slot (otherwise
    /// `CROSSSLOT`). One client's keys always share a slot (the `{hash
    /// tag}`), but a batch mixes clients: a cluster store batches per node,
    /// declaring one client's keys (see `cluster/`).
    pub(crate) fn per_node(&self) -> Option<MakePerNode> {
        match self {
            Target::Topology(topology) => topology.per_node(),
            Target::Url(_) | Target::Pool(_) => None,
        }
    }

    fn is_pool(&self) -> bool {
        match self {
            Target::Url(_) => false,
            Target::Pool(_) => true,
            Target::Topology(topology) => topology.is_pool(),
        }
    }

    #[cfg(feature = "sentinel")]
    fn takes_primary_auth(&self) -> bool {
        matches!(self, Target::Topology(topology) if topology.takes_primary_auth())
    }
}

/// A URL parsed, with the mistakes redis-rs would only find when connecting
/// (or would describe in its own terms) found now.
pub(super) fn parse(url: &str) -> Result<ConnectionInfo, ConfigError> {
    let invalid =
        |why: &str| ConfigError::store(format!("Redis URL {}: {}", redact(url), redact(why)));
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    let tls = ["rediss", "valkeys"]
        .iter()
        .any(|s| s.eq_ignore_ascii_case(scheme));
    if tls && !cfg!(feature = "tls") {
        return Err(invalid(
            "TLS (rediss://) needs tollgate's `tls` cargo feature",
        ));
    }
    let info = url
        .into_connection_info()
        .map_err(|e| invalid(&e.to_string()))?;
    if let ConnectionAddr::TcpTls { insecure: true, .. } = info.addr() {
        return Err(invalid(
            "#insecure (no certificate verification) is not supported: \
             give the server's CA with tls_root_certificates instead",
        ));
    }
    Ok(info.set_tcp_settings(tcp_settings()))
}

/// `TCP_NODELAY`, as Redis sets on its side and most clients do: with
/// several calls in flight on one connection, Nagle's algorithm would hold
/// a call written while an earlier one is unacknowledged until that ACK,
/// which the server may delay up to 40 ms.
pub(super) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

pub(super) fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}

/// The client for one server, trusting `certificates` when given.
fn client(
    url: &str,
    info: ConnectionInfo,
    certificates: Option<Certificates>,
) -> Result<redis::Client, ConfigError> {
    let invalid =
        |why: String| ConfigError::store(format!("Redis URL {}: {}", redact(url), redact(&why)));
    if is_tls(&info) {
        tls_provider();
    }
    match certificates {
        None => redis::Client::open(info).map_err(|e| invalid(e.to_string())),
        Some(certificates) => {
            if !is_tls(&info) {
                return Err(invalid(
                    "tls_root_certificates needs a rediss:// URL".to_owned(),
                ));
            }
            certificates.client(info).map_err(invalid)
        }
    }
}

/// `what a,b,c +N more`: a few addresses, for messages.
#[allow(
    dead_code,
    reason = "the cluster and sentinel targets' label, and a build may have neither"
)]
pub(super) fn label(what: &str, addrs: impl Iterator<Item = String>) -> Arc<str> {
    const SHOWN: usize = 3;
    let addrs: Vec<String> = addrs.collect();
    let shown = addrs
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    match addrs.len().saturating_sub(SHOWN) {
        0 => format!("{what} {shown}").into(),
        more => format!("{what} {shown} +{more} more").into(),
    }
}

/// Root certificates checked at build time, to verify servers with instead of
/// the system's roots.
#[cfg(feature = "tls")]
pub(crate) struct Certificates(pub(super) redis::TlsCertificates);

#[cfg(feature = "tls")]
fn certificates(pem: Option<&[u8]>) -> Result<Option<Certificates>, ConfigError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    let Some(pem) = pem else { return Ok(None) };
    let parsed = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError::store(format!("tls_root_certificates: not PEM: {e}")))?;
    if parsed.is_empty() {
        return Err(ConfigError::store(
            "tls_root_certificates: no certificate in the PEM \
             (expected -----BEGIN CERTIFICATE----- blocks)",
        ));
    }
    Ok(Some(Certificates(redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem.to_vec()),
    })))
}

/// Without the `tls` feature there are never certificates.
#[cfg(not(feature = "tls"))]
pub(crate) enum Certificates {}

#[cfg(feature = "tls")]
impl Certificates {
    fn client(self, info: ConnectionInfo) -> Result<redis::Client, String> {
        redis::Client::build_with_tls(info, self.0).map_err(|e| e.to_string())
    }
}

#[cfg(not(feature = "tls"))]
impl Certificates {
    fn client(self, _: ConnectionInfo) -> Result<redis::Client, String> {
        match self {}
    }
}

/// Makes sure rustls has a crypto provider before a TLS connection needs
/// one: ring, unless the application installed one. rustls picks ring by
/// itself when it is the only provider compiled in, but panics when the
/// application's dependencies compile in another one too.
pub(super) fn tls_provider() {
    #[cfg(feature = "tls")]
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one first, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// `host:port` (or the socket path) of an address, for messages.
pub(crate) fn host_of(addr: &ConnectionAddr) -> Arc<str> {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}").into()
        }
        ConnectionAddr::Unix(path) => path.display().to_string().into(),
        other => other.to_string().into(),
    }
}

/// `url` with any password replaced by `***`, for messages: a URL is
/// configuration, and its userinfo, or the `pass=` / `password=` / `user=`
/// query parameters redis-rs reads for unix sockets, may hold a secret.
pub(crate) fn redact(url: &str) -> String {
    let url = redact_query(url);
    // A mistyped URL (no `://`: `user:pass@host`, `redis:/:pass@host`) is
    // redacted as well: it is the one most likely to reach an error message.
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url.as_str()),
    };
    // The last '@' ends the userinfo, even when an unencoded password holds
    // '@' or '/' (Redis URLs have no '@' after the host).
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => String::from("***"),
            };
            match scheme {
                Some(scheme) => format!("{scheme}://{user}@{host}"),
                None => format!("{user}@{host}"),
            }
        }
        None => url.clone(),
    }
}

/// `url` with the values of secret-bearing query parameters replaced by `***`.
fn redact_query(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((name, _))
                if ["pass", "password", "user", "username"]
                    .contains(&name.to_ascii_lowercase().as_str()) =>
            {
                format!("{name}=***")
            }
            _ => param.to_owned(),
        })
        .collect();
    format!("{base}?{}", params.join("&"))
}
