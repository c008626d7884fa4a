//! Delay mode: requests held until their tokens are due.

use http::{Request, StatusCode};
use tower::{Layer, ServiceExt};

use crate::layer::RateLimitLayer;
use crate::quota::Quota;
use crate::store::MemoryStore;

use super::{body_text, text};

/// Paused tokio time and the in-memory store (whose clock is tokio's): the
/// held requests are forwarded exactly when their tokens are due.
#[tokio::test(start_paused = true)]
async fn delay_mode_spaces_a_burst_at_the_refill_rate() {
    use crate::layer::Delayed;
    use std::time::Duration;
    use tokio::time::Instant;

    let start = Instant::now();
    let inner = tower::service_fn(move |req: Request<()>| async move {
        let held = req.extensions().get::<Delayed>().map(Delayed::wait);
        text(format!("{:?} {held:?}", start.elapsed()))
    });
    // 10 a second, bursts of 1: a token every 100 ms; held up to 500 ms.
    let layer = RateLimitLayer::new(
        MemoryStore::new(),
        Quota::per_second(10).unwrap().burst(1).unwrap(),
    )
    .key(crate::key::Global)
    .delay(Duration::from_millis(500));
    let svc = layer.clone().layer(inner);
    let calls: Vec<_> = (0..7)
        .map(|_| tokio::spawn(svc.clone().oneshot(Request::new(()))))
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        let res = call.await.unwrap().unwrap();
        let status = res.status();
        let delayed = res.extensions().get::<Delayed>().copied();
        answers.push((status, delayed, body_text(res).await));
    }
    // Forwarded at 0, 100, ..., 500 ms; the seventh would need 600 ms.
    for (i, (status, delayed, body)) in answers.iter().take(6).enumerate() {
        let at = Duration::from_millis(100 * i as u64);
        assert_eq!(*status, StatusCode::OK, "{i}");
        let held = (i > 0).then_some(at);
        assert_eq!(*delayed, held.map(Delayed::new), "{i}");
        assert_eq!(*body, format!("{at:?} {held:?}"), "{i}");
    }
    assert_eq!(answers[6].0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(layer.waiting(), 0);
    // Without delay mode the same burst is refused after the first.
    let plain = RateLimitLayer::new(
        MemoryStore::new(),
        Quota::per_second(10).unwrap().burst(1).unwrap(),
    )
    .key(crate::key::Global)
    .layer(inner);
    let first = plain.clone().oneshot(Request::new(())).await.unwrap();
    let second = plain.oneshot(Request::new(())).await.unwrap();
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS)
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_waiting_bound_is_a_plain_check() {
    use crate::layer::Delay;
    use std::time::Duration;

    let inner = tower::service_fn(|_: Request<()>| async { text("ok") });
    let layer = RateLimitLayer::new(
        MemoryStore::new(),
        Quota::per_second(1).unwrap().burst(1).unwrap(),
    )
    .key(crate::key::Global)
    .delay(Delay::new(Duration::from_secs(10)).max_waiting(2).unwrap());
    assert!(Delay::new(Duration::from_secs(1)).max_waiting(0).is_err());
    let svc = layer.clone().layer(inner);
    // The bucket's one token: admitted at once, nothing held.
    let res = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(layer.waiting(), 0);
    // Two held (due in 1 s and 2 s)...
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(svc.clone().oneshot(Request::new(()))))
        .collect();
    while layer.waiting() < 2 {
        tokio::task::yield_now().await;
    }
    // ...so the next finds no slot: checked without waiting, refused,
    // told when its token would come (3 s: after the two held ones).
    let res = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "3");
    assert_eq!(layer.waiting(), 2);
    for call in held {
        assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_eq!(layer.waiting(), 0);
    // Slots free again: the next request is held, not refused.
    let res = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}
