//! What the crate reports about itself: `tracing` events (cargo feature
//! `tracing`) and `metrics` facade counters, gauges and histograms (cargo
//! feature `metrics`). Without either feature, store errors (at most one line
//! per kind every 5 s) and the once-a-process hints (the `tonic` feature,
//! unnamed layers) go to stderr, and every other function here does nothing
//! and costs nothing. The names and labels are documented in
//! `src/docs/observability.md`.
//!
//! No event or label ever carries a client key: only policy names, key kinds
//! (`ip`, `header:x-api-key`), outcomes and error kinds.
// Which of these functions and arguments are used depends on the features:
// the Redis store reports its calls, and tracing and metrics each read part of
// what is passed.
#![cfg_attr(
    not(all(feature = "redis", feature = "tracing", feature = "metrics")),
    allow(dead_code, unused_variables)
)]

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, ErrorKind};

/// How often at most a store error of one kind is logged; the others in
/// between are counted and the count is logged with the next one.
pub(crate) const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// The outcome of one decision, as counted in `tollgate_decisions_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The store admitted the request.
    Allowed,
    /// The store denied it.
    Limited,
    /// The store failed; the in-process fallback admitted it.
    FallbackAllowed,
    /// The store failed; the in-process fallback denied it.
    FallbackLimited,
    /// No decision: the store failed and no fallback decided.
    StoreError,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::FallbackAllowed => "fallback_allowed",
            Outcome::FallbackLimited => "fallback_limited",
            Outcome::StoreError => "store_error",
        }
    }
}

/// The state of a store's circuit breaker, as the `tollgate_breaker_state`
/// gauge reports it (0, 1, 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BreakerState {
    Closed = 0,
    HalfOpen = 1,
    Open = 2,
}

/// A gRPC request reached `PeerIp` or `ClientIp` without a peer address while
/// the `tonic` feature is off (the caller makes sure this runs once a
/// process). It goes to stderr without the `tracing` feature: a server that
/// answers every call without its key must not stay silent about why.
#[cfg(not(feature = "tonic"))]
pub(crate) fn grpc_peer_needs_tonic() {
    const HINT: &str = "tollgate: a gRPC request reached PeerIp/ClientIp without a peer address. \
        tonic servers put the peer into TcpConnectInfo, which tollgate reads only with its \
        `tonic` feature: enable tollgate's `tonic` feature (features = [\"tonic\"]), or insert \
        the peer's SocketAddr into the request extensions. Until then these calls have no key \
        (the layer's MissingKey policy answers them). Said once a process.";
    #[cfg(feature = "tracing")]
    tracing::warn!(target: "tollgate", "{HINT}");
    #[cfg(not(feature = "tracing"))]
    eprintln!("{HINT}");
}

/// A layer was built with an unnamed policy (named `default`): from the
/// second one a process builds, a warning, once (on stderr without the
/// `tracing` feature): unnamed layers that take the same key share buckets,
/// so nested ones would each spend from one bucket.
pub(crate) fn unnamed_layer() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static UNNAMED: AtomicUsize = AtomicUsize::new(0);
    if UNNAMED.fetch_add(1, Ordering::Relaxed) != 1 {
        return;
    }
    const HINT: &str = "tollgate: two rate limit layers have unnamed policies (both called \
        \"default\"): with the same key they share buckets, and a request through both spends \
        twice from one. Name each layer's policy (Policy::new(\"api\", [..])). Said once a process.";
    #[cfg(feature = "tracing")]
    tracing::warn!(target: "tollgate", "{HINT}");
    #[cfg(not(feature = "tracing"))]
    eprintln!("{HINT}");
}

/// The metrics keys of one policy's decisions (`tollgate_decisions_total`
/// by `policy` and `outcome`), one per outcome, made once with the policy:
/// a decision then builds no key (no label string, no vector of labels)
/// and asks whichever recorder is current for its counter, so a recorder
/// installed later, or a local one, counts from then on. Empty without the
/// `metrics` feature.
pub(crate) struct DecisionKeys {
    #[cfg(feature = "metrics")]
    keys: [metrics::Key; 5],
}

/// What the decision counters' registrations say of where they come from
/// (what `metrics::counter!` here would say).
#[cfg(feature = "metrics")]
static DECISION_METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

