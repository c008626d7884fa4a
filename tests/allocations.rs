//! Heap allocations per request through the layer, counted by dhat's global
//! allocator: a request the layer decides at once (a memory store, a Redis
//! store's deny cache) boxes no future and clones no service, so it allocates
//! only for the request's own data: its key and the
//! [`Decision`](tollgate::Decision) it puts in the request's extensions (and,
//! for a refusal, in the layer's own answer's); its storage key is written
//! into a buffer of the thread's. A request sent to Redis in a batch adds its own
//! part of the call (its bucket keys, its boxed check, its reply channel) and
//! a share of what the call allocates.

#[cfg(feature = "redis")]
mod support;

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::Header;
use tollgate::layer::{HeaderStyle, RateLimitLayer};
use tollgate::{MemoryStore, Quota, RateLimiter};
use tower::{Layer, Service, ServiceExt};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn allocated() -> u64 {
    dhat::HeapStats::get().total_blocks
}

/// The requests, built before counting: their own head is not the layer's.
fn requests(clients: &[&str], n: usize) -> Vec<Request<()>> {
    (0..n)
        .map(|i| {
            Request::get("/")
                .header("x-client", clients[i % clients.len()])
                .body(())
                .unwrap()
        })
        .collect()
}

/// Allocations per request of `requests` through `svc` (each awaited on this
/// thread, its response dropped), after the same for the inner service alone
/// is subtracted by the caller. Every response must have `status`.
async fn per_request<S, B>(svc: &mut S, requests: Vec<Request<()>>, status: StatusCode) -> f64
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
{
    let n = requests.len();
    let before = allocated();
    for req in requests {
        let res = svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(res.status(), status);
    }
    (allocated() - before) as f64 / n as f64
}

fn inner() -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone
{
    tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    })
}

/// Room for what other threads allocate while requests are counted (dhat
/// counts the whole process: a Redis store's connection task, the runtime):
/// a few blocks over hundreds of requests. One more allocation per request
/// adds 1.0 to the average, far above this.
const SLACK: f64 = 0.5;

/// What counting a decision for metrics allocates, with the `metrics`
/// feature on: nothing (its key is the policy's, made once; no recorder is
/// installed here, so the counter is the no-op recorder's).
const METRICS: f64 = 0.0;

/// An admitted request: the key read from the header and the decision in
/// the request's extensions (the extension map, its table and the boxed
/// decision: these requests come without extensions). The response's
/// extensions get nothing (see `RateLimitLayer::decision_in_response`).
const ADMITTED: f64 = 4.0 + METRICS;

/// An admitted request of a layer that keeps the decision out of the
/// request (`decision_in_request(false)`): nothing at all (the key is
/// borrowed from the header, the decision lives on the stack).
const KEPT_OUT: f64 = METRICS;

/// A request refused at once: the key, the 429 answer's header map (2), its
/// `Retry-After` value and body, and the decision in its extensions (3).
const DENIED: f64 = 8.0 + METRICS;

/// A refusal from a Redis store's deny cache: [`DENIED`], and the list of
/// the request's bucket keys in Redis (the list and one key per quota), and
/// with `metrics` the cache hit's counter.
/// A `RateLimiter::check` of a key seen before, on a memory store: nothing
/// (the storage key is not written out, the metrics key is made once).
const CHECKED: f64 = METRICS;

#[cfg(feature = "redis")]
const CACHED: f64 = DENIED + 2.0 + if cfg!(feature = "metrics") { 1.0 } else { 0.0 };

