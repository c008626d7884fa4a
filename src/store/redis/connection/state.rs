//! What the clones of one store share about its connection ([`Inner`]):
//! where connections come from, the held one ([`HeldConn`]), the connect
//! under way and the backoff after a failed one.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use redis::AsyncConnectionConfig;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::super::epoch::ServerEpoch;
use super::conn::Conn;
use super::source::Source;
use crate::error::ErrorKind;

/// The first wait after a failed connect.
pub(super) const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// The longest wait between connects.
const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// The connection in use, and how many calls in a row timed out on it.
#[derive(Clone)]
pub(crate) struct HeldConn {
    pub(crate) id: u64,
    pub(crate) conn: Conn,
    pub(super) timeouts: Arc<AtomicU32>,
}

/// The shared part of a [`Link`](super::Link).
pub(crate) struct Inner {
    pub(crate) source: Source,
    pub(super) host: Arc<str>,
    pub(crate) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) config: AsyncConnectionConfig,
    pub(super) state: Mutex<State>,
    pub(super) changed: Notify,
    pub(super) pinging: AtomicBool,
    pub(super) next_id: AtomicU64,
    /// The server's epoch, told of every new connection, whose first calls
    /// then check the server's identity (see `epoch.rs`); unset on a
    /// cluster.
    pub(super) epoch: OnceLock<Arc<ServerEpoch>>,
    /// The store's watch was started (see `watch.rs`).
    pub(super) watch_started: AtomicBool,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) held: Option<HeldConn>,
    pub(super) connecting: bool,
    /// Bumped whenever a connect ends, so waiters see that it did.
    pub(super) attempts: u64,
    /// No connect before this instant (backoff after a failure).
    pub(super) retry_at: Option<Instant>,
    pub(super) backoff: Duration,
    pub(super) last_error: Option<(ErrorKind, Arc<str>)>,
    /// When a cluster connection was last replaced in the background.
    pub(super) renewed_at: Option<Instant>,
}

impl Inner {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        crate::lock::lock(&self.state)
    }
}

/// The next connect waits the backoff, which doubles up to [`MAX_BACKOFF`].
pub(super) fn backoff(state: &mut State) {
    state.retry_at = Some(Instant::now() + state.backoff);
    state.backoff = (state.backoff * 2).min(MAX_BACKOFF);
}
