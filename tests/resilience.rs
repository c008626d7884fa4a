//! What a store problem costs the caller, against real redis-server processes
//! and real faults (SIGSTOP, SIGKILL, a proxy that delays or drops traffic):
//! the circuit breaker, the connection lifecycle, the in-process fallback and
//! out-of-memory answers.
//!
//! Faults are injected with short store timeouts (100 ms); recovery is asserted
//! with generous bounds a busy 2-core machine keeps, and the figures are
//! printed. `benches/outage.sh` measures the same things under load.
#![cfg(feature = "redis")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{Proxy, RedisServer};
use tollgate::store::{CircuitBreaker, RedisStoreBuilder};
use tollgate::{Error, ErrorKind, Fallback, Policy, Quota, RateLimiter, RedisStore, Store};

const TIMEOUT: Duration = Duration::from_millis(100);

/// A store without leases (so every check reaches Redis) at `url`, with
/// this call timeout; the test adds the rest.
fn unleased(url: String, timeout: Duration) -> RedisStoreBuilder {
    RedisStore::builder()
        .leases(false)
        .url(url)
        .timeout(timeout)
}

fn store_at(url: String) -> RedisStore {
    unleased(url, TIMEOUT).build().expect("store")
}

fn policy() -> Policy {
    Policy::new("resilience", [Quota::per_second(1_000_000).unwrap()]).unwrap()
}

/// Checks `key` until Redis answers: a fresh store's first call also connects
/// and loads the script, which a busy machine can stretch past [`TIMEOUT`].
async fn answered(store: &RedisStore, key: &str) -> tollgate::Decision {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match store.check(key, &policy(), 1).await {
            Ok(d) => return d,
            Err(e) if e.is_store_error() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("no answer within 30 s: {e}"),
        }
    }
}

/// One finished call: when it started and ended (since the test began) and
/// what kind of failure it was, if any.
#[derive(Clone, Copy, Debug)]
struct Call {
    start: Duration,
    end: Duration,
    failure: Option<ErrorKind>,
}

/// Checks from `tasks` tasks, back to back, for `run`.
async fn hammer(store: &RedisStore, tasks: usize, run: Duration, t0: Instant) -> Vec<Call> {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let policy = policy();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (store, calls, policy) = (store.clone(), Arc::clone(&calls), policy.clone());
            tokio::spawn(async move {
                let deadline = Instant::now() + run;
                while Instant::now() < deadline {
                    let start = t0.elapsed();
                    let result = store.check(&format!("k{i}"), &policy, 1).await;
                    let call = Call {
                        start,
                        end: t0.elapsed(),
                        failure: result.err().map(|e| e.kind()),
                    };
                    calls.lock().unwrap().push(call);
                    if call.failure == Some(ErrorKind::CircuitOpen) {
                        // Open breaker: answers are instant; pace the loop.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    let mut calls = calls.lock().unwrap().clone();
    calls.sort_by_key(|c| c.start);
    calls
}

/// Checks behind calls that hang (Redis frozen) are answered by their own
/// deadline, when they were queued plus the store timeout, wherever they
/// wait: in a call, or in the queue, also behind more checks than the next
/// calls take. A store keeps two calls in flight; with batches of two, the
/// last of five queued checks is still queued when the first calls give up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_behind_hung_calls_are_answered_by_their_own_deadlines() {
    const LONG: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let store = unleased(server.url(), LONG)
        .max_batch(2)
        // Every check goes to Redis: an open breaker would answer the later
        // ones at once, and this is about the calls and the queue.
        .circuit_breaker(CircuitBreaker::disabled())
        .build()
        .expect("store");
    let _ = answered(&store, "warm").await;
    server.freeze();
    let check = |key: &'static str| {
        let store = store.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let result = store.check(key, &policy(), 1).await;
            (key, result.err(), t.elapsed())
        })
    };
    let hung = [check("first"), check("second")];
    // Both calls are out (and hang) before the next checks come.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let queued = ["third", "fourth", "fifth", "sixth", "seventh"].map(check);
    for task in hung.into_iter().chain(queued) {
        let (key, error, waited) = task.await.unwrap();
        println!("{key}: {error:?} after {waited:?}");
        assert!(
            matches!(error, Some(Error::Timeout(t)) if t == LONG),
            "{key}: {error:?}"
        );
        // Answered only when it leaves the queue, the seventh check would
        // wait about 1.9 s: the calls that end at about 1 s take four.
        assert!(waited >= LONG * 9 / 10, "{key} answered early: {waited:?}");
        assert!(waited < LONG + LONG / 2, "{key} waited {waited:?}");
    }
    server.thaw();
}

