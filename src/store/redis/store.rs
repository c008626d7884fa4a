//! [`RedisStore`]: token buckets in Redis, behind a circuit breaker.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::{RedisError, Value};
use tokio::time::Instant;

use super::batch::{Batcher, Pending, answer, batch_of};
use super::connection::{Conn, Link};
use super::failure::{classify, is_connection_error};
use super::script::{Batch, Script};
use crate::decision::Reservation;
use crate::error::Error;
use crate::observe::{self, LogThrottle};
use crate::quota::micros;
use crate::store::breaker::{Admit, Breaker};
use crate::store::contract::{Store, validate};
use crate::store::deny_cache::DenyCache;
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
    /// `None` when the store sends every check on its own.
    batcher: Option<Batcher>,
    /// `None` when every check asks Redis.
    denials: Option<DenyCache>,
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
    /// Denials kept in process; 0 turns the deny cache off.
    pub(crate) deny_cache: usize,
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
                batcher: (parts.max_batch > 1).then(|| Batcher::new(parts.max_batch)),
                denials: (parts.deny_cache > 0).then(|| DenyCache::new(parts.deny_cache)),
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
        storage_key(
            &self.inner.prefix,
            &safe_key(key),
            &format!("}}:{}", quota.id()),
        )
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
        self.reserve_inner(key, policy, cost, 0, clock)
            .await
            .map(|(decision, _)| decision)
    }

    /// A decision that may take on debt for `max_wait_us` (0: a plain check),
    /// and the wait until its tokens are due.
    async fn reserve_inner(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        max_wait_us: u64,
        clock: Option<u64>,
    ) -> Result<(Decision, u64), Error> {
        validate(policy, cost)?;
        let keys = self.keys_of(key, policy);
        let cacheable = clock.is_none() && max_wait_us == 0 && cost > 0;
        if cacheable && let Some(decision) = self.cached_denial(&keys, cost) {
            return Ok((decision, 0));
        }
        self.send(keys, policy, cost, max_wait_us, clock).await
    }

    /// The storage keys of `key`'s buckets, one per quota of `policy`.
    fn keys_of(&self, key: &str, policy: &Policy) -> Vec<String> {
        let key = safe_key(key);
        policy
            .key_tails()
            .iter()
            .map(|tail| storage_key(&self.inner.prefix, &key, tail))
            .collect()
    }

    /// A denial of `cost` the deny cache still holds for `keys`.
    fn cached_denial(&self, keys: &[String], cost: u64) -> Option<Decision> {
        let decision = self.inner.denials.as_ref()?.lookup(keys, cost)?;
        observe::deny_cache_hit(STORE);
        Some(decision)
    }

    /// A plain check as far as it goes without waiting: the deny cache's
    /// answer, or the storage keys to send with [`check_keys`](Self::check_keys).
    pub(crate) fn check_now(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<Result<Decision, Vec<String>>, Error> {
        validate(policy, cost)?;
        let keys = self.keys_of(key, policy);
        if cost > 0
            && let Some(decision) = self.cached_denial(&keys, cost)
        {
            return Ok(Ok(decision));
        }
        Ok(Err(keys))
    }

    /// Sends the check that [`check_now`](Self::check_now) could not answer.
    pub(crate) async fn check_keys(
        &self,
        keys: Vec<String>,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.send(keys, policy, cost, 0, None)
            .await
            .map(|(decision, _)| decision)
    }

    /// Sends a validated check or reservation on `keys` (batched when it
    /// can be) and remembers a denial of a plain check in the deny cache.
    async fn send(
        &self,
        keys: Vec<String>,
        policy: &Policy,
        cost: u64,
        max_wait_us: u64,
        clock: Option<u64>,
    ) -> Result<(Decision, u64), Error> {
        let cacheable = clock.is_none() && max_wait_us == 0 && cost > 0;
        // Batch only while the breaker is closed: when it is open, a check is
        // answered at once (or is the probe) instead of queueing behind calls
        // that may hang.
        if clock.is_none()
            && let Some(batcher) = &self.inner.batcher
            && self.inner.breaker.is_closed()
        {
            return self.batched(batcher, keys, policy, cost, max_wait_us).await;
        }
        let remembered = (cacheable && self.inner.denials.is_some()).then(|| keys.clone());
        let sent = Instant::now();
        let mut batch = Batch::new(clock);
        batch.push(keys, policy, cost, max_wait_us);
        let script = self.script_for(clock);
        let batch = &batch;
        let reply = self
            .guarded(|mut conn| async move { batch.run(&mut conn, script).await })
            .await?;
        let outcome = batch
            .outcomes(&reply)?
            .pop()
            .ok_or_else(|| Error::store(crate::ErrorKind::Server, "empty reply from the script"))?;
        if let (Some(cache), Some(keys)) = (&self.inner.denials, remembered)
            && !outcome.0.allowed()
        {
            cache.insert(keys, cost, &outcome.0, sent);
        }
        Ok(outcome)
    }

    /// Several checks in one script call, decided in order at the microsecond
    /// `now_us` (cargo feature `test-util`): what batching sends under load.
    #[cfg(feature = "test-util")]
    pub async fn check_batch_at(
        &self,
        checks: &[(&str, &Policy, u64)],
        now_us: u64,
    ) -> Result<Vec<Decision>, Error> {
        let mut batch = Batch::new(Some(now_us));
        for (key, policy, cost) in checks {
            validate(policy, *cost)?;
            let keys = policy.quotas().iter().map(|q| self.bucket_key(key, q));
            batch.push(keys, policy, *cost, 0);
        }
        let script = &self.inner.test_script;
        let call = &batch;
        let reply = self
            .guarded(|mut conn| async move { call.run(&mut conn, script).await })
            .await?;
        Ok(batch
            .outcomes(&reply)?
            .into_iter()
            .map(|(decision, _)| decision)
            .collect())
    }

    /// `reserve` with an explicit microsecond clock (cargo feature `test-util`).
    #[cfg(feature = "test-util")]
    pub async fn reserve_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        max_wait: Duration,
        now_us: u64,
    ) -> Result<Reservation, Error> {
        let (decision, wait) = self
            .reserve_inner(key, policy, cost, micros(max_wait), Some(now_us))
            .await?;
        Ok(Reservation::new(decision, wait))
    }

    /// Queues a check for the next script call (see `batch.rs`) and waits for
    /// its answer, at most the store timeout.
    async fn batched(
        &self,
        batcher: &Batcher,
        keys: Vec<String>,
        policy: &Policy,
        cost: u64,
        max_wait_us: u64,
    ) -> Result<(Decision, u64), Error> {
        let (reply, answered) = tokio::sync::oneshot::channel();
        let check = Pending {
            keys,
            policy: policy.clone(),
            cost,
            max_wait_us,
            sent: Instant::now(),
            reply,
        };
        if let Some(checks) = batcher.enqueue(check) {
            let store = self.clone();
            tokio::spawn(async move { store.drain(checks).await });
        }
        // Each check counts towards the breaker by what its caller saw: an
        // answer, a failure, or its own timeout (waiting in the queue or in
        // the call), once.
        match tokio::time::timeout(self.inner.timeout, answered).await {
            Ok(Ok(Ok(outcome))) => {
                self.inner.breaker.success();
                Ok(outcome)
            }
            Ok(Ok(Err(err))) => {
                if !matches!(err, Error::CircuitOpen { .. }) {
                    self.inner.breaker.failure();
                }
                Err(err)
            }
            Ok(Err(_)) => Err(Error::store(
                crate::ErrorKind::Server,
                "the batch of this check was dropped",
            )),
            Err(_) => {
                // The caller waited the whole timeout (in the queue or in the
                // call): for the breaker, as for the caller, a timeout.
                self.inner.breaker.failure();
                let err = Error::Timeout(self.inner.timeout);
                observe::store_error(STORE, &err, &self.inner.errors);
                Err(err)
            }
        }
    }

    /// Sends `checks`, then whatever queued meanwhile, until the queue is empty.
    async fn drain(&self, mut checks: Vec<Pending>) {
        let Some(batcher) = &self.inner.batcher else {
            return;
        };
        loop {
            let batch = batch_of(&checks);
            let script = &self.inner.script;
            let call = &batch;
            let outcomes = self
                .guarded_checks(
                    0,
                    |mut conn| async move { call.run(&mut conn, script).await },
                )
                .await
                .and_then(|reply| batch.outcomes(&reply));
            answer(checks, outcomes, self.inner.denials.as_ref());
            match batcher.next() {
                Some(next) => checks = next,
                None => return,
            }
        }
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
        self.guarded_checks(1, op).await
    }

    /// [`guarded`](Self::guarded) for a call that carries `checks` checks: a
    /// failure counts once per check towards opening the breaker. With 0 the
    /// callers count their own outcomes (a batch's checks, see `batched`).
    async fn guarded_checks<T, F, Fut>(&self, checks: usize, op: F) -> Result<T, Error>
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
        let result = self.bounded(op, matches!(admit, Admit::Probe(_))).await;
        let failure = result.as_ref().err();
        observe::store_call(STORE, started.elapsed(), failure.map(Error::kind));
        match (admit, failure) {
            (Admit::Probe(probe), failure) => probe.done(failure.is_none()),
            _ if checks == 0 => {}
            (_, None) => self.inner.breaker.success(),
            (_, Some(_)) => self
                .inner
                .breaker
                .failures_of(u32::try_from(checks).unwrap_or(u32::MAX)),
        }
        if let Some(err) = failure {
            observe::store_error(STORE, err, &self.inner.errors);
        }
        result
    }

    /// Runs `op` on the held connection within the timeout, replacing the
    /// connection and retrying once if it is broken. A `probe` connects even
    /// while connects back off.
    async fn bounded<T, F, Fut>(&self, op: F, probe: bool) -> Result<T, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let link = &self.inner.link;
        let mut in_use = None;
        let attempt = async {
            let held = link.get(probe).await?;
            in_use = Some(held.clone());
            match op(held.conn.clone()).await {
                Ok(value) => {
                    link.success(&held);
                    Ok(value)
                }
                Err(e) if is_connection_error(&e) => {
                    link.forget(held.id);
                    let fresh = link.get(probe).await?;
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

/// `{prefix}{{{key}` and the quota's `tail` (`}:` and its id), in one
/// allocation.
fn storage_key(prefix: &str, key: &str, tail: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1 + key.len() + tail.len());
    out.push_str(prefix);
    out.push('{');
    out.push_str(key);
    out.push_str(tail);
    out
}

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
        let keys = self.keys_of(key, policy);
        if let Some(cache) = &self.inner.denials {
            cache.forget(&keys);
        }
        let mut del = redis::cmd("DEL");
        del.arg(&keys);
        let del = &del;
        self.guarded(|mut conn| async move { del.query_async::<Value>(&mut conn).await })
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checks_keys_are_the_bucket_keys_of_its_quotas() {
        let store = RedisStore::builder()
            .url("redis://127.0.0.1:1")
            .prefix("app:rl:")
            .build()
            .unwrap();
        let policy = Policy::new(
            "p",
            [
                Quota::per_second(10).unwrap(),
                Quota::per_hour(1_000).unwrap().burst(50).unwrap(),
            ],
        )
        .unwrap();
        for key in ["user:42", "a key with spaces", &"x".repeat(300)] {
            let expected: Vec<String> = policy
                .quotas()
                .iter()
                .map(|q| store.bucket_key(key, q))
                .collect();
            assert_eq!(store.keys_of(key, &policy), expected);
        }
        assert_eq!(
            store.bucket_key("user:42", &policy.quotas()[0]),
            "app:rl:{user:42}:10/1s:10"
        );
    }
}
