//! Different limits per route and per customer tier, then a scripted run.
//!
//! `cargo run --example per_route` starts the server on a free loopback port,
//! sends a few requests that show each policy at work, prints the answers and
//! exits. `cargo run --example per_route -- --serve` keeps serving on
//! 127.0.0.1:3000 until Ctrl-C instead.
//!
//! - every request: 30 a minute per client address, in the outermost layer,
//!   so unauthenticated requests are limited too;
//! - then an auth layer checks the API key against the server's records and
//!   stores the customer (unknown keys: 401, and no bucket of their own);
//! - `GET /search`: 2 a second per customer (expensive), its own `route_layer`;
//! - `POST /bulk`: costs one token per item in `x-items` (at least 1);
//! - everything else: the customer's tier picks the policy: `pro` 100 a minute,
//!   otherwise `free` 10 a minute. The tier comes from the server's records
//!   (what the auth layer stored), never from a header the client writes: each
//!   policy has its own buckets, so a client choosing its tier could pick the
//!   larger quota;
//! - `GET /health`: added after every layer, neither limited nor authenticated.
//!
//! Customers are keyed by who they are (`FromExtension`), not by the API key
//! header: with the raw header, a client sending a new random key per request
//! would get a fresh bucket each time.

use std::error::Error;
use std::net::SocketAddr;

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::key::{FromExtension, PeerIp};
use tollgate::layer::{Choice, RateLimitLayer};
use tollgate::{MemoryStore, Policy, Quota};

/// One scripted request: method, path, headers.
type Step = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// A customer, as the auth layer found it in the server's records.
#[derive(Clone)]
struct Customer {
    name: &'static str,
    tier: &'static str,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let store = MemoryStore::new();
    let free = Policy::new("free", [Quota::per_minute(10)?])?;
    let pro = Policy::new("pro", [Quota::per_minute(100)?])?;
    let bulk = Policy::new("bulk", [Quota::per_minute(20)?])?;
    let customer = || FromExtension::new("customer", |c: &Customer| c.name.to_owned());

    let per_ip = RateLimitLayer::new(
        store.clone(),
        Policy::new("per-ip", [Quota::per_minute(30)?])?,
    )
    .key(PeerIp::new());
    let by_tier = RateLimitLayer::new(store.clone(), free.clone())
        .key(customer())
        .select_policy(move |parts| {
            // The route template axum matched, and the tier the auth layer
            // stored: both trusted, neither written by the client.
            let route = parts
                .extensions
                .get::<MatchedPath>()
                .map(MatchedPath::as_str);
            let tier = parts.extensions.get::<Customer>().map(|c| c.tier);
            match (route, tier) {
                (Some("/bulk"), _) => bulk.clone().into(),
                (_, Some("pro")) => pro.clone().into(),
                _ => Choice::Default,
            }
        })
        // Bulk calls weigh one token per item; anything unparsable weighs 1, and
        // never less than 1: a client that could send `x-items: 0` would be free.
        .cost(|parts| {
            parts
                .headers
                .get("x-items")
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .unwrap_or(1)
                .max(1)
        });
    let search =
        RateLimitLayer::new(store, Policy::new("search", [Quota::per_second(2)?])?).key(customer());

    let app = Router::new()
        .route("/search", get(|| async { "results\n" }))
        .route_layer(search)
        .route("/", get(|| async { "home\n" }))
        .route("/bulk", post(|| async { "imported\n" }))
        .layer(by_tier)
        .layer(middleware::from_fn(authenticate))
        .layer(per_ip)
        .route("/health", get(|| async { "ok\n" }));
    // PeerIp reads the peer address from axum's ConnectInfo.
    let app = app.into_make_service_with_connect_info::<SocketAddr>();

    if std::env::args().any(|a| a == "--serve") {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
        println!("listening on http://127.0.0.1:3000; Ctrl-C stops");
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        return Ok(());
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let script: &[Step] = &[
        ("GET", "/search", &[("x-api-key", "alice")]),
        ("GET", "/search", &[("x-api-key", "alice")]),
        ("GET", "/search", &[("x-api-key", "alice")]),
        ("GET", "/", &[("x-api-key", "alice")]),
        ("GET", "/", &[("x-api-key", "bob")]),
        (
            "POST",
            "/bulk",
            &[("x-api-key", "alice"), ("x-items", "15")],
        ),
        (
            "POST",
            "/bulk",
            &[("x-api-key", "alice"), ("x-items", "10")],
        ),
        (
            "POST",
            "/bulk",
            &[("x-api-key", "alice"), ("x-items", "50")],
        ),
        ("GET", "/health", &[]),
        ("GET", "/", &[]),
        ("GET", "/", &[("x-api-key", "k-random-81f3")]),
    ];
    for (method, path, headers) in script {
        let mut req = Request::builder()
            .method(*method)
            .uri(format!("{base}{path}"));
        for (name, value) in *headers {
            req = req.header(*name, *value);
        }
        let res = client.request(req.body(Full::new(Bytes::new()))?).await?;
        let status = res.status();
        let ratelimit = res
            .headers()
            .get_all("ratelimit")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(", ");
        let body = res.into_body().collect().await?.to_bytes();
        let shown: Vec<String> = headers.iter().map(|(n, v)| format!("{n}: {v}")).collect();
        println!("{method:<4} {path:<8} {:<34} -> {status}", shown.join(", "));
        if !ratelimit.is_empty() {
            println!("     RateLimit: {ratelimit}");
        }
        println!("     {}", String::from_utf8_lossy(&body).trim_end());
    }
    drop(client);
    let _ = stop.send(());
    server.await??;
    Ok(())
}

/// The API key check against the server's records (a fixed table here). The
/// customer, tier included, goes into the request extensions for the layers
/// and handlers after it.
async fn authenticate(mut req: Request, next: Next) -> Result<Response, StatusCode> {
    let customer = match req.headers().get("x-api-key").map(|k| k.as_bytes()) {
        Some(b"alice") => Customer {
            name: "alice",
            tier: "free",
        },
        Some(b"bob") => Customer {
            name: "bob",
            tier: "pro",
        },
        _ => return Err(StatusCode::UNAUTHORIZED),
    };
    req.extensions_mut().insert(customer);
    Ok(next.run(req).await)
}
