//! Policy tables through a real server and a real Redis: rules chosen by
//! axum route template and method, exemptions that never reach the store,
//! and tables swapped while serving, with what happens to the buckets.
#![cfg(all(feature = "redis", feature = "axum"))]

mod support;

use axum::Router;
use axum::routing::{get, post};
use http::StatusCode;
use support::RedisServer;
use support::http::{Client, Reply, TestServer};
use tollgate::layer::{PolicyRule, PolicyTable, RateLimitLayer, RuleKey};
use tollgate::{Policy, Quota};

fn limit(name: &str, quota: &str) -> PolicyRule {
    PolicyRule::new(Policy::new(name, [quota.parse::<Quota>().unwrap()]).unwrap())
}

/// The table before a reload: per-minute quotas, so nothing refills during
/// the test.
fn first_table() -> PolicyTable {
    PolicyTable::new([
        PolicyRule::exempt("health")
            .unwrap()
            .routes(["GET /health"])
            .unwrap(),
        limit("login", "2/min").routes(["POST /login"]).unwrap(),
        limit("items", "3/min").routes(["/items/{id}"]).unwrap(),
    ])
    .unwrap()
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route(
            "/login",
            post(|| async { "welcome" }).get(|| async { "form" }),
        )
        .route("/items/{id}", get(|| async { "item" }))
        .route("/health", get(|| async { "ok" }))
        .route("/other", get(|| async { "other" }))
        .layer(layer)
}

async fn statuses(client: &Client, method: &str, url: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(client.send(method, url, &[]).await.status.as_u16());
    }
    out
}

fn policy_of(reply: &Reply) -> Option<&str> {
    reply.header("ratelimit-policy")
}

