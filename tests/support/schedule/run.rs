//! Runs one schedule: the instances' workers offer the planned load while
//! the nemesis injects the planned faults and resets, and every operation
//! goes into the history.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::task::JoinSet;
use tollgate::{Decision, Policy, Quota, RateLimiter, RedisStore};

use super::fault::Fault;
use super::history::{History, Op, What};
use super::plan::{Action, Plan};
use super::rng::Rng;
use super::servers::Target;

/// The policy name every instance shares (so they share the buckets).
pub const POLICY: &str = "fs";

/// The mean cost of a check (costs are 1 to 5, uniform).
const MEAN_COST: f64 = 3.0;

/// What a schedule did.
pub struct Outcome {
    pub ops: Vec<Op>,
    /// Checks decided in process from holds, over every instance.
    pub local_decisions: u64,
    /// Panics in the process meanwhile (the caller counts them).
    pub panics: u64,
    /// Seconds of this host's wall clock (Redis's `TIME` here, which its
    /// buckets refill by) per second of the monotonic clock the history is
    /// timed on, over the schedule: not 1 while the wall clock is slewed
    /// (4 900 ppm fast measured on a development VM).
    pub clock: f64,
}

/// The name of hot key `key`, as a limiter is asked for it.
pub fn key_name(key: usize) -> String {
    format!("hot{key}")
}

/// The policy of `plan`: its one bucket.
pub fn policy(plan: &Plan) -> Policy {
    let quota = Quota::per_second(plan.rate)
        .and_then(|q| q.burst(plan.capacity))
        .expect("a valid quota");
    Policy::new(POLICY, [quota]).expect("a valid policy")
}

/// What every task of a schedule shares.
struct Shared {
    plan: Plan,
    history: History,
    workers: usize,
}

/// Runs `plan` against `target`, keys under `prefix`.
pub async fn run<T: Target>(plan: &Plan, target: T, prefix: &str) -> Outcome {
    let stores: Vec<RedisStore> = plan
        .instances
        .iter()
        .map(|i| {
            let builder = target
                .builder()
                .prefix(prefix)
                .timeout(plan.timeout)
                .leases(i.lease_period.is_some());
            match i.lease_period {
                Some(period) => builder.lease_period(period),
                None => builder,
            }
            .build()
            .expect("a store")
        })
        .collect();
    let policy = policy(plan);
    let limiters: Vec<RateLimiter> = stores
        .iter()
        .map(|s| RateLimiter::new(s.clone(), policy.clone()))
        .collect();
    let shared = Arc::new(Shared {
        plan: plan.clone(),
        history: History::new(),
        workers: plan.instances.iter().map(|i| i.workers).sum(),
    });
    // The workers' draws come from a stream apart from the plan's.
    let mut rng = Rng::new(!plan.seed);
    let mut tasks = JoinSet::new();
    for (instance, limiter) in limiters.iter().enumerate() {
        for _ in 0..plan.instances[instance].workers {
            let (shared, limiter, rng) = (Arc::clone(&shared), limiter.clone(), rng.fork());
            tasks.spawn(worker(shared, instance, limiter, rng));
        }
    }
    let (wall, monotonic) = (SystemTime::now(), Instant::now());
    let target = Arc::new(Mutex::new(target));
    nemesis(&shared, &target, &limiters).await;
    while let Some(done) = tasks.join_next().await {
        done.expect("a worker panicked");
    }
    let clock = SystemTime::now()
        .duration_since(wall)
        .map_or(1.0, |w| w.as_secs_f64() / monotonic.elapsed().as_secs_f64());
    Outcome {
        ops: shared.history.ops(),
        local_decisions: stores.iter().map(|s| s.lease_stats().local_decisions).sum(),
        panics: 0,
        clock,
    }
}

