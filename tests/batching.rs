//! Batched checks answer exactly as the same checks sent one by one: random
//! sequences of checks over a few clients, policies and costs, sent as one
//! script call and as separate calls at the same Redis clock, and compared with
//! the in-memory store, which decides one at a time.
#![cfg(all(feature = "redis", feature = "test-util"))]

mod support;

use std::time::Duration;

use proptest::test_runner::TestCaseError;
use support::RedisServer;
use support::batches::{Check, batch_equals_one_by_one, policies, run_guarded, steps};
use tollgate::{MemoryStore, Policy, RedisStore};

const T0: u64 = 1_763_000_000_000_000;

#[test]
fn a_batch_answers_as_its_checks_sent_one_by_one() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let policies = policies();
    let cases = std::sync::atomic::AtomicU64::new(0);
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
            batch_equals_one_by_one(&runtime, &batched, &single, &memory, &list, now, T0)?;
        }
        Ok(())
    };
    run_guarded(
        64,
        steps(3, 12),
        || server.expired_keys(),
        || {
            let _: () = server.cmd(&["FLUSHALL"]);
        },
        run_case,
    );
}
