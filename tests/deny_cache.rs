//! The local deny cache against a real Redis: a flooded key costs Redis about
//! one call per refill, and every denial the cache gives is one Redis would
//! give too.
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use support::RedisServer;
use tollgate::{Policy, Quota, RedisStore, Store};

fn store(server: &RedisServer, deny_cache: usize) -> RedisStore {
    RedisStore::builder()
        .pool(server.pool())
        .timeout(Duration::from_secs(5))
        .deny_cache(deny_cache)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_flooded_key_costs_redis_one_call_per_refill_and_no_false_denial() {
    let server = RedisServer::start();
    let cached = store(&server, 1_000);
    // Looks at the same buckets without a cache (a peek spends nothing).
    let truth = store(&server, 0);
    // 2 a second, bursts of 3: a token every 500 ms.
    let policy = Policy::from(Quota::per_second(2).unwrap().burst(3).unwrap());
    let _ = cached.check("warm", &policy, 1).await.unwrap();
    server.reset_stats();

    let start = Instant::now();
    let (mut admitted, mut denied, mut peeks) = (0u64, 0u64, 0u64);
    while start.elapsed() < Duration::from_millis(1_600) {
        // Now and then, ask Redis first: if a token is there already, the
        // next check must be admitted (nobody else spends from this bucket).
        let token_there = if (admitted + denied) % 200 == 0 {
            peeks += 1;
            truth.check("hot", &policy, 0).await.unwrap().remaining() > 0
        } else {
            false
        };
        let d = cached.check("hot", &policy, 1).await.unwrap();
        if d.allowed() {
            admitted += 1;
            continue;
        }
        assert!(!token_there, "the cache denied what Redis admits: {d:?}");
        denied += 1;
        assert!(d.retry_after() <= Duration::from_millis(500), "{d:?}");
    }
    let calls = server.calls("evalsha") + server.calls("eval");
    println!(
        "{admitted} admitted, {denied} denied: {} Redis calls for the checks ({peeks} peeks besides)",
        calls - peeks
    );
    // 3 at once, then one every 500 ms: 6 or 7 in 1.6 s.
    assert!((5..=7).contains(&admitted), "{admitted} admitted");
    assert!(
        denied > 1_000,
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

#[tokio::test]
async fn a_reset_on_this_instance_clears_the_cached_denial() {
    let server = RedisServer::start();
    let store = store(&server, 1_000);
    let policy = Policy::from(Quota::per_hour(2).unwrap());
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
    // A larger cost waits at least as long: denied locally too; a smaller
    // cost than any cached one, or a peek, would ask Redis.
    store.reset("k", &policy).await.unwrap();
    assert!(store.check("k", &policy, 1).await.unwrap().allowed());
}
