//! Heap allocations per request through the layer, counted by dhat's global
//! allocator: a request the layer decides at once (a memory store, a Redis
//! store's deny cache) boxes no future and clones no service, so it allocates
//! only for the request's own data: its key, its storage key, and the
//! [`Decision`](tollgate::Decision) it puts in the request's and the
//! response's extensions.

#[cfg(feature = "redis")]
mod support;

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::Header;
use tollgate::layer::{HeaderStyle, RateLimitLayer};
use tollgate::{MemoryStore, Quota};
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

/// What counting a decision for metrics allocates (its labels), with the
/// `metrics` feature on.
const METRICS: f64 = if cfg!(feature = "metrics") { 2.0 } else { 0.0 };

/// An admitted request: the key read from the header, the storage key, and
/// the decision in the request's and the response's extensions (for each,
/// the extension map, its table and the boxed decision).
const ADMITTED: f64 = 8.0 + METRICS;

/// A request refused at once: the key, the storage key, the 429 answer's
/// header map (2), its `Retry-After` value and body, and the decision in its
/// extensions (3).
const DENIED: f64 = 9.0 + METRICS;

/// A refusal from a Redis store's deny cache: [`DENIED`], and the list of
/// the request's bucket keys in Redis (the list and one key per quota), and
/// with `metrics` the cache hit's counter.
#[cfg(feature = "redis")]
const CACHED: f64 = DENIED + 2.0 + if cfg!(feature = "metrics") { 1.0 } else { 0.0 };

#[tokio::test(flavor = "current_thread")]
async fn requests_decided_at_once_allocate_only_for_their_data_and_the_deny_cache_alike() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let clients = ["c1", "c2", "c3"];
    let base = per_request(&mut inner(), requests(&clients, 300), StatusCode::OK).await;

    let mut memory = RateLimitLayer::new(MemoryStore::new(), Quota::per_hour(1_000).unwrap())
        .key(Header::new("x-client").verbatim())
        .headers(HeaderStyle::None)
        .layer(inner());
    // The first request of each client makes its bucket.
    let _ = per_request(&mut memory, requests(&clients, 3), StatusCode::OK).await;
    let admitted = per_request(&mut memory, requests(&clients, 300), StatusCode::OK).await;
    assert!(
        admitted - base < ADMITTED + SLACK,
        "admitted: {admitted} - {base}"
    );

    // Denied at once: the answer is the layer's own, with the decision in its
    // extensions only (no inner response, no request extensions).
    let mut spent = RateLimitLayer::new(MemoryStore::new(), Quota::per_hour(1).unwrap())
        .key(Header::new("x-client").verbatim())
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

    #[cfg(feature = "redis")]
    a_denial_from_the_deny_cache_allocates_as_the_memory_store_does(base).await;
}

/// A flooded key is answered from the deny cache as a memory store answers:
/// no future, no Redis call. (Part of the test above: dhat counts for one
/// test at a time.)
#[cfg(feature = "redis")]
async fn a_denial_from_the_deny_cache_allocates_as_the_memory_store_does(base: f64) {
    let server = support::RedisServer::start();
    let clients = ["hot"];
    let mut redis = RateLimitLayer::new(server.store(), Quota::per_hour(1).unwrap())
        .key(Header::new("x-client").verbatim())
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
