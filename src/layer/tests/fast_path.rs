//! What a check costs: the futures it boxes, and the inner services it clones.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt};

use crate::layer::RateLimitLayer;
use crate::quota::Quota;
use crate::store::MemoryStore;

use super::{Waiting, text};

/// A request decided at once (memory store, deny cache) boxes no future;
/// the others move their check future into a box, which must not carry
/// the kilobytes of a Redis call's, a fallback's or a reservation's
/// futures more than once: those are boxed where they are awaited.
#[test]
fn the_check_futures_stay_small() {
    let inner = tower::service_fn(|_: Request<()>| async { text("ok") });
    let svc = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(1).unwrap()).layer(inner);
    let (parts, ()) = Request::new(()).into_parts();
    let future = crate::layer::check::check_later(Arc::clone(&svc.config), parts);
    let size = std::mem::size_of_val(&future);
    assert!(size <= 1_400, "the check future is {size} bytes");
}

/// A Redis check the deny cache cannot answer is the one boxed future of
/// its request: the Redis call's future is in it, nothing else large.
#[cfg(feature = "redis")]
#[test]
fn a_redis_checks_future_is_boxed_once_and_stays_small() {
    use crate::layer::check::{InCall, in_call};
    let inner = tower::service_fn(|_: Request<()>| async { text("ok") });
    // Built without connecting: nothing here talks to a server.
    let store = crate::RedisStore::from_url("redis://127.0.0.1:1").unwrap();
    let svc = RateLimitLayer::new(store, Quota::per_minute(1).unwrap())
        .key(crate::key::Global)
        .layer(inner);
    let InCall::Later(future, ()) = in_call(&svc.config, Request::new(())) else {
        panic!("a Redis check with nothing cached must be sent");
    };
    let size = std::mem::size_of_val(&*future);
    // Glibc's allocator serves blocks of up to 1 032 bytes from a
    // per-thread cache; larger ones take its slower shared path.
    assert!(size <= 1_024, "the Redis check future is {size} bytes");
}

/// An inner service that counts its clones.
struct Counted(Arc<AtomicUsize>);

impl Clone for Counted {
    fn clone(&self) -> Self {
        self.0.fetch_add(1, Ordering::SeqCst);
        Counted(Arc::clone(&self.0))
    }
}

impl Service<Request<()>> for Counted {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        std::future::ready(text("ok"))
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn an_open_circuit_breaker_is_answered_in_call_without_cloning_the_service() {
    use crate::store::CircuitBreaker;
    // A port nothing listens on: every call fails at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = crate::RedisStore::builder()
        .url(format!("redis://127.0.0.1:{port}"))
        .circuit_breaker(
            CircuitBreaker::new()
                .failures(1)
                .first_probe(std::time::Duration::from_secs(60))
                .max_cooldown(std::time::Duration::from_secs(60)),
        )
        .build()
        .unwrap();
    let clones = Arc::new(AtomicUsize::new(0));
    let mut svc = RateLimitLayer::new(store, Quota::per_minute(1).unwrap())
        .key(crate::key::Global)
        .layer(Counted(Arc::clone(&clones)));
    let failure = |res: &Response<_>| {
        res.extensions()
            .get::<crate::layer::StoreFailure>()
            .map(|f| matches!(f.error(), crate::Error::CircuitOpen { .. }))
    };
    // The first request goes to Redis (a boxed check that takes the
    // ready service and leaves a clone), fails, and opens the breaker.
    let res = svc.ready().await.unwrap().call(Request::new(())).await;
    let res = res.unwrap();
    assert_eq!(res.status(), 200, "the store error lets it through");
    assert_eq!(failure(&res), Some(false));
    assert_eq!(clones.load(Ordering::SeqCst), 1);
    // While it is open, requests are answered in `call`.
    for _ in 0..3 {
        let res = svc.ready().await.unwrap().call(Request::new(())).await;
        let res = res.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(failure(&res), Some(true));
    }
    assert_eq!(clones.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn requests_decided_at_once_call_the_ready_service_without_cloning_it() {
    let clones = Arc::new(AtomicUsize::new(0));
    let mut svc = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(1).unwrap())
        .key(crate::key::Global)
        .layer(Counted(Arc::clone(&clones)));
    for status in [200, 429] {
        let res = svc.ready().await.unwrap().call(Request::new(())).await;
        assert_eq!(res.unwrap().status(), status);
    }
    assert_eq!(clones.load(Ordering::SeqCst), 0);
    // A check that waits (here: for its extractor) takes the ready
    // service with it and leaves a clone behind.
    let mut waiting = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(1).unwrap())
        .key(Waiting(Arc::new(AtomicUsize::new(0))))
        .layer(Counted(Arc::clone(&clones)));
    let res = waiting.ready().await.unwrap().call(Request::new(())).await;
    assert_eq!(res.unwrap().status(), 200);
    assert_eq!(clones.load(Ordering::SeqCst), 1);
}
