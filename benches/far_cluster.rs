//! Batching on a far Redis Cluster: does it cost a check a round trip?
//! `RedisStore` on a 3-primary cluster with its default batching against the
//! same store with batching off (`max_batch(1)`), with every node a round trip
//! of about 2 x `DELAY_MS` away ("far") and on loopback ("near", for
//! reference). The single-node counterpart is `benches/far_redis.sh`.
//!
//! Run: `cargo bench --bench far_cluster --features cluster` (under 3
//! minutes with the defaults; `ROUNDS=1 DURATION=2` for a quick trial).
//! Needs redis-server and redis-cli (7.0 or later).
//!
//! Set-up: 3 cluster primaries without replicas (the test harness's
//! `RedisCluster::start_without_replicas`), and in front of each the
//! harness's delay line (`Proxy::start_delayed`, in this process: a reader
//! thread per direction stamps each chunk with its due time, a writer thread
//! passes chunks on in order, each at its time, with `std::thread::sleep`;
//! `TCP_NODELAY` on both sockets) that holds every chunk `DELAY_MS` each
//! way. For the far runs each primary announces its proxy's port
//! (`CONFIG SET cluster-announce-port`; the cluster bus keeps its real port,
//! `cluster-announce-bus-port`), so `CLUSTER SLOTS` names the proxies and
//! the store, seeded with the proxies' addresses, reaches every node
//! through its proxy; for the near runs the announced ports are reset (0)
//! and the store is seeded with the nodes' own addresses. Both are checked
//! before the runs (every primary's `CLUSTER SLOTS`) and at the end of each
//! run (the ports of this process's TCP connections: a far run must hold
//! none to a node directly. The proxies run in this process, so their own
//! connections to the nodes, one for each connection they accepted, are
//! left out: those to a node are counted less those a proxy accepted).
//!
//! Each run: a new store (default batching, or `max_batch(1)`; both with a
//! 2 s call timeout so that a stall on a busy machine shows as latency, not
//! as errors), `N` tokio tasks (a `WORKERS`-thread runtime) each checking in a
//! closed loop a key drawn at random among `KEYS`, at
//! `Quota::per_second(1_000_000)` (every check admitted), `WARMUP` s, then
//! `DURATION` s measured: every check's latency is recorded. Reported per
//! run: p50, p90, p99 and mean of the recorded latencies, decisions/s
//! (checks started and answered in the measured window, by its length),
//! script calls per
//! decision (`EVALSHA` + `EVAL` over the 3 primaries, `INFO commandstats`
//! read at the window's start and end), errors and denials (both should be
//! 0), and this process's connections to the proxies and to the nodes.
//! Runs alternate batched and unbatched at each concurrency, the order
//! turning each round; the summary gives the medians over the rounds, the
//! ratios batched / unbatched of those medians (p50 and decisions/s), the
//! difference of the p50s in ms and, far, in round trips (the median far
//! `PING`: were the median check to wait for a call in flight before its
//! own went out, it would show as about +1 there), and the lowest and
//! highest of each round's own ratios (its two runs side by side): the
//! noise to read the ratios against.
//!
//! Environment (defaults in brackets):
//!   ROUNDS [5]         rounds; every run once per round
//!   DURATION [2]       measured seconds per run;  WARMUP [0.5] before it
//!   CONNS ["1 4 16"]   concurrent callers
//!   KEYS [1000]        keys, drawn at random per check
//!   DELAY_MS [0.5]     the proxies' hold per chunk and direction, in ms
//!                      (decimals allowed, to the microsecond): a round trip
//!                      of about 2 x DELAY_MS plus the threads' wake-ups,
//!                      measured (median `PING` per proxy) and printed
//!   MODES ["far near"]
//!   WORKERS [2]        tokio worker threads
//!
//! On 2 cores the 3 redis-servers, the proxies' threads and the benchmark
//! share the CPU: the near runs are CPU-bound and only a reference; the far
//! runs are bound by the round trip.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use support::Proxy;
use support::cluster::{RedisCluster, parse_cluster_slots};
use support::node::Node;
use tollgate::{Policy, Quota, RedisStore, Store};

