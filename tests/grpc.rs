//! The layer in front of tonic through real sockets against a real Redis: a
//! tonic server (and an axum server mixing HTTP routes with gRPC services) on
//! 127.0.0.1:0, tonic clients, and a `redis-server` per test.
//!
//! Quotas refill slowly (a few a minute), so counts never depend on how fast a
//! busy machine sends calls. Tests that read the `google.rpc` details or the
//! peer address need the `tonic` feature; the others show that gRPC clients get
//! gRPC answers without it too.
#![cfg(feature = "redis")]

mod support;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use http_body_util::BodyExt;
use support::RedisServer;
use support::grpc::{
    self, CHECK, GrpcServer, PROBE_DECISION, PROBE_STORE_FAILURE, check, meta, pushback, within,
};
use support::http::{Client, TestServer};
use tollgate::key::{Global, Header};
use tollgate::layer::{Choice, OnStoreError, RateLimitLayer, grpc_method};
use tollgate::{Policy, Quota};
use tonic::Code;
use tonic_health::ServingStatus;
use tonic_health::pb::HealthCheckRequest;
use tower::{Service, ServiceExt};

/// `n` a minute: nothing refills during a test that does not wait on purpose.
fn per_minute(n: u64) -> Quota {
    Quota::per_minute(n).unwrap()
}

/// A layer for tonic's server, as it is: no body configuration.
fn layer(redis: &RedisServer, policy: impl Into<Policy>) -> RateLimitLayer {
    RateLimitLayer::new(redis.store(), policy)
}

/// A policy named `name` of `quotas`.
fn named(name: &str, quotas: impl IntoIterator<Item = Quota>) -> Policy {
    Policy::new(name, quotas).unwrap()
}

/// The `t` of a `RateLimit` item (`"name";r=0;t=30`).
fn t_of(item: &str) -> u64 {
    item.rsplit(";t=").next().unwrap().parse().unwrap()
}

/// Microseconds of Redis time since `start_us` (a Redis `TIME` reading).
///
/// A wait of `w` counted from a spend made after `start_us` is reported as
/// `w` less the time that passed until the decision, which is at most this:
/// so the reported wait lies within `w - elapsed ..= w`, a bound measured on
/// the store's own clock rather than a guessed margin.
fn elapsed_us(redis: &RedisServer, start_us: u64) -> u64 {
    redis.time_us() - start_us
}

#[tokio::test]
async fn limited_calls_get_resource_exhausted_with_pushback() {
    let redis = RedisServer::start();
    let layer = layer(&redis, named("health", [per_minute(2)])).key(Global);
    let server = GrpcServer::start(layer).await;
    let mut client = server.client().await;
    let start = redis.time_us();
    for r in [1, 0] {
        let ok = within(client.check(check(&[]))).await.expect("admitted");
        // The rate limit headers arrive as initial metadata.
        let md = ok.metadata();
        assert_eq!(meta(md, "ratelimit-policy"), Some("\"health\";q=2;w=60"));
        let item = meta(md, "ratelimit").unwrap();
        assert!(item.starts_with(&format!("\"health\";r={r};t=")), "{item}");
    }
    let status = within(client.check(check(&[]))).await.unwrap_err();
    // Not UNAVAILABLE, which is what tonic makes of a bare HTTP 429.
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let ms = pushback(&status).expect("grpc-retry-pushback-ms") as u64;
    // One token every 30 s, counted from the first spend, rounded up to the
    // millisecond.
    let lowest = 30_000 - elapsed_us(&redis, start) / 1000;
    assert!((lowest..=30_000).contains(&ms), "{ms}");
    assert_eq!(
        status.message(),
        format!("rate limit exceeded: policy health, retry in {ms} ms")
    );
    // The same decision in whole seconds, rounded up, for HTTP-minded readers.
    let t = t_of(meta(status.metadata(), "ratelimit").unwrap());
    assert_eq!(t, (ms as u64).div_ceil(1000));
    assert_eq!(meta(status.metadata(), "retry-after"), None);
}

