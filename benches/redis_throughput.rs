//! Decisions per second against one local redis-server, four clients
//! interleaved in every round:
//!
//! - (a) `RedisStore`: one held multiplexed connection; concurrent checks go
//!   together in one `EVALSHA` (its batching, up to 32 checks a call);
//! - (b) the pattern of other Redis limiters: `pool.get()` per decision, then
//!   `EVALSHA` of the same script (deadpool-redis recycles each connection it
//!   hands out with `UNWATCH` + `PING`), with deadpool's default pool size;
//! - (b') the same with a pool of 50, so no task waits for a connection;
//! - (c) `redis-benchmark` sending the same `EVALSHA`, one decision per call
//!   (50 clients, 16-deep pipelines): what Redis does when every decision is
//!   a script call of its own.
//!
//! (a) and (b) run 50 tasks on a 2-worker tokio runtime, each calling as fast
//! as it can for `RUN`, over `KEYS` client keys at `Quota::per_second(10)`.
//! With the default 10 000 keys the supply (100 000 tokens a second, after a
//! first burst of 100 000) is above what any client here can ask for, so
//! nearly every decision admits and writes: the costlier case for Redis, and
//! the same mix for every client, whatever its speed. `KEYS=1000` puts demand
//! above supply, so the faster clients get mostly denials (which write
//! nothing) and the mixes differ. Every run counts admissions and denials.
//! Redis is flushed before each run, so every run starts from full buckets.
//!
//! Every column is measured in the run it describes; the two computed from
//! other measurements say how:
//!
//! - `decisions/s`: (a), (b): decisions the tasks made / wall time of the run;
//!   (c): redis-benchmark's own requests per second.
//! - `allowed`, `denied`: (a), (b): counted from each `Decision`, and checked
//!   against the `SET` calls the script made (one per admission) in `INFO
//!   commandstats`; (c): from those `SET` calls (redis-benchmark cannot see the
//!   replies), marked `*`.
//! - `µs/call`: `usec_per_call` of `evalsha` in `INFO commandstats`: one
//!   script call's execution, wall time, so it grows when the two cores are
//!   contended; a call of (a) may decide a whole batch of checks.
//! - `CPU µs/d` (computed): the server's `used_cpu_user + used_cpu_sys` (`INFO
//!   cpu`) over the run, divided by decisions: the script plus reading, parsing
//!   and answering, key expiry.
//! - `cmds/d` (computed): commands the clients sent (`INFO commandstats`, less
//!   the `GET`/`SET`/`TIME` the script runs inside Redis and the harness's own
//!   `INFO`/`CONFIG`), divided by decisions.
//! - `reads/d` (computed): socket reads the server processed
//!   (`total_reads_processed` of `INFO stats`) divided by decisions. A caller
//!   alone sends one read per round trip; below 1, commands of several callers
//!   arrived in one read (a multiplexed connection or redis-benchmark's
//!   pipelines). The harness's few `INFO` connections are included.
//!
//! The summary gives, per client, the median and the range over the rounds,
//! and the ratios between clients computed round by round (both ran in the
//! same round, so under the same load), with their median and range. The
//! load average at the start and the end of the bench is printed: the
//! machine may be shared, and absolute figures move with it.
//!
//! Run: `cargo bench --bench redis_throughput` (3 rounds, about 1 minute);
//! `ROUNDS=5 KEYS=1000 cargo bench --bench redis_throughput` to change them.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_redis::redis::Script;
use support::RedisServer;
use tollgate::{Quota, RateLimiter, RedisStore};

const TASKS: usize = 50;
const RUN: Duration = Duration::from_secs(4);
/// Upper bound on decisions per task and run, so a run ends even if time stalls.
const MAX_PER_TASK: u64 = 1_000_000;
/// redis-benchmark requests per run: several seconds at the rates seen here.
const BENCHMARK_REQUESTS: u64 = 300_000;
const SCRIPT: &str = include_str!("../lua/token_bucket.lua");

