//! [`RedisStore`]: token buckets in Redis, behind a circuit breaker: what it
//! is made of, its settings, `ping`, and the [`Store`] trait's face (check,
//! reserve, reset), which the files beside it carry out (`keys.rs`,
//! `decide.rs`, `reset.rs`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;
#[cfg(feature = "test-util")]
use std::{future::Future, pin::Pin};

use redis::Value;
use tokio::time::Instant;

use super::batch::{Batcher, Queued};
use super::connection::Link;
use super::encode::SlotOf;
use super::epoch::ServerEpoch;
use super::failure::{classify, is_connection_error};
use super::lease::{LeaseConfig, Leases};
use super::script::Script;
use super::watch;
use crate::decision::Decision;
use crate::decision::Reservation;
use crate::error::Error;
use crate::observe::LogThrottle;
use crate::policy::Policy;
use crate::quota::micros;
use crate::store::breaker::{Breaker, CircuitBreaker};
use crate::store::contract::Store;
use crate::store::deny_cache::DenyCache;
use crate::store::sealed::Sealed;

/// The `store` label of this store's metrics.
pub(super) const STORE: &str = "redis";

/// Token buckets in Redis, decided by one Lua script per check.
///
/// - **One round trip per decision**, on one held multiplexed connection that
///   concurrent checks pipeline on (no pool checkout, no `PING` per check).
/// - **Clock:** Redis `TIME`, never the application's.
/// - **Keys:** `{prefix}{{client}}:{period}`, e.g. `tollgate:{user:42}:1s`;
///   the client part is made safe by [`safe_key`](crate::store::safe_key)
///   and is the cluster hash tag, so all quotas of one client share a slot.
///   Each key expires when its bucket would be full again (plus 1 ms).
/// - **Bounded waits:** each call is bounded by the store timeout (default
///   100 ms); connecting happens outside the calls, with its own timeout and
///   backoff. A connection error is retried once on a fresh connection within
///   the same timeout (if the first attempt did reach Redis, the cost may be
///   spent twice, which errs on the side of limiting). `NOSCRIPT` (after a
///   restart, failover or `SCRIPT FLUSH`) is answered with `EVAL`.
/// - **Circuit breaker:** after repeated failures checks fail at once with
///   [`Error::CircuitOpen`] until a probe succeeds (see
///   [`CircuitBreaker`](crate::store::CircuitBreaker)). The probe's call runs
///   in the background, and the check that took it waits for it at most
///   10 ms, so a hung Redis holds no request for the timeout once the breaker
///   is open.
/// - **Visible:** with the `tracing` and `metrics` features, every failure,
///   breaker transition and call latency is reported (see the
///   [observability docs](crate#observability)).
///
/// Build it with [`RedisStore::from_url`], [`RedisStore::from_pool`] or, to
/// change the defaults, [`RedisStore::builder`] (which also connects to a Redis
/// Cluster, to the primary that Sentinels name, and over TLS, with the cargo
/// features `cluster`, `sentinel` and `tls`); check it at start-up with
/// [`ping`](Self::ping). Clones share the connection and the breaker.
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate::{Quota, RateLimiter, RedisStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::builder()
///     .url("redis://127.0.0.1:6379")
///     .prefix("myapp:rl:")
///     .timeout(Duration::from_millis(50))
///     .build()?;
/// store.ping().await?; // fail at start-up, naming the server
/// let limiter = RateLimiter::new(store, Quota::per_second(10)?);
/// let decision = limiter.check("user:42", 1).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct RedisStore {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) link: Link,
    pub(super) breaker: Arc<Breaker>,
    pub(super) prefix: String,
    pub(super) timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) script: Script,
    #[cfg(feature = "test-util")]
    pub(super) test_script: Script,
    pub(super) errors: LogThrottle,
    /// `None` when the store sends every check on its own (or, on a
    /// cluster, batches per node).
    pub(super) batcher: Option<Arc<Batcher>>,
    /// On a cluster: the slot map and a queue per primary (`cluster/`);
    /// `None` elsewhere or when batching is off.
    pub(super) nodes: Option<Box<dyn PerNode>>,
    /// `None` when every check asks Redis.
    pub(super) denials: Option<DenyCache>,
    /// `None` when leases are off.
    pub(super) leases: Option<Leases>,
    /// The server's epoch; `None` on a cluster.
    pub(super) epoch: Option<Arc<ServerEpoch>>,
}

impl Drop for Inner {
    /// Reports every hold still here (in the background, if a runtime
    /// runs): its unspent tokens go back to the bucket instead of waiting
    /// for the hold's expiry. One call per hold, so a cluster routes each.
    fn drop(&mut self) {
        let Some(leases) = &self.leases else { return };
        let reports = leases.drain();
        if reports.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let link = self.link.clone();
        let script = self.script.clone();
        let limit = self.timeout * 2;
        runtime.spawn(async move {
            let send = async {
                for report in &reports {
                    let (keys, policy, spend) = report.spend();
                    let mut batch = super::encode::Batch::new(None);
                    batch.push(keys, policy, &spend);
                    if let Ok(held) = link.get(false).await {
                        let mut conn = held.conn.clone();
                        let _ = batch.run(&mut conn, &script).await;
                    }
                }
            };
            let _ = tokio::time::timeout(limit, send).await;
        });
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("host", self.inner.link.host())
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .field("breaker_closed", &self.inner.breaker.is_closed())
            .finish()
    }
}

