//! Lock-outs (`Quota::lockout`) on real servers: a lock-out taken by one
//! instance holds for another sharing the Redis server, exactly until its end
//! on Redis `TIME`; the layer's `Retry-After` and `RateLimit` headers tell
//! its end; the login guard ("5 wrong passwords, then 15 minutes locked
//! out") refuses even the right password until then, on a memory store and
//! on Redis, through real sockets.
#![cfg(all(feature = "redis", feature = "axum"))]

mod support;

use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::get;
use support::RedisServer;
use support::http::{Client, TestServer};
use tollgate::layer::RateLimitLayer;
use tollgate::{AnyStore, MemoryStore, Policy, Quota, RateLimiter, RedisStore, key};

/// The stamp stored in a bucket (`level:stamp:full,num`): a locked-out bucket's is
/// the lock-out's end, in microseconds of Redis `TIME`.
fn stamp(server: &RedisServer, key: &str) -> u64 {
    let value: String = server.cmd(&["GET", key]);
    let mut parts = value.split(':');
    let _level = parts.next();
    let stamp = parts.next().expect("level:stamp").parse().expect("a stamp");
    assert!(parts.next().is_some(), "the quota's figures: {value}");
    assert_eq!(
        parts.next(),
        None,
        "no holds on a lock-out's bucket: {value}"
    );
    stamp
}

