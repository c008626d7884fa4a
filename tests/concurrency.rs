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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use support::RedisServer;
use tokio::time::Instant;
use tollgate::{MemoryStore, Quota, RateLimiter};

const TASKS: usize = 64;
const RUN: Duration = Duration::from_secs(3);
const RATE: u64 = 200;
const CAPACITY: u64 = 400;

fn quota() -> Quota {
    Quota::per_second(RATE).unwrap().burst(CAPACITY).unwrap()
}

struct Outcome {
    admitted: u64,
    decisions: u64,
    elapsed_us: u64,
    g1: Duration,
    g2: Duration,
}

/// Runs the hammer; `clock` reads the store's clock in microseconds.
async fn hammer(
    limiters: &[RateLimiter],
    clock: impl Fn() -> u64 + Send + Sync + 'static,
) -> Outcome {
    let clock = Arc::new(clock);
    let local_start = Instant::now();
    let before = {
        let clock = Arc::clone(&clock);
        tokio::task::spawn_blocking(move || clock()).await.unwrap()
    };
    let deadline = Instant::now() + RUN;
    // Microseconds after local_start: the first answer, and each task's last send.
    let first_answer = Arc::new(AtomicU64::new(u64::MAX));
    let last_send = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let limiter = limiters[i % limiters.len()].clone();
            let first_answer = Arc::clone(&first_answer);
            let last_send = Arc::clone(&last_send);
            tokio::spawn(async move {
                let (mut admitted, mut decisions) = (0u64, 0u64);
                loop {
                    let sent = Instant::now();
                    let d = limiter.check("hot", 1).await.expect("check");
                    let since = |t: Instant| (t - local_start).as_micros() as u64;
                    first_answer.fetch_min(since(Instant::now()), Ordering::Relaxed);
                    decisions += 1;
                    if d.allowed() {
                        admitted += 1;
                    } else if sent >= deadline {
                        // Denied after the run: under one token was left.
                        last_send.fetch_max(since(sent), Ordering::Relaxed);
                        break;
                    }
                }
                (admitted, decisions)
            })
        })
        .collect();
    let (mut admitted, mut decisions) = (0, 0);
    for t in tasks {
        let (a, d) = t.await.unwrap();
        admitted += a;
        decisions += d;
    }
    let after = tokio::task::spawn_blocking(move || clock()).await.unwrap();
    let local_end = Instant::now() - local_start;
    Outcome {
        admitted,
        decisions,
        elapsed_us: after - before,
        g1: Duration::from_micros(first_answer.load(Ordering::Relaxed)),
        g2: local_end - Duration::from_micros(last_send.load(Ordering::Relaxed)),
    }
}

fn assert_bounds(store: &str, o: &Outcome) {
    let rate_us = |us: u128| (u128::from(RATE) * us / 1_000_000) as u64;
    let bound = CAPACITY + rate_us(u128::from(o.elapsed_us));
    // + 2: the level left (< 1 token) and rounding down rate x (g1 + g2).
    let margin = rate_us((o.g1 + o.g2).as_micros()) + 2;
    println!(
        "{store}: admitted {} of {} decisions in {} µs; bound {bound}, margin {margin} \
         (g1 {:?}, g2 {:?})",
        o.admitted, o.decisions, o.elapsed_us, o.g1, o.g2
    );
    assert!(
        o.admitted <= bound + 1,
        "{store}: admitted {} > {bound} + 1",
        o.admitted
    );
    assert!(
        o.admitted + margin >= bound,
        "{store}: admitted {} < {bound} - {margin}",
        o.admitted
    );
    assert!(
        o.decisions >= 3 * o.admitted,
        "{store}: demand ({} decisions) did not far exceed supply ({})",
        o.decisions,
        o.admitted
    );
}

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
