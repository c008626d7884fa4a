//! Both stores against an independent model of the token bucket.
//!
//! The model below is written from the definition, not from `src/store/bucket.rs`:
//! a bucket's level is an exact rational number of tokens,
//! `level(t) = min(capacity, level(t0) + (t - t0) * tokens / period)`, where
//! `t0` is the last time a check spent from it. A check of cost `c` admits
//! iff every quota holds at least `c`; admitting subtracts `c` from all of
//! them, a denial or a peek changes nothing. A clock that goes back refills
//! nothing: a check uses the later of its clock and `t0`, and the waits it
//! reports count from that later time. A quota may have a lock-out: a check
//! it refuses itself (its bucket lacks the cost) while not locked out moves
//! its bucket to hold exactly the cost at the lock-out's end, when that is
//! later than the cost would refill, and until that end the bucket admits
//! nothing, reports nothing remaining and counts its waits from the end (a
//! bucket counted from a later time, by a clock that went back, is locked
//! out the same way). The model keeps the level as a `u128`
//! numerator over the period in microseconds (no reduction, no shared code
//! with the engine), so any rounding in the engine shows up as a mismatch.
//!
//! Three runs compare every field of every quota state after every step:
//!
//! - **explicit clock** (cargo feature `test-util`): generated (time step,
//!   cost) sequences, with steps back in time too, against
//!   `MemoryStore::check_at`, `RedisStore::check_at` and the model;
//! - **Redis `TIME`**, the production path: `RedisStore::check` with real
//!   sleeps between steps. The test reads Redis `TIME` before and after each
//!   call, so the script's clock lies in that interval; the answer must be the
//!   model's at some time in it, and after an admission the stamp the script
//!   stored says exactly when, so the model follows the store step by step;
//! - **tokio's paused clock** (with `test-util`): `MemoryStore::check` (its production clock) with
//!   the clock advanced by exact microseconds.
#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::RedisServer;
use support::model::{Expected, compare};
use tollgate::{MemoryStore, Policy, Quota, Store};

/// One quota as the model sees it: `tokens` per `period_us`, bucket `capacity`.
#[derive(Clone, Copy, Debug)]
struct ModelQuota {
    tokens: u128,
    period_us: u128,
    capacity: u128,
    /// The lock-out in microseconds (0: none).
    lockout_us: u128,
}

/// One bucket: `scaled / period_us` tokens at the microsecond `stamp` (the last
/// spend), exactly; a bucket never spent from is full. Negative after a
/// charge into debt.
#[derive(Clone, Copy, Debug)]
struct ModelBucket {
    q: ModelQuota,
    scaled: i128,
    stamp: Option<u128>,
    /// The quota the bucket was last written under: `q` until the quota
    /// changes to other figures of its period; the first check after that
    /// carries the bucket into `q`.
    kept: ModelQuota,
}

/// The longest wait or reset the stores report (2^53 µs, about 285 years):
/// past it a Lua number is not exact, so both stores report this bound.
const MAX_REPORTED_US: u64 = 1 << 53;

fn ceil(a: u128, b: u128) -> u64 {
    u64::try_from(a.div_ceil(b)).expect("fits in u64")
}

impl ModelBucket {
    fn full(q: ModelQuota) -> Self {
        ModelBucket {
            q,
            scaled: (q.capacity * q.period_us) as i128,
            stamp: None,
            kept: q,
        }
    }

    /// The time a check at `now` counts from and the level then, in `q`'s
    /// terms: a bucket kept under other figures is refilled under them up
    /// to that time, then carried into `q` (see [`carry`]).
    fn read(&self, now: u128) -> (u128, i128) {
        let t = self.time(now);
        if self.stamp.is_none() || same_figures(self.kept, self.q) {
            return (t, self.level(t));
        }
        let kept = ModelBucket {
            q: self.kept,
            ..*self
        };
        (t, carry(kept.level(t), self.kept, self.q))
    }

    fn cap(&self) -> i128 {
        (self.q.capacity * self.q.period_us) as i128
    }

    /// The time a check at `now` counts from: `now`, or the last spend if the
    /// clock is behind it.
    fn time(&self, now: u128) -> u128 {
        self.stamp.map_or(now, |s| s.max(now))
    }

    /// The level at `t` (not before the stamp): `+ (t - stamp) * tokens /
    /// period`, capped at the capacity.
    fn level(&self, t: u128) -> i128 {
        match self.stamp {
            None => self.cap(),
            Some(s) => (self.scaled + ((t - s) * self.q.tokens) as i128).min(self.cap()),
        }
    }

