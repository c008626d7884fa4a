//! Where connections come from ([`Source`]): a URL's client, the
//! application's pool, a cluster, sentinels; and redis-rs's response timeout
//! for the connections the store does not make itself.

use std::time::Duration;

use deadpool_redis::Pool;
use redis::{AsyncConnectionConfig, Client, RedisError};

use super::super::cluster::ClusterSource;
use super::conn::Conn;

/// redis-rs's response timeout for a store whose calls time out after
/// `call_timeout`: four times as long, at least one second, so that it never
/// decides before the store does. Only for the connections the store does
/// not make itself (an application's pool, whose connections come with
/// redis-rs's 500 ms, and a cluster client): the ones it makes from a URL
/// or through Sentinel have none, as every call on them is bounded by the
/// store's own timeout, and a second timer per call would cost a timer
/// registration and, often, a wake-up of the runtime's driver.
pub(crate) fn response_timeout(call_timeout: Duration) -> Duration {
    (call_timeout * 4).max(Duration::from_secs(1))
}

/// Where connections come from.
#[allow(
    clippy::large_enum_variant,
    reason = "one per store, made once at start-up and never moved after"
)]
pub(crate) enum Source {
    /// A client for one server, from a URL.
    Client(Client),
    /// The application's deadpool-redis pool; one connection is taken and kept.
    Pool(Pool),
    /// A Redis Cluster (cargo feature `cluster`): the store's own clients,
    /// or the application's cluster pool, whose client resends calls on its
    /// own (see [`Link::resends`]). Without the feature, `ClusterSource`
    /// has no values and nothing makes this variant.
    #[allow(dead_code, reason = "made by cluster/ when the cluster feature is on")]
    Cluster(ClusterSource),
    /// Sentinels, asked for the primary on every connect.
    #[cfg(feature = "sentinel")]
    Sentinel(tokio::sync::Mutex<redis::sentinel::SentinelClient>),
}

impl Source {
    pub(super) async fn connect(&self, config: &AsyncConnectionConfig) -> Result<Conn, RedisError> {
        match self {
            Source::Client(client) => client
                .get_multiplexed_async_connection_with_config(config)
                .await
                .map(Conn::Multiplexed),
            Source::Pool(pool) => {
                let pooled = pool.get().await.map_err(|e| match e {
                    deadpool_redis::PoolError::Backend(e) => e,
                    other => RedisError::from(std::io::Error::other(other.to_string())),
                })?;
                Ok(Conn::Multiplexed(deadpool_redis::Connection::take(pooled)))
            }
            Source::Cluster(cluster) => cluster.connect().await.map(Conn::Cluster),
            #[cfg(feature = "sentinel")]
            Source::Sentinel(client) => client
                .lock()
                .await
                .get_async_connection_with_config(config)
                .await
                .map(Conn::Multiplexed),
        }
    }
}
