//! RedisStore against real redis-server processes: exact refills, denials that
//! spend nothing, TTLs, several quotas at once, Redis `TIME`, script reloads, one
//! round trip per decision, and what callers see when Redis fails.
//!
//! Each test starts its own server, so tests can stop, restart or freeze it.
#![cfg(all(feature = "redis", feature = "test-util"))]

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::RedisServer;
use tollgate::{Error, Policy, Quota, RateLimiter, RedisStore, Store};

/// A realistic clock for `check_at` (microseconds since the epoch).
const T0: u64 = 1_763_000_000_000_000;
const SECOND: u64 = 1_000_000;
const HOUR: u64 = 3_600 * SECOND;

const SCRIPT: &str = include_str!("../lua/token_bucket.lua");

fn q(tokens: u64, period: Duration) -> Quota {
    Quota::new(tokens, period).unwrap()
}

fn get(server: &RedisServer, key: &str) -> Option<String> {
    server.cmd(&["GET", key])
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cmd(&["PTTL", key])
}

/// The stored `level:stamp` pair of a bucket.
fn stored(server: &RedisServer, key: &str) -> (i64, i64) {
    let value = get(server, key).expect("bucket is stored");
    let (level, stamp) = value.split_once(':').expect("level:stamp");
    (level.parse().unwrap(), stamp.parse().unwrap())
}

fn keys(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    keys.sort();
    keys
}

// ---------------------------------------------------------------------------
// Exact refills
// ---------------------------------------------------------------------------

/// One token an hour, with a burst of 3: every token arrives exactly on the hour,
/// not a microsecond earlier, not later (flooring a slow refill, or restarting the
/// clock on each call, would never refill it).
#[tokio::test]
async fn one_per_hour_refills_exactly_on_schedule() {
    let server = RedisServer::start();
    let store = server.store();
    let hourly = Policy::from(Quota::per_hour(1).unwrap().burst(3).unwrap());
    assert!(store.check_at("h", &hourly, 3, T0).await.unwrap().allowed());
    for k in 1..=3 {
        let due = T0 + k * HOUR;
        // Peeks and denials on the way must not disturb the refill.
        for t in [T0 + (k - 1) * HOUR + 1, due - HOUR / 2, due - 7_777] {
            let d = store.check_at("h", &hourly, 1, t).await.unwrap();
            assert!(!d.allowed(), "token {k} early at {}", t - T0);
            assert_eq!(d.retry_after(), Duration::from_micros(due - t));
        }
        let early = store.check_at("h", &hourly, 1, due - 1).await.unwrap();
        assert!(!early.allowed(), "token {k} at due - 1µs");
        assert_eq!(early.retry_after(), Duration::from_micros(1));
        let on_time = store.check_at("h", &hourly, 1, due).await.unwrap();
        assert!(on_time.allowed(), "token {k} late");
        assert_eq!(on_time.remaining(), 0);
        assert_eq!(on_time.reset_after(), Duration::from_secs(3 * 3600));
    }
}

/// Seven a second: token k is due at ceil(k / 7 s). The fractions left after
/// each admission must carry over exactly.
#[tokio::test]
async fn seven_per_second_refills_exactly_on_schedule() {
    let server = RedisServer::start();
    let store = server.store();
    let seven = Policy::from(Quota::per_second(7).unwrap());
    assert!(store.check_at("s", &seven, 7, T0).await.unwrap().allowed());
    for k in 1..=21u64 {
        let due = T0 + (k * SECOND).div_ceil(7);
        let early = store.check_at("s", &seven, 1, due - 1).await.unwrap();
        assert!(!early.allowed(), "token {k} early");
        assert_eq!(early.retry_after(), Duration::from_micros(1));
        assert!(
            store.check_at("s", &seven, 1, due).await.unwrap().allowed(),
            "token {k} late"
        );
    }
}

