//! A store outlives the runtimes it is used on: stores shared across runtimes
//! (actix workers, tests with a static store) see their background tasks
//! dropped when a runtime shuts down. A connect dropped that way must not leave
//! the store waiting for it for good: against a real redis-server, frozen with
//! SIGSTOP while the first runtime's connect waits on it.
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use support::RedisServer;
use tollgate::{Policy, Quota, RedisStore, Store};

fn policy() -> Policy {
    Policy::new("lifecycle", [Quota::per_second(1_000_000).unwrap()]).unwrap()
}

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// Checks on `runtime` until one is answered by Redis, for up to `within`.
fn answered_within(
    runtime: &tokio::runtime::Runtime,
    store: &RedisStore,
    within: Duration,
) -> bool {
    let deadline = Instant::now() + within;
    runtime.block_on(async {
        while Instant::now() < deadline {
            if store.check("after", &policy(), 1).await.is_ok() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    })
}

#[test]
fn a_connect_dropped_with_its_runtime_does_not_stall_the_store() {
    let server = RedisServer::start();
    // A connect timeout far longer than the first runtime lives: its connect
    // is still waiting on the frozen server when that runtime shuts down.
    let store = RedisStore::builder()
        .leases(false)
        .url(server.url())
        .timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    server.freeze();
    let first = runtime(1);
    let failed = first.block_on(async { store.check("before", &policy(), 1).await.is_err() });
    assert!(failed, "a frozen server answered");
    // Shutting down drops the connect's task mid-connect.
    first.shutdown_timeout(Duration::from_millis(100));
    server.thaw();

    let second = runtime(1);
    assert!(
        answered_within(&second, &store, Duration::from_secs(10)),
        "the store never connected again after the runtime of its first connect shut down"
    );
}

#[test]
fn a_connect_whose_task_never_ran_does_not_stall_the_store() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let server = RedisServer::start();
    // Unbatched, so the check's first poll is what starts the connect.
    let store = RedisStore::builder()
        .leases(false)
        .url(server.url())
        .timeout(Duration::from_millis(500))
        .max_batch(1)
        .build()
        .unwrap();
    // One poll starts the connect's task; the runtime is dropped before it
    // runs.
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    first.block_on(async {
        let policy = policy();
        let mut check = std::pin::pin!(store.check("before", &policy, 1));
        let pending = check
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending();
        assert!(pending, "answered without connecting");
    });
    drop(first);

    let second = runtime(1);
    assert!(
        answered_within(&second, &store, Duration::from_secs(10)),
        "the store never connected after the task of its first connect was dropped unrun"
    );
}

/// Checks answered without I/O (a memory store; the fallback while Redis is
/// down) in tight loops on both workers of a 2-worker runtime: other tasks
/// and timers must still run, because each check spends tokio's cooperative
/// budget. Without that the loops hold both workers until they stop by
/// themselves (5 s here).
#[test]
fn loops_of_checks_answered_at_once_let_other_tasks_run() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tollgate::{Fallback, MemoryStore, RateLimiter};

    let mut redis = RedisServer::start();
    let store = redis.store();
    redis.stop();
    let limiters = [
        RateLimiter::new(MemoryStore::new(), Quota::per_second(1_000).unwrap()),
        RateLimiter::new(store, Quota::per_second(1_000).unwrap()).fallback(Fallback::memory()),
    ];
    for limiter in limiters {
        let runtime = runtime(2);
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let waited = runtime.block_on(async {
            // Redis dead: the breaker opens, then the fallback answers at once.
            for _ in 0..20 {
                let _ = limiter.check("warm", 1).await;
            }
            for _ in 0..2 {
                let limiter = limiter.clone();
                let stop = Arc::clone(&stop);
                tokio::spawn(async move {
                    let until = Instant::now() + Duration::from_secs(5);
                    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                        let _ = limiter.check("loop", 1).await;
                    }
                });
            }
            let timer = tokio::spawn(async {
                let asked = Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                asked.elapsed()
            });
            let waited = timer.await.unwrap();
            stop.store(true, Ordering::Relaxed);
            waited
        });
        drop(runtime);
        println!(
            "a 10 ms sleep took {waited:?} ({:?} in all)",
            started.elapsed()
        );
        assert!(
            waited < Duration::from_secs(2),
            "a 10 ms timer waited {waited:?} behind loops of checks"
        );
    }
}
