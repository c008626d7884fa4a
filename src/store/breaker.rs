//! [`CircuitBreaker`]: when a store keeps failing, stop asking it, answer at
//! once, and let one probe through now and then.
//!
//! A store that hangs (a frozen primary, a blackholed route) would otherwise
//! make every request wait the store timeout; behind the breaker it costs one
//! call per probe instead, which a Redis store sends in the background.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ConfigError;
use crate::observe::{self, BreakerDetail, BreakerState};

/// Consecutive failures that open the breaker, by default.
pub const DEFAULT_BREAKER_FAILURES: u32 = 3;
/// The first cool-down after the breaker opens, by default.
pub const DEFAULT_FIRST_PROBE: Duration = Duration::from_millis(250);
/// The longest cool-down between probes, by default.
pub const DEFAULT_MAX_COOLDOWN: Duration = Duration::from_millis(500);

/// The circuit breaker of a store: after [`failures`](Self::failures)
/// consecutive failures or timeouts it opens, and checks fail at once with
/// [`Error::CircuitOpen`](crate::Error::CircuitOpen) (so the layer's
/// store-error policy or fallback applies without any wait). After a cool-down
/// exactly one check goes through as a probe; if it succeeds the breaker closes,
/// otherwise the cool-down doubles, up to [`max_cooldown`](Self::max_cooldown).
/// Each cool-down is shortened by a random jitter of up to half, so instances
/// do not probe in step.
///
/// A [`RedisStore`](crate::RedisStore) sends the probe's call in a task of its
/// own, bounded by the store timeout, and the check that took the probe waits
/// for it at most 10 ms: a store that answers by then gives it its decision,
/// otherwise it fails with [`Error::Timeout`](crate::Error::Timeout) of 10 ms
/// and the probe goes on without it. So a store that hangs holds no request
/// for the store timeout once the breaker is open.
///
/// Defaults: open after 3 consecutive failures, first probe after 250 ms,
/// cool-downs of at most 500 ms. The cap is short on purpose: once the store is
/// back, decisions resume within a cool-down (the probe connects at once, even
/// while reconnects back off), so within about half a second, while probing
/// costs one call to the store per cool-down.
///
/// ```
/// use std::time::Duration;
/// use tollgate::RedisStore;
/// use tollgate::store::CircuitBreaker;
///
/// # fn main() -> Result<(), tollgate::ConfigError> {
/// let store = RedisStore::builder()
///     .url("redis://127.0.0.1:6379")
///     .circuit_breaker(
///         CircuitBreaker::new()
///             .failures(5)
///             .first_probe(Duration::from_millis(500))
///             .max_cooldown(Duration::from_secs(5)),
///     )
///     .build()?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct CircuitBreaker {
    enabled: bool,
    failures: u32,
    first_probe: Duration,
    max_cooldown: Duration,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self::new()
    }
}

impl CircuitBreaker {
    /// The default breaker (see the type docs).
    pub fn new() -> Self {
        CircuitBreaker {
            enabled: true,
            failures: DEFAULT_BREAKER_FAILURES,
            first_probe: DEFAULT_FIRST_PROBE,
            max_cooldown: DEFAULT_MAX_COOLDOWN,
        }
    }

    /// No breaker: every check asks the store and waits up to its timeout.
    pub fn disabled() -> Self {
        CircuitBreaker {
            enabled: false,
            ..Self::new()
        }
    }

    /// Consecutive failures or timeouts that open the breaker (at least 1).
    pub fn failures(mut self, failures: u32) -> Self {
        self.failures = failures;
        self
    }

    /// The cool-down before the first probe (at least 1 ms).
    pub fn first_probe(mut self, cooldown: Duration) -> Self {
        self.first_probe = cooldown;
        self
    }

