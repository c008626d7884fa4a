//! Your own key: customers by API key, everyone else by client IP.
//!
//! `cargo run --example custom_key --features axum` starts the server on a free
//! loopback port, runs a short script of requests, prints what each got and
//! exits. Add `-- --serve` to serve on 127.0.0.1:3000 until Ctrl-C instead. The
//! `axum` feature lets the IP extractors read axum's `ConnectInfo`.
//!
//! - `CustomerKey` is a [`KeyExtractor`] of our own: it looks the `x-api-key`
//!   header up in a table of known keys (a database in real life, hence async)
//!   and keys the request by the customer, so a customer's keys share a bucket.
//!   Unknown or absent keys give no key...
//! - ...and then the layer falls back to the client IP ([`ClientIp`]), as the
//!   reverse proxy in front of us reported it. Here the "proxy" is this machine
//!   (127.0.0.1 is trusted); in production list your load balancers' networks.
//!   Fallback keys have their own kind (`client-ip`), so a customer id can never
//!   collide with an address.

use std::collections::HashMap;
use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::{Extension, Router, routing::get};
use bytes::Bytes;
use http::Request;
use http::request::Parts;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::key::{ClientIp, KeyExtractor, Kind};
use tollgate::layer::{MissingKey, RateLimitLayer};
use tollgate::{Decision, MemoryStore, Quota};

/// Keys a request by the customer owning its API key.
struct CustomerKey {
    customers: Arc<HashMap<&'static str, &'static str>>,
}

impl KeyExtractor for CustomerKey {
    fn kind(&self) -> Kind {
        Kind::custom("customer")
    }

    async fn extract(&self, parts: &Parts) -> Option<String> {
        let api_key = parts.headers.get("x-api-key")?.to_str().ok()?;
        // A real lookup would await a database or cache here.
        self.customers.get(api_key).map(|c| (*c).to_owned())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let customers = Arc::new(HashMap::from([
        ("k-acme-1", "acme"),
        ("k-acme-2", "acme"),
        ("k-globex", "globex"),
    ]));
    let limit = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(3)?)
        .key(CustomerKey { customers })
        .on_missing_key(MissingKey::fallback(ClientIp::trusted_proxies([
            "127.0.0.1/32",
        ])?));
    let app = Router::new()
        .route(
            "/",
            // Option: a request the layer let through without a decision (store
            // down, failing open) must not become a 500.
            get(|d: Option<Extension<Decision>>| async move {
                match d {
                    Some(Extension(d)) => format!("ok, {} left", d.remaining()),
                    None => "ok, not limited".to_owned(),
                }
            }),
        )
        .layer(limit);
    // ClientIp needs the peer address: serve with connect info.
    let service = app.into_make_service_with_connect_info::<SocketAddr>();

    if std::env::args().any(|a| a == "--serve") {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
        println!("listening on http://127.0.0.1:3000; Ctrl-C stops");
        axum::serve(listener, service)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        return Ok(());
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}/", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, service)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let script: &[&[(&str, &str)]] = &[
        &[("x-api-key", "k-acme-1")],
        &[("x-api-key", "k-acme-2")],
        &[("x-api-key", "k-acme-1")],
        &[("x-api-key", "k-acme-2")], // acme's 4th request: both keys share one bucket
        &[("x-api-key", "k-globex")], // another customer, another bucket
        &[("x-forwarded-for", "203.0.113.7")], // no key: the client IP decides
        &[
            ("x-api-key", "k-unknown"),
            ("x-forwarded-for", "203.0.113.7"),
        ],
        &[("x-forwarded-for", "6.6.6.6, 203.0.113.7")], // forged prefix ignored
        &[("x-forwarded-for", "203.0.113.7")],
        &[("x-forwarded-for", "198.51.100.9")],
    ];
    for headers in script {
        let mut req = Request::get(&base);
        for (name, value) in *headers {
            req = req.header(*name, *value);
        }
        let res = client.request(req.body(Full::new(Bytes::new()))?).await?;
        let status = res.status();
        let body = res.into_body().collect().await?.to_bytes();
        let shown: Vec<String> = headers.iter().map(|(n, v)| format!("{n}: {v}")).collect();
        println!(
            "{:<52} -> {status}  {}",
            shown.join(", "),
            String::from_utf8_lossy(&body).lines().next().unwrap_or("")
        );
    }
    drop(client);
    let _ = stop.send(());
    server.await??;
    Ok(())
}
