//! The sentinel target (cargo feature `sentinel`):
//! [`RedisStore::from_sentinel`], the builder's `sentinel` and
//! `sentinel_primary_auth`, and the Sentinel client they make, checked when
//! the store is built.

use std::fmt;
use std::sync::Arc;

use redis::{ConnectionAddr, ConnectionInfo};

use super::builder::RedisStoreBuilder;
use super::connection::Source;
use super::store::RedisStore;
use super::target::{
    Certificates, Credentials, Settings, Target, Topology, host_of, is_tls, label, parse, redact,
    tls_provider,
};
use crate::error::ConfigError;
impl RedisStore {
    /// A store for the primary that the Sentinels at `sentinel_urls` know as
    /// `master_name` (cargo feature `sentinel`), with the default settings.
    /// Every connect asks the sentinels which server is the primary, so a
    /// failover is followed. Nothing is connected until the first check.
    ///
    /// ```no_run
    /// # fn run() -> Result<(), tollgate::ConfigError> {
    /// let store = tollgate::RedisStore::from_sentinel(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "mymaster",
    /// )?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when there is no sentinel URL, a URL cannot be
    /// parsed, the URLs disagree on TLS, credentials or database, or the
    /// master name is empty.
    pub fn from_sentinel<I, S>(sentinel_urls: I, master_name: &str) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder().sentinel(sentinel_urls, master_name).build()
    }
}

impl RedisStoreBuilder {
    /// Connects to the primary that the Sentinels at `sentinel_urls` know as
    /// `master_name` (cargo feature `sentinel`), asking them again on every
    /// connect: after a failover, the connection to the old primary breaks
    /// (or answers `READONLY`), and the next connect finds the new one.
    ///
    /// The sentinels' own credentials go into their URLs (the same for all);
    /// the primary's into [`sentinel_primary_auth`](Self::sentinel_primary_auth).
    /// `rediss://` sentinel URLs mean TLS to the sentinels and the primary
    /// alike; a database in the URLs is the primary's.
    pub fn sentinel<I, S>(mut self, sentinel_urls: I, master_name: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.target = Some(Target::Topology(Box::new(Sentinels {
            urls: sentinel_urls.into_iter().map(Into::into).collect(),
            master: master_name.into(),
        })));
        self
    }

    /// Credentials for the primary the sentinels name, sent with `AUTH`
    /// (`username` `None` for the default user). Only for a store built with
    /// [`sentinel`](Self::sentinel). The password never appears in messages or
    /// in `Debug` output.
    pub fn sentinel_primary_auth(mut self, username: Option<&str>, password: &str) -> Self {
        self.primary_auth = Some(Credentials {
            username: username.map(str::to_owned),
            password: password.to_owned(),
        });
        self
    }
}

/// The primary that the sentinels at `urls` know as `master`.
struct Sentinels {
    urls: Vec<String>,
    master: String,
}

impl fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|u| redact(u)).collect();
        write!(f, "primary {:?} via sentinels {urls:?}", self.master)
    }
}

impl Topology for Sentinels {
    fn source(
        self: Box<Self>,
        settings: &Settings,
        certificates: Option<Certificates>,
    ) -> Result<(Source, Arc<str>), ConfigError> {
        client(&self.urls, &self.master, settings, certificates)
    }

    fn takes_primary_auth(&self) -> bool {
        true
    }
}

/// The Sentinel client for the primary `master` of the sentinels at `urls`,
/// checked now.
fn client(
    urls: &[String],
    master: &str,
    settings: &Settings,
    certificates: Option<Certificates>,
) -> Result<(Source, Arc<str>), ConfigError> {
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};

    if master.is_empty() {
        return Err(ConfigError::store(
            "the Sentinel master name must not be empty",
        ));
    }
    let infos = urls
        .iter()
        .map(|u| parse(u))
        .collect::<Result<Vec<_>, _>>()?;
    let listed = || urls.iter().map(|u| redact(u)).collect::<Vec<_>>();
    let Some(first) = infos.first() else {
        return Err(ConfigError::store(
            "a Sentinel store needs at least one sentinel URL",
        ));
    };
    // One set of credentials and one TLS mode for all sentinels: that is
    // what redis-rs's Sentinel client takes.
    let same = |i: &ConnectionInfo| {
        is_tls(i) == is_tls(first)
            && i.redis_settings().username() == first.redis_settings().username()
            && i.redis_settings().password() == first.redis_settings().password()
            && i.redis_settings().db() == first.redis_settings().db()
    };
    if !infos.iter().all(same) {
        return Err(ConfigError::store(format!(
            "sentinel URLs {:?} must all use the same scheme, credentials and database",
            listed()
        )));
    }
    let tls = is_tls(first);
    let (username, password, db) = (
        first.redis_settings().username().map(str::to_owned),
        first.redis_settings().password().map(str::to_owned),
        first.redis_settings().db(),
    );
    let host = label(
        &format!("primary {master:?} via sentinels"),
        infos.iter().map(|i| host_of(i.addr()).to_string()),
    );
    let addrs: Vec<ConnectionAddr> = infos.into_iter().map(|i| i.addr().clone()).collect();
    let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)
        .map_err(|e| ConfigError::store(redact(&e.to_string())))?;
    if let Some(username) = username {
        builder = builder.set_client_to_sentinel_username(username);
    }
    if let Some(password) = password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    // Sentinels have no databases: a database in their URLs is the primary's.
    if db != 0 {
        builder = builder.set_client_to_redis_db(db);
    }
    if let Some(auth) = &settings.primary_auth {
        if let Some(username) = &auth.username {
            builder = builder.set_client_to_redis_username(username);
        }
        builder = builder.set_client_to_redis_password(&auth.password);
    }
    if tls {
        tls_provider();
        builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
    }
    if let Some(certificates) = certificates {
        if !tls {
            return Err(ConfigError::store(
                "tls_root_certificates needs rediss:// sentinel URLs",
            ));
        }
        builder = certificates.sentinel(builder);
    }
    let client = builder.build().map_err(|e| {
        ConfigError::store(format!(
            "sentinels {:?}: {}",
            listed(),
            redact(&e.to_string())
        ))
    })?;
    Ok((Source::Sentinel(tokio::sync::Mutex::new(client)), host))
}

#[cfg(feature = "tls")]
impl Certificates {
    fn sentinel(
        self,
        builder: redis::sentinel::SentinelClientBuilder,
    ) -> redis::sentinel::SentinelClientBuilder {
        builder
            .set_client_to_sentinel_certificates(self.0.clone())
            .set_client_to_redis_certificates(self.0)
    }
}

#[cfg(not(feature = "tls"))]
impl Certificates {
    fn sentinel(
        self,
        _: redis::sentinel::SentinelClientBuilder,
    ) -> redis::sentinel::SentinelClientBuilder {
        match self {}
    }
}
