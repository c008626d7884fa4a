//! Decisions per second and Redis CPU per decision: `RedisStore` on a 3-primary
//! Redis Cluster (3 replicas) against `RedisStore` on a single node, in one
//! run, same machine, same load.
//!
//! Each run: 50 tokio tasks (a 2-worker runtime) over 10 000 client keys at
//! `Quota::per_second(10)` (admissions, which write, and denials), 4 s. Seven
//! setups alternate, three rounds each:
//!
//! - a single node;
//! - a single node with a replica (a primary feeds its replica every write,
//!   as each cluster primary does);
//! - a cluster of one node that owns every slot, through the cluster client:
//!   what cluster mode costs a node (slot checks, the cluster bus) and the
//!   client (routing), with as many processes as the single node;
//! - the cluster: 3 primaries and 3 replicas;
//! - the same cluster with batching off (`max_batch(1)`);
//! - the same cluster driven by 150 tasks: as many per primary as the single
//!   node gets, so each primary's queue is as deep as the single node's;
//! - a cluster of 3 primaries without replicas, driven by 150 tasks: cluster
//!   mode at the single node's depth, without the replication the single
//!   node does not do either.
//!
//! Printed per run:
//!
//! - decisions/s;
//! - Redis CPU per decision: `used_cpu_user + used_cpu_sys` (`INFO cpu`) of the
//!   server(s) over the run, divided by decisions: for the cluster, summed over
//!   the 3 primaries (what serves decisions), with the replicas' CPU (applying
//!   the primaries' writes) apart;
//! - the benchmark process's own CPU per decision (`/proc/self/stat`: the
//!   client, routing included, and the tokio runtime);
//! - per primary: its share of the decisions (by the slot of each decision's
//!   client, counted by the benchmark), the decisions per script call it ran
//!   (decisions / `EVALSHA`: the depth of its batches) and its CPU per
//!   decision it served;
//! - `usec_per_call` of `evalsha` (the script's execution, wall time);
//! - commands the clients sent per decision (all but the `GET`/`SET`/`TIME`
//!   the script runs inside Redis).
//!
//! Then the same `EVALSHA` sent by `redis-benchmark` (50 connections, 16-deep
//! pipelines, 10 000 keys) to the single node, the one-node cluster, and each
//! primary of the cluster in turn (keys whose hash tag the primary owns;
//! `redis-benchmark --cluster` cannot route random keys): each server's CPU
//! per call with the client's batching taken out of the picture.
//!
//! On 2 cores the cluster cannot show its scale: 6 redis-servers and the
//! client share the 2 cores. What transfers to a real deployment is the CPU per
//! decision per node (see BENCHMARKS.md for the model).
//!
//! Run: `cargo bench --bench cluster --features cluster` (about 2 minutes).

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::RedisServer;
use support::cluster::RedisCluster;
use support::node::Node;
use tollgate::{Quota, RateLimiter, RedisStore};

const TASKS: usize = 50;
const KEYS: u64 = 10_000;
const RUN: Duration = Duration::from_secs(4);
/// Upper bound on decisions per task and run, so a run ends even if time stalls.
const MAX_PER_TASK: u64 = 200_000;
const ROUNDS: usize = 3;

fn quota() -> Quota {
    Quota::per_second(10).expect("quota")
}

/// The client of a task's `n`th check: an index below `KEYS`...
fn client_index(task: usize, n: u64) -> u64 {
    (task as u64 * 7_919 + n).wrapping_mul(2_654_435_761) % KEYS
}

/// ...and its name.
fn client_name(k: u64) -> String {
    format!("user:{k:012}")
}

fn client(task: usize, n: u64) -> String {
    client_name(client_index(task, n))
}

