//! The in-process fallback against a real, stopped redis-server, and through
//! a real socket: no request of any cost passes it unlimited, and it decides
//! for as long as Redis fails, whatever the deny cache answers meanwhile.
//! Also: `RateLimiter` keeps policies of different names apart, as the layer
//! does.
#![cfg(all(feature = "redis", feature = "axum"))]

mod support;

use std::time::Instant;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use support::RedisServer;
use support::http::{Client, TestServer};
use tollgate::key::Global;
use tollgate::layer::RateLimitLayer;
use tollgate::{Fallback, MemoryStore, Policy, Quota, RateLimiter};

/// Redis down, each request costing more than an instance's share of the
/// burst (10 a second shared by 4: burst 3, cost 5). The fallback raises the
/// share's burst once, to the quota's 10, and admits at the share's rate,
/// 2.5 tokens a second: two requests now and one every 2 s after them, never
/// all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_above_an_instances_share_is_limited_not_forwarded() {
    let mut redis = RedisServer::start();
    let store = redis.store();
    redis.stop();
    let fallback = Fallback::memory().share(std::num::NonZeroU32::new(4).unwrap());
    let layer = RateLimitLayer::new(store, Quota::per_second(10).unwrap())
        .key(Global)
        .fixed_cost(5)
        .unwrap()
        .fallback(fallback.clone());
    let server = TestServer::axum(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let client = Client::new();
    let started = Instant::now();
    let mut ok = 0;
    let mut limited = 0;
    for _ in 0..40 {
        let r = client.get(&server.url("/")).await;
        match r.status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("answered {other}: {r:?}"),
        }
    }
    let took = started.elapsed().as_secs_f64();
    // Two at once, then one per 2 s of the run.
    let bound = 2 + (took / 2.0).floor() as usize;
    assert!(
        (1..=bound).contains(&ok),
        "{ok} of 40 admitted in {took:.2} s (at most {bound}), {limited} limited"
    );
    assert!(fallback.is_active());
}

/// A flooded key's denial, remembered while Redis was up, is answered from the
/// deny cache during the outage. That is not Redis answering: the fallback
/// keeps deciding for everyone else, without turning off and on per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_denials_do_not_turn_the_fallback_off() {
    let mut redis = RedisServer::start();
    let store = redis.store();
    let fallback = Fallback::memory();
    let limiter = RateLimiter::new(store, Quota::per_minute(1).unwrap()).fallback(fallback.clone());
    // Connected, then the flooded key denied by Redis (and remembered).
    let mut first = None;
    for _ in 0..200 {
        match limiter.check("flooded", 1).await {
            Ok(d) => {
                first = Some(d);
                break;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    assert!(first.expect("Redis answered").allowed());
    let denied = limiter.check("flooded", 1).await.unwrap();
    assert!(!denied.allowed() && !denied.is_fallback());
    redis.stop();

    let mut fallback_decisions = 0;
    for i in 0..50 {
        let other = limiter.check(&format!("client-{i}"), 1).await.unwrap();
        if other.is_fallback() {
            fallback_decisions += 1;
        }
        let flooded = limiter.check("flooded", 1).await.unwrap();
        assert!(!flooded.allowed(), "the flooded key was admitted");
        if fallback_decisions > 0 {
            assert!(
                fallback.is_active(),
                "the fallback stopped after a remembered denial (round {i})"
            );
        }
    }
    assert!(fallback_decisions > 0, "the fallback never decided");
}

/// Two limiters of one quota on one store, with policies of two names: a
/// client spending in one leaves the other's bucket alone. Limiters of the
/// same name share it.
#[tokio::test]
async fn limiters_of_different_policy_names_never_share_a_bucket() {
    let redis = RedisServer::start();
    let stores: [(&str, tollgate::AnyStore); 2] = [
        ("memory", MemoryStore::new().into()),
        // The harness's store (a 5 s timeout): the first call connects
        // and loads the script, which 100 ms may not cover on a busy machine.
        ("redis", redis.store().into()),
    ];
    for (kind, store) in stores {
        let quota = Quota::per_minute(1).unwrap();
        let login = RateLimiter::new(store.clone(), Policy::new("login", [quota]).unwrap());
        let signup = RateLimiter::new(store.clone(), Policy::new("signup", [quota]).unwrap());
        let login_again = RateLimiter::new(store.clone(), Policy::new("login", [quota]).unwrap());
        assert!(login.check("user:42", 1).await.unwrap().allowed(), "{kind}");
        assert!(
            signup.check("user:42", 1).await.unwrap().allowed(),
            "{kind}: signup was refused after one login"
        );
        assert!(
            !login_again.check("user:42", 1).await.unwrap().allowed(),
            "{kind}: two limiters of one policy name did not share the bucket"
        );
        login.reset("user:42").await.unwrap();
        assert!(
            login_again.check("user:42", 1).await.unwrap().allowed(),
            "{kind}"
        );
        assert_eq!(
            signup.peek("user:42").await.unwrap().remaining(),
            0,
            "{kind}"
        );
    }
}
