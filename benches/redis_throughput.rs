//! Decisions per second against one local redis-server, three ways, in one run:
//!
//! - (a) `RedisStore`: one held multiplexed connection, one `EVALSHA` per decision;
//! - (b) the pattern of other Redis limiters: `pool.get()` per decision, then
//!   `EVALSHA` of the same script (deadpool-redis checks each connection it hands
//!   out with a `PING`), with deadpool's default pool size and with 50;
//! - (c) the limit: `redis-benchmark` sending the same `EVALSHA` (50 clients,
//!   16-deep pipelines).
//!
//! Every client runs 50 tasks (a 2-worker tokio runtime) over 10 000 client keys
//! at `Quota::per_second(10)`. Also printed: Redis time per call (`INFO
//! commandstats` `usec_per_call` of `evalsha`: the script's execution, wall
//! time, so it grows when the 2 cores are contended), Redis CPU per decision
//! (`INFO cpu` user + sys of the server over the run, divided by decisions: the
//! script plus network I/O and parsing), commands and round trips per
//! decision (commands the clients sent, divided by decisions; commands the script
//! runs inside Redis do not count; deadpool-redis pipelines `UNWATCH` with its
//! `PING`, one round trip), and `MEMORY USAGE` of one bucket key.
//!
//! Run: `cargo bench --bench redis_throughput` (about 40 s; every loop is bounded
//! in time and count).

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_redis::redis::Script;
use support::RedisServer;
use tollgate::{Quota, RateLimiter, RedisStore};

const TASKS: usize = 50;
const KEYS: u64 = 10_000;
const RUN: Duration = Duration::from_secs(4);
/// Upper bound on decisions per task and run, so a run ends even if time stalls.
const MAX_PER_TASK: u64 = 200_000;
const ROUNDS: usize = 2;
const SCRIPT: &str = include_str!("../lua/token_bucket.lua");

fn quota() -> Quota {
    Quota::per_second(10).expect("quota")
}

/// The client key of a task's n-th decision: spread over `KEYS` keys, written as
/// redis-benchmark writes `__rand_int__` (12 digits).
fn client(task: usize, n: u64) -> String {
    let k = (task as u64 * 7_919 + n).wrapping_mul(2_654_435_761) % KEYS;
    format!("user:{k:012}")
}

struct Run {
    decisions: u64,
    secs: f64,
    usec_per_call: f64,
    /// CPU time of the redis-server process (user + sys, `INFO cpu`) per decision,
    /// µs: the command plus reading, parsing and answering it.
    cpu_us: f64,
    /// Commands the client sent per decision.
    commands: f64,
    /// Round trips per decision: commands, less the `UNWATCH` that deadpool-redis
    /// pipelines with its `PING` when recycling a connection.
    round_trips: f64,
}

impl Run {
    fn rate(&self) -> f64 {
        self.decisions as f64 / self.secs
    }
}

/// Commands the clients sent since the last reset: everything but what the
/// script runs inside Redis (GET, SET, TIME).
fn client_commands(server: &RedisServer) -> (u64, BTreeMap<String, u64>) {
    let mut calls = server.all_calls();
    for inside in ["get", "set", "time"] {
        calls.remove(inside);
    }
    (calls.values().sum(), calls)
}

/// CPU seconds the redis-server process has used (`used_cpu_user + used_cpu_sys`).
fn cpu_seconds(server: &RedisServer) -> f64 {
    let info: String = server.cmd(&["INFO", "cpu"]);
    info.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| *k == "used_cpu_user" || *k == "used_cpu_sys")
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum()
}

