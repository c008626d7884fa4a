//! RedisStore against real redis-server processes: exact refills, denials that
//! spend nothing, TTLs, several quotas at once, Redis `TIME`, script reloads, one
//! round trip per decision, and what callers see when Redis fails.
//!
//! Each test starts its own server, so tests can stop, restart or freeze it.
#![cfg(all(feature = "redis", feature = "test-util"))]

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use support::RedisServer;
use tollgate::{Error, Policy, Quota, RateLimiter, RedisStore, Store};

/// A realistic clock for `check_at` (microseconds since the epoch).
const T0: u64 = 1_763_000_000_000_000;
const SECOND: u64 = 1_000_000;
const HOUR: u64 = 3_600 * SECOND;

const SCRIPT: &str = include_str!("../lua/token_bucket.lua");

/// How long a key outlives its bucket's refill, in milliseconds
/// (`MARGIN_MS` in the script).
const MARGIN_MS: i64 = 1;

fn q(tokens: u64, period: Duration) -> Quota {
    Quota::new(tokens, period).unwrap()
}

fn get(server: &RedisServer, key: &str) -> Option<String> {
    server.cmd(&["GET", key])
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cmd(&["PTTL", key])
}

/// When a key expires, in milliseconds since the epoch (`PEXPIRETIME`, Redis 7;
/// -2 when there is no key). Any `SET ... PX` moves it; reads leave it exactly
/// as it was, so comparing it catches a write that a falling `PTTL` would hide.
fn pexpiretime(server: &RedisServer, key: &str) -> i64 {
    server.cmd(&["PEXPIRETIME", key])
}

