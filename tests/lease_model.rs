//! Leases against an independent model, on a real Redis at an explicit
//! clock: random schedules of several instances that take leases, spend
//! them in process, report them (or lose the report), let them expire,
//! retry a lease whose reply was lost, and check directly, while Redis's
//! clock may step back.
//!
//! On every case:
//! - every script answer (admitted, remaining, tokens granted, report
//!   found) is the model's;
//! - **the bound:** for every pair of admissions (in Redis or in process)
//!   at true times `t1 <= t2`, the tokens admitted in `[t1, t2]` are at
//!   most capacity + rate x (t2 - t1);
//! - **under-admission:** a check is denied only when the tokens the
//!   bucket has not set aside for holds lack its cost (the model's rule,
//!   which Redis must match), so what leases cost is bounded by the tokens
//!   held.
#![cfg(all(feature = "redis", feature = "test-util"))]

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::RedisServer;
use tollgate::{Policy, Quota, RedisStore};

/// How many times its plain life a roomy lease lives.
const ROOMY_LIVES: u64 = 32;

/// A realistic Redis clock (microseconds since the epoch, November 2025).
const EPOCH_US: u64 = 1_763_000_000_000_000;

#[derive(Clone, Debug)]
enum Step {
    /// True time moves on.
    Advance(u64),
    /// Redis's clock steps back (a failover to a replica whose clock is
    /// behind).
    ClockBack(u64),
    /// An instance checks in Redis.
    Check { cost: u64 },
    /// An instance spends from its oldest hold in process, if it can.
    Local { inst: usize, cost: u64 },
    /// An instance asks for a lease, carrying the report of its oldest
    /// closed hold if `carry`, a partial report of its open hold that spent
    /// most if `partial` (never on a request sent again), and naming a roomy size (0: none; granted
    /// instead, for 32 times the life, when the bucket is at least 3/4
    /// free). When `lost`,
    /// the reply is lost and the store sends the same request again, as it
    /// does after a broken connection.
    Lease {
        inst: usize,
        want: u64,
        life_ms: u64,
        roomy: u64,
        carry: bool,
        partial: bool,
        lost: bool,
    },
    /// An instance stops spending its oldest open hold and reports it now
    /// (`how` 0), loses its report (1), or keeps the report for its next
    /// lease request (2).
    Close { inst: usize, how: u8 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..400_000u64).prop_map(Step::Advance),
        1 => (0..300_000u64).prop_map(Step::ClockBack),
        4 => (1..4u64).prop_map(|cost| Step::Check { cost }),
        8 => (0..3usize, 1..3u64).prop_map(|(inst, cost)| Step::Local { inst, cost }),
        3 => (
            0..3usize,
            1..30u64,
            50..3_000u64,
            prop_oneof![Just(0u64), 1..60u64],
            any::<bool>(),
            any::<bool>(),
            prop::bool::weighted(0.2)
        )
            .prop_map(|(inst, want, life_ms, roomy, carry, partial, lost)| Step::Lease {
                inst,
                want,
                life_ms,
                roomy,
                carry,
                partial: partial && !lost,
                lost
            }),
        2 => (0..3usize, 0..3u8).prop_map(|(inst, how)| Step::Close { inst, how }),
    ]
}

fn case() -> impl Strategy<Value = (Quota, Vec<Step>)> {
    let quota = (1..20u64, 1..5_000u64, 1..40u64).prop_map(|(tokens, ms, cap)| {
        Quota::new(tokens, Duration::from_millis(ms))
            .unwrap()
            .burst(cap.max(3))
            .unwrap()
    });
    (quota, prop::collection::vec(step(), 1..60))
}

/// A hold as the model keeps it in the bucket: id, units held, expiry
/// (Redis time).
#[derive(Clone, Debug)]
struct ModelHold {
    id: u64,
    units: u64,
    expiry: u64,
}

/// The bucket as stored (written only when the script writes it).
#[derive(Clone, Debug, Default)]
struct Stored {
    /// None: no key (a full bucket).
    bucket: Option<(i64, u64, Vec<ModelHold>)>,
}

/// A bucket read at `now`: refilled (capped at full, holds inside), then
/// every hold past its expiry debited whole.
fn read(stored: &Stored, q: &Quota, now: u64) -> (i64, u64, Vec<ModelHold>) {
    let full = (q.capacity() * den(q)) as i64;
    let num = num(q);
    match &stored.bucket {
        None => (full, now, Vec::new()),
        Some((level, stamp, holds)) => {
            let mut level = (*level).min(full);
            let mut stamp = *stamp;
            if now > stamp {
                let gap = i128::from(now - stamp) * i128::from(num);
                level = (i128::from(level) + gap).min(i128::from(full)) as i64;
                stamp = now;
            }
            let mut kept = Vec::new();
            for h in holds {
                if h.expiry <= now {
                    level -= h.units as i64;
                } else {
                    kept.push(h.clone());
                }
            }
            (level, stamp, kept)
        }
    }
}

