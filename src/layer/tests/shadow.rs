//! Shadow mode: what would have been refused is forwarded and marked.

use http::{Request, StatusCode};
use tower::{Layer, ServiceExt};

use crate::layer::{RateLimitLayer, ShadowRejection};
use crate::quota::Quota;
use crate::store::MemoryStore;

use super::{body_text, text};

#[tokio::test]
async fn shadow_mode_marks_what_it_would_have_refused_without_a_decision() {
    let inner = tower::service_fn(|req: Request<()>| async move {
        let seen = req.extensions().get::<ShadowRejection>().cloned();
        text(format!("{seen:?}"))
    });
    let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(3).unwrap())
        .key(crate::key::Header::new("x-api-key").unwrap())
        .cost(|parts| if parts.uri.path() == "/big" { 10 } else { 1 })
        .shadow();
    let svc = layer.layer(inner);
    // No key: forwarded, and marked in the request and the response.
    let res = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.extensions().get::<ShadowRejection>(),
        Some(&ShadowRejection::MissingKey {
            kind: "header:x-api-key".into()
        })
    );
    assert!(body_text(res).await.contains("MissingKey"));
    // A cost no wait would admit: forwarded and marked.
    let big = Request::get("/big")
        .header("x-api-key", "k")
        .body(())
        .unwrap();
    let res = svc.clone().oneshot(big).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.extensions().get::<ShadowRejection>(),
        Some(&ShadowRejection::CostTooHigh {
            cost: 10,
            capacity: 3
        })
    );
    // An ordinary admitted request carries no mark.
    let ok = Request::get("/").header("x-api-key", "k").body(()).unwrap();
    let res = svc.oneshot(ok).await.unwrap();
    assert_eq!(res.extensions().get::<ShadowRejection>(), None);
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_reserves_but_never_holds() {
    use crate::layer::Delayed;
    use std::time::Duration;
    use tokio::time::Instant;

    let inner = tower::service_fn(|_: Request<()>| async { text("ok") });
    let svc = RateLimitLayer::new(
        MemoryStore::new(),
        Quota::per_second(2).unwrap().burst(1).unwrap(),
    )
    .key(crate::key::Global)
    .delay(Duration::from_secs(5))
    .shadow()
    .layer(inner);
    let start = Instant::now();
    let _ = svc.clone().oneshot(Request::new(())).await.unwrap();
    let res = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(
        res.extensions().get::<Delayed>(),
        Some(&Delayed::new(Duration::from_millis(500)))
    );
}
