//! Leases in a scenario: 4 `RedisStore`s in one process (4 "instances",
//! each with its own connection, `.url(..)`) share ONE key of
//! `Quota::per_second(RATE)` (capacity = the default burst, `RATE`), each
//! store driven by its own tokio task at a fixed pace (`interval_at`,
//! `MissedTickBehavior::Burst`, the four schedules staggered by a quarter of
//! a period), on a 2-worker multi-thread runtime, against one local
//! redis-server started here. Four runs of `DURATION` seconds each:
//!
//! - **half load**: the key offered 50% of its rate in total, leases on, then
//!   off (plain `RedisStore`);
//! - **double load**: the key offered 2x its rate in total, leases on, then
//!   off.
//!
//! Every run uses fresh stores, a key of its own, and starts from
//! `FLUSHALL` + `CONFIG RESETSTAT` (after a warm-up peek per store on
//! another key, so the connections are open and the script loaded). Both
//! kinds of store keep the library's defaults otherwise (the deny cache is
//! on in both). Columns:
//!
//! - `offered/s`: checks made / wall time of the run (the pace kept).
//! - `late max`: the most a tick ran after its scheduled time; `check max`:
//!   the longest one check took. A stalled task (a busy machine: the load
//!   average is printed) catches up with its missed ticks at once, which
//!   bursts demand: a leased store then runs out of held tokens and asks
//!   Redis until its next lease comes.
//! - `admitted`: the fraction of checks admitted.
//! - `calls/d`: `calls` of `cmdstat_evalsha` + `cmdstat_eval` (`INFO
//!   commandstats`), read right after the last check, / checks made. A call
//!   may carry several decisions (batching, lease requests, reports).
//! - `local`: checks decided in process from held tokens
//!   (`lease_stats().local_decisions`, summed over the 4 stores) / checks.
//! - `worst 1 s`: every admission's time (`std::time::Instant`, taken when
//!   the check returned) starts a window; the most admissions in any
//!   `[t, t + 1 s)`, as a fraction of `capacity + rate x 1 s`. Host-clock
//!   stamps: a Redis decision is stamped when its reply arrived, so this is
//!   within the stamps' jitter (a millisecond is `rate / 1000` tokens).
//! - `total/span`: admissions / (`capacity + rate x (last - first
//!   admission)`), host clock: how much of what the bucket could give in
//!   that span was given (at double load the target is >= 95%).
//! - `TIME bound`: admissions against `capacity + rate x (T1 - T0)`, T0 and
//!   T1 read with Redis `TIME` before the first and after the last check:
//!   exact, on Redis's own clock; `ok` or `OVER`.
//!
//! Run: `cargo bench --bench leases` (about 1 minute);
//! `DURATION=10 RATE=2000 LEASE_PERIOD_MS=1000 cargo bench --bench leases`
//! to change the run length, the key's rate and the lease period (default:
//! the library's, 1 s).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::RedisServer;
use tokio::time::MissedTickBehavior;
use tollgate::store::LeaseStats;
use tollgate::{Policy, Quota, RedisStore, Store};

/// Instances (stores) sharing the key.
const STORES: usize = 4;
/// Time after the last check for background reports and lease requests to
/// land before the next run flushes Redis.
const SETTLE: Duration = Duration::from_millis(500);

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

/// One run's settings.
#[derive(Clone, Copy)]
struct Scenario {
    /// Offered load as a multiple of the key's rate (0.5, 2.0).
    load: f64,
    leases: bool,
}

impl Scenario {
    /// "half" or "double", and "leased" or "plain".
    fn words(&self) -> (&'static str, &'static str) {
        let load = if self.load < 1.0 { "half" } else { "double" };
        let store = if self.leases { "leased" } else { "plain" };
        (load, store)
    }

    fn name(&self) -> String {
        let (load, store) = self.words();
        format!("{load} load, {store}")
    }
}

