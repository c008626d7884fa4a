//! The limiter's metrics in the Prometheus text format at `/metrics`.
//!
//! `cargo run --example metrics --features metrics` starts an axum server on a
//! free loopback port with two rate limits (and a Prometheus recorder for the
//! `metrics` facade), sends requests until both limits answer 429, then reads
//! `/metrics`, prints the `tollgate_*` lines, and exits. Add `-- --serve` to
//! serve on 127.0.0.1:3000 until Ctrl-C instead
//! (`curl -H 'x-api-key: k-acme' http://127.0.0.1:3000/`, then
//! `curl http://127.0.0.1:3000/metrics`).
//!
//! The limits are keyed as the README's "Keys" paragraph says:
//!
//! - **per client address**, outermost, on every request (`PeerIp`, the
//!   default key): a client can send a new API key with every request, but
//!   not from a new address;
//! - **per API client**, only for API keys the server knows: an unknown key
//!   makes no bucket (the key extractor answers no key, and the request is
//!   left to the address limit), so random keys neither escape a limit nor
//!   fill the store.
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
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::PrometheusBuilder;
use tollgate::key::from_fn;
use tollgate::layer::{MissingKey, RateLimitLayer};
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
    // While the store fails, both limits keep holding in this process.
    let fallback = Fallback::memory();
    // Every request, per client address (the default key).
    let per_ip = RateLimitLayer::new(
        store.clone(),
        Policy::new("per-ip", [Quota::per_minute(8)?])?,
    )
    .fallback(fallback.clone());
    // Known API clients only: the client an API key belongs to (a database
    // in real life). An unknown API key gives no key, and this layer lets
    // the request through: the per-address limit alone holds it.
    let client = from_fn("client", |parts| {
        match parts.headers.get("x-api-key")?.as_bytes() {
            b"k-acme" => Some("acme".to_owned()),
            b"k-globex" => Some("globex".to_owned()),
            _ => None,
        }
    });
    let per_client =
        RateLimitLayer::new(store, Policy::new("per-client", [Quota::per_minute(3)?])?)
            .key(client)
            .on_missing_key(MissingKey::allow())
            .fallback(fallback);
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        // The last layer added is the outermost: per_ip sees every request.
        .layer(per_client)
        .layer(per_ip)
        // Added after the limits: the scraper is not limited.
        .route(
            "/metrics",
            get(move || {
                let prometheus = prometheus.clone();
                async move { prometheus.render() }
            }),
        )
        // PeerIp reads the peer address from axum's ConnectInfo.
        .into_make_service_with_connect_info::<SocketAddr>();

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
    // A known client: its own limit (3 a minute) answers the 4th and 5th.
    for _ in 0..5 {
        let status = get_root(&client, addr, "k-acme").await?;
        println!("GET / with a known API key -> {status}");
    }
    // A new API key each time, as a client escaping its limit would send:
    // no bucket of its own; the address limit (8 a minute, 5 spent above)
    // answers the 4th and later.
    for i in 0..5 {
        let status = get_root(&client, addr, &format!("random-{i}")).await?;
        println!("GET / with a new unknown API key -> {status}");
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

/// `GET /` with `api_key` in `x-api-key`: the status of the answer.
async fn get_root(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    api_key: &str,
) -> Result<http::StatusCode, Box<dyn Error>> {
    let req = Request::get(format!("http://{addr}/"))
        .header("x-api-key", api_key)
        .body(Full::new(Bytes::new()))?;
    Ok(client.request(req).await?.status())
}
