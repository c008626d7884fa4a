//! The local deny cache against a real Redis: a flooded key costs Redis about
//! one call per refill, and every answer the cache gives agrees with Redis's
//! buckets, read through a second store without a cache just before each
//! check: it admits whenever a token is there, and the wait it tells, for
//! the cost it was asked (larger than the one it cached, too), is never less
//! than the wait those buckets imply.
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use support::RedisServer;
use tollgate::{Decision, Policy, Quota, RedisStore, Store};

fn store(server: &RedisServer, deny_cache: usize) -> RedisStore {
    RedisStore::builder()
        .leases(false)
        .pool(server.pool())
        .timeout(Duration::from_secs(5))
        .deny_cache(deny_cache)
        .build()
        .unwrap()
}

/// 2 a second, bursts of 3: a token every 500 ms.
const PER_TOKEN: Duration = Duration::from_millis(500);
const CAPACITY: u64 = 3;

fn policy() -> Policy {
    Policy::from(Quota::per_second(2).unwrap().burst(CAPACITY).unwrap())
}

/// What Redis's bucket says of a check of `cost`, read with a peek (which
/// spends nothing) by a store without a cache.
struct Truth {
    /// The bucket holds the cost.
    fits: bool,
    /// How long until it holds the cost. The quota refills one unit of level
    /// a microsecond, so the time to full is exact, and the bucket lacks the
    /// cost for the time to full less the refill of the tokens it may miss.
    wait: Duration,
}

async fn truth(store: &RedisStore, key: &str, policy: &Policy, cost: u64) -> Truth {
    let peek = store.check(key, policy, 0).await.unwrap();
    Truth {
        fits: peek.remaining() >= cost,
        wait: peek
            .reset_after()
            .saturating_sub(PER_TOKEN * u32::try_from(CAPACITY - cost).unwrap()),
    }
}

/// Checks `d`, the answer to a check of `cost` made after `truth` was read,
/// `elapsed` since before that read: a token there is admitted, and a denial
/// is told no less than the wait the bucket implied, less the time gone by
/// (and not more than that wait plus `slack`, the reply's travel time).
fn agrees(d: &Decision, truth: &Truth, cost: u64, elapsed: Duration, slack: Duration) {
    if truth.fits {
        assert!(d.allowed(), "the cache denied what Redis admits: {d:?}");
    }
    if d.allowed() {
        return;
    }
    let told = d.retry_after();
    assert!(
        told + elapsed >= truth.wait,
        "cost {cost}: told {told:?}, Redis's bucket implies {:?} ({elapsed:?} before)",
        truth.wait
    );
    assert!(
        told <= truth.wait + slack,
        "cost {cost}: told {told:?}, Redis's bucket implies {:?}",
        truth.wait
    );
}

/// What a flood needs on `server`: a store with a deny cache, one that looks at
/// the same buckets without a cache (a peek spends nothing), and the policy;
/// the connection up and the script loaded before the server's stats are
/// reset.
async fn flood(server: &RedisServer) -> (RedisStore, RedisStore, Policy) {
    let cached = store(server, 1_000);
    let truth_store = store(server, 0);
    let policy = policy();
    let _ = cached.check("warm", &policy, 1).await.unwrap();
    server.reset_stats();
    (cached, truth_store, policy)
}

#[tokio::test]
async fn a_flooded_key_costs_redis_one_call_per_refill_and_no_false_denial() {
    let server = RedisServer::start();
    let (cached, truth_store, policy) = flood(&server).await;

    let start = Instant::now();
    let (mut admitted, mut denied, mut peeks) = (0u64, 0u64, 0u64);
    while start.elapsed() < Duration::from_millis(1_600) {
        // Before every check, read Redis's bucket: if a token is there
        // already, the check must be admitted (nobody else spends from this
        // bucket), and a denial must be told at least the wait it implies.
        let before = Instant::now();
        let truth = truth(&truth_store, "hot", &policy, 1).await;
        peeks += 1;
        let d = cached.check("hot", &policy, 1).await.unwrap();
        agrees(&d, &truth, 1, before.elapsed(), Duration::from_millis(100));
        if d.allowed() {
            admitted += 1;
            continue;
        }
        denied += 1;
        assert!(d.retry_after() <= PER_TOKEN, "{d:?}");
    }
    let calls = server.calls("evalsha") + server.calls("eval");
    println!(
        "{admitted} admitted, {denied} denied: {} Redis calls for the checks ({peeks} peeks besides)",
        calls - peeks
    );
    // 3 at once, then one every 500 ms: 6 or 7 in 1.6 s.
    assert!((5..=7).contains(&admitted), "{admitted} admitted");
    // Relative, not a count: each turn is a real round trip, and a loaded
    // machine may make only a few dozen in 1.6 s.
    assert!(
        denied > 5 * admitted,
        "only {denied} denials: the flood was not a flood"
    );
    // One call per admission and about one per refill that found the bucket
    // still empty, plus the truth's peeks: far fewer than the checks.
    assert!(
        calls <= 2 * admitted + 4 + peeks,
        "{calls} Redis calls for {} checks",
        admitted + denied
    );
}

