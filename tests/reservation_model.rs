//! Reservations: both stores against an independent model, and what callers
//! of `reserve` and `acquire` are promised.
//!
//! The model is written from the definition, not from `src/store/bucket.rs`
//! (nor from `tests/model.rs`, whose plain checks it extends): a bucket's level
//! is an exact rational number of tokens that may be negative while reserved
//! tokens are owed,
//! `level(t) = min(capacity, level(t0) + (t - t0) * tokens / period)`.
//!
//! - A reservation of cost `c` that may wait `w` is admitted iff every quota's
//!   level reaches `c` within `w` (a plain check is `w = 0`). Admitting
//!   subtracts `c` from every quota; the tokens are due when every level is
//!   back at zero, and that is the wait. A refused reservation changes nothing
//!   and reports the longest time any quota needs to hold `c`.
//! - The model keeps each level as a signed `i128` numerator over the period in
//!   microseconds, with no reduction and no code shared with the engine.
//!
//! Every generated case runs the same steps (checks, and reservations with
//! random maximum waits, some exactly at the wait needed and a microsecond
//! either side) against `MemoryStore::reserve_at` / `check_at`,
//! `RedisStore::reserve_at` / `check_at` (one real redis-server, a fresh key per
//! case) and the model, at explicit clocks, and compares every field of every
//! quota state and the wait after every step.
#![cfg(all(feature = "redis", feature = "test-util"))]

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::RedisServer;
use support::model::{Expected, compare};
use tollgate::{Error, MemoryStore, Policy, Quota, RateLimiter, RedisStore};

/// A realistic Redis clock (microseconds since the epoch, November 2025).
const EPOCH_US: u64 = 1_763_000_000_000_000;

/// Debts are kept exact by capping them at 2^52 units of a token's fraction
/// (`debt_for` in the engine): a maximum wait is only honoured up to
/// `2^52 / num` microseconds. Cases stay inside that range, where the
/// definition above holds exactly.
const MAX_EXACT: u128 = 1 << 52;

#[derive(Clone, Copy, Debug)]
struct ModelQuota {
    tokens: i128,
    period_us: i128,
    capacity: i128,
}

/// One bucket: the level is `scaled / period_us` tokens, exactly; negative
/// while reserved tokens are owed.
#[derive(Clone, Copy, Debug)]
struct ModelBucket {
    q: ModelQuota,
    scaled: i128,
}

fn ceil(a: i128, b: i128) -> u64 {
    assert!(a >= 0 && b > 0);
    u64::try_from((a + b - 1) / b).expect("fits in u64")
}

impl ModelBucket {
    fn full(q: ModelQuota) -> Self {
        ModelBucket {
            q,
            scaled: q.capacity * q.period_us,
        }
    }

    fn advance(&mut self, elapsed_us: u64) {
        let cap = self.q.capacity * self.q.period_us;
        self.scaled = (self.scaled + i128::from(elapsed_us) * self.q.tokens).min(cap);
    }

    /// Microseconds until the level reaches `cost` (0 when it is there).
    fn time_to_hold(&self, cost: u64) -> u64 {
        let want = i128::from(cost) * self.q.period_us;
        if self.scaled >= want {
            0
        } else {
            ceil(want - self.scaled, self.q.tokens)
        }
    }

    fn state(&self, allowed: bool, cost: u64) -> Expected {
        let q = self.q;
        Expected {
            allowed,
            remaining: u64::try_from(self.scaled.max(0) / q.period_us).expect("fits"),
            retry_after_us: if allowed {
                0
            } else {
                self.time_to_hold(cost).min(MAX_REPORTED_US)
            },
            reset_after_us: ceil(q.capacity * q.period_us - self.scaled, q.tokens)
                .min(MAX_REPORTED_US),
        }
    }
}

struct Model {
    buckets: Vec<ModelBucket>,
}

