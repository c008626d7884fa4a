//! What an outage looks like from outside: `tracing` events and `metrics`
//! recorded while a real Redis is killed and restarted under the HTTP layer
//! with a fallback. One test, because a process has one global recorder and one
//! global subscriber.
#![cfg(all(feature = "redis", feature = "tracing", feature = "metrics"))]

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::RedisServer;
use tollgate::key::Header;
use tollgate::layer::RateLimitLayer;
use tollgate::{Decision, Fallback, Policy, Quota, RedisStore};
use tower::{Layer, ServiceExt};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// One event: its level, and every field (the message included) as text.
#[derive(Clone, Debug)]
struct Event {
    level: tracing::Level,
    fields: BTreeMap<String, String>,
}

impl Event {
    fn message(&self) -> &str {
        self.fields.get("message").map_or("", String::as_str)
    }
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Keeps every event of the `tollgate` target.
struct Keep(Arc<Mutex<Vec<Event>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Keep {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "tollgate" {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        self.0.lock().unwrap().push(Event {
            level: *event.metadata().level(),
            fields: fields.0,
        });
    }
}

const SECRET_KEY: &str = "sk_live_observed_42";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_shows_in_events_and_metrics_without_client_keys() {
    let events = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(Keep(Arc::clone(&events))),
    )
    .unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let mut redis = RedisServer::start();
    let store = RedisStore::builder()
        .leases(false)
        .url(redis.url())
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let policy = Policy::new("obs", [Quota::per_minute(1_000).unwrap()]).unwrap();
    // Connected and the script loaded before the layer's first request, which
    // Redis must decide: a busy machine can stretch that first call past the
    // 100 ms timeout.
    let warm = Instant::now();
    while tollgate::Store::check(&store, "warm", &policy, 1)
        .await
        .is_err()
    {
        assert!(
            warm.elapsed() < Duration::from_secs(30),
            "Redis never answered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let inner = tower::service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("ok"))))
    });
    let svc = RateLimitLayer::new(store, policy)
        .key(Header::new("x-api-key").unwrap())
        .fallback(Fallback::memory())
        .decision_in_response()
        .layer(inner);
    let request = || {
        Request::get("/")
            .header("x-api-key", SECRET_KEY)
            .body(())
            .unwrap()
    };
    let decision = |res: &Response<_>| res.extensions().get::<Decision>().cloned();

    for _ in 0..3 {
        let res = svc.clone().oneshot(request()).await.unwrap();
        assert!(!decision(&res).unwrap().is_fallback());
    }
    redis.stop();
    for _ in 0..30 {
        let res = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(res.status(), 200);
        assert!(decision(&res).unwrap().is_fallback());
    }
    redis.restart();
    let back = Instant::now();
    loop {
        let res = svc.clone().oneshot(request()).await.unwrap();
        if !decision(&res).unwrap().is_fallback() {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "Redis never decided again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Metrics.
    let mut counters: BTreeMap<String, u64> = BTreeMap::new();
    let mut gauges: BTreeMap<String, f64> = BTreeMap::new();
    let mut histograms: BTreeMap<String, usize> = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        assert!(!name.contains(SECRET_KEY), "{name}");
        match value {
            DebugValue::Counter(v) => {
                counters.insert(name, v);
            }
            DebugValue::Gauge(v) => {
                gauges.insert(name, v.into_inner());
            }
            DebugValue::Histogram(v) => {
                histograms.insert(name, v.len());
            }
        }
    }
    println!("{counters:#?}\n{gauges:#?}\n{histograms:#?}");
    let counter = |name: &str| counters.get(name).copied().unwrap_or(0);
    assert!(counter("tollgate_decisions_total{outcome=allowed,policy=obs}") >= 4);
    assert_eq!(
        counter("tollgate_decisions_total{outcome=fallback_allowed,policy=obs}")
            + counter("tollgate_decisions_total{outcome=fallback_limited,policy=obs}"),
        counter("tollgate_decisions_total{outcome=fallback_allowed,policy=obs}"),
        "the fallback's quota of 1000 a minute limited nobody"
    );
    assert!(counter("tollgate_decisions_total{outcome=fallback_allowed,policy=obs}") >= 30);
    assert!(counter("tollgate_store_errors_total{kind=connection,store=redis}") >= 1);
    // After three failures the breaker answers by itself.
    assert!(counter("tollgate_store_errors_total{kind=circuit_open,store=redis}") >= 20);
    assert_eq!(
        gauges.get("tollgate_breaker_state{store=redis}"),
        Some(&0.0)
    );
    assert_eq!(gauges.get("tollgate_fallback_active{}"), Some(&0.0));
    assert!(
        histograms.get("tollgate_store_call_duration_seconds{result=ok,store=redis}") >= Some(&4)
    );
    assert!(
        histograms.get("tollgate_store_call_duration_seconds{result=connection,store=redis}")
            >= Some(&1)
    );

    // Events.
    let events = events.lock().unwrap().clone();
    for e in &events {
        assert!(!format!("{e:?}").contains(SECRET_KEY), "{e:?}");
    }
    let has = |level: tracing::Level, text: &str| {
        events
            .iter()
            .any(|e| e.level == level && e.message().contains(text))
    };
    assert!(
        has(tracing::Level::WARN, "circuit breaker opened"),
        "{events:#?}"
    );
    assert!(
        has(tracing::Level::INFO, "circuit breaker closed"),
        "{events:#?}"
    );
    assert!(has(
        tracing::Level::WARN,
        "deciding with the in-process fallback"
    ));
    assert!(has(tracing::Level::INFO, "fallback stopped deciding"));
    // Dozens of errors, but at most one line per kind in a test this short.
    let error_lines: Vec<&Event> = events
        .iter()
        .filter(|e| e.message().starts_with("rate limit store error"))
        .collect();
    let mut kinds: Vec<&str> = error_lines
        .iter()
        .map(|e| e.fields.get("kind").map_or("", String::as_str))
        .collect();
    kinds.sort();
    let unique = {
        let mut u = kinds.clone();
        u.dedup();
        u
    };
    assert_eq!(
        kinds, unique,
        "more than one line per kind: {error_lines:#?}"
    );
    assert!(
        kinds.contains(&"connection") && kinds.contains(&"circuit_open"),
        "{kinds:?}"
    );
    // One debug event per decision, with the policy and the key kind only.
    let decisions: Vec<&Event> = events
        .iter()
        .filter(|e| e.level == tracing::Level::DEBUG && e.message() == "rate limit decision")
        .collect();
    assert!(decisions.len() >= 34, "{} decision events", decisions.len());
    for d in &decisions {
        assert_eq!(d.fields.get("policy").map(String::as_str), Some("obs"));
        assert_eq!(
            d.fields.get("key_kind").map(String::as_str),
            Some("header:x-api-key")
        );
    }
}
