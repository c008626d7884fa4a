//! Both stores against an independent model of the token bucket.
//!
//! The model below is written from the definition, not from `src/store/bucket.rs`:
//! a bucket's level is an exact rational number of tokens,
//! `level(t) = min(capacity, level(t0) + (t - t0) * tokens / period)`. A check of
//! cost `c` admits iff every quota holds at least `c`; admitting subtracts `c`
//! from all of them, a denial changes nothing. The model keeps the level as a
//! `u128` numerator over the period in microseconds (no reduction, no shared code
//! with the engine), so any rounding in the engine shows up as a mismatch.
//!
//! Every generated case runs the same sequence of (elapsed, cost) steps against
//! `MemoryStore::check_at`, `RedisStore::check_at` (one real redis-server for the
//! whole property, a fresh key per case) and the model, and compares every field
//! of every quota state after every step.
#![cfg(all(feature = "redis", feature = "test-util"))]

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::RedisServer;
use tollgate::{Decision, Error, MemoryStore, Policy, Quota, RedisStore};

/// A realistic Redis clock (microseconds since the epoch, November 2025), so the
/// script's arithmetic runs on numbers of the size production sends.
const EPOCH_US: u64 = 1_763_000_000_000_000;

/// One quota as the model sees it: `tokens` per `period_us`, bucket `capacity`.
#[derive(Clone, Copy, Debug)]
struct ModelQuota {
    tokens: u128,
    period_us: u128,
    capacity: u128,
}

/// One bucket: the level is `scaled / period_us` tokens, exactly.
#[derive(Clone, Copy, Debug)]
struct ModelBucket {
    q: ModelQuota,
    scaled: u128,
}

#[derive(Debug, PartialEq, Eq)]
struct Expected {
    allowed: bool,
    remaining: u64,
    retry_after_us: u64,
    reset_after_us: u64,
}

fn ceil(a: u128, b: u128) -> u64 {
    u64::try_from(a.div_ceil(b)).expect("fits in u64")
}

impl ModelBucket {
    fn full(q: ModelQuota) -> Self {
        ModelBucket {
            q,
            scaled: q.capacity * q.period_us,
        }
    }

    /// The level after `elapsed_us` more microseconds: `+ elapsed * tokens / period`,
    /// capped at the capacity.
    fn advance(&mut self, elapsed_us: u128) {
        let cap = self.q.capacity * self.q.period_us;
        self.scaled = (self.scaled + elapsed_us * self.q.tokens).min(cap);
    }

    fn holds(&self, cost: u128) -> bool {
        self.scaled >= cost * self.q.period_us
    }

    /// remaining = floor(level); retry_after = ceil((cost - level) / rate) when the
    /// check was denied and this bucket lacks tokens; reset_after =
    /// ceil((capacity - level) / rate). The rate is tokens / period per µs, so
    /// `(x - level) / rate` is `(x * period - scaled) / tokens`.
    fn state(&self, allowed: bool, cost: u128) -> Expected {
        let q = self.q;
        let retry_after_us = if allowed || self.holds(cost) {
            0
        } else {
            ceil(cost * q.period_us - self.scaled, q.tokens)
        };
        Expected {
            allowed,
            remaining: u64::try_from(self.scaled / q.period_us).expect("fits"),
            retry_after_us,
            reset_after_us: ceil(q.capacity * q.period_us - self.scaled, q.tokens),
        }
    }
}

/// The model of one client's buckets over several quotas.
struct Model {
    buckets: Vec<ModelBucket>,
}

impl Model {
    fn new(quotas: &[Quota]) -> Self {
        let buckets = quotas
            .iter()
            .map(|q| {
                ModelBucket::full(ModelQuota {
                    tokens: u128::from(q.tokens()),
                    period_us: q.period().as_micros(),
                    capacity: u128::from(q.capacity()),
                })
            })
            .collect();
        Model { buckets }
    }

    /// Advances time, then decides `cost` against every quota, all or nothing.
    fn check(&mut self, elapsed_us: u64, cost: u64) -> Vec<Expected> {
        let cost = u128::from(cost);
        for b in &mut self.buckets {
            b.advance(u128::from(elapsed_us));
        }
        let allowed = self.buckets.iter().all(|b| b.holds(cost));
        if allowed {
            for b in &mut self.buckets {
                b.scaled -= cost * b.q.period_us;
            }
        }
        self.buckets
            .iter()
            .map(|b| b.state(allowed, cost))
            .collect()
    }
}

/// The quota the decision's top-level accessors must describe, as documented on
/// `Decision`: for a denial the longest wait, for an admission the fewest tokens
/// left (then the longest time to full); ties go to the first quota listed.
fn binding(states: &[Expected]) -> usize {
    let allowed = states.first().is_some_and(|s| s.allowed);
    let mut best = 0;
    for (i, s) in states.iter().enumerate().skip(1) {
        let b = &states[best];
        let better = if allowed {
            s.remaining < b.remaining
                || (s.remaining == b.remaining && s.reset_after_us > b.reset_after_us)
        } else {
            s.retry_after_us > b.retry_after_us
        };
        if better {
            best = i;
        }
    }
    best
}