impl Model {
    fn new(quotas: &[Quota]) -> Self {
        let buckets = quotas
            .iter()
            .map(|q| {
                ModelBucket::full(ModelQuota {
                    tokens: i128::from(q.tokens()),
                    period_us: i128::try_from(q.period().as_micros()).unwrap(),
                    capacity: i128::from(q.capacity()),
                })
            })
            .collect();
        Model { buckets }
    }

    /// The wait a reservation of `cost` needs after `elapsed_us` more
    /// microseconds, without changing anything.
    fn needed(&self, elapsed_us: u64, cost: u64) -> u64 {
        self.buckets
            .iter()
            .map(|b| {
                let mut b = *b;
                b.advance(elapsed_us);
                b.time_to_hold(cost)
            })
            .max()
            .unwrap_or(0)
    }

    /// Advances time, then reserves `cost` with up to `max_wait_us` of wait:
    /// the states and, when admitted, the wait until the tokens are due; when
    /// refused, the wait it would have needed.
    fn reserve(&mut self, elapsed_us: u64, cost: u64, max_wait_us: u64) -> (Vec<Expected>, u64) {
        for b in &mut self.buckets {
            b.advance(elapsed_us);
        }
        let allowed = self
            .buckets
            .iter()
            .all(|b| b.time_to_hold(cost) <= max_wait_us);
        let wait = if allowed {
            for b in &mut self.buckets {
                b.scaled -= i128::from(cost) * b.q.period_us;
            }
            self.buckets
                .iter()
                .map(|b| {
                    if b.scaled < 0 {
                        ceil(-b.scaled, b.q.tokens)
                    } else {
                        0
                    }
                })
                .max()
                .unwrap_or(0)
                .min(MAX_REPORTED_US)
        } else {
            self.buckets
                .iter()
                .map(|b| b.time_to_hold(cost))
                .max()
                .unwrap_or(0)
                .min(MAX_REPORTED_US)
        };
        let states = self
            .buckets
            .iter()
            .map(|b| b.state(allowed, cost))
            .collect();
        (states, wait)
    }
}

/// The longest wait or reset the stores report (2^53 µs, about 285 years):
/// past it a Lua number is not exact, so both stores report this bound.
const MAX_REPORTED_US: u64 = 1 << 53;

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The longest maximum wait every quota of `quotas` honours exactly.
fn exact_wait_limit(quotas: &[Quota]) -> u64 {
    quotas
        .iter()
        .map(|q| {
            let period_us = q.period().as_micros() as u64;
            let num = q.tokens() / gcd(q.tokens(), period_us);
            u64::try_from(MAX_EXACT / u128::from(num)).unwrap_or(u64::MAX)
        })
        .min()
        .unwrap_or(0)
}

fn quota() -> impl Strategy<Value = Quota> {
    let named = prop_oneof![
        Just(Quota::per_second(7).unwrap()),
        Just(Quota::per_hour(1).unwrap()),
        Just(Quota::per_minute(60).unwrap()),
        Just(Quota::new(3, Duration::from_millis(1500)).unwrap()),
        Just(Quota::per_second(10).unwrap().burst(25).unwrap()),
        Just(Quota::per_hour(1000).unwrap()),
        Just(Quota::per_second(10).unwrap().burst(1).unwrap()),
    ];
    let period = prop_oneof![
        Just(Duration::from_secs(1)),
        Just(Duration::from_secs(60)),
        Just(Duration::from_secs(3600)),
        Just(Duration::from_secs(86_400)),
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
    // Capacity x den close to 2^52: levels and debts at the top of the
    // script's exact range.
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

/// 1 to 3 quotas of distinct periods (a policy's quotas are told apart by
/// their periods).
fn quotas() -> impl Strategy<Value = Vec<Quota>> {
    prop::collection::vec(quota(), 1..=3).prop_map(|mut qs| {
        let mut seen = Vec::new();
        qs.retain(|q| {
            let fresh = !seen.contains(&q.period());
            seen.push(q.period());
            fresh
        });
        qs
    })
}

fn elapsed() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => Just(0u64),
        3 => 0u64..1_000,
        4 => 0u64..2_000_000,
        2 => 0u64..120_000_000,
        1 => 0u64..7_200_000_000,
    ]
}