/// Retries `store.check` until it answers, for recovery steps after a fault:
/// a store with a short timeout can miss it on a busy machine while
/// reconnecting. Returns the decision and how many attempts failed first;
/// fails the test if nothing answers within 30 s.
async fn until_answered(
    store: &RedisStore,
    key: &str,
    policy: &Policy,
    cost: u64,
) -> (tollgate::Decision, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut failed = 0;
    loop {
        match store.check(key, policy, cost).await {
            Ok(d) => return (d, failed),
            Err(e) if e.is_store_error() && Instant::now() < deadline => {
                failed += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("no answer within 30 s after {failed} failures: {e}"),
        }
    }
}

/// The stored `level:stamp` pair of a bucket (`level:stamp:full,num`).
fn stored(server: &RedisServer, key: &str) -> (i64, i64) {
    let value = get(server, key).expect("bucket is stored");
    let mut fields = value.split(':');
    let (level, stamp) = (fields.next().unwrap(), fields.next().expect("level:stamp"));
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
        let err = server.try_cmd::<Vec<u8>>(&full).unwrap_err();
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
    let reply = numbers(server.cmd(&ok));
    assert_eq!(reply[..2], [1, 0]);
}

/// The numbers of a reply of the script: little-endian doubles packed into one
/// string, every one a whole number.
fn numbers(reply: Vec<u8>) -> Vec<i64> {
    assert_eq!(reply.len() % 8, 0, "{reply:?}");
    reply
        .chunks_exact(8)
        .map(|c| {
            let n = f64::from_le_bytes(c.try_into().unwrap());
            assert_eq!(n.fract(), 0.0, "{n}");
            n as i64
        })
        .collect()
}

/// The script writes integers with `%d` where a C long holds 53 bits (a
/// `struct` "l" of 8 bytes), and with `%.0f` elsewhere (32-bit builds). This Redis takes the first way; the
/// second is forced here by making the check fail. Both, on the same fixed
/// clock and the same calls (spends, a reservation that takes the level below
/// zero, a denial, a two-quota decision, batched and alone), must store the same
/// values with the same TTLs and answer the same replies.
#[tokio::test]
async fn both_number_formats_store_and_answer_the_same() {
    const CHECK: &str = "if struct.size(\"l\") >= 8 then";
    const CLOCK: &str = "local now = redis.call(\"TIME\") -- tollgate:clock";
    assert!(SCRIPT.contains(CHECK) && SCRIPT.contains(CLOCK));
    // A fixed clock (1 763 000 000.123456 s) so the two scripts see the same time.
    let fixed = SCRIPT.replacen(CLOCK, "local now = {\"1763000000\", \"123456\"}", 1);
    let long = fixed.clone();
    let float = fixed.replacen(CHECK, "if false then", 1);
    let server = RedisServer::start();
    // Quotas: 1 = 10 per second (full 10 x 100 000 units, 1 unit a µs), 2 = a
    // burst of 3 at 1 per hour (full 3 x 3.6e9 units, 1 unit a µs).
    let quotas = [
        "2",
        "1000000",
        "1",
        "100000",
        "10800000000",
        "1",
        "3600000000",
    ];
    // (keys, decisions): per decision n, cost, then (quota index, debt) per quota.
    let calls: [(&[&str], &[&str]); 5] = [
        (&["a"], &["1", "3", "1", "0"]),
        (&["a", "b"], &["1", "4", "1", "0", "1", "2", "2", "0"]),
        // A reservation: 9 tokens from 3 left, debt up to 7 tokens.
        (&["a"], &["1", "9", "1", "700000"]),
        // Denied: the level is below zero.
        (&["a"], &["1", "1", "1", "0"]),
        // Two quotas at once, then the hourly one alone, in one call.
        (
            &["c", "d", "d"],
            &["2", "1", "1", "0", "2", "0", "1", "1", "2", "0"],
        ),
    ];
    let mut seen = Vec::new();
    for (name, source) in [("%d", &long), ("%.0f", &float)] {
        let _: () = server.cmd(&["FLUSHALL"]);
        let mut replies = Vec::new();
        for (keys, decisions) in calls {
            let n = keys.len().to_string();
            let mut cmd = vec!["EVAL", source.as_str(), n.as_str()];
            let named: Vec<String> = keys.iter().map(|k| format!("fmt:{{x}}:{k}")).collect();
            cmd.extend(named.iter().map(String::as_str));
            cmd.push("");
            cmd.extend(quotas);
            // D, the number of decisions, precedes them.
            let d = decisions_count(decisions);
            cmd.push(d.as_str());
            cmd.extend(decisions.iter().copied());
            replies.push(numbers(server.cmd(&cmd)));
        }
        let mut stored = Vec::new();
        for k in ["a", "b", "c", "d"] {
            let key = format!("fmt:{{x}}:{k}");
            let value: Option<String> = server.cmd(&["GET", &key]);
            let value = value.unwrap_or_else(|| panic!("{name}: {key} not stored"));
            let mut fields = value.split(':');
            let (level, stamp) = (fields.next().unwrap(), fields.next().expect("level:stamp"));
            assert!(
                level.parse::<i64>().is_ok() && stamp.parse::<u64>().is_ok(),
                "{name}: {key} = {value:?}"
            );
            stored.push((value, pttl(&server, &key)));
        }
        seen.push((name, replies, stored));
    }
    let (_, replies, stored) = &seen[0];
    // The reservation took the first bucket below zero, so a negative level was
    // written, and the denial after it came back with a wait.
    assert!(stored[0].0.starts_with('-'), "{stored:?}");
    assert_eq!(replies[3][0], 0, "{replies:?}");
    let (_, float_replies, float_stored) = &seen[1];
    assert_eq!(replies, float_replies);
    for (long, float) in stored.iter().zip(float_stored) {
        assert_eq!(long.0, float.0);
        // Both TTLs were set from the same fixed clock; they can differ only
        // by the real time between the two runs' reads.
        assert!(
            (long.1 - float.1).abs() < 5_000,
            "{stored:?} {float_stored:?}"
        );
    }
}

/// The script on the test's clock, read from `ARGV[1]` (µs), with keys that
/// outlive the test (1 000 s), so Redis expires none of them while the
/// test's clock runs apart from its own.
fn script_on_argv_clock() -> String {
    const CLOCK: &str = "local now = redis.call(\"TIME\") -- tollgate:clock";
    const MARGIN: &str = "local MARGIN_MS = 1 -- tollgate:margin";
    // ARGV[1] is the clock here, not an epoch.
    const EPOCH: &str = "local epoch_spec = ARGV[1] -- tollgate:epoch";
    assert!(SCRIPT.contains(CLOCK) && SCRIPT.contains(MARGIN) && SCRIPT.contains(EPOCH));
    SCRIPT
        .replacen(
            CLOCK,
            "local now = {math.floor(tonumber(ARGV[1]) / 1000000), tonumber(ARGV[1]) % 1000000}",
            1,
        )
        .replacen(MARGIN, "local MARGIN_MS = 1000000", 1)
        .replacen(EPOCH, "local epoch_spec = \"\"", 1)
}

/// The script's compact form (`-D`, then one cost per decision; the store
/// sends it when every decision of a call is a check of one quota) decides
/// exactly as the long form (`D`, then `1, cost, 1, 0` per decision): the
/// same replies and the same stored buckets, over random calls on a clock
/// of the test's (now and then going back), with keys that repeat within a
/// call.
#[tokio::test]
async fn the_compact_form_decides_as_the_long_form() {
    let source = script_on_argv_clock();
    let server = RedisServer::start();
    let mut conn = server.conn();
    // (full, num, den): 10 per second, and a burst of 3 refilled 3 per 2 s.
    let quotas = [["1000000", "1", "100000"], ["6000000", "3", "2000000"]];
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |below: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % below
    };
    let mut now: u64 = 1_763_000_000_000_000;
    let (mut admitted, mut denied) = (0, 0);
    for call in 0..400 {
        // Mostly forward; now and then back (a failover to a server whose
        // clock is behind the stamps).
        if next(20) == 0 {
            now -= next(300_000);
        } else {
            now += next(400_000);
        }
        let quota = quotas[(call / 50) % 2];
        let decisions = 1 + next(8) as usize;
        let picks: Vec<(u64, u64)> = (0..decisions).map(|_| (next(4), next(4))).collect();
        // Both forms' calls, then the reads of every TTL, in one
        // transaction: TTLs run in Redis's own time, so calls and reads a
        // busy machine spreads over many milliseconds would tell the forms
        // apart by when they ran.
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (form, prefix) in [("long", "l"), ("compact", "c")] {
            let keys: Vec<String> = picks
                .iter()
                .map(|(k, _)| format!("{prefix}:{{x}}:{k}"))
                .collect();
            let mut args: Vec<String> = vec![now.to_string(), "1".into()];
            args.extend(quota.iter().map(|s| s.to_string()));
            if form == "long" {
                args.push(decisions.to_string());
                for (_, cost) in &picks {
                    args.extend(["1".into(), cost.to_string(), "1".into(), "0".into()]);
                }
            } else {
                args.push(format!("-{decisions}"));
                args.extend(picks.iter().map(|(_, cost)| cost.to_string()));
            }
            pipe.cmd("EVAL")
                .arg(source.as_str())
                .arg(keys.len())
                .arg(&keys)
                .arg(&args);
        }
        for prefix in ["l", "c"] {
            for k in 0..4 {
                pipe.cmd("PTTL").arg(format!("{prefix}:{{x}}:{k}"));
            }
        }
        let (long, compact, ttls): (Vec<u8>, Vec<u8>, Vec<i64>) = {
            let mut all: Vec<redis::Value> = pipe.query(&mut conn).expect("EVAL and PTTL");
            let ttls = all.split_off(2);
            let ttls = ttls
                .into_iter()
                .map(|v| redis::from_redis_value(v).unwrap());
            let mut replies = all.into_iter().map(|v| redis::from_redis_value(v).unwrap());
            (
                replies.next().unwrap(),
                replies.next().unwrap(),
                ttls.collect(),
            )
        };
        let replies = [numbers(long), numbers(compact)];
        let ttls = [&ttls[..4], &ttls[4..]];
        assert_eq!(replies[0], replies[1], "call {call}: {picks:?} at {now}");
        // The same TTLs, but for the real time the transaction took, which
        // a stall of Redis itself can stretch (a wrong one is off by a
        // token's refill, 100 or 667 ms here, or by a step of the clock).
        for (long, compact) in ttls[0].iter().zip(ttls[1]) {
            assert!(
                (long - compact).abs() <= 50,
                "call {call}: TTLs {:?} against {:?}",
                ttls[0],
                ttls[1]
            );
        }
        for d in replies[0].chunks_exact(4) {
            if d[0] == 1 {
                admitted += 1
            } else {
                denied += 1
            }
        }
        for k in 0..4 {
            let long: Option<String> = server.cmd(&["GET", &format!("l:{{x}}:{k}")]);
            let compact: Option<String> = server.cmd(&["GET", &format!("c:{{x}}:{k}")]);
            assert_eq!(long, compact, "call {call}: key {k}");
        }
    }
    // The sequence met both outcomes often, so the comparison covered both.
    assert!(
        admitted > 100 && denied > 100,
        "{admitted} admitted, {denied} denied"
    );
}

