//! A per-API-key limit on an axum app, served until Ctrl-C:
//! `cargo run --example axum_basic`, then for example
//! `curl -i -H 'x-api-key: k-1' http://127.0.0.1:3000/`.
//!
//! Set `PORT` to listen elsewhere and `REDIS_URL` to keep buckets in Redis
//! (shared by every instance) instead of memory.

use std::error::Error;

use axum::{Extension, Router, routing::get};
use tollgate::key::Header;
use tollgate::layer::{MissingKey, OnStoreError, RateLimitLayer};
use tollgate::{AnyStore, Decision, Fallback, MemoryStore, Policy, Quota, RedisStore};

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
    // 5 requests a second per API key, bursts of 10, and 1000 an hour: both
    // quotas are decided together, all or nothing.
    let api = Policy::new(
        "api",
        [Quota::per_second(5)?.burst(10)?, Quota::per_hour(1000)?],
    )?;
    let limit = RateLimitLayer::new(store, api)
        .key(Header::new("x-api-key"))
        // No API key: 400 with a short explanation (the default, spelled out).
        .on_missing_key(MissingKey::reject())
        // Redis down: keep limiting in this process, with the same quotas
        // divided by the number of instances (here one). The default would
        // be OnStoreError::Allow: keep serving, unlimited.
        .on_store_error(OnStoreError::Fallback(Fallback::memory().share(1)?));

    let app = Router::new()
        .route("/", get(hello))
        .layer(limit)
        // Added after the limit: not limited.
        .route("/health", get(|| async { "ok\n" }));

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!(
        "listening on http://{} (buckets in {label}); Ctrl-C stops\n\
         try: curl -i -H 'x-api-key: k-1' http://{}/",
        listener.local_addr()?,
        listener.local_addr()?
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// The decision is absent when the layer let the request through without one
/// (store down, failing open): take it as an `Option`, or a Redis outage becomes
/// a 500 "Missing request extension" here.
async fn hello(decision: Option<Extension<Decision>>) -> String {
    match decision {
        Some(Extension(decision)) => format!("hello! {} requests left\n", decision.remaining()),
        None => "hello! (not limited right now)\n".to_owned(),
    }
}