#[cfg(feature = "tonic")]
#[tokio::test]
async fn details_carry_retry_info_and_quota_failure() {
    use tonic_types::StatusExt;

    let redis = RedisServer::start();
    let quotas = [per_minute(2), Quota::per_hour(100).unwrap()];
    let layer = layer(&redis, named("reads", quotas)).key(Header::new("x-api-key").unwrap());
    let server = GrpcServer::start(layer).await;
    let mut client = server.client().await;
    let key = [("x-api-key", "k-secret-1")];
    for _ in 0..2 {
        within(client.check(check(&key))).await.expect("admitted");
    }
    let status = within(client.check(check(&key))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let ms = pushback(&status).unwrap() as u64;
    let retry = status.get_details_retry_info().expect("RetryInfo");
    // The decision's wait rounded up to the millisecond, exactly the pushback.
    assert_eq!(
        retry.retry_delay,
        Some(std::time::Duration::from_millis(ms))
    );
    let failure = status.get_details_quota_failure().expect("QuotaFailure");
    // Only the per-minute quota is exhausted; the hourly one has room left.
    assert_eq!(failure.violations.len(), 1, "{failure:?}");
    let v = &failure.violations[0];
    assert_eq!(v.quota_id, "reads.0");
    assert_eq!(v.quota_value, 2);
    assert_eq!(v.subject, "header:x-api-key");
    // The quota in its text form, as a configuration file writes it.
    assert_eq!(
        v.description,
        "policy reads, quota reads.0: 2/min exhausted"
    );
    // No client key is echoed anywhere in the answer.
    assert!(!format!("{status:?} {failure:?}").contains("k-secret-1"));
    for value in status.metadata().clone().into_headers().values() {
        assert!(!value.to_str().unwrap_or("").contains("k-secret-1"));
    }
}

/// A lock-out (`Quota::lockout`): the refusal that locks tells its end in
/// the pushback, `RetryInfo` and the `RateLimit` item, exactly (the script
/// sets it from the same clock); a call during it is refused until then.
#[cfg(feature = "tonic")]
#[tokio::test]
async fn a_lockout_tells_its_end_in_retry_info() {
    use tonic_types::StatusExt;

    let redis = RedisServer::start();
    // 2 a minute (a token every 30 s), then 10 minutes locked out.
    let quota = per_minute(2)
        .lockout(std::time::Duration::from_secs(600))
        .unwrap();
    let layer = layer(&redis, named("guarded", [quota])).key(Global);
    let server = GrpcServer::start(layer).await;
    let mut client = server.client().await;
    for _ in 0..2 {
        within(client.check(check(&[]))).await.expect("admitted");
    }
    let status = within(client.check(check(&[]))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(pushback(&status), Some(600_000));
    let retry = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(retry.retry_delay, Some(std::time::Duration::from_secs(600)));
    assert_eq!(t_of(meta(status.metadata(), "ratelimit").unwrap()), 600);
    // Refused again a few milliseconds on: the end stays where it was (a
    // refusal during the lock-out does not start it again).
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let again = within(client.check(check(&[]))).await.unwrap_err();
    let ms = pushback(&again).unwrap();
    assert!(ms < 600_000, "{ms}");
}

#[tokio::test]
async fn limited_answer_is_http_200_trailers_only() {
    let redis = RedisServer::start();
    let server = GrpcServer::start(layer(&redis, per_minute(1)).key(Global)).await;
    let mut client = server.client().await;
    let start = redis.time_us();
    within(client.check(check(&[]))).await.expect("admitted");

    // The same call again, sent raw over HTTP/2 to see the wire answer.
    let mut channel = grpc::channel(server.addr()).await;
    let req = http::Request::post(format!("http://{}{CHECK}", server.addr()))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::empty())
        .unwrap();
    let res = within(channel.ready().await.unwrap().call(req))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let (parts, body) = res.into_parts();
    let h = &parts.headers;
    assert_eq!(h["content-type"], "application/grpc");
    assert_eq!(h["grpc-status"], "8");
    assert!(
        h["grpc-message"]
            .to_str()
            .unwrap()
            .starts_with("rate limit")
    );
    let ms: u64 = h["grpc-retry-pushback-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let lowest = 60_000 - elapsed_us(&redis, start) / 1000;
    assert!((lowest..=60_000).contains(&ms), "{ms}");
    // The details need tonic-types, so they come with the `tonic` feature only.
    assert_eq!(
        h.contains_key("grpc-status-details-bin"),
        cfg!(feature = "tonic")
    );
    // A 200 that no cache may keep.
    assert_eq!(h["cache-control"], "no-store");
    // Trailers-only: the header block ends the stream, no data, no trailers.
    let body = within(body.collect()).await.unwrap();
    assert!(body.trailers().is_none());
    assert!(body.to_bytes().is_empty());

    // A GET is no gRPC call, whatever its content-type and even over HTTP/2:
    // it gets the HTTP answer, not an empty 200 a cache could serve to others.
    let req = http::Request::get(format!("http://{}{CHECK}", server.addr()))
        .header("content-type", "application/grpc")
        .body(tonic::body::Body::empty())
        .unwrap();
    let res = within(channel.ready().await.unwrap().call(req))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["cache-control"], "no-store");
    assert!(!res.headers().contains_key("grpc-status"));
}

#[tokio::test]
async fn only_real_grpc_calls_get_grpc_answers() {
    let redis = RedisServer::start();
    let limit = RateLimitLayer::new(redis.store(), per_minute(1)).key(Global);
    let page = || async { "popular page" };
    let app = Router::new()
        .route("/popular", get(page).post(page))
        .layer(limit);
    let server = TestServer::axum(app).await;
    let http = Client::new();
    let url = server.url("/popular");
    assert_eq!(http.get(&url).await.status, StatusCode::OK);

    // A limited GET claiming to be gRPC: the HTTP 429, never an empty 200 that
    // a cache in front of the service would keep and serve to every user.
    let r = http
        .get_with(&url, &[("content-type", b"application/grpc")])
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("grpc-status"), None);
    assert!(r.retry_after().is_some());
    assert!(r.body.starts_with("Too Many Requests"), "{}", r.body);
    // Not a gRPC media type, though it starts like one.
    let r = http
        .send("POST", &url, &[("content-type", b"application/grpcx")])
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");

    // gRPC-Web runs over HTTP/1.1, and reaches a limit inside tonic-web as
    // application/grpc over HTTP/1.1: both are calls, answered trailers-only,
    // and a POST answer marked no-store is not cached either.
    for (content_type, answered) in [
        (&b"application/grpc-web+proto"[..], "application/grpc-web"),
        (b"application/grpc+proto", "application/grpc"),
    ] {
        let r = http
            .send("POST", &url, &[("content-type", content_type)])
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        assert_eq!(r.header("content-type"), Some(answered));
        assert_eq!(r.header("grpc-status"), Some("8"));
        assert_eq!(r.header("cache-control"), Some("no-store"));
        assert!(r.body.is_empty(), "{}", r.body);
    }
}