/// Stragglers heard just before a newer check's answer do not keep the
/// breaker open. The calls in flight hang, and the checks queued with them
/// give up at their own deadlines, a moment after the calls: five failures,
/// and the breaker opens. Redis answers again a moment later, and so does the
/// call that took the queue when the hung calls ended, to a check sent after
/// all five. Had that answer been heard first, the five would have counted
/// for nothing: the breaker closes at once, rather than refuse every check
/// until a probe (after a cluster failover, 87 checks were refused this way
/// after checks had resumed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_answered_after_the_stragglers_that_opened_the_breaker_closes_it() {
    const LONG: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let store = unleased(server.url(), LONG)
        // Longer than the test: only an answer closes the breaker, no probe.
        .circuit_breaker(
            CircuitBreaker::new()
                .first_probe(Duration::from_secs(60))
                .max_cooldown(Duration::from_secs(60)),
        )
        .build()
        .expect("store");
    let _ = answered(&store, "warm").await;
    let t0 = Instant::now();
    server.freeze();
    let check = |key: &'static str| {
        let store = store.clone();
        tokio::spawn(async move { store.check(key, &policy(), 1).await })
    };
    // The store's two calls hang, ending at 2 s; the next call takes the
    // queue then, and hangs until the thaw.
    let hung = [check("hung1"), check("hung2")];
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Queued: they give up at 2.2 s, after that call took them, before it is
    // answered.
    let queued = [check("queued1"), check("queued2"), check("queued3")];
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Sent after all of them, queued too; it waits until 2.8 s.
    let newer = check("newer");
    for task in hung.into_iter().chain(queued) {
        let err = task.await.unwrap().unwrap_err();
        assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    }
    assert!(
        matches!(
            store.check("open", &policy(), 1).await,
            Err(Error::CircuitOpen { .. })
        ),
        "five failures in a row did not open the breaker"
    );
    tokio::time::sleep(
        (t0 + Duration::from_millis(2_500)).saturating_duration_since(Instant::now()),
    )
    .await;
    server.thaw();
    let answer = newer.await.unwrap();
    assert!(answer.is_ok(), "the newer check: {answer:?}");
    let after = store.check("after", &policy(), 1).await;
    assert!(
        after.is_ok(),
        "the breaker stayed open after a newer check was answered: {after:?}"
    );
}

/// A malformed script reply (rewritten by the harness's proxy) is a failure
/// for the circuit breaker, on a call of its own (`max_batch(1)`) as in a
/// batch: a server that answers what no script sends cannot decide. Three
/// in a row open the breaker, and a probe answered so does not close it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_replies_count_as_failures_on_every_path() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    // Cool-downs of 100-200 ms: the checks right after the breaker opens
    // find it open, and a probe is due 250 ms later.
    let cool_down = Duration::from_millis(200);
    let stores = [1, 64].map(|max_batch| {
        unleased(proxy.url(), Duration::from_secs(1))
            .max_batch(max_batch)
            .circuit_breaker(
                CircuitBreaker::new()
                    .first_probe(cool_down)
                    .max_cooldown(cool_down),
            )
            .build()
            .unwrap()
    });
    for store in &stores {
        let _ = answered(store, "warm").await;
    }
    proxy.corrupt_script_replies();
    for store in &stores {
        for _ in 0..3 {
            let err = store.check("bent", &policy(), 1).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Server, "{err}");
        }
        let open = store.check("bent", &policy(), 1).await;
        assert!(
            matches!(open, Err(Error::CircuitOpen { .. })),
            "three malformed replies did not open the breaker ({store:?}): {open:?}"
        );
        tokio::time::sleep(cool_down + Duration::from_millis(50)).await;
        // The probe: answered, malformed.
        let probe = store.check("bent", &policy(), 1).await.unwrap_err();
        assert!(
            !matches!(probe, Error::CircuitOpen { .. }),
            "no probe after the cool-down"
        );
        // Its task has ended by now; the next cool-down is at least 100 ms.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let after = store.check("bent", &policy(), 1).await;
        assert!(
            matches!(after, Err(Error::CircuitOpen { .. })),
            "a probe answered with a malformed reply closed the breaker ({store:?}): {after:?}"
        );
    }
}

