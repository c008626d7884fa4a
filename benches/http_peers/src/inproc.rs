//! `inproc-peers`: tollgate against governor in process, without sockets, in
//! alternating rounds, printing medians and ratios of the same run.
//!
//! ```sh
//! cargo run --release --manifest-path benches/http_peers/Cargo.toml --bin inproc-peers
//! ROUNDS=5 OPS=1000000 KEYS="1 10000 1000000" cargo run --release ... --bin inproc-peers
//! ```
//!
//! For each key count (`KEYS`, default `1 10000 1000000`), one thread, every
//! decision admitted (10^9 a second per key, burst 10^9), keys
//! `c0`..`c{K-1}` taken in turn (each one seen before, after a first pass):
//!
//! - **engine**: governor's keyed limiter (`RateLimiter::keyed`,
//!   `check_key`) against tollgate's `RateLimiter::check` on a
//!   `MemoryStore`, in one `block_on` (no runtime cost per call);
//! - **layer**: a trivial service answering at once, bare, behind
//!   tower_governor (keyed by the `x-client` header) and behind
//!   `RateLimitLayer` (the same header, verbatim), with and without rate
//!   limit headers; the layer's cost is the variant's time less the bare
//!   service's of the same round; and `RateLimitLayer` again with
//!   `decision_in_request(false)` (tower_governor puts no decision in the
//!   request's extensions);
//! - **two threads**: the engines again, two threads on one limiter, each
//!   its half of the keys; nanoseconds of wall time a decision;
//! - **Redis with leases** (with `REDIS_URL` set, up to 10 000 keys): the
//!   engine and the layer (without headers and with) on a `RedisStore` with leases on
//!   (a tenth of `OPS` each round, after passes over every key that give
//!   each one a lease, see below);
//! - **bytes a key**: the resident memory a limiter takes for `K` keys
//!   (only for the largest `K`), each in a fresh process of this binary;
//!   with `REDIS_URL`, the lease map's too (a `RedisStore` with leases,
//!   every key checked six times so that it holds a lease; at most 100 000
//!   keys, the lease map's default bound) against the memory store's at
//!   the same count.
//!
//! Rounds alternate the variants (`ROUNDS`, default 5, `OPS` decisions each,
//! default 1 000 000); the medians of the rounds are printed, then the ratios
//! tollgate / governor. Run it on an otherwise idle machine.

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, Response};
use tower::{Layer, Service, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const KEY_HEADER: &str = "x-client";

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn keys(k: usize) -> Vec<String> {
    (0..k).map(|i| format!("c{i}")).collect()
}

/// governor's quota and tollgate's: 10^9 a second, burst 10^9, so that
/// every decision of a run is admitted however fast it goes.
fn governor_quota() -> governor::Quota {
    let n = NonZeroU32::new(1_000_000_000).expect("nonzero");
    governor::Quota::per_second(n).allow_burst(n)
}

fn tollgate_quota() -> tollgate::Quota {
    tollgate::Quota::per_second(1_000_000_000).expect("quota")
}

/// A memory store with room for `k` keys and an eighth more (the default
/// holds 100 000; governor has no bound), so no key is forgotten during a
/// run: a store's bound is split evenly among its shards, and keys do not
/// hash quite evenly (with room for exactly 1 000 000 keys, about half of
/// the 64 shards of a store holding 1 000 000 were over their share, and
/// every pass evicted and made keys again). Room costs nothing until used.
fn store(k: usize) -> Result<tollgate::MemoryStore, BoxError> {
    Ok(tollgate::MemoryStore::with_max_keys(
        (k + k / 8).max(tollgate::store::DEFAULT_MAX_KEYS),
    )?)
}

/// Nanoseconds per call of `f` over `ops` calls.
fn per_op(ops: usize, mut f: impl FnMut(usize)) -> f64 {
    let start = Instant::now();
    for i in 0..ops {
        f(i);
    }
    start.elapsed().as_nanos() as f64 / ops as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn request(key: &str) -> Request<Body> {
    Request::get("/")
        .header(KEY_HEADER, key)
        .body(Body::empty())
        .expect("request")
}

#[derive(Clone)]
struct ClientHeader;

impl tower_governor::key_extractor::KeyExtractor for ClientHeader {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, tower_governor::GovernorError> {
        req.headers()
            .get(KEY_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

/// The service every layer wraps: answers at once.
fn bare() -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
+ Clone
+ Send {
    tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    })
}

/// `RateLimitLayer` over `store` under a policy `name`d, keyed by the
/// `x-client` header verbatim, around the bare service: with the IETF rate
/// limit headers or none, with the decision in the request's extensions or
/// not.
fn tollgate_layer(
    store: impl Into<tollgate::AnyStore>,
    name: &str,
    headers: bool,
    in_request: bool,
) -> Result<
    impl Service<Request<Body>, Response = Response<Body>, Error: std::fmt::Debug + Send, Future: Send>
    + Clone
    + Send
    + 'static,
    BoxError,
> {
    let style = match headers {
        true => tollgate::layer::HeaderStyle::Ietf,
        false => tollgate::layer::HeaderStyle::None,
    };
    Ok(tollgate::layer::RateLimitLayer::new(
        store,
        tollgate::Policy::new(name, [tollgate_quota()])?,
    )
    .key(tollgate::key::Header::new(KEY_HEADER)?.verbatim())
    .headers(style)
    .decision_in_request(in_request)
    .axum_body()
    .layer(bare()))
}

/// Runs `ops` requests through `svc`, keys in turn; nanoseconds a request.
async fn drive<S>(svc: &mut S, keys: &[String], ops: usize) -> f64
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    for i in 0..ops {
        let res = svc
            .ready()
            .await
            .expect("ready")
            .call(request(&keys[i % keys.len()]))
            .await
            .expect("answer");
        assert!(res.status().is_success(), "refused: {}", res.status());
    }
    start.elapsed().as_nanos() as f64 / ops as f64
}

/// Checks every key six times through `layer`, many at once, so that
/// each one gets a lease (see the Redis rows in `main`).
fn warm_layer<S>(rt: &tokio::runtime::Runtime, layer: &S, keys: &[String])
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug + Send,
{
    rt.block_on(async {
        for chunk in keys.chunks(WARM_KEYS) {
            let mut calls = tokio::task::JoinSet::new();
            for key in chunk.iter().flat_map(|key| [key; 6]) {
                let (mut layer, req) = (layer.clone(), request(key));
                calls.spawn(async move { layer.ready().await?.call(req).await });
            }
            while let Some(res) = calls.join_next().await {
                let res = res.expect("joined").expect("answer");
                assert!(res.status().is_success(), "refused: {}", res.status());
            }
        }
    });
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("bytes") {
        return bytes_mode(&args[2], args[3].parse()?);
    }
    let rounds = env("ROUNDS", 5);
    let ops = env("OPS", 1_000_000);
    let counts: Vec<usize> = std::env::var("KEYS")
        .unwrap_or_else(|_| "1 10000 1000000".into())
        .split_whitespace()
        .map(|k| k.parse().expect("a key count"))
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    println!("in-process peers: {rounds} rounds x {ops} decisions, one thread, medians in ns");
    for &k in &counts {
        let keys = keys(k);
        let gov = governor::RateLimiter::keyed(governor_quota());
        let toll = tollgate::RateLimiter::new(store(k)?, tollgate_quota());
        let gov_cfg = tower_governor::governor::GovernorConfigBuilder::default()
            .period(Duration::from_nanos(1))
            .burst_size(1_000_000_000)
            .key_extractor(ClientHeader)
            .finish()
            .ok_or("governor config")?;
        let gov_hdr_cfg = tower_governor::governor::GovernorConfigBuilder::default()
            .period(Duration::from_nanos(1))
            .burst_size(1_000_000_000)
            .key_extractor(ClientHeader)
            .use_headers()
            .finish()
            .ok_or("governor config")?;
        let mut plain = bare();
        let mut gov_layer = tower_governor::GovernorLayer::new(gov_cfg).layer(bare());
        let mut gov_headers = tower_governor::GovernorLayer::new(gov_hdr_cfg).layer(bare());
        let mut toll_layer = tollgate_layer(store(k)?, "bare", false, true)?;
        let mut toll_headers = tollgate_layer(store(k)?, "headers", true, true)?;
        // The same two, without the decision in the request's extensions
        // (`decision_in_request(false)`): tower_governor puts none there.
        let mut toll_out = tollgate_layer(store(k)?, "out", false, false)?;
        let mut toll_out_headers = tollgate_layer(store(k)?, "out-headers", true, false)?;
        // A first pass over every key (not measured): keys seen before.
        let warm = k.max(10_000);
        per_op(warm, |i| {
            let _ = gov.check_key(&keys[i % k]);
        });
        rt.block_on(async {
            for i in 0..warm {
                let key = &keys[i % k];
                assert!(toll.check(key, 1).await.expect("decision").allowed());
            }
            drive(&mut gov_layer, &keys, warm).await;
            drive(&mut gov_headers, &keys, warm).await;
            drive(&mut toll_layer, &keys, warm).await;
            drive(&mut toll_headers, &keys, warm).await;
            drive(&mut toll_out, &keys, warm).await;
            drive(&mut toll_out_headers, &keys, warm).await;
        });
        // With REDIS_URL: the engine and the layer on Redis with leases.
        let redis = match std::env::var("REDIS_URL") {
            Ok(url) if k <= LEASED_ROUNDS_KEYS => Some(url),
            _ => None,
        };
        let leased = match &redis {
            Some(url) => Some(rt.block_on(async {
                // A generous timeout: a first pass takes a lease per key.
                let store = tollgate::RedisStore::builder()
                    .url(url.as_str())
                    .leases(true)
                    .timeout(Duration::from_secs(2))
                    .build()?;
                let limiter = tollgate::RateLimiter::new(
                    store.clone(),
                    tollgate::Policy::new("leased", [tollgate_quota()])?,
                );
                let layer = tollgate_layer(store.clone(), "leased-layer", false, true)?;
                let with_headers = tollgate_layer(store.clone(), "leased-headers", true, true)?;
                Ok::<_, BoxError>((limiter, layer, with_headers, store))
            })?),
            None => None,
        };
        let mut rows: Vec<(&str, Vec<f64>)> = [
            "engine governor",
            "engine tollgate",
            "bare service",
            "layer governor",
            "layer tollgate",
            "layer governor, headers",
            "layer tollgate, headers",
            "engine governor, 2 threads",
            "engine tollgate, 2 threads",
            "layer tollgate, no decision in request",
            "layer tollgate, headers, none in request",
            "engine tollgate, Redis",
            "layer tollgate, Redis",
            "layer tollgate, Redis, headers",
        ]
        .into_iter()
        .map(|n| (n, Vec::new()))
        .collect();
        let mut leased = leased;
        let mut here = Vec::new();
        // Keys with leases before every round of the Redis rows (not
        // measured): a key gets a lease only once it shows demand (three
        // checks within about a third of a lease period before), and its
        // holds are given back once it has been quiet for two periods, as it
        // is while the other variants run. So every key is checked six times
        // (the first three go to Redis, the fourth asks for a lease), many at
        // once so that they are batched: one by one, a pass over 10 000 keys
        // in Redis takes longer than two periods. `WARM_KEYS` keys at a
        // time.
        let warm_engine = |limiter: &tollgate::RateLimiter| {
            rt.block_on(async {
                // Between rounds the runtime is not driven (the other rows
                // run outside it), so a call the store had in flight (a
                // lease request, a confirmation) times out as soon as it
                // resumes, and a few such open the circuit breaker: wait
                // until the store answers again (its probe closes it).
                tokio::time::sleep(Duration::from_millis(10)).await;
                for _ in 0..100 {
                    if limiter.check("settle", 1).await.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                for chunk in keys.chunks(WARM_KEYS) {
                    let mut checks = tokio::task::JoinSet::new();
                    for key in chunk.iter().flat_map(|key| [key; 6]) {
                        let (limiter, key) = (limiter.clone(), key.clone());
                        checks.spawn(async move { limiter.check(&key, 1).await });
                    }
                    while let Some(d) = checks.join_next().await {
                        assert!(d.expect("joined").expect("decision").allowed());
                    }
                }
            });
        };
        for _ in 0..rounds {
            rows[0].1.push(per_op(ops, |i| {
                assert!(gov.check_key(&keys[i % k]).is_ok());
            }));
            rows[1].1.push(rt.block_on(async {
                let start = Instant::now();
                for i in 0..ops {
                    let d = toll.check(&keys[i % k], 1).await.expect("decision");
                    assert!(d.allowed());
                }
                start.elapsed().as_nanos() as f64 / ops as f64
            }));
            let (b, g, t, gh, th, to, toh) = rt.block_on(async {
                let b = drive(&mut plain, &keys, ops).await;
                let g = drive(&mut gov_layer, &keys, ops).await;
                let t = drive(&mut toll_layer, &keys, ops).await;
                let gh = drive(&mut gov_headers, &keys, ops).await;
                let th = drive(&mut toll_headers, &keys, ops).await;
                let to = drive(&mut toll_out, &keys, ops).await;
                let toh = drive(&mut toll_out_headers, &keys, ops).await;
                (b, g, t, gh, th, to, toh)
            });
            rows[2].1.push(b);
            // The layers' own cost: less the bare service of the same round.
            rows[3].1.push(g - b);
            rows[4].1.push(t - b);
            rows[5].1.push(gh - b);
            rows[6].1.push(th - b);
            rows[9].1.push(to - b);
            rows[10].1.push(toh - b);
            rows[7].1.push(two_threads(ops, k, |i| {
                assert!(gov.check_key(&keys[i]).is_ok());
            }));
            rows[8].1.push(two_threads_async(ops, k, &toll, &keys));
            if let Some((limiter, layer, with_headers, store)) = leased.as_mut() {
                // A tenth of the decisions: a check that goes to Redis takes
                // tens of microseconds.
                let ops = (ops / 10).max(1);
                warm_engine(limiter);
                let before = store.lease_stats().local_decisions;
                let e = rt.block_on(async {
                    let start = Instant::now();
                    for i in 0..ops {
                        let d = limiter.check(&keys[i % k], 1).await.expect("decision");
                        assert!(d.allowed());
                    }
                    start.elapsed().as_nanos() as f64 / ops as f64
                });
                let local = (store.lease_stats().local_decisions - before) as f64 / ops as f64;
                here.push(local);
                warm_layer(&rt, layer, &keys);
                let l = rt.block_on(drive(layer, &keys, ops)) - b;
                warm_layer(&rt, with_headers, &keys);
                let h = rt.block_on(drive(with_headers, &keys, ops)) - b;
                rows[11].1.push(e);
                rows[12].1.push(l);
                rows[13].1.push(h);
            }
        }
        rows.retain(|(_, v)| !v.is_empty());
        if !here.is_empty() {
            // The Redis engine row's checks decided from a hold (the rest
            // went to Redis, tens of microseconds each).
            println!(
                "{k} keys: Redis engine row, share decided in process (median) {:.4}",
                median(here.clone())
            );
        }
        let m: Vec<f64> = rows.iter().map(|(_, v)| median(v.clone())).collect();
        println!("\n{k} keys");
        for ((name, _), v) in rows.iter().zip(&m) {
            println!("  {name:<40} {v:>8.0}");
        }
        println!(
            "  ratio engine tollgate / governor          {:.2}x",
            m[1] / m[0]
        );
        println!(
            "  ratio layer tollgate / governor           {:.2}x",
            m[4] / m[3]
        );
        println!(
            "  ratio layer tollgate / governor, headers  {:.2}x",
            m[6] / m[5]
        );
        println!(
            "  ratio engine tollgate / governor, 2 threads {:.2}x",
            m[8] / m[7]
        );
        println!(
            "  ratio layer tollgate, no decision in request / governor          {:.2}x",
            m[9] / m[3]
        );
        println!(
            "  ratio layer tollgate, headers, none in request / governor, headers {:.2}x",
            m[10] / m[5]
        );
        if m.len() > 12 {
            println!(
                "  ratio engine Redis leases / memory        {:.2}x",
                m[11] / m[1]
            );
            println!(
                "  ratio layer Redis leases / memory         {:.2}x",
                m[12] / m[4]
            );
            println!(
                "  ratio layer Redis leases / memory, headers {:.2}x",
                m[13] / m[6]
            );
        }
    }
    if let Some(&k) = counts.iter().max() {
        let bytes = [fresh_bytes("governor", k)?, fresh_bytes("tollgate", k)?];
        println!("\nresident bytes a key, {k} keys (fresh processes)");
        println!("  governor {:>8.0}\n  tollgate {:>8.0}", bytes[0], bytes[1]);
        println!("  ratio tollgate / governor {:.2}x", bytes[1] / bytes[0]);
        // The lease map's entries (a Redis store with leases, every key
        // holding a lease), against the memory store's at the same count.
        if std::env::var("REDIS_URL").is_ok() {
            let k = k.min(LEASED_BYTES_KEYS);
            let bytes = [fresh_bytes("tollgate", k)?, fresh_bytes("leased", k)?];
            println!("\nresident bytes a key, {k} keys, each holding a lease (fresh processes)");
            println!(
                "  memory store {:>8.0}\n  lease map    {:>8.0}",
                bytes[0], bytes[1]
            );
            println!(
                "  ratio lease map / memory store {:.2}x",
                bytes[1] / bytes[0]
            );
            // Keys checked twice (no lease: a key is leased once it shows
            // demand), most keys of an API keyed by client address: a
            // Redis store's bytes a key with leases on and off.
            let twice = [
                fresh_bytes("redis-twice", k)?,
                fresh_bytes("leased-twice", k)?,
            ];
            println!("\nresident bytes a key, {k} keys, each checked twice (fresh processes)");
            println!(
                "  Redis store, leases off {:>8.0}\n  Redis store, leases on  {:>8.0}",
                twice[0], twice[1]
            );
            println!("  the lease map's share  {:>8.0}", twice[1] - twice[0]);
        }
    }
    Ok(())
}

/// Keys warmed at once (six checks each) for the Redis rows: 1 000 checks
/// at once could keep a call waiting past the store's timeout, and 1 500
/// (250 keys) once did, on a busy 2-core machine.
const WARM_KEYS: usize = 125;

/// The most keys the Redis rows run for: a pass that gives every key its
/// lease, then one over them all measured, must end within a lease period
/// or two, or the first keys' holds go back before they are measured (at
/// 100 000 keys the measured checks went to Redis, 800x the memory
/// store's time).
const LEASED_ROUNDS_KEYS: usize = 10_000;

/// The most keys the lease map's bytes are measured for: the lease map's
/// default bound (`RedisStoreBuilder::lease_keys`), so that none is
/// evicted.
const LEASED_BYTES_KEYS: usize = 100_000;

/// Two threads deciding `ops` in all, thread `t` on the keys `i` with
/// `i % 2 == t` (of `k`; both on key 0 when there is one): nanoseconds of
/// wall time a decision.
fn two_threads(ops: usize, k: usize, f: impl Fn(usize) + Sync) -> f64 {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..2 {
            let f = &f;
            scope.spawn(move || {
                for i in 0..ops / 2 {
                    f(if k == 1 { 0 } else { (2 * i + t) % k });
                }
            });
        }
    });
    start.elapsed().as_nanos() as f64 / ops as f64
}

/// [`two_threads`] for tollgate's engine: each thread runs its checks in one
/// `block_on` of its own runtime.
fn two_threads_async(ops: usize, k: usize, toll: &tollgate::RateLimiter, keys: &[String]) -> f64 {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..2 {
            scope.spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    for i in 0..ops / 2 {
                        let key = &keys[if k == 1 { 0 } else { (2 * i + t) % k }];
                        assert!(toll.check(key, 1).await.expect("decision").allowed());
                    }
                });
            });
        }
    });
    start.elapsed().as_nanos() as f64 / ops as f64
}

