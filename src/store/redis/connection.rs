//! The connection a Redis store holds, and its lifecycle.
//!
//! - **One connection, held.** Every call runs on a clone of one multiplexed
//!   connection, so concurrent calls pipeline on its socket; there is no pool
//!   checkout (and no `PING`) per call.
//! - **Connecting runs outside the calls.** A connect is a task of its own with
//!   its own timeout ([`connect_timeout`](super::RedisStoreBuilder::connect_timeout)):
//!   a call waits for it at most its own timeout, and a connect slower than that
//!   still completes and serves later calls. One connect runs at a time, so the
//!   calls in flight after a restart share it. After a failed connect the next
//!   one waits a backoff (50 ms doubling to 250 ms); calls in between fail at
//!   once with the last connect error instead of piling up, except the circuit
//!   breaker's probe, which connects at once: it is there to find out whether
//!   the store is back.
//! - **A slow call does not drop a healthy connection.** After a timeout the
//!   connection is checked with a `PING` in the background, and dropped only if
//!   that fails or a second call in a row times out. A connection that breaks
//!   (I/O error, `READONLY` or `MASTERDOWN` after a failover) is dropped at once.
//! - **redis-rs's own response timeout** is set to four times the store's
//!   timeout (at least one second): it never decides before the store's
//!   timeout does, and only frees the replies that never come.
//! - **A cluster connection is replaced, never dropped.** redis-rs follows
//!   `MOVED`/`ASK`, reconnects a node whose socket closed and refreshes the
//!   slot map; but a node that stops answering without closing its sockets
//!   (a dead host, a partition) keeps its slots' calls timing out, since a
//!   timeout makes redis-rs neither reconnect nor ask for the slot map. So
//!   after a timeout or an error redis-rs gave up on, a new cluster
//!   connection (new sockets, a fresh slot map from the seeds) is made in the
//!   background, at most once a second, while the old one keeps serving the
//!   other nodes' calls; it takes over once it is up. A refund goes on a
//!   second cluster connection, made without redis-rs's retries
//!   ([`Conn::for_call`]).
//! - **Sentinel** is asked for the primary on every connect, so the connect
//!   after a failover (a broken socket, `READONLY` from the demoted primary)
//!   finds the new one.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use deadpool_redis::Pool;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisError, RedisFuture, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::cluster::{ClusterConn, ClusterSource};
use super::epoch::ServerEpoch;
use super::failure::{AtHost, kind_of};
use crate::error::{Error, ErrorKind};

/// The first wait after a failed connect.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// The longest wait between connects.
const MAX_BACKOFF: Duration = Duration::from_millis(250);
/// Consecutive timeouts on one connection that drop it without waiting for
/// the background `PING`.
const TIMEOUTS_BEFORE_RECONNECT: u32 = 2;
/// At most one replacement of a cluster connection per this interval.
const RENEW_INTERVAL: Duration = Duration::from_secs(1);

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

/// Why a refund is refused on an application's cluster pool.
pub(crate) const RESENDS: &str = "a script call giving tokens back is never sent on an \
     application's cluster pool: its client (deadpool-redis builds it with redis-rs's \
     default of 16 retries) may send it again after a broken connection, and Redis may \
     have run it already; build the store with .cluster(seed_urls) instead";

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
    /// own (see [`Link::resends`]).
    Cluster(ClusterSource),
    /// Sentinels, asked for the primary on every connect.
    #[cfg(feature = "sentinel")]
    Sentinel(tokio::sync::Mutex<redis::sentinel::SentinelClient>),
}