    /// The longest cool-down between probes (at least the first one, at most
    /// 10 minutes).
    pub fn max_cooldown(mut self, cooldown: Duration) -> Self {
        self.max_cooldown = cooldown;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.failures == 0 {
            return Err(ConfigError::store(
                "circuit breaker: failures must be at least 1 (or use CircuitBreaker::disabled())",
            ));
        }
        if self.first_probe < Duration::from_millis(1)
            || self.max_cooldown < self.first_probe
            || self.max_cooldown > Duration::from_secs(600)
        {
            return Err(ConfigError::store(format!(
                "circuit breaker: first probe {:?} must be at least 1ms and at most the \
                 maximum cool-down {:?}, itself at most 10 minutes",
                self.first_probe, self.max_cooldown
            )));
        }
        Ok(())
    }
}

const CLOSED: u8 = BreakerState::Closed as u8;
const HALF_OPEN: u8 = BreakerState::HalfOpen as u8;
const OPEN: u8 = BreakerState::Open as u8;

/// What the breaker says to one call.
#[derive(Debug)]
pub(crate) enum Admit {
    /// Closed: go ahead.
    Go,
    /// This call is the probe. Report its result with the guard.
    Probe(ProbeGuard),
    /// Open: fail at once; the next probe is due in this long.
    Reject(Duration),
}

/// A running circuit breaker, shared by the clones of one store.
#[derive(Debug)]
pub(crate) struct Breaker {
    config: CircuitBreaker,
    store: &'static str,
    state: AtomicU8,
    failures: AtomicU32,
    open: Mutex<Cooldown>,
    rng: AtomicU64,
    /// When the breaker was made: the origin of `answered`.
    epoch: Instant,
    /// Microseconds after `epoch` at which the latest call that succeeded
    /// was sent: a call sent before it that fails later (a straggler held by
    /// a dead node through a failover) says nothing of the store now, and
    /// does not count.
    answered: AtomicU64,
    /// Microseconds after `epoch` at which the latest call whose failure
    /// counted was sent: once the breaker is open, a call sent after it
    /// that succeeds shows the failures that opened it to be stragglers.
    failed: AtomicU64,
}

#[derive(Debug)]
struct Cooldown {
    until: Instant,
    length: Duration,
}