/// Resident bytes (`/proc/self/statm`).
fn resident() -> Result<f64, BoxError> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: f64 = statm.split_whitespace().nth(1).ok_or("statm")?.parse()?;
    Ok(pages * 4096.0)
}

/// The resident bytes a key that `which` takes for `k` keys, measured by a
/// fresh process of this program (`bytes which k`).
fn fresh_bytes(which: &str, k: usize) -> Result<f64, BoxError> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .args(["bytes", which, &k.to_string()])
        .output()?;
    Ok(String::from_utf8(out.stdout)?.trim().parse::<f64>()?)
}

/// Prints the resident bytes a key that `which` takes for `k` keys.
fn bytes_mode(which: &str, k: usize) -> Result<(), BoxError> {
    let keys = keys(k);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let before = resident()?;
    let after = match which {
        "governor" => {
            let gov = governor::RateLimiter::keyed(governor_quota());
            for key in &keys {
                let _ = gov.check_key(key);
            }
            let after = resident()?;
            std::hint::black_box(&gov);
            after
        }
        "leased" | "leased-twice" | "redis-twice" => {
            let url = std::env::var("REDIS_URL")?;
            // Six checks a key give it a lease; two do not (a key is leased
            // once it shows demand).
            let checks = if which == "leased" { 6 } else { 2 };
            rt.block_on(async {
                let store = tollgate::RedisStore::builder()
                    .url(url.as_str())
                    .leases(which != "redis-twice")
                    .timeout(Duration::from_secs(5))
                    .build()?;
                let toll = tollgate::RateLimiter::new(
                    store.clone(),
                    tollgate::Policy::new("bytes", [tollgate_quota()])?,
                );
                // Connected before the first reading.
                let _ = toll.check("connect", 1).await?;
                let connected = resident()?;
                // `checks` a key, `WARM_KEYS` keys at a time (see
                // `warm_engine`): of six, the fourth asks for its lease. The tasks' blocks are
                // reused from one batch to the next, a few bytes a key.
                for chunk in keys.chunks(WARM_KEYS) {
                    let mut tasks = tokio::task::JoinSet::new();
                    for key in chunk
                        .iter()
                        .flat_map(|key| std::iter::repeat_n(key, checks))
                    {
                        let (toll, key) = (toll.clone(), key.clone());
                        tasks.spawn(async move { toll.check(&key, 1).await });
                    }
                    while let Some(d) = tasks.join_next().await {
                        let _ = d??;
                    }
                }
                // The last leases answered.
                tokio::time::sleep(Duration::from_millis(200)).await;
                let grown = resident()? - connected;
                eprintln!("{:?}", store.lease_stats());
                std::hint::black_box(&toll);
                Ok::<_, BoxError>(grown)
            })
            // Counted from the reading after connecting.
            .map(|grown| before + grown)?
        }
        _ => {
            let toll = tollgate::RateLimiter::new(store(k)?, tollgate_quota());
            rt.block_on(async {
                for key in &keys {
                    let _ = toll.check(key, 1).await;
                }
            });
            let after = resident()?;
            std::hint::black_box(&toll);
            after
        }
    };
    println!("{}", (after - before) / k as f64);
    Ok(())
}
