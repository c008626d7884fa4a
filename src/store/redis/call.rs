//! How one call of a [`RedisStore`] runs: on the held connection within the
//! store timeout, retried once on a fresh connection if that one broke,
//! behind the circuit breaker (whose probe runs in a task of its own, see
//! `probe.rs`), and reported.

use std::future::Future;
use std::sync::Arc;

use redis::RedisError;
use tokio::time::Instant;

use super::connection::Conn;
use super::encode::Batch;
use super::failure::{classify, is_connection_error};
use super::probe::{self, PROBE_WAIT};
use super::script::Script;
use super::store::{RedisStore, STORE};
use super::watch;
use crate::decision::Decision;
use crate::error::Error;
use crate::observe;
use crate::store::breaker::{Admit, ProbeGuard};

impl RedisStore {
    #[cfg(feature = "test-util")]
    pub(super) fn script_for(&self, clock: Option<u64>) -> &Script {
        match clock {
            Some(_) => &self.inner.test_script,
            None => &self.inner.script,
        }
    }

    #[cfg(not(feature = "test-util"))]
    pub(super) fn script_for(&self, _clock: Option<u64>) -> &Script {
        &self.inner.script
    }

    /// The decisions of `batch` in the script's `reply`; a reply that does
    /// not read is a store error. Read within the call
    /// ([`admitted_reading`](Self::admitted_reading)), which reports it and
    /// counts it as the call's failure.
    pub(super) fn read(&self, batch: &Batch, reply: &[i64]) -> Result<Vec<(Decision, u64)>, Error> {
        batch.outcomes(reply)
    }

    /// The one decision of `batch`, a batch of one check, in the script's
    /// `reply`.
    pub(super) fn read_one(&self, batch: &Batch, reply: &[i64]) -> Result<(Decision, u64), Error> {
        self.read(batch, reply)?
            .pop()
            .ok_or_else(|| Error::store(crate::ErrorKind::Server, "empty reply from the script"))
    }

    /// The breaker's probe: `batch`'s script call in a task of its own,
    /// bounded by the store timeout, which this check waits for at most
    /// [`PROBE_WAIT`] (see `probe.rs`); `once`: a call that gives tokens
    /// back (see `Conn::for_call`). A reply that does not read fails the
    /// probe.
    pub(super) async fn send_probe(
        &self,
        probe: ProbeGuard,
        batch: Arc<Batch>,
        clock: Option<u64>,
        once: bool,
    ) -> Result<(Decision, u64), Error> {
        let store = self.clone();
        let call = async move {
            let script = store.script_for(clock);
            let batch = &batch;
            let started = Instant::now();
            let result = store
                .bounded(
                    |conn| async move { batch.run(&mut conn.for_call(once)?, script).await },
                    true,
                    None,
                )
                .await
                .and_then(|reply| store.read_one(batch, &reply));
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

    /// Runs `op` behind the circuit breaker, reads its reply with `read`,
    /// and reports how it went (the test-clock calls; checks and resets
    /// never take the probe inline).
    #[cfg(feature = "test-util")]
    pub(super) async fn guarded<T, U, F, Fut>(
        &self,
        op: F,
        read: impl FnOnce(T) -> Result<U, Error>,
    ) -> Result<U, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        self.admitted_reading(self.inner.breaker.admit(), 1, None, op, read)
            .await
    }

    /// Runs `op` as the breaker's `admit` says, and reports how it went. A
    /// failure counts once per check of the call (`checks`) towards opening
    /// the breaker; with 0 the callers count their own outcomes (a batch's
    /// checks, see `batched`). The call is timed out at `deadline`, or the
    /// store timeout after it starts: a check sent by its caller (`batched`)
    /// ends at the caller's own deadline, here, where a timeout still tells
    /// the connection (`Link::timed_out`).
    pub(super) async fn admitted<T, F, Fut>(
        &self,
        admit: Admit,
        checks: usize,
        deadline: Option<Instant>,
        op: F,
    ) -> Result<T, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        self.admitted_reading(admit, checks, deadline, op, Ok).await
    }

    /// [`admitted`](Self::admitted) for a call whose reply `read` turns into
    /// its outcome. A reply that does not read (a malformed script reply)
    /// fails the call: for the breakers, the probe and the reports as for
    /// the caller. The connection worked, but a server that answers what
    /// no script sends cannot decide, and while it does, checks should go
    /// to the store-error policy at once rather than wait for garbage.
    pub(super) async fn admitted_reading<T, U, F, Fut, R>(
        &self,
        admit: Admit,
        checks: usize,
        deadline: Option<Instant>,
        op: F,
        read: R,
    ) -> Result<U, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
        R: FnOnce(T) -> Result<U, Error>,
    {
        if let Admit::Reject(retry_in) = admit {
            let err = Error::CircuitOpen { retry_in };
            observe::store_error(STORE, &err, &self.inner.errors);
            return Err(err);
        }
        let started = Instant::now();
        // The timeout is at most 60 s (checked when the store is built), so
        // this cannot overflow.
        let deadline = deadline.unwrap_or(started + self.inner.timeout);
        let probe = matches!(admit, Admit::Probe(_));
        let result = self.bounded(op, probe, Some(deadline)).await.and_then(read);
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

    /// Runs `op` on the held connection until `deadline` (by default the
    /// store timeout from now), replacing the connection and retrying once
    /// if it is broken. A `probe` connects even while connects back off.
    pub(super) async fn bounded<T, F, Fut>(
        &self,
        op: F,
        probe: bool,
        deadline: Option<Instant>,
    ) -> Result<T, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        // The timeout is at most 60 s (checked when the store is built), so
        // this cannot overflow.
        let deadline = deadline.unwrap_or_else(|| Instant::now() + self.inner.timeout);
        let link = &self.inner.link;
        watch::start(link);
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
        let outcome = tokio::time::timeout_at(deadline, attempt).await;
        outcome.unwrap_or_else(|_| {
            if let Some(held) = &in_use {
                link.timed_out(held);
            }
            Err(Error::Timeout(self.inner.timeout))
        })
    }
}