#[tokio::test]
async fn rules_choose_by_route_and_a_swap_applies_while_serving() {
    let redis = RedisServer::start();
    let table = first_table();
    let layer = RateLimitLayer::new(
        redis.store(),
        Policy::new("api", [Quota::per_minute(100).unwrap()]).unwrap(),
    )
    .policy_table(table.clone());
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    let url = |path: &str| server.url(path);

    // POST /login is the login policy; GET /login is not (it falls to api).
    assert_eq!(
        statuses(&client, "POST", &url("/login"), 3).await,
        [200, 200, 429]
    );
    let form = client.get(&url("/login")).await;
    assert_eq!(form.status, StatusCode::OK);
    assert_eq!(policy_of(&form), Some("\"api\";q=100;w=60"));
    // One bucket per template, whatever the id.
    let mut items = Vec::new();
    for id in 1..=4 {
        items.push(
            client
                .get(&url(&format!("/items/{id}")))
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(items, [200, 200, 200, 429]);
    // Exempt: no header, and no store call.
    let calls = redis.calls("evalsha");
    for _ in 0..5 {
        let health = client.get(&url("/health")).await;
        assert_eq!(health.status, StatusCode::OK);
        assert_eq!(policy_of(&health), None);
    }
    assert_eq!(
        redis.calls("evalsha"),
        calls,
        "an exempt request reached the store"
    );
    // Paths axum does not route to /login never reach its rule (nor its handler).
    assert_eq!(client.send("POST", &url("/login/"), &[]).await.status, 404);

    // Reload: login is now 4 a minute, items unchanged. Same server, same
    // router, same layer.
    table.swap(
        PolicyTable::new([
            PolicyRule::exempt("health")
                .unwrap()
                .routes(["GET /health"])
                .unwrap(),
            limit("login", "4/min").routes(["POST /login"]).unwrap(),
            limit("items", "3/min").routes(["/items/{id}"]).unwrap(),
        ])
        .unwrap(),
    );
    // The changed quota carries the bucket over: the client had spent all
    // of the old one's 2, so it has none of the new one's 4 (a per-minute
    // refill gives nothing during the test).
    let login = statuses(&client, "POST", &url("/login"), 3).await;
    assert_eq!(login, [429, 429, 429]);
    let reply = client.send("POST", &url("/login"), &[]).await;
    assert_eq!(policy_of(&reply), Some("\"login\";q=4;w=60"));
    // The unchanged one kept its bucket: still limited.
    assert_eq!(client.get(&url("/items/9")).await.status, 429);

    // Reload without the items rule: /items falls to the layer's own policy.
    table.swap(
        PolicyTable::new([limit("login", "4/min").routes(["POST /login"]).unwrap()]).unwrap(),
    );
    let item = client.get(&url("/items/9")).await;
    assert_eq!(item.status, StatusCode::OK);
    assert_eq!(policy_of(&item), Some("\"api\";q=100;w=60"));
    // Health lost its exemption with the reload: limited by api now.
    assert_eq!(
        policy_of(&client.get(&url("/health")).await),
        Some("\"api\";q=100;w=60")
    );

    // Back to the first table: login's bucket is still in Redis (it expires
    // only when full again), carried back into 2/min: still spent.
    table.swap(first_table());
    assert_eq!(client.send("POST", &url("/login"), &[]).await.status, 429);
}

/// A rule's own key: a header-keyed rule counts each tenant apart, while the
/// layer's key (the peer address) covers the rest.
#[tokio::test]
async fn a_rule_with_its_own_key() {
    let redis = RedisServer::start();
    let table = PolicyTable::new([limit("tenants", "1/min")
        .routes(["/items/{id}"])
        .unwrap()
        .key(RuleKey::header("x-tenant").unwrap())])
    .unwrap();
    let layer =
        RateLimitLayer::new(redis.store(), Quota::per_minute(100).unwrap()).policy_table(table);
    let server = TestServer::axum(app(layer)).await;
    let client = Client::new();
    let item = server.url("/items/1");
    let as_tenant = |t: &'static str| [("x-tenant", t.as_bytes())];
    let a = client.get_with(&item, &as_tenant("a")).await;
    let b = client.get_with(&item, &as_tenant("b")).await;
    let a_again = client.get_with(&item, &as_tenant("a")).await;
    assert_eq!(
        (
            a.status.as_u16(),
            b.status.as_u16(),
            a_again.status.as_u16()
        ),
        (200, 200, 429)
    );
    // Without the header the rule's key is missing: 400, naming its kind.
    let none = client.get(&item).await;
    assert_eq!(none.status, StatusCode::BAD_REQUEST);
    assert!(none.body.contains("header:x-tenant"), "{}", none.body);
    // The header's value is stored hashed, never in clear.
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert!(
        keys.iter().any(|k| k.contains("tenants:header:x-tenant:#")),
        "{keys:?}"
    );
}

/// gRPC methods by path on a tonic server: a rule per method, an exempt
/// method, and a swap, all without rebuilding the server.
#[tokio::test]
async fn rules_choose_grpc_methods_on_a_tonic_server() {
    use support::grpc::{GrpcServer, check, meta, within};
    use tonic_health::pb::HealthCheckRequest;

    let redis = RedisServer::start();
    let rules = |checks: &str| {
        PolicyTable::new([
            PolicyRule::exempt("watches")
                .unwrap()
                .grpc(["/grpc.health.v1.Health/Watch"])
                .unwrap(),
            limit("checks", checks)
                .grpc(["/grpc.health.v1.Health/Check"])
                .unwrap()
                .key(RuleKey::global()),
        ])
        .unwrap()
    };
    let table = rules("2/min");
    let layer = RateLimitLayer::new(redis.store(), Quota::per_minute(100).unwrap())
        .key(tollgate::key::Global)
        .policy_table(table.clone());
    let server = GrpcServer::start(layer).await;
    let mut client = server.client().await;
    for _ in 0..2 {
        let ok = within(client.check(check(&[]))).await.expect("admitted");
        assert_eq!(
            meta(ok.metadata(), "ratelimit-policy"),
            Some("\"checks\";q=2;w=60")
        );
    }
    let status = within(client.check(check(&[]))).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(status.message().contains("policy checks"), "{status:?}");
    // Watch is exempt: no rate limit metadata at all.
    let watch = within(client.watch(HealthCheckRequest {
        service: String::new(),
    }))
    .await
    .expect("exempt");
    assert_eq!(meta(watch.metadata(), "ratelimit-policy"), None);
    // A reload with a larger quota: the spent bucket is carried over (2 of
    // 2 spent is 3 of 3 spent), so no free burst, under the new policy.
    table.swap(rules("3/min"));
    let status = within(client.check(check(&[]))).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(
        meta(status.metadata(), "ratelimit-policy"),
        Some("\"checks\";q=3;w=60")
    );
}
