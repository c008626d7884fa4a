//! A primary killed under load, for the cluster and Sentinel tests: what the
//! callers saw (errors, how long until checks resumed) and what the limit
//! became (over-admission against the writes the new primary never got).
//!
//! ## The measurement
//!
//! One hot key has a bucket of [`CAPACITY`] tokens that refills so slowly
//! (over 30 days) that the run adds well under one token; so, exactly,
//! `admitted + remaining_at_the_end = CAPACITY + refill`. Tasks check it
//! (and other keys, on every node) before, during and after the failover.
//!
//! - **excess** = `admitted + remaining_at_the_end - CAPACITY - refill`: what
//!   the failover admitted beyond the bucket. Redis replicates asynchronously,
//!   so a write the old primary acknowledged but had not yet sent to its
//!   replica is lost, and the tokens it spent come back.
//! - **lost_seen** = the highest `remaining` answered after the kill, plus
//!   one, minus the lowest `remaining` answered before it: how many tokens the
//!   promoted replica had that the old primary had already handed out.
//!
//! Only acknowledged writes that were lost can be admitted twice, so
//! `excess <= lost_seen` (+ rounding) must hold. A retried call that reached
//! Redis twice spends twice and makes the excess smaller, never larger.
//!
//! `FAILOVER_DEBUG=1` prints the calls per 250 ms window and every error
//! after checks resumed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tollgate::{ErrorKind, Quota, RateLimiter};

/// The hot key's bucket.
pub const CAPACITY: u64 = 100_000;
/// How long the load runs before the kill.
const BEFORE: Duration = Duration::from_millis(1500);
/// How long the load keeps running after checks resumed.
const AFTER: Duration = Duration::from_secs(3);

/// `CAPACITY` tokens refilled over 30 days: under 0.04 tokens a second.
pub fn quota() -> Quota {
    Quota::new(CAPACITY, Duration::from_secs(30 * 24 * 3600)).unwrap()
}

#[derive(Clone, Debug)]
struct Call {
    /// Which limiter (application instance) made the call.
    limiter: usize,
    start: Duration,
    end: Duration,
    hot: bool,
    outcome: Result<(bool, u64), (ErrorKind, bool, String)>,
}

/// What a failover under load looked like.
#[derive(Debug)]
pub struct Report {
    pub calls: usize,
    pub errors: usize,
    /// Per kind: how many, and the first message.
    pub error_kinds: Vec<(ErrorKind, usize, String)>,
    pub kill_to_promoted: Duration,
    /// Until every limiter decided on the hot key again (each store has its
    /// own breaker, which lets one probe through at most every second).
    pub kill_to_resumed: Duration,
    pub promoted_to_resumed: Duration,
    pub admitted: u64,
    pub remaining_at_end: u64,
    pub refill: f64,
    pub excess: i64,
    pub lost_seen: i64,
}