impl Breaker {
    pub(crate) fn new(config: CircuitBreaker, store: &'static str) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
            ^ (&config as *const CircuitBreaker as u64);
        Breaker {
            config,
            store,
            state: AtomicU8::new(CLOSED),
            failures: AtomicU32::new(0),
            open: Mutex::new(Cooldown {
                until: Instant::now(),
                length: config.first_probe,
            }),
            rng: AtomicU64::new(seed | 1),
            epoch: Instant::now(),
            answered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    /// Its settings.
    pub(crate) fn config(&self) -> CircuitBreaker {
        self.config
    }

    /// How long calls are still refused, without taking the probe: `Some`
    /// while the breaker cools down or a probe runs, `None` when a call may
    /// go (closed, or a probe is due, which [`admit`](Self::admit) hands out).
    pub(crate) fn refusing(&self) -> Option<Duration> {
        self.refusing_in(self.state.load(Ordering::Acquire))
    }

    /// [`refusing`](Self::refusing) in `state`.
    fn refusing_in(&self, state: u8) -> Option<Duration> {
        if !self.config.enabled {
            return None;
        }
        match state {
            CLOSED => None,
            HALF_OPEN => Some(self.config.first_probe.min(self.remaining())),
            _ => {
                let now = Instant::now();
                let until = self.cooldown().until;
                (now < until).then(|| until - now)
            }
        }
    }

    /// Whether a call may go to the store now.
    pub(crate) fn admit(self: &std::sync::Arc<Self>) -> Admit {
        // One read of the state: a breaker that opens meanwhile is not
        // probed before its cool-down.
        let state = self.state.load(Ordering::Acquire);
        if let Some(retry_in) = self.refusing_in(state) {
            return Admit::Reject(retry_in);
        }
        if !self.config.enabled || state == CLOSED {
            return Admit::Go;
        }
        // Open with its cool-down over: exactly one caller wins the probe.
        if self
            .state
            .compare_exchange(OPEN, HALF_OPEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            observe::breaker(self.store, BreakerState::HalfOpen, BreakerDetail::None);
            Admit::Probe(ProbeGuard {
                breaker: Some(std::sync::Arc::clone(self)),
            })
        } else {
            Admit::Reject(self.config.first_probe)
        }
    }

    /// Whether a call that must not be the probe may go to the store: a
    /// batch, whose checks would all wait for the probe's answer. Closed (or
    /// disabled): go ahead; otherwise refused, also when a probe is due,
    /// which is left to a check sent on its own.
    pub(crate) fn admit_without_probe(&self) -> Admit {
        if !self.config.enabled || self.is_closed() {
            return Admit::Go;
        }
        Admit::Reject(self.refusing().unwrap_or(Duration::ZERO))
    }

    /// A call (not a probe) sent at `sent` succeeded.
    ///
    /// Stragglers are often heard just before the success that would have
    /// masked them: when a hung call times out, its checks and those queued
    /// with it fail a moment before the next call, on a fresh connection or
    /// to a promoted node, answers the checks queued after them. If their
    /// failures opened the breaker, this success of a call sent after all of
    /// them closes it again, as if it had been heard first: otherwise checks
    /// would be refused for a whole cool-down while the store answers.
    pub(crate) fn success(&self, sent: Instant) {
        let sent = self.since_epoch(sent);
        self.answered.fetch_max(sent, Ordering::AcqRel);
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        // Half-open, the probe decides.
        if self.state.load(Ordering::Acquire) == OPEN
            && sent > self.failed.load(Ordering::Acquire)
            && self
                .state
                .compare_exchange(OPEN, CLOSED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.cooldown().length = self.config.first_probe;
            observe::breaker(self.store, BreakerState::Closed, BreakerDetail::None);
        }
    }

    /// A call (not a probe) sent at `sent` failed.
    pub(crate) fn failure(&self, sent: Instant) {
        self.failures_of(1, sent);
    }

    /// A call sent at `sent` that carried `checks` checks (a batch) failed:
    /// each of them counts, as if they had failed one by one, unless a call
    /// sent after it has succeeded since (or succeeds while the breaker is
    /// open, see [`success`](Self::success)).
    pub(crate) fn failures_of(&self, checks: u32, sent: Instant) {
        let sent = self.since_epoch(sent);
        if !self.config.enabled || sent < self.answered.load(Ordering::Acquire) {
            return;
        }
        // Before the count, so that a success that finds the breaker open
        // also finds the send of every failure that opened it.
        self.failed.fetch_max(sent, Ordering::AcqRel);
        let failures = self.failures.fetch_add(checks.max(1), Ordering::AcqRel) + checks.max(1);
        if failures >= self.config.failures
            && self
                .state
                .compare_exchange(CLOSED, OPEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let probe_in = self.start_cooldown(self.config.first_probe);
            observe::breaker(
                self.store,
                BreakerState::Open,
                BreakerDetail::Opened { failures, probe_in },
            );
        }
    }

    /// Whether the breaker is closed now.
    pub(crate) fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) == CLOSED
    }

    /// Microseconds from the breaker's making to `at` (0 before it).
    fn since_epoch(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }

    fn probe_done(&self, ok: bool) {
        if ok {
            // Calls sent before the probe's answer and failing after it are
            // stragglers of the outage.
            self.answered
                .fetch_max(self.since_epoch(Instant::now()), Ordering::AcqRel);
            self.failures.store(0, Ordering::Relaxed);
            self.cooldown().length = self.config.first_probe;
            self.state.store(CLOSED, Ordering::Release);
            observe::breaker(self.store, BreakerState::Closed, BreakerDetail::None);
        } else {
            let longer = self
                .cooldown()
                .length
                .saturating_mul(2)
                .min(self.config.max_cooldown);
            let probe_in = self.start_cooldown(longer);
            self.state.store(OPEN, Ordering::Release);
            observe::breaker(
                self.store,
                BreakerState::Open,
                BreakerDetail::ProbeFailed { probe_in },
            );
        }
    }

