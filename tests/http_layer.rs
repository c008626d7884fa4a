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

/// Whole seconds of Redis time since `start_us` (a Redis `TIME` reading),
/// rounded down.
///
/// A wait of `w` whole seconds counted from a spend made after `start_us`
/// is reported, rounded up, as `w - e` for the `e` seconds that passed until
/// the decision; `e` is at most what Redis says now. So the reported value
/// lies in `w - whole_secs_since(..) ..= w`: exactly `w` on a machine that
/// takes under a second, and a bound that grows only with the measured delay
/// on a busy one, never a guessed margin.
fn whole_secs_since(redis: &RedisServer, start_us: u64) -> u64 {
    (redis.time_us() - start_us) / 1_000_000
}

/// `w - whole_secs_since(..) ..= w`, see [`whole_secs_since`].
fn wait_range(redis: &RedisServer, start_us: u64, w: u64) -> std::ops::RangeInclusive<u64> {
    w.saturating_sub(whole_secs_since(redis, start_us))..=w
}

/// The `t` of the last `RateLimit` item (`"name";r=0;t=30`).
fn t_of(header: &str) -> u64 {
    header.rsplit(";t=").next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn burst_is_cut_at_capacity_then_admitted_after_retry_after() {
    let redis = RedisServer::start();
    let layer = RateLimitLayer::new(redis.store(), small()).key(Global);
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    // Send until the first 429: the burst of 3 passes, plus one token for
    // each whole second the requests took (none on a machine that is not
    // stalled).
    let start = redis.time_us();
    let mut admitted = 0;
    let limited = loop {
        let r = client.get(&server.url("/")).await;
        if r.status != StatusCode::OK {
            break r;
        }
        assert_eq!(r.header("ratelimit-policy"), Some("\"default\";q=3;w=3"));
        admitted += 1;
        assert!(admitted < 1_000, "never limited");
    };
    let refilled = whole_secs_since(&redis, start);
    assert!(
        (3..=3 + refilled).contains(&admitted),
        "{admitted} admitted in under {} s",
        refilled + 1
    );
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

/// `axum_body()` changes only the body type: through a real socket, the
/// same admissions, headers and 429 answer as the default layer's.
#[cfg(feature = "axum")]
#[tokio::test]
async fn axum_bodies_answer_as_the_wrapped_ones() {
    let redis = RedisServer::start();
    let limit = |name: &str| {
        RateLimitLayer::new(redis.store(), named(name, [slow()]))
            .key(Header::new("x-client").unwrap().verbatim())
    };
    let wrapped = TestServer::axum(app(limit("api"))).await;
    let plain = TestServer::axum(
        Router::new()
            .route("/", get(echo))
            .layer(limit("api").axum_body()),
    )
    .await;
    let client = Client::new();
    let get_as = |server: &TestServer, who: &'static str| {
        let url = server.url("/");
        let client = &client;
        async move { client.get_with(&url, &[("x-client", who.as_bytes())]).await }
    };
    for n in 0..4 {
        // Both servers share the buckets in Redis; each client spends its 3
        // through one of them. The reset (`t`, `Retry-After`, the 429's
        // text) may differ by a second between the two: only its presence is
        // compared.
        let (a, b) = (get_as(&wrapped, "w").await, get_as(&plain, "p").await);
        assert_eq!(a.status, b.status, "request {n}: {a:?} / {b:?}");
        // A 429's text names its wait: compared above by its presence only.
        if a.status == StatusCode::OK {
            assert_eq!(a.body, b.body, "request {n}");
        }
        for name in ["ratelimit-policy", "content-type", "cache-control"] {
            assert_eq!(a.header(name), b.header(name), "request {n}: {name}");
        }
        let r = |reply: &support::http::Reply| reply.header("ratelimit").map(without_t);
        assert_eq!(r(&a), r(&b), "request {n}");
        assert_eq!(a.retry_after().is_some(), b.retry_after().is_some());
    }
    // The client spent through the other server is refused here too.
    let refused = get_as(&plain, "w").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        refused.body.starts_with("Too Many Requests"),
        "{}",
        refused.body
    );
    assert!(refused.retry_after().is_some_and(|s| s > 0), "{refused:?}");
}

