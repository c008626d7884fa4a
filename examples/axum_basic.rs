//! Limits on an axum app, served until Ctrl-C: `cargo run --example axum_basic`,
//! then for example `curl -i -H 'x-api-key: k-acme' http://127.0.0.1:3000/`.
//!
//! Two layers, as a public API needs them:
//!
//! - **per client address**, outermost, for every request: 20 a second, bursts
//!   of 40. Unauthenticated requests (and the API key checks they cause) are
//!   limited by it, and a bucket costs an attacker an address;
//! - **per API client**, inside the auth layer, keyed on the client the auth
//!   layer verified (never on the raw header: a client sending a random API key
//!   per request would get a fresh bucket each time): 5 a second, bursts of 10,
//!   and 1000 an hour, decided together.
//!
//! Set `PORT` to listen elsewhere and `REDIS_URL` to keep buckets in Redis
//! (shared by every instance) instead of memory. While Redis is down, both
//! limits keep holding in this process (the in-process fallback).

use std::error::Error;
use std::net::SocketAddr;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::{Extension, Router, routing::get};
use tollgate::key::{self, PeerIp};
use tollgate::layer::RateLimitLayer;
use tollgate::{AnyStore, Decision, Fallback, MemoryStore, Policy, Quota, RedisStore};

/// A caller whose API key the auth layer verified.
#[derive(Clone)]
struct ApiClient {
    name: &'static str,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let (store, label): (AnyStore, _) = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            let store = RedisStore::from_url(&url)?;
            // Start anyway when Redis is down, but say so: the fallback decides.
            if let Err(e) = store.ping().await {
                eprintln!("warning: {e}; the in-process fallback decides until Redis answers");
            }
            (store.into(), "Redis")
        }
        _ => (MemoryStore::new().into(), "memory"),
    };
    serve(store, label).await
}

async fn serve(store: AnyStore, label: &str) -> Result<(), Box<dyn Error>> {
    // Redis down: keep limiting in this process, each quota divided by the
    // number of instances (here one). The default would be
    // OnStoreError::Allow: keep serving, unlimited.
    let fallback = Fallback::memory().share(std::num::NonZeroU32::MIN);
    // Every request, by the peer address (behind a load balancer use
    // ClientIp::trusted_proxies with its networks).
    let per_ip = RateLimitLayer::new(
        store.clone(),
        Policy::new("per-ip", [Quota::per_second(20)?.burst(40)?])?,
    )
    .key(PeerIp::new())
    .fallback(fallback.clone());
    // Verified callers, by who they are; both quotas decided together.
    let per_client = RateLimitLayer::new(
        store,
        Policy::new(
            "per-client",
            [Quota::per_second(5)?.burst(10)?, Quota::per_hour(1000)?],
        )?,
    )
    .key(key::FromExtension::new("client", |c: &ApiClient| {
        c.name.to_owned()
    }))
    .fallback(fallback);

    // The last layer added runs first.
    let app = Router::new()
        .route("/", get(hello))
        .layer(per_client)
        .layer(middleware::from_fn(authenticate))
        .layer(per_ip)
        // Added after the limits: neither limited nor authenticated.
        .route("/health", get(|| async { "ok\n" }));

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!(
        "listening on http://{} (buckets in {label}); Ctrl-C stops\n\
         try: curl -i -H 'x-api-key: k-acme' http://{}/",
        listener.local_addr()?,
        listener.local_addr()?
    );
    // The peer address reaches PeerIp through axum's ConnectInfo.
    let service = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, service)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// The API key check: a fixed table here, a database or cache in real life.
/// Unknown keys are refused before they reach the per-client limit, so they
/// never make a bucket of their own.
async fn authenticate(mut req: Request, next: Next) -> Result<Response, StatusCode> {
    let name = match req.headers().get("x-api-key").map(|k| k.as_bytes()) {
        Some(b"k-acme") => "acme",
        Some(b"k-globex") => "globex",
        _ => return Err(StatusCode::UNAUTHORIZED),
    };
    req.extensions_mut().insert(ApiClient { name });
    Ok(next.run(req).await)
}

/// The decision is absent when the layer let the request through without one
/// (store down, failing open): take it as an `Option`, or a Redis outage becomes
/// a 500 "Missing request extension" here. It is the innermost layer's, the
/// per-client one.
async fn hello(decision: Option<Extension<Decision>>) -> String {
    match decision {
        Some(Extension(decision)) => format!("hello! {} requests left\n", decision.remaining()),
        None => "hello! (not limited right now)\n".to_owned(),
    }
}