// The default key (the peer address) reads axum's ConnectInfo: tollgate's
// `axum` feature.
#[cfg(feature = "axum")]
#[tokio::test]
async fn mixed_server_answers_http_with_429_and_grpc_with_a_status() {
    use tollgate::layer::Rejection;

    let redis = RedisServer::start();
    // One layer in front of both: HTTP routes and a tonic service in one axum
    // router, keyed by the peer address (axum's ConnectInfo). The rejection
    // style applies to HTTP only.
    let limit =
        RateLimitLayer::new(redis.store(), per_minute(2)).rejection(Rejection::problem_json());
    let (_reporter, health) = tonic_health::server::health_reporter();
    let app = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .merge(tonic::service::Routes::new(health).into_axum_router())
        .layer(limit);
    let server = TestServer::axum(app).await;
    let http = Client::new();
    let mut grpc =
        tonic_health::pb::health_client::HealthClient::new(grpc::channel(server.addr()).await);

    let start = redis.time_us();
    let r = http.get(&server.url("/hello")).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "hello"));
    let ok = within(grpc.check(check(&[]))).await.expect("admitted");
    let item = meta(ok.metadata(), "ratelimit").unwrap();
    assert!(item.starts_with("\"default\";r=0;t="), "{item}");

    // Both protocols spend from the one bucket of 127.0.0.1, now empty.
    let r = http.get(&server.url("/hello")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    // One token every 30 s from the first spend, in whole seconds rounded up.
    let wait = r.retry_after().unwrap();
    let lowest = 30 - elapsed_us(&redis, start) / 1_000_000;
    assert!((lowest..=30).contains(&wait), "{wait}");
    assert!(
        r.header("ratelimit")
            .unwrap()
            .starts_with("\"default\";r=0;t=")
    );
    let status = within(grpc.check(check(&[]))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(pushback(&status).unwrap() > 0);
}

#[tokio::test]
async fn per_method_policies_from_the_grpc_path() {
    let redis = RedisServer::start();
    let checks = Policy::new("checks", [per_minute(2)]).unwrap();
    let watches = Policy::new("watches", [per_minute(1)]).unwrap();
    let layer = layer(&redis, per_minute(100))
        .key(Global)
        .select_policy(move |parts| match grpc_method(parts) {
            Some(("grpc.health.v1.Health", "Check")) => checks.clone().into(),
            Some(("grpc.health.v1.Health", "Watch")) => watches.clone().into(),
            _ => Choice::Default,
        });
    let server = GrpcServer::start(layer).await;
    let mut client = server.client().await;

    for _ in 0..2 {
        within(client.check(check(&[]))).await.expect("admitted");
    }
    let status = within(client.check(check(&[]))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("policy checks"), "{status:?}");

    // Watch has its own bucket of one: a server-streaming call is checked once,
    // when it starts, however many messages it then receives.
    let request = || HealthCheckRequest {
        service: String::new(),
    };
    let watch = within(client.watch(request())).await.expect("admitted");
    assert_eq!(
        meta(watch.metadata(), "ratelimit-policy"),
        Some("\"watches\";q=1;w=60")
    );
    let mut stream = watch.into_inner();
    let mut seen = Vec::new();
    for next in [ServingStatus::NotServing, ServingStatus::Serving] {
        let msg = within(stream.message()).await.unwrap().expect("a message");
        seen.push(msg.status);
        server.reporter.set_service_status("", next).await;
    }
    let msg = within(stream.message()).await.unwrap().expect("a message");
    seen.push(msg.status);
    assert_eq!(seen, [1, 2, 1], "SERVING, NOT_SERVING, SERVING");

    let status = within(client.watch(request())).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("policy watches"), "{status:?}");
}