/// The compact form hands a bucket with holds (leases) and every check after
/// it to the script's general steps: a call of one check, and a call of
/// several whose second meets holds, decide, store and reply exactly as the
/// same checks in the long form, on the same clock.
#[test]
fn compact_checks_of_held_buckets_decide_as_the_long_form() {
    let source = script_on_argv_clock();
    let server = RedisServer::start();
    // 10 per second: full 10 x 100 000 units, 1 unit a µs.
    let quota = ["1", "1000000", "1", "100000"];
    let now: u64 = 1_763_000_000_000_000;
    let eval = |keys: &[String], at: u64, decisions: &[&str]| -> Vec<i64> {
        let n = keys.len().to_string();
        let at = at.to_string();
        let mut cmd = vec!["EVAL", source.as_str(), n.as_str()];
        cmd.extend(keys.iter().map(String::as_str));
        cmd.push(at.as_str());
        cmd.extend(quota);
        cmd.extend(decisions.iter().copied());
        numbers(server.cmd(&cmd))
    };
    let key = |prefix: &str, k: u32| format!("{prefix}:{{x}}:{k}");
    for prefix in ["l", "c"] {
        // Key 1 of each form: a lease of cost 1 that holds up to 4 tokens
        // for 10 s (id 7, no report, no roomy size, no partial report).
        let lease = eval(
            &[key(prefix, 1)],
            now,
            &[
                "1", "1", "1", "1", "-2", "7", "4", "10000000", "0", "0", "0", "0", "0", "0",
            ],
        );
        assert_eq!(lease[0], 1, "{lease:?}");
        assert!(lease[4] > 0, "no hold granted: {lease:?}");
    }
    let later = now + 50_000;
    // One check alone, of the held key.
    let long = eval(&[key("l", 1)], later, &["1", "1", "1", "1", "0"]);
    let compact = eval(&[key("c", 1)], later, &["-1", "1"]);
    assert_eq!(long, compact);
    // Four checks; the second meets the holds, the others plain buckets.
    let (ks, costs) = ([0, 1, 2, 1], ["2", "1", "3", "9"]);
    let mut long_args = vec!["4"];
    for cost in costs {
        long_args.extend(["1", cost, "1", "0"]);
    }
    let mut compact_args = vec!["-4"];
    compact_args.extend(costs);
    let long = eval(&ks.map(|k| key("l", k)), later, &long_args);
    let compact = eval(&ks.map(|k| key("c", k)), later, &compact_args);
    assert_eq!(long, compact);
    // The held key's last check asked more than its free tokens: denied.
    assert_eq!(long[12], 0, "{long:?}");
    for k in 0..3 {
        let l: Option<String> = server.cmd(&["GET", &key("l", k)]);
        let c: Option<String> = server.cmd(&["GET", &key("c", k)]);
        assert_eq!(l, c, "key {k}");
        assert!(l.is_some(), "key {k} not stored");
    }
    let held: String = server.cmd(&["GET", &key("c", 1)]);
    assert!(held.contains(":7,"), "the hold is gone: {held}");
}