    /// When the bucket is full again (`None`: it has never been spent from).
    fn full_at(&self) -> Option<u128> {
        self.stamp
            .map(|s| s + u128::from(ceil((self.cap() - self.scaled) as u128, self.q.tokens)))
    }

    /// remaining = floor(level); retry_after = ceil((cost - level) / rate) when the
    /// check was denied and this bucket lacks tokens; reset_after =
    /// ceil((capacity - level) / rate); both plus `ahead`, the time from the
    /// check's clock to the time it counts from. The rate is tokens / period
    /// per µs, so `(x - level) / rate` is `(x * period - scaled) / tokens`.
    ///
    /// A locked-out bucket (counted from a later time, with a lock-out)
    /// reports nothing remaining and, refused, waits at least until then.
    fn state(&self, level: i128, allowed: bool, cost: u128, ahead: u128) -> Expected {
        let q = self.q;
        let locked = q.lockout_us > 0 && ahead > 0;
        let ahead = u64::try_from(ahead).expect("fits");
        let need = (cost * q.period_us) as i128;
        let retry_after_us = if allowed || (level >= need && !locked) {
            0
        } else {
            (ahead + ceil((need - level).max(0) as u128, q.tokens)).min(MAX_REPORTED_US)
        };
        let to_full = ceil((self.cap() - level) as u128, q.tokens);
        let remaining = match locked {
            true => 0,
            false => u64::try_from(level.max(0) as u128 / q.period_us).expect("fits"),
        };
        Expected {
            allowed,
            remaining,
            retry_after_us,
            reset_after_us: if to_full == 0 && !locked {
                0
            } else {
                (ahead + to_full).min(MAX_REPORTED_US)
            },
        }
    }
}

fn model_quota(q: &Quota) -> ModelQuota {
    ModelQuota {
        tokens: u128::from(q.tokens()),
        period_us: q.period().as_micros(),
        capacity: u128::from(q.capacity()),
        lockout_us: q.lockout_time().map_or(0, |t| t.as_micros()),
    }
}

fn same_figures(a: ModelQuota, b: ModelQuota) -> bool {
    (a.tokens, a.period_us, a.capacity) == (b.tokens, b.period_us, b.capacity)
}

/// Whether two quotas of one period count a bucket in the same units: the
/// same full bucket and refill a microsecond (1/den token each, den =
/// period / gcd(tokens, period)), as the stores keep them. `5/min` and
/// `60/min` do: a bucket under one is the other's as it is, and a change
/// between them carries nothing.
fn same_units(a: ModelQuota, b: ModelQuota) -> bool {
    let units = |q: ModelQuota| {
        let g = gcd(q.tokens as u64, q.period_us as u64) as u128;
        (q.period_us, q.capacity * q.period_us / g, q.tokens / g)
    };
    units(a) == units(b)
}

/// A level (in 1/period tokens) of a bucket of `from` carried into `to`, a
/// quota of the same period: the same share of the capacity, floored to
/// the unit the stores count `to` in (1/den token, den = period / gcd(tokens,
/// period)): exactly while the product of the level in `from`'s units and
/// the ratio's numerator (in lowest terms) is within 2^52 of zero, else by
/// the double arithmetic the script does, less two units; never below
/// -2^52 units.
fn carry(scaled: i128, from: ModelQuota, to: ModelQuota) -> i128 {
    let unit = |q: ModelQuota| gcd(q.tokens as u64, q.period_us as u64) as i128;
    let full = |q: ModelQuota| q.capacity as i128 * q.period_us as i128 / unit(q);
    let (full_from, full_to) = (full(from), full(to));
    let level = scaled.min(from.capacity as i128 * from.period_us as i128) / unit(from);
    let g = gcd(full_from as u64, full_to as u64) as i128;
    let (n, d) = (full_to / g, full_from / g);
    let exact = 1i128 << 52;
    let units = if (level * n).abs() <= exact {
        (level * n).div_euclid(d)
    } else {
        ((level as f64) * (n as f64) / (d as f64)).floor() as i128 - 2
    };
    units.clamp(-exact, full_to) * unit(to)
}

/// The model of one client's buckets over several quotas.
#[derive(Clone, Debug)]
struct Model {
    buckets: Vec<ModelBucket>,
}

impl Model {
    fn new(quotas: &[Quota]) -> Self {
        let buckets = quotas
            .iter()
            .map(|q| ModelBucket::full(model_quota(q)))
            .collect();
        Model { buckets }
    }