/// Offers the planned load from one instance: checks as a Poisson stream
/// of the phase's rate (this worker's share), each admitted one maybe
/// followed by a refund or a charge.
async fn worker(shared: Arc<Shared>, instance: usize, limiter: RateLimiter, mut rng: Rng) {
    let plan = &shared.plan;
    let mut settlements = JoinSet::new();
    while let Some(phase) = plan.phase_at(shared.history.now()) {
        let checks_per_second = phase.load / MEAN_COST / shared.workers as f64;
        let gap = Duration::from_secs_f64(rng.exponential(1.0 / checks_per_second));
        let now = shared.history.now();
        // Memoryless: a gap that runs past the phase is drawn again at its
        // end, at the next phase's rate.
        if now + gap >= phase.until {
            tokio::time::sleep(phase.until.saturating_sub(now)).await;
            continue;
        }
        tokio::time::sleep(gap).await;
        let key = rng.range(0, plan.keys as u64 - 1) as usize;
        let cost = rng.range(1, 5);
        let invoke = shared.history.now();
        let result = limiter.check(&key_name(key), cost).await;
        let admitted = matches!(&result, Ok(d) if d.allowed());
        let what = What::Check {
            key,
            cost,
            admitted,
        };
        let error = result.as_ref().err().map(ToString::to_string);
        shared.history.record(Some(instance), invoke, error, what);
        if let (true, Ok(decision)) = (admitted, &result)
            && let Some(settle) = settlement(plan, &mut rng, key, cost)
        {
            let (shared, limiter) = (Arc::clone(&shared), limiter.clone());
            let decision = decision.clone();
            let delay = Duration::from_millis(rng.range(0, 100));
            settlements.spawn(async move {
                tokio::time::sleep(delay).await;
                settle_now(&shared, instance, &limiter, settle, &decision).await;
            });
        }
    }
    while let Some(done) = settlements.join_next().await {
        done.expect("a settlement panicked");
    }
}

/// A refund (of part of the cost) or a charge (usually small, now and then
/// a whole bucket) to follow an admitted check, or none.
fn settlement(plan: &Plan, rng: &mut Rng, key: usize, cost: u64) -> Option<What> {
    if rng.chance(plan.refund_chance) {
        let amount = rng.range(1, cost);
        return Some(What::Refund { key, amount });
    }
    if rng.chance(plan.charge_chance) {
        let amount = if rng.chance(0.1) {
            plan.capacity
        } else {
            rng.range(1, 5)
        };
        return Some(What::Charge { key, amount });
    }
    None
}

async fn settle_now(
    shared: &Shared,
    instance: usize,
    limiter: &RateLimiter,
    what: What,
    decision: &Decision,
) {
    let invoke = shared.history.now();
    let result = match what {
        What::Refund { key, amount } => limiter.refund(&key_name(key), amount, decision).await,
        What::Charge { key, amount } => limiter.charge(&key_name(key), amount, decision).await,
        _ => unreachable!("only refunds and charges are settlements"),
    };
    let error = result.err().map(|e| e.to_string());
    shared.history.record(Some(instance), invoke, error, what);
}

/// Injects the plan's faults and resets, one at a time, each at its time
/// or when the one before is over.
async fn nemesis<T: Target>(shared: &Shared, target: &Arc<Mutex<T>>, limiters: &[RateLimiter]) {
    for step in &shared.plan.steps {
        tokio::time::sleep(step.at.saturating_sub(shared.history.now())).await;
        let invoke = shared.history.now();
        match step.action {
            Action::Fault(fault) => {
                let held = limiters
                    .iter()
                    .filter_map(|l| l.store().as_redis())
                    .map(|s| s.lease_stats().outstanding)
                    .sum();
                inflict(target, fault).await;
                let what = What::Fault {
                    name: fault.kind(),
                    loss: fault.loses_data(),
                    empties: fault.empties(),
                    held,
                };
                shared.history.record(None, invoke, None, what);
            }
            Action::Reset { key, by } => {
                let result = limiters[by].reset(&key_name(key)).await;
                let what = What::Reset { key };
                let error = result.err().map(|e| e.to_string());
                shared.history.record(Some(by), invoke, error, what);
            }
        }
    }
}

/// Does `fault` on a blocking thread: the harness's server calls are
/// synchronous, and a freeze sleeps.
async fn inflict<T: Target>(target: &Arc<Mutex<T>>, fault: Fault) {
    let target = Arc::clone(target);
    tokio::task::spawn_blocking(move || {
        target
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .inflict(fault);
    })
    .await
    .unwrap_or_else(|e| panic!("the harness failed to do {fault}: {e}"));
}
