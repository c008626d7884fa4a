//! Buckets in Redis, shared by every instance of the application.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{ErrorKind, RedisError, Script, ServerErrorKind, Value};
use deadpool_redis::{Config, Pool, Runtime};

use super::contract::{Store, validate};
use super::key::safe_key;
use super::sealed::Sealed;
use crate::decision::{Decision, QuotaState};
use crate::{ConfigError, Error, Policy, Quota};

/// The token bucket script, sent with `EVALSHA` (and loaded on `NOSCRIPT`).
pub(crate) const SCRIPT: &str = include_str!("../../lua/token_bucket.lua");

/// Default key prefix of [`RedisStore`].
pub const DEFAULT_PREFIX: &str = "tollgate:";

/// Default per-call timeout of [`RedisStore`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// Token buckets in Redis, decided by one Lua script per check.
///
/// - **One round trip per decision.** deadpool-redis checks every connection it
///   hands out with a `PING`, which would double the cost of each check. The store
///   therefore takes one multiplexed connection and keeps it: every check sends
///   one `EVALSHA` on a clone of it, and concurrent checks pipeline on its
///   socket. It is replaced only when it breaks.
/// - **Clock:** Redis `TIME`, never the application's.
/// - **Keys:** `{prefix}{{client}}:{quota}`, e.g. `tollgate:{user:42}:10/1s:10`;
///   the client part is made safe by [`safe_key`] and is the cluster hash tag,
///   so all quotas of one client share a slot. Each key expires when its bucket
///   would be full again (plus one second).
/// - **Failures:** each call is bounded by a timeout (default
///   [`DEFAULT_TIMEOUT`]). A connection error is retried once on a fresh
///   connection within that time; if the first attempt did reach Redis, the retry
///   can spend the cost twice, which errs on the side of limiting, never of
///   admitting more. A connection that times out is replaced on the next
///   check, so a silently dead (half-open) connection costs one timeout, not
///   all later checks. `NOSCRIPT` (after a restart, failover or `SCRIPT FLUSH`)
///   reloads the script transparently.
///
/// Build it with [`RedisStore::from_url`], [`RedisStore::from_pool`] or, to
/// change the defaults, [`RedisStore::builder`]. Clones share the connection.
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
    pool: Pool,
    held: Mutex<Option<Held>>,
    connecting: tokio::sync::Mutex<()>,
    prefix: String,
    timeout: Duration,
    script: Script,
}

#[derive(Clone)]
struct Held {
    id: u64,
    conn: MultiplexedConnection,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .field("pool", &self.inner.pool.status())
            .finish()
    }
}

/// Where a [`RedisStoreBuilder`] gets its connections.
enum Source {
    Url(String),
    Pool(Pool),
}

/// Configures a [`RedisStore`]; made by [`RedisStore::builder`].
///
/// Setters take the builder by value and never fail; [`build`](Self::build)
/// checks everything at once and reports the first mistake.
#[must_use]
pub struct RedisStoreBuilder {
    source: Option<Source>,
    prefix: String,
    timeout: Duration,
}

impl std::fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match &self.source {
            None => "none".to_owned(),
            Some(Source::Url(url)) => redact(url),
            Some(Source::Pool(_)) => "application pool".to_owned(),
        };
        f.debug_struct("RedisStoreBuilder")
            .field("source", &source)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RedisStoreBuilder {
    /// Connects to the Redis at `url` (`redis://[user:password@]host:port/db`).
    /// Nothing is connected until the first check.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.source = Some(Source::Url(url.into()));
        self
    }

    /// Takes connections from the application's own deadpool-redis pool (one,
    /// kept: see [`RedisStore`]).
    pub fn pool(mut self, pool: Pool) -> Self {
        self.source = Some(Source::Pool(pool));
        self
    }

    /// The key prefix ([`DEFAULT_PREFIX`] otherwise). It must be at most 64
    /// bytes of `[A-Za-z0-9._:/-]`, so it can neither hide a `{hash tag}` nor
    /// bloat every key.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The per-call timeout ([`DEFAULT_TIMEOUT`] otherwise): a check that takes
    /// longer fails with [`Error::Timeout`]. Must be between 1 ms and 60 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The store, or the first configuration mistake.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when no URL or pool was given, the URL cannot be
    /// parsed (the message shows it without its password), or the prefix or the
    /// timeout is out of range.
    pub fn build(self) -> Result<RedisStore, ConfigError> {
        let ok = self.prefix.len() <= 64
            && self
                .prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b));
        if !ok {
            return Err(ConfigError::store(format!(
                "key prefix {:?} must be at most 64 bytes of [A-Za-z0-9._:/-]",
                self.prefix
            )));
        }
        if self.timeout < Duration::from_millis(1) || self.timeout > Duration::from_secs(60) {
            return Err(ConfigError::store(format!(
                "store timeout {:?} must be between 1ms and 60s",
                self.timeout
            )));
        }
        let pool = match self.source {
            None => {
                return Err(ConfigError::store(
                    "RedisStore needs a URL or a pool: call .url(..) or .pool(..)",
                ));
            }
            Some(Source::Pool(pool)) => pool,
            Some(Source::Url(url)) => Config::from_url(url.as_str())
                .create_pool(Some(Runtime::Tokio1))
                .map_err(|e| {
                    ConfigError::store(format!(
                        "Redis URL {}: {}",
                        redact(&url),
                        redact(&e.to_string())
                    ))
                })?,
        };
        Ok(RedisStore {
            inner: Arc::new(Inner {
                pool,
                held: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                prefix: self.prefix,
                timeout: self.timeout,
                script: Script::new(SCRIPT),
            }),
        })
    }
}

