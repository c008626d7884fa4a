//! Buckets in Redis, shared by every instance of the application.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{ErrorKind, RedisError, Script, ServerErrorKind, Value};
use deadpool_redis::{Config, Pool, Runtime};

use super::{Store, safe_key, validate};
use crate::decision::{Decision, QuotaState};
use crate::{Error, Quota};

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
///   therefore takes one multiplexed connection out of the pool and keeps it: every
///   check sends one `EVALSHA` on a clone of it, and concurrent checks pipeline on
///   its socket. It goes back to the pool only to replace a broken connection.
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
/// Clones share the connection.
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate::{Quota, RateLimiter, RedisStore};
///
/// # async fn run() -> Result<(), tollgate::Error> {
/// let store = RedisStore::from_url("redis://127.0.0.1:6379")?
///     .with_prefix("myapp:rl:")?
///     .with_timeout(Duration::from_millis(50))?;
/// let limiter = RateLimiter::new(store, Quota::per_second(10)?);
/// let decision = limiter.check("user:42", 1).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
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

impl RedisStore {
    /// A store over the application's own pool, with the default prefix
    /// ([`DEFAULT_PREFIX`]) and timeout ([`DEFAULT_TIMEOUT`]).
    pub fn new(pool: Pool) -> Self {
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

    /// A store with its own pool for the Redis at `url` (`redis://host:port/db`).
    /// Nothing is connected until the first check.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let pool = Config::from_url(url)
            .create_pool(Some(Runtime::Tokio1))
            .map_err(|e| Error::InvalidConfig(format!("Redis URL {url:?}: {e}")))?;
        Ok(Self::new(pool))
    }

    /// Sets the key prefix. It must be at most 64 bytes of `[A-Za-z0-9._:/-]`, so
    /// it can neither hide a `{hash tag}` nor bloat every key.
    pub fn with_prefix(self, prefix: impl Into<String>) -> Result<Self, Error> {
        let prefix = prefix.into();
        let ok = prefix.len() <= 64
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b));
        if !ok {
            return Err(Error::InvalidConfig(format!(
                "key prefix {prefix:?} must be at most 64 bytes of [A-Za-z0-9._:/-]"
            )));
        }
        Ok(self.rebuild(|inner| inner.prefix = prefix))
    }

    /// Sets the per-call timeout: a check that takes longer fails with
    /// [`Error::Timeout`]. Must be between 1 ms and 60 s.
    pub fn with_timeout(self, timeout: Duration) -> Result<Self, Error> {
        if timeout < Duration::from_millis(1) || timeout > Duration::from_secs(60) {
            return Err(Error::InvalidConfig(format!(
                "store timeout {timeout:?} must be between 1ms and 60s"
            )));
        }
        Ok(self.rebuild(|inner| inner.timeout = timeout))
    }

    fn rebuild(self, change: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = Inner {
            pool: self.inner.pool.clone(),
            held: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            prefix: self.inner.prefix.clone(),
            timeout: self.inner.timeout,
            script: Script::new(SCRIPT),
        };
        change(&mut inner);
        RedisStore {
            inner: Arc::new(inner),
        }
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
        quotas: &[Quota],
        cost: u64,
        now_us: u64,
    ) -> Result<Decision, Error> {
        self.decide(key, quotas, cost, Some(now_us)).await
    }

    async fn decide(
        &self,
        key: &str,
        quotas: &[Quota],
        cost: u64,
        now_us: Option<u64>,
    ) -> Result<Decision, Error> {
        validate(quotas, cost)?;
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

impl Store for RedisStore {
    async fn check(&self, key: &str, quotas: &[Quota], cost: u64) -> Result<Decision, Error> {
        self.decide(key, quotas, cost, None).await
    }

    async fn reset(&self, key: &str, quotas: &[Quota]) -> Result<(), Error> {
        if quotas.is_empty() {
            return Ok(());
        }
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