    /// Decides `cost` at the clock `now` against every quota, all or nothing;
    /// an admission of a positive cost spends and moves the stamps, a
    /// refusal locks out the buckets with a lock-out that refused it.
    fn check(&mut self, now: u64, cost: u64) -> Vec<Expected> {
        let (now, cost) = (u128::from(now), u128::from(cost));
        let read: Vec<(u128, i128)> = self.buckets.iter().map(|b| b.read(now)).collect();
        let mut times: Vec<u128> = read.iter().map(|&(t, _)| t).collect();
        let mut levels: Vec<i128> = read.iter().map(|&(_, l)| l).collect();
        // A check (not a peek) writes buckets carried into other units.
        let carried = cost > 0
            && self
                .buckets
                .iter()
                .any(|b| b.stamp.is_some() && !same_units(b.kept, b.q));
        let allowed = self
            .buckets
            .iter()
            .zip(&levels)
            .zip(&times)
            .all(|((b, &l), &t)| {
                l >= (cost * b.q.period_us) as i128 && !(b.q.lockout_us > 0 && t > now)
            });
        let mut locked = false;
        if !allowed && cost > 0 {
            for ((b, l), t) in self.buckets.iter_mut().zip(&mut levels).zip(&mut times) {
                let need = (cost * b.q.period_us) as i128;
                // Locked out until the cost is back at the end, if it would
                // be back sooner without.
                let sooner = ((need - *l).max(0) as u128) <= b.q.lockout_us * b.q.tokens;
                if b.q.lockout_us > 0 && *t == now && *l < need && sooner {
                    *l = need.min(b.cap());
                    *t = now + b.q.lockout_us;
                    locked = true;
                }
            }
        }
        // A refusal that locks a bucket out stores every bucket as it is
        // at the time it counts from, and so does one that carried a bucket.
        if locked || (carried && !allowed) {
            for ((b, &l), &t) in self.buckets.iter_mut().zip(&levels).zip(&times) {
                b.scaled = l;
                b.stamp = Some(t);
                b.kept = b.q;
            }
        }
        if allowed {
            for (b, l) in self.buckets.iter().zip(levels.iter_mut()) {
                *l -= (cost * b.q.period_us) as i128;
            }
            if cost > 0 {
                for ((b, &l), &t) in self.buckets.iter_mut().zip(&levels).zip(&times) {
                    b.scaled = l;
                    b.stamp = Some(t);
                    b.kept = b.q;
                }
            }
        }
        self.buckets
            .iter()
            .zip(levels)
            .zip(times)
            .map(|((b, l), t)| b.state(l, allowed, cost, t - now))
            .collect()
    }

    /// An adjustment after the fact at `now`: `delta` tokens spent from
    /// every bucket (a charge) or, negative, given back (a refund), whatever
    /// they hold; each bucket stays between minus its capacity and its
    /// capacity. The stamps move to the time it counts from, except on a
    /// bucket never spent from that ends full (nothing is stored).
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    fn adjust(&mut self, now: u64, delta: i64) {
        // Nothing to settle: nothing is written.
        if delta == 0 {
            return;
        }
        let now = u128::from(now);
        for b in &mut self.buckets {
            let (t, level) = b.read(now);
            let carried = b.stamp.is_some() && !same_figures(b.kept, b.q);
            let moved = level - i128::from(delta) * b.q.period_us as i128;
            // Clamped, never against the adjustment (a debt deeper than the
            // capacity, carried from a smaller one, stays through a charge).
            let level = if delta > 0 {
                moved.max(-b.cap()).min(level)
            } else {
                moved.min(b.cap()).max(level)
            };
            // A bucket never spent from that ends full stays as it was.
            if b.stamp.is_none() && level == b.cap() {
                continue;
            }
            // A bucket kept under other figures is carried back into them
            // and stays under them: an adjustment is not a check.
            if carried {
                b.scaled = carry(level, b.q, b.kept);
                b.stamp = Some(t);
                continue;
            }
            b.scaled = level;
            b.stamp = Some(t);
            b.kept = b.q;
        }
    }

    /// What the check at `now` would answer, without changing the model.
    fn peek(&self, now: u64, cost: u64) -> Vec<Expected> {
        self.clone().check(now, cost)
    }

    /// Changes every quota to `quotas` (the same periods, in order): the
    /// buckets are carried at their next check.
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    fn change(&mut self, quotas: &[Quota]) {
        for (b, q) in self.buckets.iter_mut().zip(quotas) {
            b.q = model_quota(q);
            if b.stamp.is_none() {
                b.kept = b.q;
            }
        }
    }