/// One run, every figure measured in it.
struct Outcome {
    scenario: Scenario,
    offered: u64,
    admitted: u64,
    errors: u64,
    wall: Duration,
    calls: u64,
    stats: LeaseStats,
    /// Admission times, sorted.
    times: Vec<Instant>,
    /// Redis `TIME` (µs) before the first check and after the last.
    t0_us: u64,
    t1_us: u64,
    /// How late the latest tick ran after its scheduled time (a stalled
    /// task: the missed ticks then come at once).
    max_late: Duration,
    /// The longest a check took.
    max_check: Duration,
}

/// Settings shared by every run.
struct Setup {
    rate: u64,
    duration: Duration,
    lease_period: Option<Duration>,
}

impl Setup {
    fn quota(&self) -> Quota {
        Quota::per_second(self.rate).expect("quota")
    }
}

fn store(server: &RedisServer, setup: &Setup, leases: bool) -> RedisStore {
    let mut builder = RedisStore::builder().url(server.url()).leases(leases);
    if let Some(period) = setup.lease_period {
        builder = builder.lease_period(period);
    }
    builder.build().expect("store")
}

/// `calls` of the script commands (`EVALSHA`, `EVAL`) since the last reset.
fn script_calls(server: &RedisServer) -> u64 {
    server.calls("evalsha") + server.calls("eval")
}

fn sum_stats(stores: &[RedisStore]) -> LeaseStats {
    let mut sum = LeaseStats::default();
    for s in stores.iter().map(RedisStore::lease_stats) {
        sum.local_decisions += s.local_decisions;
        sum.requests += s.requests;
        sum.granted += s.granted;
        sum.spent += s.spent;
        sum.returned += s.returned;
        sum.expired += s.expired;
        sum.outstanding += s.outstanding;
        sum.held += s.held;
    }
    sum
}

async fn run(server: &RedisServer, setup: &Setup, scenario: Scenario) -> Outcome {
    let quota = setup.quota();
    let policy = Policy::from(quota);
    let (load, kind) = scenario.words();
    let key = format!("shared-{load}-{kind}");
    let stores: Vec<RedisStore> = (0..STORES)
        .map(|_| store(server, setup, scenario.leases))
        .collect();
    for s in &stores {
        // A peek (cost 0) always asks Redis: opens the connection and loads
        // the script, on another key.
        let _ = s.check("warm-up", &policy, 0).await.expect("warm-up");
    }
    let _: () = server.cmd(&["FLUSHALL"]);
    server.reset_stats();

    // Each store offers an equal share, one check per tick.
    let per_store = setup.rate as f64 * scenario.load / STORES as f64;
    let period = Duration::from_secs_f64(1.0 / per_store);
    let ticks = (per_store * setup.duration.as_secs_f64()).round() as u64;
    let t0_us = server.time_us();
    let start = tokio::time::Instant::now() + Duration::from_millis(10);
    let wall_start = Instant::now();
    let tasks: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (s, policy, key) = (s.clone(), policy.clone(), key.clone());
            let first = start + period * i as u32 / STORES as u32;
            tokio::spawn(async move {
                let mut interval = tokio::time::interval_at(first, period);
                interval.set_missed_tick_behavior(MissedTickBehavior::Burst);
                let mut times = Vec::with_capacity(ticks as usize);
                let mut errors = 0u64;
                let (mut max_late, mut max_check) = (Duration::ZERO, Duration::ZERO);
                for _ in 0..ticks {
                    let due = interval.tick().await;
                    let asked = tokio::time::Instant::now();
                    max_late = max_late.max(asked.saturating_duration_since(due));
                    let decision = s.check(&key, &policy, 1).await;
                    max_check = max_check.max(asked.elapsed());
                    match decision {
                        Ok(d) if d.allowed() => times.push(Instant::now()),
                        Ok(_) => {}
                        Err(_) => errors += 1,
                    }
                }
                (times, errors, max_late, max_check)
            })
        })
        .collect();
    let mut times = Vec::new();
    let mut errors = 0;
    let (mut max_late, mut max_check) = (Duration::ZERO, Duration::ZERO);
    for t in tasks {
        let (t, e, late, check) = t.await.expect("task");
        times.extend(t);
        errors += e;
        max_late = max_late.max(late);
        max_check = max_check.max(check);
    }
    let t1_us = server.time_us();
    let wall = wall_start.elapsed();
    let calls = script_calls(server);
    let stats = sum_stats(&stores);
    times.sort_unstable();
    // The stores report their holds when dropped (in the background).
    drop(stores);
    tokio::time::sleep(SETTLE).await;
    Outcome {
        scenario,
        offered: ticks * STORES as u64,
        admitted: times.len() as u64,
        errors,
        wall,
        calls,
        stats,
        times,
        t0_us,
        t1_us,
        max_late,
        max_check,
    }
}