/// The cluster slot of a key (CRC16 of its `{hash tag}`, as Redis computes
/// it), to count which primary decides each check.
fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tag = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for &byte in tag {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

/// One redis-server as the benchmark sees it.
trait Server {
    fn info(&self, section: &str) -> String;
    fn reset(&self);
    fn script_load(&self, script: &str) -> String;
}

impl Server for RedisServer {
    fn info(&self, section: &str) -> String {
        self.cmd(&["INFO", section])
    }
    fn reset(&self) {
        self.reset_stats();
    }
    fn script_load(&self, script: &str) -> String {
        self.cmd(&["SCRIPT", "LOAD", script])
    }
}

impl Server for Node {
    fn info(&self, section: &str) -> String {
        self.cmd(&["INFO", section])
    }
    fn reset(&self) {
        self.reset_stats();
    }
    fn script_load(&self, script: &str) -> String {
        self.cmd(&["SCRIPT", "LOAD", script])
    }
}

fn field(info: &str, name: &str) -> f64 {
    info.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// CPU seconds (user + system) of this process so far.
fn own_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which ends with ')'): utime and stime
    // are the 12th and 13th, in clock ticks (100 a second on Linux).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn cpu_seconds(s: &dyn Server) -> f64 {
    let info = s.info("cpu");
    field(&info, "used_cpu_user") + field(&info, "used_cpu_sys")
}

/// `INFO commandstats` as command -> (calls, usec).
fn commandstats(s: &dyn Server) -> BTreeMap<String, (u64, f64)> {
    s.info("commandstats")
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, fields) = l.split_once(':')?;
            let get = |k: &str| {
                fields
                    .split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .find(|(key, _)| *key == k)
                    .and_then(|(_, v)| v.trim().parse::<f64>().ok())
            };
            Some((name.to_string(), (get("calls")? as u64, get("usec")?)))
        })
        .collect()
}

struct Node1 {
    name: String,
    /// Decisions whose client this server serves (counted by the benchmark).
    decided: u64,
    evalsha: u64,
    cpu_s: f64,
    usec: f64,
}

struct Run {
    decisions: u64,
    secs: f64,
    /// Per server that decides (one, or the 3 primaries).
    nodes: Vec<Node1>,
    /// CPU seconds of the replicas (cluster only).
    replica_cpu_s: f64,
    /// Commands the clients sent, all servers together.
    sent: u64,
    /// CPU seconds of this process (the client).
    client_cpu_s: f64,
}

impl Run {
    fn rate(&self) -> f64 {
        self.decisions as f64 / self.secs
    }
    fn cpu_us_per_decision(&self) -> f64 {
        self.nodes.iter().map(|n| n.cpu_s).sum::<f64>() * 1e6 / self.decisions as f64
    }
    fn client_cpu_us_per_decision(&self) -> f64 {
        self.client_cpu_s * 1e6 / self.decisions as f64
    }
    fn usec_per_call(&self) -> f64 {
        let calls: u64 = self.nodes.iter().map(|n| n.evalsha).sum();
        self.nodes.iter().map(|n| n.usec).sum::<f64>() / calls as f64
    }
}

/// Runs `tasks` tasks checking through `limiter` for `RUN`, measuring
/// `deciding` (and `replicas`, whose CPU is reported apart); `owners` gives
/// for each client index the index in `deciding` of the server that decides
/// it (empty: the first).
async fn drive(
    tasks: usize,
    limiter: RateLimiter,
    deciding: &[(String, &dyn Server)],
    replicas: &[&dyn Server],
    owners: Arc<Vec<usize>>,
) -> Run {
    for (_, s) in deciding {
        s.reset();
    }
    let cpu_before: Vec<f64> = deciding.iter().map(|(_, s)| cpu_seconds(*s)).collect();
    let replica_before: f64 = replicas.iter().map(|s| cpu_seconds(*s)).sum();
    let client_before = own_cpu_seconds();
    let start = Instant::now();
    let deadline = start + RUN;
    let limiter = Arc::new(limiter);
    let servers = deciding.len();
    let tasks: Vec<_> = (0..tasks)
        .map(|task| {
            let limiter = Arc::clone(&limiter);
            let owners = Arc::clone(&owners);
            tokio::spawn(async move {
                let mut n = 0;
                let mut per_server = vec![0u64; servers];
                while n < MAX_PER_TASK && Instant::now() < deadline {
                    let k = client_index(task, n);
                    let _ = limiter.check(&client_name(k), 1).await.expect("check");
                    per_server[owners.get(k as usize).copied().unwrap_or(0)] += 1;
                    n += 1;
                }
                per_server
            })
        })
        .collect();
    let mut decided = vec![0u64; servers];
    for t in tasks {
        for (sum, n) in decided.iter_mut().zip(t.await.expect("task")) {
            *sum += n;
        }
    }
    let decisions = decided.iter().sum();
    let secs = start.elapsed().as_secs_f64();
    let client_cpu_s = own_cpu_seconds() - client_before;
    let mut nodes = Vec::new();
    let mut sent = 0;
    for (((name, s), before), decided) in deciding.iter().zip(cpu_before).zip(decided) {
        let cpu_s = cpu_seconds(*s) - before;
        let mut stats = commandstats(*s);
        let (evalsha, usec) = stats.get("evalsha").copied().unwrap_or((0, 0.0));
        for inside in ["get", "set", "time", "info", "config|resetstat", "replconf"] {
            stats.remove(inside);
        }
        sent += stats.values().map(|(calls, _)| calls).sum::<u64>();
        nodes.push(Node1 {
            name: name.clone(),
            decided,
            evalsha,
            cpu_s,
            usec,
        });
    }
    let replica_cpu_s = replicas.iter().map(|s| cpu_seconds(*s)).sum::<f64>() - replica_before;
    Run {
        decisions,
        secs,
        nodes,
        replica_cpu_s,
        sent,
        client_cpu_s,
    }
}