    /// Forgets bucket `i` (its store key expired): it is full again.
    fn forget(&mut self, i: usize) {
        self.buckets[i] = ModelBucket::full(self.buckets[i].q);
    }
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
    // Some with a lock-out: short (microseconds to seconds) or 15 minutes.
    let lockout = prop_oneof![
        6 => Just(0u64),
        1 => 1u64..5_000_000,
        1 => Just(900_000_000u64),
    ];
    (prop_oneof![3 => named, 3 => random, 1 => extreme], lockout).prop_map(|(q, us)| match us {
        0 => q,
        us => q.lockout(Duration::from_micros(us)).unwrap_or(q),
    })
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
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

/// Time steps from "the same microsecond" up to two hours, so buckets are seen
/// empty, partly refilled, exactly refilled and overfull; and steps back (a
/// failover to a server whose clock is behind), small and large.
fn elapsed() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => Just(0i64),
        3 => 0i64..1_000,
        4 => 0i64..2_000_000,
        2 => 0i64..120_000_000,
        1 => 0i64..7_200_000_000,
        1 => -2_000_000i64..0,
        1 => -7_200_000_000i64..0,
    ]
}

fn case() -> impl Strategy<Value = (Vec<Quota>, Vec<(i64, u64)>)> {
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

/// A step of a case with adjustments: a check of a cost, or an adjustment
/// of `delta` tokens (negative: a refund), followed by a peek.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
enum Step {
    Check(u64),
    Adjust(i64),
    /// Every quota changed to other figures of its period, drawn from the
    /// seed (see [`changed`]).
    Change(u64),
}

/// `quotas` changed to other figures of their periods, drawn from `seed`:
/// tokens and burst as people change them, sometimes a capacity at the top
/// of the exact range (so carrying meets its inexact path); a quota whose
/// draw cannot be made stays as it was. Lock-outs stay.
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
fn changed(quotas: &[Quota], seed: u64) -> Vec<Quota> {
    let mut x = seed;
    let mut next = || {
        // splitmix64
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    quotas
        .iter()
        .map(|q| {
            let (a, b) = (next(), next());
            let tokens = 1 + a % 1_000;
            let period = q.period();
            let made = Quota::new(tokens, period).ok().and_then(|new| match b % 4 {
                0 => Some(new),
                1 | 2 => new.burst(1 + b / 4 % 2_000).ok(),
                _ => {
                    let us = u64::try_from(period.as_micros()).ok()?;
                    let den = us / gcd(tokens, us);
                    new.burst(((1u64 << 52) / den).checked_sub(b / 4 % 1_000)?)
                        .ok()
                }
            });
            let made = made.unwrap_or(*q);
            match q.lockout_time() {
                Some(time) => made.lockout(time).unwrap_or(*q),
                None => made,
            }
        })
        .collect()
}

/// As [`adjusted_case`], with quota changes (raised, lowered, back).
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
fn changed_case() -> impl Strategy<Value = (Vec<Quota>, Vec<(i64, Step)>)> {
    quotas().prop_flat_map(|qs| {
        // Costs within every figure a change may draw: 1 token at least.
        let step = prop_oneof![
            4 => (0..=1u64).prop_map(Step::Check),
            1 => (-1i64..=2).prop_map(Step::Adjust),
            2 => any::<u64>().prop_map(Step::Change),
        ];
        let steps = prop::collection::vec((elapsed(), step), 1..40);
        (Just(qs), steps)
    })
}

/// As [`case`], with refunds of up to the largest cost and charges of up to
/// twice the largest capacity (so the clamp at minus the capacity is met).
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
fn adjusted_case() -> impl Strategy<Value = (Vec<Quota>, Vec<(i64, Step)>)> {
    quotas().prop_flat_map(|qs| {
        let cap = qs.iter().map(Quota::capacity).min().unwrap_or(1);
        let most = qs.iter().map(Quota::capacity).max().unwrap_or(1);
        let most = i64::try_from(most.min(1 << 40)).unwrap_or(1 << 40);
        let small = i64::try_from(cap.min(3)).unwrap_or(3);
        let step = prop_oneof![
            3 => (0..=cap.min(3)).prop_map(Step::Check),
            2 => (0..=cap).prop_map(Step::Check),
            2 => (-small..=small).prop_map(Step::Adjust),
            1 => (-most..=2 * most).prop_map(Step::Adjust),
        ];
        let steps = prop::collection::vec((elapsed(), step), 1..40);
        (Just(qs), steps)
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// [`runner`] of `cases`, or of `PROPTEST_CASES` when set (as for every
/// property test): for the runs without real sleeps.
fn scaled_runner(cases: u32) -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    runner(cases)
}

/// Fails the property when more than 1 case in 20 was rejected: a run that
/// rejects most of its cases would pass while checking almost nothing.
fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        max_global_rejects: cases / 20,
        max_shrink_iters: 2_000,
        failure_persistence: None,
        ..Config::default()
    })
}

/// The explicit-clock run: both stores' `check_at`, which exists only with
/// the `test-util` feature.
#[cfg(feature = "test-util")]
mod explicit_clock {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use tollgate::{Error, RedisStore};

    /// A realistic Redis clock (microseconds since the epoch, November 2025), so
    /// the script's arithmetic runs on numbers of the size production sends.
    const EPOCH_US: u64 = 1_763_000_000_000_000;

    struct Stores {
        server: RedisServer,
        runtime: tokio::runtime::Runtime,
        redis: RedisStore,
        next_key: AtomicU64,
    }

    /// Why a case failed: a mismatch, or a real-time key expiry that makes the
    /// case say nothing.
    enum Failure {
        Mismatch(String),
        Perturbed,
    }

    /// Runs one case. The script sets each key's TTL from the clock it is
    /// given, so a fast quota's key lives about a second of real time: a stall
    /// that long in the middle of a case lets Redis expire it and start a fresh
    /// bucket. Such a case is rejected (and regenerated) rather than failed, at
    /// most one in 20 (see [`runner`]); the keys are deleted after every case so
    /// no earlier case's key can expire during a later one.
    fn run_case(stores: &Stores, quotas: &[Quota], steps: &[(i64, Step)]) -> Result<(), Failure> {
        let expired = stores.server.expired_keys();
        let outcome = compare_stores(stores, quotas, steps);
        let perturbed = stores.server.expired_keys() != expired;
        let _: () = stores.server.cmd(&["FLUSHALL"]);
        match outcome {
            Err(_) if perturbed => Err(Failure::Perturbed),
            other => other.map_err(Failure::Mismatch),
        }
    }

    fn stores() -> Stores {
        let server = RedisServer::start();
        Stores {
            redis: server.store(),
            server,
            runtime: runtime(),
            next_key: AtomicU64::new(0),
        }
    }

    /// Runs `cases` on fresh stores; a case a real-time expiry disturbed is
    /// rejected (see [`run_case`]).
    fn run_cases(cases: impl Strategy<Value = (Vec<Quota>, Vec<(i64, Step)>)>) {
        let stores = stores();
        // About 200 cases of up to 40 steps: a few seconds even on a busy machine.
        let result = scaled_runner(200).run(&cases, |(quotas, steps)| {
            run_case(&stores, &quotas, &steps).map_err(|f| match f {
                Failure::Mismatch(why) => TestCaseError::fail(why),
                Failure::Perturbed => TestCaseError::reject("a key expired in real time"),
            })
        });
        if let Err(e) = result {
            panic!("{e}");
        }
    }

    #[test]
    fn both_stores_agree_with_the_model() {
        run_cases(case().prop_map(|(quotas, steps)| {
            let steps = steps.into_iter().map(|(e, cost)| (e, Step::Check(cost)));
            (quotas, steps.collect())
        }));
    }

    /// Checks interleaved with refunds and charges (the layer's `settle`,
    /// `RateLimiter::refund` and `charge`): after every adjustment both
    /// stores' buckets, peeked, are the model's, and every check after it is
    /// decided as the model decides, debt included.
    /// Quotas raised, lowered and changed back while a client spends: each
    /// bucket is carried into the new figures (the share spent stays spent)
    /// alike by both stores and the model.
    #[test]
    fn both_stores_agree_with_the_model_across_quota_changes() {
        run_cases(changed_case());
    }

    #[test]
    fn both_stores_agree_with_the_model_through_refunds_and_charges() {
        run_cases(adjusted_case());
    }

    /// A case 20 000 generated cases found (`PROPTEST_CASES=20000`): a
    /// bucket charged down to its debt bound, whose clock steps back, is
    /// full again past 2^53 µs. The script's doubles rounded that reset to
    /// the even microsecond above; every store now reports 2^53 for it.
    #[test]
    fn a_reset_past_two_to_the_53_is_reported_at_the_bound() {
        let quotas = [
            Quota::new(248_521, Duration::from_micros(42_600_227_215))
                .unwrap()
                .burst(26_273_076_921)
                .unwrap(),
            Quota::per_second(10).unwrap().burst(25).unwrap(),
        ];
        let steps = [
            (0, Step::Check(1)),
            (-319_344_584, Step::Check(0)),
            (745, Step::Adjust(6_988_664_198)),
            (1_035_164, Step::Adjust(45_557_489_513)),
        ];
        let stores = stores();
        if let Err(Failure::Mismatch(why)) = run_case(&stores, &quotas, &steps) {
            panic!("{why}");
        }
    }

    /// A case 20 000 generated cases found (`PROPTEST_CASES=20000`, at
    /// 8c2448f): a quota with a lock-out, locked, changed twice while the
    /// clock stepped back.
    #[test]
    fn a_locked_bucket_changed_twice_under_a_clock_that_stepped_back() {
        let quotas = [
            Quota::per_minute(5).unwrap(),
            Quota::new(3, Duration::from_millis(1_500))
                .unwrap()
                .lockout(Duration::from_secs(15 * 60))
                .unwrap(),
        ];
        let steps = [
            (0, Step::Check(1)),
            (0, Step::Check(1)),
            (0, Step::Check(1)),
            (0, Step::Check(1)),
            (191_212, Step::Change(15_864_904_544_398_607_910)),
            (-2, Step::Check(1)),
            (-123_670, Step::Check(0)),
            (0, Step::Change(108_683_213_897_871)),
        ];
        let stores = stores();
        if let Err(Failure::Mismatch(why)) = run_case(&stores, &quotas, &steps) {
            panic!("{why}");
        }
    }

    /// Runs `steps` on both stores and the model, comparing every decision.
    fn compare_stores(
        stores: &Stores,
        quotas: &[Quota],
        steps: &[(i64, Step)],
    ) -> Result<(), String> {
        let mut policy = Policy::new("model", quotas.iter().copied()).map_err(|e| e.to_string())?;
        let id = stores.next_key.fetch_add(1, Ordering::Relaxed);
        let key = format!("model:{id}");
        let memory = MemoryStore::new();
        let mut model = Model::new(quotas);
        let mut now = EPOCH_US;
        for (step, &(elapsed, op)) in steps.iter().enumerate() {
            now = now.checked_add_signed(elapsed).expect("clock in range");
            let cost = match op {
                Step::Check(cost) => cost,
                Step::Change(seed) => {
                    let quotas = changed(policy.quotas(), seed);
                    model.change(&quotas);
                    policy = Policy::new("model", quotas).map_err(|e| e.to_string())?;
                    0
                }
                Step::Adjust(delta) => {
                    model.adjust(now, delta);
                    memory.adjust_at(&key, &policy, delta, now);
                    stores
                        .runtime
                        .block_on(stores.redis.adjust_at(&key, &policy, delta, now))
                        .map_err(|e| format!("redis adjust, step {step}: {e}"))?;
                    0
                }
            };
            let want = model.check(now, cost);
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

    /// A cost above any quota's capacity is refused by both stores the same way,
    /// before anything is stored.
    #[test]
    fn both_stores_refuse_impossible_costs_alike() {
        let server = RedisServer::start();
        let runtime = runtime();
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
        let runtime = runtime();
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
}

// ---------------------------------------------------------------------------
// The production path: Redis TIME
// ---------------------------------------------------------------------------

/// Quotas that refill within the milliseconds a case sleeps (one token per
/// millisecond up to one every 150 ms), and a few slow ones.
fn live_quota() -> impl Strategy<Value = Quota> {
    prop_oneof![
        Just(Quota::per_second(1_000).unwrap().burst(5).unwrap()),
        Just(Quota::per_second(100).unwrap().burst(3).unwrap()),
        Just(Quota::new(7, Duration::from_millis(50)).unwrap()),
        Just(
            Quota::new(3, Duration::from_millis(450))
                .unwrap()
                .burst(4)
                .unwrap()
        ),
        Just(Quota::per_second(7).unwrap()),
        Just(Quota::per_minute(60).unwrap().burst(2).unwrap()),
        Just(Quota::per_hour(1000).unwrap()),
        (1u64..=50, 1u64..=300)
            .prop_map(|(tokens, ms)| { Quota::new(tokens, Duration::from_millis(ms)).unwrap() }),
    ]
}

/// 1 or 2 live quotas of distinct periods and up to 20 (sleep µs, cost)
/// steps.
fn live_case() -> impl Strategy<Value = (Vec<Quota>, Vec<(u64, u64)>)> {
    prop::collection::vec(live_quota(), 1..=2)
        .prop_map(|mut qs| {
            qs.dedup_by_key(|q| q.period());
            qs
        })
        .prop_flat_map(|qs| {
            let cap = qs.iter().map(Quota::capacity).min().unwrap_or(1);
            let sleep = prop_oneof![3 => Just(0u64), 2 => 0u64..2_000, 1 => 0u64..30_000];
            let cost = prop_oneof![3 => 0..=cap.min(2), 1 => 0..=cap];
            (Just(qs), prop::collection::vec((sleep, cost), 1..20))
        })
}

/// The stamp of a bucket key (`level:stamp:full,num`), if the key exists.
fn stored_stamp(server: &RedisServer, key: &str) -> Option<u64> {
    let value: Option<String> = server.cmd(&["GET", key]);
    value.map(|v| {
        let stamp = v.split(':').nth(1).expect("level:stamp");
        stamp.parse().expect("integer stamp")
    })
}

/// One case on the production path; see the module docs. `Err` is a mismatch.
/// Script calls (`EVALSHA`, `EVAL`) the server has run.
fn script_calls(server: &RedisServer) -> u64 {
    server.calls("evalsha") + server.calls("eval")
}

/// One case on the production path; see the module docs. `Err` is a mismatch.
///
/// With `deny_cache`, a check the store answered without Redis (no script
/// call during it) is a cached denial. The model cannot say when exactly it
/// was decided, but it can say what the cache must never do: deny what Redis
/// would admit (the model admits at `lo`, so at every later time too), or
/// report a longer wait than Redis would (the model's wait at `lo`, the
/// longest in the interval).
fn live_case_run(
    server: &RedisServer,
    runtime: &tokio::runtime::Runtime,
    store: &tollgate::RedisStore,
    deny_cache: bool,
    key: &str,
    quotas: &[Quota],
    steps: &[(u64, u64)],
) -> Result<(), String> {
    let policy = Policy::new("live", quotas.iter().copied()).map_err(|e| e.to_string())?;
    let keys: Vec<String> = store.bucket_keys(key, &policy);
    let mut model = Model::new(quotas);
    // The longest Redis call so far, in Redis time: a cached wait is counted
    // down from when its answer arrived, after Redis decided, so it may
    // overstate by that call's reply time at most.
    let mut longest_call = 0u64;
    for (step, &(sleep_us, cost)) in steps.iter().enumerate() {
        std::thread::sleep(Duration::from_micros(sleep_us));
        let before: Vec<Option<String>> = keys.iter().map(|k| server.cmd(&["GET", k])).collect();
        let calls = deny_cache.then(|| script_calls(server));
        let lo = server.time_us();
        let got = runtime
            .block_on(store.check(key, &policy, cost))
            .map_err(|e| format!("step {step}: {e}"))?;
        let hi = server.time_us();
        if calls.is_some_and(|calls| script_calls(server) == calls) {
            // Answered from the cache, somewhere in [lo, hi]: a denial the
            // model gives at lo, each wait no shorter than the model's at hi
            // (never understated), and no longer than the model's at lo
            // plus the reply time of the call it came from (and 1 µs for a
            // larger cost than the cached one).
            let (at_lo, at_hi) = (model.peek(lo, cost), model.peek(hi, cost));
            let waits = |states: &[Expected]| -> Vec<u64> {
                states.iter().map(|s| s.retry_after_us).collect()
            };
            let cached: Vec<u64> = got
                .states()
                .iter()
                .map(|s| s.retry_after().as_micros() as u64)
                .collect();
            let shorter = cached.iter().zip(waits(&at_hi)).any(|(c, m)| *c < m);
            let longer = cached
                .iter()
                .zip(waits(&at_lo))
                .any(|(c, m)| *c > m + longest_call + 1);
            if got.allowed() || at_lo[0].allowed || shorter || longer {
                return Err(format!(
                    "step {step}: answered without Redis: {got:?}; the model at {lo}: {at_lo:?}, \
                     at {hi}: {at_hi:?} (calls took up to {longest_call} us)"
                ));
            }
            continue;
        }
        longest_call = longest_call.max(hi - lo);
        // The script read TIME between `lo` and `hi`, and the model is a
        // function of that time: some t in between must give this answer.
        let Some(first) =
            (lo..=hi).find(|&t| compare("redis", step, &got, &model.peek(t, cost)).is_ok())
        else {
            return Err(format!(
                "step {step}: {got:?} is the model's answer at no time in [{lo}, {hi}]; at {lo}: {:?}",
                model.peek(lo, cost)
            ));
        };
        if !(got.allowed() && cost > 0) {
            // A denial or a peek writes nothing (a key may only have expired).
            for (k, was) in keys.iter().zip(before) {
                let now: Option<String> = server.cmd(&["GET", k]);
                if now.is_some() && now != was {
                    return Err(format!(
                        "step {step}: a denial or peek wrote {k}: {was:?} -> {now:?}"
                    ));
                }
            }
            continue;
        }
        // An admission stamped its buckets with the time the script read:
        // the model moves to exactly that time.
        let stamps: Vec<Option<u64>> = keys.iter().map(|k| stored_stamp(server, k)).collect();
        let read = server.time_us();
        let at = match stamps.iter().flatten().next() {
            Some(&at) => {
                if stamps.iter().flatten().any(|&s| s != at) || !(lo..=hi).contains(&at) {
                    return Err(format!(
                        "step {step}: stamps {stamps:?} outside [{lo}, {hi}] or unequal"
                    ));
                }
                at
            }
            // Every key already expired (a stall of over a second): any time
            // that gave this answer will do for what follows.
            None => first,
        };
        let want = model.check(at, cost);
        compare("redis", step, &got, &want)
            .map_err(|e| format!("{e} (at the stored stamp {at})"))?;
        for (i, stamp) in stamps.iter().enumerate() {
            if stamp.is_none() {
                // Expired already: Redis keeps a key at least a second past the
                // time its bucket is full, so the model must be full by now.
                let full_at = model.buckets[i].full_at().unwrap_or(0);
                if full_at > u128::from(read) {
                    return Err(format!(
                        "step {step}: key {} expired before its bucket was full at {full_at}",
                        keys[i]
                    ));
                }
                model.forget(i);
            }
        }
    }
    Ok(())
}

/// Runs the production-path property against a store built with or without
/// its deny cache.
fn redis_time_path(deny_cache: bool) {
    let server = RedisServer::start();
    let runtime = runtime();
    let mut builder = tollgate::RedisStore::builder()
        .leases(false)
        .pool(server.pool())
        .timeout(Duration::from_secs(5));
    if !deny_cache {
        builder = builder.deny_cache(0);
    }
    let store = builder.build().unwrap();
    let next = std::cell::Cell::new(0u64);
    // About 40 cases of up to 20 steps and 30 ms sleeps: a few seconds.
    let result = runner(40).run(&live_case(), |(quotas, steps)| {
        next.set(next.get() + 1);
        let key = format!("live:{}", next.get());
        live_case_run(&server, &runtime, &store, deny_cache, &key, &quotas, &steps)
            .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// `RedisStore::check`, the script production runs (clock from Redis `TIME`),
/// agrees with the model at every step; the model's time for each step is
/// read from Redis around the call, so nothing depends on how fast the
/// machine is, and no case is rejected. The deny cache is off, so every
/// answer comes from the script.
#[test]
fn redis_time_path_agrees_with_the_model() {
    redis_time_path(false);
}

/// The same with the deny cache on (the default): answers from Redis agree
/// with the model exactly, and denials the store gives from its cache never
/// deny what the model admits or promise a longer wait.
#[test]
fn redis_time_path_with_the_deny_cache_agrees_with_the_model() {
    redis_time_path(true);
}

/// `MemoryStore::check`, with its production clock (tokio's `Instant` with
/// `test-util`) paused and advanced by exact microseconds, agrees with the
/// model at every step.
#[test]
#[cfg_attr(
    not(feature = "test-util"),
    ignore = "MemoryStore follows tokio's clock with `test-util` only"
)]
fn memory_paused_clock_path_agrees_with_the_model() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let forward = |(quotas, steps): (Vec<Quota>, Vec<(i64, u64)>)| {
        let steps: Vec<(u64, u64)> = steps
            .into_iter()
            .map(|(e, c)| (e.unsigned_abs(), c))
            .collect();
        (quotas, steps)
    };
    let result = scaled_runner(200).run(&case().prop_map(forward), |(quotas, steps)| {
        runtime.block_on(async {
            let policy = Policy::new("paused", quotas.iter().copied()).unwrap();
            // The store counts time from its creation: the model's zero.
            let store = MemoryStore::new();
            let mut model = Model::new(&quotas);
            let mut now = 0u64;
            for (step, &(elapsed, cost)) in steps.iter().enumerate() {
                tokio::time::advance(Duration::from_micros(elapsed)).await;
                now += elapsed;
                let want = model.check(now, cost);
                let got = store
                    .check("k", &policy, cost)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                compare("memory", step, &got, &want).map_err(TestCaseError::fail)?;
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
