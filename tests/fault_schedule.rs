//! Random fault schedules against real servers, checked window by window
//! (the method is in `tests/support/schedule/mod.rs`).
//!
//! Each run draws its schedules from a base seed it prints; a schedule
//! with a window over the bucket's bound fails the test and prints its
//! seed. Environment:
//!
//! - `FAULT_SCHEDULES` (20): how many standalone schedules;
//!   `FAULT_CLUSTER_SCHEDULES` (2): how many on a Redis Cluster.
//! - `FAULT_SEED=0x…`: replay that one schedule; `FAULT_BASE_SEED`: draw
//!   the run's schedules from this seed instead of the clock.
//! - `FAULT_LEASES=on|off|mixed`: every schedule's leases.
//! - `FAULT_KINDS=flushall,restart,…`: the fault kinds drawn from, and
//!   `reset` for resets (every kind, and resets, when unset).
//! - `FAULT_DURATION_MS` (3000): how long each schedule's traffic runs.
//! - `FAULT_DUMP=1`: print every operation of every schedule.
//!
//! `scripts/fault_schedules.sh` runs 500 against a chosen server and
//! prints the totals.
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use support::schedule::check::{self, Bucket};
use support::schedule::fault::FAULT_KINDS;
use support::schedule::ideal;
use support::schedule::panics;
use support::schedule::plan::{Leases, Options, Plan};
use support::schedule::report::{Report, Tally};
use support::schedule::rng::Rng;
use support::schedule::run::{self, Outcome};
use support::schedule::servers::{Standalone, Target};

/// A schedule that takes longer than its traffic and this is stuck.
const STUCK: Duration = Duration::from_secs(60);

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    let text = std::env::var(name).ok()?;
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok().map(|v| v.to_string()),
        None => Some(text.clone()),
    };
    let value = parsed.and_then(|t| t.parse().ok());
    Some(value.unwrap_or_else(|| panic!("{name}={text:?} is not a number")))
}