#[tokio::test]
async fn headers_equal_the_decision_the_handler_sees() {
    let redis = RedisServer::start();
    let quotas = [Quota::per_second(10).unwrap(), Quota::per_hour(5).unwrap()];
    let layer = RateLimitLayer::new(redis.store(), named("api", quotas)).key(Global);
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    let start = redis.time_us();
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
        // Five tokens an hour: the next is 720 s after the first spend.
        let t = t_of(items[1]);
        assert!(wait_range(&redis, start, 720).contains(&t), "{header}");
    }
    let limited = client.get(&server.url("/")).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    let t = t_of(limited.header("ratelimit").unwrap());
    // The next token, 720 s after the first spend, and Retry-After says the same.
    assert!(wait_range(&redis, start, 720).contains(&t), "t={t}");
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
        .key(Header::new("x-api-key").unwrap().verbatim())
        .select_policy(move |parts| {
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
    let start = redis.time_us();
    let r = client.get_with(&server.url("/bulk"), &free_hdr).await;
    assert_eq!(r.header("ratelimit"), Some("\"free\";r=1;t=15"));
    let r = client.get_with(&server.url("/"), &free_hdr).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(summary(&r.body), "allowed=true remaining=0 limit=4");
    let r = client.get_with(&server.url("/bulk"), &free_hdr).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // 3 tokens at one per 15 s: 45 s from the first spend, rounded up.
    let wait = r.retry_after().unwrap();
    assert!(wait_range(&redis, start, 45).contains(&wait), "{wait}");

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
            "tollgate:{default:header:x-api-key:k-1}:100/m:b100",
            "tollgate:{free:header:x-api-key:k-1}:1m",
            "tollgate:{pro:header:x-api-key:k-1}:1m",
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
        .key(Header::new("x-api-key").unwrap())
        .shadow();
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    let key = [("x-api-key", &b"k"[..])];
    let start = redis.time_us();
    for left in [2, 1, 0] {
        let r = client.get_with(&server.url("/"), &key).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            summary(&r.body),
            format!("allowed=true remaining={left} limit=3")
        );
    }
    for _ in 0..3 {
        let r = client.get_with(&server.url("/"), &key).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(summary(&r.body), "allowed=false remaining=0 limit=3");
        // One token every 20 s, counted from the first spend.
        let t = t_of(r.header("ratelimit").unwrap());
        assert!(wait_range(&redis, start, 20).contains(&t), "t={t}");
        assert_eq!(
            r.header("ratelimit"),
            Some(format!("\"default\";r=0;t={t}").as_str())
        );
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
    let header = || Header::new("x-api-key").unwrap().verbatim();

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
        keys.contains(&"tollgate:{default:custom:agent:bot}:3/m:b3".to_owned()),
        "{keys:?}"
    );
    assert!(
        keys.contains(&"tollgate:{default:header:x-api-key:bot}:3/m:b3".to_owned()),
        "{keys:?}"
    );
}

/// Header values are stored hashed, and the hash is a fixed function of the
/// value: a known answer, so a change to the hashing (which would split every
/// client's bucket in two during a rolling deploy) fails here.
#[tokio::test]
async fn api_keys_never_reach_redis_in_clear() {
    let redis = RedisServer::start();
    let layer = RateLimitLayer::new(redis.store(), slow()).key(Header::new("x-api-key").unwrap());
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    let secret = b"sk_live_4242";
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let r = client
            .get_with(&server.url("/"), &[("x-api-key", secret)])
            .await;
        statuses.push(r.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429], "one bucket per key");
    // `#` and the first 128 bits of SHA-256, in hex: of the value
    // (tollgate::store::hashed_key), then once more of that `#...` string when
    // the layer makes the extracted value safe (a value starting with `#` is
    // always hashed, so a client cannot pose as a hashed key). Computed with
    // `printf sk_live_4242 | sha256sum` and again on `#` + its first 32 digits.
    assert_eq!(
        tollgate::store::hashed_key(secret),
        "#ad45a523454f5b3e6fca96a1a3bb6098"
    );
    assert_eq!(
        tollgate::store::safe_key("#ad45a523454f5b3e6fca96a1a3bb6098"),
        "#b6f9b48ef935de1045655eae0d060641"
    );
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert_eq!(
        keys,
        ["tollgate:{default:header:x-api-key:#b6f9b48ef935de1045655eae0d060641}:3/m:b3"]
    );
}

