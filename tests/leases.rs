//! Leases against a real Redis, in real time: several stores (instances)
//! sharing keys decide most checks in process, never admit more than the
//! bucket allows between two readings of Redis's clock, keep spending held
//! tokens through an outage until the holds expire, and give held tokens
//! back when a key is evicted or the store dropped. The exact arithmetic,
//! expiries, lost reports and resent leases are in `tests/lease_model.rs`.
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use support::RedisServer;
use tollgate::{Policy, Quota, RedisStore, Store};

fn leased(server: &RedisServer, period: Duration) -> RedisStore {
    leased_within(server, period, Duration::from_secs(5))
}

/// As [`leased`], giving up on a call after `timeout`.
fn leased_within(server: &RedisServer, period: Duration, timeout: Duration) -> RedisStore {
    RedisStore::builder()
        .pool(server.pool())
        .timeout(timeout)
        .leases(true)
        .lease_period(period)
        .build()
        .unwrap()
}

/// The holds written in `key`'s bucket (the part after the stamp), if any.
fn holds(server: &RedisServer, key: &str) -> Option<String> {
    let value: Option<String> = server.cmd(&["GET", key]);
    let value = value?;
    // `level:stamp:full,num:holds`
    value.splitn(4, ':').nth(3).map(str::to_owned)
}

