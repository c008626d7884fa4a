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
use support::far;
use tollgate::{MemoryStore, Policy, RedisStore, Store};

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
                .leases(false)
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

/// The production path (`check`: the queue, the drain, the answers handed
/// back) gives each of many concurrent callers its own answer. 32 clients
/// are drained to 32 levels (client `i` holds `i` tokens), then all 32 check
/// at once: client 0 is denied, client `i` is admitted with `i - 1` left.
/// Tasks on one thread all queue before any call is sent, so the first call
/// carries one check and the rest go together in the next ones: fewer
/// script calls than checks.
#[tokio::test]
async fn concurrent_checks_through_the_queue_each_get_their_own_answer() {
    const CLIENTS: u64 = 32;
    let server = RedisServer::start();
    let store = server.store();
    let policy = Policy::from(tollgate::Quota::per_hour(2 * CLIENTS).unwrap());
    let name = |i: u64| format!("client{i}");
    for i in 0..CLIENTS {
        let d = store
            .check(&name(i), &policy, 2 * CLIENTS - i)
            .await
            .unwrap();
        assert!(d.allowed() && d.remaining() == i, "{i}: {d:?}");
    }
    server.reset_stats();
    // Redis holds its clients for a moment, so the checks queue behind the
    // calls in flight and are answered from shared calls, however many calls
    // the store would otherwise keep in flight on a fast machine.
    let _: () = server.cmd(&["CLIENT", "PAUSE", "200", "ALL"]);
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (store, policy, key) = (store.clone(), policy.clone(), name(i));
            tokio::spawn(async move { store.check(&key, &policy, 1).await.unwrap() })
        })
        .collect();
    for (i, task) in (0..CLIENTS).zip(tasks) {
        let d = task.await.unwrap();
        if i == 0 {
            assert!(!d.allowed() && d.remaining() == 0, "{i}: {d:?}");
            assert!(d.retry_after() > Duration::ZERO, "{i}: {d:?}");
        } else {
            assert!(d.allowed(), "{i}: {d:?}");
            assert_eq!(d.remaining(), i - 1, "{i}: {d:?}");
        }
    }
    let calls = server.calls("evalsha") + server.calls("eval");
    println!("{CLIENTS} concurrent checks in {calls} script calls");
    assert!(
        calls < CLIENTS / 4,
        "{calls} script calls for {CLIENTS} checks"
    );
    // Each bucket holds what its answer said.
    for i in 1..CLIENTS {
        let d = store.check(&name(i), &policy, 0).await.unwrap();
        assert_eq!(d.remaining(), i - 1, "{i}");
    }
}

/// With Redis far away (a proxy holding every chunk 25 ms each way), a check
/// under moderate concurrency is sent at once: it waits about one round trip,
/// its own call's, not one for a call to end and then its own. 4 and then 16
/// callers each check in a loop; after a warm-up (the in-flight limit opens
/// within a few round trips), the median check takes less than 1.5 times a
/// plain `PING` through the same proxy. With a fixed two calls in flight, the
/// median is about two round trips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_far_away_a_check_waits_one_round_trip_not_two() {
    const WARM_UP: usize = 10;
    const MEASURED: usize = 15;
    let server = RedisServer::start();
    let proxy = support::Proxy::start_delayed(server.port(), Duration::from_millis(25));
    let ping = {
        let url = proxy.url();
        tokio::task::spawn_blocking(move || far::ping_median(&url))
            .await
            .unwrap()
    };
    let store = RedisStore::builder()
        .leases(false)
        .url(proxy.url())
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let policy = Policy::from(tollgate::Quota::per_second(1_000_000).unwrap());
    for callers in [4usize, 16] {
        let keys = (0..callers).map(|i| format!("far{callers}:{i}"));
        let took = far::check_times(&store, &policy, keys, WARM_UP, MEASURED).await;
        far::assert_about_one_round_trip(&format!("{callers} callers"), ping, took);
    }
}

