//! The HTTP layer through real sockets against a real Redis: an axum (or bare
//! hyper) server on 127.0.0.1:0, a hyper client, and a `redis-server` per test.
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use axum::routing::get;
use axum::{Extension, Router};
use http::StatusCode;
use support::RedisServer;
use support::http::{Client, TestServer};
use tollgate::key::{Global, Header, from_fn};
use tollgate::layer::{
    Choice, HeaderStyle, MissingKey, OnStoreError, RateLimitLayer, Rejection, StoreFailure,
};
use tollgate::{Decision, Policy, Quota, RedisStore};

/// A policy named `name` of `quotas`.
fn named(name: &str, quotas: impl IntoIterator<Item = Quota>) -> Policy {
    Policy::new(name, quotas).unwrap()
}

/// A handler that reports what the layer put in the request extensions.
async fn echo(
    decision: Option<Extension<Decision>>,
    failure: Option<Extension<StoreFailure>>,
) -> String {
    match (decision, failure) {
        (Some(Extension(d)), _) => format!(
            "allowed={} remaining={} limit={} states={:?}",
            d.allowed(),
            d.remaining(),
            d.limit(),
            d.states().iter().map(|s| s.remaining()).collect::<Vec<_>>()
        ),
        (None, Some(_)) => "store-failure".to_owned(),
        (None, None) => "unlimited".to_owned(),
    }
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new().route("/", get(echo)).layer(layer)
}

/// 1 token a second, bursts of 3: a short refill keeps the waits in tests short.
fn small() -> Quota {
    Quota::per_second(1).unwrap().burst(3).unwrap()
}

/// 3 a minute: nothing refills during a test that does not wait on purpose, so
/// counts do not depend on how fast a busy machine sends requests.
fn slow() -> Quota {
    Quota::per_minute(3).unwrap()
}

/// The decision a response's body reports (see `echo`), without the states.
fn summary(body: &str) -> &str {
    body.split(" states=").next().unwrap_or(body)
}

#[tokio::test]
async fn burst_is_cut_at_capacity_then_admitted_after_retry_after() {
    let redis = RedisServer::start();
    let layer = RateLimitLayer::new(redis.store(), small()).key(Global);
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    // Send until the first 429: at least the burst of 3 passes, a few more only if
    // this machine is slow enough for tokens to refill meanwhile.
    let mut admitted = 0;
    let limited = loop {
        let r = client.get(&server.url("/")).await;
        if r.status != StatusCode::OK {
            break r;
        }
        assert_eq!(r.header("ratelimit-policy"), Some("\"default\";q=3;w=3"));
        admitted += 1;
        assert!(admitted < 20, "never limited");
    };
    assert!(admitted >= 3, "only {admitted} admitted");
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.header("cache-control"), Some("no-store"));
    assert!(
        limited.body.starts_with("Too Many Requests"),
        "{}",
        limited.body
    );
    // Under a second to the next token, rounded up: 1, never 0.
    assert_eq!(limited.retry_after(), Some(1));
    // Retry-After never points earlier than the RateLimit reset parameter.
    assert_eq!(limited.header("ratelimit"), Some("\"default\";r=0;t=1"));

    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = client.get(&server.url("/")).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert!(again.body.starts_with("allowed=true"), "{}", again.body);
}

