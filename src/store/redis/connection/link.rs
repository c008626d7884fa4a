//! [`Link`]: the held connection's lifecycle. Getting it (connecting
//! first, or failing at once while connects back off), and what a success, a
//! broken connection or a timeout does to it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use redis::{AsyncConnectionConfig, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::super::epoch::ServerEpoch;
use super::connect::{Connecting, connect, spawn_connect};
use super::source::{Source, response_timeout};
use super::state::{HeldConn, Inner, MIN_BACKOFF, State};
use crate::error::{Error, ErrorKind};

/// Consecutive timeouts on one connection that drop it without waiting for
/// the background `PING`.
const TIMEOUTS_BEFORE_RECONNECT: u32 = 2;
/// At most one replacement of a cluster connection per this interval.
const RENEW_INTERVAL: Duration = Duration::from_secs(1);

/// The held connection and what is being done about it; shared by the clones
/// of one store.
#[derive(Clone)]
pub(crate) struct Link {
    inner: Arc<Inner>,
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
    pub(crate) async fn get(&self, probe: bool) -> Result<HeldConn, Error> {
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
    pub(crate) fn success(&self, held: &HeldConn) {
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
    pub(crate) fn timed_out(&self, held: &HeldConn) {
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

/// A background `PING` under way: clears `pinging` when its task ends, however
/// it ends.
struct Pinging(Arc<Inner>);

impl Drop for Pinging {
    fn drop(&mut self) {
        self.0.pinging.store(false, Ordering::Release);
    }
}