#[tokio::test]
async fn hostile_header_values_neither_panic_nor_grow_redis_keys() {
    let redis = RedisServer::start();
    let layer = RateLimitLayer::new(redis.store(), slow()).key(Header::new("x-api-key").unwrap());
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    let long = vec![b'a'; 64 * 1024];
    let braces = b"{}{user:1}}{{".repeat(100);
    let values: [&[u8]; 5] = [b"\xff\xfe\x80", b"{a}", &long, &braces, b"  spaced  "];
    for value in values {
        let mut statuses = Vec::new();
        for _ in 0..4 {
            let r = client
                .get_with(&server.url("/"), &[("x-api-key", value)])
                .await;
            statuses.push(r.status.as_u16());
        }
        assert_eq!(
            statuses,
            [200, 200, 200, 429],
            "{:.20}",
            String::from_utf8_lossy(value)
        );
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

/// Generous for a busy 2-core CI machine: the store gives up after 100 ms, and
/// without its timeout a frozen Redis would hold the request until the
/// client's own 30 s.
const FAILURE_BOUND: Duration = Duration::from_secs(5);

/// Sends `GET url` until the layer reports a decision (the store answered): a
/// warm-up whose 100 ms store timeout can be missed on a busy machine.
async fn until_decided(client: &Client, url: &str) -> support::http::Reply {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = client.get(url).await;
        if r.status == StatusCode::OK && r.body.starts_with("allowed=") {
            return r;
        }
        assert!(Instant::now() < deadline, "no decision within 30 s: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn redis_down_or_frozen_allow_forwards_and_deny_answers_503_quickly() {
    let mut redis = RedisServer::start();
    // Room for every call: the calls that time out against the frozen Redis
    // still run when it thaws, and a denial among their late replies would go
    // into the deny cache (Redis did deny) and answer 429 instead of 503.
    let roomy = || Quota::per_minute(1_000).unwrap();
    let allow = RateLimitLayer::new(fast_failing(&redis), roomy()).key(Global);
    let deny = RateLimitLayer::new(fast_failing(&redis), roomy())
        .key(Global)
        .on_store_error(OnStoreError::Deny);
    let allow_server = TestServer::axum(app(allow)).await;
    let deny_server = TestServer::axum(app(deny)).await;
    let client = Client::new();
    // Warm up: both stores hold a connection to a live Redis and decide (from
    // one shared bucket; a warm-up that timed out may have spent too).
    for server in [&allow_server, &deny_server] {
        let r = until_decided(&client, &server.url("/")).await;
        assert!(r.body.starts_with("allowed=true"), "{}", r.body);
    }

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
        assert_eq!(
            (r.status, r.body.as_str()),
            (StatusCode::OK, "store-failure")
        );
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
    assert_eq!(keys[1], "tollgate:{items:route+ip:6:/login:127.0.0.1}:1m");
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
/// recipe it replaces (`Header::new("x-api-key")?.or(PeerIp)`) let the same client
/// through unlimited, with a Redis key per request.
///
/// `PeerIp` reads axum's `ConnectInfo`: tollgate's `axum` feature.
#[cfg(feature = "axum")]
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
        tollgate::key::FromExtension::new("client", |c: &ApiClient| c.0.to_owned()),
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
        ["tollgate:{per-ip:ip:127.0.0.1}:1m"]
    );

    // The recipe it replaces: every invented key is a fresh bucket and a key.
    let redis = RedisServer::start();
    let header_or_ip = Header::new("x-api-key").unwrap().or(PeerIp::new());
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
    let start = redis.time_us();
    let first = client.get(&server.url("/")).await;
    assert_eq!(summary(&first.body), "allowed=true remaining=0 limit=1");
    let r = client.get(&server.url("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(r.body.contains("#quota-exceeded"), "{}", r.body);
    assert!(
        r.body.contains("\"violated-policies\":[\"default\"]"),
        "{}",
        r.body
    );
    let wait = r.retry_after().unwrap();
    assert!(wait_range(&redis, start, 60).contains(&wait), "{wait}");

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
    let start = redis.time_us();
    let first = client.get(&server.url("/")).await;
    assert_eq!(summary(&first.body), "allowed=true remaining=0 limit=1");
    let r = client.get(&server.url("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let wait_ms: u64 = r
        .body
        .strip_prefix("{\"wait_ms\":")
        .and_then(|b| b.strip_suffix('}'))
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("{}", r.body));
    // The layer still adds what a 429 must carry, from the same decision.
    let wait = r.retry_after().unwrap();
    assert!(wait_range(&redis, start, 60).contains(&wait), "{wait}");
    // The body's wait is in whole milliseconds, rounded down.
    assert!(
        ((wait - 1) * 1000..=wait * 1000).contains(&wait_ms),
        "{wait_ms} ms against Retry-After {wait}"
    );
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(
        r.header("ratelimit"),
        Some(format!("\"custom\";r=0;t={wait}").as_str())
    );
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
    let start = redis.time_us();
    for left in [2, 1, 0] {
        let r = client.get(&server.url("/")).await;
        assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "plain"));
        let item = r.header("ratelimit").unwrap();
        assert!(
            item.starts_with(&format!("\"default\";r={left};")),
            "{item}"
        );
    }
    let r = client.get(&server.url("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let wait = r.retry_after().unwrap();
    assert!(wait_range(&redis, start, 20).contains(&wait), "{wait}");
    // The server put the peer SocketAddr in the extensions; PeerIp keyed by it.
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert_eq!(keys, ["tollgate:{default:ip:127.0.0.1}:3/m:b3"]);
}

// ---------------------------------------------------------------------------
// In process (tower's `oneshot` on the axum router), where the response
// extensions can be seen; the store is still a real Redis.
// ---------------------------------------------------------------------------

/// One `GET /` through `app`, in process: the response with its extensions,
/// and its body as text.
async fn call(app: &Router) -> (http::Response<()>, String) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let req = http::Request::get("/")
        .body(axum::body::Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        http::Response::from_parts(parts, ()),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// The `RateLimit` items of a response, in order.
fn ratelimit_items(res: &http::Response<()>) -> Vec<String> {
    res.headers()
        .get_all("ratelimit")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// Two nested layers with different names: the outer one decides (and spends)
/// first; the handler and the response extensions carry the inner, more
/// specific decision; both report their headers; when the inner one refuses,
/// the outer one has already spent; when the outer one refuses, the inner one
/// is never asked.
#[tokio::test]
async fn nested_layers_spend_outer_first_and_show_the_inner_decision() {
    let redis = RedisServer::start();
    let outer = RateLimitLayer::new(
        redis.store(),
        named("outer", [Quota::per_minute(5).unwrap()]),
    )
    .key(Global)
    .decision_in_response();
    let inner = RateLimitLayer::new(redis.store(), named("inner", [slow()]))
        .key(Global)
        .decision_in_response();
    // The last `.layer` is the outermost.
    let app = Router::new()
        .route("/", get(echo))
        .layer(inner)
        .layer(outer);

    for (outer_left, inner_left) in [(4, 2), (3, 1), (2, 0)] {
        let (res, body) = call(&app).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            summary(&body),
            format!("allowed=true remaining={inner_left} limit=3"),
            "the handler sees the inner decision"
        );
        let d = res.extensions().get::<Decision>().unwrap();
        assert_eq!((d.limit(), d.remaining()), (3, inner_left));
        let items = ratelimit_items(&res);
        assert_eq!(items.len(), 2, "{items:?}");
        assert!(
            items[0].starts_with(&format!("\"inner\";r={inner_left}")),
            "{items:?}"
        );
        assert!(
            items[1].starts_with(&format!("\"outer\";r={outer_left}")),
            "{items:?}"
        );
    }
    // The inner layer refuses, after the outer one spent its token.
    for outer_left in [1, 0] {
        let (res, _) = call(&app).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        let d = res.extensions().get::<Decision>().unwrap();
        assert!(!d.allowed());
        assert_eq!(d.limit(), 3, "the refusing (inner) decision is kept");
        let items = ratelimit_items(&res);
        assert!(items[0].starts_with("\"inner\";r=0"), "{items:?}");
        assert!(
            items[1].starts_with(&format!("\"outer\";r={outer_left}")),
            "{items:?}"
        );
    }
    // Now the outer layer refuses; the inner one is not asked.
    redis.reset_stats();
    let (res, _) = call(&app).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.extensions().get::<Decision>().unwrap().limit(), 5);
    assert_eq!(ratelimit_items(&res).len(), 1);
    assert_eq!(redis.calls("evalsha"), 1, "the inner layer asked the store");
    let mut keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    keys.sort();
    assert_eq!(
        keys,
        [
            "tollgate:{inner:global:global}:1m",
            "tollgate:{outer:global:global}:1m",
        ]
    );
}

/// Nested layers with the same name, key and quota share one bucket: each
/// request spends twice from it (the documented reason to name policies).
#[tokio::test]
async fn nested_layers_with_the_same_name_share_one_bucket() {
    let redis = RedisServer::start();
    let layer = || RateLimitLayer::new(redis.store(), slow()).key(Global);
    let app = Router::new()
        .route("/", get(echo))
        .layer(layer())
        .layer(layer());
    let (res, body) = call(&app).await;
    assert_eq!(res.status(), StatusCode::OK);
    // 3 a minute: the outer layer left 2, the inner one 1.
    assert_eq!(summary(&body), "allowed=true remaining=1 limit=3");
    let (res, _) = call(&app).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert_eq!(keys, ["tollgate:{default:global:global}:3/m:b3"]);
    // Three spends (two, then the outer one before the inner refusal): no
    // whole token left.
    let peek = tollgate::RateLimiter::new(redis.store(), slow())
        .peek("global:global")
        .await
        .unwrap();
    assert_eq!(peek.remaining(), 0);
}

/// A store failure lands in the response extensions as well as the request
/// ones, whatever the layer then does: forwarded (fail open), answered 503
/// (fail closed), or forwarded in shadow mode even when set to fail closed.
#[tokio::test]
async fn store_failures_reach_the_response_extensions() {
    let mut redis = RedisServer::start();
    let store = redis.store();
    let base = || {
        RateLimitLayer::new(store.clone(), slow())
            .key(Global)
            .decision_in_response()
    };
    let app = |layer: RateLimitLayer| Router::new().route("/", get(echo)).layer(layer);
    let allow = app(base());
    let deny = app(base().on_store_error(OnStoreError::Deny));
    let shadow = app(base().on_store_error(OnStoreError::Deny).shadow());
    // Working first: decisions, no failure.
    for app in [&allow, &deny, &shadow] {
        let (res, _) = call(app).await;
        assert!(res.extensions().get::<Decision>().is_some());
        assert!(res.extensions().get::<StoreFailure>().is_none());
    }
    redis.stop();
    let cases = [
        ("allow", &allow, StatusCode::OK, "store-failure"),
        (
            "deny",
            &deny,
            StatusCode::SERVICE_UNAVAILABLE,
            "Service Unavailable: rate limit store unavailable, retry shortly\n",
        ),
        ("shadow", &shadow, StatusCode::OK, "store-failure"),
    ];
    for (name, app, status, body_text) in cases {
        let (res, body) = call(app).await;
        assert_eq!((res.status(), body.as_str()), (status, body_text), "{name}");
        let failure = res
            .extensions()
            .get::<StoreFailure>()
            .unwrap_or_else(|| panic!("{name}: no StoreFailure in the response"));
        assert!(failure.error().is_store_error(), "{name}: {failure:?}");
        assert!(
            !matches!(failure.error(), tollgate::Error::Timeout(_)),
            "{name}: {failure:?}"
        );
        assert!(res.extensions().get::<Decision>().is_none(), "{name}");
        assert_eq!(res.headers().get("ratelimit"), None, "{name}");
    }
}

/// Shadow mode over real sockets with Redis down: requests are forwarded and
/// the handler sees the failure, whichever store-error policy is set.
#[tokio::test]
async fn shadow_mode_forwards_store_failures() {
    let mut redis = RedisServer::start();
    let client = Client::new();
    let mut servers = Vec::new();
    for on_error in [OnStoreError::Allow, OnStoreError::Deny] {
        let layer = RateLimitLayer::new(redis.store(), slow())
            .key(Global)
            .on_store_error(on_error)
            .shadow();
        servers.push(TestServer::axum(app(layer)).await);
    }
    for server in &servers {
        let r = client.get(&server.url("/")).await;
        assert!(r.body.starts_with("allowed=true"), "{}", r.body);
    }
    redis.stop();
    for server in &servers {
        for _ in 0..3 {
            let r = client.get(&server.url("/")).await;
            assert_eq!(
                (r.status, r.body.as_str()),
                (StatusCode::OK, "store-failure")
            );
            assert_eq!(r.header("ratelimit"), None);
            assert_eq!(r.header("retry-after"), None);
        }
    }
}

/// With Redis down and a `fallback`, answers are decided in
/// process under this instance's share of the policy (`share(2)`: 5 of the
/// 10 a minute), and the headers describe that share, not the full policy.
#[tokio::test]
async fn fallback_answers_carry_the_headers_of_their_share() {
    use tollgate::Fallback;

    let mut redis = RedisServer::start();
    let store = redis.store();
    redis.stop();
    let fallback = Fallback::memory().share(std::num::NonZeroU32::new(2).unwrap());
    let layer = RateLimitLayer::new(store, named("api", [Quota::per_minute(10).unwrap()]))
        .key(Global)
        .fallback(fallback);
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    for left in (0..5).rev() {
        let r = client.get(&server.url("/")).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        assert_eq!(r.header("ratelimit-policy"), Some("\"api\";q=5;w=60"));
        assert_eq!(
            summary(&r.body),
            format!("allowed=true remaining={left} limit=5")
        );
        let item = r.header("ratelimit").unwrap();
        assert!(item.starts_with(&format!("\"api\";r={left}")), "{item}");
    }
    let limited = client.get(&server.url("/")).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.header("ratelimit-policy"), Some("\"api\";q=5;w=60"));
    // The next of the 5 tokens a minute is due at most 12 s after the first
    // admission.
    let t = t_of(limited.header("ratelimit").unwrap());
    assert!((1..=12).contains(&t), "{t}");
    assert_eq!(limited.retry_after(), Some(t));
}