/// Sub-second periods, slow rates and costs above 1 all answer exact figures.
#[tokio::test]
async fn subsecond_and_slow_rates_with_costs_above_one() {
    let server = RedisServer::start();
    let store = server.store();
    // (quota, cost spent at T0, cost asked next, expected retry_after in µs)
    let cases = [
        // 10/s: 6 left, 7 asked: one token short, 100 ms.
        (Quota::per_second(10).unwrap(), 4, 7, 100_000),
        // One token every 250 ms.
        (q(1, Duration::from_millis(250)), 1, 1, 250_000),
        // 3 per 1500 ms is one token every 500 ms; 2 short is 1 s.
        (q(3, Duration::from_millis(1500)), 3, 2, SECOND),
        // 5 per 10 ms: one token every 2 ms.
        (q(5, Duration::from_millis(10)), 5, 5, 10_000),
        // 1 per minute with a burst of 5: 4 short is 4 minutes.
        (
            Quota::per_minute(1).unwrap().burst(5).unwrap(),
            5,
            4,
            240 * SECOND,
        ),
        // 2 a day: one token every 12 hours.
        (q(2, Duration::from_secs(86_400)), 2, 1, 12 * HOUR),
    ];
    for (i, (quota, spend, ask, retry_us)) in cases.into_iter().enumerate() {
        let key = format!("rate:{i}");
        let quotas = Policy::from(quota);
        let first = store.check_at(&key, &quotas, spend, T0).await.unwrap();
        assert!(first.allowed(), "{quota}");
        assert_eq!(first.remaining(), quota.capacity() - spend, "{quota}");
        let d = store.check_at(&key, &quotas, ask, T0).await.unwrap();
        assert!(!d.allowed(), "{quota}");
        assert_eq!(d.retry_after(), Duration::from_micros(retry_us), "{quota}");
        let due = T0 + retry_us;
        let d = store.check_at(&key, &quotas, ask, due - 1).await.unwrap();
        assert!(!d.allowed(), "{quota} admitted 1 µs early");
        let d = store.check_at(&key, &quotas, ask, due).await.unwrap();
        assert!(d.allowed(), "{quota} not admitted on time");
    }
}

/// A cost above the capacity can never succeed: an error, not a wait, and nothing
/// is stored. The script refuses it too when called directly.
#[tokio::test]
async fn cost_above_capacity_is_refused_by_the_store_and_the_script() {
    let server = RedisServer::start();
    let store = server.store();
    let quota = Quota::per_second(1).unwrap().burst(4).unwrap();
    let err = store
        .check("big", &Policy::from(quota), 5)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::CostExceedsCapacity {
                cost: 5,
                capacity: 4
            }
        ),
        "{err:?}"
    );
    assert!(!err.is_store_error());
    assert!(keys(&server).is_empty());

    // The script on its own: KEYS[1], Redis TIME, one quota of capacity 4 at
    // 1 token per 1e6 µs (full = 4 x 1e6 units), one decision of cost 5.
    let key = store.bucket_key("big", &quota);
    let args = |cost: &'static str| ["", "1", "4000000", "1", "1000000", "1", "1", cost, "1", "0"];
    let sha: String = server.cmd(&["SCRIPT", "LOAD", SCRIPT]);
    for cmd in [["EVALSHA", sha.as_str()], ["EVAL", SCRIPT]] {
        let mut full: Vec<&str> = cmd.to_vec();
        full.extend(["1", key.as_str()]);
        full.extend(args("5"));
        let err = server.try_cmd::<Vec<i64>>(&full).unwrap_err();
        assert!(
            err.to_string().contains("cost exceeds capacity"),
            "{}: {err}",
            cmd[0]
        );
    }
    assert!(keys(&server).is_empty());
    // The same call with cost 4 is admitted: the refusal was about the cost.
    let mut ok = vec!["EVALSHA", sha.as_str(), "1", key.as_str()];
    ok.extend(args("4"));
    let reply: Vec<i64> = server.cmd(&ok);
    assert_eq!(reply[..2], [1, 0]);
}

// ---------------------------------------------------------------------------
// Denials, TTLs, peeks and resets
// ---------------------------------------------------------------------------

