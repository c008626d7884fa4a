//! The layer's delay mode through real sockets against a real Redis: a burst
//! leaves at the refill rate, one store call per request; the bound on held
//! requests; a client that goes away while held.
//!
//! Times are measured on the server (when the handler runs) and checked
//! against the tokens' due instants, which Redis's clock decides: a handler
//! can run late on a busy machine but never before its token is due, so the
//! lower bounds are tight and the upper bounds generous. Every figure is
//! printed.
#![cfg(all(feature = "redis", feature = "axum"))]

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use support::RedisServer;
use support::http::{Client, TestServer};
use tokio::io::AsyncWriteExt;
use tollgate::layer::{Delay, RateLimitLayer};
use tollgate::{Policy, Quota, RedisStore};

/// A store that sends every decision as a script call of its own (no
/// batching), so script calls count decisions; its script already loaded, so
/// no `NOSCRIPT` round comes into the counts.
async fn unbatched(server: &RedisServer) -> RedisStore {
    let store = RedisStore::builder()
        .leases(false)
        .pool(server.pool())
        .timeout(Duration::from_secs(5))
        .max_batch(1)
        .build()
        .unwrap();
    let warm = Policy::new("warm", [Quota::per_second(1).unwrap()]).unwrap();
    let _ = tollgate::Store::check(&store, "warm", &warm, 1)
        .await
        .unwrap();
    store
}

/// When each request reached the handler, since `start`.
type Arrivals = Arc<Mutex<Vec<Duration>>>;

fn app(layer: RateLimitLayer, start: Instant, arrivals: Arrivals) -> Router {
    Router::new()
        .route(
            "/",
            get(move || async move {
                arrivals.lock().unwrap().push(start.elapsed());
                "ok"
            }),
        )
        .layer(layer)
}

fn sorted(arrivals: &Arrivals) -> Vec<Duration> {
    let mut v = arrivals.lock().unwrap().clone();
    v.sort();
    v
}

#[tokio::test]
async fn a_burst_is_forwarded_at_the_refill_rate() {
    let redis = RedisServer::start();
    const N: usize = 8;
    // 10 a second, bursts of 1: a token every 100 ms.
    let policy = Policy::new("shaped", [Quota::per_second(10).unwrap().burst(1).unwrap()]).unwrap();
    let interval = Duration::from_millis(100);
    let layer =
        RateLimitLayer::new(unbatched(&redis).await, policy.clone()).delay(Duration::from_secs(5));
    let start = Instant::now();
    let arrivals: Arrivals = Arc::default();
    let server = TestServer::axum(app(layer, start, Arc::clone(&arrivals))).await;
    let client = Client::new();
    redis.reset_stats();
    let sent = Instant::now();
    let url = server.url("/");
    let replies: Vec<_> = (0..N)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { client.get(&url).await })
        })
        .collect();
    for reply in replies {
        let reply = reply.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        assert!(reply.header("ratelimit").is_some(), "{reply:?}");
    }
    let times = sorted(&arrivals);
    let offset = sent - start;
    let span = times[N - 1] - times[0];
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    let rate = (N - 1) as f64 / span.as_secs_f64();
    println!(
        "delay mode, {N} requests at once, 10/s burst 1: forwarded at {times:?} \
         (sent at {offset:?}); gaps {gaps:?}; span {span:?}, {rate:.2} requests/s"
    );
    // Request k is forwarded no earlier than its token: k intervals after the
    // first reservation, which Redis made after the burst was sent (1 ms for
    // rounding between Redis's clock and this one).
    for (k, at) in times.iter().enumerate() {
        let due = offset + interval * k as u32;
        assert!(
            *at + Duration::from_millis(1) >= due,
            "request {k} forwarded at {at:?}, before its token at {due:?}"
        );
    }
    // And not absurdly later: the rate is the refill rate, within generous
    // bounds for a busy machine.
    assert!(times[N - 1] < offset + interval * (N as u32 - 1) + Duration::from_secs(3));
    // Counted from the burst's sending (the last is forwarded at least 700 ms
    // after it), so a late first forward cannot inflate it.
    let overall = (N - 1) as f64 / (times[N - 1] - offset).as_secs_f64();
    assert!((1.8..=10.1).contains(&overall), "{overall:.2} requests/s");
    // Spread out, not forwarded together once the last is due: the first and
    // the last at least half the 700 ms apart (room for a 350 ms stall).
    assert!(span >= interval * (N as u32 - 1) / 2, "{times:?}");
    // One store call per request: N script calls, N decisions (a GET of
    // the bucket and one of the server's epoch key each), none polled.
    assert_eq!(redis.calls("evalsha"), N as u64);
    assert_eq!(redis.calls("get"), 2 * N as u64);

    // Without delay mode a burst is refused after the first request (here
    // with a token every 10 s, so none refills while the burst is sent).
    let refused = RateLimitLayer::new(
        unbatched(&redis).await,
        Policy::new("refused", [Quota::per_minute(6).unwrap().burst(1).unwrap()]).unwrap(),
    );
    let plain = TestServer::axum(app(refused, start, Arc::default())).await;
    let url = plain.url("/");
    let replies: Vec<_> = (0..N)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { client.get(&url).await.status })
        })
        .collect();
    let mut ok = 0;
    for reply in replies {
        if reply.await.unwrap() == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 1, "{ok} of {N} admitted without delay mode");
}