#[tokio::test(flavor = "current_thread")]
async fn requests_decided_at_once_allocate_only_for_their_data_and_the_deny_cache_alike() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let clients = ["c1", "c2", "c3"];
    let base = per_request(&mut inner(), requests(&clients, 300), StatusCode::OK).await;

    let mut memory = RateLimitLayer::new(MemoryStore::new(), Quota::per_hour(1_000).unwrap())
        .key(Header::new("x-client").unwrap().verbatim())
        .headers(HeaderStyle::None)
        .layer(inner());
    // The first request of each client makes its bucket.
    let _ = per_request(&mut memory, requests(&clients, 3), StatusCode::OK).await;
    let admitted = per_request(&mut memory, requests(&clients, 300), StatusCode::OK).await;
    assert!(
        admitted - base < ADMITTED + SLACK,
        "admitted: {admitted} - {base}"
    );

    // Without the decision in the request: no extension map for it.
    let mut bare = RateLimitLayer::new(MemoryStore::new(), Quota::per_hour(1_000).unwrap())
        .key(Header::new("x-client").unwrap().verbatim())
        .headers(HeaderStyle::None)
        .decision_in_request(false)
        .layer(inner());
    let _ = per_request(&mut bare, requests(&clients, 3), StatusCode::OK).await;
    let kept_out = per_request(&mut bare, requests(&clients, 300), StatusCode::OK).await;
    println!(
        "per request: inner alone {base}, admitted {admitted}, without the decision {kept_out}"
    );
    assert!(
        kept_out - base < KEPT_OUT + SLACK,
        "admitted, decision kept out of the request: {kept_out} - {base}"
    );

    // Denied at once: the answer is the layer's own, with the decision in its
    // extensions only (no inner response, no request extensions).
    let mut spent = RateLimitLayer::new(MemoryStore::new(), Quota::per_hour(1).unwrap())
        .key(Header::new("x-client").unwrap().verbatim())
        .headers(HeaderStyle::None)
        .layer(inner());
    let _ = per_request(&mut spent, requests(&clients, 3), StatusCode::OK).await;
    let denied = per_request(
        &mut spent,
        requests(&clients, 300),
        StatusCode::TOO_MANY_REQUESTS,
    )
    .await;
    println!("per request: inner alone {base}, admitted {admitted}, denied {denied}");
    assert!(denied - base < DENIED + SLACK, "denied: {denied} - {base}");

    a_limiter_check_of_a_known_key_allocates_nothing_of_its_own().await;
    #[cfg(feature = "axum")]
    axum_bodies_save_the_router_a_box_per_response().await;
    #[cfg(feature = "redis")]
    a_denial_from_the_deny_cache_allocates_as_the_memory_store_does(base).await;
    #[cfg(feature = "redis")]
    a_batched_redis_check_allocates_for_its_own_data(base).await;
}

/// See [`CHECKED`]. (Part of the test above: dhat counts for one test at a
/// time.)
async fn a_limiter_check_of_a_known_key_allocates_nothing_of_its_own() {
    let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_hour(1_000).unwrap());
    let keys = ["c1", "c2", "c3"];
    for key in keys {
        assert!(limiter.check(key, 1).await.unwrap().allowed());
    }
    let before = allocated();
    for i in 0..300 {
        assert!(limiter.check(keys[i % 3], 1).await.unwrap().allowed());
    }
    let checked = (allocated() - before) as f64 / 300.0;
    println!("per RateLimiter::check: {checked}");
    assert!(checked < CHECKED + SLACK, "checked: {checked}");
}

/// An admitted request sent to Redis, batched with others (64 callers at
/// once): [`ADMITTED`], its storage key (kept while the call is in flight),
/// and the request's own part of the call: its bucket keys in Redis (the
/// list and one key), its boxed check and its reply channel; the keys move
/// into the script call and back, the answer is read without a list.
#[cfg(feature = "redis")]
const BATCHED: f64 = ADMITTED + 5.0;

/// What one script call allocates (the command, the reply, the batch's
/// lists, the task that sends it), shared by the checks it carries: 15
/// measured at about 21 checks a call.
#[cfg(feature = "redis")]
const PER_CALL: f64 = 16.0;