/// A denied check writes nothing: the stored value and its TTL stay as they
/// were, and the balance never goes below zero however many denials come.
#[tokio::test]
async fn a_denial_spends_nothing_and_the_balance_never_goes_negative() {
    let server = RedisServer::start();
    let store = server.store();
    // One token every 12 s: the key lives a minute of real time, so the test
    // cannot race its TTL.
    let quotas = Policy::from(Quota::per_minute(5).unwrap());
    let key = store.bucket_key("d", &quotas.quotas()[0]);
    assert!(store.check_at("d", &quotas, 5, T0).await.unwrap().allowed());
    let value = get(&server, &key).unwrap();
    let ttl = pttl(&server, &key);
    // 6 s later there is half a token: 200 denials of 1, 2 and 5 tokens.
    for i in 0..200u64 {
        let cost = [1, 2, 5][(i % 3) as usize];
        let d = store
            .check_at("d", &quotas, cost, T0 + 6 * SECOND)
            .await
            .unwrap();
        assert!(!d.allowed());
        assert_eq!(d.remaining(), 0);
        // Half a token is there: the wait is for the rest only.
        assert_eq!(
            d.retry_after(),
            Duration::from_micros(cost * 12 * SECOND - 6 * SECOND)
        );
    }
    assert_eq!(
        get(&server, &key).unwrap(),
        value,
        "a denial wrote the bucket"
    );
    let ttl_after = pttl(&server, &key);
    assert!(
        ttl_after <= ttl && ttl_after > 0,
        "a denial touched the TTL: {ttl} -> {ttl_after}"
    );
    // Had a denial taken anything, the token due at 12 s would come later.
    let d = store
        .check_at("d", &quotas, 1, T0 + 12 * SECOND)
        .await
        .unwrap();
    assert!(d.allowed());
    let (level, _) = stored(&server, &key);
    assert_eq!(level, 0);

    // The same with the real clock: a burst of production denials leaves a
    // non-negative level behind.
    let quotas = Policy::from(Quota::per_second(5).unwrap());
    for _ in 0..100 {
        let _ = store.check("live", &quotas, 2).await.unwrap();
    }
    let (level, _) = stored(&server, &store.bucket_key("live", &quotas.quotas()[0]));
    assert!(level >= 0, "level {level}");
}

/// Every stored bucket has a TTL that lets it live until it is full again (an
/// earlier expiry would hand out tokens early) and not much longer (at most one
/// second more), for several quotas and after partial spends.
#[tokio::test]
async fn ttl_covers_the_refill_and_no_more_than_a_second_beyond() {
    let server = RedisServer::start();
    let store = server.store();
    let quotas = [
        Quota::per_second(3).unwrap(),
        Quota::per_hour(1).unwrap(),
        q(3, Duration::from_millis(1500)).burst(5).unwrap(),
        Quota::per_minute(100).unwrap().burst(7).unwrap(),
        q(1, Duration::from_secs(86_400)).burst(2).unwrap(),
    ];
    for (i, quota) in quotas.iter().enumerate() {
        let key = format!("ttl:{i}");
        // A first spend, a bigger one, then one more: partial spends each time.
        for cost in [1, quota.capacity() / 2, 1] {
            if cost == 0 {
                continue;
            }
            let start = Instant::now();
            let d = store
                .check(&key, &Policy::from(*quota), cost)
                .await
                .unwrap();
            if !d.allowed() {
                continue;
            }
            let ttl = pttl(&server, &store.bucket_key(&key, quota));
            let waited_ms = start.elapsed().as_millis() as i64 + 1;
            let to_full_ms = d.reset_after().as_micros().div_ceil(1000) as i64;
            assert!(ttl > 0, "{quota}: ttl {ttl}");
            assert!(
                ttl <= to_full_ms + 1000,
                "{quota}: ttl {ttl} ms, full again in {to_full_ms} ms"
            );
            assert!(
                ttl + waited_ms >= to_full_ms,
                "{quota}: key expires {ttl} ms from now, before the bucket is full in {to_full_ms} ms"
            );
        }
    }
}

/// An idle client's key disappears by itself once its bucket is full again.
#[tokio::test]
async fn keys_vanish_after_their_ttl() {
    let server = RedisServer::start();
    let store = server.store();
    let fast = Quota::per_second(1000).unwrap();
    let _ = store.check("idle", &Policy::from(fast), 1).await.unwrap();
    let key = store.bucket_key("idle", &fast);
    let exists = |server: &RedisServer| server.cmd::<i64>(&["EXISTS", &key]) == 1;
    assert!(exists(&server));
    // Full in 1 ms, so the TTL is at most 1001 ms.
    let deadline = Instant::now() + Duration::from_secs(5);
    while exists(&server) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!exists(&server), "key still there after 5 s");
}