fn quota() -> Quota {
    Quota::per_second(10).expect("quota")
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

/// The client key of a task's n-th decision: spread over `keys` keys, written
/// as redis-benchmark writes `__rand_int__` (12 digits).
fn client(keys: u64, task: usize, n: u64) -> String {
    let k = (task as u64 * 7_919 + n).wrapping_mul(2_654_435_761) % keys;
    format!("user:{k:012}")
}

/// One client's run, every figure measured in it.
struct Run {
    decisions: u64,
    per_sec: f64,
    allowed: u64,
    /// `allowed` came from the server's `SET` count, not from decisions.
    allowed_from_sets: bool,
    usec_per_call: f64,
    cpu_us: f64,
    commands: f64,
    reads: f64,
    sent: BTreeMap<String, u64>,
}

/// Server counters before a run.
struct Before {
    cpu: f64,
    reads: u64,
}

fn info_field(server: &RedisServer, section: &str, field: &str) -> f64 {
    let info: String = server.cmd(&["INFO", section]);
    info.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| *k == field)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in INFO {section}"))
}

/// CPU seconds the redis-server process has used (`used_cpu_user + used_cpu_sys`).
fn cpu_seconds(server: &RedisServer) -> f64 {
    info_field(server, "cpu", "used_cpu_user") + info_field(server, "cpu", "used_cpu_sys")
}

/// Empty buckets and zeroed counters, then the counters that cannot be zeroed.
fn fresh(server: &RedisServer) -> Before {
    let _: () = server.cmd(&["FLUSHALL"]);
    server.reset_stats();
    Before {
        cpu: cpu_seconds(server),
        reads: info_field(server, "stats", "total_reads_processed") as u64,
    }
}

/// The server's side of a run that made `decisions` decisions.
fn measure(
    server: &RedisServer,
    before: &Before,
    decisions: u64,
    per_sec: f64,
    allowed: Option<u64>,
) -> Run {
    let cpu = cpu_seconds(server);
    let reads = info_field(server, "stats", "total_reads_processed") as u64;
    let mut sent = server.all_calls();
    let sets = sent.remove("set").unwrap_or(0);
    for inside in ["get", "time"] {
        sent.remove(inside);
    }
    if let Some(allowed) = allowed {
        // One quota, cost 1: the script writes once per admission, never for a
        // denial. A mismatch means the bench counts something else than it says.
        assert_eq!(sets, allowed, "SET calls against admissions counted");
    }
    let d = decisions as f64;
    Run {
        decisions,
        per_sec,
        allowed: allowed.unwrap_or(sets),
        allowed_from_sets: allowed.is_none(),
        usec_per_call: server
            .command_stat("evalsha", "usec_per_call")
            .unwrap_or(f64::NAN),
        cpu_us: (cpu - before.cpu) * 1e6 / d,
        commands: sent.values().sum::<u64>() as f64 / d,
        reads: (reads - before.reads) as f64 / d,
        sent,
    }
}

