//! [`RedisStore`]: token buckets in Redis, behind a circuit breaker.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::{RedisError, Value};
use tokio::time::Instant;

use super::connection::{Conn, Link};
use super::failure::{classify, is_connection_error};
use super::script::{Call, Script, decision};
use crate::error::Error;
use crate::observe::{self, LogThrottle};
use crate::store::breaker::{Admit, Breaker};
use crate::store::contract::{Store, validate};
use crate::store::key::safe_key;
use crate::store::sealed::Sealed;
use crate::{Decision, Policy, Quota};

/// The `store` label of this store's metrics.
const STORE: &str = "redis";

/// Token buckets in Redis, decided by one Lua script per check.
///
/// - **One round trip per decision**, on one held multiplexed connection that
///   concurrent checks pipeline on (no pool checkout, no `PING` per check).
/// - **Clock:** Redis `TIME`, never the application's.
/// - **Keys:** `{prefix}{{client}}:{quota}`, e.g. `tollgate:{user:42}:10/1s:10`;
///   the client part is made safe by [`safe_key`] and is the cluster hash tag,
///   so all quotas of one client share a slot. Each key expires when its bucket
///   would be full again (plus one second).
/// - **Bounded waits:** each call is bounded by the store timeout (default
///   100 ms); connecting happens outside the calls, with its own timeout and
///   backoff. A connection error is retried once on a fresh connection within
///   the same timeout (if the first attempt did reach Redis, the cost may be
///   spent twice, which errs on the side of limiting). `NOSCRIPT` (after a
///   restart, failover or `SCRIPT FLUSH`) is answered with `EVAL`.
/// - **Circuit breaker:** after repeated failures checks fail at once with
///   [`Error::CircuitOpen`] until a probe succeeds (see
///   [`CircuitBreaker`](crate::store::CircuitBreaker)), so a hung Redis costs
///   one timeout per probe, not one per request.
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
    inner: Arc<Inner>,
}

struct Inner {
    link: Link,
    breaker: Arc<Breaker>,
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    script: Script,
    #[cfg(feature = "test-util")]
    test_script: Script,
    errors: LogThrottle,
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
}

impl RedisStore {
    pub(crate) fn assemble(parts: Parts) -> Self {
        RedisStore {
            inner: Arc::new(Inner {
                link: parts.link,
                breaker: Arc::new(parts.breaker),
                prefix: parts.prefix,
                timeout: parts.timeout,
                connect_timeout: parts.connect_timeout,
                script: Script::production(),
                #[cfg(feature = "test-util")]
                test_script: Script::with_test_clock(),
                errors: LogThrottle::default(),
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

    /// The storage key of `key`'s bucket for `quota`.
    pub fn bucket_key(&self, key: &str, quota: &Quota) -> String {
        format!("{}{{{}}}:{}", self.inner.prefix, safe_key(key), quota.id())
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
            let held = link.get().await?;
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

    /// `check` with an explicit microsecond clock instead of Redis `TIME`, for
    /// tests that control time (cargo feature `test-util`). It runs a variant of
    /// the script that production calls never run.
    #[cfg(feature = "test-util")]
    pub async fn check_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        now_us: u64,
    ) -> Result<Decision, Error> {
        self.decide(key, policy, cost, Some(now_us)).await
    }

    async fn decide(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        clock: Option<u64>,
    ) -> Result<Decision, Error> {
        validate(policy, cost)?;
        let keys = policy
            .quotas()
            .iter()
            .map(|q| self.bucket_key(key, q))
            .collect();
        let call = Call::check(keys, policy, cost, clock);
        let script = self.script_for(clock);
        let call = &call;
        let reply = self
            .guarded(|mut conn| async move { call.run(&mut conn, script).await })
            .await?;
        decision(policy.quotas(), &reply)
    }

    #[cfg(feature = "test-util")]
    fn script_for(&self, clock: Option<u64>) -> &Script {
        match clock {
            Some(_) => &self.inner.test_script,
            None => &self.inner.script,
        }
    }

    #[cfg(not(feature = "test-util"))]
    fn script_for(&self, _clock: Option<u64>) -> &Script {
        &self.inner.script
    }

    /// Runs `op` behind the circuit breaker, and reports how it went.
    async fn guarded<T, F, Fut>(&self, op: F) -> Result<T, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let admit = self.inner.breaker.admit();
        if let Admit::Reject(retry_in) = admit {
            let err = Error::CircuitOpen { retry_in };
            observe::store_error(STORE, &err, &self.inner.errors);
            return Err(err);
        }
        let started = Instant::now();
        let result = self.bounded(op).await;
        let failure = result.as_ref().err();
        observe::store_call(STORE, started.elapsed(), failure.map(Error::kind));
        match (admit, failure) {
            (Admit::Probe(probe), failure) => probe.done(failure.is_none()),
            (_, None) => self.inner.breaker.success(),
            (_, Some(_)) => self.inner.breaker.failure(),
        }
        if let Some(err) = failure {
            observe::store_error(STORE, err, &self.inner.errors);
        }
        result
    }

    /// Runs `op` on the held connection within the timeout, replacing the
    /// connection and retrying once if it is broken.
    async fn bounded<T, F, Fut>(&self, op: F) -> Result<T, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let link = &self.inner.link;
        let mut in_use = None;
        let attempt = async {
            let held = link.get().await?;
            in_use = Some(held.clone());
            match op(held.conn.clone()).await {
                Ok(value) => {
                    link.success(&held);
                    Ok(value)
                }
                Err(e) if is_connection_error(&e) => {
                    link.forget(held.id);
                    let fresh = link.get().await?;
                    in_use = Some(fresh.clone());
                    match op(fresh.conn.clone()).await {
                        Ok(value) => {
                            link.success(&fresh);
                            Ok(value)
                        }
                        Err(e) => {
                            if is_connection_error(&e) {
                                link.forget(fresh.id);
                            }
                            Err(classify(e, link.host()))
                        }
                    }
                }
                Err(e) => Err(classify(e, link.host())),
            }
        };
        let outcome = tokio::time::timeout(self.inner.timeout, attempt).await;
        outcome.unwrap_or_else(|_| {
            if let Some(held) = &in_use {
                link.timed_out(held);
            }
            Err(Error::Timeout(self.inner.timeout))
        })
    }
}

impl Sealed for RedisStore {}

impl Store for RedisStore {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, Error> {
        self.decide(key, policy, cost, None).await
    }

    async fn reset(&self, key: &str, policy: &Policy) -> Result<(), Error> {
        let mut del = redis::cmd("DEL");
        for q in policy.quotas() {
            del.arg(self.bucket_key(key, q));
        }
        let del = &del;
        self.guarded(|mut conn| async move { del.query_async::<Value>(&mut conn).await })
            .await
            .map(drop)
    }
}