/// A peek (cost 0) creates no key and changes neither value nor TTL.
#[tokio::test]
async fn peek_writes_nothing() {
    let server = RedisServer::start();
    let store = server.store();
    let limiter = RateLimiter::new(store.clone(), Quota::per_minute(10).unwrap());
    let d = limiter.peek("new").await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 10);
    assert!(keys(&server).is_empty(), "peek created {:?}", keys(&server));

    let _ = limiter.check("new", 4).await.unwrap();
    let key = store.bucket_key("new", &limiter.quotas()[0]);
    let value = get(&server, &key);
    let ttl = pttl(&server, &key);
    for _ in 0..10 {
        assert_eq!(limiter.peek("new").await.unwrap().remaining(), 6);
    }
    assert_eq!(get(&server, &key), value);
    assert!(pttl(&server, &key) <= ttl);
}

/// `reset` forgets every bucket of the client; others keep theirs.
#[tokio::test]
async fn reset_forgets_the_buckets() {
    let server = RedisServer::start();
    let limiter = RateLimiter::new(
        server.store(),
        Policy::new(
            "reset",
            [Quota::per_second(5).unwrap(), Quota::per_hour(20).unwrap()],
        )
        .unwrap(),
    );
    let _ = limiter.check("a", 5).await.unwrap();
    let _ = limiter.check("b", 2).await.unwrap();
    assert!(!limiter.check("a", 1).await.unwrap().allowed());
    assert_eq!(keys(&server).len(), 4);
    limiter.reset("a").await.unwrap();
    let left = keys(&server);
    assert_eq!(left.len(), 2);
    assert!(left.iter().all(|k| k.contains("{b}")), "{left:?}");
    let d = limiter.peek("a").await.unwrap();
    assert_eq!(
        d.states().iter().map(|s| s.remaining()).collect::<Vec<_>>(),
        [5, 20]
    );
    // The hourly bucket of b (one token every 3 minutes) was not reset.
    assert_eq!(limiter.peek("b").await.unwrap().states()[1].remaining(), 18);
    // Resetting an unknown client is fine.
    limiter.reset("nobody").await.unwrap();
}

// ---------------------------------------------------------------------------
// Several quotas at once
// ---------------------------------------------------------------------------

/// 10/s and 15/h decided together: when the hourly quota denies, the per-second
/// bucket is left untouched, and the decision names the hourly quota.
#[tokio::test]
async fn several_quotas_are_all_or_nothing() {
    let server = RedisServer::start();
    let store = server.store();
    let second = Quota::per_second(10).unwrap();
    let hour = Quota::per_hour(15).unwrap();
    let quotas = Policy::new("m", [second, hour]).unwrap();
    let second_key = store.bucket_key("m", &second);
    let hour_key = store.bucket_key("m", &hour);

    let d = store.check_at("m", &quotas, 10, T0).await.unwrap();
    assert!(d.allowed());
    // Fewest left: the per-second bucket (0 of 10, hourly 5 of 15).
    assert_eq!((d.quota(), d.remaining()), (Some(&second), 0));

    // Still within the same second: the per-second quota denies, the hourly
    // bucket stays as it was.
    let hour_before = get(&server, &hour_key);
    let d = store.check_at("m", &quotas, 1, T0 + 50_000).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(d.quota(), Some(&second));
    assert_eq!(d.retry_after(), Duration::from_millis(50));
    assert_eq!(d.states()[1].remaining(), 5);
    assert_eq!(d.states()[1].retry_after(), Duration::ZERO);
    assert_eq!(get(&server, &hour_key), hour_before);

    let d = store.check_at("m", &quotas, 5, T0 + SECOND).await.unwrap();
    assert!(d.allowed());
    assert_eq!((d.quota(), d.remaining()), (Some(&hour), 0));

    // The per-second bucket is full again, the hourly one is empty: denied, and
    // the per-second bucket must not be charged.
    let second_before = get(&server, &second_key);
    let d = store
        .check_at("m", &quotas, 1, T0 + 2 * SECOND)
        .await
        .unwrap();
    assert!(!d.allowed());
    assert_eq!(d.quota(), Some(&hour));
    // One token every 240 s; 2 s of it have passed.
    assert_eq!(d.retry_after(), Duration::from_secs(238));
    assert_eq!(d.remaining(), 0);
    let per_second = d.states()[0];
    assert_eq!(per_second.remaining(), 10);
    assert_eq!(per_second.retry_after(), Duration::ZERO);
    assert_eq!(get(&server, &second_key), second_before);
}

