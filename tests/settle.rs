//! Costs settled by the response (`RateLimitLayer::settle` and its
//! shortcuts), through real sockets, on a memory store and a real Redis:
//! charge first, refund after, so a flood of attempts is bounded while their
//! responses are in flight; successful requests under a limit of failures
//! cost nothing; a refund or a charge is one script call at most, and a
//! request whose cost stands costs no call beyond its check.
#![cfg(all(feature = "redis", feature = "axum"))]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::get;
use support::RedisServer;
use support::http::{Client, TestServer};
use tollgate::key::{self, Global};
use tollgate::layer::{RateLimitLayer, Settle};
use tollgate::{AnyStore, Fallback, MemoryStore, Policy, Quota, RateLimiter};

/// 5 failed logins per account per 15 minutes: nothing refills during a test.
fn failures() -> Policy {
    Policy::new("login", [Quota::new(5, Duration::from_secs(900)).unwrap()]).unwrap()
}

/// The account in `/login/{account}/{password}`.
fn account() -> impl tollgate::key::KeyExtractor {
    key::from_fn("account", |parts| {
        parts
            .uri
            .path()
            .strip_prefix("/login/")
            .and_then(|rest| rest.split('/').next())
            .map(str::to_owned)
    })
}

/// A login service counting the attempts that reach the password check; a
/// check takes `slow` so that concurrent attempts are all in flight at once.
fn login_app(layer: RateLimitLayer, checked: Arc<AtomicUsize>, slow: Duration) -> Router {
    Router::new()
        .route(
            "/login/{account}/{password}",
            get(move |Path((_, password)): Path<(String, String)>| {
                let checked = Arc::clone(&checked);
                async move {
                    checked.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(slow).await;
                    if password == "right" {
                        StatusCode::OK
                    } else {
                        StatusCode::UNAUTHORIZED
                    }
                }
            }),
        )
        .layer(layer)
}

/// The bucket's remaining tokens, read through a limiter of the same policy
/// name (the layer's keys are `name:kind:value`).
async fn remaining(store: &AnyStore, account: &str) -> u64 {
    let limiter = RateLimiter::new(store.clone(), failures());
    limiter
        .peek(&format!("custom:account:{account}"))
        .await
        .unwrap()
        .remaining()
}

