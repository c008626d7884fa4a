//! MemoryStore at its edges: a bounded number of keys, forgetting refilled
//! buckets first and then the key nearest to full, new clients served under a
//! flood, and long or hostile keys.
#![cfg(feature = "test-util")]

use std::time::Duration;

use tollgate::store::{MAX_RAW_KEY_LEN, safe_key};
use tollgate::{MemoryStore, Policy, Quota, RateLimiter, Store};

const SECOND: u64 = 1_000_000;

fn per_second(n: u64) -> Policy {
    Quota::per_second(n).unwrap().into()
}

/// A small store holds exactly as many busy keys as it was built for; one more
/// takes the place of another and the store stays at that size.
#[test]
fn a_small_store_holds_exactly_max_keys() {
    for max in [1, 2, 7, 100, 1000] {
        let store = MemoryStore::with_max_keys(max).unwrap();
        let quotas = Policy::from(Quota::per_hour(1).unwrap());
        for i in 0..max {
            let _ = store
                .check_at(&format!("k{i}"), &quotas, 1, 0)
                .unwrap_or_else(|e| panic!("max {max}: key {i} refused: {e}"));
        }
        assert_eq!(store.len(), max);
        // Changed: a new key used to be refused with StoreFull here; it is now
        // admitted in place of the key nearest to full.
        let d = store.check_at("one-more", &quotas, 1, 0).unwrap();
        assert!(d.allowed());
        assert_eq!(store.len(), max);
    }
}

/// A large store spreads keys over shards; it still takes most of its nominal
/// size in random keys before a shard fills up (a shard holds 1/64 of it), and
/// never more than the nominal size.
#[test]
fn a_large_store_fills_up_evenly_and_stays_bounded() {
    let max = 64 * 1024;
    let store = MemoryStore::with_max_keys(max).unwrap();
    let quotas = Policy::from(Quota::per_hour(1).unwrap());
    let (mut held, mut first_eviction, mut evictions) = (0, None, 0);
    // Changed: a full shard used to refuse new keys (StoreFull); it now evicts
    // one key per new key, seen here as a check after which the store did not
    // grow. Every check is admitted.
    for i in 0..2 * max {
        if evictions == 4_000 {
            break;
        }
        let d = store
            .check_at(&format!("client:{i}"), &quotas, 1, 0)
            .unwrap();
        assert!(d.allowed());
        let len = store.len();
        if len == held {
            first_eviction.get_or_insert(held);
            evictions += 1;
        }
        held = len;
        assert!(held <= max, "{held} keys held, max {max}");
    }
    // Each of the 64 shards holds 1024; the fullest shard reaches that when the
    // store is about 95% full (the first eviction before 75% would be an
    // 8-sigma event).
    let first_eviction = first_eviction.expect("the store filled up");
    assert!(
        first_eviction >= max * 3 / 4,
        "first eviction after {first_eviction} of {max} keys"
    );
}

/// A full store keeps limiting the keys it has: a flood of new keys is served,
/// but evicts the key nearest to full, and then its own keys, never the
/// clients that have drained their buckets.
#[test]
fn a_full_store_keeps_limiting_known_keys() {
    let store = MemoryStore::with_max_keys(10).unwrap();
    let quotas = per_second(2);
    // k0 drains its bucket first, so it is the nearest to full.
    for i in 0..10 {
        let _ = store.check_at(&format!("k{i}"), &quotas, 2, i).unwrap();
    }
    // Changed: new keys used to be refused (StoreFull) here. They are now
    // served: the first takes k0's place, each later one the previous new
    // key's (half a second from full, where the k are a whole second).
    for i in 0..100 {
        let d = store.check_at(&format!("new{i}"), &quotas, 1, 10).unwrap();
        assert!(d.allowed());
    }
    // k1 is still known and still empty.
    let d = store.check_at("k1", &quotas, 1, 100_000).unwrap();
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Duration::from_micros(400_001));
    // k0 was forgotten: it comes back full, which gives it the 2 tokens it
    // was missing, one capacity, the bound the eviction allows.
    assert!(store.check_at("k0", &quotas, 2, 100_000).unwrap().allowed());
    for i in 2..10 {
        let d = store
            .check_at(&format!("k{i}"), &quotas, 1, 100_000)
            .unwrap();
        assert!(!d.allowed(), "k{i}");
    }
    // A peek at an unknown key needs no room and stores nothing.
    let d = store.check_at("stranger", &quotas, 0, 100_000).unwrap();
    assert_eq!(d.remaining(), 2);
    assert_eq!(store.len(), 10);
}