    /// Starts a cool-down of `length`, less a random jitter of up to half.
    fn start_cooldown(&self, length: Duration) -> Duration {
        let jittered = length.mul_f64(1.0 - 0.5 * self.random());
        let mut c = self.cooldown();
        c.length = length;
        c.until = Instant::now() + jittered;
        jittered
    }

    fn remaining(&self) -> Duration {
        self.cooldown()
            .until
            .saturating_duration_since(Instant::now())
    }

    fn cooldown(&self) -> std::sync::MutexGuard<'_, Cooldown> {
        crate::lock::lock(&self.open)
    }

    /// A number in [0, 1) from a xorshift generator: jitter needs no more.
    fn random(&self) -> f64 {
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The right to probe. Dropped without a result (the call was cancelled: its
/// task dropped with its runtime, or the caller of a probe sent inline gave
/// up), it counts as a failed probe, so the breaker never stays half-open
/// waiting for an answer that will not come.
#[derive(Debug)]
pub(crate) struct ProbeGuard {
    breaker: Option<std::sync::Arc<Breaker>>,
}

impl ProbeGuard {
    pub(crate) fn done(mut self, ok: bool) {
        if let Some(b) = self.breaker.take() {
            b.probe_done(ok);
        }
    }
}

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        if let Some(b) = self.breaker.take() {
            b.probe_done(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn breaker() -> Arc<Breaker> {
        Arc::new(Breaker::new(CircuitBreaker::new(), "test"))
    }

    /// Through a failover, calls sent to the dead node before the new one
    /// answered fail after it did: they are stragglers, not news, and must
    /// not open the breaker again once the store answers.
    #[tokio::test(start_paused = true)]
    async fn failures_of_calls_sent_before_a_success_do_not_count() {
        let b = breaker();
        let early = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        b.success(Instant::now());
        for _ in 0..10 {
            b.failure(early);
        }
        assert!(b.is_closed(), "stragglers opened the breaker");
        for _ in 0..3 {
            b.failure(Instant::now());
        }
        assert!(!b.is_closed(), "fresh failures must still open it");
    }

    /// A hung call times out, with the checks queued beside it, a moment
    /// before the next call answers the checks queued after them: the
    /// stragglers are heard first and open the breaker. The success of a
    /// check sent after all of them closes it again at once, as if heard
    /// first; a success of a call sent before them does not, and fresh
    /// failures still open it.
    #[tokio::test(start_paused = true)]
    async fn a_success_sent_after_the_failures_that_opened_it_closes_the_breaker() {
        let b = breaker();
        let hung = Instant::now();
        tokio::time::advance(Duration::from_millis(6)).await;
        let queued = Instant::now();
        tokio::time::advance(Duration::from_millis(994)).await;
        for _ in 0..3 {
            b.failure(hung);
        }
        assert!(matches!(b.admit(), Admit::Reject(_)));
        b.success(queued);
        assert!(
            b.is_closed(),
            "a newer call answered, the breaker stayed open"
        );
        assert!(matches!(b.admit(), Admit::Go));
        for _ in 0..3 {
            b.failure(Instant::now());
        }
        assert!(!b.is_closed(), "fresh failures must still open it");

        let b = breaker();
        let early = Instant::now();
        tokio::time::advance(Duration::from_millis(6)).await;
        for _ in 0..3 {
            b.failure(Instant::now());
        }
        b.success(early);
        assert!(!b.is_closed(), "a call sent before the failures closed it");
        // Nor does a call sent after the failures that opened it but before
        // one that failed since.
        tokio::time::advance(Duration::from_millis(1)).await;
        let between = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        b.failure(Instant::now());
        b.success(between);
        assert!(
            !b.is_closed(),
            "a call older than the last failure closed it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_consecutive_failures_and_probes_once() {
        let b = breaker();
        for _ in 0..2 {
            assert!(matches!(b.admit(), Admit::Go));
            b.failure(Instant::now());
        }
        // A success in between resets the count.
        b.success(Instant::now());
        for _ in 0..2 {
            b.failure(Instant::now());
        }
        assert!(b.is_closed());
        b.failure(Instant::now());
        assert!(!b.is_closed());
        let Admit::Reject(wait) = b.admit() else {
            panic!("open breaker let a call through")
        };
        assert!(
            wait <= DEFAULT_FIRST_PROBE && wait >= DEFAULT_FIRST_PROBE / 2,
            "{wait:?}"
        );
        tokio::time::advance(DEFAULT_FIRST_PROBE).await;
        let Admit::Probe(probe) = b.admit() else {
            panic!("no probe after the cool-down")
        };
        // Never more than one probe in flight.
        for _ in 0..100 {
            assert!(matches!(b.admit(), Admit::Reject(_)));
        }
        probe.done(true);
        assert!(b.is_closed());
        assert!(matches!(b.admit(), Admit::Go));
    }

    #[tokio::test(start_paused = true)]
    async fn failed_probes_double_the_cooldown_up_to_the_cap() {
        let b = breaker();
        for _ in 0..3 {
            b.failure(Instant::now());
        }
        let mut expected = DEFAULT_FIRST_PROBE;
        for _ in 0..6 {
            tokio::time::advance(expected).await;
            let Admit::Probe(probe) = b.admit() else {
                panic!("no probe after {expected:?}")
            };
            probe.done(false);
            expected = (expected * 2).min(DEFAULT_MAX_COOLDOWN);
            let Admit::Reject(wait) = b.admit() else {
                panic!("closed after a failed probe")
            };
            assert!(
                wait <= expected && wait >= expected / 2,
                "{wait:?} vs {expected:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_never_takes_the_probe() {
        let b = breaker();
        assert!(matches!(b.admit_without_probe(), Admit::Go));
        for _ in 0..3 {
            b.failure(Instant::now());
        }
        assert!(matches!(b.admit_without_probe(), Admit::Reject(_)));
        // A probe is due: a batch is still refused, and leaves the probe to
        // the next call that may take it.
        tokio::time::advance(DEFAULT_FIRST_PROBE).await;
        assert!(matches!(b.admit_without_probe(), Admit::Reject(_)));
        let Admit::Probe(probe) = b.admit() else {
            panic!("a batch took the probe")
        };
        assert!(matches!(b.admit_without_probe(), Admit::Reject(_)));
        probe.done(true);
        assert!(matches!(b.admit_without_probe(), Admit::Go));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_probe_counts_as_failed() {
        let b = breaker();
        for _ in 0..3 {
            b.failure(Instant::now());
        }
        tokio::time::advance(DEFAULT_FIRST_PROBE).await;
        let Admit::Probe(probe) = b.admit() else {
            panic!("no probe")
        };
        drop(probe);
        assert!(!b.is_closed());
        tokio::time::advance(DEFAULT_MAX_COOLDOWN).await;
        assert!(matches!(b.admit(), Admit::Probe(_)));
    }

    #[test]
    fn a_disabled_breaker_never_opens_and_configs_are_checked() {
        let b = Arc::new(Breaker::new(CircuitBreaker::disabled(), "test"));
        for _ in 0..100 {
            b.failure(Instant::now());
        }
        assert!(matches!(b.admit(), Admit::Go));
        assert!(CircuitBreaker::new().failures(0).validate().is_err());
        assert!(
            CircuitBreaker::new()
                .first_probe(Duration::ZERO)
                .validate()
                .is_err()
        );
        assert!(
            CircuitBreaker::new()
                .first_probe(Duration::from_secs(2))
                .validate()
                .is_err()
        );
        assert!(CircuitBreaker::new().validate().is_ok());
    }
}
