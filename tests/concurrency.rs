//! Many callers on one key never get more than the quota, and get all of it.
//!
//! One key, hammered by many callers at once: 64 tokio tasks through 4
//! `RedisStore`s (each with its own pool and connection to one redis-server, as
//! 4 application instances would), and 8 OS threads on one `MemoryStore`.
//!
//! ## The accounting, exact
//!
//! A bucket starts full at its first spend (time `s0`) and gains `rate` tokens
//! a second, never more than its capacity; only admissions change it, each
//! stamping it with the time it used. So after the last admission (time `s1`)
//! with `level` tokens left:
//!
//! `admitted + level = capacity + rate * (s1 - s0) - lost`,
//!
//! where `lost` is whatever a full bucket could not take in. Both stamps and
//! the level are read from the store itself (Redis: the stored `level:stamp`
//! of the first and the last admission; memory: the explicit clock the test
//! hands out), so nothing depends on how fast the machine is:
//!
//! - **never more:** `admitted + level <= capacity + rate * (s1 - s0)`, always;
//!   more would mean a race spent a token twice.
//! - **all of it:** nothing is lost unless the bucket was full again mid-run,
//!   which an admission reports (one token's time to full, `reset_after`).
//!   Unless one did, the equality holds exactly.
//! - **to the last token:** every caller keeps calling after the run until it
//!   is denied, so the level the last admission left is under one token.
#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use support::RedisServer;
use tokio::time::Instant;
use tollgate::{Quota, RateLimiter};

const RUN: Duration = Duration::from_secs(3);
const RATE: u64 = 200;
/// Large enough that the bucket key outlives any stall between the last
/// admission and the test reading it: a key lasts until its bucket is full
/// again (plus 1 ms), and the last admission leaves it under a token, 10 s
/// from full.
const CAPACITY: u64 = 2_000;
/// The first admission's cost. Its stamp is read right after it, so it leaves
/// the bucket far from full: the key then lasts `FIRST / RATE` = 2 s, where
/// one token would give a busy machine 6 ms to read it.
const FIRST: u64 = 400;
/// A token in the script's units: `Quota::per_second(200)` refills one unit a
/// microsecond, and a token is 1/200 s.
const UNITS_PER_TOKEN: u64 = 1_000_000 / RATE;
const FULL: u64 = CAPACITY * UNITS_PER_TOKEN;

fn quota() -> Quota {
    Quota::per_second(RATE).unwrap().burst(CAPACITY).unwrap()
}

/// What the callers saw.
#[derive(Debug, Default)]
struct Tally {
    admitted: u64,
    decisions: u64,
    /// An admission found the bucket full: it may have refilled past the top.
    saw_full: bool,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.admitted += other.admitted;
        self.decisions += other.decisions;
        self.saw_full |= other.saw_full;
    }

    /// The first admission, of `cost` tokens, from a bucket that is full by
    /// definition.
    fn first(d: &tollgate::Decision, cost: u64) -> Self {
        assert!(d.allowed(), "{d:?}");
        Tally {
            admitted: cost,
            decisions: 1,
            saw_full: false,
        }
    }

    fn record(&mut self, d: &tollgate::Decision) {
        self.decisions += 1;
        if d.allowed() {
            self.admitted += 1;
            // One token spent from a full bucket leaves exactly one token's
            // time to full (the clocks here never run behind the stamp).
            self.saw_full |= d.reset_after() == Duration::from_micros(UNITS_PER_TOKEN);
        }
    }
}

/// Checks the accounting (see the module docs): `admitted` including the first
/// admission at `s0`, `level` in units left by the last admission at `s1`.
fn assert_accounting(store: &str, tally: &Tally, s0: u64, s1: u64, level: u64) {
    let supply = FULL + (s1 - s0); // one unit a microsecond
    let taken = tally.admitted * UNITS_PER_TOKEN + level;
    println!(
        "{store}: admitted {} of {} decisions; {} µs from the first to the last \
         admission; {level} units left; supply {supply} units, taken {taken}; \
         bucket seen full mid-run: {}",
        tally.admitted,
        tally.decisions,
        s1 - s0,
        tally.saw_full
    );
    assert!(
        taken <= supply,
        "{store}: admitted {} tokens and left {level} units: more than the {supply} \
         units the bucket can have held",
        tally.admitted
    );
    if !tally.saw_full {
        assert_eq!(taken, supply, "{store}: tokens were lost");
    }
    assert!(
        level < UNITS_PER_TOKEN,
        "{store}: {level} units left after every caller was denied"
    );
}

