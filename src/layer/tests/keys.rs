//! Keys: which bucket a request is counted in, and extractors that wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::{Request, StatusCode};
use tower::{Layer, ServiceExt};

use crate::layer::RateLimitLayer;
use crate::quota::Quota;
use crate::store::MemoryStore;

use super::{Waiting, body_text, text};

#[tokio::test]
async fn kinds_of_different_extractors_never_share_a_bucket() {
    let store = MemoryStore::new();
    let inner = tower::service_fn(|_: Request<()>| async { text("ok") });
    let layer = |key| {
        RateLimitLayer::new(store.clone(), Quota::per_minute(1).unwrap())
            .key(key)
            .layer(inner)
    };
    let constant = |kind: &'static str, value: &'static str| {
        crate::key::from_fn(kind, move |_| Some(value.to_owned()))
    };
    let from_peer = || {
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(std::net::SocketAddr::from(([203, 0, 113, 7], 1)));
        req
    };
    // PeerIp spends the bucket of 203.0.113.7...
    let peer = RateLimitLayer::new(store.clone(), Quota::per_minute(1).unwrap()).layer(inner);
    let res = peer.clone().oneshot(from_peer()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(peer.oneshot(from_peer()).await.unwrap().status(), 429);
    // ...which a closure that calls itself `ip` cannot reach.
    let lookalike = layer(constant("ip", "203.0.113.7"));
    let res = lookalike.oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // `a:b` with the value `c` and `a` with the value `b:c` are two buckets.
    let colon_in_kind = layer(constant("a:b", "c"));
    let colon_in_value = layer(constant("a", "b:c"));
    for svc in [colon_in_kind, colon_in_value] {
        let res = svc.oneshot(Request::new(())).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(store.len(), 4);
}

#[tokio::test]
async fn the_default_key_is_the_peer_address() {
    let inner = tower::service_fn(|_: Request<()>| async { text("ok") });
    let store = MemoryStore::new();
    let svc = RateLimitLayer::new(store.clone(), Quota::per_minute(1).unwrap()).layer(inner);
    let from = |ip: [u8; 4]| {
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(std::net::SocketAddr::from((ip, 40_000)));
        req
    };
    for (ip, status) in [
        ([192, 0, 2, 1], 200),
        ([192, 0, 2, 1], 429),
        ([192, 0, 2, 2], 200),
    ] {
        let res = svc.clone().oneshot(from(ip)).await.unwrap();
        assert_eq!(res.status(), status, "from {ip:?}");
    }
    // No peer address: a configuration problem, answered at once.
    let res = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(body_text(res).await.contains("(ip)"));
}

#[tokio::test]
async fn an_extractor_that_waits_is_awaited_and_asked_again_only_once() {
    let asked = Arc::new(AtomicUsize::new(0));
    let chosen = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&chosen);
    let inner = tower::service_fn(|_: Request<()>| async { text("ok") });
    let svc = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(2).unwrap())
        .key(Waiting(Arc::clone(&asked)))
        .select_policy(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            crate::layer::Choice::Default
        })
        .layer(inner);
    for status in [200, 200, 429, 429] {
        let res = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(res.status(), status);
    }
    // The first request's try without waiting polled a future once and
    // dropped it; from then on every request's future is awaited, once,
    // and its policy chosen once.
    assert_eq!(asked.load(Ordering::SeqCst), 5);
    assert_eq!(chosen.load(Ordering::SeqCst), 5);
}