const SCRIPT: &str = include_str!("../lua/token_bucket.lua");

/// `redis-benchmark` sending our `EVALSHA` (50 clients, 16-deep pipelines)
/// with keys `key` (`__rand_int__` replaced by one of 10 000 numbers) to the
/// server `node` on `port`; returns calls per second and its CPU µs and
/// `usec` per call.
fn redis_benchmark(port: u16, key: &str, node: &dyn Server) -> (f64, f64, f64) {
    let sha = script_load(node);
    node.reset();
    let cpu_before = cpu_seconds(node);
    let requests = 300_000u64;
    let mut cmd = redis_benchmark_command(port, 16, requests);
    cmd.args(["EVALSHA", &sha, "1", key])
        // The script's arguments (see lua/token_bucket.lua): no test clock,
        // one quota (10/s: full 10 x 100 000 units, 1 unit a µs, 100 000
        // units a token), one decision of one quota, cost 1, no debt.
        .args(["", "1", "1000000", "1", "100000", "1", "1", "1", "1", "0"]);
    let rps = requests_per_second(&mut cmd);
    let cpu_s = cpu_seconds(node) - cpu_before;
    let (calls, usec) = commandstats(node)
        .get("evalsha")
        .copied()
        .unwrap_or((0, 0.0));
    (rps, cpu_s * 1e6 / calls as f64, usec / calls as f64)
}

