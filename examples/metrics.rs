//! The limiter's metrics in the Prometheus text format at `/metrics`.
//!
//! `cargo run --example metrics --features metrics` starts an axum server on a
//! free loopback port with a rate limit (and a Prometheus recorder for the
//! `metrics` facade), sends a burst that gets limited, then reads `/metrics` and
//! prints the `tollgate_*` lines, and exits. Add `-- --serve` to serve on
//! 127.0.0.1:3000 until Ctrl-C instead (`curl http://127.0.0.1:3000/metrics`).
//!
//! Buckets live in memory, or in Redis when `REDIS_URL` is set; then the store
//! metrics (call latency, errors by kind, circuit breaker state) show too. With
//! Redis unreachable, the in-process fallback decides and the metrics say so.

use std::error::Error;
use std::net::SocketAddr;

use axum::{Router, routing::get};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::PrometheusBuilder;
use tollgate::key::Header;
use tollgate::layer::RateLimitLayer;
use tollgate::{AnyStore, Fallback, MemoryStore, Policy, Quota, RedisStore};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    // Every metric the crate records goes to this recorder from now on.
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    let store: AnyStore = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            let store = RedisStore::from_url(&url)?;
            if let Err(e) = store.ping().await {
                eprintln!("warning: {e}; the in-process fallback decides");
            }
            store.into()
        }
        _ => MemoryStore::new().into(),
    };
    let limit = RateLimitLayer::new(store, Policy::new("api", [Quota::per_minute(3)?])?)
        .key(Header::new("x-api-key")?)
        .fallback(Fallback::memory());
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(limit)
        // Added after the limit: the scraper is not limited.
        .route(
            "/metrics",
            get(move || {
                let prometheus = prometheus.clone();
                async move { prometheus.render() }
            }),
        );

    let serve = std::env::args().any(|a| a == "--serve");
    let bind: SocketAddr = if serve {
        ([127, 0, 0, 1], 3000).into()
    } else {
        ([127, 0, 0, 1], 0).into()
    };
    let listener = tokio::net::TcpListener::bind(bind).await?;
    let addr = listener.local_addr()?;
    if serve {
        println!("listening on http://{addr}; metrics at http://{addr}/metrics; Ctrl-C stops");
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        return Ok(());
    }
    tokio::spawn(async move { axum::serve(listener, app).await });

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for _ in 0..5 {
        let req = Request::get(format!("http://{addr}/"))
            .header("x-api-key", "k-1")
            .body(Full::new(Bytes::new()))?;
        let status = client.request(req).await?.status();
        println!("GET / -> {status}");
    }
    let req = Request::get(format!("http://{addr}/metrics")).body(Full::new(Bytes::new()))?;
    let body = client
        .request(req)
        .await?
        .into_body()
        .collect()
        .await?
        .to_bytes();
    println!("\nGET /metrics (the tollgate lines):");
    for line in String::from_utf8_lossy(&body).lines() {
        if line.starts_with("tollgate_") {
            println!("  {line}");
        }
    }
    Ok(())
}