/// All keys of one client share a `{hash tag}` and so one cluster slot, even for
/// hostile client keys, while different clients get different tags.
#[tokio::test]
async fn all_keys_of_a_client_share_one_cluster_slot() {
    // CLUSTER KEYSLOT needs a cluster-enabled node ("cluster support disabled"
    // otherwise); it answers without any slot assigned.
    let server = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let store = RedisStore::from_pool(server.pool());
    let quotas = [
        Quota::per_second(10).unwrap(),
        Quota::per_hour(1000).unwrap(),
        q(3, Duration::from_millis(1500)).burst(9).unwrap(),
    ];
    let long = "x".repeat(500);
    let clients = ["user:42", "a{b}c", "{", "}{", &long, "ip:2001:db8::/64"];
    let mut tags = Vec::new();
    for client in clients {
        let keys: Vec<String> = quotas.iter().map(|q| store.bucket_key(client, q)).collect();
        let slots: Vec<i64> = keys
            .iter()
            .map(|k| server.cmd(&["CLUSTER", "KEYSLOT", k]))
            .collect();
        assert!(
            slots.iter().all(|s| *s == slots[0]),
            "{keys:?} -> {slots:?}"
        );
        // The tag is the first {...} of the key: exactly one pair of braces.
        let tag = keys[0]
            .split_once('{')
            .and_then(|(_, rest)| rest.split_once('}'))
            .map(|(tag, _)| tag.to_string())
            .unwrap();
        for k in &keys {
            assert_eq!(k.matches('{').count(), 1, "{k}");
            assert_eq!(k.matches('}').count(), 1, "{k}");
            assert!(k.contains(&format!("{{{tag}}}")), "{k}");
        }
        let tag_slot: i64 = server.cmd(&["CLUSTER", "KEYSLOT", &tag]);
        assert_eq!(tag_slot, slots[0]);
        tags.push(tag);
    }
    let mut distinct = tags.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), tags.len(), "{tags:?}");
}

// ---------------------------------------------------------------------------
// The clock
// ---------------------------------------------------------------------------

/// Production checks take the time from Redis `TIME`, once per check whatever
/// the number of quotas; `check_at` never calls it.
#[tokio::test]
async fn production_checks_read_redis_time_once_each() {
    let server = RedisServer::start();
    let store = server.store();
    let quotas = Policy::new(
        "clock",
        [
            Quota::per_second(100).unwrap(),
            Quota::per_hour(1000).unwrap(),
        ],
    )
    .unwrap();
    // Commands run inside a script are counted in INFO commandstats.
    let _: i64 = server.cmd(&["EVAL", "redis.call('TIME') return 1", "0"]);
    assert_eq!(server.calls("time"), 1);
    server.reset_stats();
    const N: u64 = 37;
    for _ in 0..N {
        let _ = store.check("clock", &quotas, 1).await.unwrap();
    }
    for i in 0..5 {
        let _ = store.check_at("clock2", &quotas, 1, T0 + i).await.unwrap();
    }
    assert_eq!(server.calls("time"), N);
}