/// A reply too long to pack at once (the script packs 1 024 numbers at a
/// time) reads back whole and in order: 300 checks of fresh keys in one call,
/// each of its own cost (1 to 10), in the compact form (1 200 numbers), the
/// long form, and the long form over two quotas (7 numbers a decision, 2 100
/// in all, so chunks end inside decisions).
#[test]
fn long_replies_are_packed_whole_and_in_order() {
    let server = RedisServer::start();
    // Quota 1: 10 per second (full 10 x 100 000 units, 1 unit a µs), quota 2:
    // 20 per second (full 20 x 50 000).
    let quotas = ["2", "1000000", "1", "100000", "1000000", "1", "50000"];
    let cost = |i: usize| (i % 10 + 1) as i64;
    let decisions = 300;
    for form in ["compact", "long", "two quotas"] {
        let _: () = server.cmd(&["FLUSHALL"]);
        let per = if form == "two quotas" { 2 } else { 1 };
        let keys: Vec<String> = (0..decisions * per)
            .map(|i| format!("long:{{x}}:{i}"))
            .collect();
        let mut args: Vec<String> = vec![String::new()];
        args.extend(quotas.iter().map(|q| q.to_string()));
        match form {
            "compact" => args.push(format!("-{decisions}")),
            _ => args.push(decisions.to_string()),
        }
        for i in 0..decisions {
            let c = cost(i).to_string();
            match form {
                "compact" => args.push(c),
                "long" => args.extend(["1".into(), c, "1".into(), "0".into()]),
                _ => args.extend([
                    "2".into(),
                    c,
                    "1".into(),
                    "0".into(),
                    "2".into(),
                    "0".into(),
                ]),
            }
        }
        let n = keys.len().to_string();
        let mut cmd = vec!["EVAL", SCRIPT, n.as_str()];
        cmd.extend(keys.iter().map(String::as_str));
        cmd.extend(args.iter().map(String::as_str));
        let reply = numbers(server.cmd(&cmd));
        let width = 1 + 3 * per;
        assert_eq!(reply.len(), decisions * width, "{form}");
        for (i, d) in reply.chunks_exact(width).enumerate() {
            let c = cost(i);
            // Admitted, what is left, no wait, a token's refill per token spent.
            let mut expected = vec![1, 10 - c, 0, c * 100_000];
            if per == 2 {
                expected.extend([20 - c, 0, c * 50_000]);
            }
            assert_eq!(d, expected, "{form}: decision {i}");
        }
    }
}

/// A bucket whose stored value does not read as a level and a stamp is a
/// full bucket, in the compact form (a check of one quota) and the long form
/// (two quotas), including values Lua's `tonumber` reads as NaN or infinity.
/// The check is decided, one script call each, and the bucket written anew.
#[tokio::test]
async fn unreadable_buckets_are_full() {
    let server = RedisServer::start();
    let store = server.store();
    // 10 a minute: the bucket written anew lives 6 s, long enough to be read
    // back on a busy machine (at 10 a second it would expire after 100 ms).
    let ten = q(10, Duration::from_secs(60));
    let one = Policy::from(ten);
    let two = Policy::new("two", [ten, q(100, Duration::from_secs(3600))]).unwrap();
    // The script is cached on the server after the first check.
    assert!(store.check("warm", &one, 1).await.unwrap().allowed());
    let values = [
        "nan:0", "0:nan", "inf:0", "-inf:0", "0:inf", "1:-inf", "1e400:5", "junk", "5", ":",
    ];
    for (i, value) in values.iter().enumerate() {
        for (form, policy) in [("compact", &one), ("long", &two)] {
            let client = format!("broken-{form}-{i}");
            let key = store.bucket_keys(&client, policy).remove(0);
            let _: () = server.cmd(&["SET", &key, value]);
            server.reset_stats();
            let d = store.check(&client, policy, 1).await.unwrap();
            assert!(d.allowed(), "{form} {value:?}: {d:?}");
            assert_eq!(d.states()[0].remaining(), 9, "{form} {value:?}");
            assert_eq!(
                server.calls("evalsha") + server.calls("eval"),
                1,
                "{value:?}"
            );
            let stored = get(&server, &key).unwrap();
            let mut fields = stored.split(':');
            let (level, stamp) = (fields.next().unwrap(), fields.next().unwrap());
            assert!(
                level.parse::<i64>().is_ok() && stamp.parse::<u64>().is_ok(),
                "{form} {value:?} -> {stored:?}"
            );
        }
    }
}

