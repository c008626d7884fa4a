//! One connect, a task of its own ([`connect`]), and the guard that ends it
//! as a failed one however its task ends ([`Connecting`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::super::failure::{AtHost, kind_of};
use super::source::Source;
use super::state::{HeldConn, Inner, MIN_BACKOFF, backoff};
use crate::error::ErrorKind;

/// Spawns the connect `renew` began, if it did. Never with the state locked:
/// a runtime shutting down drops the task at once, and its guard locks the
/// state.
pub(super) fn spawn_connect(connecting: Option<Connecting>) {
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
pub(super) struct Connecting {
    inner: Option<Arc<Inner>>,
}

impl Connecting {
    pub(super) fn new(inner: &Arc<Inner>) -> Self {
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

/// One connect, run as a task of its own so that it completes even when the
/// call that started it has given up.
pub(super) async fn connect(mut connecting: Connecting) {
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
            state.held = Some(HeldConn {
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