fn compare(who: &str, step: usize, got: &Decision, want: &[Expected]) -> Result<(), String> {
    let states: Vec<Expected> = got
        .states()
        .iter()
        .map(|s| Expected {
            allowed: got.allowed(),
            remaining: s.remaining(),
            retry_after_us: s.retry_after().as_micros() as u64,
            reset_after_us: s.reset_after().as_micros() as u64,
        })
        .collect();
    if states != want {
        return Err(format!(
            "{who}, step {step}: got {states:?}, model says {want:?}"
        ));
    }
    let b = &want[binding(want)];
    let top = (
        got.allowed(),
        got.remaining(),
        got.retry_after(),
        got.reset_after(),
    );
    let expected_top = (
        b.allowed,
        b.remaining,
        if b.allowed {
            Duration::ZERO
        } else {
            Duration::from_micros(b.retry_after_us)
        },
        Duration::from_micros(b.reset_after_us),
    );
    if top != expected_top {
        return Err(format!(
            "{who}, step {step}: decision reports {top:?}, model's most restrictive quota is {expected_top:?}"
        ));
    }
    Ok(())
}

/// Quotas people use (7/s, 1/h, per-minute, bursts) and odd ones (1500 ms periods,
/// a few microseconds, a day).
fn quota() -> impl Strategy<Value = Quota> {
    let named = prop_oneof![
        Just(Quota::per_second(7).unwrap()),
        Just(Quota::per_hour(1).unwrap()),
        Just(Quota::per_minute(60).unwrap()),
        Just(Quota::new(3, Duration::from_millis(1500)).unwrap()),
        Just(Quota::per_second(10).unwrap().burst(25).unwrap()),
        Just(Quota::per_hour(1000).unwrap()),
    ];
    let period = prop_oneof![
        Just(Duration::from_secs(1)),
        Just(Duration::from_secs(60)),
        Just(Duration::from_secs(3600)),
        Just(Duration::from_secs(86_400)),
        Just(Duration::from_millis(1500)),
        (1u64..5_000).prop_map(Duration::from_millis),
        (1_000u64..10_000_000).prop_map(Duration::from_micros),
    ];
    let random = (1u64..=1_000, period, prop::option::of(1u64..=2_000)).prop_filter_map(
        "quota out of the exact range",
        |(tokens, period, burst)| {
            let q = Quota::new(tokens, period).ok()?;
            match burst {
                Some(b) => q.burst(b).ok(),
                None => Some(q),
            }
        },
    );
    // Quotas at the edge of exactness: capacity x den as close to 2^52 as the
    // quota allows, so the script's doubles run at the top of their exact range.
    let extreme = (1u64..=1_000_000, 1u64..=86_400_000_000, 0u64..1_000).prop_filter_map(
        "quota out of the exact range",
        |(tokens, period_us, less)| {
            let den = period_us / gcd(tokens, period_us);
            let capacity = ((1u64 << 52) / den).checked_sub(less)?;
            Quota::new(tokens, Duration::from_micros(period_us))
                .ok()?
                .burst(capacity)
                .ok()
        },
    );
    prop_oneof![3 => named, 3 => random, 1 => extreme]
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// 1 to 3 distinct quotas.
fn quotas() -> impl Strategy<Value = Vec<Quota>> {
    prop::collection::vec(quota(), 1..=3).prop_map(|mut qs| {
        let mut seen = Vec::new();
        qs.retain(|q| {
            let fresh = !seen.contains(q);
            seen.push(*q);
            fresh
        });
        qs
    })
}

/// Time steps from "the same microsecond" up to two hours, so buckets are seen
/// empty, partly refilled, exactly refilled and overfull.
fn elapsed() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => Just(0u64),
        3 => 0u64..1_000,
        4 => 0u64..2_000_000,
        2 => 0u64..120_000_000,
        1 => 0u64..7_200_000_000,
    ]
}

fn case() -> impl Strategy<Value = (Vec<Quota>, Vec<(u64, u64)>)> {
    quotas().prop_flat_map(|qs| {
        let cap = qs.iter().map(Quota::capacity).min().unwrap_or(1);
        let cost = prop_oneof![
            3 => 0..=cap.min(3),
            2 => 0..=cap,
        ];
        let steps = prop::collection::vec((elapsed(), cost), 1..40);
        (Just(qs), steps)
    })
}

struct Stores {
    server: RedisServer,
    runtime: tokio::runtime::Runtime,
    redis: RedisStore,
    next_key: AtomicU64,
}

/// Why a case failed: a mismatch, or a real-time key expiry that makes the case
/// say nothing.
enum Failure {
    Mismatch(String),
    Perturbed,
}

/// `expired_keys` of `INFO stats`.
fn expired_keys(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "stats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("expired_keys:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("expired_keys in INFO stats")
}