/// How many decisions a flat list of decision arguments holds.
fn decisions_count(decisions: &[&str]) -> String {
    let mut i = 0;
    let mut count = 0;
    while i < decisions.len() {
        let n: usize = decisions[i].parse().unwrap();
        i += 2 + 2 * n;
        count += 1;
    }
    count.to_string()
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
    let expires = pexpiretime(&server, &key);
    server.reset_stats();
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
    assert_eq!(
        pexpiretime(&server, &key),
        expires,
        "a denial moved the TTL"
    );
    assert_eq!(server.calls("set"), 0, "a denial wrote something");
    // Had a denial taken anything, the token due at 12 s would come later.
    let d = store
        .check_at("d", &quotas, 1, T0 + 12 * SECOND)
        .await
        .unwrap();
    assert!(d.allowed());
    let (level, _) = stored(&server, &key);
    assert_eq!(level, 0);

    // The same with the real clock: 100 checks of 2 tokens at 5/s (all of them
    // would pass only if they took 39 s). Each admission writes once, each
    // denial not at all, so the stored bucket is exactly what the last
    // admission left: a level of (1 token - its reset_after) in units of
    // 1/200 000 token (5/s is one unit per microsecond), never below zero.
    let quotas = Policy::from(Quota::per_second(5).unwrap());
    server.reset_stats();
    let (mut admitted, mut denied, mut last) = (0, 0, None);
    for _ in 0..100 {
        let d = store.check("live", &quotas, 2).await.unwrap();
        if d.allowed() {
            admitted += 1;
            last = Some(d);
        } else {
            denied += 1;
            // Denied: under 2 tokens left, and a positive wait for the rest.
            assert!(d.remaining() <= 1, "{d:?}");
            assert!(!d.retry_after().is_zero(), "{d:?}");
        }
    }
    assert!(
        denied > 0,
        "100 checks of 2 tokens at 5/s were all admitted"
    );
    assert_eq!(server.calls("set"), admitted, "one write per admission");
    let last = last.expect("the first check of a fresh key is admitted");
    let (level, _) = stored(&server, &store.bucket_key("live", &quotas.quotas()[0]));
    let full = 1_000_000; // 5 tokens of 200 000 units
    assert_eq!(
        level,
        full - last.reset_after().as_micros() as i64,
        "the stored level is not the one the last admission reported"
    );
    assert_eq!(level as u64 / 200_000, last.remaining());
}

