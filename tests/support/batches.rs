//! Random sequences of batches for the batching tests, on one server
//! (`tests/batching.rs`) and on a cluster (`tests/cluster_batching.rs`).

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::{Policy, Quota};

/// Three policies: one quota, two quotas decided together, an odd period.
pub fn policies() -> Vec<Policy> {
    vec![
        Policy::new("a", [Quota::per_second(3).unwrap()]).unwrap(),
        Policy::new(
            "b",
            [
                Quota::per_second(5).unwrap().burst(2).unwrap(),
                Quota::per_minute(7).unwrap(),
            ],
        )
        .unwrap(),
        Policy::new("c", [Quota::new(2, Duration::from_millis(1500)).unwrap()]).unwrap(),
    ]
}

/// A check: client index, policy index (of [`policies`]), cost.
pub type Check = (usize, usize, u64);

/// Steps of (elapsed µs, the checks sent together): checks of `clients`
/// clients, batches of up to `max_checks - 1`.
pub fn steps(clients: usize, max_checks: usize) -> impl Strategy<Value = Vec<(u64, Vec<Check>)>> {
    let check = (0..clients, 0usize..3, 0u64..=2);
    let batch = prop::collection::vec(check, 1..max_checks);
    let elapsed = prop_oneof![Just(0u64), 0u64..400_000, 0u64..3_000_000];
    prop::collection::vec((elapsed, batch), 1..6)
}

/// Runs `cases` cases of [`steps`] through `case`, panicking on a failure.
///
/// The script sets each key's TTL from the clock it is given, so a fast
/// quota's key lives about a second of real time: a stall that long mid-case
/// lets Redis expire it and start a fresh bucket. A case that fails while
/// `expired` (Redis's `expired_keys`) moved is rejected and generated again
/// rather than failed, at most `cases / 20` times (as in `tests/model.rs`), so
/// a run that rejects most of its cases does not pass. `flush` deletes every
/// case's keys after it, so that none expires during a later one.
pub fn run_guarded(
    cases: u32,
    strategy: impl Strategy<Value = Vec<(u64, Vec<Check>)>>,
    expired: impl Fn() -> u64,
    flush: impl Fn(),
    case: impl Fn(&[(u64, Vec<Check>)]) -> Result<(), TestCaseError>,
) {
    let mut runner = TestRunner::new(Config {
        cases,
        max_global_rejects: cases / 20,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |steps| {
        let before = expired();
        let outcome = case(&steps);
        let perturbed = expired() != before;
        flush();
        match outcome {
            Err(TestCaseError::Fail(why)) if perturbed => Err(TestCaseError::reject(format!(
                "a key expired during the case (a stall of a second or more): {why}"
            ))),
            other => other,
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// One step of a case: `list` decided as one batch by `batched`, one by one
/// by `single` at the same Redis clock `now` (µs), and by `memory` at
/// `now - t0`; every answer must be the same.
#[cfg(feature = "test-util")]
pub fn batch_equals_one_by_one(
    runtime: &tokio::runtime::Runtime,
    batched: &tollgate::RedisStore,
    single: &tollgate::RedisStore,
    memory: &tollgate::MemoryStore,
    list: &[(&str, &Policy, u64)],
    now: u64,
    t0: u64,
) -> Result<(), TestCaseError> {
    let together = runtime.block_on(batched.check_batch_at(list, now)).unwrap();
    for (i, (key, policy, cost)) in list.iter().enumerate() {
        let alone = runtime
            .block_on(single.check_at(key, policy, *cost, now))
            .unwrap();
        let mem = memory.check_at(key, policy, *cost, now - t0).unwrap();
        prop_assert_eq!(&together[i], &alone, "check {} of {:?}", i, list);
        prop_assert_eq!(&together[i], &mem, "check {} of {:?}", i, list);
    }
    Ok(())
}
