//! The cluster target: [`RedisStore::from_cluster_urls`] and
//! [`from_cluster_pool`](RedisStore::from_cluster_pool), the builder's
//! `cluster` and `cluster_pool`, and the cluster client they make, checked
//! when the store is built.

use std::fmt;
use std::sync::Arc;

use super::super::builder::RedisStoreBuilder;
use super::super::connection::{Source, response_timeout};
use super::super::store::{MakePerNode, RedisStore};
use super::super::target::{
    Certificates, Settings, Target, Topology, host_of, is_tls, label, parse, redact, tcp_settings,
    tls_provider,
};
use super::connection::ClusterSource;
use super::per_node::per_node;
use crate::error::ConfigError;
impl RedisStore {
    /// A store for the Redis Cluster that the nodes at `seed_urls` belong to
    /// (cargo feature `cluster`), with the default settings. One seed that
    /// answers is enough; the others are tried when it does not. Nothing is
    /// connected until the first check (or [`ping`](Self::ping)).
    ///
    /// ```no_run
    /// # fn run() -> Result<(), tollgate::ConfigError> {
    /// let store = tollgate::RedisStore::from_cluster_urls([
    ///     "redis://10.0.0.1:6379",
    ///     "redis://10.0.0.2:6379",
    ///     "redis://10.0.0.3:6379",
    /// ])?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when there is no seed, a URL cannot be parsed or
    /// selects a database other than 0, or the seeds disagree on TLS or
    /// credentials; URLs are shown without their password.
    pub fn from_cluster_urls<I, S>(seed_urls: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder().cluster(seed_urls).build()
    }

    /// A store over the application's own deadpool-redis cluster pool
    /// (`deadpool_redis::cluster::Pool`, cargo feature `cluster`), with the
    /// default settings. It takes one cluster connection from the pool and
    /// keeps it. Refunds fail on it without being sent (see
    /// [`cluster_pool`](RedisStoreBuilder::cluster_pool)).
    pub fn from_cluster_pool(pool: deadpool_redis::cluster::Pool) -> Self {
        match Self::builder().cluster_pool(pool).build() {
            Ok(store) => store,
            // The defaults with a pool cannot fail to build.
            Err(e) => unreachable!("{e}"),
        }
    }
}

impl RedisStoreBuilder {
    /// Connects to the Redis Cluster that the nodes at `seed_urls` belong to
    /// (cargo feature `cluster`). Each check is decided by the primary of its
    /// client's slot: alone, or under load in a batch with other checks that
    /// primary serves (see [`max_batch`](Self::max_batch)); redis-rs follows
    /// `MOVED` and `ASK`, refreshes its slot map and reconnects nodes after a
    /// failover. The store's timeouts apply to every node.
    ///
    /// A refund goes on a second cluster connection, made without redis-rs's
    /// retries: they resend a call after a broken connection or a timeout,
    /// when Redis may have made the refund already. So the store holds two
    /// sockets per node.
    pub fn cluster<I, S>(mut self, seed_urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let seeds = seed_urls.into_iter().map(Into::into).collect();
        self.target = Some(Target::Topology(Box::new(Cluster::Seeds(seeds))));
        self
    }

    /// Takes one cluster connection from the application's own deadpool-redis
    /// cluster pool and keeps it (cargo feature `cluster`). The pool's own
    /// client settings (redis-rs's timeouts and retries among them) stay as the
    /// application made them; the store's timeout still bounds every check.
    ///
    /// A refund ([`RateLimiter::refund`](crate::RateLimiter::refund), a
    /// settlement that gives tokens back) is never sent on such a store: it
    /// fails at once, and its tokens stay spent. deadpool-redis builds its
    /// cluster client with redis-rs's default of 16 retries, which resend a
    /// call after a broken connection, when Redis may have made the refund
    /// already, and offers no way to turn them off. Checks and charges,
    /// which only limit more when sent again, go as usual. Use
    /// [`cluster`](Self::cluster) where refunds matter.
    pub fn cluster_pool(mut self, pool: deadpool_redis::cluster::Pool) -> Self {
        self.target = Some(Target::Topology(Box::new(Cluster::Pool(pool))));
        self
    }
}

