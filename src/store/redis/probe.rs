//! The circuit breaker's probe, sent in a task of its own.
//!
//! A probe of a store that hangs (a frozen primary, a blackholed route) takes
//! the whole store timeout. Awaited by the check that took it, it would hold
//! that check, and its client, for the timeout once per cool-down: a few
//! requests a second, each waiting the timeout, on every instance, for as
//! long as the store hangs. Under load that is a fixed share of each
//! second's requests (a load generator that keeps its connections busy
//! counts such a wait as the requests the connection could have sent
//! meanwhile), the very cost the breaker is there to remove.
//!
//! So the probe's call runs in a task of its own, bounded by the store
//! timeout, and tells the breaker how it went when it ends; the check that
//! took the probe waits for it at most [`PROBE_WAIT`]. A store that answers
//! within that gives the check its decision (as after an outage, when the
//! probe finds the store back); otherwise the check fails with
//! [`Error::Timeout`] of that length, and the probe goes on without it. A
//! probe answered after its check gave up has spent that check's tokens, as
//! a call that times out may: it errs on the side of limiting.

use std::future::Future;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::error::{Error, ErrorKind};
use crate::store::breaker::ProbeGuard;

/// The longest a check waits for the probe it took: far above a store's
/// round trip when it is healthy, far below its timeout.
pub(crate) const PROBE_WAIT: Duration = Duration::from_millis(10);

/// Runs `call`, the probe's store call (bounded by the store timeout), in a
/// task of its own, whose outcome closes the breaker or starts its next
/// cool-down through `probe`. Waits for the outcome at most `wait`.
pub(crate) async fn detached<T, C>(probe: ProbeGuard, call: C, wait: Duration) -> Result<T, Error>
where
    T: Send + 'static,
    C: Future<Output = Result<T, Error>> + Send + 'static,
{
    let (answer, answered) = oneshot::channel();
    tokio::spawn(async move {
        let result = call.await;
        // The breaker first: the check that gets this answer finds it
        // closed or open already.
        probe.done(result.is_ok());
        // A check that stopped waiting no longer listens.
        let _ = answer.send(result);
    });
    match tokio::time::timeout(wait, answered).await {
        Ok(Ok(result)) => result,
        // The task ended without an answer (its runtime shut down): its
        // guard counted the probe as failed.
        Ok(Err(_)) => Err(Error::store(
            ErrorKind::Server,
            "the circuit breaker's probe was dropped",
        )),
        Err(_) => Err(Error::Timeout(wait)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::CircuitBreaker;
    use crate::store::breaker::{Admit, Breaker};

    /// An open breaker whose probe is due, and the probe.
    async fn probing() -> (Arc<Breaker>, ProbeGuard) {
        let breaker = Arc::new(Breaker::new(CircuitBreaker::new(), "test"));
        for _ in 0..3 {
            breaker.failure(tokio::time::Instant::now());
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        let Admit::Probe(probe) = breaker.admit() else {
            panic!("no probe")
        };
        (breaker, probe)
    }

    #[tokio::test(start_paused = true)]
    async fn a_prompt_answer_reaches_the_check_and_closes_the_breaker() {
        let (breaker, probe) = probing().await;
        let call = async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok(7)
        };
        assert_eq!(detached(probe, call, PROBE_WAIT).await.unwrap(), 7);
        assert!(breaker.is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_store_holds_the_check_for_the_short_wait_only() {
        let (breaker, probe) = probing().await;
        let timeout = Duration::from_millis(300);
        let call = async move {
            tokio::time::sleep(timeout).await;
            Err::<(), _>(Error::Timeout(timeout))
        };
        let start = tokio::time::Instant::now();
        let err = detached(probe, call, PROBE_WAIT).await.unwrap_err();
        assert!(
            matches!(err, Error::Timeout(t) if t == PROBE_WAIT),
            "{err:?}"
        );
        assert_eq!(start.elapsed(), PROBE_WAIT);
        // The probe goes on: no second probe while it runs, and when it
        // fails the breaker cools down again.
        assert!(matches!(breaker.admit(), Admit::Reject(_)));
        tokio::time::sleep(timeout).await;
        assert!(!breaker.is_closed());
        assert!(breaker.refusing().is_some(), "no cool-down after the probe");
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_answer_still_closes_the_breaker() {
        let (breaker, probe) = probing().await;
        let call = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(())
        };
        assert!(matches!(
            detached(probe, call, PROBE_WAIT).await,
            Err(Error::Timeout(_))
        ));
        assert!(!breaker.is_closed());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(breaker.is_closed());
    }
}