/// Runs `TASKS` tasks calling `decide` until `RUN` is over; returns the figures.
async fn drive<F, Fut>(server: &RedisServer, decide: F) -> Run
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    server.reset_stats();
    let cpu_before = cpu_seconds(server);
    let decide = Arc::new(decide);
    let start = Instant::now();
    let deadline = start + RUN;
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let decide = Arc::clone(&decide);
            tokio::spawn(async move {
                let mut n = 0;
                while n < MAX_PER_TASK && Instant::now() < deadline {
                    decide(task, n).await;
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
    let secs = start.elapsed().as_secs_f64();
    let cpu_us = (cpu_seconds(server) - cpu_before) * 1e6 / decisions as f64;
    let (sent, calls) = client_commands(server);
    let usec_per_call = server
        .command_stat("evalsha", "usec_per_call")
        .unwrap_or(f64::NAN);
    let unwatch = calls.get("unwatch").copied().unwrap_or(0);
    println!("  commands sent for {decisions} decisions: {calls:?}");
    Run {
        decisions,
        secs,
        usec_per_call,
        cpu_us,
        commands: sent as f64 / decisions as f64,
        round_trips: (sent - unwatch) as f64 / decisions as f64,
    }
}

async fn run_store(server: &RedisServer) -> Run {
    let limiter = RateLimiter::new(server.store(), quota());
    let _ = limiter.peek("warm-up").await.expect("warm-up");
    drive(server, move |task, n| {
        let limiter = limiter.clone();
        async move {
            let _ = limiter.check(&client(task, n), 1).await.expect("check");
        }
    })
    .await
}

/// What other limiters do: take a connection from the pool for each decision.
async fn run_pool_per_decision(server: &RedisServer, max_size: Option<usize>) -> Run {
    let mut config = deadpool_redis::Config::from_url(server.url());
    if let Some(max_size) = max_size {
        config.pool = Some(deadpool_redis::PoolConfig::new(max_size));
    }
    let pool = config
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("pool");
    let store = RedisStore::from_pool(pool.clone());
    let script = Arc::new(Script::new(SCRIPT));
    let q = quota();
    let period_us = q.period().as_micros() as u64;
    let g = gcd(q.tokens(), period_us);
    let (num, den) = (q.tokens() / g, period_us / g);
    let invoke = move |task: usize, n: u64| {
        let (pool, script, store) = (pool.clone(), Arc::clone(&script), store.clone());
        async move {
            let mut conn = pool.get().await.expect("pool.get");
            let _: Vec<i64> = script
                .key(store.bucket_key(&client(task, n), &q))
                .arg(1)
                .arg("")
                .arg(q.capacity())
                .arg(num)
                .arg(den)
                .invoke_async(&mut conn)
                .await
                .expect("evalsha");
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
fn run_redis_benchmark(server: &RedisServer) -> Run {
    let sha: String = server.cmd(&["SCRIPT", "LOAD", SCRIPT]);
    server.reset_stats();
    let cpu_before = cpu_seconds(server);
    let requests = 300_000u64;
    let out = Command::new("timeout")
        .args(["60", "redis-benchmark", "-h", "127.0.0.1", "-p"])
        .arg(server.port().to_string())
        .args(["-c", "50", "-P", "16", "-r", &KEYS.to_string(), "--csv"])
        .args(["-n", &requests.to_string()])
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
    let usec_per_call = server
        .command_stat("evalsha", "usec_per_call")
        .unwrap_or(f64::NAN);
    let calls = server.calls("evalsha");
    let cpu_us = (cpu_seconds(server) - cpu_before) * 1e6 / calls as f64;
    Run {
        decisions: calls,
        secs: calls as f64 / rps,
        usec_per_call,
        cpu_us,
        commands: 1.0,
        round_trips: 1.0 / 16.0,
    }
}

fn main() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "redis_throughput: {TASKS} tasks, 2 tokio workers, {} s per run, {KEYS} keys at {}",
        RUN.as_secs(),
        quota()
    );
    let default_pool = deadpool_redis::PoolConfig::default().max_size;
    let names = [
        "(a) RedisStore, held multiplexed connection".to_string(),
        format!("(b) pool.get() per decision, pool of {default_pool} (default)"),
        "(b') pool.get() per decision, pool of 50".to_string(),
        "(c) redis-benchmark EVALSHA, 50 clients, -P 16".to_string(),
    ];
    let mut runs: Vec<Vec<Run>> = (0..names.len()).map(|_| Vec::new()).collect();
    for round in 1..=ROUNDS {
        println!("round {round}/{ROUNDS}");
        runs[0].push(runtime.block_on(run_store(&server)));
        runs[1].push(runtime.block_on(run_pool_per_decision(&server, None)));
        runs[2].push(runtime.block_on(run_pool_per_decision(&server, Some(50))));
        runs[3].push(run_redis_benchmark(&server));
    }

    println!();
    println!(
        "| {:<52} | {:>11} | {:>13} | {:>14} | {:>17} | {:>20} |",
        "client",
        "decisions/s",
        "Redis µs/call",
        "Redis CPU µs/d",
        "commands/decision",
        "round trips/decision"
    );
    println!(
        "|{:-<54}|{:->13}|{:->15}|{:->16}|{:->19}|{:->22}|",
        "", "", "", "", "", ""
    );
    for (name, runs) in names.iter().zip(&runs) {
        for r in runs {
            let trips = if name.starts_with("(c)") {
                "1/16 (pipelined)".to_string()
            } else {
                format!("{:.3}", r.round_trips)
            };
            println!(
                "| {name:<52} | {:>11.0} | {:>13.2} | {:>14.2} | {:>17.3} | {trips:>20} |",
                r.rate(),
                r.usec_per_call,
                r.cpu_us,
                r.commands
            );
        }
    }
    let best = |i: usize| runs[i].iter().map(Run::rate).fold(0.0, f64::max);
    println!();
    println!(
        "ratio (a)/(b)  = {:.2}   (best run of each)",
        best(0) / best(1)
    );
    println!("ratio (a)/(b') = {:.2}", best(0) / best(2));
    println!("ratio (a)/(c)  = {:.2}", best(0) / best(3));

    let store = server.store();
    let key = store.bucket_key("user:42", &quota());
    let _ = runtime
        .block_on(RateLimiter::new(store, quota()).check("user:42", 1))
        .expect("check");
    let bytes: i64 = server.cmd(&["MEMORY", "USAGE", &key]);
    let value: String = server.cmd(&["GET", &key]);
    println!("MEMORY USAGE {key} = {bytes} bytes (value {value:?})");
}
