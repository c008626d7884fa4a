//! [`RedisStore`]: token buckets in Redis, behind a circuit breaker.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::{RedisError, Value};
use tokio::time::Instant;

use super::batch::{Batcher, Pending, Slot, answer, batch_of, remember};
#[cfg(feature = "cluster")]
use super::cluster::{Nodes, hash_slot, others_in_first_slot};
use super::connection::{Conn, Link};
use super::encode::{Batch, SlotOf};
use super::failure::{classify, is_connection_error};
use super::probe::{self, PROBE_WAIT};
use super::script::Script;
use super::sending::Sending;
use crate::decision::Reservation;
use crate::error::Error;
use crate::observe::{self, LogThrottle};
use crate::quota::micros;
use crate::store::breaker::{Admit, Breaker, ProbeGuard};
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
    /// `None` when the store sends every check on its own (or, on a
    /// cluster, batches per node).
    batcher: Option<Arc<Batcher>>,
    /// On a cluster: the slot map and a queue per primary (`nodes.rs`);
    /// `None` elsewhere or when batching is off.
    #[cfg(feature = "cluster")]
    nodes: Option<Nodes>,
    /// The script for batches over several slots of one node.
    #[cfg(feature = "cluster")]
    spread_script: Script,
    #[cfg(all(feature = "cluster", feature = "test-util"))]
    spread_test_script: Script,
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
    /// A cluster: batches are made per node (`nodes.rs`).
    pub(crate) per_node: bool,
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
                batcher: (parts.max_batch > 1 && !parts.per_node)
                    .then(|| Arc::new(Batcher::new(parts.max_batch))),
                #[cfg(feature = "cluster")]
                nodes: (parts.max_batch > 1 && parts.per_node).then(|| Nodes::new(parts.max_batch)),
                #[cfg(feature = "cluster")]
                spread_script: Script::spread(),
                #[cfg(all(feature = "cluster", feature = "test-util"))]
                spread_test_script: Script::spread_with_test_clock(),
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
    /// answer, [`Error::CircuitOpen`] while the breaker refuses calls, or the
    /// storage keys to send with [`send`](Self::send).
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
        if let Some(retry_in) = self.inner.breaker.refusing() {
            let err = Error::CircuitOpen { retry_in };
            observe::store_error(STORE, &err, &self.inner.errors);
            return Err(err);
        }
        Ok(Err(keys))
    }

    /// Sends a validated check or reservation on `keys` (batched when it
    /// can be) and remembers a denial of a plain check in the deny cache.
    /// A check that [`check_now`](Self::check_now) could not answer is sent
    /// with `max_wait_us` 0 and no `clock`.
    ///
    /// The route is chosen here, before anything is awaited (see
    /// `sending.rs`); nothing is sent until the future is polled.
    pub(crate) fn send<'a>(
        &'a self,
        keys: Vec<String>,
        policy: &'a Policy,
        cost: u64,
        max_wait_us: u64,
        clock: Option<u64>,
    ) -> Sending<'a, impl Future<Output = Result<(Decision, u64), Error>> + Send + 'a> {
        // Batch only while the breaker is closed: when it is open, a check is
        // answered at once (or is the probe) instead of queueing behind calls
        // that may hang.
        let may_batch = clock.is_none() && self.inner.breaker.is_closed();
        if may_batch && let Some(batcher) = &self.inner.batcher {
            let queue = Arc::clone(batcher);
            return Sending::Batched {
                future: self.batched(queue, false, keys, policy, cost, max_wait_us),
            };
        }
        // On a cluster, into the queue of the node that serves the client's
        // slot; sent on its own until the store has a slot map.
        #[cfg(feature = "cluster")]
        if may_batch && let Some(nodes) = &self.inner.nodes {
            match keys.first().and_then(|key| nodes.queue_for(key)) {
                Some(queue) => {
                    return Sending::Batched {
                        future: self.batched(queue, true, keys, policy, cost, max_wait_us),
                    };
                }
                None => self.refresh_slots(),
            }
        }
        // Boxed: the call on its own holds redis-rs's futures, about 2 KB,
        // which would otherwise be part of every batched check's future too.
        Sending::Alone {
            future: Box::pin(self.send_alone(keys, policy, cost, max_wait_us, clock)),
        }
    }

    /// A check or reservation in a script call of its own: batching is off,
    /// the breaker is not closed, a cluster store has no slot map yet, or
    /// `clock` is set (tests).
    async fn send_alone(
        &self,
        keys: Vec<String>,
        policy: &Policy,
        cost: u64,
        max_wait_us: u64,
        clock: Option<u64>,
    ) -> Result<(Decision, u64), Error> {
        // The deny cache learns from checks and reservations that may spend
        // or be denied; a test clock's decisions never touch it.
        let learns = clock.is_none() && cost > 0 && self.inner.denials.is_some();
        let remembered = learns.then(|| keys.clone());
        let sent = Instant::now();
        let mut batch = Batch::new(clock);
        batch.push(keys, policy, cost, max_wait_us);
        let mut outcomes = match self.inner.breaker.admit() {
            Admit::Probe(probe) => {
                let batch = Arc::new(batch);
                let reply = self.send_probe(probe, Arc::clone(&batch), clock).await?;
                self.read(&batch, &reply)?
            }
            admit => {
                let script = self.script_for(clock);
                let call = &batch;
                let reply = self
                    .admitted(admit, 1, |mut conn| async move {
                        call.run(&mut conn, script).await
                    })
                    .await?;
                self.read(&batch, &reply)?
            }
        };
        let outcome = outcomes
            .pop()
            .ok_or_else(|| Error::store(crate::ErrorKind::Server, "empty reply from the script"))?;
        if let (Some(cache), Some(keys)) = (&self.inner.denials, remembered) {
            remember(cache, keys, cost, max_wait_us, &outcome.0, sent);
        }
        Ok(outcome)
    }

    /// Several checks in one script call, decided in order at the microsecond
    /// `now_us` (cargo feature `test-util`): what batching sends under load.
    ///
    /// On a Redis Cluster the checks are grouped by the node that serves
    /// their client's slot, by the store's slot map (read first if it has
    /// none), and each group is one call, as batching does under load.
    #[cfg(feature = "test-util")]
    pub async fn check_batch_at(
        &self,
        checks: &[(&str, &Policy, u64)],
        now_us: u64,
    ) -> Result<Vec<Decision>, Error> {
        #[cfg(feature = "cluster")]
        if let Some(nodes) = &self.inner.nodes {
            return self.check_batch_on_nodes(nodes, checks, now_us).await;
        }
        let mut batch = Batch::new(Some(now_us));
        for (key, policy, cost) in checks {
            validate(policy, *cost)?;
            let keys: Vec<String> = policy
                .quotas()
                .iter()
                .map(|q| self.bucket_key(key, q))
                .collect();
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

    /// Queues a check for the next script call of `queue` (see `batch.rs`;
    /// `spread`: the queue of a cluster node, see `nodes.rs`) and waits for
    /// its answer, at most the store timeout.
    async fn batched(
        &self,
        queue: Arc<Batcher>,
        spread: bool,
        keys: Vec<String>,
        policy: &Policy,
        cost: u64,
        max_wait_us: u64,
    ) -> Result<(Decision, u64), Error> {
        let (reply, answered) = tokio::sync::oneshot::channel();
        let sent = Instant::now();
        let check = Pending {
            keys,
            policy: policy.clone(),
            cost,
            max_wait_us,
            sent,
            reply,
        };
        if let Some(checks) = queue.enqueue(check) {
            // The in-flight slot `enqueue` handed out is owned by the drain's
            // future from here on: a task dropped before it first runs (a
            // runtime shutting down) gives it back too, so the queue never
            // stalls.
            let slot = Slot::new(queue);
            let store = self.clone();
            tokio::spawn(async move { store.drain(slot, checks, spread).await });
        }
        // Each check counts towards the breaker by what its caller saw: an
        // answer, a failure, or its own timeout (waiting in the queue or in
        // the call), once.
        // The deadline from the clock already read for `sent` (one read of
        // the clock per check, not two); the timeout is at most 60 s (checked
        // when the store is built), so this cannot overflow.
        let deadline = sent + self.inner.timeout;
        match tokio::time::timeout_at(deadline, answered).await {
            Ok(Ok(Ok(outcome))) => {
                self.inner.breaker.success(sent);
                Ok(outcome)
            }
            Ok(Ok(Err(err))) => {
                if !matches!(err, Error::CircuitOpen { .. }) {
                    self.inner.breaker.failure(sent);
                }
                Err(err)
            }
            Ok(Err(_)) => {
                // The drain that held this check ended without answering it
                // (its task was dropped with its runtime, or panicked): not
                // Redis's doing, so the breaker does not count it.
                let err = Error::store(
                    crate::ErrorKind::Server,
                    "the batch of this check was dropped",
                );
                observe::store_error(STORE, &err, &self.inner.errors);
                Err(err)
            }
            Err(_) => {
                // The caller waited the whole timeout (in the queue or in the
                // call): for the breaker, as for the caller, a timeout.
                self.inner.breaker.failure(sent);
                let err = Error::Timeout(self.inner.timeout);
                observe::store_error(STORE, &err, &self.inner.errors);
                Err(err)
            }
        }
    }

    /// Sends `checks`, then whatever queued meanwhile, until `queue` is
    /// empty. `spread`: a cluster node's queue, whose batches may hold
    /// clients of several slots.
    async fn drain(&self, mut slot: Slot, mut checks: Vec<Pending>, spread: bool) {
        loop {
            #[cfg(feature = "cluster")]
            if spread {
                let apart =
                    others_in_first_slot(&mut checks, |c| c.keys.first().map(String::as_str));
                for check in apart {
                    let store = self.clone();
                    tokio::spawn(async move { store.alone(check).await });
                }
            }
            // One check needs no spread call: the production script decides
            // it, routed by its own slot.
            let spread = spread && checks.len() > 1;
            #[cfg(feature = "cluster")]
            let slot_of: Option<SlotOf> = spread.then_some(hash_slot);
            #[cfg(not(feature = "cluster"))]
            let slot_of: Option<SlotOf> = None;
            let mut batch = batch_of(&mut checks, slot_of);
            let script = self.batch_script(spread);
            let call = &batch;
            let started = Instant::now();
            // A batch never takes the breaker's probe: its checks would all
            // wait for it.
            let reply = self
                .admitted(
                    self.inner.breaker.admit_without_probe(),
                    0,
                    |mut conn| async move { call.run(&mut conn, script).await },
                )
                .await;
            // What the call took, for the queue's in-flight limit; a failed
            // call teaches nothing about round trips.
            let round_trip = reply.is_ok().then(|| started.elapsed());
            // The checks' keys back, for the deny cache and for checks sent
            // on their own.
            for (check, keys) in checks.iter_mut().zip(batch.take_keys()) {
                check.keys = keys;
            }
            match reply {
                Ok(reply) if batch.not_local(&reply) => {
                    // The node does not serve every key (the slot map is
                    // stale); nothing was written.
                    for check in checks {
                        let store = self.clone();
                        tokio::spawn(async move { store.alone(check).await });
                    }
                    self.refresh_slots();
                }
                Ok(reply) => answer(
                    checks,
                    self.read(&batch, &reply),
                    self.inner.denials.as_ref(),
                ),
                Err(err) => {
                    // A failover or a replaced connection may have moved
                    // slots: read the map again.
                    self.refresh_slots();
                    answer(checks, Err(err), self.inner.denials.as_ref());
                }
            }
            match slot.next(round_trip) {
                Some(next) => checks = next,
                None => return,
            }
        }
    }

    /// Sends one check of a batch on its own, routed by its slot.
    async fn alone(&self, check: Pending) {
        if check.reply.is_closed() {
            return;
        }
        let mut checks = vec![check];
        let mut batch = batch_of(&mut checks, None);
        let script = &self.inner.script;
        let call = &batch;
        // Sent on its own, but for the checks of a batch: never the probe.
        let outcomes = self
            .admitted(
                self.inner.breaker.admit_without_probe(),
                0,
                |mut conn| async move { call.run(&mut conn, script).await },
            )
            .await
            .and_then(|reply| self.read(&batch, &reply));
        for (check, keys) in checks.iter_mut().zip(batch.take_keys()) {
            check.keys = keys;
        }
        answer(checks, outcomes, self.inner.denials.as_ref());
    }

    /// The decisions of `batch` in the script's `reply`; a reply that does
    /// not read is a store error, reported as one.
    fn read(&self, batch: &Batch, reply: &[i64]) -> Result<Vec<(Decision, u64)>, Error> {
        batch.outcomes(reply).inspect_err(|err| {
            observe::store_error(STORE, err, &self.inner.errors);
        })
    }

    /// The script for a batch of `drain`.
    fn batch_script(&self, spread: bool) -> &Script {
        #[cfg(feature = "cluster")]
        if spread {
            return &self.inner.spread_script;
        }
        let _ = spread;
        &self.inner.script
    }

    /// On a cluster, reads the slot map again in the background (at most one
    /// read at a time, spaced; see `nodes.rs`); elsewhere nothing.
    fn refresh_slots(&self) {
        #[cfg(feature = "cluster")]
        if let Some(nodes) = &self.inner.nodes
            && nodes.begin_refresh(true)
        {
            // Owned by the task from here: a task that never finishes still
            // ends the read, so later refreshes can start.
            let read = SlotRead(self.clone());
            tokio::spawn(async move { read.0.read_slots(&read).await });
        }
    }

    /// Reads `CLUSTER SLOTS` through the cluster connection into the slot map,
    /// in the `read` that `begin_refresh` allowed (which ends it when
    /// dropped). A failure keeps the old map and is reported as a store error
    /// (not counted by the breaker).
    #[cfg(feature = "cluster")]
    async fn read_slots(&self, _read: &SlotRead) {
        let Some(nodes) = &self.inner.nodes else {
            return;
        };
        let read = self
            .bounded(
                |mut conn| async move {
                    redis::cmd("CLUSTER")
                        .arg("SLOTS")
                        .query_async::<Value>(&mut conn)
                        .await
                },
                false,
            )
            .await;
        let failure = match read {
            Ok(reply) => nodes.install(&reply).err().map(|why| {
                Error::store(
                    crate::ErrorKind::Server,
                    format!("Redis at {}: {why}", self.inner.link.host()),
                )
            }),
            Err(err) => Some(err),
        };
        if let Some(err) = failure {
            observe::store_error(STORE, &err, &self.inner.errors);
        }
    }

    /// `check_batch_at` on a cluster: one call per node of the slot map, as
    /// `drain` sends them (one by one after a call the node refused).
    #[cfg(all(feature = "cluster", feature = "test-util"))]
    async fn check_batch_on_nodes(
        &self,
        nodes: &Nodes,
        checks: &[(&str, &Policy, u64)],
        now_us: u64,
    ) -> Result<Vec<Decision>, Error> {
        if !nodes.has_map() && nodes.begin_refresh(false) {
            let read = SlotRead(self.clone());
            self.read_slots(&read).await;
        }
        // Per node (by its queue), its checks in order: index, first key.
        type Members = Vec<(usize, String)>;
        let mut groups: Vec<(Option<Arc<Batcher>>, Members)> = Vec::new();
        for (i, (key, policy, cost)) in checks.iter().enumerate() {
            validate(policy, *cost)?;
            let first = policy
                .quotas()
                .first()
                .map(|q| self.bucket_key(key, q))
                .unwrap_or_default();
            let queue = nodes.queue_for(&first);
            let same = |g: &Option<Arc<Batcher>>| match (g, &queue) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            };
            match groups.iter_mut().find(|(g, _)| same(g)) {
                Some((_, members)) => members.push((i, first)),
                None => groups.push((queue, vec![(i, first)])),
            }
        }
        let mut out: Vec<Option<Decision>> = checks.iter().map(|_| None).collect();
        for (_, mut members) in groups {
            // As `drain` does: other clients of the first one's slot apart,
            // and one by one after a call the node refused.
            let mut alone = others_in_first_slot(&mut members, |(_, k)| Some(k.as_str()));
            let spread = members.len() > 1;
            let mut batch = if spread {
                Batch::with_capacity(members.len(), Some(now_us), Some(hash_slot))
            } else {
                Batch::new(Some(now_us))
            };
            for (i, _) in &members {
                let (key, policy, cost) = checks.get(*i).copied().ok_or_else(|| {
                    Error::store(crate::ErrorKind::Server, "check index out of range")
                })?;
                let keys: Vec<String> = policy
                    .quotas()
                    .iter()
                    .map(|q| self.bucket_key(key, q))
                    .collect();
                batch.push(keys, policy, cost, 0);
            }
            let script = if spread {
                &self.inner.spread_test_script
            } else {
                &self.inner.test_script
            };
            let call = &batch;
            let reply = self
                .guarded(|mut conn| async move { call.run(&mut conn, script).await })
                .await?;
            if batch.not_local(&reply) {
                alone.append(&mut members);
                if nodes.begin_refresh(false) {
                    let read = SlotRead(self.clone());
                    self.read_slots(&read).await;
                }
            } else {
                for ((i, _), (decision, _)) in members.iter().zip(batch.outcomes(&reply)?) {
                    if let Some(slot) = out.get_mut(*i) {
                        *slot = Some(decision);
                    }
                }
            }
            alone.sort_unstable_by_key(|(i, _)| *i);
            for (i, _) in alone {
                if let (Some((key, policy, cost)), Some(slot)) = (checks.get(i), out.get_mut(i)) {
                    *slot = Some(self.decide(key, policy, *cost, Some(now_us)).await?);
                }
            }
        }
        out.into_iter()
            .map(|d| {
                d.ok_or_else(|| Error::store(crate::ErrorKind::Server, "check left undecided"))
            })
            .collect()
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

    /// The breaker's probe: `batch`'s script call in a task of its own,
    /// bounded by the store timeout, which this check waits for at most
    /// [`PROBE_WAIT`] (see `probe.rs`).
    async fn send_probe(
        &self,
        probe: ProbeGuard,
        batch: Arc<Batch>,
        clock: Option<u64>,
    ) -> Result<Vec<i64>, Error> {
        let store = self.clone();
        let call = async move {
            let script = store.script_for(clock);
            let batch = &batch;
            let started = Instant::now();
            let result = store
                .bounded(
                    |mut conn| async move { batch.run(&mut conn, script).await },
                    true,
                )
                .await;
            store.report(started, result.as_ref().err());
            result
        };
        probe::detached(probe, call, PROBE_WAIT.min(self.inner.timeout)).await
    }

    /// Reports a call that started at `started` and ended with `failure`.
    fn report(&self, started: Instant, failure: Option<&Error>) {
        observe::store_call(STORE, started.elapsed(), failure.map(Error::kind));
        if let Some(err) = failure {
            observe::store_error(STORE, err, &self.inner.errors);
        }
    }

    /// Runs `op` behind the circuit breaker, and reports how it went (the
    /// test-clock calls; checks and resets never take the probe inline).
    #[cfg(feature = "test-util")]
    async fn guarded<T, F, Fut>(&self, op: F) -> Result<T, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        self.admitted(self.inner.breaker.admit(), 1, op).await
    }

    /// Runs `op` as the breaker's `admit` says, and reports how it went. A
    /// failure counts once per check of the call (`checks`) towards opening
    /// the breaker; with 0 the callers count their own outcomes (a batch's
    /// checks, see `batched`).
    async fn admitted<T, F, Fut>(&self, admit: Admit, checks: usize, op: F) -> Result<T, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        if let Admit::Reject(retry_in) = admit {
            let err = Error::CircuitOpen { retry_in };
            observe::store_error(STORE, &err, &self.inner.errors);
            return Err(err);
        }
        let started = Instant::now();
        let result = self.bounded(op, matches!(admit, Admit::Probe(_))).await;
        let failure = result.as_ref().err();
        match (admit, failure) {
            (Admit::Probe(probe), failure) => probe.done(failure.is_none()),
            _ if checks == 0 => {}
            (_, None) => self.inner.breaker.success(started),
            (_, Some(_)) => self
                .inner
                .breaker
                .failures_of(u32::try_from(checks).unwrap_or(u32::MAX), started),
        }
        self.report(started, failure);
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

/// A read of the slot map that `Nodes::begin_refresh` allowed: ends it when
/// dropped, whether the read finished, failed, or its task never finished
/// (dropped with its runtime, or panicking).
#[cfg(feature = "cluster")]
struct SlotRead(RedisStore);

#[cfg(feature = "cluster")]
impl Drop for SlotRead {
    fn drop(&mut self) {
        if let Some(nodes) = &self.0.inner.nodes {
            nodes.end_refresh();
        }
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
        // Never the breaker's probe: while the breaker is open a reset fails
        // at once instead of waiting for a hung Redis.
        let admit = self.inner.breaker.admit_without_probe();
        self.admitted(admit, 1, |mut conn| async move {
            del.query_async::<Value>(&mut conn).await
        })
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

    /// A batched check that finds a free call slot takes it and spawns the
    /// task that sends the call. A task dropped before it first runs (its
    /// runtime shut down) must give the slot back: a store keeps two, and
    /// with both lost every later check of the store would wait in the queue
    /// until its timeout, for good.
    #[test]
    fn a_drain_task_dropped_before_it_runs_gives_its_call_slot_back() {
        use std::task::{Context, Waker};
        // Built without connecting: the drain never runs, nothing is sent.
        let store = RedisStore::from_url("redis://127.0.0.1:1").unwrap();
        let policy = Policy::from(Quota::per_second(10).unwrap());
        for _ in 0..super::super::window::MIN_IN_FLIGHT + 1 {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                // One poll: the check is queued and its drain spawned, but the
                // block ends before the runtime runs the drain.
                let mut check = std::pin::pin!(store.check("a", &policy, 1));
                let pending = check
                    .as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
                    .is_pending();
                assert!(pending, "answered without a call");
            });
            // Shutting down drops the drain's task unpolled.
            drop(runtime);
        }
        let batcher = store.inner.batcher.as_ref().unwrap();
        let (reply, _answered) = tokio::sync::oneshot::channel();
        let check = Pending {
            keys: vec!["{a}".into()],
            policy,
            cost: 1,
            max_wait_us: 0,
            sent: Instant::now(),
            reply,
        };
        assert!(
            batcher.enqueue(check).is_some(),
            "a new check no longer finds a free call slot"
        );
    }
}