#[tokio::test]
async fn headers_equal_the_decision_the_handler_sees() {
    let redis = RedisServer::start();
    let quotas = [Quota::per_second(10).unwrap(), Quota::per_hour(5).unwrap()];
    let layer = RateLimitLayer::new(redis.store(), named("api", quotas)).key(Global);
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    for n in 1..=5u64 {
        let r = client.get(&server.url("/")).await;
        assert_eq!(r.status, StatusCode::OK);
        // The hourly quota binds: the handler sees its numbers.
        assert_eq!(
            summary(&r.body),
            format!("allowed=true remaining={} limit=5", 5 - n)
        );
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"api.0\";q=10;w=1, \"api.1\";q=5;w=3600")
        );
        // Every item's r is the remaining of its quota in the handler's Decision.
        let header = r.header("ratelimit").unwrap();
        let items: Vec<&str> = header.split(", ").collect();
        let states = r.body.split("states=").nth(1).unwrap();
        let from_header: Vec<String> = items
            .iter()
            .map(|i| {
                i.split(";r=")
                    .nth(1)
                    .unwrap()
                    .split(';')
                    .next()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(format!("[{}]", from_header.join(", ")), states, "{header}");
        assert!(items[0].starts_with("\"api.0\";"), "{header}");
        assert!(items[0].ends_with(";t=1"), "{header}");
        // One token an hour: the next is 720 s after the first spend.
        let t: u64 = items[1].rsplit("t=").next().unwrap().parse().unwrap();
        assert!((700..=720).contains(&t), "{header}");
    }
    let limited = client.get(&server.url("/")).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    let t: u64 = limited
        .header("ratelimit")
        .unwrap()
        .rsplit("t=")
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // One token an hour: roughly 720 s away, and Retry-After says the same.
    assert!((700..=720).contains(&t), "t={t}");
    assert_eq!(limited.retry_after(), Some(t));

    // Legacy headers carry the same numbers.
    let legacy = RateLimitLayer::new(redis.store(), named("legacy", [small()]))
        .key(Global)
        .headers(HeaderStyle::Legacy);
    let server = TestServer::axum(app(legacy)).await;
    let r = client.get(&server.url("/")).await;
    assert_eq!(summary(&r.body), "allowed=true remaining=2 limit=3");
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("2"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("1"));
    assert_eq!(r.header("ratelimit"), None);
}

#[tokio::test]
async fn policies_per_route_and_tier_with_costs_keep_separate_buckets() {
    let redis = RedisServer::start();
    let free = Policy::new("free", [Quota::per_minute(4).unwrap()]).unwrap();
    let pro = Policy::new("pro", [Quota::per_minute(40).unwrap()]).unwrap();
    let layer = RateLimitLayer::new(redis.store(), Quota::per_minute(100).unwrap())
        .key(Header::new("x-api-key").verbatim())
        .policy(move |parts| {
            if parts.uri.path() == "/health" {
                return Choice::Exempt;
            }
            match parts.headers.get("x-tier").map(|v| v.as_bytes()) {
                Some(b"pro") => pro.clone().into(),
                Some(b"free") => free.clone().into(),
                _ => Choice::Default,
            }
        })
        .cost(|parts| if parts.uri.path() == "/bulk" { 3 } else { 1 });
    let app = Router::new()
        .route("/", get(echo))
        .route("/bulk", get(echo))
        .route("/health", get(echo))
        .layer(layer);
    let server = TestServer::axum(app).await;
    let client = Client::new();
    let key = ("x-api-key", &b"k-1"[..]);

    // Free tier: a bulk call costs 3 of 4, one more single call, then limited.
    let free_hdr = [key, ("x-tier", &b"free"[..])];
    let r = client.get_with(&server.url("/bulk"), &free_hdr).await;
    assert_eq!(r.header("ratelimit"), Some("\"free\";r=1;t=15"));
    assert_eq!(
        client.get_with(&server.url("/"), &free_hdr).await.status,
        200
    );
    let r = client.get_with(&server.url("/bulk"), &free_hdr).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // 3 tokens at one per 15 s: 45 s, rounded up, less what refilled meanwhile.
    let wait = r.retry_after().unwrap();
    assert!((44..=45).contains(&wait), "{wait}");

    // The same key on the pro tier and on the default policy has its own buckets.
    let pro_hdr = [key, ("x-tier", &b"pro"[..])];
    let r = client.get_with(&server.url("/bulk"), &pro_hdr).await;
    assert_eq!(r.header("ratelimit"), Some("\"pro\";r=37;t=2"));
    let r = client.get_with(&server.url("/"), &[key]).await;
    assert_eq!(r.header("ratelimit"), Some("\"default\";r=99;t=1"));

    // Exempt routes are not counted and carry no header.
    let r = client.get_with(&server.url("/health"), &free_hdr).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "unlimited"));
    assert_eq!(r.header("ratelimit"), None);

    let mut keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    keys.sort();
    assert_eq!(
        keys,
        [
            "tollgate:{default:header:x-api-key:k-1}:100/1m:100",
            "tollgate:{free:header:x-api-key:k-1}:4/1m:4",
            "tollgate:{pro:header:x-api-key:k-1}:40/1m:40",
        ]
    );
}