/// Every stored bucket has a TTL that lets it live until it is full again (an
/// earlier expiry would hand out tokens early) plus the one-second margin and
/// no more, for several quotas and after partial spends; peeks and denials
/// leave the expiry exactly where it was.
#[tokio::test]
async fn ttl_covers_the_refill_and_no_more_than_a_millisecond_beyond() {
    let server = RedisServer::start();
    let store = server.store();
    // (quota, [(cost, admitted)]): every step's outcome is known in advance.
    // The hourly and daily quotas cannot refill a token during the test, so
    // their last spend is denied; the others have room for every spend. Cost
    // 0 is a peek: admitted, and it writes nothing.
    let cases = [
        (
            Quota::per_second(3).unwrap(),
            [(1, true), (1, true), (1, true)],
        ),
        (
            Quota::per_hour(1).unwrap(),
            [(1, true), (0, true), (1, false)],
        ),
        (
            q(3, Duration::from_millis(1500)).burst(5).unwrap(),
            [(1, true), (2, true), (1, true)],
        ),
        (
            Quota::per_minute(100).unwrap().burst(7).unwrap(),
            [(1, true), (3, true), (1, true)],
        ),
        (
            q(1, Duration::from_secs(86_400)).burst(2).unwrap(),
            [(1, true), (1, true), (1, false)],
        ),
    ];
    for (i, (quota, steps)) in cases.into_iter().enumerate() {
        let key = format!("ttl:{i}");
        let bucket = store.bucket_key(&key, &quota);
        for (step, (cost, admitted)) in steps.into_iter().enumerate() {
            let expires = pexpiretime(&server, &bucket);
            let start = Instant::now();
            let d = store.check(&key, &Policy::from(quota), cost).await.unwrap();
            assert_eq!(d.allowed(), admitted, "{quota}, step {step}: {d:?}");
            if cost == 0 || !admitted {
                assert_eq!(
                    pexpiretime(&server, &bucket),
                    expires,
                    "{quota}, step {step}: a peek or denial moved the expiry"
                );
                continue;
            }
            let ttl = pttl(&server, &bucket);
            let waited_ms = start.elapsed().as_millis() as i64 + 1;
            let to_full_ms = d.reset_after().as_micros().div_ceil(1000) as i64;
            // The script sets PX = to_full + MARGIN_MS; since then at most
            // `waited_ms` have passed.
            assert!(
                ttl <= to_full_ms + MARGIN_MS,
                "{quota}: ttl {ttl} ms, full again in {to_full_ms} ms"
            );
            assert!(
                ttl + waited_ms >= to_full_ms + MARGIN_MS,
                "{quota}: key expires {ttl} ms from now, the bucket is full in {to_full_ms} ms \
                 (+ 1 ms margin, {waited_ms} ms ago)"
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
    // Every token spent: full again in 1 s, so the key is there when the
    // test looks right after (one token would leave a busy machine 2 ms).
    let _ = store
        .check("idle", &Policy::from(fast), 1000)
        .await
        .unwrap();
    let key = store.bucket_key("idle", &fast);
    let exists = |server: &RedisServer| server.cmd::<i64>(&["EXISTS", &key]) == 1;
    assert!(exists(&server));
    // Redis expires it 1 s and at most 2 ms later; the deadline only stops a
    // broken store from hanging the test.
    let deadline = Instant::now() + Duration::from_secs(30);
    while exists(&server) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!exists(&server), "key still there after 30 s");
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
    // The limiter keeps the key behind its policy's name.
    let key = store.bucket_key("default:new", &limiter.quotas()[0]);
    assert!(get(&server, &key).is_some(), "no bucket at {key}");
    let value = get(&server, &key);
    let expires = pexpiretime(&server, &key);
    server.reset_stats();
    for _ in 0..10 {
        assert_eq!(limiter.peek("new").await.unwrap().remaining(), 6);
    }
    assert_eq!(get(&server, &key), value);
    assert_eq!(
        pexpiretime(&server, &key),
        expires,
        "a peek moved the expiry"
    );
    assert_eq!(server.calls("set"), 0, "a peek wrote something");
}

/// `reset` forgets every bucket of the client; others keep theirs.
#[tokio::test]
async fn reset_forgets_the_buckets() {
    let server = RedisServer::start();
    // 5 a minute: no token comes back during the test, so the denial below
    // does not depend on how fast the machine is.
    let limiter = RateLimiter::new(
        server.store(),
        Policy::new(
            "reset",
            [Quota::per_minute(5).unwrap(), Quota::per_hour(20).unwrap()],
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
    assert!(left.iter().all(|k| k.contains("{reset:b}")), "{left:?}");
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
    // The wait counts from the stamp: an hour and one token (100 ms) from
    // `now`, less the Redis time that has passed since, which is at most
    // what Redis says now.
    let since = server.time_us() - now;
    let wait = HOUR + 100_000;
    assert!(d.retry_after() <= Duration::from_micros(wait), "{d:?}");
    assert!(
        d.retry_after() >= Duration::from_micros(wait - since),
        "{d:?}, {since} µs after the stamp was written"
    );
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
/// checks: the next check answers from a fresh bucket without an error, after
/// exactly one reload of the script (`SCRIPT LOAD` then `EVALSHA`, or an
/// `EVAL`: either is fine), and every later check is a plain `EVALSHA`.
#[tokio::test]
async fn a_redis_restart_is_invisible_to_the_caller() {
    let mut server = RedisServer::start();
    let store = server.store();
    let quotas = Policy::from(Quota::per_hour(10).unwrap());
    assert_eq!(store.check("r", &quotas, 4).await.unwrap().remaining(), 6);
    server.restart();
    // A new process: counting starts here (less the harness's readiness PING).
    server.reset_stats();
    let d = store
        .check("r", &quotas, 1)
        .await
        .expect("check after restart");
    assert!(d.allowed());
    assert_eq!(d.remaining(), 9, "not a fresh bucket");
    let reloads = |server: &RedisServer| server.calls("script|load") + server.calls("eval");
    assert_eq!(reloads(&server), 1, "{:?}", server.all_calls());
    // The cached script was gone: at most the one EVALSHA that met NOSCRIPT
    // failed; the decision ran the script exactly once.
    let failed = failed_calls(&server, "evalsha");
    assert!(failed <= 1, "{failed} EVALSHA failed");
    let ran = |server: &RedisServer| {
        server.calls("evalsha") - failed_calls(server, "evalsha") + server.calls("eval")
    };
    assert_eq!(ran(&server), 1);

    const K: u64 = 8;
    for i in 0..K {
        assert_eq!(
            store.check("r", &quotas, 1).await.unwrap().remaining(),
            8 - i
        );
    }
    assert_eq!(
        reloads(&server),
        1,
        "reloaded again: {:?}",
        server.all_calls()
    );
    assert_eq!(failed_calls(&server, "evalsha"), failed);
    assert_eq!(ran(&server), 1 + K);
    // Nothing else was sent but the connection's own handshake and what the
    // script runs inside Redis (TIME, GET, SET, and PUBLISH while the
    // server has no epoch: see "Epochs" in the script).
    let mut calls = server.all_calls();
    for known in [
        "evalsha",
        "eval",
        "script|load",
        "time",
        "get",
        "set",
        "publish",
        "client|setinfo",
    ] {
        calls.remove(known);
    }
    assert!(calls.is_empty(), "unexpected commands: {calls:?}");
}

/// `failed_calls` of one command in `INFO commandstats` (0 when never called).
fn failed_calls(server: &RedisServer, command: &str) -> u64 {
    server
        .command_stat(command, "failed_calls")
        .map_or(0, |v| v as u64)
}

// ---------------------------------------------------------------------------
// Configuration: prefix and timeout
// ---------------------------------------------------------------------------

/// The prefix set with the builder starts every key the store writes, and
/// stores with different prefixes on one server keep separate buckets. A
/// prefix that could hide a `{hash tag}` or bloat every key is refused when
/// the store is built, with a message that names it.
#[tokio::test]
async fn the_builder_prefix_names_every_key_and_bad_prefixes_are_refused() {
    let server = RedisServer::start();
    let prefixed = RedisStore::builder()
        .leases(false)
        .pool(server.pool())
        .prefix("app-1.rl:v2/")
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    assert_eq!(prefixed.prefix(), "app-1.rl:v2/");
    let plain = server.store();
    assert_eq!(plain.prefix(), tollgate::store::DEFAULT_PREFIX);
    let quota = Quota::per_minute(3).unwrap();
    let policy = Policy::from(quota);
    assert_eq!(
        prefixed.bucket_key("user:42", &quota),
        "app-1.rl:v2/{user:42}:3/m:b3"
    );
    assert_eq!(
        prefixed
            .check("user:42", &policy, 2)
            .await
            .unwrap()
            .remaining(),
        1
    );
    assert_eq!(
        plain
            .check("user:42", &policy, 1)
            .await
            .unwrap()
            .remaining(),
        2
    );
    assert_eq!(
        keys(&server),
        ["app-1.rl:v2/{user:42}:3/m:b3", "tollgate:{user:42}:3/m:b3"]
    );
    prefixed.reset("user:42", &policy).await.unwrap();
    assert_eq!(keys(&server), ["tollgate:{user:42}:3/m:b3"]);

    // 64 bytes of every allowed character, and no prefix at all, are fine.
    let longest = "aZ09._:/-".repeat(8)[..64].to_owned();
    for ok in [longest.as_str(), ""] {
        let store = RedisStore::builder()
            .leases(false)
            .url(server.url())
            .prefix(ok)
            .build()
            .unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        assert_eq!(store.bucket_key("k", &quota), format!("{ok}{{k}}:3/m:b3"));
    }
    let too_long = "a".repeat(65);
    for bad in [
        "has{brace}",
        "}",
        "with space",
        "tab\t",
        "é",
        "a*b",
        "new\nline",
        too_long.as_str(),
    ] {
        let err = RedisStore::builder()
            .leases(false)
            .url(server.url())
            .prefix(bad)
            .build()
            .unwrap_err();
        assert_eq!(err.kind(), tollgate::ConfigErrorKind::Store, "{bad:?}");
        assert!(
            err.message().contains(&format!("{bad:?}")),
            "{bad:?}: {err}"
        );
    }
}

/// A store built without `.timeout(..)` gives up after 100 ms, whichever
/// constructor built it (with the defaults, leases on): against a frozen
/// server every check fails with `Error::Timeout(100 ms)`.
#[tokio::test]
async fn the_default_timeout_is_100_ms() {
    assert_eq!(tollgate::store::DEFAULT_TIMEOUT, Duration::from_millis(100));
    let server = RedisServer::start();
    let quotas = Policy::from(Quota::per_minute(50).unwrap());
    let stores = [
        (
            "builder",
            RedisStore::builder().pool(server.pool()).build().unwrap(),
        ),
        ("from_url", RedisStore::from_url(&server.url()).unwrap()),
        ("from_pool", RedisStore::from_pool(server.pool())),
    ];
    for (name, store) in &stores {
        assert_eq!(store.timeout(), Duration::from_millis(100), "{name}");
        // Connect and load the script; 100 ms can be short on a busy machine.
        let _ = until_answered(store, "x", &quotas, 1).await;
    }
    server.freeze();
    // A key none of them has checked, so none holds a lease on it (leases
    // are on by default): the check has to reach the frozen server.
    for (name, store) in &stores {
        let start = Instant::now();
        let err = store.check("y", &quotas, 1).await.unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(err, Error::Timeout(t) if t == Duration::from_millis(100)),
            "{name}: {err:?}"
        );
        assert!(took >= Duration::from_millis(100), "{name}: {took:?}");
        assert!(took < Duration::from_secs(10), "{name}: {took:?}");
    }
    server.thaw();
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
    // one TIME per call, a GET per quota and one of the server's epoch key,
    // and, while no hold was ever granted on the server (it has no epoch), a
    // PUBLISH asking for watchers. They are not round trips.
    assert_eq!(calls.remove("time"), Some(K));
    assert!(calls.remove("publish").is_none_or(|p| p <= K));
    assert_eq!(calls.remove("get"), Some(3 * K));
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
    // A GET per quota of every decision, and one of the epoch key a call.
    assert_eq!(
        calls.remove("get"),
        Some(2 * K + evalsha),
        "every decision was made"
    );
    assert!(calls.remove("set").is_some_and(|set| set <= 2 * K));
    assert!(calls.remove("publish").is_none_or(|p| p <= evalsha));
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
    // A timeout far longer than any refusal takes: an error other than
    // `Timeout` proves the store did not wait for it.
    let timeout = Duration::from_secs(30);
    let warm = server.store_with_timeout(timeout);
    let _ = warm.check("x", &quotas, 1).await.unwrap();
    let cold = server.store_with_timeout(timeout);
    server.stop();
    for (name, store) in [("held connection", &warm), ("cold store", &cold)] {
        let start = Instant::now();
        let err = store.check("x", &quotas, 1).await.unwrap_err();
        let took = start.elapsed();
        assert!(err.is_store_error(), "{name}: {err:?}");
        assert!(!matches!(err, Error::Timeout(_)), "{name}: {err:?}");
        assert!(took < timeout / 3, "{name}: took {took:?}");
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
    // A fresh store's first call also connects and loads the script, which a
    // busy machine can stretch past 100 ms.
    let _ = until_answered(&warm, "x", &quotas, 1).await;
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
        // Generous: CI is a busy 2-core machine; what matters is that it
        // gives up at all instead of hanging with the server.
        assert!(took < Duration::from_secs(10), "{name}: took {took:?}");
    }
    server.thaw();
    // Recovery: with a 100 ms timeout a reconnect can miss it on a busy
    // machine, so retry; a store stuck on the frozen connection never answers.
    for store in [&warm, &cold] {
        let (d, _) = until_answered(store, "x", &quotas, 1).await;
        assert!(d.allowed(), "{d:?}");
    }
}

/// A connection that silently stopped carrying anything (half-open after a
/// network change: the socket looks fine, nothing comes back) costs a timeout
/// or two (one could be a slow call; a second in a row, or a failed
/// background PING, drops the connection), not all later checks: the store
/// must give up on it and connect anew, while Redis itself is fine.
#[tokio::test]
async fn a_dead_connection_is_replaced_after_a_timeout() {
    let server = RedisServer::start();
    let proxy = support::Proxy::start(server.port());
    let timeout = Duration::from_millis(100);
    let store = RedisStore::builder()
        .leases(false)
        .url(proxy.url())
        .timeout(timeout)
        .build()
        .unwrap();
    let quotas = Policy::from(Quota::per_hour(100).unwrap());
    // A fresh store's first call also connects and loads the script, which a
    // busy machine can stretch past 100 ms; a try that timed out may still
    // have spent a token, so the counts below start from this answer.
    let (warm, _) = until_answered(&store, "x", &quotas, 1).await;
    let left = warm.remaining();
    proxy.blackhole();
    let first = store.check("x", &quotas, 1).await.unwrap_err();
    assert!(matches!(first, Error::Timeout(_)), "{first:?}");
    // Recovery: a check on the new connection can itself miss 100 ms on a busy
    // machine, so retry; a store that kept the dead connection would time out
    // on every attempt.
    let mut remaining = Vec::new();
    let mut failed = 0;
    for _ in 0..3 {
        let (d, f) = until_answered(&store, "x", &quotas, 1).await;
        remaining.push(d.remaining());
        failed += f;
    }
    // The blackholed call never reached Redis; each answer spent one token; a
    // timed-out retry may have spent up to two (its call and its reconnect).
    if failed == 0 {
        assert_eq!(remaining, [left - 1, left - 2, left - 3]);
    } else {
        assert!(remaining.windows(2).all(|w| w[1] < w[0]), "{remaining:?}");
        assert!(
            remaining[2] <= left - 3 && remaining[2] + 2 * failed >= left - 3,
            "{remaining:?} after {failed} timeouts"
        );
    }
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
        .leases(false)
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

/// A charge or refund on a bucket that reservations took deeper into debt
/// than its capacity never forgives that debt, in Redis as in memory: the
/// next reservation still waits behind all of them.
#[tokio::test]
async fn an_adjustment_never_forgives_a_reservations_debt() {
    let server = RedisServer::start();
    let redis = server.store();
    let memory = tollgate::MemoryStore::new();
    let policy = Policy::from(Quota::per_second(1).unwrap());
    let wait = Duration::from_secs(10);
    for _ in 0..11 {
        assert!(
            redis
                .reserve_at("r", &policy, 1, wait, T0)
                .await
                .unwrap()
                .admitted()
        );
        assert!(
            memory
                .reserve_at("r", &policy, 1, wait, T0)
                .unwrap()
                .admitted()
        );
    }
    redis.adjust_at("r", &policy, 1, T0).await.unwrap();
    memory.adjust_at("r", &policy, 1, T0);
    let long = Duration::from_secs(60);
    let r = redis.reserve_at("r", &policy, 1, long, T0).await.unwrap();
    let m = memory.reserve_at("r", &policy, 1, long, T0).unwrap();
    assert_eq!(r.wait(), Duration::from_secs(11), "Redis forgave the debt");
    assert_eq!(m.wait(), Duration::from_secs(11), "memory forgave the debt");
}