/// `redis-benchmark` against the server on `port`: 50 clients, `pipeline`
/// deep, `requests` calls, random numbers among the benchmark's keys, CSV
/// output; the command's arguments follow.
fn redis_benchmark_command(port: u16, pipeline: u32, requests: u64) -> std::process::Command {
    let mut cmd = std::process::Command::new("timeout");
    cmd.args(["120", "redis-benchmark", "-h", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .args(["-c", "50", "-P", &pipeline.to_string()])
        .args(["-r", &KEYS.to_string(), "--csv"])
        .args(["-n", &requests.to_string()]);
    cmd
}

/// Runs `cmd` (from [`redis_benchmark_command`]) and reads its requests per
/// second.
fn requests_per_second(cmd: &mut std::process::Command) -> f64 {
    let out = cmd
        .output()
        .expect("redis-benchmark (from the redis-tools package)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .nth(1)
        .and_then(|l| l.split(',').nth(1))
        .map(|v| v.trim_matches('"'))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("redis-benchmark output: {stdout}"))
}

fn script_load(s: &dyn Server) -> String {
    s.script_load(SCRIPT)
}

/// The cluster store's batch script: `lua/cluster_batch.lua` in front of
/// the token bucket (as `Script::spread` builds it).
const SPREAD: &str = concat!(
    include_str!("../lua/cluster_batch.lua"),
    include_str!("../lua/token_bucket.lua")
);

/// `redis-benchmark` sending calls of `BATCH` decisions each (50 clients,
/// 4-deep pipelines), as batching makes them under load: every key with the
/// hash tag `{tag}` (one slot, so a cluster takes it declared), the decisions
/// those of the single-decision run above. `spread`: the cluster store's
/// batch script, with the keys also in `ARGV`. Returns calls per second and
/// the server's CPU µs per decision.
fn redis_benchmark_batched(port: u16, tag: &str, node: &dyn Server, spread: bool) -> (f64, f64) {
    const BATCH: usize = 16;
    let sha = node.script_load(if spread { SPREAD } else { SCRIPT });
    node.reset();
    let cpu_before = cpu_seconds(node);
    let requests = 20_000u64;
    let keys: Vec<String> = (0..BATCH)
        .map(|i| format!("tollgate:{{{tag}}}:u{i}:__rand_int__:10/1s:10"))
        .collect();
    let mut cmd = redis_benchmark_command(port, 4, requests);
    cmd.args(["EVALSHA", &sha, &BATCH.to_string()])
        .args(&keys)
        .args(["", "1", "1000000", "1", "100000", &BATCH.to_string()]);
    for _ in 0..BATCH {
        cmd.args(["1", "1", "1", "0"]);
    }
    if spread {
        cmd.args(&keys).arg(BATCH.to_string());
    }
    let rps = requests_per_second(&mut cmd);
    let cpu_s = cpu_seconds(node) - cpu_before;
    let (calls, _) = commandstats(node)
        .get("evalsha")
        .copied()
        .unwrap_or((0, 0.0));
    (rps, cpu_s * 1e6 / (calls as f64 * BATCH as f64))
}

/// The mean Redis CPU of the rows whose name starts with `prefix`.
fn mean_cpu_of(rows: &[BenchRow], prefix: &str) -> f64 {
    let cpus: Vec<f64> = rows
        .iter()
        .filter(|r| r.name.starts_with(prefix))
        .map(|r| r.cpu)
        .collect();
    cpus.iter().sum::<f64>() / cpus.len() as f64
}

/// One `redis-benchmark` run.
struct BenchRow {
    name: String,
    rps: f64,
    cpu: f64,
    usec: f64,
}

impl BenchRow {
    fn new(name: &str, rps: f64, cpu: f64, usec: f64) -> Self {
        BenchRow {
            name: name.to_string(),
            rps,
            cpu,
            usec,
        }
    }
}

/// A store and the servers it decides on (and their replicas).
struct Setup<'a> {
    name: &'static str,
    /// Tasks checking at once.
    tasks: usize,
    limiter: RateLimiter,
    deciding: Vec<(String, &'a dyn Server)>,
    replicas: Vec<&'a dyn Server>,
    /// Per client index, the index in `deciding` of its server (empty: one
    /// server decides everything).
    owners: Arc<Vec<usize>>,
}

/// The servers of a cluster setup: its primaries decide, by `owners`.
struct ClusterNodes<'a> {
    primaries: &'a [Node],
    replicas: &'a [Node],
    owners: Arc<Vec<usize>>,
}

/// A setup on a cluster: `tasks` tasks checking through `limiter`.
fn on_cluster<'a>(
    name: &'static str,
    tasks: usize,
    limiter: RateLimiter,
    nodes: &ClusterNodes<'a>,
) -> Setup<'a> {
    Setup {
        name,
        tasks,
        limiter,
        deciding: nodes
            .primaries
            .iter()
            .map(|p| (format!("primary :{}", p.port()), p as &dyn Server))
            .collect(),
        replicas: nodes.replicas.iter().map(|r| r as &dyn Server).collect(),
        owners: Arc::clone(&nodes.owners),
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let single = RedisServer::start();
    let replicated = RedisServer::start();
    let replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &replicated.port().to_string()]);
    let one = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let _: () = one.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !one
        .cmd::<String>(&["CLUSTER", "INFO"])
        .contains("cluster_state:ok")
    {
        assert!(
            Instant::now() < deadline,
            "the one-node cluster never got ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let cluster = RedisCluster::start();
    let primaries = cluster.primaries();
    let replicas = cluster.replicas();
    let bare = RedisCluster::start_without_replicas();
    let bare_primaries = bare.primaries();
    println!(
        "cluster bench: {TASKS} tasks ({} for the 3x setups), 2 tokio workers, {} s per run, \
         {KEYS} keys at {}",
        3 * TASKS,
        RUN.as_secs(),
        quota()
    );
    // Which primary decides each client: the slot of its bucket's key.
    let owners_in = |cluster: &RedisCluster, primaries: &[Node]| -> Arc<Vec<usize>> {
        let slot_map = cluster.slots();
        let owners = (0..KEYS)
            .map(|k| {
                // Every key of a client hashes by its {hash tag}.
                let slot = key_slot(&format!("tollgate:{{{}}}:", client_name(k)));
                let port = slot_map
                    .iter()
                    .find(|r| r.start <= slot && slot <= r.end)
                    .expect("every slot is served")
                    .primary;
                primaries
                    .iter()
                    .position(|p| p.port() == port)
                    .expect("a primary")
            })
            .collect();
        Arc::new(owners)
    };
    let cluster_nodes = ClusterNodes {
        primaries: &primaries,
        replicas: &replicas,
        owners: owners_in(&cluster, &primaries),
    };
    let bare_nodes = ClusterNodes {
        primaries: &bare_primaries,
        replicas: &[],
        owners: owners_in(&bare, &bare_primaries),
    };
    // The benchmark's slots are Redis's.
    for k in [0, 1, 4_321, KEYS - 1] {
        let key = format!("tollgate:{{{}}}:10/1s:10", client_name(k));
        assert_eq!(key_slot(&key), cluster.keyslot(&key), "{key}");
    }
    let limiter = |builder: tollgate::store::RedisStoreBuilder| {
        // Leases off: this measures the checks' calls (batched per primary).
        let store = builder
            .leases(false)
            .timeout(Duration::from_secs(5))
            .build()
            .expect("store");
        RateLimiter::new(store, quota())
    };
    let setups: Vec<Setup> = vec![
        Setup {
            tasks: TASKS,
            name: "single node",
            limiter: limiter(RedisStore::builder().url(single.url())),
            deciding: vec![(format!("single :{}", single.port()), &single as &dyn Server)],
            replicas: vec![],
            owners: Arc::default(),
        },
        Setup {
            tasks: TASKS,
            name: "single node + replica",
            limiter: limiter(RedisStore::builder().url(replicated.url())),
            deciding: vec![(
                format!("primary :{}", replicated.port()),
                &replicated as &dyn Server,
            )],
            replicas: vec![&replica as &dyn Server],
            owners: Arc::default(),
        },
        Setup {
            tasks: TASKS,
            name: "cluster of 1 node, all slots",
            limiter: limiter(RedisStore::builder().cluster([one.url()])),
            deciding: vec![(format!("node :{}", one.port()), &one as &dyn Server)],
            replicas: vec![],
            owners: Arc::default(),
        },
        on_cluster(
            "cluster, 3 primaries (summed)",
            TASKS,
            limiter(RedisStore::builder().cluster(cluster.seed_urls())),
            &cluster_nodes,
        ),
        // The same cluster with batching off: one script call per decision,
        // what a cluster store did before it batched per node.
        on_cluster(
            "cluster, 3 primaries, unbatched",
            TASKS,
            limiter(
                RedisStore::builder()
                    .cluster(cluster.seed_urls())
                    .max_batch(1),
            ),
            &cluster_nodes,
        ),
        // The cluster with as many tasks per primary as the single node has:
        // each primary's queue as deep as the single node's, as when a
        // cluster serves the load it was sized for.
        on_cluster(
            "cluster, 3 primaries, 3x tasks",
            3 * TASKS,
            limiter(RedisStore::builder().cluster(cluster.seed_urls())),
            &cluster_nodes,
        ),
        // And a cluster of 3 primaries without replicas, as deep: what
        // cluster mode costs a node apart from feeding a replica.
        on_cluster(
            "cluster, no replicas, 3x tasks",
            3 * TASKS,
            limiter(RedisStore::builder().cluster(bare.seed_urls())),
            &bare_nodes,
        ),
    ];
    // Connect everywhere and load the script on every node before measuring.
    runtime.block_on(async {
        for setup in &setups {
            for n in 0..300 {
                let _ = setup
                    .limiter
                    .check(&client(0, n), 1)
                    .await
                    .expect("warm-up");
            }
        }
    });

    let mut runs: Vec<Vec<Run>> = setups.iter().map(|_| Vec::new()).collect();
    for round in 1..=ROUNDS {
        println!("round {round}/{ROUNDS}");
        for (setup, runs) in setups.iter().zip(&mut runs) {
            let limiter = setup.limiter.clone();
            let owners = Arc::clone(&setup.owners);
            runs.push(runtime.block_on(drive(
                setup.tasks,
                limiter,
                &setup.deciding,
                &setup.replicas,
                owners,
            )));
        }
    }

    println!();
    println!(
        "| {:<30} | {:>11} | {:>14} | {:>13} | {:>17} | {:>16} | {:>15} |",
        "store",
        "decisions/s",
        "Redis CPU µs/d",
        "Redis µs/call",
        "commands/decision",
        "replica CPU µs/d",
        "client CPU µs/d"
    );
    println!(
        "|{:-<32}|{:->13}|{:->16}|{:->15}|{:->19}|{:->18}|{:->17}|",
        "", "", "", "", "", "", ""
    );
    for (setup, runs) in setups.iter().zip(&runs) {
        let name = setup.name;
        for r in runs {
            let replica = if setup.replicas.is_empty() {
                "-".to_string()
            } else {
                format!("{:.2}", r.replica_cpu_s * 1e6 / r.decisions as f64)
            };
            println!(
                "| {name:<30} | {:>11.0} | {:>14.2} | {:>13.2} | {:>17.3} | {replica:>16} | {:>15.2} |",
                r.rate(),
                r.cpu_us_per_decision(),
                r.usec_per_call(),
                r.sent as f64 / r.decisions as f64,
                r.client_cpu_us_per_decision(),
            );
        }
    }
    println!();
    println!(
        "Per primary (cluster runs, {TASKS} tasks, {} tasks, {0} tasks without replicas): share of decisions (by client \
         slot), decisions per EVALSHA, CPU µs per decision it served",
        3 * TASKS
    );
    for (i, r) in runs[3].iter().chain(&runs[5]).chain(&runs[6]).enumerate() {
        let line: Vec<String> = r
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "{} {:.1}% {:.1} d/call {:.2} µs/d",
                    n.name,
                    100.0 * n.decided as f64 / r.decisions as f64,
                    n.decided as f64 / n.evalsha.max(1) as f64,
                    n.cpu_s * 1e6 / n.decided.max(1) as f64
                )
            })
            .collect();
        println!("  run {}: {}", i + 1, line.join(", "));
    }
    let mean =
        |runs: &[Run], f: fn(&Run) -> f64| runs.iter().map(f).sum::<f64>() / runs.len() as f64;
    println!();
    for (of, to) in [
        (3, 0),
        (3, 1),
        (2, 0),
        (4, 0),
        (3, 4),
        (5, 0),
        (5, 1),
        (6, 0),
    ] {
        let (a, b) = (&runs[of], &runs[to]);
        println!(
            "{} / {}, means of the runs: Redis CPU per decision {:.2}x, \
             decisions/s {:.2}x, client CPU per decision {:.2}x",
            setups[of].name,
            setups[to].name,
            mean(a, Run::cpu_us_per_decision) / mean(b, Run::cpu_us_per_decision),
            mean(a, Run::rate) / mean(b, Run::rate),
            mean(a, Run::client_cpu_us_per_decision) / mean(b, Run::client_cpu_us_per_decision),
        );
    }
    println!();
    println!("redis-benchmark EVALSHA, 50 clients, -P 16 (no tollgate client):");
    println!(
        "| {:<30} | {:>11} | {:>14} | {:>13} |",
        "servers", "calls/s", "Redis CPU µs/c", "Redis µs/call"
    );
    println!("|{:-<32}|{:->13}|{:->16}|{:->15}|", "", "", "", "");
    // A hash tag each primary owns, so that its keys stay on it.
    let tags: Vec<String> = primaries
        .iter()
        .map(|p| {
            (0..)
                .map(|i| format!("t{i}"))
                .find(|t| cluster.primary_for_key(&format!("{{{t}}}")) == *p)
                .expect("a tag")
        })
        .collect();
    let random_key = "tollgate:{user:__rand_int__}:10/1s:10";
    let mut rows: Vec<BenchRow> = Vec::new();
    for _ in 0..2 {
        let (rps, cpu, usec) = redis_benchmark(single.port(), random_key, &single);
        rows.push(BenchRow::new("single node", rps, cpu, usec));
        let (rps, cpu, usec) = redis_benchmark(one.port(), random_key, &one);
        rows.push(BenchRow::new(
            "cluster of 1 node, all slots",
            rps,
            cpu,
            usec,
        ));
        for (p, tag) in primaries.iter().zip(&tags) {
            let key = format!("tollgate:{{{tag}}}:user:__rand_int__:10/1s:10");
            let (rps, cpu, usec) = redis_benchmark(p.port(), &key, p);
            rows.push(BenchRow::new(
                &format!("cluster primary :{}", p.port()),
                rps,
                cpu,
                usec,
            ));
        }
    }
    for r in &rows {
        println!(
            "| {:<30} | {:>11.0} | {:>14.2} | {:>13.2} |",
            r.name, r.rps, r.cpu, r.usec
        );
    }
    let mean_cpu = |prefix: &str| mean_cpu_of(&rows, prefix);
    println!(
        "redis-benchmark, Redis CPU per call: cluster of 1 node / single node {:.2}x, \
         a cluster primary / single node {:.2}x",
        mean_cpu("cluster of 1") / mean_cpu("single"),
        mean_cpu("cluster primary") / mean_cpu("single")
    );
    // The same comparison at 16 decisions per call, as batching sends them:
    // what a node pays per decision once the per-call cost is spread, with
    // the production script and with the cluster store's batch script.
    println!();
    println!(
        "redis-benchmark EVALSHA of 16 decisions per call (one hash tag), 50 clients, -P 4 \
         (no tollgate client):"
    );
    println!(
        "| {:<44} | {:>11} | {:>14} |",
        "servers, script", "calls/s", "Redis CPU µs/d"
    );
    println!("|{:-<46}|{:->13}|{:->16}|", "", "", "");
    let (primary, tag) = (&primaries[0], &tags[0]);
    let primary_name = format!("cluster primary :{}, batch script", primary.port());
    let targets: [(&str, u16, &str, &dyn Server, bool); 4] = [
        (
            "single node, token_bucket.lua",
            single.port(),
            "t",
            &single,
            false,
        ),
        (
            "cluster of 1 node, token_bucket.lua",
            one.port(),
            "t",
            &one,
            false,
        ),
        (
            "cluster of 1 node, batch script",
            one.port(),
            "t",
            &one,
            true,
        ),
        (&primary_name, primary.port(), tag, primary, true),
    ];
    let mut batched: Vec<BenchRow> = Vec::new();
    for _ in 0..2 {
        for (name, port, tag, node, spread) in targets {
            let (rps, cpu) = redis_benchmark_batched(port, tag, node, spread);
            batched.push(BenchRow::new(name, rps, cpu, 0.0));
        }
    }
    for r in &batched {
        println!("| {:<44} | {:>11.0} | {:>14.2} |", r.name, r.rps, r.cpu);
    }
    let mean_batched = |prefix: &str| mean_cpu_of(&batched, prefix);
    let single_cpu = mean_batched("single node");
    println!(
        "redis-benchmark, 16 decisions per call, Redis CPU per decision against the single node: \
         cluster of 1 node {:.2}x, with the batch script {:.2}x, a cluster primary with the batch \
         script {:.2}x",
        mean_batched("cluster of 1 node, token") / single_cpu,
        mean_batched("cluster of 1 node, batch") / single_cpu,
        mean_batched("cluster primary") / single_cpu
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average: {}", load.trim());
}