/// Runs one case. The script sets each key's TTL from the clock it is given, so
/// a fast quota's key lives about a second of real time: a stall that long in
/// the middle of a case lets Redis expire it and start a fresh bucket. Such a
/// case is rejected (and regenerated) rather than failed; the keys are deleted
/// after every case so no earlier case's key can expire during a later one.
fn run_case(stores: &Stores, quotas: &[Quota], steps: &[(u64, u64)]) -> Result<(), Failure> {
    let expired = expired_keys(&stores.server);
    let outcome = compare_stores(stores, quotas, steps);
    let perturbed = expired_keys(&stores.server) != expired;
    let _: () = stores.server.cmd(&["FLUSHALL"]);
    match outcome {
        Err(_) if perturbed => Err(Failure::Perturbed),
        other => other.map_err(Failure::Mismatch),
    }
}

fn compare_stores(stores: &Stores, quotas: &[Quota], steps: &[(u64, u64)]) -> Result<(), String> {
    let policy = Policy::new("model", quotas.iter().copied()).map_err(|e| e.to_string())?;
    let id = stores.next_key.fetch_add(1, Ordering::Relaxed);
    let key = format!("model:{id}");
    let memory = MemoryStore::new();
    let mut model = Model::new(quotas);
    let mut now = EPOCH_US;
    for (step, &(elapsed, cost)) in steps.iter().enumerate() {
        now += elapsed;
        let want = model.check(elapsed, cost);
        let mem = memory
            .check_at(&key, &policy, cost, now)
            .map_err(|e| format!("memory, step {step}: {e}"))?;
        compare("memory", step, &mem, &want)?;
        let red = stores
            .runtime
            .block_on(stores.redis.check_at(&key, &policy, cost, now))
            .map_err(|e| format!("redis, step {step}: {e}"))?;
        compare("redis", step, &red, &want)?;
    }
    Ok(())
}

#[test]
fn both_stores_agree_with_the_model() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stores = Stores {
        redis: server.store(),
        server,
        runtime,
        next_key: AtomicU64::new(0),
    };
    // About 200 cases of up to 40 steps: a few seconds even on a busy machine.
    let mut runner = TestRunner::new(Config {
        cases: 200,
        max_shrink_iters: 2_000,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&case(), |(quotas, steps)| {
        run_case(&stores, &quotas, &steps).map_err(|f| match f {
            Failure::Mismatch(why) => TestCaseError::fail(why),
            Failure::Perturbed => TestCaseError::reject("a key expired in real time"),
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// A cost above any quota's capacity is refused by both stores the same way,
/// before anything is stored.
#[test]
fn both_stores_refuse_impossible_costs_alike() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let quotas = Policy::new(
        "impossible",
        [
            Quota::per_second(10).unwrap(),
            Quota::per_hour(1).unwrap().burst(4).unwrap(),
        ],
    )
    .unwrap();
    let memory = MemoryStore::new();
    let redis = server.store();
    let mem = memory.check_at("k", &quotas, 5, EPOCH_US).unwrap_err();
    let red = runtime
        .block_on(redis.check_at("k", &quotas, 5, EPOCH_US))
        .unwrap_err();
    for e in [mem, red] {
        assert!(
            matches!(
                e,
                Error::CostExceedsCapacity {
                    cost: 5,
                    capacity: 4
                }
            ),
            "{e:?}"
        );
    }
    assert!(memory.is_empty());
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert!(keys.is_empty(), "{keys:?}");
}

/// A clock that goes backwards (a failover to a server whose clock is behind)
/// refills nothing until it reaches the bucket's stamp again, and the waits
/// both stores report count from the stamp, not from the earlier clock.
#[test]
fn both_stores_wait_from_the_stamp_when_the_clock_goes_back() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let quotas = Policy::from(Quota::per_second(10).unwrap());
    let memory = MemoryStore::new();
    let redis = server.store();
    let stamp = EPOCH_US + 5_000_000;
    let check = |cost: u64, now: u64| {
        let mem = memory.check_at("back", &quotas, cost, now).unwrap();
        let red = runtime
            .block_on(redis.check_at("back", &quotas, cost, now))
            .unwrap();
        assert_eq!(mem, red, "stores disagree at {now}");
        mem
    };
    assert!(check(10, stamp).allowed());
    // Two seconds behind the stamp: a token is 2.1 s away, a full bucket 3 s.
    let d = check(1, stamp - 2_000_000);
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Duration::from_millis(2_100));
    assert_eq!(d.reset_after(), Duration::from_secs(3));
    assert_eq!(
        check(0, stamp - 2_000_000).reset_after(),
        Duration::from_secs(3)
    );
    // Exactly when promised, counted from the earlier clock.
    assert!(!check(1, stamp - 2_000_000 + 2_099_999).allowed());
    assert!(check(1, stamp - 2_000_000 + 2_100_000).allowed());
}