impl DecisionKeys {
    /// The keys of the policy named `policy`.
    pub(crate) fn new(policy: &str) -> Self {
        #[cfg(feature = "metrics")]
        {
            let key = |outcome: Outcome| {
                metrics::Key::from_parts(
                    "tollgate_decisions_total",
                    vec![
                        metrics::Label::new("policy", policy.to_owned()),
                        metrics::Label::new("outcome", outcome.as_str()),
                    ],
                )
            };
            DecisionKeys {
                keys: [
                    Outcome::Allowed,
                    Outcome::Limited,
                    Outcome::FallbackAllowed,
                    Outcome::FallbackLimited,
                    Outcome::StoreError,
                ]
                .map(key),
            }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = policy;
            DecisionKeys {}
        }
    }

    #[cfg(feature = "metrics")]
    fn of(&self, outcome: Outcome) -> &metrics::Key {
        let [
            allowed,
            limited,
            fallback_allowed,
            fallback_limited,
            store_error,
        ] = &self.keys;
        match outcome {
            Outcome::Allowed => allowed,
            Outcome::Limited => limited,
            Outcome::FallbackAllowed => fallback_allowed,
            Outcome::FallbackLimited => fallback_limited,
            Outcome::StoreError => store_error,
        }
    }
}

/// One decision under the policy named `policy` (its keys `keys`): a
/// debug event and a counter.
#[inline]
pub(crate) fn decision(policy: &str, keys: &DecisionKeys, key_kind: &str, outcome: Outcome) {
    #[cfg(feature = "tracing")]
    tracing::debug!(
        target: "tollgate",
        policy,
        key_kind,
        outcome = outcome.as_str(),
        "rate limit decision"
    );
    #[cfg(feature = "metrics")]
    metrics::with_recorder(|recorder| {
        recorder.register_counter(keys.of(outcome), &DECISION_METADATA)
    })
    .increment(1);
    #[cfg(not(any(feature = "tracing", feature = "metrics")))]
    let _ = (policy, key_kind, outcome);
    #[cfg(not(feature = "metrics"))]
    let _ = keys;
}

/// A settlement made (`delta` tokens charged, or given back when
/// negative): a debug event and a counter of the tokens, by `settlement`,
/// `refund` or `charge`. Only once it is made: one that failed changed
/// nothing.
pub(crate) fn settled(policy: &str, delta: i64) {
    let settlement = if delta < 0 { "refund" } else { "charge" };
    let tokens = delta.unsigned_abs();
    #[cfg(feature = "tracing")]
    tracing::debug!(
        target: "tollgate",
        policy,
        settlement,
        tokens,
        "rate limit settlement"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "tollgate_settled_tokens_total",
        "policy" => policy.to_owned(),
        "settlement" => settlement
    )
    .increment(tokens);
    #[cfg(not(any(feature = "tracing", feature = "metrics")))]
    let _ = (policy, settlement, tokens);
}

/// Held tokens that ended unspent (`how`: `returned` by a report, or
/// `expired`): a counter of the tokens.
pub(crate) fn lease_tokens(store: &'static str, how: &'static str, tokens: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_lease_tokens_total", "store" => store, "end" => how)
        .increment(tokens);
    #[cfg(not(feature = "metrics"))]
    let _ = (store, how, tokens);
}

/// Tokens in a store's holds not yet reported.
pub(crate) fn lease_held(store: &'static str, tokens: u64) {
    #[cfg(feature = "metrics")]
    #[expect(clippy::cast_precision_loss, reason = "a gauge")]
    metrics::gauge!("tollgate_lease_held_tokens", "store" => store).set(tokens as f64);
    #[cfg(not(feature = "metrics"))]
    let _ = (store, tokens);
}