/// A bucket stamped in the future (written by a server whose clock was ahead, or
/// here by `check_at`) gets no refill from a production check until Redis time
/// catches up, and keeps its stamp; one stamped in the past refills from Redis
/// time.
#[tokio::test]
async fn a_stamp_ahead_of_redis_time_refills_nothing() {
    let server = RedisServer::start();
    let store = server.store();
    let quotas = Policy::from(Quota::per_second(10).unwrap());
    let now = server.time_us();

    // Half spent at a stamp an hour ahead of Redis.
    let ahead = store.bucket_key("ahead", &quotas.quotas()[0]);
    let d = store
        .check_at("ahead", &quotas, 5, now + HOUR)
        .await
        .unwrap();
    assert!(d.allowed());
    // Spending goes on from the level as it was: no refill, the stamp stays.
    let d = store.check("ahead", &quotas, 1).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 4, "refilled from a clock behind the stamp");
    let (_, stamp) = stored(&server, &ahead);
    assert_eq!(stamp as u64, now + HOUR, "stamp moved back");
    // The key lives until the bucket is full counted from its stamp: over an hour.
    assert!(
        pttl(&server, &ahead) > 3_600_000,
        "{}",
        pttl(&server, &ahead)
    );
    assert!(store.check("ahead", &quotas, 4).await.unwrap().allowed());
    let value = get(&server, &ahead);
    let d = store.check("ahead", &quotas, 1).await.unwrap();
    assert!(!d.allowed(), "refilled from a clock behind the stamp");
    assert_eq!(d.remaining(), 0);
    // The wait counts from the stamp, an hour (less the test's run) away.
    assert!(d.retry_after() > Duration::from_secs(3590), "{d:?}");
    assert!(d.retry_after() <= Duration::from_secs(3600) + Duration::from_millis(100));
    assert_eq!(get(&server, &ahead), value, "a denial wrote the bucket");

    let behind = store.bucket_key("behind", &quotas.quotas()[0]);
    let _ = store
        .check_at("behind", &quotas, 10, now - 2 * SECOND)
        .await
        .unwrap();
    let d = store.check("behind", &quotas, 1).await.unwrap();
    assert!(d.allowed(), "no refill from Redis time");
    assert_eq!(d.remaining(), 9);
    let (_, stamp) = stored(&server, &behind);
    let after = server.time_us();
    assert!((now..=after).contains(&(stamp as u64)), "stamp {stamp}");
}

// ---------------------------------------------------------------------------
// Script cache and restarts
// ---------------------------------------------------------------------------

/// After `SCRIPT FLUSH` the next check reloads the script and answers from the
/// bucket it had.
#[tokio::test]
async fn script_flush_reloads_the_script_and_keeps_state() {
    let server = RedisServer::start();
    let store = server.store();
    let quotas = Policy::from(Quota::per_hour(10).unwrap());
    // A reload is an EVAL of the whole script after EVALSHA met NOSCRIPT.
    let loads = |server: &RedisServer| server.calls("script|load") + server.calls("eval");
    assert_eq!(store.check("f", &quotas, 3).await.unwrap().remaining(), 7);
    assert_eq!(loads(&server), 1, "first check loads the script");
    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    let d = store.check("f", &quotas, 2).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 5, "state lost across SCRIPT FLUSH");
    assert_eq!(loads(&server), 2, "script not reloaded");
    // Loaded again, the next check needs no reload.
    let _ = store.check("f", &quotas, 1).await.unwrap();
    assert_eq!(loads(&server), 2);
}

/// A Redis restart (connection broken, script cache and data gone) between two
/// checks: the next check answers from a fresh bucket without an error.
#[tokio::test]
async fn a_redis_restart_is_invisible_to_the_caller() {
    let mut server = RedisServer::start();
    let store = server.store();
    let quotas = Policy::from(Quota::per_hour(10).unwrap());
    assert_eq!(store.check("r", &quotas, 4).await.unwrap().remaining(), 6);
    server.restart();
    let d = store
        .check("r", &quotas, 1)
        .await
        .expect("check after restart");
    assert!(d.allowed());
    assert_eq!(d.remaining(), 9, "not a fresh bucket");
    assert_eq!(store.check("r", &quotas, 1).await.unwrap().remaining(), 8);
}

// ---------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------