/// A frozen Redis (SIGSTOP: sockets open, nobody answers) costs the calls in
/// flight one timeout, then the breaker opens: checks fail at once with
/// `CircuitOpen`, and only one probe at a time waits the timeout. When Redis
/// thaws, the next probe closes the breaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_costs_one_timeout_per_probe_not_per_check() {
    let server = RedisServer::start();
    let store = store_at(server.url());
    let _ = answered(&store, "warm").await;
    server.freeze();
    let t0 = Instant::now();
    let calls = hammer(&store, 16, Duration::from_millis(2_500), t0).await;

    // The breaker is open from its first answer on; checks already waiting
    // then (in flight, or queued for the next batch) may have waited up to the
    // timeout, every check sent after that must not, but the probes.
    let opened = calls
        .iter()
        .filter(|c| c.failure == Some(ErrorKind::CircuitOpen))
        .map(|c| c.end)
        .min()
        .expect("the breaker never opened");
    let slow: Vec<&Call> = calls
        .iter()
        .filter(|c| c.failure == Some(ErrorKind::Timeout))
        .collect();
    let instant: Vec<Duration> = calls
        .iter()
        .filter(|c| c.failure == Some(ErrorKind::CircuitOpen) && c.start >= opened)
        .map(|c| c.end - c.start)
        .collect();
    let mut sorted = instant.clone();
    sorted.sort();
    let p90 = sorted[sorted.len() * 9 / 10];
    let probes: Vec<&&Call> = slow.iter().filter(|c| c.start >= opened).collect();
    println!(
        "{} calls; breaker open after {opened:?}; {} timeouts ({} probes); open answers p90 {p90:?}, max {:?}",
        calls.len(),
        slow.len(),
        probes.len(),
        sorted.last()
    );
    assert!(
        calls.iter().all(|c| c.failure.is_some()),
        "a frozen Redis answered"
    );
    // Only calls already under way when the breaker opened (at most two per
    // task: the one in flight at the freeze and the next), and the probes, waited.
    assert!(slow.len() <= 2 * 16 + probes.len(), "{slow:?}");
    let early = calls.iter().filter(|c| c.start < opened).count();
    assert!(early <= 2 * 16, "{early} checks before the breaker opened");
    // 2.5 s of cool-downs of at least 125 ms, then at least 250 ms: a handful.
    assert!(
        (1..=12).contains(&probes.len()),
        "{} probes in 2.5 s",
        probes.len()
    );
    // Never more than one probe in flight.
    for pair in probes.windows(2) {
        assert!(pair[1].start >= pair[0].end, "overlapping probes: {pair:?}");
    }
    // An open breaker answers without waiting for anything.
    assert!(instant.len() > 100, "only {} open answers", instant.len());
    assert!(
        sorted.iter().all(|d| *d < TIMEOUT),
        "an open-breaker answer waited the timeout"
    );
    assert!(p90 < Duration::from_millis(10), "open answers p90 {p90:?}");

    server.thaw();
    let thawed = Instant::now();
    let resumed = loop {
        if store.check("after", &policy(), 1).await.is_ok() {
            break thawed.elapsed();
        }
        assert!(
            thawed.elapsed() < Duration::from_secs(5),
            "no answer after thawing"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!("decisions resumed {resumed:?} after the thaw");
    // The longest cool-down is 500 ms; give a busy machine more than a second.
    assert!(
        resumed < Duration::from_secs(2),
        "resumed after {resumed:?}"
    );
}

/// The probes of a frozen Redis hold no check for the store timeout: the
/// check that takes a probe waits for it only briefly, and the probe's call
/// goes on in the background. So once the breaker is open, no check waits
/// anywhere near the timeout (here 1 s), across several probes, while the
/// probes still find Redis back once it thaws. A probe that made its check
/// wait would cost that client the whole timeout once per cool-down, which
/// under load is a fixed share of every second's requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probes_of_a_frozen_redis_keep_no_check_waiting() {
    const LONG: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let store = unleased(server.url(), LONG)
        // Short cool-downs: a probe about every second (its call's timeout
        // and a cool-down), so several during the freeze.
        .circuit_breaker(
            CircuitBreaker::new()
                .first_probe(Duration::from_millis(20))
                .max_cooldown(Duration::from_millis(50)),
        )
        .build()
        .expect("store");
    let _ = answered(&store, "warm").await;
    server.freeze();
    let t0 = Instant::now();
    let calls = hammer(&store, 16, Duration::from_millis(4_000), t0).await;

    let opened = calls
        .iter()
        .filter(|c| c.failure == Some(ErrorKind::CircuitOpen))
        .map(|c| c.end)
        .min()
        .expect("the breaker never opened");
    let after: Vec<&Call> = calls.iter().filter(|c| c.start >= opened).collect();
    // The checks that took a probe: a frozen Redis never answers them.
    let probes: Vec<&&Call> = after
        .iter()
        .filter(|c| c.failure == Some(ErrorKind::Timeout))
        .collect();
    // Waited at least half the timeout: a probe's check kept waiting for
    // Redis. Answered at once, a check takes microseconds to milliseconds,
    // a hundred times less: no busy machine turns one into the other.
    let waited: Vec<&&Call> = after
        .iter()
        .filter(|c| c.end - c.start >= LONG / 2)
        .collect();
    let longest = after.iter().map(|c| c.end - c.start).max();
    println!(
        "{} checks; breaker open after {opened:?}; {} checks after that, {} of them probes, \
         the longest {longest:?}; {} waited half the timeout or more: {waited:?}",
        calls.len(),
        after.len(),
        probes.len(),
        waited.len()
    );
    assert!(
        calls.iter().all(|c| c.failure.is_some()),
        "a frozen Redis answered"
    );
    assert!(probes.len() >= 2, "{} probes: {probes:?}", probes.len());
    assert!(
        waited.is_empty(),
        "{} checks waited for a probe: {waited:?}",
        waited.len()
    );

    server.thaw();
    let thawed = Instant::now();
    let resumed = loop {
        if store.check("after", &policy(), 1).await.is_ok() {
            break thawed.elapsed();
        }
        assert!(
            thawed.elapsed() < Duration::from_secs(10),
            "no answer after thawing"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!("decisions resumed {resumed:?} after the thaw");
    // A probe in flight is answered at the thaw; the next one is due within
    // 50 ms. Generous for a busy machine.
    assert!(
        resumed < Duration::from_secs(3),
        "resumed after {resumed:?}"
    );
}

/// With a fallback, a killed Redis changes who decides, not whether the limit
/// holds: the in-process store enforces the same quota, and Redis decides again
/// once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_limits_while_redis_is_down_and_redis_decides_again_when_back() {
    let mut server = RedisServer::start();
    let store = store_at(server.url());
    let _ = answered(&store, "warm").await;
    let limiter =
        RateLimiter::new(store, Quota::per_minute(5).unwrap()).fallback(Fallback::memory());
    for left in [4, 3] {
        let d = limiter.check("client", 1).await.unwrap();
        assert_eq!(
            (d.allowed(), d.remaining(), d.is_fallback()),
            (true, left, false)
        );
    }
    server.stop();
    // The fallback's bucket starts full: 5 admitted, then limited, every
    // decision marked as the fallback's.
    for left in (0..5).rev() {
        let d = limiter.check("client", 1).await.unwrap();
        assert!(d.is_fallback(), "{d:?}");
        assert_eq!((d.allowed(), d.remaining()), (true, left));
    }
    for _ in 0..50 {
        let d = limiter.check("client", 1).await.unwrap();
        assert!(d.is_fallback() && !d.allowed(), "{d:?}");
    }
    assert!(limiter.configured_fallback().unwrap().is_active());

    server.restart();
    let back = Instant::now();
    let resumed = loop {
        let d = limiter.check("other", 1).await.unwrap();
        if !d.is_fallback() {
            break back.elapsed();
        }
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "Redis never decided again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!("Redis decided again {resumed:?} after it came back");
    assert!(
        resumed < Duration::from_secs(2),
        "resumed after {resumed:?}"
    );
    assert!(!limiter.configured_fallback().unwrap().is_active());
    // The restarted Redis is empty: a fresh bucket, decided by Redis.
    let d = limiter.check("client", 1).await.unwrap();
    assert_eq!(
        (d.allowed(), d.remaining(), d.is_fallback()),
        (true, 4, false)
    );
}

/// A connect slower than the call timeout (a TLS handshake across zones, a
/// loaded server) is not cancelled with the call: it completes and serves the
/// next calls, on the one connection it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_slower_than_the_call_timeout_still_completes() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.delay_new_connections(Duration::from_millis(400));
    let store = unleased(proxy.url(), TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let first = store.check("slow", &policy(), 1).await.unwrap_err();
    assert!(matches!(first, Error::Timeout(_)), "{first:?}");
    let start = Instant::now();
    let answered = loop {
        match store.check("slow", &policy(), 1).await {
            Ok(d) => break d,
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "never connected: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(answered.allowed());
    assert_eq!(proxy.accepted(), 1, "the slow connect was restarted");
}

/// One call that is merely slow (Redis answers no one for 300 ms) times out,
/// but the connection is healthy: the background PING keeps it, and no new
/// connection is made.
///
/// Another client holds Redis with `CLIENT PAUSE 300 ALL`, whose end the
/// server times by its own clock. A script that spins until `TIME` has moved
/// 300 ms would spin for good on Redis 7.2+ and Valkey, where `TIME` stands
/// still while a script runs: it ends only once the server, busy for 5 s
/// (`busy-reply-threshold`), starts answering `BUSY`, and by then the PING
/// has timed out and the connection is rightly dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_call_does_not_drop_a_healthy_connection() {
    let server = RedisServer::start();
    let store = store_at(server.url());
    let _ = answered(&store, "warm").await;
    let connections = || -> u64 {
        let info: String = server.cmd(&["INFO", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    let before = connections();
    // Another client makes Redis answer no one for 300 ms; the thread ends
    // with the pause.
    let url = server.url();
    let busy = std::thread::spawn(move || {
        let mut conn = deadpool_redis::redis::Client::open(url)
            .unwrap()
            .get_connection()
            .unwrap();
        let paused_at = Instant::now();
        let _: () = deadpool_redis::redis::cmd("CLIENT")
            .arg(&["PAUSE", "300", "ALL"])
            .query(&mut conn)
            .unwrap();
        std::thread::sleep(Duration::from_millis(300).saturating_sub(paused_at.elapsed()));
    });
    // Checks answered before the pause starts are fine; the first one sent
    // during it times out.
    let deadline = Instant::now() + Duration::from_secs(10);
    let slow = loop {
        match store.check("slow", &policy(), 1).await {
            Ok(_) if Instant::now() < deadline && !busy.is_finished() => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok(d) => panic!("no check ever met the pause: {d:?}"),
            Err(e) => break e,
        }
    };
    assert!(matches!(slow, Error::Timeout(_)), "{slow:?}");
    busy.join().unwrap();
    // Give the background PING time to answer, then use the store again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..5 {
        assert!(store.check("after", &policy(), 1).await.unwrap().allowed());
    }
    // The pausing client's connection and this INFO's own are the only new
    // ones.
    assert_eq!(connections() - before, 2, "the store reconnected");
}

/// Redis out of memory under `noeviction`: writes are refused with `OOM`.
/// Admissions fail as `ErrorKind::OutOfMemory` (visible, not silent), and a
/// fallback keeps limiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_is_an_error_of_its_own_and_the_fallback_limits() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    // Connected and the script loaded first, so the call below meets only
    // the refusal.
    let store = store_at(server.url());
    let _ = answered(&store, "warm").await;
    // A limit below what Redis already uses: every write is refused, whatever
    // the connections' buffers add or free meanwhile.
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    assert!(server.try_cmd::<()>(&["SET", "probe", "v"]).is_err());
    let err = store.check("oom", &policy(), 1).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutOfMemory, "{err}");
    assert!(err.is_store_error());
    assert!(err.to_string().contains("OOM"), "{err}");

    let limiter = RateLimiter::new(
        unleased(server.url(), TIMEOUT)
            .circuit_breaker(CircuitBreaker::disabled())
            .build()
            .unwrap(),
        Quota::per_minute(2).unwrap(),
    )
    .fallback(Fallback::memory());
    let decisions: Vec<(bool, bool)> = futures_decisions(&limiter, 3).await;
    assert_eq!(decisions, [(true, true), (true, true), (true, false)]);
}

/// `n` checks of one key: (decided by the fallback, allowed).
async fn futures_decisions(limiter: &RateLimiter, n: usize) -> Vec<(bool, bool)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let d = limiter.check("oom", 1).await.unwrap();
        out.push((d.is_fallback(), d.allowed()));
    }
    out
}

/// `ping` is the start-up check: it answers with the round trip, or fails
/// naming the server and never its password.
#[tokio::test]
async fn ping_names_the_server_and_never_the_password() {
    let server = RedisServer::start();
    let ok = RedisStore::from_url(&server.url()).unwrap();
    assert!(ok.ping().await.unwrap() < Duration::from_secs(5));
    let dead_port = support::free_port();
    let dead = RedisStore::from_url(&format!("redis://:hunter2@127.0.0.1:{dead_port}")).unwrap();
    let err = dead.ping().await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(&format!("127.0.0.1:{dead_port}")),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
    assert_eq!(err.kind(), ErrorKind::Connection, "{message}");
}
