//! Many callers on one key through several limiters, as several application
//! instances would: the cluster test's hammer. The upper bound is exact
//! (capacity plus the refill over the Redis time the run took, plus the one
//! token the rounding can add); the lower bound, which only shows the callers
//! kept the bucket busy, allows the refill of the time before the first answer
//! and after the last send. `tests/concurrency.rs` holds the single node and
//! the memory store to the stamps of the first and last admissions instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tollgate::{Quota, RateLimiter};

pub const TASKS: usize = 64;
pub const RUN: Duration = Duration::from_secs(3);
pub const RATE: u64 = 200;
pub const CAPACITY: u64 = 400;

pub fn quota() -> Quota {
    Quota::per_second(RATE).unwrap().burst(CAPACITY).unwrap()
}

pub struct Outcome {
    pub admitted: u64,
    pub decisions: u64,
    pub elapsed_us: u64,
    pub g1: Duration,
    pub g2: Duration,
}

/// Runs the hammer on the key `"hot"`; `clock` reads the store's clock in
/// microseconds.
pub async fn hammer(
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

pub fn assert_bounds(store: &str, o: &Outcome) {
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