/// Costs 1, 2 and 3 in turn on one flooded key: a denial cached for one
/// cost answers the larger ones, each told the wait for its own tokens (500
/// ms more per token), and every answer agrees with Redis's bucket.
#[tokio::test]
async fn larger_costs_answered_by_the_cache_are_told_their_own_wait() {
    let server = RedisServer::start();
    let (cached, truth_store, policy) = flood(&server).await;

    let start = Instant::now();
    let (mut checks, mut tokens, mut local) = (0u64, 0u64, 0u64);
    while start.elapsed() < Duration::from_millis(1_600) {
        let cost = 1 + checks % CAPACITY;
        checks += 1;
        let before = Instant::now();
        let truth = truth(&truth_store, "hot", &policy, cost).await;
        let calls = server.calls("evalsha");
        let d = cached.check("hot", &policy, cost).await.unwrap();
        let asked_redis = server.calls("evalsha") > calls;
        agrees(
            &d,
            &truth,
            cost,
            before.elapsed(),
            Duration::from_millis(100),
        );
        if d.allowed() {
            tokens += cost;
        } else if !asked_redis {
            local += 1;
        }
    }
    println!("{checks} checks of costs 1 to 3: {tokens} tokens admitted, {local} denied locally");
    // 3 at once, then one every 500 ms.
    assert!((4..=7).contains(&tokens), "{tokens} tokens admitted");
    assert!(
        local > checks / 2,
        "only {local} of {checks} checks denied locally"
    );
}

#[tokio::test]
async fn a_reset_on_this_instance_clears_the_cached_denial() {
    let server = RedisServer::start();
    let store = store(&server, 1_000);
    let truth_store = self::store(&server, 0);
    // 2 an hour: a token every 30 minutes, one unit of level a microsecond.
    let quota = Quota::per_hour(2).unwrap();
    let policy = Policy::from(quota);
    for _ in 0..2 {
        assert!(store.check("k", &policy, 1).await.unwrap().allowed());
    }
    assert!(!store.check("k", &policy, 1).await.unwrap().allowed());
    let calls = server.calls("evalsha");
    assert!(!store.check("k", &policy, 1).await.unwrap().allowed());
    assert_eq!(
        server.calls("evalsha"),
        calls,
        "the repeat denial asked Redis"
    );
    // A larger cost waits at least as long: denied locally too, and told
    // the wait for both tokens, the bucket's time to full (30 minutes more
    // than the cached denial's).
    let before = Instant::now();
    let full = truth_store
        .check("k", &policy, 0)
        .await
        .unwrap()
        .reset_after();
    let calls = server.calls("evalsha");
    let d = store.check("k", &policy, 2).await.unwrap();
    let elapsed = before.elapsed();
    assert_eq!(
        server.calls("evalsha"),
        calls,
        "the larger cost asked Redis"
    );
    assert!(!d.allowed());
    let told = d.retry_after();
    assert!(
        told + elapsed >= full && told <= full + Duration::from_millis(100),
        "told {told:?} for 2 tokens, {full:?} until the bucket holds them"
    );
    // A smaller cost than any cached one, or a peek, would ask Redis; a
    // reset on this instance forgets the denial.
    store.reset("k", &policy).await.unwrap();
    assert!(store.check("k", &policy, 1).await.unwrap().allowed());
}