/// What one step does.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// A plain check (`check_at`).
    Check,
    /// A reservation with this maximum wait.
    Reserve(u64),
    /// A reservation whose maximum wait is the wait it needs, plus this many
    /// microseconds (-1, 0 or 1): the edge of admission.
    AtTheEdge(i8),
}

fn op() -> impl Strategy<Value = Op> {
    let max_wait = prop_oneof![
        2 => Just(0u64),
        2 => 0u64..1_000,
        3 => 0u64..3_000_000,
        2 => 0u64..600_000_000,
        1 => 0u64..7_200_000_000,
    ];
    prop_oneof![
        2 => Just(Op::Check),
        5 => max_wait.prop_map(Op::Reserve),
        2 => (-1i8..=1).prop_map(Op::AtTheEdge),
    ]
}

fn case() -> impl Strategy<Value = (Vec<Quota>, Vec<(u64, u64, Op)>)> {
    quotas().prop_flat_map(|qs| {
        let cap = qs.iter().map(Quota::capacity).min().unwrap_or(1);
        let cost = prop_oneof![
            3 => 0..=cap.min(3),
            2 => 0..=cap,
        ];
        let steps = prop::collection::vec((elapsed(), cost, op()), 1..40);
        (Just(qs), steps)
    })
}

struct Stores {
    server: RedisServer,
    runtime: tokio::runtime::Runtime,
    redis: RedisStore,
    next_key: AtomicU64,
}

enum Failure {
    Mismatch(String),
    Perturbed,
}

/// Runs one case. Keys get TTLs from the case's clock, so a fast quota's key
/// may live only about a second of real time; a case during which Redis
/// expired a key says nothing and is generated again (as in tests/model.rs).
fn run_case(stores: &Stores, quotas: &[Quota], steps: &[(u64, u64, Op)]) -> Result<(), Failure> {
    let expired = stores.server.expired_keys();
    let outcome = compare_stores(stores, quotas, steps);
    let perturbed = stores.server.expired_keys() != expired;
    let _: () = stores.server.cmd(&["FLUSHALL"]);
    match outcome {
        Err(_) if perturbed => Err(Failure::Perturbed),
        other => other.map_err(Failure::Mismatch),
    }
}