/// `url` with any password replaced by `***`, for messages: a URL is
/// configuration, and its userinfo may hold a secret.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The last '@' ends the userinfo, even when an unencoded password holds
    // '@' or '/' (Redis URLs have no '@' after the host).
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => String::from("***"),
            };
            format!("{scheme}://{user}@{host}")
        }
        None => url.to_owned(),
    }
}

impl RedisStore {
    /// A store for the Redis at `url` (`redis://host:port/db`) with the default
    /// prefix and timeout. Nothing is connected until the first check.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when the URL cannot be parsed; the message shows the
    /// URL without its password.
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        Self::builder().url(url).build()
    }

    /// A store over the application's own deadpool-redis pool, with the default
    /// prefix ([`DEFAULT_PREFIX`]) and timeout ([`DEFAULT_TIMEOUT`]).
    pub fn from_pool(pool: Pool) -> Self {
        RedisStore {
            inner: Arc::new(Inner {
                pool,
                held: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                prefix: DEFAULT_PREFIX.to_owned(),
                timeout: DEFAULT_TIMEOUT,
                script: Script::new(SCRIPT),
            }),
        }
    }

    /// A builder to set the prefix, the timeout and where connections come from.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder {
            source: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
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

    /// The storage key of `key`'s bucket for `quota`.
    pub fn bucket_key(&self, key: &str, quota: &Quota) -> String {
        format!("{}{{{}}}:{}", self.inner.prefix, safe_key(key), quota.id())
    }

    /// `check` with an explicit microsecond clock instead of Redis `TIME`, for
    /// tests that control time. Production code never sends a clock.
    #[doc(hidden)]
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
        now_us: Option<u64>,
    ) -> Result<Decision, Error> {
        validate(policy, cost)?;
        let quotas = policy.quotas();
        let mut call = self.inner.script.prepare_invoke();
        for q in quotas {
            call.key(self.bucket_key(key, q));
        }
        call.arg(cost);
        match now_us {
            Some(now) => call.arg(now),
            None => call.arg(""),
        };
        for q in quotas {
            call.arg(q.capacity()).arg(q.num()).arg(q.den());
        }
        let call = &call;
        let reply: Vec<i64> = self
            .bounded(|mut conn| async move { call.invoke_async(&mut conn).await })
            .await?;
        parse_reply(quotas, &reply)
    }

    /// Runs `op` on the held connection within the timeout, replacing the
    /// connection and retrying once if it is broken. A connection that lets the
    /// time run out is dropped too: it may be dead without knowing it (half-open
    /// after a network change or failover), and would otherwise make every later
    /// check time out as well.
    async fn bounded<T, F, Fut>(&self, op: F) -> Result<T, Error>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let mut in_use = None;
        let attempt = async {
            let held = self.connection().await?;
            in_use = Some(held.id);
            match op(held.conn).await {
                Err(e) if is_connection_error(&e) => {
                    self.forget(held.id);
                    let fresh = self.connection().await?;
                    in_use = Some(fresh.id);
                    op(fresh.conn).await.map_err(|e| {
                        if is_connection_error(&e) {
                            self.forget(fresh.id);
                        }
                        Error::store(e)
                    })
                }
                other => other.map_err(Error::store),
            }
        };
        let outcome = tokio::time::timeout(self.inner.timeout, attempt).await;
        outcome.unwrap_or_else(|_| {
            if let Some(id) = in_use {
                self.forget(id);
            }
            Err(Error::Timeout(self.inner.timeout))
        })
    }

    async fn connection(&self) -> Result<Held, Error> {
        if let Some(held) = self.slot().clone() {
            return Ok(held);
        }
        // One reconnect at a time: after a restart, thousands of checks in flight
        // would otherwise each open a connection against a recovering server.
        let _connecting = self.inner.connecting.lock().await;
        if let Some(held) = self.slot().clone() {
            return Ok(held);
        }
        let pooled = self.inner.pool.get().await.map_err(Error::store)?;
        let held = Held {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            conn: deadpool_redis::Connection::take(pooled),
        };
        *self.slot() = Some(held.clone());
        Ok(held)
    }

    /// Drops the held connection if it is still the broken one.
    fn forget(&self, id: u64) {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|h| h.id == id) {
            *slot = None;
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Held>> {
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Sealed for RedisStore {}

impl Store for RedisStore {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, Error> {
        self.decide(key, policy, cost, None).await
    }

    async fn reset(&self, key: &str, policy: &Policy) -> Result<(), Error> {
        let quotas = policy.quotas();
        let mut del = deadpool_redis::redis::cmd("DEL");
        for q in quotas {
            del.arg(self.bucket_key(key, q));
        }
        let del = &del;
        self.bounded(|mut conn| async move { del.query_async::<Value>(&mut conn).await })
            .await
            .map(drop)
    }
}

/// Errors that mean this connection will not work again: broken sockets, and a
/// server that is no longer the primary (`READONLY`, `MASTERDOWN`) after a
/// failover behind a stable address. The retry is safe for the latter: the
/// script's first write failed, so it wrote nothing.
fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
}

fn parse_reply(quotas: &[Quota], reply: &[i64]) -> Result<Decision, Error> {
    let malformed =
        || Error::Store(format!("unexpected reply from the rate limit script: {reply:?}").into());
    let (allowed, rest) = reply.split_first().ok_or_else(malformed)?;
    if rest.len() != quotas.len() * 3 {
        return Err(malformed());
    }
    let states = quotas
        .iter()
        .zip(rest.chunks_exact(3))
        .map(|(q, c)| match *c {
            [remaining, retry, reset] => {
                let n = |v: i64| u64::try_from(v).map_err(|_| malformed());
                Ok(QuotaState::new(*q, n(remaining)?, n(retry)?, n(reset)?))
            }
            _ => Err(malformed()),
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(Decision::new(*allowed == 1, states))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_appear_in_messages() {
        assert_eq!(
            redact("redis://:s3cret@cache.internal:6379/0"),
            "redis://:***@cache.internal:6379/0"
        );
        assert_eq!(
            redact("rediss://app:s3cret@cache.internal:6380"),
            "rediss://app:***@cache.internal:6380"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("not a url"), "not a url");
        // A password holding '@' or '/' is still hidden.
        let url = "redis://app:p@ss/w0rd@cache:6379/1";
        assert!(!redact(url).contains("w0rd"), "{}", redact(url));
        for bad in [
            "redis://:s3cret@",
            "redis://:s3cret@host:notaport",
            "redis://u:s3cret@[::1",
        ] {
            if let Err(e) = RedisStore::from_url(bad) {
                assert!(!e.to_string().contains("s3cret"), "{e}");
            }
            let debug = format!("{:?}", RedisStore::builder().url(bad));
            assert!(!debug.contains("s3cret"), "{debug}");
        }
    }

    #[test]
    fn builder_mistakes_surface_at_build() {
        let url = || RedisStore::builder().url("redis://127.0.0.1:6379");
        assert!(url().build().is_ok());
        assert!(RedisStore::builder().build().is_err());
        assert!(url().prefix("has{brace}").build().is_err());
        assert!(url().prefix("x".repeat(65)).build().is_err());
        assert!(url().timeout(Duration::ZERO).build().is_err());
        assert!(url().timeout(Duration::from_secs(61)).build().is_err());
        let store = url().prefix("app:rl:").build().unwrap();
        assert_eq!(store.prefix(), "app:rl:");
        assert_eq!(store.timeout(), DEFAULT_TIMEOUT);
    }
}