/// After warm-up, K decisions one after the other send exactly K commands to
/// the server, all `EVALSHA`: no `PING` from a pool checkout, no reload,
/// nothing else. Concurrent decisions pipeline on the held connection and are
/// batched: at most one command per decision, every decision answered (one
/// `GET` per quota each), one `TIME` per command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_one_round_trip_per_decision() {
    let server = RedisServer::start();
    let limiter = RateLimiter::new(
        server.store(),
        Policy::new(
            "trips",
            [
                Quota::per_second(1000).unwrap(),
                Quota::per_hour(100_000).unwrap(),
            ],
        )
        .unwrap(),
    );
    let _ = limiter.check("warm", 1).await.unwrap();
    server.reset_stats();

    const K: u64 = 300;
    for i in 0..K {
        let _ = limiter.check(&format!("seq:{}", i % 7), 1).await.unwrap();
    }
    let mut calls = server.all_calls();
    // INFO commandstats also counts the commands the script runs inside Redis:
    // one TIME per call and a GET per quota. They are not round trips.
    assert_eq!(calls.remove("time"), Some(K));
    assert_eq!(calls.remove("get"), Some(2 * K));
    assert!(calls.remove("set").is_some_and(|set| set <= 2 * K));
    assert_eq!(
        calls,
        BTreeMap::from([("evalsha".to_string(), K)]),
        "commands sent for {K} decisions one after the other"
    );

    server.reset_stats();
    let tasks: Vec<_> = (0..20)
        .map(|t| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                for i in 0..K / 20 {
                    let _ = limiter.check(&format!("par:{t}:{i}"), 1).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let mut calls = server.all_calls();
    let evalsha = calls.remove("evalsha").unwrap_or(0);
    assert_eq!(calls.remove("time"), Some(evalsha), "one TIME per call");
    assert_eq!(calls.remove("get"), Some(2 * K), "every decision was made");
    assert!(calls.remove("set").is_some_and(|set| set <= 2 * K));
    assert!(calls.is_empty(), "other commands: {calls:?}");
    println!("{K} concurrent decisions in {evalsha} calls");
    assert!(evalsha <= K, "{evalsha} calls for {K} decisions");
}

// ---------------------------------------------------------------------------
// Failures
// ---------------------------------------------------------------------------

/// A stopped server is a store error, reported at once (connection refused), not
/// after the store timeout; both for a held connection and a cold store.
#[tokio::test]
async fn a_stopped_server_is_a_quick_store_error() {
    let mut server = RedisServer::start();
    let quotas = Policy::from(Quota::per_second(5).unwrap());
    let warm = server.store();
    let _ = warm.check("x", &quotas, 1).await.unwrap();
    let cold = server.store();
    server.stop();
    for (name, store) in [("held connection", &warm), ("cold store", &cold)] {
        let start = Instant::now();
        let err = store.check("x", &quotas, 1).await.unwrap_err();
        let took = start.elapsed();
        assert!(err.is_store_error(), "{name}: {err:?}");
        assert!(!matches!(err, Error::Timeout(_)), "{name}: {err:?}");
        // The harness store's timeout is 5 s; a refusal comes much sooner.
        assert!(took < Duration::from_secs(2), "{name}: took {took:?}");
    }
}

/// A frozen server (SIGSTOP: sockets open, nobody answers) gives `Error::Timeout`
/// after the store timeout, for a held connection and for a new one; once the
/// server thaws, checks succeed again.
#[tokio::test]
async fn a_frozen_server_times_out_then_recovers() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(100);
    let quotas = Policy::from(Quota::per_second(50).unwrap());
    let warm = server.store_with_timeout(timeout);
    let _ = warm.check("x", &quotas, 1).await.unwrap();
    let cold = server.store_with_timeout(timeout);
    server.freeze();
    for (name, store) in [("held connection", &warm), ("cold store", &cold)] {
        let start = Instant::now();
        let err = store.check("x", &quotas, 1).await.unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(err, Error::Timeout(t) if t == timeout),
            "{name}: {err:?}"
        );
        assert!(err.is_store_error());
        assert!(took >= timeout, "{name}: gave up after {took:?}");
        // Generous: CI is a busy 2-core machine.
        assert!(took < Duration::from_secs(2), "{name}: took {took:?}");
    }
    server.thaw();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = None;
    while Instant::now() < deadline {
        match warm.check("x", &quotas, 1).await {
            Ok(d) => {
                last = Some(d);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert!(last.is_some(), "no answer after thawing");
    let _ = cold
        .check("x", &quotas, 1)
        .await
        .expect("cold store after thaw");
}

/// A connection that silently stopped carrying anything (half-open after a
/// network change: the socket looks fine, nothing comes back) costs at most
/// two timeouts (one could be a slow call; a second in a row, or a failed
/// background PING, drops the connection), not all later checks: the store
/// must give up on it and connect anew, while Redis itself is fine.
#[tokio::test]
async fn a_dead_connection_is_replaced_after_a_timeout() {
    let server = RedisServer::start();
    let proxy = support::Proxy::start(server.port());
    let timeout = Duration::from_millis(100);
    let store = RedisStore::builder()
        .url(proxy.url())
        .timeout(timeout)
        .build()
        .unwrap();
    let quotas = Policy::from(Quota::per_hour(100).unwrap());
    assert_eq!(store.check("x", &quotas, 1).await.unwrap().remaining(), 99);
    proxy.blackhole();
    let first = store.check("x", &quotas, 1).await.unwrap_err();
    assert!(matches!(first, Error::Timeout(_)), "{first:?}");
    let second = store.check("x", &quotas, 1).await;
    assert!(
        matches!(second, Err(Error::Timeout(_))) || second.is_ok(),
        "{second:?}"
    );
    // The lost calls never reached Redis: the fresh connection sees 99 left.
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(store.check("x", &quotas, 1).await.map(|d| d.remaining()));
    }
    assert!(
        answers.iter().all(Result::is_ok),
        "still waiting on the dead connection: {answers:?}"
    );
    let expected = if second.is_ok() { 95 } else { 96 };
    assert_eq!(answers[2].as_ref().unwrap(), &expected);
}

/// A failover behind a stable address: the held connection still reaches the
/// old primary, now a read-only replica. The script's write fails with
/// `READONLY`; the store must drop that connection and decide on the new primary
/// within the same call, instead of failing every later check.
#[tokio::test]
async fn a_demoted_primary_is_left_for_the_new_one() {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let proxy = support::Proxy::start(old.port());
    let store = RedisStore::builder()
        .pool(
            deadpool_redis::Config::from_url(proxy.url())
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                .unwrap(),
        )
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let quotas = Policy::from(Quota::per_minute(10).unwrap());
    assert!(store.check("failover", &quotas, 1).await.unwrap().allowed());

    // New connections now reach `new`; the held one still reaches `old`, which
    // becomes a replica of `new`.
    proxy.retarget(new.port());
    let _: String = old.cmd(&["REPLICAOF", "127.0.0.1", &new.port().to_string()]);
    // A replica is read-only at once; it need not finish syncing.
    for _ in 0..3 {
        let d = store.check("failover", &quotas, 1).await.unwrap();
        assert!(d.allowed());
    }
    let keys: Vec<String> = new.cmd(&["KEYS", "*"]);
    assert_eq!(keys.len(), 1, "the new primary holds the bucket: {keys:?}");
}

/// After a restart, the checks in flight share one new connection instead of
/// each opening its own against the recovering server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_in_flight_after_a_restart_share_one_reconnect() {
    let mut server = RedisServer::start();
    let store = server.store();
    let quotas = Policy::from(Quota::per_second(1_000).unwrap());
    let _ = store.check("warm", &quotas, 1).await.unwrap();
    server.restart();
    // Connections the harness itself opened since the restart (readiness PING).
    let before = connections_received(&server);

    let checks: Vec<_> = (0..200)
        .map(|i| {
            let (store, quotas) = (store.clone(), quotas.clone());
            tokio::spawn(async move { store.check(&format!("k{i}"), &quotas, 1).await })
        })
        .collect();
    let mut failed = 0;
    for check in checks {
        if check.await.unwrap().is_err() {
            failed += 1;
        }
    }
    // Each call that meets the broken connection retries on the new one.
    assert_eq!(failed, 0, "checks failed after the restart");
    let opened = connections_received(&server) - before - 1; // this INFO's own
    assert!(
        opened <= 2,
        "{opened} connections for 200 checks after a restart"
    );
}

fn connections_received(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "stats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}