#[tokio::test]
async fn keys_from_grpc_metadata() {
    let redis = RedisServer::start();
    let layer = layer(&redis, per_minute(1)).key(Header::new("x-api-key").unwrap());
    let server = GrpcServer::start(layer).await;
    let mut client = server.client().await;

    within(client.check(check(&[("x-api-key", "k-1")])))
        .await
        .expect("admitted");
    let status = within(client.check(check(&[("x-api-key", "k-1")])))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    // Another key has its own bucket.
    within(client.check(check(&[("x-api-key", "k-2")])))
        .await
        .expect("admitted");

    // No key, and MissingKey::reject (the default): INVALID_ARGUMENT naming the
    // kind of key that was expected.
    let status = within(client.check(check(&[]))).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(
        status.message(),
        "no rate limit key (header:x-api-key) in this call"
    );
    assert_eq!(pushback(&status), None);

    // One bucket per metadata value, hashed: the API keys never reach Redis.
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert_eq!(keys.len(), 2, "{keys:?}");
    for key in &keys {
        assert!(
            key.starts_with("tollgate:{default:header:x-api-key:#"),
            "{key}"
        );
        assert!(!key.contains("k-1") && !key.contains("k-2"), "{key}");
    }
}

#[cfg(feature = "tonic")]
#[tokio::test]
async fn the_default_key_is_the_peer_from_tcp_connect_info() {
    use tonic_types::StatusExt;

    let redis = RedisServer::start();
    // No .key(...): PeerIp, read from the TcpConnectInfo tonic's server inserts.
    let server = GrpcServer::start(layer(&redis, per_minute(1))).await;
    let mut client = server.client().await;
    within(client.check(check(&[]))).await.expect("admitted");
    let status = within(client.check(check(&[]))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let failure = status.get_details_quota_failure().unwrap();
    assert_eq!(failure.violations[0].subject, "ip");
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert_eq!(keys, ["tollgate:{default:ip:127.0.0.1}:1/m:b1"]);
}

#[cfg(feature = "tonic")]
#[tokio::test]
async fn the_default_key_is_the_peer_on_a_tls_server_too() {
    use tollgate::key::ClientIp;

    // TLS the application terminates itself stores only
    // TlsConnectInfo<TcpConnectInfo>; tonic's own TLS stores it next to
    // TcpConnectInfo. Either way the peer must be found, or every call would be
    // rejected as keyless (INVALID_ARGUMENT).
    for own_tls in [false, true] {
        let redis = RedisServer::start();
        let start = |layer| async move {
            if own_tls {
                GrpcServer::start_tls(layer).await
            } else {
                GrpcServer::start_tls_incoming(layer).await
            }
        };
        let server = start(layer(&redis, per_minute(1))).await;
        let mut client = server.client().await;
        within(client.check(check(&[]))).await.expect("admitted");
        let status = within(client.check(check(&[]))).await.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        // ClientIp checks that peer against its trusted proxies the same way.
        let trusted = ClientIp::trusted_proxies(["127.0.0.0/8"]).unwrap();
        let xff = [("x-forwarded-for", "198.51.100.9, 203.0.113.7")];
        let server = start(layer(&redis, per_minute(1)).key(trusted)).await;
        within(server.client().await.check(check(&xff)))
            .await
            .expect("admitted");
        let mut keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
        keys.sort();
        assert_eq!(
            keys,
            [
                "tollgate:{default:client-ip:203.0.113.7}:1/m:b1",
                "tollgate:{default:ip:127.0.0.1}:1/m:b1",
            ],
            "own TLS: {own_tls}"
        );
    }
}

#[cfg(feature = "tonic")]
#[tokio::test]
async fn client_ip_believes_metadata_only_from_trusted_peers() {
    use tollgate::key::ClientIp;

    let redis = RedisServer::start();
    let xff = [("x-forwarded-for", "198.51.100.9, 203.0.113.7")];
    // The loopback peer (from TcpConnectInfo) is a trusted proxy: the client is
    // the rightmost untrusted x-forwarded-for entry.
    let trusted = ClientIp::trusted_proxies(["127.0.0.0/8"]).unwrap();
    let server = GrpcServer::start(layer(&redis, per_minute(1)).key(trusted)).await;
    within(server.client().await.check(check(&xff)))
        .await
        .expect("admitted");
    // The same header from a peer outside the trusted networks is ignored.
    let untrusted = ClientIp::trusted_proxies(["10.0.0.0/8"]).unwrap();
    let server = GrpcServer::start(layer(&redis, per_minute(1)).key(untrusted)).await;
    within(server.client().await.check(check(&xff)))
        .await
        .expect("admitted");
    let mut keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    keys.sort();
    assert_eq!(
        keys,
        [
            "tollgate:{default:client-ip:127.0.0.1}:1/m:b1",
            "tollgate:{default:client-ip:203.0.113.7}:1/m:b1",
        ]
    );
}

#[tokio::test]
async fn store_down_is_unavailable_with_deny_and_unlimited_with_allow() {
    let mut redis = RedisServer::start();
    let deny = GrpcServer::start(
        layer(&redis, per_minute(1))
            .key(Global)
            .on_store_error(OnStoreError::Deny),
    )
    .await;
    // Probed: the health service's view shows the layer was there and failed
    // open, which a forwarded call alone would not.
    let allow = GrpcServer::start_probed(layer(&redis, per_minute(1)).key(Global)).await;
    let mut client = allow.client().await;
    let ok = within(client.check(check(&[]))).await.expect("admitted");
    assert_eq!(
        meta(ok.metadata(), PROBE_DECISION),
        Some("allowed=true remaining=0 limit=1")
    );
    redis.stop();

    let status = within(deny.client().await.check(check(&[])))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(
        status.message(),
        "rate limit store unavailable, retry shortly"
    );
    assert_eq!(pushback(&status), Some(1000));
    #[cfg(feature = "tonic")]
    {
        use tonic_types::StatusExt;
        let retry = status.get_details_retry_info().expect("RetryInfo");
        assert_eq!(retry.retry_delay, Some(std::time::Duration::from_secs(1)));
    }

    // Fail open (the default): every call passes, unlimited (the bucket of
    // one is spent: with a working store these would be refused), and the
    // service sees the failure.
    for _ in 0..3 {
        let ok = within(client.check(check(&[]))).await.expect("forwarded");
        assert_eq!(meta(ok.metadata(), "ratelimit"), None);
        assert_eq!(meta(ok.metadata(), PROBE_DECISION), None);
        let failure = meta(ok.metadata(), PROBE_STORE_FAILURE).expect("a StoreFailure");
        assert!(!failure.is_empty());
    }
}

/// Shadow mode over gRPC: calls over the limit are forwarded (no
/// `RESOURCE_EXHAUSTED`) with the refusing decision in the request
/// extensions and the `RateLimit` metadata; with Redis down they are
/// forwarded too, even with `OnStoreError::Deny`, carrying the failure.
#[tokio::test]
async fn shadow_mode_forwards_over_limit_and_failed_calls() {
    let mut redis = RedisServer::start();
    let shadow = |on_error| {
        layer(&redis, named("health", [per_minute(2)]))
            .key(Global)
            .on_store_error(on_error)
            .shadow()
    };
    let allow = GrpcServer::start_probed(shadow(OnStoreError::Allow)).await;
    // For the outage below: stores that have denied nobody, so no answer can
    // come from a deny cache.
    let fresh_allow = GrpcServer::start_probed(shadow(OnStoreError::Allow)).await;
    let fresh_deny = GrpcServer::start_probed(shadow(OnStoreError::Deny)).await;
    let mut client = allow.client().await;
    let start = redis.time_us();
    for left in [1, 0] {
        let ok = within(client.check(check(&[]))).await.expect("admitted");
        assert_eq!(
            meta(ok.metadata(), PROBE_DECISION),
            Some(format!("allowed=true remaining={left} limit=2").as_str())
        );
    }
    for _ in 0..3 {
        let ok = within(client.check(check(&[])))
            .await
            .expect("forwarded in shadow mode");
        let md = ok.metadata();
        assert_eq!(
            meta(md, PROBE_DECISION),
            Some("allowed=false remaining=0 limit=2")
        );
        // One token every 30 s from the first spend.
        let t = t_of(meta(md, "ratelimit").unwrap());
        let lowest = 30 - elapsed_us(&redis, start) / 1_000_000;
        assert!((lowest..=30).contains(&t), "t={t}");
        assert_eq!(
            meta(md, "ratelimit"),
            Some(format!("\"health\";r=0;t={t}").as_str())
        );
        assert_eq!(meta(md, "grpc-retry-pushback-ms"), None);
    }

    redis.stop();
    for server in [&fresh_allow, &fresh_deny] {
        let mut client = server.client().await;
        let ok = within(client.check(check(&[])))
            .await
            .expect("forwarded in shadow mode");
        assert_eq!(meta(ok.metadata(), PROBE_DECISION), None);
        assert!(meta(ok.metadata(), PROBE_STORE_FAILURE).is_some());
        assert_eq!(meta(ok.metadata(), "ratelimit"), None);
    }
}

#[tokio::test]
async fn cost_above_capacity_is_resource_exhausted_and_never_retried() {
    let redis = RedisServer::start();
    let layer = layer(&redis, per_minute(2))
        .key(Global)
        .cost(|parts| if parts.uri.path() == CHECK { 3 } else { 1 });
    let server = GrpcServer::start(layer).await;
    let status = within(server.client().await.check(check(&[])))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    // gRFC A6: a negative pushback tells retry policies not to retry.
    assert_eq!(pushback(&status), Some(-1));
    assert!(
        status.message().contains("can never be admitted"),
        "{status:?}"
    );
    #[cfg(feature = "tonic")]
    {
        use tonic_types::StatusExt;
        assert!(status.get_details_retry_info().is_none());
        let failure = status.get_details_quota_failure().unwrap();
        assert_eq!(failure.violations[0].quota_id, "default");
    }
    // Decided without asking the store.
    assert_eq!(redis.calls("evalsha") + redis.calls("eval"), 0);
}