/// Runs `TASKS` tasks calling `decide` until `RUN` is over; `decide` answers
/// whether the decision admitted.
async fn drive<F, Fut>(server: &RedisServer, decide: F) -> Run
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let before = fresh(server);
    let decide = Arc::new(decide);
    let allowed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + RUN;
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (decide, allowed) = (Arc::clone(&decide), Arc::clone(&allowed));
            tokio::spawn(async move {
                let mut n = 0;
                while n < MAX_PER_TASK && Instant::now() < deadline {
                    if decide(task, n).await {
                        allowed.fetch_add(1, Ordering::Relaxed);
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut decisions = 0;
    for t in tasks {
        decisions += t.await.expect("task");
    }
    let per_sec = decisions as f64 / start.elapsed().as_secs_f64();
    let allowed = allowed.load(Ordering::Relaxed);
    measure(server, &before, decisions, per_sec, Some(allowed))
}

async fn run_store(server: &RedisServer, keys: u64) -> Run {
    let limiter = RateLimiter::new(server.store(), quota());
    let _ = limiter.peek("warm-up").await.expect("warm-up");
    drive(server, move |task, n| {
        let limiter = limiter.clone();
        async move {
            let d = limiter.check(&client(keys, task, n), 1).await;
            d.expect("check").allowed()
        }
    })
    .await
}

/// What other limiters do: take a connection from the pool for each decision.
async fn run_pool_per_decision(server: &RedisServer, keys: u64, max_size: Option<usize>) -> Run {
    let mut config = deadpool_redis::Config::from_url(server.url());
    if let Some(max_size) = max_size {
        config.pool = Some(deadpool_redis::PoolConfig::new(max_size));
    }
    let pool = config
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("pool");
    // Leases off: this measures each decision's way to Redis and back.
    let store = RedisStore::builder()
        .pool(pool.clone())
        .leases(false)
        .build()
        .expect("store");
    let script = Arc::new(Script::new(SCRIPT));
    let q = quota();
    let period_us = q.period().as_micros() as u64;
    let g = gcd(q.tokens(), period_us);
    let (num, den) = (q.tokens() / g, period_us / g);
    let invoke = move |task: usize, n: u64| {
        let (pool, script, store) = (pool.clone(), Arc::clone(&script), store.clone());
        async move {
            let mut conn = pool.get().await.expect("pool.get");
            // The arguments RedisStore sends for one check (see the header of
            // lua/token_bucket.lua): Redis TIME; one quota (full, num, den);
            // one decision of cost 1 on quota 1, no debt. The reply: allowed,
            // then remaining, wait and reset for the quota, as little-endian
            // doubles packed into one string.
            let reply: Vec<u8> = script
                .key(store.bucket_key(&client(keys, task, n), &q))
                .arg("")
                .arg(1)
                .arg(q.capacity() * den)
                .arg(num)
                .arg(den)
                .arg(1)
                .arg(1)
                .arg(1)
                .arg(1)
                .arg(0)
                .invoke_async(&mut conn)
                .await
                .expect("evalsha");
            reply.get(..8) == Some(&1f64.to_le_bytes()[..])
        }
    };
    // Load the script and open the pool's connections before measuring.
    let invoke = Arc::new(invoke);
    let warm: Vec<_> = (0..TASKS)
        .map(|task| tokio::spawn((Arc::clone(&invoke))(task, 0)))
        .collect();
    for w in warm {
        w.await.expect("warm-up");
    }
    drive(server, move |task, n| invoke(task, n)).await
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// redis-benchmark sending our EVALSHA, 16-deep pipelines on 50 connections.
fn run_redis_benchmark(server: &RedisServer, keys: u64) -> Run {
    let sha: String = server.cmd(&["SCRIPT", "LOAD", SCRIPT]);
    let before = fresh(server);
    let out = Command::new("timeout")
        .args(["120", "redis-benchmark", "-h", "127.0.0.1", "-p"])
        .arg(server.port().to_string())
        .args(["-c", "50", "-P", "16", "-r", &keys.to_string(), "--csv"])
        .args(["-n", &BENCHMARK_REQUESTS.to_string()])
        .args([
            "EVALSHA",
            &sha,
            "1",
            "tollgate:{user:__rand_int__}:10/1s:10",
        ])
        // Redis TIME; one quota (full 10 x 100000 units, 1/100000 token per
        // microsecond: 10/s); one decision of cost 1 on that quota, no debt.
        .args(["", "1", "1000000", "1", "100000", "1", "1", "1", "1", "0"])
        .output()
        .expect("redis-benchmark (from the redis-tools package)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // --csv: a header line, then "name","rps",...
    let rps: f64 = stdout
        .lines()
        .nth(1)
        .and_then(|l| l.split(',').nth(1))
        .map(|v| v.trim_matches('"'))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("redis-benchmark output: {stdout}"));
    let failed = server
        .command_stat("evalsha", "failed_calls")
        .unwrap_or(0.0) as u64;
    assert_eq!(failed, 0, "EVALSHA failed in redis-benchmark");
    let decisions = server.calls("evalsha");
    measure(server, &before, decisions, rps, None)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `median (min-max)` of `v`, with `digits` decimals.
fn spread(v: &[f64], digits: usize) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.digits$} ({:.digits$}-{:.digits$})",
        median(v.to_vec()),
        min,
        max
    )
}

fn main() {
    let rounds = env_or("ROUNDS", 3) as usize;
    let keys = env_or("KEYS", 10_000);
    let load_start = load_average();
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let version: String = server.cmd(&["INFO", "server"]);
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    println!(
        "redis_throughput: {TASKS} tasks, 2 tokio workers, {} s per run, {keys} keys at {}, \
         {rounds} rounds; Redis {version}, {} CPUs; load average at start: {load_start}",
        RUN.as_secs(),
        quota(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    let default_pool = deadpool_redis::PoolConfig::default().max_size;
    let names = [
        "(a) RedisStore, held multiplexed connection".to_string(),
        format!("(b) pool.get() per decision, pool of {default_pool} (default)"),
        "(b') pool.get() per decision, pool of 50".to_string(),
        "(c) redis-benchmark EVALSHA, -c 50 -P 16".to_string(),
    ];
    let mut runs: Vec<Vec<Run>> = (0..names.len()).map(|_| Vec::new()).collect();
    for round in 1..=rounds {
        eprintln!("round {round}/{rounds}");
        runs[0].push(runtime.block_on(run_store(&server, keys)));
        runs[1].push(runtime.block_on(run_pool_per_decision(&server, keys, None)));
        runs[2].push(runtime.block_on(run_pool_per_decision(&server, keys, Some(50))));
        runs[3].push(run_redis_benchmark(&server, keys));
    }
    let load_end = load_average();

    println!();
    println!(
        "| client | round | decisions/s | allowed | denied | µs/call | CPU µs/d | cmds/d | reads/d |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, runs) in names.iter().zip(&runs) {
        for (i, r) in runs.iter().enumerate() {
            let mark = if r.allowed_from_sets { "*" } else { "" };
            println!(
                "| {name} | {} | {:.0} | {}{mark} | {}{mark} | {:.2} | {:.2} | {:.3} | {:.3} |",
                i + 1,
                r.per_sec,
                r.allowed,
                r.decisions - r.allowed,
                r.usec_per_call,
                r.cpu_us,
                r.commands,
                r.reads,
            );
        }
    }
    println!("\n* from the SET calls the script made (redis-benchmark cannot see replies)");
    println!("\ncommands the clients sent, last round:");
    for (name, runs) in names.iter().zip(&runs) {
        if let Some(r) = runs.last() {
            println!("  {name}: {:?} for {} decisions", r.sent, r.decisions);
        }
    }

    println!(
        "\nover {rounds} rounds, median (min-max):\n\n| client | decisions/s | allowed % | µs/call | CPU µs/d | cmds/d | reads/d |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, runs) in names.iter().zip(&runs) {
        let col = |f: &dyn Fn(&Run) -> f64| runs.iter().map(f).collect::<Vec<_>>();
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} |",
            spread(&col(&|r| r.per_sec), 0),
            spread(&col(&|r| 100.0 * r.allowed as f64 / r.decisions as f64), 1),
            spread(&col(&|r| r.usec_per_call), 2),
            spread(&col(&|r| r.cpu_us), 2),
            spread(&col(&|r| r.commands), 3),
            spread(&col(&|r| r.reads), 3),
        );
    }
    println!("\nratios of decisions/s, round by round (computed), median (min-max):");
    for (label, i, j) in [("(a)/(b) ", 0, 1), ("(a)/(b')", 0, 2), ("(a)/(c) ", 0, 3)] {
        let ratios: Vec<f64> = runs[i]
            .iter()
            .zip(&runs[j])
            .map(|(a, b)| a.per_sec / b.per_sec)
            .collect();
        let all: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "  {label} = {}   rounds: {}",
            spread(&ratios, 2),
            all.join(" ")
        );
    }

    let store = server.store();
    let key = store.bucket_key("user:42", &quota());
    let _ = runtime
        .block_on(RateLimiter::new(store, quota()).check("user:42", 1))
        .expect("check");
    let bytes: i64 = server.cmd(&["MEMORY", "USAGE", &key]);
    let value: String = server.cmd(&["GET", &key]);
    println!("\nMEMORY USAGE {key} = {bytes} bytes (value {value:?})");
    println!("load average at start: {load_start}; at end: {load_end}");
}
