//! Held keys: requests decided in `call` without taking them apart, as the
//! general check would decide them.

use http::Request;
use tower::{Layer, Service, ServiceExt};

use crate::decision::Decision;
use crate::layer::RateLimitLayer;
use crate::quota::Quota;
use crate::store::MemoryStore;

use super::{body_text, text};

/// A `Header`-keyed layer over a memory store decides a key the store
/// holds in `call` without taking the request apart (`check::held`); a
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
        RateLimitLayer::new(store.clone(), quota).key(crate::key::Header::new("x-client").unwrap())
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
        RateLimitLayer::new(store.clone(), two).key(crate::key::Header::new("x-client").unwrap())
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