fn compare_stores(
    stores: &Stores,
    quotas: &[Quota],
    steps: &[(u64, u64, Op)],
) -> Result<(), String> {
    let policy = Policy::new("reserve", quotas.iter().copied()).map_err(|e| e.to_string())?;
    let key = format!(
        "reserve:{}",
        stores.next_key.fetch_add(1, Ordering::Relaxed)
    );
    let limit = exact_wait_limit(quotas);
    let memory = MemoryStore::new();
    let mut model = Model::new(quotas);
    let mut now = EPOCH_US;
    for (step, &(elapsed, cost, op)) in steps.iter().enumerate() {
        now += elapsed;
        let max_wait = match op {
            Op::Check => None,
            Op::Reserve(w) => Some(w.min(limit)),
            Op::AtTheEdge(delta) => {
                let needed = model.needed(elapsed, cost);
                Some(needed.saturating_add_signed(i64::from(delta)).min(limit))
            }
        };
        let (want, want_wait) = model.reserve(elapsed, cost, max_wait.unwrap_or(0));
        let on = |who: &str, e: Error| format!("{who}, step {step}: {e}");
        match max_wait {
            None => {
                let mem = memory
                    .check_at(&key, &policy, cost, now)
                    .map_err(|e| on("memory", e))?;
                compare("memory check", step, &mem, &want)?;
                let red = stores
                    .runtime
                    .block_on(stores.redis.check_at(&key, &policy, cost, now))
                    .map_err(|e| on("redis", e))?;
                compare("redis check", step, &red, &want)?;
            }
            Some(w) => {
                let w = Duration::from_micros(w);
                let mem = memory
                    .reserve_at(&key, &policy, cost, w, now)
                    .map_err(|e| on("memory", e))?;
                let red = stores
                    .runtime
                    .block_on(stores.redis.reserve_at(&key, &policy, cost, w, now))
                    .map_err(|e| on("redis", e))?;
                for (who, r) in [("memory reserve", &mem), ("redis reserve", &red)] {
                    compare(who, step, r.decision(), &want)?;
                    let got = (r.admitted(), r.wait().as_micros() as u64);
                    let expected = (want[0].allowed, want_wait);
                    if got != expected {
                        return Err(format!(
                            "{who}, step {step} (max wait {w:?}): (admitted, wait) {got:?}, model says {expected:?}"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn both_stores_reserve_as_the_model_does() {
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
    let mut runner = TestRunner::new(Config {
        cases: cases(200),
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

/// `default` cases, or `PROPTEST_CASES` when set (as for every property
/// test): the long run (`scripts/properties.sh`) sets it.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A clock that steps back (a failover to a server whose clock is behind, a
/// reshard between nodes whose clocks differ) leaves buckets stamped ahead of
/// it; their waits count from the stamp. Both stores must still never admit
/// a reservation whose wait is longer than its `max_wait`, and must agree.
#[test]
fn a_clock_stepped_back_never_makes_a_reservation_wait_past_max_wait() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = server.store();
    let next_key = AtomicU64::new(0);
    let step = (
        prop_oneof![3 => 0i64..2_000_000, 2 => -2_000_000i64..0],
        1u64..=3,
        prop_oneof![Just(0u64), 0u64..3_000_000],
    );
    let case = (quota(), prop::collection::vec(step, 1..30));
    let mut runner = TestRunner::new(Config {
        cases: cases(200),
        max_shrink_iters: 2_000,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&case, |(q, steps)| {
        let policy = Policy::from(q);
        let key = format!("back:{}", next_key.fetch_add(1, Ordering::Relaxed));
        let memory = MemoryStore::new();
        let expired = server.expired_keys();
        let mut now = EPOCH_US;
        let mut outcome = Ok(());
        for (i, &(moved, cost, max_wait)) in steps.iter().enumerate() {
            now = now.saturating_add_signed(moved);
            let cost = cost.min(q.capacity());
            let w = Duration::from_micros(max_wait);
            let mem = memory.reserve_at(&key, &policy, cost, w, now).unwrap();
            let red = runtime
                .block_on(redis.reserve_at(&key, &policy, cost, w, now))
                .unwrap();
            for (who, r) in [("memory", &mem), ("redis", &red)] {
                if r.admitted() && r.wait() > w {
                    outcome = Err(format!(
                        "{who}, step {i}: admitted with a wait of {:?}, max wait {w:?}",
                        r.wait()
                    ));
                }
            }
            let got = |r: &tollgate::Reservation| {
                (
                    r.admitted(),
                    r.wait(),
                    r.decision().remaining(),
                    r.decision().retry_after(),
                )
            };
            if outcome.is_ok() && got(&mem) != got(&red) {
                outcome = Err(format!(
                    "step {i}: memory {:?}, redis {:?}",
                    got(&mem),
                    got(&red)
                ));
            }
            if outcome.is_err() {
                break;
            }
        }
        let perturbed = server.expired_keys() != expired;
        let _: () = server.cmd(&["FLUSHALL"]);
        match outcome {
            Err(_) if perturbed => Err(TestCaseError::reject("a key expired in real time")),
            Err(why) => Err(TestCaseError::fail(why)),
            Ok(()) => Ok(()),
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The model itself, on a case worked by hand: it must be able to say no.
#[test]
fn the_model_refuses_what_does_not_fit() {
    // 10 a second, burst 1: a token every 100 ms.
    let q = Quota::per_second(10).unwrap().burst(1).unwrap();
    let mut model = Model::new(&[q]);
    assert_eq!(model.reserve(0, 1, 0).1, 0);
    // The next token is 100 ms away: 99 999 µs is too short, 100 000 fits.
    let (states, wait) = model.reserve(0, 1, 99_999);
    assert!(!states[0].allowed);
    assert_eq!(wait, 100_000);
    let (states, wait) = model.reserve(0, 1, 100_000);
    assert!(states[0].allowed);
    assert_eq!((wait, states[0].reset_after_us), (100_000, 200_000));
    // A third queues behind it.
    assert_eq!(model.reserve(0, 1, 1_000_000).1, 200_000);
}

// ---------------------------------------------------------------------------
// A reservation that cannot fit consumes nothing
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_reservation_that_cannot_fit_consumes_nothing() {
    let server = RedisServer::start();
    let redis = server.store();
    let memory = MemoryStore::new();
    // Two quotas: the per-second one would fit in 300 ms, the hourly one not
    // within the hour: neither may be spent.
    let policy = Policy::new(
        "fit",
        [Quota::per_second(10).unwrap(), Quota::per_hour(12).unwrap()],
    )
    .unwrap();
    let t0 = EPOCH_US;
    let wait = Duration::from_secs(1);
    for i in 0..10 {
        let now = t0 + i;
        assert!(
            redis
                .reserve_at("c", &policy, 1, wait, now)
                .await
                .unwrap()
                .admitted()
        );
        assert!(
            memory
                .reserve_at("c", &policy, 1, wait, now)
                .unwrap()
                .admitted()
        );
    }
    let keys: Vec<String> = policy
        .quotas()
        .iter()
        .map(|q| redis.bucket_key("c", q))
        .collect();
    let stored = |server: &RedisServer| -> Vec<Option<String>> {
        keys.iter().map(|k| server.cmd(&["GET", k])).collect()
    };
    let before = stored(&server);
    let now = t0 + 20;
    let peek_mem = memory.check_at("c", &policy, 0, now).unwrap();
    // 3 tokens: the per-second quota has none (due in 300 ms, within the
    // second), the hourly one has 2 left and needs 5 minutes for the third.
    let mem = memory.reserve_at("c", &policy, 3, wait, now).unwrap();
    let red = redis.reserve_at("c", &policy, 3, wait, now).await.unwrap();
    for r in [&mem, &red] {
        assert!(!r.admitted());
        // The wait it would have needed: the hourly quota's 5 minutes.
        assert_eq!(
            r.wait(),
            Duration::from_secs(300) - Duration::from_micros(20)
        );
        assert_eq!(r.decision().retry_after(), r.wait());
    }
    assert_eq!(mem, red);
    assert_eq!(
        stored(&server),
        before,
        "a refused reservation wrote to Redis"
    );
    assert_eq!(memory.check_at("c", &policy, 0, now).unwrap(), peek_mem);
    // And what would fit still does, exactly as if nothing had been asked.
    let later = now + 100_000;
    let mem = memory.reserve_at("c", &policy, 1, wait, later).unwrap();
    let red = redis
        .reserve_at("c", &policy, 1, wait, later)
        .await
        .unwrap();
    assert!(mem.admitted() && red.admitted());
    assert_eq!(mem, red);
}

// ---------------------------------------------------------------------------
// Waiters are served in arrival order, across instances
// ---------------------------------------------------------------------------

/// Two limiters (two stores, two connections) on one Redis, reserving in
/// turn from one key: the tokens come due one interval apart in the order
/// the reservations reached Redis, whichever instance made them. Explicit
/// clocks make every due instant exact.
#[tokio::test]
async fn waiters_are_served_in_arrival_order_across_two_instances() {
    let server = RedisServer::start();
    let (a, b) = (server.store(), server.store());
    // 10 a second, bursts of 2: a token every 100 ms.
    let policy = Policy::from(Quota::per_second(10).unwrap().burst(2).unwrap());
    let interval = 100_000;
    let mut dues = Vec::new();
    let mut now = EPOCH_US;
    for i in 0..12u64 {
        let store = if i % 2 == 0 { &a } else { &b };
        let r = store
            .reserve_at("queue", &policy, 1, Duration::from_secs(5), now)
            .await
            .unwrap();
        assert!(r.admitted(), "reservation {i}");
        dues.push(now + r.wait().as_micros() as u64);
        // The next caller arrives 7 ms later, well before its token.
        now += 7_000;
    }
    // The burst of 2 is due at once; then one token every 100 ms, first
    // reserved first served.
    let expected: Vec<u64> = (0..12u64)
        .map(|i| match i {
            0 | 1 => EPOCH_US + 7_000 * i,
            _ => EPOCH_US + (i - 1) * interval,
        })
        .collect();
    assert_eq!(dues, expected);
}

/// The same with Redis's own clock and real calls: `reserve` through two
/// `RateLimiter`s in turn. Waits grow in call order, and each reservation is
/// due one interval after the one before it, within what the calls took.
#[tokio::test]
async fn real_time_reservations_from_two_limiters_queue_in_call_order() {
    let server = RedisServer::start();
    // A token every 500 ms: waits grow as long as consecutive reservations
    // come less than that apart, which a busy machine keeps easily.
    let policy = Policy::from(Quota::per_second(2).unwrap().burst(1).unwrap());
    let a = RateLimiter::new(server.store(), policy.clone());
    let b = RateLimiter::new(server.store(), policy);
    // Both connected, with the script loaded, before the first reservation.
    for limiter in [&a, &b] {
        let _ = limiter.check("warm", 1).await.unwrap();
    }
    let start = Instant::now();
    let mut seen = Vec::new();
    for i in 0..10 {
        let limiter = if i % 2 == 0 { &a } else { &b };
        let before = start.elapsed();
        let r = limiter
            .reserve("queue", 1, Duration::from_secs(5))
            .await
            .unwrap();
        let after = start.elapsed();
        assert!(r.admitted());
        seen.push((before, after, r.wait()));
    }
    println!("(sent, answered, wait) of each reservation: {seen:?}");
    for pair in seen.windows(2) {
        let ((b0, a0, w0), (b1, a1, w1)) = (pair[0], pair[1]);
        assert!(w1 > w0, "waits must grow in call order: {seen:?}");
        // Each is due (Redis's clock at the call, plus the wait) exactly one
        // interval after the one before. The call's instant lies between
        // sending and answering, so that is all the slack there is (1 ms for
        // rounding between the two clocks).
        let interval = Duration::from_millis(500);
        let slack = Duration::from_millis(1);
        assert!(a1 + w1 + slack >= b0 + w0 + interval, "{seen:?}");
        assert!(b1 + w1 <= a0 + w0 + interval + slack, "{seen:?}");
    }
}

// ---------------------------------------------------------------------------
// acquire: one store call per admitted wait
// ---------------------------------------------------------------------------

/// `calls` of the commands that reach Redis from outside: the script calls.
/// The commands the script runs inside (TIME, GET, SET, and PUBLISH while
/// the server has no epoch) are counted apart.
fn script_calls(server: &RedisServer) -> BTreeMap<String, u64> {
    server
        .all_calls()
        .into_iter()
        .filter(|(name, _)| !matches!(name.as_str(), "time" | "get" | "set" | "publish"))
        .collect()
}

#[tokio::test]
async fn acquire_makes_one_store_call_per_admitted_wait() {
    let server = RedisServer::start();
    // 20 a second, burst 1: each acquire after the first waits 50 ms.
    let limiter = RateLimiter::new(
        server.store(),
        Quota::per_second(20).unwrap().burst(1).unwrap(),
    );
    let _ = limiter.check("warm", 1).await.unwrap();
    server.reset_stats();
    const N: u64 = 6;
    let start = Instant::now();
    let mut admitted_at = Vec::new();
    for _ in 0..N {
        let d = limiter
            .acquire("k", 1, Duration::from_secs(2))
            .await
            .unwrap();
        assert!(d.allowed());
        admitted_at.push(start.elapsed());
    }
    let elapsed = start.elapsed();
    println!("acquire x{N} at 20/s: admitted at {admitted_at:?}");
    assert_eq!(
        script_calls(&server),
        BTreeMap::from([("evalsha".to_string(), N)]),
        "one script call per acquire, no polling"
    );
    // One decision per acquire inside Redis too: one TIME and one GET each,
    // and a GET of the server's epoch key.
    assert_eq!(server.calls("time"), N);
    assert_eq!(server.calls("get"), 2 * N);
    // The first is admitted at once, the next five 50 ms apart: at least
    // 250 ms in all (the waits come from Redis's clock; 1 ms for the two
    // clocks' rounding), and not absurdly more.
    assert!(elapsed >= Duration::from_millis(249), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");

    // A wait beyond max_wait: refused at once, in one call, spending nothing.
    // On a bucket of one a minute, drained first: its next token is a minute
    // away, however long the commands in between take.
    let limiter = RateLimiter::new(limiter.store().clone(), Quota::per_minute(1).unwrap());
    assert!(limiter.check("k", 1).await.unwrap().allowed());
    server.reset_stats();
    let stored = |server: &RedisServer| -> Option<String> {
        let key = limiter
            .store()
            .as_redis()
            .unwrap()
            .bucket_key("default:k", &limiter.quotas()[0]);
        server.cmd(&["GET", &key])
    };
    let before = stored(&server);
    assert!(before.is_some(), "no bucket where the limiter keeps it");
    let refused_at = Instant::now();
    let err = limiter
        .acquire("k", 1, Duration::from_millis(1))
        .await
        .unwrap_err();
    let took = refused_at.elapsed();
    let Error::WaitTooLong { retry_after } = err else {
        panic!("{err:?}");
    };
    println!("refused in {took:?}, would have waited {retry_after:?}");
    assert!(retry_after > Duration::from_millis(1));
    assert_eq!(
        script_calls(&server),
        BTreeMap::from([("evalsha".to_string(), 1)])
    );
    assert_eq!(stored(&server), before);
}

/// Concurrent acquirers on two instances: every one is admitted, each after
/// one reservation (batched calls may carry several, but there is exactly
/// one decision per acquirer), and never more than the bucket allows by any
/// instant.
#[tokio::test]
async fn concurrent_acquirers_on_two_instances_decide_once_each() {
    let server = RedisServer::start();
    let policy = Policy::from(Quota::per_second(20).unwrap().burst(2).unwrap());
    let limiters = [
        RateLimiter::new(server.store(), policy.clone()),
        RateLimiter::new(server.store(), policy),
    ];
    server.reset_stats();
    const N: usize = 16;
    let start = Instant::now();
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let limiter = limiters[i % 2].clone();
            tokio::spawn(async move {
                let d = limiter.acquire("shared", 1, Duration::from_secs(5)).await;
                (d.map(|d| d.allowed()).unwrap_or(false), start.elapsed())
            })
        })
        .collect();
    let mut admitted = Vec::new();
    for task in tasks {
        let (ok, at) = task.await.unwrap();
        assert!(ok);
        admitted.push(at);
    }
    admitted.sort();
    println!("{N} acquirers at 20/s, burst 2, admitted at {admitted:?}");
    // One GET of a bucket per acquirer, and of the epoch key per call.
    assert_eq!(
        server.calls("get"),
        N as u64 + server.calls("evalsha"),
        "one decision per acquirer"
    );
    assert!(server.calls("evalsha") <= N as u64);
    // By the k-th admission (0-based), at most 2 + 20/s x elapsed tokens had
    // been handed out: admission k is at least (k - 1) x 50 ms after the
    // first call (1 ms for clock rounding).
    for (k, at) in admitted.iter().enumerate() {
        let due = Duration::from_millis(50) * (k as u32).saturating_sub(1);
        assert!(
            *at + Duration::from_millis(1) >= due,
            "admission {k} at {at:?}, before its token at {due:?}"
        );
    }
}
