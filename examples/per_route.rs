//! Different limits per route and per customer tier, then a scripted run.
//!
//! `cargo run --example per_route` starts the server on a free loopback port,
//! sends a few requests that show each policy at work, prints the answers and
//! exits. `cargo run --example per_route -- --serve` keeps serving on
//! 127.0.0.1:3000 until Ctrl-C instead.
//!
//! - `GET /search`: 2 a second per API key (expensive), its own `route_layer`.
//! - `POST /bulk`: costs one token per item in `x-items` (at most 20).
//! - everything else: the customer's tier picks the policy: `pro` 100 a minute,
//!   otherwise `free` 10 a minute. The tier comes from the server's own records
//!   (here a lookup by API key; in an application, from the auth layer), never
//!   from a header the client writes: each policy has its own buckets, so a
//!   client choosing its tier could pick the larger quota.
//! - `GET /health`: exempt.

use std::error::Error;

use axum::Router;
use axum::routing::{get, post};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::key::Header;
use tollgate::layer::{Choice, RateLimitLayer};
use tollgate::{MemoryStore, Policy, Quota};

/// One scripted request: method, path, headers.
type Step = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let store = MemoryStore::new();
    let free = Policy::new("free", [Quota::per_minute(10)?])?;
    let pro = Policy::new("pro", [Quota::per_minute(100)?])?;
    let bulk = Policy::new("bulk", [Quota::per_minute(20)?])?;

    let by_tier = RateLimitLayer::new(store.clone(), free.clone())
        .key(Header::new("x-api-key"))
        .policy(move |parts| match (parts.uri.path(), tier_of(parts)) {
            ("/health", _) => Choice::Exempt,
            ("/bulk", _) => bulk.clone().into(),
            (_, "pro") => pro.clone().into(),
            _ => Choice::Default,
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
    let search = RateLimitLayer::new(store, Policy::new("search", [Quota::per_second(2)?])?)
        .key(Header::new("x-api-key"));

    let app = Router::new()
        .route("/search", get(|| async { "results\n" }))
        .route_layer(search)
        .route("/", get(|| async { "home\n" }))
        .route("/bulk", post(|| async { "imported\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(by_tier);

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

/// The customer's tier from the server's own records. A real application would
/// read what its auth layer stored in the request extensions.
fn tier_of(parts: &http::request::Parts) -> &'static str {
    match parts.headers.get("x-api-key").map(|k| k.as_bytes()) {
        Some(b"bob") => "pro",
        _ => "free",
    }
}
