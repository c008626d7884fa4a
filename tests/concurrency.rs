//! Many callers on one key never get more than the quota, and get all of it.
//!
//! 64 tasks on a multi-thread runtime hammer one key through 4 `RateLimiter`s for
//! 3 seconds: with `RedisStore`, each limiter has its own pool and connection to
//! one redis-server (as 4 application instances would); with `MemoryStore`, the
//! 4 limiters share one store across threads.
//!
//! ## The bounds
//!
//! Let `elapsed` be the time between a clock reading taken before the first call
//! and one taken after the last (Redis `TIME` for Redis, so the bound uses the
//! store's own clock). The bucket starts full at the first call and refills at
//! `rate`, so
//!
//! - **upper:** `admitted <= capacity + rate * elapsed + 1` (the `+ 1` only
//!   absorbs rounding of the product): more would mean a race spent a token twice.
//! - **lower:** after the 3 s every task keeps calling until it is denied once, so
//!   the last call of the run is a denial, which means under one token was left.
//!   Nothing is lost on the way as long as the bucket never fills up again mid-run
//!   (that needs every task stalled for `capacity / rate` = 2 s). Hence
//!   `admitted > capacity + rate * (t_last - t_first) - 1`. The difference
//!   between `elapsed` and `t_last - t_first` is bounded by two windows measured
//!   on the local clock: from before the first clock reading to the first answer
//!   (`g1`), and from the last task's final call to after the second clock reading
//!   (`g2`). So `margin = rate * (g1 + g2) + 1`, measured rather than guessed: it
//!   grows on a busy machine, stays honest, and is printed.
//!
//! The test also checks that demand far exceeded supply (decisions >= 3 x
//! admitted), or the lower bound would prove nothing about contention.
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;

use support::RedisServer;
use support::hammer::{assert_bounds, hammer, quota};
use tollgate::{MemoryStore, RateLimiter};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_never_admits_more_than_the_quota_across_instances() {
    let server = Arc::new(RedisServer::start());
    let limiters: Vec<_> = (0..4)
        .map(|_| RateLimiter::new(server.store(), quota()))
        .collect();
    // Connect and load the script before the clock starts.
    for l in &limiters {
        let _ = l.peek("warm-up").await.unwrap();
    }
    let clock = {
        let server = Arc::clone(&server);
        move || server.time_us()
    };
    let outcome = hammer(&limiters, clock).await;
    assert_bounds("redis", &outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_never_admits_more_than_the_quota_across_threads() {
    let store = MemoryStore::new();
    let limiters: Vec<_> = (0..4)
        .map(|_| RateLimiter::new(store.clone(), quota()))
        .collect();
    let epoch = std::time::Instant::now();
    let outcome = hammer(&limiters, move || epoch.elapsed().as_micros() as u64).await;
    assert_bounds("memory", &outcome);
}