/// Settings, from the environment.
struct Settings {
    rounds: usize,
    duration: Duration,
    warmup: Duration,
    conns: Vec<usize>,
    keys: u64,
    /// `DELAY_MS` as given, for the report.
    delay_ms: f64,
    /// The hold per chunk and direction.
    delay: Duration,
    modes: Vec<Mode>,
    workers: usize,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} does not parse")),
        Err(_) => default,
    }
}

impl Settings {
    fn from_env() -> Self {
        let delay_ms = env_or("DELAY_MS", 0.5f64);
        let delay = Duration::try_from_secs_f64(delay_ms / 1e3)
            .unwrap_or_else(|_| panic!("DELAY_MS={delay_ms}: milliseconds, 0 or more"));
        let conns = std::env::var("CONNS").unwrap_or_else(|_| "1 4 16".into());
        let modes = std::env::var("MODES").unwrap_or_else(|_| "far near".into());
        Settings {
            rounds: env_or("ROUNDS", 5usize).max(1),
            duration: Duration::from_secs_f64(env_or("DURATION", 2.0f64)),
            warmup: Duration::from_secs_f64(env_or("WARMUP", 0.5f64)),
            conns: conns
                .split_whitespace()
                .map(|c| c.parse().expect("CONNS: numbers"))
                .collect(),
            keys: env_or("KEYS", 1000u64).max(1),
            delay_ms,
            delay,
            modes: modes
                .split_whitespace()
                .map(|m| match m {
                    "far" => Mode::Far,
                    "near" => Mode::Near,
                    other => panic!("MODES: far or near, not {other:?}"),
                })
                .collect(),
            workers: env_or("WORKERS", 2usize).max(1),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    Far,
    Near,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Far => "far",
            Mode::Near => "near",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    Batched,
    Unbatched,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Batched => "batched",
            Variant::Unbatched => "unbatched",
        }
    }
}