/// The stored `level:stamp` of a Redis bucket (`level:stamp:full,num`).
fn stored(server: &RedisServer, key: &str) -> (u64, u64) {
    let value: String = server.cmd(&["GET", key]);
    let mut fields = value.split(':');
    let (level, stamp) = (fields.next().unwrap(), fields.next().expect("level:stamp"));
    (level.parse().unwrap(), stamp.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_never_admits_more_than_the_quota_across_instances() {
    const TASKS: usize = 64;
    let server = RedisServer::start();
    let limiters: Vec<_> = (0..4)
        .map(|_| RateLimiter::new(server.store(), quota()))
        .collect();
    // Connect and load the script before the run.
    for l in &limiters {
        let _ = l.peek("warm-up").await.unwrap();
    }
    let key = limiters[0]
        .store()
        .as_redis()
        .unwrap()
        .bucket_key("default:hot", &quota());
    // The first admission, whose stamp starts the accounting.
    let mut tally = Tally::first(&limiters[0].check("hot", FIRST).await.unwrap(), FIRST);
    let (first_level, s0) = stored(&server, &key);
    assert_eq!(first_level, FULL - FIRST * UNITS_PER_TOKEN);

    let deadline = Instant::now() + RUN;
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let limiter = limiters[i % limiters.len()].clone();
            tokio::spawn(async move {
                let mut tally = Tally::default();
                loop {
                    let sent = Instant::now();
                    let d = limiter.check("hot", 1).await.expect("check");
                    tally.record(&d);
                    if !d.allowed() && sent >= deadline {
                        break;
                    }
                }
                tally
            })
        })
        .collect();
    for t in tasks {
        tally.add(t.await.unwrap());
    }
    // Redis TIME only moves forward here, so the last write is the last
    // admission.
    let (level, s1) = stored(&server, &key);
    assert_accounting("redis", &tally, s0, s1, level);
}

/// The same over `MemoryStore` from OS threads, with an explicit clock that
/// the threads advance as they go: times reach the store out of order
/// (a thread can be preempted between reading the clock and checking), which
/// the accounting allows, since a clock behind the stamp refills nothing.
#[cfg(feature = "test-util")]
#[test]
fn memory_never_admits_more_than_the_quota_across_threads() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tollgate::{MemoryStore, Policy};

    const THREADS: usize = 8;
    /// Virtual microseconds each check moves the clock on.
    const STEP: u64 = 20;
    let store = MemoryStore::new();
    let policy = Policy::from(quota());
    let s0 = 1_000_000_000;
    let clock = Arc::new(AtomicU64::new(s0));
    let mut tally = Tally::first(&store.check_at("hot", &policy, 1, s0).unwrap(), 1);
    let end = s0 + RUN.as_micros() as u64;
    // Each thread returns its tally and the latest time it was admitted at.
    let results: Vec<(Tally, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let (store, policy, clock) = (&store, &policy, Arc::clone(&clock));
                scope.spawn(move || {
                    let (mut tally, mut last) = (Tally::default(), 0);
                    loop {
                        let now = clock.fetch_add(STEP, Ordering::Relaxed);
                        let d = store.check_at("hot", policy, 1, now).unwrap();
                        tally.record(&d);
                        if d.allowed() {
                            last = last.max(now);
                        } else if now >= end {
                            break;
                        }
                    }
                    (tally, last)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut s1 = s0;
    for (t, last) in results {
        tally.add(t);
        s1 = s1.max(last);
    }
    // The stamp is the latest admission time; a peek there refills nothing,
    // and its time to full is the missing level in units.
    let d = store.check_at("hot", &policy, 0, s1).unwrap();
    let level = FULL - d.reset_after().as_micros() as u64;
    assert_accounting("memory", &tally, s0, s1, level);
    // No admission can find the bucket full: a check at a time one token past
    // the stamp of a bucket holding under a token admits, so no gap between
    // admissions is anywhere near the 10 s a refill takes.
    assert!(!tally.saw_full);
}
