//! Batched checks answer exactly as the same checks sent one by one: random
//! sequences of checks over a few clients, policies and costs, sent as one
//! script call and as separate calls at the same Redis clock, and compared with
//! the in-memory store, which decides one at a time.
#![cfg(all(feature = "redis", feature = "test-util"))]

mod support;

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::RedisServer;
use tollgate::{MemoryStore, Policy, Quota, RedisStore};

const T0: u64 = 1_763_000_000_000_000;

fn policies() -> Vec<Policy> {
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

/// A check: client, policy index, cost.
type Check = (u8, usize, u64);

/// Steps of (elapsed µs, the checks sent together).
fn steps() -> impl Strategy<Value = Vec<(u64, Vec<Check>)>> {
    let check = (0u8..3, 0usize..3, 0u64..=2);
    let batch = prop::collection::vec(check, 1..12);
    let elapsed = prop_oneof![Just(0u64), 0u64..400_000, 0u64..3_000_000];
    prop::collection::vec((elapsed, batch), 1..6)
}

#[test]
fn a_batch_answers_as_its_checks_sent_one_by_one() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let policies = policies();
    let cases = std::sync::atomic::AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 64,
        // A run that rejects most of its cases must not pass.
        max_global_rejects: 64 / 20,
        failure_persistence: None,
        ..Config::default()
    });
    let run_case = |steps: &[(u64, Vec<Check>)]| -> Result<(), TestCaseError> {
        let case = cases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let store = |name: &str| {
            RedisStore::builder()
                .pool(server.pool())
                .prefix(format!("case{case}:{name}:"))
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap()
        };
        let (batched, single) = (store("batched"), store("single"));
        let memory = MemoryStore::new();
        let mut now = T0;
        for (elapsed, checks) in steps {
            now += elapsed;
            let keys: Vec<String> = checks
                .iter()
                .map(|(c, _, _)| format!("client{c}"))
                .collect();
            let list: Vec<(&str, &Policy, u64)> = checks
                .iter()
                .zip(&keys)
                .map(|((_, p, cost), key)| (key.as_str(), &policies[*p], *cost))
                .collect();
            let together = runtime
                .block_on(batched.check_batch_at(&list, now))
                .unwrap();
            for (i, (key, policy, cost)) in list.iter().enumerate() {
                let alone = runtime
                    .block_on(single.check_at(key, policy, *cost, now))
                    .unwrap();
                let mem = memory.check_at(key, policy, *cost, now - T0).unwrap();
                prop_assert_eq!(&together[i], &alone, "check {} of {:?}", i, list);
                prop_assert_eq!(&together[i], &mem, "check {} of {:?}", i, list);
            }
        }
        Ok(())
    };
    let result = runner.run(&steps(), |steps| {
        // The script sets each key's TTL from the clock it is given, so a
        // fast quota's key lives about a second of real time: a stall that
        // long mid-case lets Redis expire it and start a fresh bucket. Such a
        // case is rejected (and regenerated) rather than failed, and every
        // case's keys go with it, so that none expires during a later one.
        let expired = server.expired_keys();
        let outcome = run_case(&steps);
        let perturbed = server.expired_keys() != expired;
        let _: () = server.cmd(&["FLUSHALL"]);
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
