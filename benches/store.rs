//! Latency of one decision: `MemoryStore` in process, `RedisStore` against a
//! redis-server this bench starts on loopback (one call at a time, so this is
//! the round trip; `redis_throughput` measures concurrent load).
//!
//! The policies are built once, outside the timed loop, so each figure is the
//! check alone. Criterion prints, for each, its estimate of the time per
//! check and a 95% confidence interval around it: `time: [low estimate high]`.
//!
//! Run: `cargo bench --bench store` (about 40 s).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use support::RedisServer;
use tollgate::{MemoryStore, Policy, Quota, Store};

fn quotas() -> Policy {
    // Large enough that the hot key keeps being admitted (a write every time).
    Quota::per_second(1_000_000).expect("quota").into()
}

fn two_quotas() -> Policy {
    Policy::new(
        "two",
        [
            Quota::per_second(1_000_000).expect("quota"),
            Quota::per_hour(1_000_000_000).expect("quota"),
        ],
    )
    .expect("policy")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn memory(c: &mut Criterion) {
    let rt = runtime();
    let store = MemoryStore::new();
    let (one, two) = (quotas(), two_quotas());
    let mut group = c.benchmark_group("memory");
    group.bench_function("check, one key", |b| {
        b.to_async(&rt)
            .iter(|| async { store.check("user:42", &one, 1).await.expect("check") })
    });
    group.bench_function("check, two quotas", |b| {
        b.to_async(&rt)
            .iter(|| async { store.check("user:42", &two, 1).await.expect("check") })
    });
    let keys: Vec<String> = (0..10_000).map(|i| format!("user:{i}")).collect();
    let mut i = 0;
    group.bench_function("check, 10k keys", |b| {
        b.to_async(&rt).iter(|| {
            i = (i + 1) % keys.len();
            let key = &keys[i];
            let (store, one) = (&store, &one);
            async move { store.check(key, one, 1).await.expect("check") }
        })
    });
    group.finish();
}

fn redis(c: &mut Criterion) {
    let rt = runtime();
    let server = RedisServer::start();
    let store = server.store();
    let (one, two) = (quotas(), two_quotas());
    let _ = rt
        .block_on(store.check("warm-up", &one, 1))
        .expect("warm-up");
    let mut group = c.benchmark_group("redis");
    group.bench_function("check, one key", |b| {
        b.to_async(&rt)
            .iter(|| async { store.check("user:42", &one, 1).await.expect("check") })
    });
    group.bench_function("check, two quotas", |b| {
        b.to_async(&rt)
            .iter(|| async { store.check("user:42", &two, 1).await.expect("check") })
    });
    group.finish();
    // With leases on, a key in steady use is decided from its hold, in
    // process: the same kind of work as the memory store's.
    let leased = tollgate::RedisStore::builder()
        .url(server.url())
        .leases(true)
        .build()
        .expect("store");
    // On worker threads of their own: a check decided from its hold never
    // waits, so on the current-thread runtime a measuring loop of them never
    // yields, and the store's lease tasks (asking for the next lease, the
    // reports) would starve past the store timeout, as no real server's
    // request loop, which waits on sockets, makes them.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("redis, leases");
    group.bench_function("check, one key", |b| {
        b.to_async(&rt)
            .iter(|| async { leased.check("user:42", &one, 1).await.expect("check") })
    });
    let keys: Vec<String> = (0..10_000).map(|i| format!("user:{i}")).collect();
    let mut i = 0;
    group.bench_function("check, 10k keys", |b| {
        b.to_async(&rt).iter(|| {
            i = (i + 1) % keys.len();
            let key = &keys[i];
            let (store, one) = (&leased, &one);
            async move { store.check(key, one, 1).await.expect("check") }
        })
    });
    group.finish();
    let stats = leased.lease_stats();
    println!(
        "redis, leases: {} of the checks decided in process, {} lease requests",
        stats.local_decisions, stats.requests
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = memory, redis
}
criterion_main!(benches);