/// What a [`RedisStore`] is made of; the builder assembles it.
pub(crate) struct Parts {
    pub(crate) link: Link,
    pub(crate) breaker: Breaker,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// The most checks in one script call; 1 turns batching off.
    pub(crate) max_batch: usize,
    /// A cluster: batches are made per node (`cluster/`), in queues this
    /// makes.
    pub(crate) per_node: Option<MakePerNode>,
    /// Denials kept in process; 0 turns the deny cache off.
    pub(crate) deny_cache: usize,
    /// `None`: leases off.
    pub(crate) leases: Option<LeaseConfig>,
}

impl RedisStore {
    pub(crate) fn assemble(parts: Parts) -> Self {
        let node_breaker = parts.breaker.config();
        // One server (not a cluster): its epoch is tracked, and the first
        // calls on every new connection check the server's identity (see
        // `epoch.rs`).
        let epoch = parts
            .per_node
            .is_none()
            .then(|| Arc::new(ServerEpoch::new(&parts.prefix)));
        let lease_prefix: Arc<str> = Arc::from(parts.prefix.as_str());
        let script = match &epoch {
            Some(epoch) => Script::production().with_epoch(Arc::clone(epoch)),
            None => Script::production(),
        };
        if let Some(epoch) = &epoch {
            // A store that can keep a watch on its server does, once told
            // holds were granted there, and spends holds only while it is
            // up (see `watch.rs`).
            if watch::can_watch(parts.link.source()) {
                epoch.keep_watch();
            }
            parts.link.tell(Arc::clone(epoch));
        }
        RedisStore {
            inner: Arc::new(Inner {
                link: parts.link,
                breaker: Arc::new(parts.breaker),
                prefix: parts.prefix,
                timeout: parts.timeout,
                connect_timeout: parts.connect_timeout,
                script,
                #[cfg(feature = "test-util")]
                test_script: Script::with_test_clock(),
                errors: LogThrottle::default(),
                batcher: (parts.max_batch > 1 && parts.per_node.is_none())
                    .then(|| Arc::new(Batcher::new(parts.max_batch))),
                nodes: parts
                    .per_node
                    .filter(|_| parts.max_batch > 1)
                    .map(|make| make(parts.max_batch, node_breaker)),
                denials: (parts.deny_cache > 0).then(|| DenyCache::new(parts.deny_cache)),
                leases: parts
                    .leases
                    .map(|config| Leases::new(config, STORE, epoch.clone(), lease_prefix)),
                epoch,
            }),
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The server this store talks to, as `host:port` (for a cluster or
    /// sentinels, the first few of their addresses); never a password.
    pub fn host(&self) -> &str {
        self.inner.link.host()
    }

    /// Connects (if needed) and sends a `PING`, for a start-up check: returns
    /// the round trip time, or an error that names the server (never its
    /// password). Waits up to the connect timeout plus the call timeout, and
    /// ignores the circuit breaker.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = tollgate::RedisStore::from_url("redis://cache.internal:6379")?;
    /// if let Err(e) = store.ping().await {
    ///     // "rate limit store failed: Redis at cache.internal:6379: Connection refused ..."
    ///     eprintln!("{e}");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn ping(&self) -> Result<Duration, Error> {
        let started = Instant::now();
        let limit = self.inner.connect_timeout + self.inner.timeout;
        let link = &self.inner.link;
        let attempt = async {
            let held = link.get(true).await?;
            let mut conn = held.conn.clone();
            match redis::cmd("PING").query_async::<Value>(&mut conn).await {
                Ok(_) => {
                    link.success(&held);
                    Ok(started.elapsed())
                }
                Err(e) => {
                    if is_connection_error(&e) {
                        link.forget(held.id);
                    }
                    Err(classify(e, link.host()))
                }
            }
        };
        tokio::time::timeout(limit, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(Error::store(
                    crate::ErrorKind::Timeout,
                    format!(
                        "Redis at {}: no answer to PING within {limit:?}",
                        link.host()
                    ),
                ))
            })
    }
}

/// What a store on a Redis Cluster adds (`cluster/`, cargo feature
/// `cluster`): a queue of checks per primary, by the slot map it reads, and
/// the spread script for a batch over several slots of one node.
pub(crate) trait PerNode: Send + Sync {
    /// The queue of the primary that serves `key`'s slot by the last map;
    /// `None` without a map or when the map has no primary for the slot.
    fn queue_for(&self, key: &str) -> Option<Arc<Batcher>>;

    /// Reads the slot map again in the background, at most one read at a
    /// time, spaced.
    fn refresh(&self, store: &RedisStore);

    /// Takes out of `checks` those of other clients in the first one's slot:
    /// they go apart, one call each.
    fn apart(&self, checks: &mut Vec<Queued>) -> Vec<Queued>;

    /// The script for a batch over several slots of one node, and how its
    /// batches find a key's slot.
    fn spread(&self) -> (&Script, SlotOf);

    /// `check_batch_at` on the cluster: one call per node of the slot map.
    #[cfg(feature = "test-util")]
    fn check_batch_at<'a>(
        &'a self,
        store: &'a RedisStore,
        checks: &'a [(&'a str, &'a Policy, u64)],
        now_us: u64,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Decision>, Error>> + Send + 'a>>;
}

/// Makes the [`PerNode`] queues of a store whose batches hold at most the
/// given number of checks.
pub(crate) type MakePerNode = fn(usize, CircuitBreaker) -> Box<dyn PerNode>;

impl Sealed for RedisStore {}

impl Store for RedisStore {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, Error> {
        self.decide(key, policy, cost, None).await
    }

    async fn reserve(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Reservation, Error> {
        let (decision, wait) = self
            .reserve_inner(key, policy, cost, micros(max_wait), None)
            .await?;
        Ok(Reservation::new(decision, wait))
    }

    async fn reset(&self, key: &str, policy: &Policy) -> Result<(), Error> {
        self.reset_buckets(key, policy).await
    }
}