/// Hammers `hot` and `others` through `limiters` (which all use [`quota`]),
/// calls `kill` (kill the primary of `hot`) after a while and then `promoted`
/// (blocking: wait until a replica took over), keeps going until checks on
/// `hot` resumed and a while longer, then checks the rules above. `clock`
/// reads a surviving server's `TIME` in microseconds.
pub async fn kill_under_load(
    what: &str,
    limiters: &[RateLimiter],
    hot: &str,
    others: &[String],
    clock: impl Fn() -> u64 + Send + Sync + 'static,
    kill: impl FnOnce() + Send + 'static,
    promoted: impl FnOnce() + Send + 'static,
) -> Report {
    let clock = Arc::new(clock);
    let read_clock = |clock: &Arc<dyn Fn() -> u64 + Send + Sync>| {
        let clock = Arc::clone(clock);
        tokio::task::spawn_blocking(move || clock())
    };
    let clock: Arc<dyn Fn() -> u64 + Send + Sync> = clock;
    let t_first = read_clock(&clock).await.unwrap();
    let t0 = Instant::now();
    let calls = Arc::new(Mutex::new(Vec::<Call>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let which = i % limiters.len();
            let limiter = limiters[which].clone();
            let (calls, stop) = (Arc::clone(&calls), Arc::clone(&stop));
            let hot = hot.to_string();
            let others = others.to_vec();
            tokio::spawn(async move {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    // Every other call on the hot key, the rest spread over
                    // the other keys (other nodes).
                    let key = match n % 2 {
                        0 => hot.as_str(),
                        _ => others[(n / 2 + i) % others.len()].as_str(),
                    };
                    let start = t0.elapsed();
                    let outcome = match limiter.check(key, 1).await {
                        Ok(d) => Ok((d.allowed(), d.remaining())),
                        Err(e) => Err((e.kind(), e.is_store_error(), e.to_string())),
                    };
                    let failed = outcome.is_err();
                    calls.lock().unwrap().push(Call {
                        limiter: which,
                        start,
                        end: t0.elapsed(),
                        hot: key == hot,
                        outcome,
                    });
                    if failed {
                        // An open breaker answers at once: pace the loop.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            })
        })
        .collect();

    tokio::time::sleep(BEFORE).await;
    // After the kill returned: calls that start later cannot reach the old
    // primary.
    tokio::task::spawn_blocking(kill).await.unwrap();
    let killed_at = t0.elapsed();
    tokio::task::spawn_blocking(promoted).await.unwrap();
    let promoted_at = t0.elapsed();
    // Until every limiter has decided on the hot key again: a check that
    // started after the kill succeeded. Not a straggler, though: a call
    // answered while calls of the same limiter started after it already
    // failed (the breaker opened while it was under way, and only its
    // probe closes it again) shows the store answering late, not resumed.
    let resumed = |calls: &[Call]| -> Vec<Option<Duration>> {
        (0..limiters.len())
            .map(|l| {
                let mut answered: Vec<&Call> = calls
                    .iter()
                    .filter(|c| c.limiter == l && c.hot && c.start >= killed_at)
                    .filter(|c| c.outcome.is_ok())
                    .collect();
                answered.sort_by_key(|c| c.end);
                answered
                    .into_iter()
                    .find(|ok| {
                        !calls.iter().any(|e| {
                            e.limiter == l
                                && e.outcome.is_err()
                                && e.start > ok.start
                                && e.end <= ok.end
                        })
                    })
                    .map(|c| c.end)
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let resumed_per_limiter: Vec<Duration> = loop {
        let resumed: Option<Vec<Duration>> = resumed(&calls.lock().unwrap()).into_iter().collect();
        if let Some(at) = resumed {
            break at;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: checks on the hot key did not resume within 30 s of the promotion"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let resumed_at = resumed_per_limiter
        .iter()
        .copied()
        .max()
        .unwrap_or_default();
    tokio::time::sleep(AFTER.saturating_sub(t0.elapsed().saturating_sub(resumed_at))).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("a checking task panicked");
    }
    let remaining_at_end = limiters[0].peek(hot).await.expect("peek").remaining();
    let t_last = read_clock(&clock).await.unwrap();

    let calls = calls.lock().unwrap().clone();
    let errors: Vec<&Call> = calls.iter().filter(|c| c.outcome.is_err()).collect();
    let mut error_kinds: Vec<(ErrorKind, usize, String)> = Vec::new();
    for c in &errors {
        let Err((kind, store_error, message)) = &c.outcome else {
            unreachable!()
        };
        assert!(
            store_error,
            "{what}: a failover must only cause store errors, got {kind:?}: {message}"
        );
        match error_kinds.iter_mut().find(|(k, _, _)| k == kind) {
            Some((_, n, _)) => *n += 1,
            None => error_kinds.push((*kind, 1, message.clone())),
        }
    }
    if std::env::var("FAILOVER_DEBUG").is_ok() {
        println!("killed {killed_at:?} promoted {promoted_at:?} resumed {resumed_at:?}");
        let mut windows: std::collections::BTreeMap<u128, [usize; 4]> = Default::default();
        for c in &calls {
            let w = windows.entry(c.start.as_millis() / 250).or_default();
            w[usize::from(c.hot) * 2 + usize::from(c.outcome.is_err())] += 1;
        }
        for (w, [ok, err, hot_ok, hot_err]) in windows {
            println!(
                "{:>6} ms: others ok {ok:>4} err {err:>4} | hot ok {hot_ok:>4} err {hot_err:>4}",
                w * 250
            );
        }
        for c in calls
            .iter()
            .filter(|c| c.outcome.is_err() && c.start > resumed_at)
        {
            println!("late: {c:?}");
        }
    }
    // Once a limiter decided again, its breaker is closed and the new
    // primary serves the slot: nothing it starts afterwards fails. A call
    // started within GRACE of that first answer ran alongside it, routed
    // before the answer came (seen once: a check started 1.4 µs after it,
    // on another key, waited its timeout), so it does not count.
    const GRACE: Duration = Duration::from_millis(50);
    let late: Vec<&&Call> = errors
        .iter()
        .filter(|c| c.start > resumed_per_limiter[c.limiter] + GRACE)
        .collect();
    assert!(
        late.is_empty(),
        "{what}: {} errors after checks resumed ({resumed_per_limiter:?}), first: {:?}",
        late.len(),
        late.first()
    );
    let hot_allowed = |c: &&Call| c.hot && matches!(c.outcome, Ok((true, _)));
    let admitted = calls.iter().filter(hot_allowed).count() as u64;
    let remaining = |c: &Call| match c.outcome {
        Ok((_, r)) => r,
        Err(_) => unreachable!(),
    };
    // Every admission of a call that started before the kill came from the
    // old primary, even if its caller saw it after `killed_at` (taken a few
    // milliseconds after the signal): the calls time out within 1 s, and no
    // replica is promoted that soon (cluster node timeout 1.5 s, sentinels'
    // down-after 1 s plus their election).
    let lowest_before = calls
        .iter()
        .filter(hot_allowed)
        .filter(|c| c.start < killed_at)
        .map(remaining)
        .min()
        .expect("admissions before the kill");
    let highest_after = calls
        .iter()
        .filter(hot_allowed)
        .filter(|c| c.start >= killed_at)
        .map(remaining)
        .max()
        .expect("admissions after the failover");
    let refill = CAPACITY as f64 * (t_last - t_first) as f64 / (30.0 * 24.0 * 3600.0 * 1e6);
    let excess = (admitted + remaining_at_end) as i64 - CAPACITY as i64 - refill.floor() as i64;
    let lost_seen = (highest_after as i64 + 1 - lowest_before as i64).max(0);
    let report = Report {
        calls: calls.len(),
        errors: errors.len(),
        error_kinds,
        kill_to_promoted: promoted_at - killed_at,
        kill_to_resumed: resumed_at - killed_at,
        promoted_to_resumed: resumed_at.saturating_sub(promoted_at),
        admitted,
        remaining_at_end,
        refill,
        excess,
        lost_seen,
    };
    println!("{what}: {report:#?}");
    assert!(
        remaining_at_end > 0,
        "{what}: the hot bucket ran dry; make CAPACITY larger: {report:?}"
    );
    // + 1: remaining is rounded down, and the refill's fraction.
    assert!(
        report.excess <= report.lost_seen + 1,
        "{what}: admitted more than the lost writes explain: {report:?}"
    );
    report
}
