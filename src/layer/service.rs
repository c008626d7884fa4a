//! [`RateLimit`]: the middleware service.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::bodies::{Bodies, Wrapped};
use super::check::{
    Checked, HeldVerdict, Now, Verdict, check, check_held, check_now, check_unsent, refuse_held,
};
use super::config::Config;
use super::dyn_key::BoxFuture;
use super::future::ResponseFuture;

/// Rate limits requests to the inner service `S`.
///
/// Built by [`RateLimitLayer`](super::RateLimitLayer); see the
/// [module docs](crate::layer) for an example and the responses it sends. Its
/// responses carry a [`ResponseBody`](super::ResponseBody) around the inner
/// service's body, so the layer can answer by itself whatever that body type
/// is; with `M` = [`AxumBody`](super::AxumBody)
/// ([`RateLimitLayer::axum_body`](super::RateLimitLayer::axum_body)) they keep
/// axum's `Body` (see [`Bodies`]).
#[must_use]
pub struct RateLimit<S, M = Wrapped> {
    inner: S,
    config: Arc<Config>,
    bodies: PhantomData<fn() -> M>,
}

impl<S, M> RateLimit<S, M> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        RateLimit {
            inner,
            config,
            bodies: PhantomData,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming the middleware.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, M> Clone for RateLimit<S, M> {
    fn clone(&self) -> Self {
        RateLimit::new(self.inner.clone(), Arc::clone(&self.config))
    }
}

impl<S: fmt::Debug, M> fmt::Debug for RateLimit<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, ReqBody, ResBody, M> Service<Request<ReqBody>> for RateLimit<S, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    M: Bodies<ResBody>,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        if let Some(held) = &self.config.held {
            match check_held(&self.config, held, &mut req) {
                // Built where it is returned: the inner future is not
                // moved again on its way out.
                Some(HeldVerdict::Pass) => {
                    return ResponseFuture::passing(self.inner.call(req));
                }
                Some(HeldVerdict::Forward(after)) => {
                    return ResponseFuture::calling(self.inner.call(req), after);
                }
                Some(HeldVerdict::Refuse(answer)) => {
                    return ResponseFuture::answered(refuse_held(&self.config, req, answer));
                }
                None => {}
            }
        }
        let (mut parts, body) = req.into_parts();
        let check: BoxFuture<'static, Checked> = match check_now(&self.config, &mut parts) {
            // Decided at once (the common case): the service driven to
            // readiness is called right away, or not at all.
            Now::Decided(Verdict::Forward(after)) => {
                let future = self.inner.call(Request::from_parts(parts, body));
                return ResponseFuture::calling(future, after);
            }
            Now::Decided(Verdict::Respond(res)) => return ResponseFuture::answered(res),
            Now::Unsent(ask, unsent) => {
                Box::pin(check_unsent(Arc::clone(&self.config), parts, ask, unsent))
            }
            Now::Wait => Box::pin(check(Arc::clone(&self.config), parts)),
        };
        // The decision comes later: the service that was driven to readiness
        // is `self.inner`; take it for this request and leave a fresh clone
        // behind (tower-service docs, "Be careful when cloning inner
        // services").
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(check, inner, body)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full};
    use tower::{Layer, Service, ServiceExt};

    use crate::decision::Decision;
    use crate::layer::{OnStoreError, RateLimitLayer, ResponseBody, ShadowRejection, StoreFailure};
    use crate::quota::Quota;
    use crate::store::MemoryStore;
    fn text(body: impl Into<Bytes>) -> Result<Response<Full<Bytes>>, Infallible> {
        Ok(Response::new(Full::new(body.into())))
    }

    async fn body_text(res: Response<ResponseBody<Full<Bytes>>>) -> String {
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

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

    /// A request decided at once (memory store, deny cache) boxes no future;
    /// the others move their check future into a box, which must not carry
    /// the kilobytes of a Redis call's, a fallback's or a reservation's
    /// futures more than once: those are boxed where they are awaited.
    #[test]
    fn the_check_futures_stay_small() {
        let inner = tower::service_fn(|_: Request<()>| async { text("ok") });
        let svc =
            RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(1).unwrap()).layer(inner);
        let (parts, ()) = Request::new(()).into_parts();
        let future = super::check(Arc::clone(&svc.config), parts);
        let size = std::mem::size_of_val(&future);
        assert!(size <= 1_400, "the check future is {size} bytes");
    }

    /// A Redis check the deny cache cannot answer is the one boxed future of
    /// its request: the Redis call's future is in it, nothing else large.
    #[cfg(feature = "redis")]
    #[test]
    fn a_redis_checks_future_is_boxed_once_and_stays_small() {
        use crate::layer::check::{Now, check_now, check_unsent};
        let inner = tower::service_fn(|_: Request<()>| async { text("ok") });
        // Built without connecting: nothing here talks to a server.
        let store = crate::RedisStore::from_url("redis://127.0.0.1:1").unwrap();
        let svc = RateLimitLayer::new(store, Quota::per_minute(1).unwrap())
            .key(crate::key::Global)
            .layer(inner);
        let (mut parts, ()) = Request::new(()).into_parts();
        let Now::Unsent(ask, unsent) = check_now(&svc.config, &mut parts) else {
            panic!("a Redis check with nothing cached must be sent");
        };
        let future = check_unsent(Arc::clone(&svc.config), parts, ask, unsent);
        let size = std::mem::size_of_val(&future);
        // Glibc's allocator serves blocks of up to 1 032 bytes from a
        // per-thread cache; larger ones take its slower shared path.
        assert!(size <= 1_024, "the Redis check future is {size} bytes");
    }

    /// A `Header`-keyed layer over a memory store decides a key the store
    /// holds in `call` without taking the request apart (`check_held`); a
    /// layer keyed by a closure returning the same value takes the general
    /// path. Both answer alike, request by request: statuses, rate limit
    /// fields, bodies and the decision handlers see.
    #[tokio::test(start_paused = true)]
    async fn a_held_key_is_answered_as_the_general_path_answers_it() {
        use crate::layer::HeaderStyle;
        let inner = tower::service_fn(|req: Request<()>| {
            let d = req.extensions().get::<Decision>().cloned();
            async move {
                text(format!(
                    "{:?}",
                    d.map(|d| (d.allowed(), d.remaining(), d.reset_after()))
                ))
            }
        });
        let cases = [
            (HeaderStyle::Ietf, true),
            (HeaderStyle::Legacy, true),
            (HeaderStyle::None, true),
            (HeaderStyle::Ietf, false),
        ];
        for (style, verbatim) in cases {
            let quota = Quota::per_minute(3).unwrap();
            let header = crate::key::Header::new("x-client").unwrap();
            let header = if verbatim { header.verbatim() } else { header };
            let held = RateLimitLayer::new(MemoryStore::new(), quota)
                .key(header)
                .headers(style);
            // The same key, from a closure: the general path.
            let key = move |p: &http::request::Parts| {
                let value = p.headers.get("x-client")?;
                Some(if verbatim {
                    value.to_str().ok()?.to_owned()
                } else {
                    crate::store::hashed_key(value.as_bytes())
                })
            };
            let general = RateLimitLayer::new(MemoryStore::new(), quota)
                .key(crate::key::from_fn("header:x-client", key))
                .headers(style);
            let (held, general) = (held.layer(inner), general.layer(inner));
            assert!(held.config.held.is_some() && general.config.held.is_none());
            for (i, client) in ["a", "a", "b", "a", "a", "b", "a"].into_iter().enumerate() {
                if i == 5 {
                    tokio::time::advance(std::time::Duration::from_secs(25)).await;
                }
                let req = || {
                    Request::get("/")
                        .header("x-client", client)
                        .body(())
                        .unwrap()
                };
                let a = held.clone().oneshot(req()).await.unwrap();
                let b = general.clone().oneshot(req()).await.unwrap();
                assert_eq!(a.status(), b.status(), "request {i}, {style:?}");
                assert_eq!(a.headers(), b.headers(), "request {i}, {style:?}");
                assert_eq!(
                    body_text(a).await,
                    body_text(b).await,
                    "request {i}, {style:?}"
                );
            }
        }
    }

    /// Once a missing key's fallback extractor has waited, a held key too
    /// is decided when the response future is polled, as every request of
    /// the layer then is: a call dropped unpolled spends nothing.
    #[tokio::test]
    async fn a_held_key_waits_for_the_poll_once_the_layer_has_waited() {
        struct Slow;
        impl crate::key::KeyExtractor for Slow {
            fn kind(&self) -> crate::key::Kind {
                crate::key::Kind::custom("slow")
            }
            async fn extract(&self, _: &http::request::Parts) -> Option<String> {
                tokio::task::yield_now().await;
                Some("slow".to_owned())
            }
        }
        let inner = tower::service_fn(|_: Request<()>| async { text("ok") });
        let mut svc = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(2).unwrap())
            .key(crate::key::Header::new("x-client").unwrap())
            .on_missing_key(crate::layer::MissingKey::fallback(Slow))
            .layer(inner);
        let with = || Request::get("/").header("x-client", "a").body(()).unwrap();
        // "a" is stored (one token of two left); the fallback then waits once.
        assert_eq!(svc.clone().oneshot(with()).await.unwrap().status(), 200);
        assert_eq!(
            svc.clone()
                .oneshot(Request::new(()))
                .await
                .unwrap()
                .status(),
            200
        );
        assert!(svc.config.waits.happened());
        // Called and dropped unpolled: nothing spent, "a" still has its token.
        drop(svc.ready().await.unwrap().call(with()));
        assert_eq!(svc.clone().oneshot(with()).await.unwrap().status(), 200);
        assert_eq!(svc.oneshot(with()).await.unwrap().status(), 429);
    }

    #[test]
    fn only_a_layer_with_nothing_to_choose_wait_for_or_settle_checks_held_keys() {
        let store = MemoryStore::new();
        let quota = Quota::per_minute(3).unwrap();
        let inner = tower::service_fn(|_: Request<()>| async { text("ok") });
        let base = || {
            RateLimitLayer::new(store.clone(), quota)
                .key(crate::key::Header::new("x-client").unwrap())
        };
        let held = |layer: RateLimitLayer| layer.layer(inner).config.held.is_some();
        assert!(held(base()));
        assert!(!held(base().cost(|_| 1)));
        assert!(!held(base().shadow()));
        assert!(!held(
            base().select_policy(|_| crate::layer::Choice::Default)
        ));
        assert!(!held(base().key(crate::key::Global)));
        let two = crate::Policy::new("two", [quota, Quota::per_hour(10).unwrap()]).unwrap();
        assert!(!held(
            RateLimitLayer::new(store.clone(), two)
                .key(crate::key::Header::new("x-client").unwrap())
        ));
    }

    /// A Redis store's keys are held when its leases pay on the policy and
    /// a check costs at least a token (as leases decide), and not
    /// otherwise. Building a store connects to nothing.
    #[cfg(feature = "redis")]
    #[test]
    fn a_layer_checks_held_keys_of_a_redis_store_whose_leases_pay() {
        let store = |leases: bool| {
            crate::RedisStore::builder()
                .url("redis://127.0.0.1:6379")
                .leases(leases)
                .build()
                .unwrap()
        };
        let inner = tower::service_fn(|_: Request<()>| async { text("ok") });
        let held = |layer: RateLimitLayer| layer.layer(inner).config.held.is_some();
        let key = || crate::key::Header::new("x-client").unwrap();
        let roomy = Quota::per_second(100).unwrap();
        assert!(held(RateLimitLayer::new(store(true), roomy).key(key())));
        assert!(!held(RateLimitLayer::new(store(false), roomy).key(key())));
        // A quota too slow for leases to pay on.
        let slow = Quota::per_hour(3).unwrap();
        assert!(!held(RateLimitLayer::new(store(true), slow).key(key())));
        let free = RateLimitLayer::new(store(true), roomy)
            .key(key())
            .fixed_cost(0)
            .unwrap();
        assert!(!held(free));
    }

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

    /// An extractor whose future waits once before answering, counting how
    /// often it is asked.
    struct Waiting(Arc<AtomicUsize>);

    impl crate::key::KeyExtractor for Waiting {
        fn kind(&self) -> crate::key::Kind {
            crate::key::Kind::custom("waiting")
        }

        async fn extract(&self, _: &http::request::Parts) -> Option<String> {
            self.0.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            Some("client".to_owned())
        }
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
                .get::<StoreFailure>()
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
}