/// A Redis Cluster: seed URLs, or the application's cluster pool.
enum Cluster {
    Seeds(Vec<String>),
    Pool(deadpool_redis::cluster::Pool),
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cluster::Seeds(seeds) => {
                let seeds: Vec<String> = seeds.iter().map(|u| redact(u)).collect();
                write!(f, "cluster {seeds:?}")
            }
            Cluster::Pool(_) => write!(f, "application cluster pool"),
        }
    }
}

impl Topology for Cluster {
    fn source(
        self: Box<Self>,
        settings: &Settings,
        certificates: Option<Certificates>,
    ) -> Result<(Source, Arc<str>), ConfigError> {
        match *self {
            Cluster::Seeds(seeds) => client(&seeds, settings, certificates),
            Cluster::Pool(pool) => Ok((
                Source::Cluster(ClusterSource::Pool(pool)),
                "the application's cluster pool".into(),
            )),
        }
    }

    fn is_pool(&self) -> bool {
        matches!(self, Cluster::Pool(_))
    }

    fn per_node(&self) -> Option<MakePerNode> {
        Some(per_node)
    }
}

/// The cluster client for `seeds`, checked now.
fn client(
    seeds: &[String],
    settings: &Settings,
    certificates: Option<Certificates>,
) -> Result<(Source, Arc<str>), ConfigError> {
    let infos = seeds
        .iter()
        .map(|url| {
            let info = parse(url)?;
            if info.redis_settings().db() != 0 {
                return Err(ConfigError::store(format!(
                    "Redis URL {}: Redis Cluster has only database 0",
                    redact(url)
                )));
            }
            Ok(info)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tls = infos.first().is_some_and(is_tls);
    let listed = || seeds.iter().map(|u| redact(u)).collect::<Vec<_>>();
    if infos.is_empty() {
        return Err(ConfigError::store(
            "a Redis Cluster store needs at least one seed URL",
        ));
    }
    if infos.iter().any(|i| is_tls(i) != tls) {
        return Err(ConfigError::store(format!(
            "Redis Cluster seeds {:?} mix rediss:// and redis://",
            listed()
        )));
    }
    let host = label(
        "cluster",
        infos.iter().map(|i| host_of(i.addr()).to_string()),
    );
    if tls {
        tls_provider();
    }
    if certificates.is_some() && !tls {
        return Err(ConfigError::store(
            "tls_root_certificates needs rediss:// seed URLs",
        ));
    }
    // Two clients: one for every call, which follows MOVED and ASK and
    // retries after a failover; one with no retries, for the calls that
    // give tokens back (see `Conn::for_call`): redis-rs resends a call
    // after a broken connection too, and Redis may have run it.
    let build = |retries: Option<u32>| {
        // A cluster connect waits for every seed, then asks one for the
        // slot map, all within the store's connect timeout: a seed that
        // accepts and never answers (a frozen or partitioned node) may take
        // half of it.
        let mut builder = redis::cluster::ClusterClientBuilder::new(infos.clone())
            .connection_timeout(settings.connect_timeout / 2)
            .response_timeout(response_timeout(settings.call_timeout))
            .tcp_settings(tcp_settings());
        if let Some(retries) = retries {
            builder = builder.retries(retries);
        }
        if let Some(certificates) = &certificates {
            builder = certificates.cluster(builder);
        }
        builder.build().map_err(|e| {
            ConfigError::store(format!(
                "Redis Cluster seeds {:?}: {}",
                listed(),
                redact(&e.to_string())
            ))
        })
    };
    let source = Source::Cluster(ClusterSource::Clients {
        routed: build(None)?,
        once: build(Some(0))?,
    });
    Ok((source, host))
}

#[cfg(feature = "tls")]
impl Certificates {
    fn cluster(
        &self,
        builder: redis::cluster::ClusterClientBuilder,
    ) -> redis::cluster::ClusterClientBuilder {
        builder.certs(self.0.clone())
    }
}

#[cfg(not(feature = "tls"))]
impl Certificates {
    fn cluster(
        &self,
        _: redis::cluster::ClusterClientBuilder,
    ) -> redis::cluster::ClusterClientBuilder {
        match *self {}
    }
}