/// See [`BATCHED`]. (Part of the test above: dhat counts for one test at a
/// time.)
#[cfg(feature = "redis")]
async fn a_batched_redis_check_allocates_for_its_own_data(base: f64) {
    const CALLERS: usize = 64;
    const EACH: usize = 50;
    let server = support::RedisServer::start();
    let redis = RateLimitLayer::new(server.store(), Quota::per_second(1_000_000).unwrap())
        .key(Header::new("x-client").unwrap().verbatim())
        .headers(HeaderStyle::None)
        .layer(inner());
    let local = tokio::task::LocalSet::new();
    // Each caller sends its requests one after another; the callers run at
    // once, so their checks meet in batches. `round` 0 warms up (connection,
    // script load); round 1 is counted.
    let mut counted = 0.0;
    for round in 0..2 {
        let callers: Vec<_> = (0..CALLERS)
            .map(|c| {
                let clients: Vec<String> = (0..EACH).map(|i| format!("r{round}c{c}i{i}")).collect();
                let refs: Vec<&str> = clients.iter().map(String::as_str).collect();
                (redis.clone(), requests(&refs, EACH))
            })
            .collect();
        server.reset_stats();
        let before = allocated();
        local
            .run_until(async {
                let tasks: Vec<_> = callers
                    .into_iter()
                    .map(|(mut svc, reqs)| {
                        tokio::task::spawn_local(async move {
                            for req in reqs {
                                let res = svc.ready().await.unwrap().call(req).await.unwrap();
                                assert_eq!(res.status(), StatusCode::OK);
                            }
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
            })
            .await;
        counted = (allocated() - before) as f64 / (CALLERS * EACH) as f64;
    }
    let calls = server.calls("evalsha");
    let per_call = (CALLERS * EACH) as f64 / calls as f64;
    println!(
        "per request: inner alone {base}, batched in Redis {counted} ({per_call:.1} checks per call)"
    );
    // Batched indeed: several checks share each call. How many depends on
    // the calls the store keeps in flight, which follow the round trip (a
    // debug build on one thread under load has a long one); the bound below
    // counts the call's share at the measured rate.
    assert!(per_call >= 2.0, "{per_call} checks per call");
    assert!(
        counted - base < BATCHED + PER_CALL / per_call + SLACK,
        "batched: {counted} - {base} at {per_call:.1} checks per call"
    );
}

/// Allocations per request of `n` requests from `clients` through an axum
/// router, each response dropped when it comes.
#[cfg(feature = "axum")]
async fn through_router(router: &mut axum::Router, clients: &[&str], n: usize) -> f64 {
    let requests: Vec<_> = (0..n)
        .map(|i| {
            Request::get("/")
                .header("x-client", clients[i % clients.len()])
                .body(axum::body::Body::empty())
                .unwrap()
        })
        .collect();
    let before = allocated();
    for req in requests {
        let res = router.call(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    (allocated() - before) as f64 / n as f64
}

/// axum's `Router::layer` boxes every response body that is not axum's own
/// `Body` into one: with `axum_body()` the layer's responses are `Body`s
/// already, so each request allocates one block fewer than with the default
/// layer. (Part of the test above: dhat counts for one test at a time.)
#[cfg(feature = "axum")]
async fn axum_bodies_save_the_router_a_box_per_response() {
    use axum::routing::get;
    let clients = ["c1", "c2", "c3"];
    let limit = || {
        RateLimitLayer::new(MemoryStore::new(), Quota::per_hour(1_000).unwrap())
            .key(Header::new("x-client").unwrap().verbatim())
            .headers(HeaderStyle::None)
    };
    let route = || axum::Router::new().route("/", get(|| async { "ok" }));
    let mut wrapped = route().layer(limit());
    let mut plain = route().layer(limit().axum_body());
    // The first request of each client makes its bucket.
    let _ = through_router(&mut wrapped, &clients, 3).await;
    let _ = through_router(&mut plain, &clients, 3).await;
    let wrapped = through_router(&mut wrapped, &clients, 300).await;
    let plain = through_router(&mut plain, &clients, 300).await;
    println!("per request through a router: wrapped bodies {wrapped}, axum bodies {plain}");
    assert!(
        wrapped - plain > 1.0 - SLACK,
        "wrapped {wrapped}, axum bodies {plain}"
    );
}

/// A flooded key is answered from the deny cache as a memory store answers:
/// no future, no Redis call. (Part of the test above: dhat counts for one
/// test at a time.)
#[cfg(feature = "redis")]
async fn a_denial_from_the_deny_cache_allocates_as_the_memory_store_does(base: f64) {
    let server = support::RedisServer::start();
    let clients = ["hot"];
    let mut redis = RateLimitLayer::new(server.store(), Quota::per_hour(1).unwrap())
        .key(Header::new("x-client").unwrap().verbatim())
        .headers(HeaderStyle::None)
        .layer(inner());
    // Spends the bucket, then Redis denies once and the cache remembers.
    let _ = per_request(&mut redis, requests(&clients, 1), StatusCode::OK).await;
    let _ = per_request(
        &mut redis,
        requests(&clients, 1),
        StatusCode::TOO_MANY_REQUESTS,
    )
    .await;
    server.reset_stats();
    let cached = per_request(
        &mut redis,
        requests(&clients, 300),
        StatusCode::TOO_MANY_REQUESTS,
    )
    .await;
    assert_eq!(server.calls("evalsha"), 0, "the cache answered");
    println!("per request: inner alone {base}, denied from the cache {cached}");
    assert!(cached - base < CACHED + SLACK, "cached: {cached} - {base}");
}