impl Source {
    async fn connect(&self, config: &AsyncConnectionConfig) -> Result<Conn, RedisError> {
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

/// A connection of any topology, used through redis-rs's `ConnectionLike`.
#[derive(Clone)]
pub(crate) enum Conn {
    Multiplexed(MultiplexedConnection),
    /// A Redis Cluster's (cargo feature `cluster`): routes each command to
    /// the primary of its first key's slot.
    Cluster(ClusterConn),
}

impl Conn {
    /// Whether the connection is many connections (a cluster): one failing
    /// node says nothing about the others, so it is replaced in the background
    /// instead of dropped.
    pub(crate) fn is_composite(&self) -> bool {
        match self {
            Conn::Multiplexed(_) => false,
            Conn::Cluster(_) => true,
        }
    }

    /// The connection for a call: this one, or for a call that gives tokens
    /// back (`gives_back`, see `Batch::run`), one whose client never sends
    /// it again. redis-rs's cluster client resends a call itself after a
    /// broken connection or a timeout (as after a redirect), up to its
    /// `retries`, and Redis may have run it before the connection broke: a
    /// refund goes on the store's second cluster connection, made with
    /// `retries(0)`, where every failure comes back to the store, which
    /// never resends a refund. A multiplexed connection resends nothing
    /// itself. An application's cluster pool has no second connection: an
    /// error, and nothing is sent.
    pub(crate) fn for_call(self, gives_back: bool) -> Result<Conn, RedisError> {
        if !gives_back {
            return Ok(self);
        }
        match self {
            Conn::Cluster(cluster) => cluster.for_refund().map(Conn::Cluster).ok_or_else(|| {
                RedisError::from((redis::ErrorKind::Client, "not sent", RESENDS.to_owned()))
            }),
            conn => Ok(conn),
        }
    }

    fn set_response_timeout(&mut self, timeout: Duration) {
        match self {
            Conn::Multiplexed(c) => c.set_response_timeout(timeout),
            // Set on the cluster client when the store builds it; an
            // application's cluster pool keeps the application's settings.
            Conn::Cluster(_) => {}
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Multiplexed(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Multiplexed(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Multiplexed(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The connection in use, and how many calls in a row timed out on it.
#[derive(Clone)]
pub(crate) struct Held {
    pub(crate) id: u64,
    pub(crate) conn: Conn,
    timeouts: Arc<AtomicU32>,
}

/// The held connection and what is being done about it; shared by the clones
/// of one store.
#[derive(Clone)]
pub(crate) struct Link {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) source: Source,
    host: Arc<str>,
    pub(crate) connect_timeout: Duration,
    response_timeout: Duration,
    config: AsyncConnectionConfig,
    state: Mutex<State>,
    changed: Notify,
    pinging: AtomicBool,
    next_id: AtomicU64,
    /// The server's epoch, told of every new connection, whose first calls
    /// then check the server's identity (see `epoch.rs`); unset on a
    /// cluster.
    epoch: OnceLock<Arc<ServerEpoch>>,
    /// The store's watch was started (see `watch.rs`).
    watch_started: AtomicBool,
}

#[derive(Default)]
struct State {
    held: Option<Held>,
    connecting: bool,
    /// Bumped whenever a connect ends, so waiters see that it did.
    attempts: u64,
    /// No connect before this instant (backoff after a failure).
    retry_at: Option<Instant>,
    backoff: Duration,
    last_error: Option<(ErrorKind, Arc<str>)>,
    /// When a cluster connection was last replaced in the background.
    renewed_at: Option<Instant>,
}

impl Link {
    pub(crate) fn new(
        source: Source,
        host: Arc<str>,
        call_timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        let response_timeout = response_timeout(call_timeout);
        // No response timeout of redis-rs's own: see `response_timeout`.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(None);
        Link {
            inner: Arc::new(Inner {
                source,
                host,
                connect_timeout,
                response_timeout,
                config,
                state: Mutex::new(State {
                    backoff: MIN_BACKOFF,
                    ..State::default()
                }),
                changed: Notify::new(),
                pinging: AtomicBool::new(false),
                next_id: AtomicU64::new(0),
                epoch: OnceLock::new(),
                watch_started: AtomicBool::new(false),
            }),
        }
    }

    /// Every connection made from now on tells `epoch`: the calls on it
    /// then check the server's identity until one has (see `epoch.rs`), so
    /// that nothing is decided on a restarted or promoted server before the
    /// store knows it is one.
    pub(crate) fn tell(&self, epoch: Arc<ServerEpoch>) {
        let _ = self.inner.epoch.set(epoch);
    }

    /// Where connections come from.
    pub(crate) fn source(&self) -> &Source {
        &self.inner.source
    }

    /// The epoch, when the store wants its watch started and this call is
    /// the first to ask (see `watch.rs`), with the link for the watch to
    /// hold (weakly: it ends when the store is dropped).
    pub(crate) fn claim_watch(&self) -> Option<(Weak<Inner>, Arc<ServerEpoch>)> {
        let epoch = self.inner.epoch.get()?;
        (epoch.watch_wanted() && !self.inner.watch_started.swap(true, Ordering::AcqRel))
            .then(|| (Arc::downgrade(&self.inner), Arc::clone(epoch)))
    }

    /// The server, for messages (never with a password).
    pub(crate) fn host(&self) -> &Arc<str> {
        &self.inner.host
    }

    /// Whether every connection of this link may send a call again on its
    /// own (an application's cluster pool): then no call that gives tokens
    /// back is sent at all (see [`Conn::for_call`]).
    pub(crate) fn resends(&self) -> bool {
        matches!(&self.inner.source, Source::Cluster(cluster) if cluster.resends())
    }

    /// The held connection, connecting first if there is none. Fails at once
    /// with the last connect error while connects are backing off, unless
    /// `probe` (the circuit breaker's probe must see whether the store is back,
    /// so it connects whatever the backoff says).
    pub(crate) async fn get(&self, probe: bool) -> Result<Held, Error> {
        let mut seen = None;
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let start = {
                let mut state = self.inner.lock();
                if let Some(held) = &state.held {
                    return Ok(held.clone());
                }
                if let Some(attempts) = seen
                    && state.attempts != attempts
                    && !state.connecting
                {
                    // The connect this call waited for failed.
                    return Err(self.last_error(&state));
                }
                seen = Some(state.attempts);
                if state.connecting {
                    None
                } else {
                    if !probe && state.retry_at.is_some_and(|at| Instant::now() < at) {
                        return Err(self.last_error(&state));
                    }
                    state.connecting = true;
                    Some(Connecting::new(&self.inner))
                }
            };
            // Spawned with the state unlocked: a runtime shutting down drops
            // the task at once, and its guard locks the state.
            if let Some(connecting) = start {
                tokio::spawn(connect(connecting));
            }
            notified.await;
        }
    }

    fn last_error(&self, state: &State) -> Error {
        match &state.last_error {
            Some((kind, message)) => Error::store(*kind, message.to_string()),
            None => Error::store(
                ErrorKind::Connection,
                format!("Redis at {}: not connected", self.inner.host),
            ),
        }
    }

    /// The call on `held` succeeded: it is healthy.
    pub(crate) fn success(&self, held: &Held) {
        if held.timeouts.load(Ordering::Relaxed) != 0 {
            held.timeouts.store(0, Ordering::Relaxed);
        }
    }

    /// A call on connection `id` broke it: drop it if it is still the one
    /// held (a cluster connection: replace it in the background).
    pub(crate) fn forget(&self, id: u64) {
        let renewing = {
            let mut state = self.inner.lock();
            match &state.held {
                Some(h) if h.id == id && h.conn.is_composite() => self.renew(&mut state),
                Some(h) if h.id == id => {
                    state.held = None;
                    if let Some(epoch) = self.inner.epoch.get() {
                        epoch.disconnected();
                    }
                    None
                }
                _ => None,
            }
        };
        spawn_connect(renewing);
    }

    /// A call on `held` ran out of time. Maybe the call was just slow, maybe
    /// the connection is dead (half-open): a second timeout in a row drops it,
    /// and a background `PING` decides before that. A cluster connection is
    /// replaced in the background instead (a `PING` would go to every
    /// primary, and fail while any one of them fails over).
    pub(crate) fn timed_out(&self, held: &Held) {
        if held.conn.is_composite() {
            let renewing = {
                let mut state = self.inner.lock();
                if state.held.as_ref().is_some_and(|h| h.id == held.id) {
                    self.renew(&mut state)
                } else {
                    None
                }
            };
            spawn_connect(renewing);
            return;
        }
        let timeouts = held.timeouts.fetch_add(1, Ordering::AcqRel) + 1;
        if timeouts >= TIMEOUTS_BEFORE_RECONNECT {
            self.forget(held.id);
            return;
        }
        if self.inner.pinging.swap(true, Ordering::AcqRel) {
            return;
        }
        // Owned by the task from here: a task that never finishes (dropped
        // with its runtime, or panicking) still lets the next timeout ping.
        let pinging = Pinging(Arc::clone(&self.inner));
        let inner = Arc::clone(&self.inner);
        let held = held.clone();
        tokio::spawn(async move {
            let _pinging = pinging;
            let mut conn = held.conn.clone();
            let ping = redis::cmd("PING");
            let alive =
                tokio::time::timeout(inner.connect_timeout, ping.query_async::<Value>(&mut conn))
                    .await
                    .is_ok_and(|reply| reply.is_ok());
            if alive {
                held.timeouts.store(0, Ordering::Relaxed);
            } else {
                let mut state = inner.lock();
                if state.held.as_ref().is_some_and(|h| h.id == held.id) {
                    state.held = None;
                }
            }
        });
    }

    /// Begins a connect that replaces the held connection when it succeeds,
    /// unless one runs, one ran within [`RENEW_INTERVAL`] or connects are
    /// backing off; the caller spawns it with [`spawn_connect`] once the
    /// state is unlocked. Calls keep the held connection meanwhile.
    fn renew(&self, state: &mut State) -> Option<Connecting> {
        let now = Instant::now();
        let due = state
            .renewed_at
            .is_none_or(|at| now.duration_since(at) >= RENEW_INTERVAL);
        let backing_off = state.retry_at.is_some_and(|at| now < at);
        if state.connecting || !due || backing_off {
            return None;
        }
        state.connecting = true;
        state.renewed_at = Some(now);
        Some(Connecting::new(&self.inner))
    }
}

/// Spawns the connect `renew` began, if it did. Never with the state locked:
/// a runtime shutting down drops the task at once, and its guard locks the
/// state.
fn spawn_connect(connecting: Option<Connecting>) {
    if let Some(connecting) = connecting {
        tokio::spawn(connect(connecting));
    }
}

/// A connect under way, made when `connecting` is set and moved into the
/// task that connects. If that task never finishes (dropped unpolled or
/// mid-connect with its runtime, or panicking), dropping this ends the
/// connect as a failed one: `connecting` cleared and the waiters woken, so
/// the next call starts another connect instead of waiting, for good, on one
/// that will never end.
struct Connecting {
    inner: Option<Arc<Inner>>,
}

impl Connecting {
    fn new(inner: &Arc<Inner>) -> Self {
        Connecting {
            inner: Some(Arc::clone(inner)),
        }
    }
}

impl Drop for Connecting {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        let mut state = inner.lock();
        state.connecting = false;
        state.attempts += 1;
        state.last_error = Some((
            ErrorKind::Connection,
            format!(
                "Redis at {}: the connect was dropped before it finished \
                 (its runtime shut down, or its task panicked)",
                inner.host
            )
            .into(),
        ));
        // A connect that keeps failing this way backs off as any other.
        backoff(&mut state);
        drop(state);
        inner.changed.notify_waiters();
    }
}

/// A background `PING` under way: clears `pinging` when its task ends, however
/// it ends.
struct Pinging(Arc<Inner>);

impl Drop for Pinging {
    fn drop(&mut self) {
        self.0.pinging.store(false, Ordering::Release);
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One connect, run as a task of its own so that it completes even when the
/// call that started it has given up.
async fn connect(mut connecting: Connecting) {
    let Some(inner) = connecting.inner.clone() else {
        return;
    };
    let outcome =
        tokio::time::timeout(inner.connect_timeout, inner.source.connect(&inner.config)).await;
    // Finished: the outcome below ends the connect, not the guard.
    connecting.inner = None;
    let mut state = inner.lock();
    state.connecting = false;
    state.attempts += 1;
    match outcome {
        Ok(Ok(mut conn)) => {
            // Pool connections come with redis-rs's default response
            // timeout (500 ms): moved past the store's. The store's own
            // connections have none (see `response_timeout`).
            if matches!(inner.source, Source::Pool(_)) {
                conn.set_response_timeout(inner.response_timeout);
            }
            if let Some(epoch) = inner.epoch.get() {
                epoch.reconnected();
            }
            state.held = Some(Held {
                id: inner.next_id.fetch_add(1, Ordering::Relaxed),
                conn,
                timeouts: Arc::new(AtomicU32::new(0)),
            });
            state.retry_at = None;
            state.backoff = MIN_BACKOFF;
            state.last_error = None;
        }
        Ok(Err(e)) => {
            let message = AtHost {
                host: Arc::clone(&inner.host),
                error: e,
            };
            state.last_error = Some((kind_of(&message.error), message.to_string().into()));
            backoff(&mut state);
        }
        Err(_) => {
            state.last_error = Some((
                ErrorKind::Connection,
                format!(
                    "Redis at {}: no connection within the connect timeout of {:?}",
                    inner.host, inner.connect_timeout
                )
                .into(),
            ));
            backoff(&mut state);
        }
    }
    drop(state);
    inner.changed.notify_waiters();
}

fn backoff(state: &mut State) {
    state.retry_at = Some(Instant::now() + state.backoff);
    state.backoff = (state.backoff * 2).min(MAX_BACKOFF);
}