/// The most of `times` (sorted) in any `[t, t + window)` with `t` one of them.
fn worst_window(times: &[Instant], window: Duration) -> u64 {
    let mut worst = 0;
    let mut j = 0;
    for (i, &t) in times.iter().enumerate() {
        let end = t + window;
        while j < times.len() && times[j] < end {
            j += 1;
        }
        worst = worst.max(j - i);
    }
    worst as u64
}

/// The figures of one outcome that the table and the targets use.
struct Figures {
    admitted_frac: f64,
    calls_per_d: f64,
    local_frac: f64,
    worst: u64,
    worst_frac: f64,
    span_bound: f64,
    total_frac: f64,
    time_bound: u64,
}

fn figures(o: &Outcome, setup: &Setup) -> Figures {
    let quota = setup.quota();
    let (capacity, rate) = (quota.capacity() as f64, setup.rate as f64);
    let d = o.offered as f64;
    let worst = worst_window(&o.times, Duration::from_secs(1));
    let span = match (o.times.first(), o.times.last()) {
        (Some(a), Some(b)) => b.duration_since(*a).as_secs_f64(),
        _ => 0.0,
    };
    let span_bound = capacity + rate * span;
    // Exact: integer tokens refilled in T1 - T0 µs, rounded down.
    let time_bound = quota.capacity() + (o.t1_us - o.t0_us) * setup.rate / 1_000_000;
    Figures {
        admitted_frac: o.admitted as f64 / d,
        calls_per_d: o.calls as f64 / d,
        local_frac: o.stats.local_decisions as f64 / d,
        worst,
        worst_frac: worst as f64 / (capacity + rate),
        span_bound,
        total_frac: o.admitted as f64 / span_bound,
        time_bound,
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT MET" }
}

fn main() {
    let setup = Setup {
        rate: env_or("RATE", 2_000),
        duration: Duration::from_secs(env_or("DURATION", 10)),
        lease_period: std::env::var("LEASE_PERIOD_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis),
    };
    let load_start = load_average();
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let info: String = server.cmd(&["INFO", "server"]);
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let quota = setup.quota();
    let period = setup
        .lease_period
        .map_or_else(|| "default (1 s)".to_owned(), |p| format!("{p:?}"));
    println!(
        "leases: {STORES} stores (own connections) share one key at {quota} (capacity {}), \
         {} s per run, lease period {period}, 2 tokio workers; Redis {version}, {} CPUs; \
         load average at start: {load_start}",
        quota.capacity(),
        setup.duration.as_secs(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    let scenarios = [
        Scenario {
            load: 0.5,
            leases: true,
        },
        Scenario {
            load: 0.5,
            leases: false,
        },
        Scenario {
            load: 2.0,
            leases: true,
        },
        Scenario {
            load: 2.0,
            leases: false,
        },
    ];
    let mut outcomes = Vec::new();
    for s in scenarios {
        eprintln!("running: {}", s.name());
        outcomes.push(runtime.block_on(run(&server, &setup, s)));
    }
    let load_end = load_average();
    let figs: Vec<Figures> = outcomes.iter().map(|o| figures(o, &setup)).collect();

    println!();
    println!(
        "| run | offered | offered/s | late max | check max | admitted | errors | script calls | \
         calls/d | local | worst 1 s (of C+R) | total/span | TIME bound |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for (o, f) in outcomes.iter().zip(&figs) {
        println!(
            "| {} | {} | {:.0} | {:.1} ms | {:.1} ms | {} ({:.2}%) | {} | {} | {:.4} | {:.1}% | {} ({:.3}) | {:.1}% of {:.0} | {} <= {}: {} |",
            o.scenario.name(),
            o.offered,
            o.offered as f64 / o.wall.as_secs_f64(),
            o.max_late.as_secs_f64() * 1e3,
            o.max_check.as_secs_f64() * 1e3,
            o.admitted,
            100.0 * f.admitted_frac,
            o.errors,
            o.calls,
            f.calls_per_d,
            100.0 * f.local_frac,
            f.worst,
            f.worst_frac,
            100.0 * f.total_frac,
            f.span_bound,
            o.admitted,
            f.time_bound,
            if o.admitted <= f.time_bound {
                "ok"
            } else {
                "OVER"
            },
        );
    }

    println!(
        "\nlease_stats, summed over the {STORES} stores, read after the last check:\n\n\
         | run | requests | granted | spent | returned | expired | outstanding | held |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for o in outcomes.iter().filter(|o| o.scenario.leases) {
        let s = &o.stats;
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            o.scenario.name(),
            s.requests,
            s.granted,
            s.spent,
            s.returned,
            s.expired,
            s.outstanding,
            s.held
        );
    }

    // outcomes: 0 half leased, 1 half plain, 2 double leased, 3 double plain.
    println!("\nleased / plain, same load, same process:");
    for (label, l, p) in [("half  ", 0, 1), ("double", 2, 3)] {
        let (l, p) = (&figs[l], &figs[p]);
        println!(
            "  {label}: calls/d {:.4} / {:.4} = {:.3}; admitted {:.4} / {:.4} = {:.3}; \
             total/span {:.4} / {:.4} = {:.3}",
            l.calls_per_d,
            p.calls_per_d,
            l.calls_per_d / p.calls_per_d,
            l.admitted_frac,
            p.admitted_frac,
            l.admitted_frac / p.admitted_frac,
            l.total_frac,
            p.total_frac,
            l.total_frac / p.total_frac,
        );
    }

    let over = |i: usize| outcomes[i].admitted > figs[i].time_bound || figs[i].worst_frac > 1.0;
    println!("\ntargets (leases on):");
    println!(
        "  half load, calls/d <= 0.01: {:.4}, {}",
        figs[0].calls_per_d,
        verdict(figs[0].calls_per_d <= 0.01)
    );
    println!(
        "  half load, admitted ~100%: {:.2}%",
        100.0 * figs[0].admitted_frac
    );
    for (label, i) in [("half", 0), ("double", 2)] {
        println!(
            "  {label} load, no over-admission (Redis TIME bound exact; worst 1 s window <= 1 on the host clock): \
             {} <= {} and {:.3}, {}",
            outcomes[i].admitted,
            figs[i].time_bound,
            figs[i].worst_frac,
            verdict(!over(i))
        );
    }
    println!(
        "  double load, admitted >= 95% of capacity + rate x span: {:.1}%, {}",
        100.0 * figs[2].total_frac,
        verdict(figs[2].total_frac >= 0.95)
    );
    let lease_period = std::env::var("LEASE_PERIOD_MS")
        .ok()
        .map(|v| format!(" LEASE_PERIOD_MS={v}"))
        .unwrap_or_default();
    println!("\nload average at start: {load_start}; at end: {load_end}");
    println!(
        "\nreproduce: DURATION={} RATE={}{lease_period} cargo bench --bench leases",
        setup.duration.as_secs(),
        setup.rate
    );
}