/// The schedules' options from the environment: the fault kinds of
/// `FAULT_KINDS` among `kinds` (all of `kinds` when it does not say), and
/// resets unless `FAULT_KINDS` leaves `reset` out.
fn options(kinds: &[&'static str], cluster: bool) -> Options {
    let leases = std::env::var("FAULT_LEASES").ok().map(|l| {
        Leases::parse(&l).unwrap_or_else(|| panic!("FAULT_LEASES={l:?}: on, off or mixed"))
    });
    let chosen: Option<Vec<String>> = std::env::var("FAULT_KINDS")
        .ok()
        .map(|list| list.split(',').map(|k| k.trim().to_owned()).collect());
    for k in chosen.iter().flatten() {
        assert!(
            k == "reset" || FAULT_KINDS.contains(&k.as_str()),
            "FAULT_KINDS: {k:?} is not reset nor one of {FAULT_KINDS:?}"
        );
    }
    let wanted = |k: &str| chosen.as_ref().is_none_or(|c| c.iter().any(|x| x == k));
    Options {
        leases,
        faults: kinds.iter().copied().filter(|k| wanted(k)).collect(),
        resets: wanted("reset"),
        duration: Duration::from_millis(env("FAULT_DURATION_MS").unwrap_or(3000)),
        cluster,
    }
}

/// `FAULT_SEED` alone, or `count` seeds drawn from the base seed, every
/// fourth a loss at the first burst (`plan::is_loss_at_first_burst`).
fn seeds(count: usize) -> Vec<u64> {
    if let Some(seed) = env("FAULT_SEED") {
        return vec![seed];
    }
    let base = env("FAULT_BASE_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("fault schedules: FAULT_BASE_SEED={base:#x}, {count} schedules");
    let mut rng = Rng::new(base);
    (0..count)
        .map(|i| match rng.next_u64() {
            seed if i.is_multiple_of(4) => seed & !3,
            seed => seed | 1,
        })
        .collect()
}

/// Checks what a schedule recorded and prints its line (and, with
/// `FAULT_DUMP=1`, every operation first).
fn judge(
    run: &str,
    index: usize,
    plan: &Plan,
    outcome: Outcome,
    took: Duration,
    tally: &mut Tally,
) {
    if std::env::var_os("FAULT_DUMP").is_some() {
        for op in &outcome.ops {
            eprintln!("{op}");
        }
    }
    // With leases, other instances' holds outlive a reset by the longest
    // lease's life (two periods; see `check.rs`), and 50 ms for the
    // clocks' reading.
    let longest = plan.instances.iter().filter_map(|i| i.lease_period).max();
    // Redis refills by its clock, the host's wall clock: a second of the
    // history's monotonic clock may hold more of it (see `Outcome::clock`).
    let bucket = Bucket {
        capacity: plan.capacity,
        rate: plan.rate as f64 * outcome.clock.max(1.0),
        reset_grace: longest.map_or(Duration::ZERO, |p| 2 * p + Duration::from_millis(50)),
    };
    let segments = check::check(&outcome.ops, plan.keys, bucket);
    let ideal = ideal::ideal(&outcome.ops, plan.keys, bucket);
    let mut report = Report::new(
        plan.clone(),
        &outcome.ops,
        segments,
        ideal,
        outcome.local_decisions,
        took,
    );
    report.panics = outcome.panics;
    eprintln!("{}", report.lines(run, index));
    tally.add(&report);
}

/// Fails with every failing seed and how to replay one.
fn assert_no_violation(tally: &Tally, test: &str) {
    eprintln!("{}", tally.lines(test));
    let failing = tally.failing();
    if let Some(first) = failing.first() {
        let seeds: Vec<String> = failing.iter().map(|s| format!("{s:#x}")).collect();
        panic!(
            "{} schedule(s) panicked (PANIC lines) or admitted more than the bucket allows in some window \
             (capacity + rate x window + refunds, from the last fresh bucket on, \
             plus half a bucket held before for a lease's life after a reset; \
             the VIOLATION lines above say where and what made the bucket fresh; \
             with leases on, one after a flush, a restart or a failover is \
             typically holds outliving the bucket that granted them). Replay one with \
             FAULT_SEED={first:#x} cargo test --all-features --test fault_schedule -- {test} \
             --nocapture. Failing seeds: {}",
            failing.len(),
            seeds.join(" "),
        );
    }
}

/// Standalone schedules: every fault kind, leases on, off and mixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_schedules_stay_within_the_bucket() {
    let options = options(&FAULT_KINDS, false);
    let mut tally = Tally::default();
    for (index, seed) in seeds(env("FAULT_SCHEDULES").unwrap_or(20))
        .into_iter()
        .enumerate()
    {
        let plan = Plan::draw(seed, &options);
        let started = Instant::now();
        let target = Standalone::start(plan.replicated);
        let outcome = run_within(&plan, target, "tollgate").await;
        judge(
            "standalone",
            index,
            &plan,
            outcome,
            started.elapsed(),
            &mut tally,
        );
    }
    assert_no_violation(&tally, "fault_schedules_stay_within_the_bucket");
}

/// Schedules whose settlements go through a Redis Cluster store: freezes
/// shorter than the node timeout (no failover), connections killed, or no
/// fault; one cluster for all of them, each schedule under its own prefix.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_schedules_stay_within_the_bucket() {
    use support::cluster::RedisCluster;
    use support::schedule::servers::ClusterTarget;

    let options = options(&["freeze", "cut"], true);
    let count = env("FAULT_CLUSTER_SCHEDULES").unwrap_or(2);
    let cluster = RedisCluster::start_with_node_timeout(15_000);
    let mut tally = Tally::default();
    for (index, seed) in seeds(count).into_iter().enumerate() {
        let plan = Plan::draw(seed, &options);
        let started = Instant::now();
        let prefix = format!("fs{index}");
        let probe = ClusterTarget {
            seeds: cluster.seed_urls(),
            hot: cluster.nodes()[0].clone(),
        };
        let store = probe.builder().prefix(&prefix).build().expect("a store");
        let hot_name = format!("{}:{}", run::POLICY, run::key_name(0));
        let quota = run::policy(&plan).quotas()[0];
        let target = ClusterTarget {
            hot: cluster.primary_for_key(&store.bucket_key(&hot_name, &quota)),
            ..probe
        };
        let outcome = run_within(&plan, target, &prefix).await;
        judge(
            "cluster",
            index,
            &plan,
            outcome,
            started.elapsed(),
            &mut tally,
        );
    }
    assert_no_violation(&tally, "cluster_schedules_stay_within_the_bucket");
}

/// Runs a schedule, failing (with its seed) if it gets stuck, and counts
/// the panics meanwhile.
async fn run_within<T: Target>(plan: &Plan, target: T, prefix: &str) -> Outcome {
    panics::watch();
    let before = panics::count();
    let mut outcome = tokio::time::timeout(plan.duration + STUCK, run::run(plan, target, prefix))
        .await
        .unwrap_or_else(|_| panic!("schedule {:#x} got stuck: {plan}", plan.seed));
    outcome.panics = panics::count() - before;
    outcome
}

/// The checker on histories made by hand: it finds what it must, and
/// nothing else.
mod checker {
    use std::time::Duration;

    use super::support::schedule::check::{Bucket, check};
    use super::support::schedule::history::{Op, What};

    /// 10 tokens, 10 a second.
    const BUCKET: Bucket = Bucket {
        capacity: 10,
        rate: 10.0,
        reset_grace: Duration::ZERO,
    };

    fn op(invoke_ms: u64, complete_ms: u64, ok: bool, what: What) -> Op {
        Op {
            instance: Some(0),
            invoke: Duration::from_millis(invoke_ms),
            complete: Duration::from_millis(complete_ms),
            error: (!ok).then(|| "failed".to_owned()),
            what,
        }
    }

    /// `n` admissions of one token, one a millisecond from `at_ms`.
    fn admissions(at_ms: u64, n: u64) -> Vec<Op> {
        (0..n)
            .map(|i| {
                let what = What::Check {
                    key: 0,
                    cost: 1,
                    admitted: true,
                };
                op(at_ms + i, at_ms + i + 1, true, what)
            })
            .collect()
    }

    fn flushall(invoke_ms: u64, complete_ms: u64) -> Op {
        let what = What::Fault {
            name: "flushall",
            loss: true,
            empties: true,
            held: 0,
        };
        op(invoke_ms, complete_ms, true, what)
    }

    fn violations(ops: &[Op]) -> u64 {
        check(ops, 1, BUCKET).iter().map(|s| s.violations).sum()
    }

    #[test]
    fn a_burst_over_the_bucket_is_a_violation() {
        // 20 tokens in 20 ms: the bound is 10 + 0.2.
        let ops = admissions(100, 20);
        assert!(violations(&ops) > 0);
        let segments = check(&ops, 1, BUCKET);
        let worst = segments[0].worst.as_ref().unwrap();
        assert_eq!((worst.admitted, worst.checks), (20, 20));
        assert!(worst.excess() > 9.0, "{worst}");
    }

    #[test]
    fn a_loss_between_two_bursts_gives_a_fresh_bucket() {
        let mut ops = admissions(100, 10);
        ops.push(flushall(200, 210));
        ops.extend(admissions(220, 10));
        assert_eq!(violations(&ops), 0);
        // The same bursts without the loss: 20 tokens against 10 + 1.4.
        ops.retain(|o| !matches!(o.what, What::Fault { .. }));
        assert!(violations(&ops) > 0);
    }

    #[test]
    fn holds_spent_after_a_loss_are_a_violation() {
        // A fresh bucket at 210 ms, then 20 tokens in 20 ms: spending held
        // tokens the lost bucket had handed out.
        let mut ops = admissions(100, 5);
        ops.push(flushall(200, 210));
        ops.extend(admissions(220, 20));
        let segments = check(&ops, 1, BUCKET);
        let after = segments.iter().find(|s| s.opened_by == "flushall").unwrap();
        assert!(after.violations > 0);
        // An admission invoked before the loss completed is not placed
        // after it.
        let mut straddling = admissions(100, 5);
        straddling.push(flushall(200, 210));
        straddling.extend(admissions(205, 5));
        straddling.extend(admissions(211, 10));
        assert_eq!(violations(&straddling), 0);
    }

    #[test]
    fn with_leases_half_a_bucket_held_may_be_spent_after_a_reset() {
        let leased = Bucket {
            reset_grace: Duration::from_millis(300),
            ..BUCKET
        };
        let after = |at_ms, n, fresh: Op| {
            let mut ops = admissions(100, 5);
            ops.push(fresh);
            ops.extend(admissions(at_ms, n));
            check(&ops, 1, leased)
                .iter()
                .map(|s| s.violations)
                .sum::<u64>()
        };
        // 15 tokens in 15 ms after a reset: 10 + 0.15 + 5 held.
        let reset = op(200, 210, true, What::Reset { key: 0 });
        assert_eq!(after(220, 15, reset.clone()), 0);
        // 16 are one too many, and so are 15 once the grace is over.
        assert!(after(220, 16, reset.clone()) > 0);
        assert!(after(520, 15, reset) > 0);
        // After a loss nothing held is counted.
        assert!(after(220, 15, flushall(200, 210)) > 0);
    }

    #[test]
    fn refunds_that_may_fall_inside_a_window_raise_its_bound() {
        let refund =
            |invoke, complete, ok| op(invoke, complete, ok, What::Refund { key: 0, amount: 5 });
        // 15 tokens in 15 ms from 100 ms: 10 + 0.15 + a refund of 5.
        let mut ops = admissions(100, 15);
        ops.push(refund(95, 105, true));
        assert_eq!(violations(&ops), 0);
        // A refund done before the window is in the bucket's level there.
        ops.pop();
        ops.push(refund(50, 60, true));
        assert!(violations(&ops) > 0);
        // One that failed may still run: it counts in every later window.
        ops.pop();
        ops.push(refund(10, 20, false));
        assert_eq!(violations(&ops), 0);
    }

    #[test]
    fn nothing_after_a_reset_that_failed_is_checked() {
        let mut ops = admissions(100, 5);
        ops.push(op(200, 300, false, What::Reset { key: 0 }));
        ops.extend(admissions(400, 30));
        assert_eq!(violations(&ops), 0);
        // Refused and failed checks admit nothing.
        let mut refused = admissions(100, 10);
        for i in 0..20 {
            let what = What::Check {
                key: 0,
                cost: 5,
                admitted: false,
            };
            refused.push(op(110 + i, 111 + i, i % 2 == 0, what));
        }
        assert_eq!(violations(&refused), 0);
    }
}