/// The quota's refill per microsecond, as a reduced fraction num/den.
fn num(q: &Quota) -> u64 {
    let (n, d) = fraction(q);
    n / gcd(n, d)
}

fn den(q: &Quota) -> u64 {
    let (n, d) = fraction(q);
    d / gcd(n, d)
}

fn fraction(q: &Quota) -> (u64, u64) {
    (q.tokens(), q.period().as_micros() as u64)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn held(holds: &[ModelHold]) -> i64 {
    holds.iter().map(|h| h.units as i64).sum()
}

fn remaining(level: i64, holds: &[ModelHold], q: &Quota) -> u64 {
    let free = level - held(holds);
    if free > 0 { free as u64 / den(q) } else { 0 }
}

/// A hold as its instance sees it.
#[derive(Clone, Debug)]
struct Local {
    id: u64,
    granted: u64,
    left: u64,
    /// True time until which it may be spent: sent + life - life / 10.
    until: u64,
    closed: bool,
}

#[derive(Clone, Debug, Default)]
struct Instance {
    holds: Vec<Local>,
}

/// A lease request: its id, the tokens wanted, its life, and the report it
/// carries.
struct Request {
    id: u64,
    want: u64,
    life_ms: u64,
    /// The roomy size (0: none).
    roomy: u64,
    report: Option<(u64, u64)>,
    /// An open hold's id and what it spent so far (the rest stays held).
    partial: Option<(u64, u64)>,
}

/// What the cases did, over the run: each kind must have happened for the
/// run to have tested it.
#[derive(Default)]
struct Tally {
    grants: AtomicU64,
    local: AtomicU64,
    denied: AtomicU64,
    found: AtomicU64,
    gone: AtomicU64,
    again: AtomicU64,
    expired_here: AtomicU64,
    roomy: AtomicU64,
    partial: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

enum Failure {
    Mismatch(String),
    Perturbed,
}

struct Rig {
    tally: Tally,
    server: RedisServer,
    store: RedisStore,
    runtime: tokio::runtime::Runtime,
}

fn run_case(rig: &Rig, key: &str, quota: Quota, steps: &[Step]) -> Result<(), Failure> {
    let started = Instant::now();
    let policy = Policy::from(quota);
    let d = den(&quota);
    let full = (quota.capacity() * d) as i64;
    let store = &rig.store;
    let rt = &rig.runtime;
    let mut stored = Stored::default();
    let mut instances = vec![Instance::default(); 3];
    let mut true_now: u64 = 0;
    let mut offset: u64 = 0;
    let mut next_id: u64 = 1;
    // Every admission: (true time, tokens).
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    let fail = |i: usize, what: String| Failure::Mismatch(format!("step {i}: {what}"));
    for (i, step) in steps.iter().enumerate() {
        let redis_now = EPOCH_US + true_now - offset;
        match *step {
            Step::Advance(us) => true_now += us,
            Step::ClockBack(us) => offset = (offset + us).min(true_now),
            Step::Check { cost, .. } => {
                let got = rt
                    .block_on(store.check_at(key, &policy, cost, redis_now))
                    .map_err(|e| fail(i, format!("check failed: {e}")))?;
                let (level, stamp, holds) = read(&stored, &quota, redis_now);
                let need = (cost * d) as i64;
                let allowed = level - held(&holds) >= need;
                let left = if allowed { level - need } else { level };
                if got.allowed() != allowed || got.remaining() != remaining(left, &holds, &quota) {
                    return Err(fail(
                        i,
                        format!(
                            "check {cost}: got {} / {}, model {allowed} / {} (level {level}, held {})",
                            got.allowed(),
                            got.remaining(),
                            remaining(left, &holds, &quota),
                            held(&holds)
                        ),
                    ));
                }
                if allowed {
                    stored.bucket = Some((left, stamp, holds));
                    admitted.push((true_now, cost));
                } else {
                    bump(&rig.tally.denied);
                }
            }
            Step::Local { inst, cost } => {
                if let Some(hold) = instances[inst]
                    .holds
                    .iter_mut()
                    .find(|h| !h.closed && h.left >= cost && true_now < h.until)
                {
                    hold.left -= cost;
                    admitted.push((true_now, cost));
                    bump(&rig.tally.local);
                } else if instances[inst]
                    .holds
                    .iter()
                    .any(|h| !h.closed && h.left >= cost)
                {
                    bump(&rig.tally.expired_here);
                }
            }
            Step::Lease {
                inst,
                want,
                life_ms,
                roomy,
                carry,
                partial,
                lost,
            } => {
                let report = if carry {
                    let closed = instances[inst].holds.iter().position(|h| h.closed);
                    closed.map(|at| {
                        let h = instances[inst].holds.remove(at);
                        (h.id, h.granted - h.left)
                    })
                } else {
                    None
                };
                let partial = if partial {
                    instances[inst]
                        .holds
                        .iter()
                        .filter(|h| !h.closed && h.granted > h.left)
                        .max_by_key(|h| h.granted - h.left)
                        .map(|h| (h.id, h.granted - h.left))
                } else {
                    None
                };
                let id = next_id;
                next_id += 1;
                let request = Request {
                    id,
                    want,
                    life_ms,
                    roomy,
                    report,
                    partial,
                };
                if lost {
                    lease(
                        rig,
                        key,
                        &policy,
                        &mut stored,
                        None,
                        i,
                        redis_now,
                        true_now,
                        &request,
                        false,
                    )?;
                }
                lease(
                    rig,
                    key,
                    &policy,
                    &mut stored,
                    Some(&mut instances[inst]),
                    i,
                    redis_now,
                    true_now,
                    &request,
                    lost,
                )?;
            }
            Step::Close { inst, how } => {
                let Some(at) = instances[inst].holds.iter().position(|h| !h.closed) else {
                    continue;
                };
                if how == 1 {
                    // Never reported: Redis debits it whole at its expiry.
                    instances[inst].holds.remove(at);
                    continue;
                }
                if how == 2 {
                    instances[inst].holds[at].closed = true;
                    continue;
                }
                let h = instances[inst].holds.remove(at);
                let spent = h.granted - h.left;
                let got = rt
                    .block_on(store.report_at(key, &policy, h.id, spent, redis_now))
                    .map_err(|e| fail(i, format!("report failed: {e}")))?;
                let (mut level, stamp, mut holds) = read(&stored, &quota, redis_now);
                let found = holds.iter().position(|m| m.id == h.id);
                if got != found.is_some() {
                    return Err(fail(
                        i,
                        format!("report of {}: got {got}, model {found:?}", h.id),
                    ));
                }
                bump(if got {
                    &rig.tally.found
                } else {
                    &rig.tally.gone
                });
                if let Some(at) = found {
                    let m = holds.remove(at);
                    level -= ((spent * d).min(m.units)) as i64;
                    stored.bucket = Some((level, stamp, holds));
                }
            }
        }
    }
    if started.elapsed() > Duration::from_millis(800) {
        // Keys live 1 s of real time past their test-clock refill.
        return Err(Failure::Perturbed);
    }
    // The bound, over every pair of admissions.
    admitted.sort_unstable();
    let num = num(&quota) as i128;
    for a in 0..admitted.len() {
        let mut tokens: i128 = 0;
        for b in a..admitted.len() {
            tokens += i128::from(admitted[b].1);
            let span = i128::from(admitted[b].0 - admitted[a].0);
            if tokens * i128::from(d) > i128::from(full) + num * span {
                return Err(Failure::Mismatch(format!(
                    "{tokens} tokens admitted in {span} us: over the bound ({admitted:?})"
                )));
            }
        }
    }
    Ok(())
}

/// One lease request (sent again when `resent`) and its check against the
/// model; its grant goes to `instance` (`None`: the reply is lost).
#[allow(clippy::too_many_arguments)]
fn lease(
    rig: &Rig,
    key: &str,
    policy: &Policy,
    stored: &mut Stored,
    mut instance: Option<&mut Instance>,
    i: usize,
    redis_now: u64,
    true_now: u64,
    request: &Request,
    resent: bool,
) -> Result<(), Failure> {
    let &Request {
        id,
        want,
        life_ms,
        roomy,
        report,
        partial,
    } = request;
    let quota = policy.quotas()[0];
    let d = den(&quota);
    let full = quota.capacity() * d;
    let (got, granted, found, got_roomy) = rig
        .runtime
        .block_on(rig.store.lease_at(
            key,
            policy,
            0,
            want,
            Duration::from_millis(life_ms),
            id,
            report,
            partial,
            roomy,
            redis_now,
        ))
        .map_err(|e| Failure::Mismatch(format!("step {i}: lease failed: {e}")))?;
    let (mut level, stamp, mut holds) = read(stored, &quota, redis_now);
    let mut model_found = false;
    if let Some((rid, spent)) = report
        && let Some(at) = holds.iter().position(|h| h.id == rid)
    {
        model_found = true;
        let h = holds.remove(at);
        level -= ((spent * d).min(h.units)) as i64;
    }
    let mut released = model_found;
    // The partial report: what it spent is debited, the rest stays held;
    // the reply's "found" is its own.
    if let Some((pid, spent)) = partial {
        model_found = false;
        if let Some(at) = holds.iter().position(|h| h.id == pid) {
            model_found = true;
            released = true;
            let units = (spent * d).min(holds[at].units);
            level -= units as i64;
            if units < holds[at].units {
                holds[at].units -= units;
            } else {
                holds.remove(at);
            }
        }
    }
    // A lease sent again is answered as it was, never as roomy: its
    // holder then uses it for the plain life, which is never longer.
    let (model_grant, write, model_roomy) = if let Some(h) = holds.iter().find(|h| h.id == id) {
        (h.units / d, released, false)
    } else {
        let free = level - held(&holds);
        // At most half of what is free, and half the room left under the
        // cap on the bucket's holds, half its capacity in all (what the
        // script stands in for after a loss of data).
        let room = ((full / 2) as i64 - held(&holds)) / 2;
        let share = if free > 0 && holds.len() < 16 {
            (free as u64 / (2 * d)).min(room.max(0) as u64 / d)
        } else {
            0
        };
        let (want, life_ms, is_roomy) = if roomy > 0 && 4 * i128::from(free) >= 3 * i128::from(full)
        {
            (roomy, ROOMY_LIVES * life_ms, true)
        } else {
            (want, life_ms, false)
        };
        let grant = want.min(share);
        if grant > 0 {
            holds.push(ModelHold {
                id,
                units: grant * d,
                expiry: redis_now + life_ms * 1_000,
            });
        }
        (grant, grant > 0 || released, is_roomy && grant > 0)
    };
    if !got.allowed() || granted != model_grant || found != model_found || got_roomy != model_roomy
    {
        return Err(Failure::Mismatch(format!(
            "step {i}: lease {id} (resent {resent}): got {} / {granted} / {found} / roomy {got_roomy}, model {model_grant} / {model_found} / roomy {model_roomy}",
            got.allowed()
        )));
    }
    if got_roomy {
        bump(&rig.tally.roomy);
    }
    // The life the holder uses: the one the reply says it got.
    let life_ms = if got_roomy {
        ROOMY_LIVES * life_ms
    } else {
        life_ms
    };
    if got.remaining() != remaining(level, &holds, &quota) {
        return Err(Failure::Mismatch(format!(
            "step {i}: lease {id}: remaining {} against the model's {}",
            got.remaining(),
            remaining(level, &holds, &quota)
        )));
    }
    if write {
        stored.bucket = Some((level, stamp, holds));
    }
    if granted > 0 {
        bump(if resent {
            &rig.tally.again
        } else {
            &rig.tally.grants
        });
    }
    // A partial report that found its hold: what it reported is no
    // longer the holder's to report.
    if let (Some(instance), Some((pid, spent)), true) = (instance.as_deref_mut(), partial, found)
        && let Some(h) = instance.holds.iter_mut().find(|h| h.id == pid)
    {
        h.granted -= spent;
        bump(&rig.tally.partial);
    }
    // The instance uses what it was granted until its life, less a tenth,
    // from when it sent the request.
    if let Some(instance) = instance
        && granted > 0
    {
        instance.holds.push(Local {
            id,
            granted,
            left: granted,
            until: true_now + life_ms * 1_000 - life_ms * 100,
            closed: false,
        });
    }
    Ok(())
}

fn scaled_runner(cases: u32) -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    TestRunner::new(Config {
        cases,
        max_global_rejects: cases / 20 + 10,
        max_shrink_iters: 2_000,
        failure_persistence: None,
        ..Config::default()
    })
}

#[test]
fn leases_keep_the_bound_and_agree_with_the_model() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .pool(server.pool())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let rig = Rig {
        tally: Tally::default(),
        server,
        store,
        runtime,
    };
    let n = std::sync::atomic::AtomicU64::new(0);
    let result = scaled_runner(1_000).run(&case(), |(quota, steps)| {
        let n = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = format!("lease-model-{n}");
        run_case(&rig, &key, quota, &steps).map_err(|f| match f {
            Failure::Mismatch(why) => TestCaseError::fail(why),
            Failure::Perturbed => TestCaseError::reject("a key expired in real time"),
        })
    });
    let _ = &rig.server;
    if let Err(e) = result {
        panic!("{e}");
    }
    let t = &rig.tally;
    let counts = [
        ("leases granted", &t.grants),
        ("resent leases answered with their hold", &t.again),
        ("admissions in process", &t.local),
        ("checks denied in Redis", &t.denied),
        ("reports that found their hold", &t.found),
        ("reports of a hold Redis had expired", &t.gone),
        ("holds not spent once past their time here", &t.expired_here),
        ("roomy leases granted", &t.roomy),
        ("partial reports that found their hold", &t.partial),
    ];
    for (what, n) in counts {
        let n = n.load(Ordering::Relaxed);
        eprintln!("{what}: {n}");
        assert!(n > 0, "no case had {what}: the run tested nothing of it");
    }
}
