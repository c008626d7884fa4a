//! Two instances of one API behind a proxy, sharing one limit per client.
//!
//! `cargo run --example instances` starts two axum servers (the instances) on
//! free loopback ports, both with the README's production set-up: a limit per
//! client address read from `X-Forwarded-For`, believed only from the proxy
//! (here this machine, 127.0.0.1; in production your load balancers'
//! networks), and an in-process fallback while the store fails. A client
//! then sends requests for two client addresses, alternating between the
//! instances as a load balancer would, and the shared count goes down across
//! both. It exits by itself.
//!
//! The store is Redis when `REDIS_URL` is set (`REDIS_URL=redis://127.0.0.1:6379
//! cargo run --example instances`): each instance gets its own `RedisStore`,
//! as separate processes would. Without it, one `MemoryStore` shared by both
//! servers of this process stands in for Redis.

use std::error::Error;
use std::net::SocketAddr;

use axum::{Router, routing::get};
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tollgate::key::ClientIp;
use tollgate::{AnyStore, Fallback, MemoryStore, Policy, RateLimitLayer, RedisStore, quota};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let url = std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty());
    let shared = MemoryStore::new();
    let mut instances = Vec::new();
    for _ in 0..2 {
        let store: AnyStore = match &url {
            Some(url) => RedisStore::from_url(url)?.into(),
            None => shared.clone().into(),
        };
        instances.push(start(store).await?);
    }
    match &url {
        Some(_) => println!("store: one RedisStore per instance, one Redis"),
        None => println!("store: one MemoryStore shared by both (set REDIS_URL for Redis)"),
    }
    println!(
        "instances: http://{} and http://{}\n",
        instances[0], instances[1]
    );

    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    // The proxy adds the client's address to X-Forwarded-For; a client that
    // forges its own entry only adds one further left, which is not read.
    for n in 0..8 {
        let instance = instances[n % 2];
        let client_ip = if n < 6 {
            "203.0.113.7"
        } else {
            "198.51.100.20"
        };
        let request = Request::get(format!("http://{instance}/"))
            .header("x-forwarded-for", format!("10.9.9.9, {client_ip}"))
            .body(Full::default())?;
        let response = client.request(request).await?;
        let remaining = response
            .headers()
            .get("ratelimit")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        println!(
            "client {client_ip:<14} via instance {}: {}  ratelimit: {remaining}",
            n % 2 + 1,
            response.status()
        );
    }
    println!("\ndone: both instances counted against one bucket per client");
    Ok(())
}

/// One instance: the README's per-address limit, 5 a minute so the example
/// runs into it, on a free loopback port.
async fn start(store: AnyStore) -> Result<SocketAddr, Box<dyn Error>> {
    let per_ip = RateLimitLayer::new(store, Policy::new("ip", [quota!(5 per minute)])?)
        .key(ClientIp::trusted_proxies(["127.0.0.1/32"])?)
        .fallback(Fallback::memory());
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(per_ip)
        .into_make_service_with_connect_info::<SocketAddr>();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}
