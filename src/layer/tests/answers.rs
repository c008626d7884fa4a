//! What the layer answers, and what it forwards: statuses, decisions in
//! extensions, inner errors, bodies.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};

use crate::decision::Decision;
use crate::layer::{OnStoreError, RateLimitLayer, StoreFailure};
use crate::quota::Quota;
use crate::store::MemoryStore;

use super::{body_text, text};

#[tokio::test]
async fn rejected_requests_never_reach_the_inner_service() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    let inner = tower::service_fn(move |req: Request<()>| {
        seen.fetch_add(1, Ordering::SeqCst);
        let remaining = req.extensions().get::<Decision>().map(Decision::remaining);
        async move { text(format!("{remaining:?}")) }
    });
    let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(2).unwrap())
        .key(crate::key::Global);
    let svc = layer.layer(inner);
    for expected in ["Some(1)", "Some(0)"] {
        let res = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(body_text(res).await, expected);
    }
    let res = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!res.extensions().get::<Decision>().unwrap().allowed());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// The handler reads the decision in the request extensions; the
/// layer's own answer carries it; the inner service's response carries
/// it only when the layer is asked to put it there, and then the
/// innermost deciding layer's.
#[tokio::test]
async fn forwarded_responses_carry_the_decision_only_when_asked() {
    let inner = tower::service_fn(|req: Request<()>| {
        let remaining = req.extensions().get::<Decision>().map(Decision::remaining);
        async move { text(format!("{remaining:?}")) }
    });
    let layer = |name: &str, tokens| {
        let policy = crate::Policy::new(name, [Quota::per_minute(tokens).unwrap()]).unwrap();
        RateLimitLayer::new(MemoryStore::new(), policy).key(crate::key::Global)
    };
    fn limit<B>(res: &Response<B>) -> Option<u64> {
        res.extensions().get::<Decision>().map(Decision::limit)
    }
    let plain = layer("plain", 1).layer(inner);
    let res = plain.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(limit(&res), None);
    assert_eq!(body_text(res).await, "Some(0)");
    let res = plain.oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limit(&res), Some(1));

    let asked = layer("asked", 2).decision_in_response().layer(inner);
    let res = asked.oneshot(Request::new(())).await.unwrap();
    assert_eq!(limit(&res), Some(2));
    assert_eq!(body_text(res).await, "Some(1)");

    // Nested: the inner layer's decision, as the handler saw it.
    let inner_layer = layer("inner", 3).decision_in_response();
    let outer_layer = layer("outer", 4).decision_in_response();
    let nested = outer_layer.layer(inner_layer.layer(inner));
    let res = nested.oneshot(Request::new(())).await.unwrap();
    assert_eq!(limit(&res), Some(3));
}

/// Without the decision in the request: the handler finds none, and
/// everything else is as before: the rate limit headers, the decision in
/// the response when asked, and in the layer's own answer.
#[tokio::test]
async fn a_layer_told_to_keep_the_decision_out_of_requests_keeps_it_out() {
    let inner = tower::service_fn(|req: Request<()>| {
        let remaining = req.extensions().get::<Decision>().map(Decision::remaining);
        async move { text(format!("{remaining:?}")) }
    });
    let svc = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(2).unwrap())
        .key(crate::key::Global)
        .decision_in_request(false)
        .decision_in_response()
        .layer(inner);
    let res = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.headers()["ratelimit"], "\"default\";r=1;t=30");
    assert_eq!(res.extensions().get::<Decision>().unwrap().remaining(), 1);
    assert_eq!(body_text(res).await, "None");
    let bare = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(1).unwrap())
        .key(crate::key::Global)
        .headers(crate::layer::HeaderStyle::None)
        .decision_in_request(false)
        .layer(inner);
    let res = bare.clone().oneshot(Request::new(())).await.unwrap();
    assert!(res.extensions().get::<Decision>().is_none());
    assert_eq!(body_text(res).await, "None");
    let res = bare.oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!res.extensions().get::<Decision>().unwrap().allowed());
}

#[tokio::test]
async fn inner_errors_pass_through_unchanged() {
    let inner = tower::service_fn(|_: Request<()>| async {
        Err::<Response<Full<Bytes>>, _>("inner failed")
    });
    let svc = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(2).unwrap())
        .key(crate::key::Global)
        .layer(inner);
    assert_eq!(
        svc.oneshot(Request::new(())).await.unwrap_err(),
        "inner failed"
    );
}

#[tokio::test]
async fn a_full_store_keeps_serving_new_clients() {
    // One key fits. The store makes room for a second key, so new
    // clients are served and limited under either store-error policy.
    let store = MemoryStore::with_max_keys(1).unwrap();
    let key = crate::key::from_fn("n", |p| {
        p.headers
            .get("x-client")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    });
    let inner = tower::service_fn(|req: Request<()>| async move {
        text(req.extensions().get::<StoreFailure>().is_some().to_string())
    });
    let layer = RateLimitLayer::new(store.clone(), Quota::per_hour(1).unwrap()).key(key);
    let allow = layer.clone().layer(inner);
    let deny = layer.on_store_error(OnStoreError::Deny).layer(inner);
    let from = |client: &str| {
        Request::get("/")
            .header("x-client", client)
            .body(())
            .unwrap()
    };
    for (svc, client) in [(&allow, "a"), (&allow, "b"), (&deny, "c")] {
        let res = svc.clone().oneshot(from(client)).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{client}");
        assert!(res.extensions().get::<StoreFailure>().is_none());
        assert_eq!(body_text(res).await, "false");
        // ...and limited from its first request on.
        let res = svc.clone().oneshot(from(client)).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{client}");
    }
    assert_eq!(store.len(), 1);
}

/// A body type with nothing but `Body` (no `From<Bytes>`, no `Default`).
struct Opaque(Full<Bytes>);

impl http_body::Body for Opaque {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        std::pin::Pin::new(&mut self.0).poll_frame(cx)
    }
}

#[tokio::test]
async fn any_body_of_bytes_works_without_configuration() {
    let inner = tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Opaque(Full::new(Bytes::from("inner")))))
    });
    let svc = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(1).unwrap())
        .key(crate::key::Global)
        .layer(inner);
    let res = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), 200);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "inner");
    let res = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "60");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "Too Many Requests: retry in 60 s\n");
}