#[tokio::test]
async fn a_full_waiting_bound_answers_429_with_the_wait() {
    let redis = RedisServer::start();
    // A token every 2 s, bursts of 1, held up to 10 s, at most 2 held at once.
    let layer = RateLimitLayer::new(
        unbatched(&redis).await,
        Quota::new(1, Duration::from_secs(2)).unwrap(),
    )
    .delay(Delay::new(Duration::from_secs(10)).max_waiting(2).unwrap());
    let start = Instant::now();
    let arrivals: Arrivals = Arc::default();
    let server = TestServer::axum(app(layer.clone(), start, Arc::clone(&arrivals))).await;
    let client = Client::new();
    let url = server.url("/");
    let first = client.get(&url).await;
    assert_eq!(first.status, StatusCode::OK);
    let drained = start.elapsed();
    let held: Vec<_> = (0..2)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { client.get(&url).await })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while layer.waiting() < 2 {
        assert!(
            Instant::now() < deadline,
            "the two requests were never held"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Both slots taken: the next requests are checked without waiting, and
    // refused with the wait their token is away (behind the two held ones,
    // 6 s after the first, less the time since; the slots stay taken for 2 s).
    for _ in 0..2 {
        let reply = client.get(&url).await;
        println!(
            "bound full after {:?}: {} retry-after {:?}",
            start.elapsed(),
            reply.status,
            reply.retry_after()
        );
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
        let retry = reply.retry_after().unwrap();
        assert!((5..=6).contains(&retry), "retry-after {retry}");
        assert_eq!(reply.header("cache-control"), Some("no-store"));
    }
    for reply in held {
        assert_eq!(reply.await.unwrap().status, StatusCode::OK);
    }
    let times = sorted(&arrivals);
    println!("drained at {drained:?}, forwarded at {times:?}");
    assert_eq!(times.len(), 3, "only the held requests reached the handler");
    // The held ones 2 s and 4 s after the first (1 ms for clock rounding).
    assert!(times[1] + Duration::from_millis(1) >= Duration::from_secs(2));
    assert!(times[2] + Duration::from_millis(1) >= Duration::from_secs(4));
    assert_eq!(layer.waiting(), 0);
}

/// A client that disconnects while its request is held: the server drops the
/// request (hyper cancels the service future), which frees its slot at once,
/// and the handler never runs; its reservation stays spent, so the next
/// request waits behind it.
#[tokio::test]
async fn a_client_that_disconnects_while_held_frees_its_slot_and_spends_its_tokens() {
    let redis = RedisServer::start();
    // 30 a minute, bursts of 1: a token every 2 s.
    let interval = Duration::from_secs(2);
    let layer = RateLimitLayer::new(
        unbatched(&redis).await,
        Quota::per_minute(30).unwrap().burst(1).unwrap(),
    )
    .delay(Duration::from_secs(30));
    let start = Instant::now();
    let arrivals: Arrivals = Arc::default();
    let server = TestServer::axum(app(layer.clone(), start, Arc::clone(&arrivals))).await;
    let client = Client::new();
    let url = server.url("/");
    assert_eq!(client.get(&url).await.status, StatusCode::OK);
    let drained = start.elapsed();

    let mut quitter = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    quitter
        .write_all(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while layer.waiting() < 1 {
        assert!(Instant::now() < deadline, "the request was never held");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held_at = start.elapsed();
    drop(quitter);
    while layer.waiting() > 0 {
        assert!(
            Instant::now() < deadline + interval,
            "the slot was never freed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let freed_at = start.elapsed();
    println!(
        "drained at {drained:?}; held at {held_at:?}; client gone, slot free after {:?}",
        freed_at - held_at
    );
    // Freed at once, not when its token came due (2 s after the first
    // request, about as long after it was held).
    assert!(
        freed_at < held_at + interval / 2,
        "freed at {freed_at:?}: only when its wait ended"
    );

    // The next request's token is the third: the quitter's stays spent.
    let reply = client.get(&url).await;
    assert_eq!(reply.status, StatusCode::OK);
    let times = sorted(&arrivals);
    println!("forwarded at {times:?}");
    assert_eq!(
        times.len(),
        2,
        "the quitter's request reached the handler: {times:?}"
    );
    assert!(
        times[1] + Duration::from_millis(1) >= interval * 2,
        "the next request came at {:?}, so the quitter's token was given back",
        times[1]
    );
    assert!(times[1] < interval * 2 + Duration::from_secs(5));
}

/// gRPC calls are held the same way on a tonic server; a call that would
/// wait longer than allowed gets `RESOURCE_EXHAUSTED`, never a bare 429.
#[tokio::test]
async fn grpc_calls_are_held_too() {
    use support::grpc::{GrpcServer, check, within};

    let redis = RedisServer::start();
    // 2 a second, bursts of 1: a token every 500 ms; held up to 1.25 s.
    let layer = RateLimitLayer::new(
        unbatched(&redis).await,
        Quota::per_second(2).unwrap().burst(1).unwrap(),
    )
    .key(tollgate::key::Global)
    .delay(Duration::from_millis(1250));
    let server = GrpcServer::start(layer).await;
    // Connected first, so that the four calls reach the layer together.
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(server.client().await);
    }
    let start = Instant::now();
    let calls: Vec<_> = clients
        .into_iter()
        .map(|mut client| async move {
            let outcome = within(client.check(check(&[]))).await;
            (outcome.map(|_| ()).map_err(|s| s.code()), start.elapsed())
        })
        .collect();
    let mut outcomes = futures_join(calls).await;
    outcomes.sort_by_key(|(_, at)| *at);
    println!("gRPC calls, 2/s burst 1, held up to 1.25 s: {outcomes:?}");
    let ok: Vec<Duration> = outcomes
        .iter()
        .filter(|(o, _)| o.is_ok())
        .map(|(_, at)| *at)
        .collect();
    let refused: Vec<_> = outcomes.iter().filter_map(|(o, _)| o.err()).collect();
    // Three fit (due at 0, 500 and 1000 ms), the fourth would wait 1.5 s
    // (unless it came 250 ms after the first).
    assert_eq!(ok.len(), 3, "{outcomes:?}");
    assert_eq!(refused, [tonic::Code::ResourceExhausted], "{outcomes:?}");
    assert!(
        ok[2] + Duration::from_millis(1) >= Duration::from_millis(1000),
        "{ok:?}"
    );
}

/// Runs the futures concurrently on this task and collects their outputs.
async fn futures_join<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut set = Vec::new();
    for f in futures {
        set.push(Box::pin(f));
    }
    let mut out: Vec<Option<F::Output>> = (0..set.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in set.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|v| v.expect("every future ran"))
        .collect()
}
