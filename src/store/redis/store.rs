//! [`RedisStore`]: token buckets in Redis, behind a circuit breaker: what it
//! is made of, and its public face (check, reserve, reset, ping).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;
#[cfg(feature = "test-util")]
use std::{future::Future, pin::Pin};

use redis::Value;
use tokio::time::Instant;

use super::batch::{Batcher, Pending};
use super::connection::Link;
use super::encode::{SlotOf, Spend};
use super::epoch::ServerEpoch;
use super::failure::{classify, is_connection_error};
use super::lease::{Errand, LeaseConfig, Leases};
use super::script::Script;
use super::watch;
use crate::decision::Decision;
use crate::decision::Reservation;
use crate::error::Error;
use crate::observe::{self, LogThrottle};
use crate::policy::Policy;
use crate::quota::Quota;
use crate::quota::micros;
use crate::store::breaker::{Breaker, CircuitBreaker};
use crate::store::contract::{Store, validate};
use crate::store::deny_cache::DenyCache;
use crate::store::key::safe_key;
use crate::store::sealed::Sealed;
/// The `store` label of this store's metrics.
pub(super) const STORE: &str = "redis";

/// Token buckets in Redis, decided by one Lua script per check.
///
/// - **One round trip per decision**, on one held multiplexed connection that
///   concurrent checks pipeline on (no pool checkout, no `PING` per check).
/// - **Clock:** Redis `TIME`, never the application's.
/// - **Keys:** `{prefix}{{client}}:{period}`, e.g. `tollgate:{user:42}:1s`;
///   the client part is made safe by [`safe_key`] and is the cluster hash tag,
///   so all quotas of one client share a slot. Each key expires when its bucket
///   would be full again (plus 1 ms).
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
                    .map(|config| Leases::new(config, STORE, epoch.clone())),
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

    /// The storage key of `key`'s bucket for `quota` in a policy that does
    /// not carry buckets over ([`Policy::carries`]: one made from a bare
    /// `Quota`, named `default`), whose keys name the quota's figures
    /// (`tollgate:{default:user:42}:10/s:b20`). [`bucket_keys`](Self::bucket_keys)
    /// gives the keys of any policy.
    pub fn bucket_key(&self, key: &str, quota: &Quota) -> String {
        storage_key(
            &self.inner.prefix,
            &safe_key(key),
            &format!("}}:{}", quota.figures()),
        )
    }

    /// The storage keys of `key`'s buckets under `policy`, one per quota in
    /// order: named by the quota's period (`tollgate:{api:user:42}:1s`) in a
    /// policy that carries buckets over ([`Policy::carries`]), by its figures
    /// otherwise.
    pub fn bucket_keys(&self, key: &str, policy: &Policy) -> Vec<String> {
        self.keys_of(key, policy)
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

    pub(super) async fn decide(
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
    pub(super) async fn reserve_inner(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        max_wait_us: u64,
        clock: Option<u64>,
    ) -> Result<(Decision, u64), Error> {
        validate(policy, cost)?;
        let cacheable = clock.is_none() && max_wait_us == 0 && cost > 0;
        if cacheable && let Some(decision) = self.leased(key, policy, cost) {
            return Ok((decision, 0));
        }
        let keys = self.keys_of(key, policy);
        if cacheable && let Some(decision) = self.cached_denial(&keys, policy, cost) {
            return Ok((decision, 0));
        }
        self.send(keys, policy, Spend::Take { cost, max_wait_us }, clock)
            .await
    }

    /// An adjustment after the fact: `delta` tokens spent from `key`'s
    /// buckets whatever they hold (a charge) or, when negative, given back
    /// (a refund), in one script call batched with the checks in flight.
    pub(crate) async fn adjust(&self, key: &str, policy: &Policy, delta: i64) -> Result<(), Error> {
        self.adjust_inner(key, policy, delta, None).await
    }

    pub(super) async fn adjust_inner(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        clock: Option<u64>,
    ) -> Result<(), Error> {
        if delta == 0 {
            return Ok(());
        }
        // A refund is given back first to this instance's holds, from what
        // it spent of them and has not reported: Redis still counts those
        // tokens as in the bucket, so a refund there would be clamped away
        // and the report would then debit them all.
        let mut delta = delta;
        if delta < 0
            && clock.is_none()
            && let Some(leases) = &self.inner.leases
        {
            let (given, reports) = leases.refund(&safe_key(key), policy, delta.unsigned_abs());
            self.run_errand(Errand {
                reports,
                ..Errand::default()
            });
            delta += i64::try_from(given).unwrap_or(0);
            if delta == 0 {
                return Ok(());
            }
        }
        let keys = self.keys_of(key, policy);
        self.send(keys, policy, Spend::Adjust(delta), clock)
            .await
            .map(|_| ())
    }

    /// The storage keys of `key`'s buckets, one per quota of `policy`.
    pub(super) fn keys_of(&self, key: &str, policy: &Policy) -> Vec<String> {
        let key = safe_key(key);
        policy
            .key_tails()
            .iter()
            .map(|tail| storage_key(&self.inner.prefix, &key, tail))
            .collect()
    }

    /// A denial of `cost` the deny cache still holds for `keys`, made for
    /// `policy`'s quotas.
    fn cached_denial(&self, keys: &[String], policy: &Policy, cost: u64) -> Option<Decision> {
        let decision = self
            .inner
            .denials
            .as_ref()?
            .lookup(keys, policy.quotas(), cost)?;
        observe::deny_cache_hit(STORE);
        Some(decision)
    }

    /// A plain check as far as it goes without waiting: the deny cache's
    /// answer, [`Error::CircuitOpen`] while the breaker refuses calls, or the
    /// storage keys to send with [`send`](Self::send).
    pub(crate) fn check_now(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<Result<Decision, Error>, Vec<String>> {
        if let Err(err) = validate(policy, cost) {
            return Ok(Err(err));
        }
        if cost > 0
            && let Some(decision) = self.leased(key, policy, cost)
        {
            return Ok(Ok(decision));
        }
        let keys = self.keys_of(key, policy);
        if cost > 0
            && let Some(decision) = self.cached_denial(&keys, policy, cost)
        {
            return Ok(Ok(decision));
        }
        if let Some(retry_in) = self.inner.breaker.refusing() {
            let err = Error::CircuitOpen { retry_in };
            observe::store_error(STORE, &err, &self.inner.errors);
            return Ok(Err(err));
        }
        Err(keys)
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
    fn apart(&self, checks: &mut Vec<Pending>) -> Vec<Pending>;

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

/// `{prefix}{{{key}` and the quota's `tail` (`}:` and its period), in one
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
        // Held tokens of a reset bucket are gone with it: forgotten here,
        // with those of the key's other policies on a bucket of this one
        // (theirs are reported, for their other buckets); and again once
        // the DEL is over, or this future dropped: a lease asked for
        // meanwhile may have been granted on the old buckets just before
        // the DEL took them.
        if let Some(leases) = &self.inner.leases {
            let mut errand = Errand::default();
            leases.forget(key, policy, false, &mut errand);
            self.run_errand(errand);
        }
        let _forget_after = ForgetAfter {
            store: self,
            key,
            policy,
        };
        let mut del = redis::cmd("DEL");
        del.arg(&keys);
        let del = &del;
        // Never the breaker's probe: while the breaker is open a reset fails
        // at once instead of waiting for a hung Redis.
        let admit = self.inner.breaker.admit_without_probe();
        // A check sent before the buckets were deleted may be denied by the
        // old ones and answered after: its denial is not cached. Fenced once
        // the DEL is over, or when this future is dropped before (the DEL
        // may run anyway).
        let _fence = FenceOnDrop {
            cache: self.inner.denials.as_ref(),
            keys: &keys,
        };
        self.admitted(admit, 1, None, |mut conn| async move {
            del.query_async::<Value>(&mut conn).await
        })
        .await
        .map(drop)
    }
}

/// Forgets the holds on a reset key's buckets again when dropped: after
/// the reset's `DEL`, or with the reset's future (see `Leases::forget`).
struct ForgetAfter<'a> {
    store: &'a RedisStore,
    key: &'a str,
    policy: &'a Policy,
}

impl Drop for ForgetAfter<'_> {
    fn drop(&mut self) {
        if let Some(leases) = &self.store.inner.leases {
            let mut errand = Errand::default();
            leases.forget(self.key, self.policy, true, &mut errand);
            self.store.run_errand(errand);
        }
    }
}

/// Fences the deny cache off `keys` when dropped (see [`DenyCache::fence`]).
struct FenceOnDrop<'a> {
    cache: Option<&'a DenyCache>,
    keys: &'a [String],
}

impl Drop for FenceOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(cache) = self.cache {
            cache.fence(self.keys);
        }
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
        let bare = Policy::from(Quota::per_second(10).unwrap().burst(20).unwrap());
        for key in ["user:42", "a key with spaces", &"x".repeat(300)] {
            let expected: Vec<String> = bare
                .quotas()
                .iter()
                .map(|q| store.bucket_key(key, q))
                .collect();
            assert_eq!(store.keys_of(key, &bare), expected);
            assert_eq!(store.bucket_keys(key, &bare), expected);
            assert_eq!(store.bucket_keys(key, &policy), store.keys_of(key, &policy));
        }
        // A named policy's keys name periods; an unnamed one's, figures.
        assert_eq!(
            store.bucket_keys("user:42", &policy),
            ["app:rl:{user:42}:1s", "app:rl:{user:42}:1h"]
        );
        assert_eq!(
            store.bucket_key("user:42", &bare.quotas()[0]),
            "app:rl:{user:42}:10/s:b20"
        );
    }
}