/// 4 stores offer one key twice its rate for about 2 s: together they never
/// admit more than capacity + rate x the Redis time between a clock reading
/// before the first check and one after the last, and most admissions are
/// made in process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_never_admit_more_than_the_bucket_allows() {
    let server = RedisServer::start();
    let stores: Vec<RedisStore> = (0..4)
        .map(|_| leased(&server, Duration::from_millis(200)))
        .collect();
    let quota = Quota::per_second(400).unwrap();
    let policy = Arc::new(Policy::from(quota));
    let admitted = Arc::new(AtomicU64::new(0));
    let t0 = server.time_us();
    let mut tasks = Vec::new();
    for store in &stores {
        let (store, policy, admitted) = (store.clone(), Arc::clone(&policy), Arc::clone(&admitted));
        // 200 checks a second each (800 against 400): one every 5 ms.
        tasks.push(tokio::spawn(async move {
            let start = Instant::now();
            let mut next = start;
            while start.elapsed() < Duration::from_secs(2) {
                if store.check("shared", &policy, 1).await.unwrap().allowed() {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                next += Duration::from_millis(5);
                tokio::time::sleep_until(next.into()).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let t1 = server.time_us();
    let admitted = admitted.load(Ordering::Relaxed);
    let bound = quota.capacity() + (t1 - t0) * 400 / 1_000_000;
    let local: u64 = stores.iter().map(|s| s.lease_stats().local_decisions).sum();
    eprintln!("admitted {admitted} of at most {bound}; {local} in process");
    assert!(
        admitted <= bound,
        "{admitted} admitted, over the bound {bound}"
    );
    // The demand is twice the rate: the bucket runs dry, and it is the
    // scarce key's checks that go to Redis; what was held while it had
    // room was spent.
    assert!(local > 0, "no admission was made in process");
}

/// 4 stores at half a key's rate: nearly every check is decided in
/// process, and Redis sees a few calls per hundred checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_at_half_the_rate_rarely_call_redis() {
    let server = RedisServer::start();
    let stores: Vec<RedisStore> = (0..4)
        .map(|_| leased(&server, Duration::from_secs(1)))
        .collect();
    let quota = Quota::per_second(1_600).unwrap();
    let policy = Arc::new(Policy::from(quota));
    server.reset_stats();
    let mut tasks = Vec::new();
    for store in &stores {
        let (store, policy) = (store.clone(), Arc::clone(&policy));
        // 200 checks a second each: 800 against 1600.
        tasks.push(tokio::spawn(async move {
            let start = Instant::now();
            let mut next = start;
            let mut decided = 0u64;
            while start.elapsed() < Duration::from_secs(3) {
                assert!(store.check("half", &policy, 1).await.unwrap().allowed());
                decided += 1;
                next += Duration::from_millis(5);
                tokio::time::sleep_until(next.into()).await;
            }
            decided
        }));
    }
    let mut decided = 0;
    for task in tasks {
        decided += task.await.unwrap();
    }
    let calls = server.calls("evalsha") + server.calls("eval");
    let local: u64 = stores.iter().map(|s| s.lease_stats().local_decisions).sum();
    eprintln!("{decided} checks, {local} in process, {calls} script calls");
    for store in &stores {
        eprintln!("{:?}", store.lease_stats());
    }
    assert!(
        calls * 20 < decided,
        "{calls} script calls for {decided} checks: leases saved little"
    );
}

/// Redis frozen (SIGSTOP): held tokens are still spent, exactly; once they
/// are spent, checks go to Redis and fail within the timeout.
#[tokio::test]
async fn held_tokens_are_spent_through_an_outage_then_checks_fail() {
    let server = RedisServer::start();
    let store = leased_within(&server, Duration::from_secs(5), Duration::from_millis(100));
    let policy = Policy::from(Quota::per_minute(1_000).unwrap());
    // Demand builds, a lease comes.
    for _ in 0..200 {
        assert!(store.check("k", &policy, 1).await.unwrap().allowed());
        if store.lease_stats().outstanding > 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Lease requests still in flight land first.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let held = store.lease_stats().outstanding;
    assert!(held > 20, "no lease came: {:?}", store.lease_stats());
    server.freeze();
    let mut spent = 0;
    let started = Instant::now();
    let outcome = loop {
        match store.check("k", &policy, 1).await {
            Ok(d) => {
                assert!(d.allowed());
                spent += 1;
            }
            Err(e) => break e,
        }
        assert!(
            spent <= held,
            "spent {spent} of {held} held while Redis was frozen"
        );
    };
    server.thaw();
    eprintln!("spent {spent} of {held} held during the outage, then: {outcome}");
    assert_eq!(
        spent, held,
        "every held token is spent before Redis is asked"
    );
    assert!(outcome.is_store_error(), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(4));
}

/// A lease call that failed after it was sent (its reply later than the
/// store's timeout) may still run in Redis: the hold it makes, which this
/// instance will never use, is given back by a report sent after the
/// failure (again a lease period later while Redis still stalls), rather
/// than left in the bucket until its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_call_timed_out_is_given_back() {
    let server = RedisServer::start();
    let store = leased_within(&server, Duration::from_secs(1), Duration::from_millis(300));
    let policy = Policy::from(Quota::per_minute(6_000).unwrap());
    // Connected and the script loaded (a peek never takes a lease).
    let mut warm = false;
    for _ in 0..50 {
        if store.check("warm", &policy, 0).await.is_ok() {
            warm = true;
            break;
        }
    }
    assert!(warm, "the store never answered");
    // A key seen a few times asks for no lease; a fourth check within a
    // third of a period does.
    for _ in 0..3 {
        assert!(store.check("k", &policy, 1).await.unwrap().allowed());
    }
    assert_eq!(store.lease_stats().requests, 0);
    // Redis stalls: the fourth check of `k`, and the lease it asks for, time
    // out; they run when Redis comes back, and so does what was sent after.
    server.freeze();
    let err = store.check("k", &policy, 1).await.unwrap_err();
    assert!(err.is_store_error(), "{err:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.thaw();
    // The give-back is tried again a lease period (1 s) after it failed,
    // and so on up to four times.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let stats = store.lease_stats();
    assert_eq!((stats.requests, stats.granted), (1, 0), "{stats:?}");
    // Without the hold, the bucket is full again and its key gone (the
    // hold would keep it, as it does without the report).
    let keys: Vec<String> = server.cmd(&["KEYS", "*{k}*"]);
    for key in &keys {
        assert_eq!(holds(&server, key), None, "a hold nobody uses is left");
    }
}

/// A dropped store reports its holds: what it held goes back to the
/// bucket instead of waiting for the holds' expiry.
#[tokio::test]
async fn a_dropped_store_gives_its_holds_back() {
    let server = RedisServer::start();
    let store = leased(&server, Duration::from_secs(10));
    let policy = Policy::from(Quota::per_minute(6_000).unwrap());
    let key = store.bucket_key("k", &policy.quotas()[0]);
    for _ in 0..100 {
        assert!(store.check("k", &policy, 1).await.unwrap().allowed());
        if store.lease_stats().outstanding > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(store.lease_stats().outstanding > 0, "no lease came");
    assert!(holds(&server, &key).is_some(), "the bucket has no holds");
    drop(store);
    let started = Instant::now();
    while holds(&server, &key).is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the holds were not given back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// With room for one key, a second key evicts the first, whose holds are
/// reported.
#[tokio::test]
async fn an_evicted_key_gives_its_holds_back() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .pool(server.pool())
        .timeout(Duration::from_secs(5))
        .leases(true)
        .lease_period(Duration::from_secs(10))
        .lease_keys(1)
        .build()
        .unwrap();
    let policy = Policy::from(Quota::per_minute(6_000).unwrap());
    let first = store.bucket_key("first", &policy.quotas()[0]);
    for _ in 0..100 {
        assert!(store.check("first", &policy, 1).await.unwrap().allowed());
        if store.lease_stats().outstanding > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(holds(&server, &first).is_some(), "no lease came");
    assert!(store.check("second", &policy, 1).await.unwrap().allowed());
    let started = Instant::now();
    // Gone from the bucket, and counted as returned once the report's
    // reply is read.
    while holds(&server, &first).is_some() || store.lease_stats().returned == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the evicted key's holds were not given back: {:?}",
            store.lease_stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A decision made in process never says more remains than this instance
/// can still spend from its hold, and never more than Redis has.
#[tokio::test]
async fn a_local_decision_never_overstates_what_remains() {
    let server = RedisServer::start();
    let store = leased(&server, Duration::from_secs(1));
    let plain = RedisStore::builder()
        .pool(server.pool())
        .leases(false)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let policy = Policy::from(Quota::per_minute(600).unwrap());
    let mut local = 0;
    for _ in 0..300 {
        let before = store.lease_stats().local_decisions;
        let d = store.check("k", &policy, 1).await.unwrap();
        assert!(d.allowed());
        if store.lease_stats().local_decisions > before {
            local += 1;
            let held = store.lease_stats().outstanding;
            assert!(
                d.remaining() <= held,
                "{} remaining, {held} held",
                d.remaining()
            );
            let redis = plain.check("k", &policy, 0).await.unwrap();
            // What Redis has free, plus what this instance holds unspent.
            assert!(d.remaining() <= redis.remaining() + held);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(local > 0, "no decision was made in process");
}

/// Leases are on by default: a store built with nothing said about them
/// decides a key with room to spare in process once its first lease is
/// granted (a roomy one, from the first), and `.leases(false)` turns them
/// off.
#[tokio::test]
async fn leases_are_on_by_default() {
    let server = RedisServer::start();
    let store = |leases: Option<bool>| {
        let builder = RedisStore::builder()
            .url(server.url())
            .timeout(Duration::from_secs(5));
        match leases {
            Some(on) => builder.leases(on),
            None => builder,
        }
        .build()
        .unwrap()
    };
    let (default, off) = (store(None), store(Some(false)));
    let policy = Policy::from(Quota::per_minute(6_000).unwrap());
    for _ in 0..200 {
        assert!(default.check("d", &policy, 1).await.unwrap().allowed());
        assert!(off.check("o", &policy, 1).await.unwrap().allowed());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let stats = default.lease_stats();
    assert!(stats.local_decisions > 100, "{stats:?}");
    // The first lease was roomy (a plain one would last a few checks at
    // this pace, and 200 checks would take dozens).
    assert!(stats.requests <= 4, "{stats:?}");
    let stats = off.lease_stats();
    assert_eq!((stats.requests, stats.local_decisions), (0, 0), "{stats:?}");
    let keys: Vec<String> = server.cmd(&["KEYS", "*{o}*"]);
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(holds(&server, &keys[0]), None);
}

/// A policy of two quotas: a lease holds the same tokens on both buckets,
/// and what is admitted stays within each quota's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_holds_on_every_quota_of_a_policy() {
    let server = RedisServer::start();
    let stores: Vec<RedisStore> = (0..2)
        .map(|_| leased(&server, Duration::from_millis(500)))
        .collect();
    let second = Quota::per_second(300).unwrap();
    let minute = Quota::per_minute(12_000).unwrap().burst(500).unwrap();
    let policy = Arc::new(Policy::new("two", [second, minute]).unwrap());
    let keys: Vec<String> = policy
        .quotas()
        .iter()
        .map(|q| stores[0].bucket_key("both", q))
        .collect();
    let admitted = Arc::new(AtomicU64::new(0));
    let t0 = server.time_us();
    let mut tasks = Vec::new();
    for store in &stores {
        let (store, policy, admitted) = (store.clone(), Arc::clone(&policy), Arc::clone(&admitted));
        // 250 checks a second each: 500 against 300 and 200 a second.
        tasks.push(tokio::spawn(async move {
            let start = Instant::now();
            let mut next = start;
            let mut both_held = false;
            while start.elapsed() < Duration::from_secs(2) {
                if store.check("both", &policy, 1).await.unwrap().allowed() {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                next += Duration::from_millis(4);
                tokio::time::sleep_until(next.into()).await;
            }
            both_held |= store.lease_stats().granted > 0;
            both_held
        }));
    }
    let mut granted = false;
    for task in tasks {
        granted |= task.await.unwrap();
    }
    let t1 = server.time_us();
    let admitted = admitted.load(Ordering::Relaxed);
    let span = t1 - t0;
    let bounds = [
        second.capacity() + span * 300 / 1_000_000,
        minute.capacity() + span * 200 / 1_000_000,
    ];
    eprintln!("admitted {admitted}, bounds {bounds:?}");
    for bound in bounds {
        assert!(
            admitted <= bound,
            "{admitted} admitted, over the bound {bound}"
        );
    }
    assert!(granted, "no lease was granted");
    // Whatever is held now is held on both buckets, the same tokens.
    let on = |key: &str| {
        holds(&server, key)
            .map(|h| h.split(';').count())
            .unwrap_or(0)
    };
    assert_eq!(
        on(&keys[0]),
        on(&keys[1]),
        "holds differ between the buckets"
    );
}

/// A reset of a key's buckets under one policy also forgets this
/// instance's holds on them taken under another policy that shares a
/// bucket (the same quota): those holds went with the bucket, and
/// spending them would admit beyond the fresh bucket.
#[tokio::test]
async fn a_reset_forgets_holds_taken_under_another_policy_on_its_buckets() {
    let server = RedisServer::start();
    let store = leased(&server, Duration::from_secs(10));
    let per_minute = Quota::per_minute(6_000).unwrap();
    // Named: a bare quota's policy (`default`) keeps buckets of its own.
    let reset = Policy::new("reset", [per_minute]).unwrap();
    let sharing = Policy::new("sharing", [per_minute, Quota::per_hour(100_000).unwrap()]).unwrap();
    for _ in 0..100 {
        assert!(store.check("k", &sharing, 1).await.unwrap().allowed());
        if store.lease_stats().outstanding > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(store.lease_stats().outstanding > 0, "no lease came");
    let local = store.lease_stats().local_decisions;
    assert!(store.check("k", &sharing, 1).await.unwrap().allowed());
    assert_eq!(
        store.lease_stats().local_decisions,
        local + 1,
        "decided from the hold"
    );
    store.reset("k", &reset).await.unwrap();
    assert_eq!(
        store.lease_stats().outstanding,
        0,
        "{:?}",
        store.lease_stats()
    );
    // The next check goes to Redis, whose fresh per-minute bucket saw it.
    assert!(store.check("k", &sharing, 1).await.unwrap().allowed());
    assert_eq!(store.lease_stats().local_decisions, local + 1);
    let key = store.bucket_keys("k", &reset).remove(0);
    assert!(server.cmd::<Vec<String>>(&["KEYS", &key]).len() == 1);
}

/// A layer keyed by a header over a leasing store spends a held key's
/// tokens in the service's `call` exactly as the general path does: two
/// servers over one store, one whose layer can decide there and one that
/// cannot (its cost is a closure), take turns on one key through real
/// sockets. Each decision made in process, on either server, is one token
/// less of the same hold (the remaining count steps down by one, except
/// where a new hold takes over, at most once per lease granted), and its
/// headers say what the handler's decision says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_spends_held_tokens_as_the_general_path_does() {
    use axum::routing::get;
    use axum::{Extension, Router};
    use support::http::{Client, TestServer};
    use tollgate::Decision;
    use tollgate::key::Header;
    use tollgate::layer::RateLimitLayer;

    async fn remaining(Extension(d): Extension<Decision>) -> String {
        d.remaining().to_string()
    }
    let redis = RedisServer::start();
    let store = leased(&redis, Duration::from_secs(1));
    let quota = Quota::per_second(100).unwrap().burst(10_000).unwrap();
    let layer =
        RateLimitLayer::new(store.clone(), quota).key(Header::new("x-client").unwrap().verbatim());
    let app = |layer: RateLimitLayer| Router::new().route("/", get(remaining)).layer(layer);
    let held = TestServer::axum(app(layer.clone())).await;
    let general = TestServer::axum(app(layer.cost(|_| 1))).await;
    let client = Client::new();
    let mut last: Option<u64> = None;
    let (mut local, mut steps, mut jumps) = (0, 0, 0);
    for n in 0..400 {
        let server = if n % 2 == 0 { &held } else { &general };
        let before = store.lease_stats().local_decisions;
        let reply = client
            .get_with(&server.url("/"), &[("x-client", b"k")])
            .await;
        assert_eq!(reply.status, 200, "request {n}: {reply:?}");
        let left: u64 = reply.body.parse().unwrap();
        let r = reply
            .header("ratelimit")
            .and_then(|h| h.split(";r=").nth(1))
            .and_then(|r| r.split(';').next())
            .and_then(|r| r.parse::<u64>().ok());
        assert_eq!(r, Some(left), "request {n}: {reply:?}");
        if store.lease_stats().local_decisions == before + 1 {
            local += 1;
            if let Some(last) = last {
                steps += 1;
                if left + 1 != last {
                    jumps += 1;
                }
            }
            last = Some(left);
        } else {
            last = None;
        }
    }
    let stats = store.lease_stats();
    assert!(local >= 300, "{local} of 400 decided in process: {stats:?}");
    assert!(
        jumps <= stats.requests,
        "{jumps} of {steps} steps were not one token: {stats:?}"
    );
}

/// Keys seen a few times cost what they cost without leases: random
/// workloads of keys each checked one to three times (cost 1, in a random
/// order, each key's checks as close together as the calls allow, under
/// a random quota that leases pay on) never ask for a lease, so nothing is
/// held for them in Redis and each check is one decision of the script, as
/// on a store without leases. A key checked a fourth time then does ask.
/// `PROPTEST_CASES` scales it (`scripts/properties.sh` runs it long).
#[test]
fn keys_seen_a_few_times_are_never_leased() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = runtime.block_on(async { leased(&server, Duration::from_secs(1)) });
    let case = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let workload = (
        prop::collection::vec(1..=3usize, 1..40),
        any::<u64>(),
        10..100_000u32,
    );
    runner
        .run(&workload, |(counts, seed, per_second)| {
            let case = case.fetch_add(1, Ordering::Relaxed);
            let policy = Policy::from(Quota::per_second(per_second.into()).unwrap());
            // Each key's checks, shuffled (xorshift from `seed`).
            let mut order: Vec<usize> = counts
                .iter()
                .enumerate()
                .flat_map(|(k, &n)| std::iter::repeat_n(k, n))
                .collect();
            let mut x = seed | 1;
            for i in (1..order.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                order.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let before = store.lease_stats();
            runtime.block_on(async {
                for &k in &order {
                    let key = format!("c{case}:k{k}");
                    let decision = store.check(&key, &policy, 1).await.unwrap();
                    prop_assert!(decision.allowed(), "{key}: {decision:?}");
                }
                Ok(())
            })?;
            let after = store.lease_stats();
            prop_assert_eq!(after.requests, before.requests, "{:?}", after);
            prop_assert_eq!(after.local_decisions, before.local_decisions);
            prop_assert_eq!(after.held, 0);
            Ok(())
        })
        .unwrap();
    // The same checks on one key, one more time: it shows demand now.
    runtime.block_on(async {
        let policy = Policy::from(Quota::per_second(1_000).unwrap());
        for _ in 0..4 {
            assert!(store.check("busy", &policy, 1).await.unwrap().allowed());
        }
    });
    // (Counted when the check asks, before the request is sent.)
    assert_eq!(store.lease_stats().requests, 1, "{:?}", store.lease_stats());
}