/// One call to a store (a check or a reset), however it ended.
pub(crate) fn store_call(store: &'static str, elapsed: Duration, error: Option<ErrorKind>) {
    #[cfg(feature = "metrics")]
    metrics::histogram!(
        "tollgate_store_call_duration_seconds",
        "store" => store,
        "result" => error.map_or("ok", ErrorKind::as_str)
    )
    .record(elapsed.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (store, elapsed, error);
}

/// A store error: counted always, logged at most once per kind per
/// [`ERROR_LOG_INTERVAL`] (see [`LogThrottle`]).
pub(crate) fn store_error(store: &'static str, error: &Error, throttle: &LogThrottle) {
    let kind = error.kind();
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "tollgate_store_errors_total",
        "store" => store,
        "kind" => kind.as_str()
    )
    .increment(1);
    if let Some(suppressed) = throttle.admit(kind) {
        #[cfg(feature = "tracing")]
        tracing::warn!(
            target: "tollgate",
            store,
            kind = kind.as_str(),
            suppressed,
            "rate limit store error: {error}"
        );
        // Without `tracing` or `metrics` an outage would go unseen: one
        // line on stderr, at the same pace.
        #[cfg(not(any(feature = "tracing", feature = "metrics")))]
        eprintln!("{}", stderr_line(store, error, suppressed));
        #[cfg(all(not(feature = "tracing"), feature = "metrics"))]
        let _ = suppressed;
    }
    #[cfg(not(any(feature = "tracing", feature = "metrics")))]
    let _ = (store, kind);
}

/// The stderr line of a store error when neither `tracing` nor `metrics`
/// reports it: what failed, how many like it were not printed since, and
/// how to report them properly.
#[cfg_attr(any(feature = "tracing", feature = "metrics"), allow(dead_code))]
fn stderr_line(store: &str, error: &Error, suppressed: u64) -> String {
    let mut line = format!("tollgate: rate limit store ({store}) error: {error}");
    if suppressed > 0 {
        line.push_str(&format!(
            " ({suppressed} more of this kind since the last line)"
        ));
    }
    line.push_str(
        " [at most one line per kind every 5 s; enable tollgate's `tracing` or `metrics` \
         feature to report store errors there instead]",
    );
    line
}

/// The circuit breaker changed state.
pub(crate) fn breaker(store: &'static str, state: BreakerState, detail: BreakerDetail) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tollgate_breaker_state", "store" => store).set(state as u8 as f64);
    #[cfg(feature = "tracing")]
    match (state, detail) {
        (BreakerState::Open, BreakerDetail::Opened { failures, probe_in }) => tracing::warn!(
            target: "tollgate",
            store,
            failures,
            probe_in_ms = probe_in.as_millis() as u64,
            "rate limit store circuit breaker opened: answering at once without the store"
        ),
        (BreakerState::Open, BreakerDetail::ProbeFailed { probe_in }) => tracing::debug!(
            target: "tollgate",
            store,
            probe_in_ms = probe_in.as_millis() as u64,
            "rate limit store probe failed; circuit breaker stays open"
        ),
        (BreakerState::HalfOpen, _) => tracing::debug!(
            target: "tollgate",
            store,
            "rate limit store circuit breaker half-open: one probe goes through"
        ),
        (BreakerState::Closed, _) => tracing::info!(
            target: "tollgate",
            store,
            "rate limit store circuit breaker closed: the store answers again"
        ),
        (BreakerState::Open, BreakerDetail::None) => {}
    }
    #[cfg(not(any(feature = "tracing", feature = "metrics")))]
    let _ = (store, state, detail);
}

/// What a breaker transition reports besides its new state.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) enum BreakerDetail {
    None,
    Opened { failures: u32, probe_in: Duration },
    ProbeFailed { probe_in: Duration },
}

/// A denial answered from the local deny cache, without the store.
pub(crate) fn deny_cache_hit(store: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_deny_cache_hits_total", "store" => store).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = store;
}

/// The in-process fallback started deciding (`active`) or stopped.
pub(crate) fn fallback(active: bool, error: Option<&Error>) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tollgate_fallback_active").set(if active { 1.0 } else { 0.0 });
    #[cfg(feature = "tracing")]
    if active {
        match error {
            Some(error) => tracing::warn!(
                target: "tollgate",
                kind = error.kind().as_str(),
                "rate limit store unavailable, deciding with the in-process fallback: {error}"
            ),
            None => tracing::warn!(
                target: "tollgate",
                "rate limit store unavailable, deciding with the in-process fallback"
            ),
        }
    } else {
        tracing::info!(
            target: "tollgate",
            "rate limit store answers again; the in-process fallback stopped deciding"
        );
    }
    #[cfg(not(any(feature = "tracing", feature = "metrics")))]
    let _ = (active, error);
}