/// Has every primary announce its proxy's port (`Some`) or its own (`None`),
/// the bus on its real port, and waits until every primary's `CLUSTER
/// SLOTS` names the announced ports; returns them.
fn announce(primaries: &[Node], proxies: Option<&[Proxy]>) -> Vec<u16> {
    let mut want = Vec::new();
    for (i, p) in primaries.iter().enumerate() {
        let port = proxies.map_or(0, |ps| ps[i].port());
        let bus = p.bus_port().expect("a cluster node has a bus port");
        let _: () = p.cmd(&[
            "CONFIG",
            "SET",
            "cluster-announce-port",
            &port.to_string(),
            "cluster-announce-bus-port",
            &bus.to_string(),
        ]);
        want.push(if port == 0 { p.port() } else { port });
    }
    want.sort_unstable();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let agreed = primaries.iter().all(|p| {
            parse_cluster_slots(p.cmd(&["CLUSTER", "SLOTS"])).is_ok_and(|ranges| {
                let seen: BTreeSet<u16> = ranges.iter().map(|r| r.primary).collect();
                seen.into_iter().collect::<Vec<_>>() == want
            })
        });
        if agreed {
            return want;
        }
        assert!(
            Instant::now() < deadline,
            "the primaries never announced ports {want:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `CLUSTER SLOTS` as ranges and the port each names, for the log.
fn slots_line(node: &Node) -> String {
    let ranges = parse_cluster_slots(node.cmd(&["CLUSTER", "SLOTS"])).expect("CLUSTER SLOTS");
    ranges
        .iter()
        .map(|r| format!("{}-{} -> {}", r.start, r.end, r.primary))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The median of `n` `PING`s on one connection to `port`, in ms.
fn ping_ms(port: u16, n: usize) -> f64 {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("client");
    let mut conn = client.get_connection().expect("connection");
    let mut times: Vec<f64> = (0..n)
        .map(|_| {
            let start = Instant::now();
            let _: String = redis::cmd("PING").query(&mut conn).expect("PING");
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The (local, remote) ports of this process's established TCP connections
/// (its socket inodes in `/proc/self/fd`, looked up in `/proc/net/tcp`).
fn my_connections() -> Vec<(u16, u16)> {
    let inodes: BTreeSet<String> = std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let port = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() < 10 || f[3] != "01" || !inodes.contains(f[9]) {
                continue;
            }
            if let (Some(local), Some(remote)) = (port(f[1]), port(f[2])) {
                ports.push((local, remote));
            }
        }
    }
    ports
}

/// Script calls (`EVALSHA` + `EVAL`) so far, over `primaries`.
fn script_calls(primaries: &[Node]) -> u64 {
    primaries
        .iter()
        .map(|p| p.calls("evalsha") + p.calls("eval"))
        .sum()
}

/// What one run measured.
struct Run {
    round: usize,
    mode: Mode,
    conns: usize,
    variant: Variant,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    mean_ms: f64,
    rate: f64,
    calls_per_decision: f64,
    errors: u64,
    denied: u64,
    /// This process's connections to the proxies.
    via_proxies: usize,
    /// This process's connections to the nodes, less the proxies' own.
    direct: usize,
}

/// A small, fast generator per task (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// What one task saw in the measured window.
#[derive(Default)]
struct Seen {
    latencies_ns: Vec<u64>,
    errors: u64,
    denied: u64,
}

#[allow(clippy::too_many_arguments)]
async fn run_one(
    s: &Settings,
    primaries: &[Node],
    proxy_ports: &[u16],
    seeds: Vec<String>,
    mode: Mode,
    conns: usize,
    variant: Variant,
    seed: u64,
) -> Run {
    // Leases off: this measures the checks' calls against a far cluster.
    let mut builder = RedisStore::builder()
        .leases(false)
        .cluster(seeds)
        .timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(5));
    if variant == Variant::Unbatched {
        builder = builder.max_batch(1);
    }
    let store = builder.build().expect("cluster store");
    let policy = Policy::from(Quota::per_second(1_000_000).expect("quota"));
    let keys: Arc<Vec<String>> = Arc::new((0..s.keys).map(|k| format!("user:{k}")).collect());
    let measure_from = Instant::now() + s.warmup;
    let until = measure_from + s.duration;
    let tasks: Vec<_> = (0..conns)
        .map(|task| {
            let (store, policy, keys) = (store.clone(), policy.clone(), Arc::clone(&keys));
            let mut rng = Rng((seed ^ (task as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1);
            tokio::spawn(async move {
                let mut seen = Seen::default();
                loop {
                    let key = &keys[rng.below(keys.len() as u64) as usize];
                    let start = Instant::now();
                    if start >= until {
                        break;
                    }
                    let outcome = store.check(key, &policy, 1).await;
                    let took = start.elapsed();
                    if start < measure_from || start + took > until {
                        continue;
                    }
                    match outcome {
                        Ok(d) => {
                            if !d.allowed() {
                                seen.denied += 1;
                            }
                            seen.latencies_ns
                                .push(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
                        }
                        Err(_) => seen.errors += 1,
                    }
                }
                seen
            })
        })
        .collect();
    tokio::time::sleep_until(measure_from.into()).await;
    let before = {
        let primaries = primaries.to_vec();
        tokio::task::spawn_blocking(move || script_calls(&primaries))
            .await
            .expect("commandstats")
    };
    tokio::time::sleep_until(until.into()).await;
    // Connections while the store still holds them.
    let connections = my_connections();
    let after = {
        let primaries = primaries.to_vec();
        tokio::task::spawn_blocking(move || script_calls(&primaries))
            .await
            .expect("commandstats")
    };
    let mut all = Seen::default();
    for t in tasks {
        let seen = t.await.expect("task");
        all.latencies_ns.extend(seen.latencies_ns);
        all.errors += seen.errors;
        all.denied += seen.denied;
    }
    drop(store);
    let mut lat = all.latencies_ns;
    lat.sort_unstable();
    let pct = |q: f64| {
        lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
            .map_or(f64::NAN, |&ns| ns as f64 / 1e6)
    };
    let node_ports: Vec<u16> = primaries.iter().map(Node::port).collect();
    let count = |f: &dyn Fn(&(u16, u16)) -> bool| connections.iter().filter(|c| f(c)).count();
    // The store's connections to the proxies, the proxies' ends of them, and
    // everything to a node: the proxies' own (one per connection accepted)
    // and any the store made directly.
    let via_proxies = count(&|(_, remote)| proxy_ports.contains(remote));
    let proxied = count(&|(local, _)| proxy_ports.contains(local));
    let to_nodes = count(&|(_, remote)| node_ports.contains(remote));
    let decisions = lat.len() as f64;
    Run {
        round: 0,
        mode,
        conns,
        variant,
        p50_ms: pct(0.5),
        p90_ms: pct(0.9),
        p99_ms: pct(0.99),
        mean_ms: lat.iter().map(|&ns| ns as f64).sum::<f64>() / decisions.max(1.0) / 1e6,
        rate: decisions / s.duration.as_secs_f64(),
        calls_per_decision: after.saturating_sub(before) as f64 / decisions.max(1.0),
        errors: all.errors,
        denied: all.denied,
        via_proxies,
        direct: to_nodes.saturating_sub(proxied),
    }
}

/// The median of the finite values (a stalled run has no p50).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.retain(|x| x.is_finite());
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn main() {
    let s = Settings::from_env();
    let load_start = load_average();
    let started = Instant::now();
    eprintln!("far_cluster: starting 3 cluster primaries and their delay proxies...");
    let cluster = RedisCluster::start_without_replicas();
    let primaries = cluster.primaries();
    let proxies: Vec<Proxy> = primaries
        .iter()
        .map(|p| Proxy::start_delayed(p.port(), s.delay))
        .collect();
    let proxy_ports: Vec<u16> = proxies.iter().map(Proxy::port).collect();
    let node_urls: Vec<String> = primaries.iter().map(Node::url).collect();
    let proxy_urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    for (p, x) in primaries.iter().zip(&proxies) {
        eprintln!(
            "  primary on port {} (bus {}), its proxy on port {}",
            p.port(),
            p.bus_port().unwrap_or(0),
            x.port()
        );
    }
    // Round trips, and the slot map each mode gives clients.
    announce(&primaries, None);
    let near_slots = slots_line(&primaries[0]);
    announce(&primaries, Some(&proxies));
    let far_slots = slots_line(&primaries[0]);
    let far_nodes: String = primaries[0].cmd(&["CLUSTER", "NODES"]);
    let far_ping: Vec<f64> = proxy_ports.iter().map(|&p| ping_ms(p, 21)).collect();
    let near_ping: Vec<f64> = primaries.iter().map(|p| ping_ms(p.port(), 21)).collect();
    let mut announced = Some(Mode::Far);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(s.workers)
        .enable_all()
        .build()
        .expect("runtime");
    let per_round = s.modes.len() * s.conns.len() * 2;
    eprintln!(
        "far_cluster: {per_round} runs x {} rounds, {:?} each (+{:?} warm-up), {} keys",
        s.rounds, s.duration, s.warmup, s.keys
    );
    let mut runs: Vec<Run> = Vec::new();
    for round in 0..s.rounds {
        // Modes in turn, reversed every other round (one switch fewer);
        // batched and unbatched side by side, their order turning too.
        let mut modes = s.modes.clone();
        if round % 2 == 1 {
            modes.reverse();
        }
        for mode in modes {
            if announced != Some(mode) {
                announce(&primaries, (mode == Mode::Far).then_some(&proxies[..]));
                announced = Some(mode);
            }
            let seeds = match mode {
                Mode::Far => proxy_urls.clone(),
                Mode::Near => node_urls.clone(),
            };
            for (i, &c) in s.conns.iter().enumerate() {
                let mut variants = [Variant::Batched, Variant::Unbatched];
                if (round + i) % 2 == 1 {
                    variants.reverse();
                }
                for v in variants {
                    let seed = (round as u64) << 32 | (c as u64) << 8 | v as u64;
                    let r = runtime.block_on(run_one(
                        &s,
                        &primaries,
                        &proxy_ports,
                        seeds.clone(),
                        mode,
                        c,
                        v,
                        seed,
                    ));
                    eprintln!(
                        "  {:<4} c={:<3} {:<9} round {}: p50 {:7.3} ms  p90 {:7.3}  p99 {:7.3}  mean {:7.3}  {:8.0} decisions/s  {:.3} calls/decision  errors {}  denied {}  connections: {} to proxies, {} to nodes",
                        r.mode.name(),
                        r.conns,
                        r.variant.name(),
                        round + 1,
                        r.p50_ms,
                        r.p90_ms,
                        r.p99_ms,
                        r.mean_ms,
                        r.rate,
                        r.calls_per_decision,
                        r.errors,
                        r.denied,
                        r.via_proxies,
                        r.direct
                    );
                    runs.push(Run { round, ..r });
                }
            }
        }
    }
    drop(runtime);
    let load_end = load_average();

    let fmt = |xs: &[f64]| {
        xs.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!();
    println!(
        "far_cluster: 3 primaries, {} rounds, {} s measured (+{} s warm-up) per run, {} keys at random, all admitted, {} cores, {} tokio workers",
        s.rounds,
        s.duration.as_secs_f64(),
        s.warmup.as_secs_f64(),
        s.keys,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        s.workers
    );
    println!(
        "PING median by primary, ms: far (delay line, {} ms a chunk each way) {}; near {}",
        s.delay_ms,
        fmt(&far_ping),
        fmt(&near_ping)
    );
    println!("CLUSTER SLOTS far:  {far_slots}");
    println!("CLUSTER SLOTS near: {near_slots}");
    println!("CLUSTER NODES far (bus ports after @):");
    for line in far_nodes.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        println!(
            "  {}",
            f.iter().take(3).copied().collect::<Vec<_>>().join(" ")
        );
    }
    println!("1-minute load average: {load_start} before, {load_end} after");
    // The far round trip, to tell what batching adds in round trips.
    let far_rtt = median(far_ping.clone());
    println!();
    println!(
        "{:<4} {:>5} | {:^40} | {:^40} | {:^15} | {:^19}",
        "",
        "",
        "batched (default)",
        "unbatched (max_batch(1))",
        "batched/unbatched",
        "batched-unbatched"
    );
    println!(
        "{:<4} {:>5} | {:>8} {:>8} {:>10} {:>10} | {:>8} {:>8} {:>10} {:>10} | {:>6} {:>8} | {:>9} {:>9}",
        "mode",
        "conns",
        "p50 ms",
        "p99 ms",
        "dec/s",
        "calls/dec",
        "p50 ms",
        "p99 ms",
        "dec/s",
        "calls/dec",
        "p50",
        "dec/s",
        "p50 ms",
        "in RTTs"
    );
    let mut misses = Vec::new();
    let mut problems = Vec::new();
    let mut spreads = Vec::new();
    for &mode in &s.modes {
        for &c in &s.conns {
            let of = |v: Variant| -> Vec<&Run> {
                runs.iter()
                    .filter(|r| r.mode == mode && r.conns == c && r.variant == v)
                    .collect()
            };
            let (b, u) = (of(Variant::Batched), of(Variant::Unbatched));
            let med = |rs: &[&Run], f: fn(&Run) -> f64| median(rs.iter().map(|r| f(r)).collect());
            let (bp, up) = (med(&b, |r| r.p50_ms), med(&u, |r| r.p50_ms));
            let (br, ur) = (med(&b, |r| r.rate), med(&u, |r| r.rate));
            let (p_ratio, r_ratio) = (bp / up, br / ur);
            // Each round's own ratios (its two runs ran side by side): their
            // spread is the noise the medians are read against.
            let paired: Vec<(f64, f64)> = b
                .iter()
                .filter_map(|x| {
                    let y = u.iter().find(|y| y.round == x.round)?;
                    // A run without decisions (a stall) has no ratio.
                    (x.rate > 0.0 && y.rate > 0.0).then(|| (x.p50_ms / y.p50_ms, x.rate / y.rate))
                })
                .collect();
            let range = |f: fn(&(f64, f64)) -> f64| {
                let xs: Vec<f64> = paired.iter().map(f).collect();
                let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                format!("{lo:.2}-{hi:.2}")
            };
            spreads.push(format!(
                "{:<4} {:>5} | p50 {}  dec/s {}",
                mode.name(),
                c,
                range(|p| p.0),
                range(|p| p.1)
            ));
            let in_rtts = match mode {
                Mode::Far => format!("{:+.3}", (bp - up) / far_rtt),
                Mode::Near => "-".to_string(),
            };
            println!(
                "{:<4} {:>5} | {:>8.3} {:>8.3} {:>10.0} {:>10.3} | {:>8.3} {:>8.3} {:>10.0} {:>10.3} | {:>6.2} {:>8.2} | {:>+9.3} {:>9}",
                mode.name(),
                c,
                bp,
                med(&b, |r| r.p99_ms),
                br,
                med(&b, |r| r.calls_per_decision),
                up,
                med(&u, |r| r.p99_ms),
                ur,
                med(&u, |r| r.calls_per_decision),
                p_ratio,
                r_ratio,
                bp - up,
                in_rtts
            );
            if mode == Mode::Far && !(p_ratio <= 1.0 && r_ratio >= 1.0) {
                misses.push(format!(
                    "c={c} (p50 {p_ratio:.3}x, decisions/s {r_ratio:.3}x)"
                ));
            }
        }
    }
    for r in &runs {
        if r.rate == 0.0 {
            problems.push(format!(
                "{} c={} {} round {}: no check both started and answered in the measured window (a stall)",
                r.mode.name(),
                r.conns,
                r.variant.name(),
                r.round + 1
            ));
        }
        if r.errors > 0 || r.denied > 0 {
            problems.push(format!(
                "{} c={} {}: {} errors, {} denied",
                r.mode.name(),
                r.conns,
                r.variant.name(),
                r.errors,
                r.denied
            ));
        }
        if r.mode == Mode::Far && (r.direct > 0 || r.via_proxies == 0) {
            problems.push(format!(
                "far c={} {}: {} connections to the nodes directly, {} to the proxies",
                r.conns,
                r.variant.name(),
                r.direct,
                r.via_proxies
            ));
        }
    }
    println!(
        "(medians over the rounds; calls/dec: script calls over the 3 primaries per decision)"
    );
    println!("batched/unbatched in each round (lowest-highest over the rounds):");
    for line in &spreads {
        println!("  {line}");
    }
    if s.modes.contains(&Mode::Far) {
        let far: Vec<&Run> = runs.iter().filter(|r| r.mode == Mode::Far).collect();
        println!(
            "far runs: connections of this process at the end of each run: {}-{} to the proxies, {} to the nodes directly",
            far.iter().map(|r| r.via_proxies).min().unwrap_or(0),
            far.iter().map(|r| r.via_proxies).max().unwrap_or(0),
            far.iter().map(|r| r.direct).max().unwrap_or(0),
        );
        if misses.is_empty() {
            println!(
                "target (far: batched p50 <= 1.00x unbatched, decisions/s >= 1.00x): met at every concurrency"
            );
        } else {
            println!(
                "target (far: batched p50 <= 1.00x unbatched, decisions/s >= 1.00x): missed at {}",
                misses.join(", ")
            );
        }
    }
    for p in &problems {
        println!("problem: {p}");
    }
    println!("total time: {:.0} s", started.elapsed().as_secs_f64());
    drop(proxies);
    drop(cluster);
}