#[tokio::test]
async fn cost_zero_peeks_and_cost_above_capacity_is_refused_without_retry_after() {
    let redis = RedisServer::start();
    let layer = RateLimitLayer::new(redis.store(), small())
        .key(Global)
        .cost(|parts| {
            parts
                .headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        });
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    let peek = client.get_with(&server.url("/"), &[("x-cost", b"0")]).await;
    assert_eq!(peek.status, StatusCode::OK);
    assert_eq!(peek.header("ratelimit"), Some("\"default\";r=3"));
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert!(keys.is_empty(), "a peek writes nothing: {keys:?}");

    let huge = client.get_with(&server.url("/"), &[("x-cost", b"4")]).await;
    assert_eq!(huge.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(huge.retry_after(), None, "no wait admits it");
    assert!(huge.body.contains("can never be admitted"), "{}", huge.body);

    let r = client.get_with(&server.url("/"), &[("x-cost", b"3")]).await;
    assert_eq!(r.header("ratelimit"), Some("\"default\";r=0;t=1"));
    // At zero tokens a peek still passes and reports the state.
    let peek = client.get_with(&server.url("/"), &[("x-cost", b"0")]).await;
    assert_eq!(peek.status, StatusCode::OK);
    assert!(peek.body.starts_with("allowed=true"), "{}", peek.body);
}

#[tokio::test]
async fn shadow_mode_never_rejects_but_reports() {
    let redis = RedisServer::start();
    let layer = RateLimitLayer::new(redis.store(), slow())
        .key(Header::new("x-api-key"))
        .shadow();
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    let key = [("x-api-key", &b"k"[..])];
    for _ in 0..3 {
        assert_eq!(client.get_with(&server.url("/"), &key).await.status, 200);
    }
    for _ in 0..3 {
        let r = client.get_with(&server.url("/"), &key).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(summary(&r.body), "allowed=false remaining=0 limit=3");
        assert_eq!(r.header("ratelimit"), Some("\"default\";r=0;t=20"));
        assert_eq!(r.header("retry-after"), None);
    }
    // A missing key is forwarded too.
    let r = client.get(&server.url("/")).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "unlimited"));
}

#[tokio::test]
async fn missing_keys_follow_the_configured_behaviour() {
    let redis = RedisServer::start();
    let client = Client::new();
    let header = || Header::new("x-api-key").verbatim();

    let reject = RateLimitLayer::new(redis.store(), small()).key(header());
    let server = TestServer::axum(app(reject)).await;
    let r = client.get(&server.url("/")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("header:x-api-key"), "{}", r.body);
    // An empty value is no key either.
    let r = client
        .get_with(&server.url("/"), &[("x-api-key", b"")])
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    // Nor is an empty key from a closure: keyless requests must not share a bucket.
    let empty =
        RateLimitLayer::new(redis.store(), small()).key(from_fn("tenant", |_| Some(String::new())));
    let server = TestServer::axum(app(empty)).await;
    let r = client.get(&server.url("/")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("tenant"), "{}", r.body);

    let allow = RateLimitLayer::new(redis.store(), small())
        .key(header())
        .on_missing_key(MissingKey::allow());
    let server = TestServer::axum(app(allow)).await;
    for _ in 0..5 {
        let r = client.get(&server.url("/")).await;
        assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "unlimited"));
        assert_eq!(r.header("ratelimit"), None);
    }

    let by_agent = from_fn("agent", |parts| {
        let ua = parts.headers.get("user-agent")?;
        Some(String::from_utf8_lossy(ua.as_bytes()).into_owned())
    });
    let fallback = RateLimitLayer::new(redis.store(), slow())
        .key(header())
        .on_missing_key(MissingKey::fallback(by_agent));
    let server = TestServer::axum(app(fallback)).await;
    let ua = [("user-agent", &b"bot"[..])];
    for _ in 0..3 {
        assert_eq!(client.get_with(&server.url("/"), &ua).await.status, 200);
    }
    assert_eq!(client.get_with(&server.url("/"), &ua).await.status, 429);
    // The primary key still has its own bucket, and no key at all is rejected.
    let r = client
        .get_with(&server.url("/"), &[("x-api-key", b"bot")])
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = client.get(&server.url("/")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.body.contains("(header:x-api-key or custom:agent)"),
        "{}",
        r.body
    );
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert!(
        keys.contains(&"tollgate:{default:custom:agent:bot}:3/1m:3".to_owned()),
        "{keys:?}"
    );
    assert!(
        keys.contains(&"tollgate:{default:header:x-api-key:bot}:3/1m:3".to_owned()),
        "{keys:?}"
    );
}