/// On loopback under sustained load, round trips are Redis's and this
/// process's own work rather than the network's: the in-flight limit stays
/// near its floor and checks still share script calls. 16 callers on two
/// worker threads each check 400 times in a loop; Redis runs fewer script
/// calls than there were checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_loopback_under_load_checks_still_share_script_calls() {
    const CALLERS: usize = 16;
    const CHECKS: usize = 400;
    let server = RedisServer::start();
    let store = server.store();
    let policy = Policy::from(tollgate::Quota::per_second(1_000_000).unwrap());
    // The script loaded and the connection up before counting.
    let _ = store.check("warm", &policy, 1).await.unwrap();
    server.reset_stats();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                let key = format!("near:{i}");
                for _ in 0..CHECKS {
                    assert!(store.check(&key, &policy, 1).await.unwrap().allowed());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let checks = (CALLERS * CHECKS) as u64;
    let calls = server.calls("evalsha") + server.calls("eval");
    println!(
        "{checks} checks in {calls} script calls ({:.3} a check)",
        calls as f64 / checks as f64
    );
    assert!(calls < checks, "{calls} script calls for {checks} checks");
}

/// A lone check goes out from its caller's future; the checks that queue
/// behind its call go out when it ends. A caller that goes away mid-call (a
/// client that disconnected: its future dropped) must not strand them.
/// Redis frozen, two callers take the store's two call slots (a new store
/// starts with two) and a third check queues behind them; both callers go
/// away, Redis thaws, and the queued check gets its answer from Redis. Were
/// it stranded, it would wait for its timeout, 20 s.
#[tokio::test]
async fn a_check_queued_behind_callers_that_went_away_mid_call_is_answered() {
    use std::task::{Context, Waker};
    let server = RedisServer::start();
    let store = server.store_with_timeout(Duration::from_secs(20));
    let policy = Policy::from(tollgate::Quota::per_hour(10).unwrap());
    // Connected, and the script loaded.
    assert!(store.check("warm", &policy, 1).await.unwrap().allowed());
    server.freeze();
    let mut callers: Vec<_> = ["a", "b", "queued"]
        .into_iter()
        .map(|key| Box::pin(store.check(key, &policy, 1)))
        .collect();
    // One poll each, in order: each is sent or queued on its first poll.
    for check in &mut callers {
        let polled = check.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        assert!(polled.is_pending(), "answered by a frozen Redis");
    }
    let queued = callers.pop().unwrap();
    // The two calls reach the frozen server (their connection's task runs),
    // then their callers go away.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(callers);
    server.thaw();
    let d = queued.await.expect("the queued check was not answered");
    assert!(d.allowed() && d.remaining() == 9, "{d:?}");
}

/// The same when the callers time out mid-call rather than go away: Redis
/// frozen, two callers' calls take the store's two call slots, a third
/// check queues half a timeout later, the first two time out, Redis thaws,
/// and the queued check, half a timeout from its own deadline, gets its
/// answer from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_queued_behind_callers_that_timed_out_is_answered() {
    let timeout = Duration::from_secs(4);
    let server = RedisServer::start();
    let store = server.store_with_timeout(timeout);
    let policy = Policy::from(tollgate::Quota::per_hour(10).unwrap());
    assert!(store.check("warm", &policy, 1).await.unwrap().allowed());
    let check = |key: &'static str| {
        let (store, policy) = (store.clone(), policy.clone());
        tokio::spawn(async move { store.check(key, &policy, 1).await })
    };
    server.freeze();
    let callers = [check("a"), check("b")];
    tokio::time::sleep(timeout / 2).await;
    let queued = check("queued");
    for caller in callers {
        let err = caller.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), tollgate::ErrorKind::Timeout, "{err}");
    }
    server.thaw();
    let d = queued
        .await
        .unwrap()
        .expect("the queued check was not answered");
    assert!(d.allowed() && d.remaining() == 9, "{d:?}");
}
