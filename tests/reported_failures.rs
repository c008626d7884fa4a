//! Store failures that are not call failures still show in metrics, like any
//! other: a malformed script reply (through the harness's proxy, which
//! rewrites it), and a batched check whose call is dropped before it answers
//! (the drain's runtime shut down). Its own process: one global metrics
//! recorder, and one test, so the counts are this test's alone.
#![cfg(all(feature = "redis", feature = "metrics"))]

mod support;

use std::time::{Duration, Instant};

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::{Proxy, RedisServer};
use tollgate::{ErrorKind, Policy, Quota, RedisStore, Store};

fn policy() -> Policy {
    Policy::new("reported", [Quota::per_second(1_000_000).unwrap()]).unwrap()
}

/// Checks `store` until Redis answers (connected, script loaded).
async fn warm(store: &RedisStore) {
    let started = Instant::now();
    while store.check("warm", &policy(), 1).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "Redis never answered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_replies_and_dropped_batches_are_reported_store_errors() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let server_errors = || {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| {
                let key = key.key();
                key.name() == "tollgate_store_errors_total"
                    && key
                        .labels()
                        .any(|l| l.key() == "kind" && l.value() == "server")
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum::<u64>()
    };
    let server = RedisServer::start();

    // Malformed replies, on a call of its own and in a batch.
    let proxy = Proxy::start(server.port());
    let stores = [1, 64].map(|max_batch| {
        RedisStore::builder()
            .leases(false)
            .url(proxy.url())
            .max_batch(max_batch)
            .build()
            .unwrap()
    });
    for store in &stores {
        warm(store).await;
    }
    proxy.corrupt_script_replies();
    for store in &stores {
        let before = server_errors();
        let err = store.check("bent", &policy(), 1).await.unwrap_err();
        assert!(err.to_string().contains("unexpected reply"), "{err}");
        assert_eq!(err.kind(), ErrorKind::Server);
        assert_eq!(
            server_errors(),
            before + 1,
            "a malformed reply was not counted as a store error ({store:?})"
        );
    }

    // A dropped batch. A long timeout, so every step below has seconds to
    // spare.
    let timeout = Duration::from_secs(4);
    let store = RedisStore::builder()
        .leases(false)
        .url(server.url())
        .timeout(timeout)
        .build()
        .unwrap();
    warm(&store).await;
    server.freeze();
    // Two checks on another runtime take both of the store's call slots;
    // their calls hang on the frozen server until the timeout.
    let other = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for key in ["a", "b"] {
        let store = store.clone();
        other.spawn(async move { store.check(key, &policy(), 1).await });
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Queued behind them: when their calls time out (2 s from now), a drain
    // on the other runtime takes this check into its next call.
    let queued = {
        let store = store.clone();
        tokio::spawn(async move { store.check("c", &policy(), 1).await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = server_errors();
    // Its call hangs too; the runtime that runs it shuts down, 1 s before the
    // check's own deadline.
    other.shutdown_background();
    let err = queued.await.unwrap().unwrap_err();
    server.thaw();
    assert!(err.to_string().contains("dropped"), "{err}");
    assert_eq!(err.kind(), ErrorKind::Server);
    assert!(err.is_store_error());
    assert_eq!(
        server_errors(),
        before + 1,
        "the dropped batch was not counted as a store error"
    );
}