#[tokio::test]
async fn api_keys_never_reach_redis_in_clear() {
    let redis = RedisServer::start();
    let layer = RateLimitLayer::new(redis.store(), slow()).key(Header::new("x-api-key"));
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    let secret = b"sk_live_4242";
    for _ in 0..4 {
        client
            .get_with(&server.url("/"), &[("x-api-key", secret)])
            .await;
    }
    let r = client
        .get_with(&server.url("/"), &[("x-api-key", secret)])
        .await;
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "still one bucket per key"
    );
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(!keys[0].contains("sk_live"), "{keys:?}");
    assert!(
        keys[0].starts_with("tollgate:{default:header:x-api-key:#"),
        "{keys:?}"
    );
}

#[tokio::test]
async fn hostile_header_values_neither_panic_nor_grow_redis_keys() {
    let redis = RedisServer::start();
    let layer = RateLimitLayer::new(redis.store(), slow()).key(Header::new("x-api-key"));
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    let long = vec![b'a'; 64 * 1024];
    let braces = b"{}{user:1}}{{".repeat(100);
    let values: [&[u8]; 5] = [b"\xff\xfe\x80", b"{a}", &long, &braces, b"  spaced  "];
    for value in values {
        for _ in 0..4 {
            let r = client
                .get_with(&server.url("/"), &[("x-api-key", value)])
                .await;
            assert!(
                r.status == StatusCode::OK || r.status == StatusCode::TOO_MANY_REQUESTS,
                "{r:?}"
            );
        }
    }
    // Each hostile value got exactly one bucket, limited like any other key.
    let r = client
        .get_with(&server.url("/"), &[("x-api-key", &long)])
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert_eq!(keys.len(), values.len(), "{keys:?}");
    for key in &keys {
        assert!(key.len() <= 160, "unbounded key {} bytes", key.len());
        // One hash tag, ours: the client part cannot move it.
        assert_eq!(key.matches('{').count(), 1, "{key}");
        assert_eq!(key.matches('}').count(), 1, "{key}");
        assert!(key.is_ascii(), "{key:?}");
    }
}

/// A store with the 100 ms timeout the brief asks failure tests to use.
fn fast_failing(redis: &RedisServer) -> RedisStore {
    redis.store_with_timeout(Duration::from_millis(100))
}

/// Generous for a busy 2-core CI machine: the store gives up after 100 ms.
const FAILURE_BOUND: Duration = Duration::from_secs(2);

#[tokio::test]
async fn redis_down_or_frozen_allow_forwards_and_deny_answers_503_quickly() {
    let mut redis = RedisServer::start();
    let allow = RateLimitLayer::new(fast_failing(&redis), small()).key(Global);
    let deny = RateLimitLayer::new(fast_failing(&redis), small())
        .key(Global)
        .on_store_error(OnStoreError::Deny);
    let allow_server = TestServer::axum(app(allow)).await;
    let deny_server = TestServer::axum(app(deny)).await;
    let client = Client::new();
    // Warm up: both stores hold a connection to a live Redis.
    assert_eq!(client.get(&allow_server.url("/")).await.status, 200);
    assert_eq!(client.get(&deny_server.url("/")).await.status, 200);

    // Frozen: connections stay open and nothing answers, so the timeout decides.
    redis.freeze();
    for _ in 0..2 {
        let start = Instant::now();
        let r = client.get(&allow_server.url("/")).await;
        assert!(start.elapsed() < FAILURE_BOUND, "{:?}", start.elapsed());
        assert_eq!(
            (r.status, r.body.as_str()),
            (StatusCode::OK, "store-failure")
        );
        assert_eq!(r.header("ratelimit"), None);

        let start = Instant::now();
        let r = client.get(&deny_server.url("/")).await;
        assert!(start.elapsed() < FAILURE_BOUND, "{:?}", start.elapsed());
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.retry_after(), Some(1));
    }

    // Killed: connections break and reconnecting is refused.
    redis.thaw();
    redis.stop();
    for _ in 0..2 {
        let start = Instant::now();
        let r = client.get(&allow_server.url("/")).await;
        assert!(start.elapsed() < FAILURE_BOUND, "{:?}", start.elapsed());
        assert_eq!(r.status, StatusCode::OK);
        let start = Instant::now();
        let r = client.get(&deny_server.url("/")).await;
        assert!(start.elapsed() < FAILURE_BOUND, "{:?}", start.elapsed());
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    }
}

