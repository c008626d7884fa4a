//! `RedisStore` behind Redis Sentinel (a primary, a replica and three
//! sentinels, started by the harness): the store asks the sentinels for the
//! primary, and after the primary is killed under load it finds the promoted
//! replica and checks resume.
#![cfg(feature = "sentinel")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::failover;
use support::sentinel::SentinelSet;
use tollgate::{RateLimiter, RedisStore};

/// Checks go to the primary the sentinels name; the primary is killed
/// (SIGKILL) while 8 tasks check; the sentinels promote the replica; every
/// limiter decides again within seconds, every error on the way is a store
/// error, and the over-admission is bounded by the writes the replica missed
/// (see `tests/support/failover.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_primary_killed_under_load_checks_resume_on_the_new_primary() {
    let set = Arc::new(SentinelSet::start());
    let timeout = Duration::from_secs(1);
    let limiters: Vec<_> = (0..2)
        .map(|_| RateLimiter::new(set.store(timeout), failover::quota()))
        .collect();

    // Through the sentinels, to the primary (the replica has it too).
    let old = set.primary();
    let replica = set.replica();
    let d = limiters[0].check("hot", 1).await.unwrap();
    assert_eq!(d.remaining(), failover::CAPACITY - 1);
    let key = set
        .store(timeout)
        .bucket_key("default:hot", &failover::quota());
    let exists: i64 = old.cmd(&["EXISTS", &key]);
    assert_eq!(exists, 1, "the check did not reach the primary");
    assert!(old.calls("evalsha") + old.calls("eval") >= 1);
    assert_eq!(replica.calls("evalsha") + replica.calls("eval"), 0);

    let others: Vec<String> = (0..8).map(|i| format!("other:{i}")).collect();
    for l in &limiters {
        let _ = l.check("hot", 1).await.unwrap();
    }
    let kill = {
        let old = old.clone();
        move || old.kill()
    };
    let promoted = {
        let set = Arc::clone(&set);
        let heir = replica.port();
        move || assert_eq!(set.wait_for_failover(), heir)
    };
    let report = failover::kill_under_load(
        "sentinel",
        &limiters,
        "hot",
        &others,
        move || replica.time_us(),
        kill,
        promoted,
    )
    .await;
    // Seen: 0.18-0.47 s; room for a probe's timeout, reconnects and a busy
    // machine.
    assert!(
        report.promoted_to_resumed <= Duration::from_secs(10),
        "checks resumed {:?} after the promotion",
        report.promoted_to_resumed
    );
    // The decisions after the failover were made on the new primary.
    let new = set.primary();
    assert_ne!(new, old);
    assert!(new.calls("evalsha") + new.calls("eval") > 0);
}

#[test]
fn sentinel_configuration_mistakes_are_refused_at_build() {
    let refused = support::refused_at_build;
    let none: [&str; 0] = [];
    let m = refused(
        RedisStore::builder()
            .leases(false)
            .sentinel(none, "mymaster"),
    );
    assert!(m.contains("at least one sentinel"), "{m}");
    let m = refused(
        RedisStore::builder()
            .leases(false)
            .sentinel(["redis://10.0.0.1:26379"], ""),
    );
    assert!(m.contains("master name"), "{m}");
    let m = refused(RedisStore::builder().leases(false).sentinel(
        ["redis://:s3cret@10.0.0.1:26379", "redis://10.0.0.2:26379"],
        "m",
    ));
    assert!(m.contains("same scheme, credentials and database"), "{m}");
    let m = refused(
        RedisStore::builder()
            .leases(false)
            .sentinel(["redis://:s3cret@10.0.0.1:notaport"], "m"),
    );
    assert!(m.contains("10.0.0.1"), "{m}");
    // Credentials for the primary only make sense with sentinels.
    let m = refused(
        RedisStore::builder()
            .leases(false)
            .url("redis://127.0.0.1:6379")
            .sentinel_primary_auth(Some("app"), "s3cret"),
    );
    assert!(m.contains("sentinel"), "{m}");

    // Nothing connects before the first check.
    let store = RedisStore::builder()
        .leases(false)
        .sentinel(["redis://:s3cret@10.0.0.1:26379"], "mymaster")
        .sentinel_primary_auth(None, "s3cret")
        .build()
        .unwrap();
    assert!(store.host().contains("mymaster"), "{}", store.host());
    assert!(store.host().contains("10.0.0.1:26379"), "{}", store.host());
    assert!(!format!("{store:?}").contains("s3cret"));
    let debug = format!(
        "{:?}",
        RedisStore::builder()
            .leases(false)
            .sentinel(["redis://:s3cret@10.0.0.1:26379"], "mymaster")
            .sentinel_primary_auth(Some("app"), "s3cret")
    );
    assert!(!debug.contains("s3cret"), "{debug}");
}