/// Checks `key` on `limiter` every 5 ms until admitted (at most 10 s).
/// Returns, for every call, Redis `TIME` just before and just after it and
/// whether it was admitted; the script's clock for the call lies between.
async fn poll_until_admitted(
    server: &RedisServer,
    limiter: &RateLimiter,
    key: &str,
) -> Vec<(u64, u64, bool)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut calls = Vec::new();
    loop {
        let before = server.time_us();
        let d = limiter.check(key, 1).await.expect("a decision");
        let after = server.time_us();
        calls.push((before, after, d.allowed()));
        if d.allowed() || Instant::now() > deadline {
            return calls;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Two instances (two stores, two pools) on one Redis server, with what a
/// production store has on (leases, and on one the deny cache): a refusal
/// by either locks the key out for both. Every call the other makes is
/// refused until the lock-out's end, on Redis `TIME`; after it, the store
/// without a deny cache admits the first call it makes, and the one with a
/// deny cache (which refuses locally until the end it was told, on its own
/// clock) admits within 50 ms of it.
#[tokio::test]
async fn a_lockout_holds_across_two_instances_until_its_end() {
    let server = RedisServer::start();
    // 5 a second, then 400 ms locked out: longer than a token's refill
    // (200 ms), so a refusal locks (a lock-out never gives a token early).
    let quota: Quota = "5/s lockout 400ms".parse().unwrap();
    let policy = Policy::new("guard", [quota]).unwrap();
    let instance = |deny_cache: usize| -> RateLimiter {
        let mut builder = RedisStore::builder()
            .pool(server.pool())
            .timeout(Duration::from_secs(5));
        if deny_cache > 0 {
            builder = builder.deny_cache(deny_cache);
        }
        RateLimiter::new(builder.build().expect("store"), policy.clone())
    };
    let plain = instance(0);
    let cached = instance(1_000);
    let store = server.store();

    // (locker, watcher, the watcher's slack after the end)
    let cases = [
        ("alice", &plain, &cached, 50_000),
        ("bob", &cached, &plain, 0),
    ];
    for (who, locker, watcher, slack) in cases {
        // Five admitted (or a few more, should the machine be slow), then
        // the refusal that locks the key out.
        let mut refused = locker.check(who, 1).await.unwrap();
        for _ in 0..100 {
            if !refused.allowed() {
                break;
            }
            refused = locker.check(who, 1).await.unwrap();
        }
        assert!(!refused.allowed());
        assert_eq!(refused.retry_after(), Duration::from_millis(400), "{who}");
        let key = store
            .bucket_keys(&format!("guard:{who}"), &policy)
            .remove(0);
        let end = stamp(&server, &key);
        let calls = poll_until_admitted(&server, watcher, who).await;
        let (&(before, after, admitted), refusals) = calls.split_last().unwrap();
        assert!(admitted, "{who}: never admitted: {calls:?}");
        assert!(
            after >= end,
            "{who}: admitted before the end {end}: {calls:?}"
        );
        for &(before, _, _) in refusals {
            assert!(
                before < end + slack,
                "{who}: refused {} us after the end: {calls:?}",
                before - end
            );
        }
        eprintln!(
            "{who}: {} refusals, admitted {} to {} us after the end",
            refusals.len(),
            before.saturating_sub(end),
            after - end
        );
    }
}

/// The login service of `tests/settle.rs`: `/login/{account}/{password}`,
/// 200 for "right", 401 otherwise.
fn login_app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route(
            "/login/{account}/{password}",
            get(|Path((_, password)): Path<(String, String)>| async move {
                if password == "right" {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                }
            }),
        )
        .layer(layer)
}

/// "5 wrong passwords, then locked out for 15 minutes": five 401s, then
/// 429 with `Retry-After: 900` and a `RateLimit` reset of 900 s, for the
/// right password too; right passwords before that cost nothing.
async fn login_guard(store: AnyStore) {
    let policy = Policy::new("login", ["5/15min lockout 15min".parse::<Quota>().unwrap()]).unwrap();
    let guard = RateLimitLayer::new(store.clone(), policy.clone())
        .key(key::from_fn("account", |parts| {
            parts
                .uri
                .path()
                .strip_prefix("/login/")
                .and_then(|rest| rest.split('/').next())
                .map(str::to_owned)
        }))
        .count_only_statuses([401])
        .unwrap();
    let server = TestServer::axum(login_app(guard)).await;
    let client = Client::new();
    for _ in 0..3 {
        let reply = client.get(&server.url("/login/alice/right")).await;
        assert_eq!(reply.status, 200);
    }
    // Refunds are settled after the response (on Redis, in a task of their
    // own): wait until they are, as the layer's keys are `name:kind:value`.
    let peek = RateLimiter::new(store, policy);
    let deadline = Instant::now() + Duration::from_secs(10);
    while peek.peek("custom:account:alice").await.unwrap().remaining() < 5 {
        assert!(Instant::now() < deadline, "the refunds never came");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for attempt in 0..5 {
        let reply = client.get(&server.url("/login/alice/wrong")).await;
        assert_eq!(reply.status, 401, "attempt {attempt}");
    }
    let locked = client.get(&server.url("/login/alice/wrong")).await;
    assert_eq!(locked.status, 429, "locked out after five failures");
    assert_eq!(locked.retry_after(), Some(900));
    let header = locked.header("ratelimit").expect("a RateLimit header");
    assert!(header.ends_with(";r=0;t=900"), "{header}");
    // The right password is refused as well, until the end.
    let reply = client.get(&server.url("/login/alice/right")).await;
    assert_eq!(reply.status, 429);
    assert!(
        matches!(reply.retry_after(), Some(899 | 900)),
        "{:?}",
        reply.retry_after()
    );
    // Another account is untouched.
    let reply = client.get(&server.url("/login/bob/right")).await;
    assert_eq!(reply.status, 200);
}

#[tokio::test]
async fn the_login_guard_locks_out_in_memory() {
    login_guard(MemoryStore::new().into()).await;
}

#[tokio::test]
async fn the_login_guard_locks_out_on_redis() {
    let server = RedisServer::start();
    // As in production: leases on (a lock-out's policy takes none).
    let store = RedisStore::builder()
        .pool(server.pool())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    login_guard(store.into()).await;
}

/// Delay mode (`RateLimiter::reserve`, as `acquire` and the layer's delay
/// use it) during a lock-out: a reservation that may wait until the end is
/// admitted for the end, one that may not is refused, and neither moves it.
async fn reservations_wait_out_a_lockout(store: AnyStore) {
    // 5 a second, then 5 s locked out: nothing in the test waits that long.
    let quota: Quota = "5/s lockout 5s".parse().unwrap();
    let limiter = RateLimiter::new(store, Policy::new("delayed", [quota]).unwrap());
    let mut refused = limiter.check("carol", 1).await.unwrap();
    for _ in 0..100 {
        if !refused.allowed() {
            break;
        }
        refused = limiter.check("carol", 1).await.unwrap();
    }
    assert_eq!(refused.retry_after(), Duration::from_secs(5));
    let short = limiter
        .reserve("carol", 1, Duration::from_millis(1))
        .await
        .unwrap();
    assert!(!short.admitted());
    assert!(short.wait() <= Duration::from_secs(5), "{:?}", short.wait());
    let long = limiter
        .reserve("carol", 1, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(long.admitted());
    // Until the end, not past it: the refused reservation did not extend it.
    assert!(long.wait() <= Duration::from_secs(5), "{:?}", long.wait());
    assert!(!long.wait().is_zero());
}

#[tokio::test]
async fn reservations_wait_out_a_lockout_in_memory() {
    reservations_wait_out_a_lockout(MemoryStore::new().into()).await;
}

#[tokio::test]
async fn reservations_wait_out_a_lockout_on_redis() {
    let server = RedisServer::start();
    reservations_wait_out_a_lockout(server.store().into()).await;
}

/// A changed lock-out (a policy table swap, a deploy) keeps the buckets:
/// a lock-out under way keeps its end, in both stores.
async fn a_changed_lockout_keeps_the_lockout_under_way(store: AnyStore) {
    let before: Quota = "5/15min lockout 15min".parse().unwrap();
    let after: Quota = "5/15min lockout 30min".parse().unwrap();
    let old = RateLimiter::new(store.clone(), Policy::new("swap", [before]).unwrap());
    let new = RateLimiter::new(store, Policy::new("swap", [after]).unwrap());
    for _ in 0..5 {
        assert!(old.check("dave", 1).await.unwrap().allowed());
    }
    let locked = old.check("dave", 1).await.unwrap();
    assert_eq!(locked.retry_after(), Duration::from_secs(900));
    let d = new.check("dave", 1).await.unwrap();
    assert!(!d.allowed(), "the changed lock-out let the key in");
    assert!(
        d.retry_after() <= Duration::from_secs(900),
        "{:?}",
        d.retry_after()
    );
    assert!(
        d.retry_after() > Duration::from_secs(800),
        "{:?}",
        d.retry_after()
    );
}

#[tokio::test]
async fn a_changed_lockout_keeps_the_lockout_under_way_in_memory() {
    a_changed_lockout_keeps_the_lockout_under_way(MemoryStore::new().into()).await;
}

#[tokio::test]
async fn a_changed_lockout_keeps_the_lockout_under_way_on_redis() {
    let server = RedisServer::start();
    let store = server.store();
    a_changed_lockout_keeps_the_lockout_under_way(store.clone().into()).await;
    // Read without a check (`read_buckets`, `tollgate peek`): the locked
    // bucket holds the refused token, but shows nothing remaining, and full
    // only after the end.
    let quota: Quota = "5/15min".parse().unwrap();
    let policy = Policy::new("swap", [quota]).unwrap();
    let key = store.bucket_keys("swap:dave", &policy).remove(0);
    let states = store
        .read_buckets(&policy, std::slice::from_ref(&key))
        .await
        .unwrap();
    let state = states[0].as_ref().expect("the bucket");
    assert_eq!(state.remaining(), 0);
    assert!(state.reset_after() > Duration::from_secs(900), "{state:?}");
}

/// For two seconds after a loss of Redis data ("learning"), every bucket
/// read carries a stand-in hold of half its capacity, standing in for holds
/// the loss took: a refusal then may be the stand-in's, and does not lock
/// the key out.
#[tokio::test]
async fn a_refusal_while_learning_after_a_loss_of_data_does_not_lock() {
    use tollgate::Store;

    let server = RedisServer::start();
    // Leases on, as in production: a hold granted gives the server an epoch.
    let store = RedisStore::builder()
        .pool(server.pool())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let leasable = Policy::from(Quota::new(200, Duration::from_secs(10)).unwrap());
    let started = Instant::now();
    while store.lease_stats().outstanding == 0 {
        let _ = store.check("warm", &leasable, 1).await;
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no hold granted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _: String = server.cmd(&["FLUSHALL"]);
    // 4 an hour (a token every 15 minutes), an hour locked out. Learning,
    // the stand-in holds 2 of the 4: two checks are admitted, the third is
    // refused by the stand-in, and waits for a token's refill (15 minutes),
    // not for a lock-out (an hour).
    let guard = Policy::new("guard", ["4/h lockout 1h".parse::<Quota>().unwrap()]).unwrap();
    for i in 0..2 {
        assert!(
            store.check("erin", &guard, 1).await.unwrap().allowed(),
            "check {i}"
        );
    }
    let refused = store.check("erin", &guard, 1).await.unwrap();
    assert!(!refused.allowed());
    // (Counted from the admissions' stamp, a moment earlier.)
    let wait = refused.retry_after();
    assert!(wait <= Duration::from_secs(900), "locked out: {wait:?}");
}