#[tokio::test]
async fn route_layer_limits_only_matched_routes() {
    let redis = RedisServer::start();
    let layer = RateLimitLayer::new(redis.store(), named("search", [slow()])).key(Global);
    let app = Router::new()
        .route("/search", get(echo))
        .route_layer(layer)
        .route("/open", get(echo));
    let server = TestServer::axum(app).await;
    let client = Client::new();
    for _ in 0..3 {
        assert_eq!(client.get(&server.url("/search")).await.status, 200);
    }
    assert_eq!(client.get(&server.url("/search")).await.status, 429);
    // Added after route_layer: not limited. Unknown paths are 404, not 429.
    let r = client.get(&server.url("/open")).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "unlimited"));
    assert_eq!(client.get(&server.url("/missing")).await.status, 404);
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn route_keys_are_route_templates_not_paths() {
    use tollgate::key::{KeyExtractorExt, PeerIp, Route};

    let redis = RedisServer::start();
    let per_route =
        RateLimitLayer::new(redis.store(), named("items", [slow()])).key(Route.and(PeerIp::new()));
    let app = Router::new()
        .route("/items/{id}", get(echo))
        .route("/login", get(echo))
        .route_layer(per_route);
    let server = TestServer::axum(app).await;
    let client = Client::new();
    // A new id for every request is still the one route /items/{id}.
    for id in 1..=3 {
        let r = client.get(&server.url(&format!("/items/{id}"))).await;
        assert_eq!(r.status, StatusCode::OK, "/items/{id}");
    }
    let r = client.get(&server.url("/items/4")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // Another route, another bucket; unknown paths are 404, not limited.
    assert_eq!(client.get(&server.url("/login")).await.status, 200);
    assert_eq!(client.get(&server.url("/nowhere")).await.status, 404);
    let mut keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    keys.sort();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(
        keys[1],
        "tollgate:{items:route+ip:6:/login:127.0.0.1}:3/1m:3"
    );
    assert!(
        keys[0].starts_with("tollgate:{items:route+ip:33:#"),
        "{keys:?}"
    );

    // Router::layer sees the template too; a path no route matched has none,
    // so the default missing-key policy answers it 400.
    let redis = RedisServer::start();
    let everywhere = RateLimitLayer::new(redis.store(), slow()).key(Route);
    let app = Router::new()
        .route("/items/{id}", get(echo))
        .layer(everywhere);
    let server = TestServer::axum(app).await;
    for id in 1..=3 {
        let r = client.get(&server.url(&format!("/items/{id}"))).await;
        assert_eq!(r.status, StatusCode::OK, "/items/{id}");
    }
    let r = client.get(&server.url("/items/4")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let r = client.get(&server.url("/nowhere")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("(route)"), "{}", r.body);
}

/// The recipe of the key docs: per address outermost, per verified client
/// inside the auth layer. A client inventing API keys is refused by the auth
/// layer, limited by its address, and makes no Redis key per invented key; the
/// recipe it replaces (`Header::new("x-api-key").or(PeerIp)`) let the same client
/// through unlimited, with a Redis key per request.
#[tokio::test]
async fn random_api_keys_neither_bypass_the_limit_nor_make_keys() {
    use axum::middleware::{self, Next};
    use tollgate::key::{KeyExtractorExt, PeerIp};

    #[derive(Clone)]
    struct ApiClient(&'static str);

    async fn auth(
        mut req: axum::extract::Request,
        next: Next,
    ) -> Result<axum::response::Response, StatusCode> {
        if req.headers().get("x-api-key").map(|k| k.as_bytes()) != Some(b"k-acme") {
            return Err(StatusCode::UNAUTHORIZED);
        }
        req.extensions_mut().insert(ApiClient("acme"));
        Ok(next.run(req).await)
    }

    let client = Client::new();
    let random_keys: Vec<String> = (0..6).map(|i| format!("k-random-{i}")).collect();

    let redis = RedisServer::start();
    let per_ip = RateLimitLayer::new(redis.store(), named("per-ip", [slow()])).key(PeerIp::new());
    let per_client = RateLimitLayer::new(redis.store(), named("per-client", [slow()])).key(
        tollgate::key::Extension::new("client", |c: &ApiClient| c.0.to_owned()),
    );
    let stack = Router::new()
        .route("/", get(echo))
        .layer(per_client)
        .layer(middleware::from_fn(auth))
        .layer(per_ip);
    let server = TestServer::axum(stack).await;
    let mut statuses = Vec::new();
    for key in &random_keys {
        let r = client
            .get_with(&server.url("/"), &[("x-api-key", key.as_bytes())])
            .await;
        statuses.push(r.status.as_u16());
    }
    assert_eq!(statuses, [401, 401, 401, 429, 429, 429]);
    assert_eq!(
        redis.cmd::<Vec<String>>(&["KEYS", "*"]),
        ["tollgate:{per-ip:ip:127.0.0.1}:3/1m:3"]
    );

    // The recipe it replaces: every invented key is a fresh bucket and a key.
    let redis = RedisServer::start();
    let header_or_ip = Header::new("x-api-key").or(PeerIp::new());
    let app = app(RateLimitLayer::new(redis.store(), slow()).key(header_or_ip));
    let server = TestServer::axum(app).await;
    for key in &random_keys {
        let r = client
            .get_with(&server.url("/"), &[("x-api-key", key.as_bytes())])
            .await;
        assert_eq!(r.status, StatusCode::OK, "never limited");
    }
    assert_eq!(redis.cmd::<Vec<String>>(&["KEYS", "*"]).len(), 6);
}

/// The table of the stacking docs: which of axum's own 404 and 405 answers
/// pass through (and are charged by) a limit placed in each of four ways.
#[tokio::test]
async fn which_answers_each_placement_charges() {
    use axum::routing::post;

    let redis = RedisServer::start();
    let client = Client::new();
    // (placement, charges 404, charges 405)
    let placements: [(&str, bool, bool); 4] = [
        ("router-layer", true, true),
        ("router-route-layer", false, true),
        ("method-layer", false, true),
        ("method-route-layer", false, false),
    ];
    for (name, charges_404, charges_405) in placements {
        let limit = RateLimitLayer::new(redis.store(), named(name, [slow()])).key(Global);
        let app = match name {
            "router-layer" => Router::new().route("/login", post(echo)).layer(limit),
            "router-route-layer" => Router::new().route("/login", post(echo)).route_layer(limit),
            "method-layer" => Router::new().route("/login", post(echo).layer(limit)),
            _ => Router::new().route("/login", post(echo).route_layer(limit)),
        };
        let server = TestServer::axum(app).await;
        let r = client.get(&server.url("/nowhere")).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{name}");
        assert_eq!(r.header("ratelimit").is_some(), charges_404, "{name} 404");
        let r = client.get(&server.url("/login")).await;
        assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{name}");
        assert_eq!(r.header("ratelimit").is_some(), charges_405, "{name} 405");
        // What is left for the real POST after those two answers.
        let r = client.send("POST", &server.url("/login"), &[]).await;
        let spent = u64::from(charges_404) + u64::from(charges_405);
        let item = r.header("ratelimit").unwrap_or_default();
        assert_eq!(
            without_t(item),
            format!("\"{name}\";r={}", 2 - spent),
            "{name}"
        );
    }
}

/// Two nested layers: items innermost first, the handler sees the innermost
/// decision, and an outer layer has spent when the inner one refuses.
#[tokio::test]
async fn nested_layers_combine_items_and_the_handler_sees_the_innermost() {
    let redis = RedisServer::start();
    let outer = RateLimitLayer::new(
        redis.store(),
        named("outer", [Quota::per_minute(10).unwrap()]),
    )
    .key(Global);
    let inner = RateLimitLayer::new(
        redis.store(),
        named("inner", [Quota::per_minute(1).unwrap()]),
    )
    .key(Global);
    let app = Router::new()
        .route("/", get(echo))
        .layer(inner)
        .layer(outer);
    let server = TestServer::axum(app).await;
    let client = Client::new();
    let r = client.get(&server.url("/")).await;
    assert_eq!(summary(&r.body), "allowed=true remaining=0 limit=1");
    let items = r.list("ratelimit").unwrap_or_default();
    assert_eq!(without_t(&items), "\"inner\";r=0, \"outer\";r=9");
    assert_eq!(
        r.list("ratelimit-policy").as_deref(),
        Some("\"inner\";q=1;w=60, \"outer\";q=10;w=60")
    );
    // The inner layer refuses; the outer one has spent all the same.
    let r = client.get(&server.url("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let items = r.list("ratelimit").unwrap_or_default();
    assert_eq!(without_t(&items), "\"inner\";r=0, \"outer\";r=8");
    // The answering (inner) layer's wait: a minute less the time since.
    let wait = r.retry_after().unwrap();
    assert!((50..=60).contains(&wait), "{wait}");
    assert!(
        items.starts_with(&format!("\"inner\";r=0;t={wait}")),
        "{items}"
    );
}

/// A `RateLimit` field without its `t` parameters, which depend on how long
/// the requests took.
fn without_t(field: &str) -> String {
    field
        .split(", ")
        .map(|item| {
            item.split(';')
                .filter(|p| !p.starts_with("t="))
                .collect::<Vec<_>>()
                .join(";")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::test]
async fn rejections_can_be_problem_json_or_custom() {
    let redis = RedisServer::start();
    let client = Client::new();
    let problem = RateLimitLayer::new(redis.store(), Quota::per_minute(1).unwrap())
        .key(Global)
        .rejection(Rejection::problem_json());
    let server = TestServer::axum(app(problem)).await;
    client.get(&server.url("/")).await;
    let r = client.get(&server.url("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(r.body.contains("#quota-exceeded"), "{}", r.body);
    assert!(
        r.body.contains("\"violated-policies\":[\"default\"]"),
        "{}",
        r.body
    );
    assert_eq!(r.retry_after(), Some(60));

    let custom = RateLimitLayer::new(
        redis.store(),
        named("custom", [Quota::per_minute(1).unwrap()]),
    )
    .key(Global)
    .rejection(Rejection::custom(|d| {
        http::Response::builder()
            .status(429)
            .header("content-type", "application/json")
            .body(format!("{{\"wait_ms\":{}}}", d.retry_after().as_millis()).into())
            .unwrap()
    }));
    let server = TestServer::axum(app(custom)).await;
    client.get(&server.url("/")).await;
    let r = client.get(&server.url("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.body.starts_with("{\"wait_ms\":"), "{}", r.body);
    // The layer still adds what a 429 must carry.
    assert_eq!(r.retry_after(), Some(60));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("ratelimit"), Some("\"custom\";r=0;t=60"));
}

#[tokio::test]
async fn a_bare_hyper_service_is_limited_by_peer_ip_by_default() {
    use bytes::Bytes;
    use http_body_util::Full;
    use tower::Layer;

    let redis = RedisServer::start();
    let inner = tower::service_fn(|_req: http::Request<hyper::body::Incoming>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from("plain"))))
    });
    let service = RateLimitLayer::new(redis.store(), slow()).layer(inner);
    let server = TestServer::hyper(service).await;
    let client = Client::new();
    for _ in 0..3 {
        let r = client.get(&server.url("/")).await;
        assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "plain"));
        assert!(r.header("ratelimit").is_some());
    }
    let r = client.get(&server.url("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.retry_after(), Some(20));
    // The server put the peer SocketAddr in the extensions; PeerIp keyed by it.
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert_eq!(keys, ["tollgate:{default:ip:127.0.0.1}:3/1m:3"]);
}