/// Lets one log line per error kind through per [`ERROR_LOG_INTERVAL`].
#[derive(Debug, Default)]
pub(crate) struct LogThrottle {
    kinds: Mutex<Vec<(ErrorKind, Instant, u64)>>,
}

impl LogThrottle {
    /// `Some(n)` when an error of `kind` may be logged now, `n` being how many
    /// were suppressed since the last one logged; `None` to suppress it.
    pub(crate) fn admit(&self, kind: ErrorKind) -> Option<u64> {
        let now = Instant::now();
        let mut kinds = crate::lock::lock(&self.kinds);
        match kinds.iter_mut().find(|(k, _, _)| *k == kind) {
            None => {
                kinds.push((kind, now, 0));
                Some(0)
            }
            Some((_, last, suppressed)) if now.duration_since(*last) >= ERROR_LOG_INTERVAL => {
                let n = *suppressed;
                *last = now;
                *suppressed = 0;
                Some(n)
            }
            Some((_, _, suppressed)) => {
                *suppressed += 1;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A policy's decision keys are made once, and each decision counts
    /// with the recorder of the moment: none, then one, then another.
    #[cfg(feature = "metrics")]
    #[test]
    fn decisions_count_with_the_recorder_of_the_moment() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};

        fn counts(recorder: &DebuggingRecorder) -> Vec<(String, u64)> {
            let mut out: Vec<(String, u64)> = recorder
                .snapshotter()
                .snapshot()
                .into_vec()
                .into_iter()
                .filter_map(|(key, _, _, value)| {
                    let key = key.key();
                    let labels: Vec<String> = key
                        .labels()
                        .map(|l| format!("{}={}", l.key(), l.value()))
                        .collect();
                    match value {
                        DebugValue::Counter(n) => {
                            Some((format!("{}{{{}}}", key.name(), labels.join(",")), n))
                        }
                        _ => None,
                    }
                })
                .collect();
            out.sort();
            out
        }

        let keys = DecisionKeys::new("p");
        // No recorder yet: counted nowhere.
        decision("p", &keys, "ip", Outcome::Allowed);
        let first = DebuggingRecorder::new();
        metrics::with_local_recorder(&first, || {
            decision("p", &keys, "ip", Outcome::Allowed);
            decision("p", &keys, "ip", Outcome::Allowed);
            decision("p", &keys, "ip", Outcome::StoreError);
        });
        let second = DebuggingRecorder::new();
        metrics::with_local_recorder(&second, || {
            decision("p", &keys, "ip", Outcome::FallbackLimited);
        });
        let name =
            |outcome: &str| format!("tollgate_decisions_total{{policy=p,outcome={outcome}}}");
        assert_eq!(
            counts(&first),
            [(name("allowed"), 2), (name("store_error"), 1)]
        );
        assert_eq!(counts(&second), [(name("fallback_limited"), 1)]);
    }

    #[test]
    fn the_stderr_line_names_the_store_the_error_and_what_to_enable() {
        let error = Error::store(ErrorKind::Connection, "Redis at cache:6379: refused");
        let line = stderr_line("redis", &error, 3);
        assert!(
            line.starts_with("tollgate: rate limit store (redis) error: "),
            "{line}"
        );
        assert!(line.contains("Redis at cache:6379: refused"), "{line}");
        assert!(line.contains("3 more of this kind"), "{line}");
        assert!(line.contains("`tracing` or `metrics`"), "{line}");
        assert!(!stderr_line("redis", &error, 0).contains("more of this kind"));
    }

    #[tokio::test(start_paused = true)]
    async fn one_line_per_kind_per_interval_with_the_count_of_the_rest() {
        let t = LogThrottle::default();
        assert_eq!(t.admit(ErrorKind::Timeout), Some(0));
        for _ in 0..41 {
            assert_eq!(t.admit(ErrorKind::Timeout), None);
        }
        // Another kind has its own budget.
        assert_eq!(t.admit(ErrorKind::Connection), Some(0));
        tokio::time::advance(ERROR_LOG_INTERVAL).await;
        assert_eq!(t.admit(ErrorKind::Timeout), Some(41));
        assert_eq!(t.admit(ErrorKind::Timeout), None);
        assert_eq!(t.admit(ErrorKind::Connection), Some(0));
    }
}