/// Waits (up to 10 s) until `account` has `want` tokens left: a refund on
/// Redis is sent in a task of its own, after the response. Returns what it
/// saw last.
async fn settles_to(store: &AnyStore, account: &str, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = remaining(store, account).await;
        if seen == want || Instant::now() > deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn twenty_concurrent_wrong_passwords(store: AnyStore) {
    let checked = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(store.clone(), failures())
        .key(account())
        .count_only_failures();
    let app = login_app(layer, Arc::clone(&checked), Duration::from_millis(200));
    let server = TestServer::axum(app).await;
    let client = Client::new();

    // 20 wrong passwords for one account at once: charged when they arrive,
    // so at most 5 reach the check, however long it takes.
    let attempts: Vec<_> = (0..20)
        .map(|_| {
            let (client, url) = (client.clone(), server.url("/login/alice/wrong"));
            tokio::spawn(async move { client.get(&url).await.status })
        })
        .collect();
    let mut statuses = Vec::new();
    for attempt in attempts {
        statuses.push(attempt.await.unwrap());
    }
    let failed = statuses.iter().filter(|s| **s == 401).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(checked.load(Ordering::SeqCst), 5, "{statuses:?}");
    assert_eq!((failed, refused), (5, 15), "{statuses:?}");

    // Another account: one failure, then a success, which is refunded: the
    // failure budget is what the failure left.
    let reply = client.get(&server.url("/login/bob/wrong")).await;
    assert_eq!(reply.status, 401);
    assert_eq!(remaining(&store, "bob").await, 4);
    for _ in 0..10 {
        let reply = client.get(&server.url("/login/bob/right")).await;
        assert_eq!(reply.status, 200);
        assert_eq!(settles_to(&store, "bob", 4).await, 4);
    }
    // Never above what it was: a refund fills up to the capacity at most.
    assert_eq!(remaining(&store, "bob").await, 4);
}

#[tokio::test]
async fn twenty_concurrent_wrong_passwords_reach_the_check_five_times_in_memory() {
    twenty_concurrent_wrong_passwords(MemoryStore::new().into()).await;
}

#[tokio::test]
async fn twenty_concurrent_wrong_passwords_reach_the_check_five_times_on_redis() {
    let redis = RedisServer::start();
    twenty_concurrent_wrong_passwords(redis.store().into()).await;
}

/// Calls of the script, however it was sent.
fn script_calls(redis: &RedisServer) -> u64 {
    redis.calls("evalsha") + redis.calls("eval")
}

#[tokio::test]
async fn a_refund_or_charge_is_one_call_and_a_kept_cost_none() {
    let redis = RedisServer::start();
    let store: AnyStore = redis.store().into();
    // 100 a day: nothing refills during the test.
    let policy = || {
        Policy::new(
            "priced",
            [Quota::new(100, Duration::from_secs(86_400)).unwrap()],
        )
        .unwrap()
    };
    // GET /keep keeps its cost, /refund is refunded, /charge costs 2 more:
    // by the response's status.
    let layer = RateLimitLayer::new(store.clone(), policy())
        .key(Global)
        .settle(|response, _| match response.status().as_u16() {
            200 => Settle::Keep,
            202 => Settle::Refund,
            _ => Settle::Charge(2),
        });
    let app = Router::new()
        .route("/keep", get(|| async { StatusCode::OK }))
        .route("/refund", get(|| async { StatusCode::ACCEPTED }))
        .route("/charge", get(|| async { StatusCode::PAYMENT_REQUIRED }))
        .layer(layer);
    let server = TestServer::axum(app).await;
    let client = Client::new();
    let limiter = RateLimiter::new(store.clone(), policy());
    // Peeks are script calls too: count them, to tell the requests' apart.
    let peeks = AtomicUsize::new(0);
    let settled_at = |want: u64| {
        let (limiter, peeks) = (&limiter, &peeks);
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                peeks.fetch_add(1, Ordering::Relaxed);
                let left = limiter.peek("global:global").await.unwrap().remaining();
                if left == want || Instant::now() > deadline {
                    return left;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };

    // The script loaded first (a server without it answers EVALSHA with
    // NOSCRIPT, and the store sends EVAL then: two calls once).
    assert_eq!(settled_at(100).await, 100);
    // One request at a time: each check is a call of its own, and a request
    // whose cost stands costs nothing more.
    redis.reset_stats();
    for _ in 0..10 {
        assert_eq!(client.get(&server.url("/keep")).await.status, 200);
    }
    assert_eq!(script_calls(&redis), 10, "10 checks whose cost stands");
    assert_eq!(settled_at(90).await, 90);

    // A refunded request: its check and at most one call for the refund.
    redis.reset_stats();
    peeks.store(0, Ordering::Relaxed);
    for n in 1..=10 {
        assert_eq!(client.get(&server.url("/refund")).await.status, 202);
        assert_eq!(settled_at(90).await, 90, "refund {n}");
    }
    let by_requests = script_calls(&redis) - peeks.load(Ordering::Relaxed) as u64;
    eprintln!("script calls for 10 refunded requests: {by_requests}");
    assert!(
        (10..=20).contains(&by_requests),
        "{by_requests} calls for 10 checks and 10 refunds"
    );

    // A charge: the check's token and 2 more, in at most one more call.
    redis.reset_stats();
    peeks.store(0, Ordering::Relaxed);
    assert_eq!(client.get(&server.url("/charge")).await.status, 402);
    assert_eq!(settled_at(87).await, 87);
    let by_request = script_calls(&redis) - peeks.load(Ordering::Relaxed) as u64;
    eprintln!("script calls for a charged request: {by_request}");
    assert!(
        by_request <= 2,
        "{by_request} calls for a check and its charge"
    );
}

/// Successful requests cost nothing, failed ones count: the first failure
/// beyond the budget is refused. `layer` is already keyed by account.
async fn only_failures_count(layer: RateLimitLayer) {
    let checked = Arc::new(AtomicUsize::new(0));
    let app = login_app(layer, checked, Duration::ZERO);
    let server = TestServer::axum(app).await;
    let client = Client::new();
    let status = |path: &'static str| {
        let (client, url) = (client.clone(), server.url(path));
        async move { client.get(&url).await.status }
    };
    assert_eq!(status("/login/carol/wrong").await, 401);
    for _ in 0..8 {
        assert_eq!(status("/login/carol/right").await, 200);
    }
    for _ in 0..4 {
        assert_eq!(status("/login/carol/wrong").await, 401);
    }
    assert_eq!(status("/login/carol/wrong").await, 429);
    assert_eq!(status("/login/carol/right").await, 429);
}

#[tokio::test]
async fn the_fallback_settles_what_it_decided() {
    // No Redis listens here: the fallback decides every request, and takes
    // the refunds of the ones it admitted.
    let dead = tollgate::RedisStore::builder()
        .leases(false)
        .url(format!("redis://127.0.0.1:{}", support::free_port()))
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(dead, failures())
        .key(account())
        .count_only_failures()
        .fallback(Fallback::memory());
    only_failures_count(layer).await;
}

#[tokio::test]
async fn delay_mode_settles_as_checks_do() {
    let layer = RateLimitLayer::new(MemoryStore::new(), failures())
        .key(account())
        .count_only_failures()
        .delay(Duration::from_millis(10));
    only_failures_count(layer).await;
}

/// gRPC calls are settled by `grpc-status`: from the trailers after the
/// body (a call that succeeded, refunded under "count only failures"), or
/// from the headers of a trailers-only answer (an error, kept). `axum_body`:
/// the service as an axum router behind `RateLimitLayer::axum_body`, whose
/// one wrapped body is the one watched for its trailers.
#[cfg(feature = "tonic")]
async fn grpc_calls_settle_by_their_status(store: AnyStore, axum_body: bool) {
    use support::grpc::{GrpcServer, within};
    use tonic_health::pb::HealthCheckRequest;

    let policy = || {
        Policy::new(
            "rpc",
            [Quota::new(10, Duration::from_secs(86_400)).unwrap()],
        )
        .unwrap()
    };
    let layer = RateLimitLayer::new(store.clone(), policy())
        .key(Global)
        .count_only_failures();
    let server = match axum_body {
        #[cfg(feature = "axum")]
        true => GrpcServer::start_axum(layer.axum_body()).await,
        _ => GrpcServer::start(layer).await,
    };
    let mut client = server.client().await;
    let limiter = RateLimiter::new(store, policy());
    let settles_to = |want: u64| {
        let limiter = &limiter;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let left = limiter.peek("global:global").await.unwrap().remaining();
                if left == want || Instant::now() > deadline {
                    return left;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    for _ in 0..12 {
        let ok = within(client.check(HealthCheckRequest {
            service: String::new(),
        }))
        .await;
        assert!(ok.is_ok(), "{ok:?}");
        assert_eq!(settles_to(10).await, 10);
    }
    for left in (7..=9).rev() {
        let missing = within(client.check(HealthCheckRequest {
            service: "no.such.Service".to_owned(),
        }))
        .await
        .unwrap_err();
        assert_eq!(missing.code(), tonic::Code::NotFound);
        assert_eq!(settles_to(left).await, left);
    }
}

#[cfg(feature = "tonic")]
#[tokio::test]
async fn grpc_calls_settle_by_their_status_in_memory() {
    grpc_calls_settle_by_their_status(MemoryStore::new().into(), false).await;
    #[cfg(feature = "axum")]
    grpc_calls_settle_by_their_status(MemoryStore::new().into(), true).await;
}

#[cfg(feature = "tonic")]
#[tokio::test]
async fn grpc_calls_settle_by_their_status_on_redis() {
    let redis = RedisServer::start();
    grpc_calls_settle_by_their_status(redis.store().into(), false).await;
}

/// Redis runs a refund's call and the reply is lost with its connection: the
/// store resends a call whose connection broke, but never one that gives
/// tokens back, so the refund is made once, not twice.
#[tokio::test]
async fn a_refund_whose_reply_is_lost_is_made_once() {
    let redis = RedisServer::start();
    let proxy = support::Proxy::start(redis.port());
    let store = tollgate::RedisStore::builder()
        .leases(false)
        .url(proxy.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let limiter = RateLimiter::new(
        store,
        Policy::new(
            "lost",
            [Quota::new(10, Duration::from_secs(86_400)).unwrap()],
        )
        .unwrap(),
    );
    let decision = limiter.check("k", 5).await.unwrap();
    assert_eq!(decision.remaining(), 5);
    let calls = script_calls(&redis);
    proxy.lose_script_replies(true);
    let lost = limiter.refund("k", 2, &decision).await;
    proxy.lose_script_replies(false);
    assert!(lost.is_err(), "{lost:?}");
    assert_eq!(script_calls(&redis) - calls, 1, "the refund was sent once");
    assert_eq!(limiter.peek("k").await.unwrap().remaining(), 7);
}

/// `tollgate_settled_tokens_total` counts the settlements made, never one
/// the store failed to make: a refund and a charge through `RateLimiter`
/// once Redis is stopped, and the layer's refund of a success whose Redis
/// call (sent in a task of its own) finds Redis stopped. The recorder is
/// this thread's, and the runtime runs every task on it.
#[cfg(feature = "metrics")]
#[tokio::test(flavor = "current_thread")]
async fn settlements_the_store_failed_to_make_are_not_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use tower::{Layer, ServiceExt};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    // The tokens counted since the last call, by settlement.
    let counted = || {
        let mut counted = std::collections::BTreeMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            if let (true, DebugValue::Counter(n @ 1..)) =
                (key.name() == "tollgate_settled_tokens_total", value)
            {
                let settlement = key.labels().find(|l| l.key() == "settlement").unwrap();
                *counted.entry(settlement.value().to_owned()).or_insert(0) += n;
            }
        }
        counted
    };
    let redis = Arc::new(std::sync::Mutex::new(RedisServer::start()));
    let store = tollgate::RedisStore::builder()
        .leases(false)
        .url(redis.lock().unwrap().url())
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let limiter = RateLimiter::new(store.clone(), failures());
    let decision = limiter.check("k", 3).await.unwrap();
    limiter.refund("k", 1, &decision).await.unwrap();
    limiter.charge("k", 1, &decision).await.unwrap();
    let made = std::collections::BTreeMap::from([("charge".into(), 1), ("refund".into(), 1)]);
    assert_eq!(counted(), made);

    // The layer: a success is refunded after its response, in a task of
    // its own, by which time the handler has stopped Redis.
    let stopping = Arc::clone(&redis);
    let inner = tower::service_fn(move |_: http::Request<()>| {
        stopping.lock().unwrap().stop();
        async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) }
    });
    let svc = RateLimitLayer::new(store, failures())
        .key(Global)
        .count_only_failures()
        .layer(inner);
    let response = svc.oneshot(http::Request::new(())).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // Redis is stopped: both fail.
    assert!(limiter.refund("k", 1, &decision).await.is_err());
    assert!(limiter.charge("k", 1, &decision).await.is_err());
    // The layer's refund has had its chance to run too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(counted(), std::collections::BTreeMap::new());
}