/// Buckets that have refilled completely are forgotten first to make room:
/// forgetting one changes no decision.
#[test]
fn refilled_keys_are_forgotten_first() {
    let store = MemoryStore::with_max_keys(4).unwrap();
    let quotas = per_second(2);
    for i in 0..4 {
        let _ = store.check_at(&format!("k{i}"), &quotas, 2, 0).unwrap();
    }
    // k0 spends again and so is not refilled at 1 s, the others are.
    assert!(
        store
            .check_at("k0", &quotas, 1, SECOND / 2)
            .unwrap()
            .allowed()
    );
    // Changed: one new key used to sweep k1..k3 at once (len 2); each new key
    // now forgets one key, a refilled one while there are any.
    for new in ["new1", "new2", "new3"] {
        let _ = store.check_at(new, &quotas, 1, SECOND).unwrap();
        assert_eq!(store.len(), 4);
    }
    let d = store.check_at("k0", &quotas, 2, SECOND).unwrap();
    assert!(!d.allowed(), "k0 was forgotten: its bucket came back full");
}

/// The flood of the issue this store was changed for: random keys fill it, and
/// a new legitimate client arriving during the flood is served and limited
/// like any other, instead of being refused for as long as the flood lasts.
#[test]
fn new_clients_are_served_and_limited_during_a_flood_of_random_keys() {
    let store = MemoryStore::with_max_keys(1_000).unwrap();
    let quotas = Policy::from(Quota::per_hour(100).unwrap());
    let mut now = 0;
    let flood = |store: &MemoryStore, now: u64| {
        let d = store
            .check_at(&format!("random-{now}"), &quotas, 1, now)
            .unwrap();
        assert!(d.allowed());
    };
    for _ in 0..5_000 {
        now += 1;
        flood(&store, now);
    }
    // The legitimate client sends 150 requests, each between flood requests.
    let mut admitted = 0;
    for _ in 0..150 {
        now += 1;
        if store.check_at("legit", &quotas, 1, now).unwrap().allowed() {
            admitted += 1;
        }
        now += 1;
        flood(&store, now);
    }
    assert_eq!(admitted, 100, "served, and limited at its quota");
    assert_eq!(store.len(), 1_000);
}

/// `sweep` releases refilled keys on the real clock; `reset` forgets a key.
#[tokio::test]
async fn sweep_and_reset_release_keys() {
    let store = MemoryStore::new();
    let fast = RateLimiter::new(store.clone(), Quota::per_second(1000).unwrap());
    let slow = RateLimiter::new(store.clone(), Quota::per_hour(1).unwrap());
    for i in 0..50 {
        let _ = fast.check(&format!("f{i}"), 1).await.unwrap();
    }
    let _ = slow.check("s", 1).await.unwrap();
    let _ = slow.check("t", 1).await.unwrap();
    assert_eq!(store.len(), 52);
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.sweep();
    assert_eq!(store.len(), 2, "fast keys refilled within 1 ms");
    slow.reset("s").await.unwrap();
    assert_eq!(store.len(), 1);
    assert!(slow.check("s", 1).await.unwrap().allowed());
    assert!(!slow.check("t", 1).await.unwrap().allowed());
    // Resetting other quotas of a key leaves its buckets alone.
    store
        .reset("t", &Policy::from(Quota::per_second(1).unwrap()))
        .await
        .unwrap();
    assert!(!slow.check("t", 1).await.unwrap().allowed());
}

/// Long keys are stored hashed (bounded memory) yet stay distinct; hostile ones
/// (braces, spaces, non-ASCII) never collide with each other or with raw keys.
#[test]
fn long_and_hostile_keys_are_hashed_and_kept_apart() {
    let store = MemoryStore::new();
    let quotas = per_second(1);
    let long_a = "a".repeat(1 << 20);
    let mut long_b = long_a.clone();
    long_b.push('b');
    let just_raw = "r".repeat(MAX_RAW_KEY_LEN);
    let just_hashed = "r".repeat(MAX_RAW_KEY_LEN + 1);
    assert_eq!(safe_key(&just_raw), just_raw.as_str());
    for k in [&long_a, &long_b, &just_hashed] {
        assert_eq!(safe_key(k).len(), 33);
    }
    let keys = [
        long_a.as_str(),
        long_b.as_str(),
        just_raw.as_str(),
        just_hashed.as_str(),
        "a{b}",
        "a{c}",
        "with space",
        "é",
        "",
    ];
    for k in keys {
        assert!(
            store.check_at(k, &quotas, 1, 0).unwrap().allowed(),
            "{k:.20}"
        );
    }
    assert_eq!(store.len(), keys.len());
    // Each is limited on its own bucket, the long ones included.
    for k in keys {
        assert!(
            !store.check_at(k, &quotas, 1, 1).unwrap().allowed(),
            "{k:.20}"
        );
    }
    // A raw key spelled like another key's hash is not that key.
    let hash = safe_key("a{b}").into_owned();
    assert!(store.check_at(&hash, &quotas, 1, 1).unwrap().allowed());
}

#[test]
fn a_store_needs_room_for_one_key() {
    let err = MemoryStore::with_max_keys(0).unwrap_err();
    assert_eq!(err.kind(), tollgate::ConfigErrorKind::Store);
    assert!(err.to_string().contains("at least one key"), "{err}");
}
