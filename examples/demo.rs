//! The first thing to run: `cargo run --example demo`.
//!
//! Starts an axum server with a rate limit on a free loopback port, fires a
//! burst of requests at it from an in-process client, prints what each one got,
//! waits out `Retry-After`, shows the next request admitted, and exits.
//!
//! Buckets live in memory, or in Redis when `REDIS_URL` is set:
//! `REDIS_URL=redis://127.0.0.1:6379 cargo run --example demo`. With Redis
//! unreachable the demo says so and carries on: the layer's in-process
//! fallback decides, with the same limit, and every answer says who decided.

use std::error::Error;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::{Extension, Router, routing::get};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tollgate::layer::RateLimitLayer;
use tollgate::{AnyStore, Decision, Fallback, MemoryStore, Policy, Quota, RedisStore};

/// 2 requests a second, bursts of 5.
const BURST: usize = 8;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    // Redis when REDIS_URL is set, memory otherwise: one type either way.
    let store: AnyStore = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            // Leases off: with them (the default), a check decided in this
            // process shows as remaining what this instance holds, not the
            // shared bucket this demo counts down.
            let store = RedisStore::builder().url(url).leases(false).build()?;
            // The start-up check names the server (never its password).
            match store.ping().await {
                Ok(rtt) => println!("store: RedisStore at {} (ping {rtt:?})", store.host()),
                Err(e) => println!(
                    "store: RedisStore, unreachable ({e});\n       \
                     the in-process fallback decides until it answers"
                ),
            }
            store.into()
        }
        _ => {
            println!("store: MemoryStore (set REDIS_URL=redis://127.0.0.1:6379 to use Redis)");
            MemoryStore::new().into()
        }
    };
    run(store).await
}

async fn run(store: AnyStore) -> Result<(), Box<dyn Error>> {
    // Keyed by the client's address, the default: a key the client cannot
    // change at will (an API key header would be: a new one per request, a new
    // full bucket every time).
    let policy = Policy::new("demo", [Quota::per_second(2)?.burst(5)?])?;
    // While Redis fails, an in-process store decides with the same quota
    // (rather than letting everything through, the default).
    let limit = RateLimitLayer::new(store, policy).fallback(Fallback::memory());
    let app = Router::new().route("/", get(hello)).layer(limit);
    // The peer address reaches the layer through axum's ConnectInfo.
    let app = app.into_make_service_with_connect_info::<SocketAddr>();

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    println!("server: http://{addr}, limit 2 requests/s per client address, bursts of 5\n");

    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let url = format!("http://{addr}/");
    let started = Instant::now();

    println!(
        "{:>3}  {:>7}  {:<22}  {:>9}  {:>11}",
        "#", "time", "status", "remaining", "retry-after"
    );
    let mut wait = None;
    for n in 1..=BURST {
        let reply = send(&client, &url).await?;
        print_row(n, started, &reply);
        if reply.status == StatusCode::TOO_MANY_REQUESTS && wait.is_none() {
            wait = reply.retry_after;
            println!("     {}", reply.ratelimit_lines());
        }
    }

    let secs = wait.ok_or("the burst was never limited")?;
    println!("\nwaiting {secs} s as Retry-After says...\n");
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let reply = send(&client, &url).await?;
    print_row(BURST + 1, started, &reply);
    println!("\nbody: {}", reply.body.trim_end());

    drop(client);
    let _ = stop.send(());
    match tokio::time::timeout(Duration::from_secs(5), server).await {
        Ok(joined) => joined??,
        Err(_) => return Err("server did not shut down within 5 s".into()),
    }
    if reply.status != StatusCode::OK {
        return Err(format!("expected 200 after waiting, got {}", reply.status).into());
    }
    println!("done: server stopped");
    Ok(())
}

/// Handlers can read the decision the layer made. It is absent when the layer
/// let the request through without one (the store failed and the layer fails
/// open), so take it as an `Option`: a store outage must not become a 500.
async fn hello(decision: Option<Extension<Decision>>) -> String {
    match decision {
        Some(Extension(d)) if d.is_fallback() => format!(
            "hello! tokens left: {} (decided by the in-process fallback)\n",
            d.remaining()
        ),
        Some(Extension(d)) => format!("hello! tokens left: {}\n", d.remaining()),
        None => "hello! (not limited: the rate limit store is unavailable)\n".to_owned(),
    }
}

struct Reply {
    status: StatusCode,
    remaining: Option<String>,
    retry_after: Option<u64>,
    policy: Option<String>,
    ratelimit: Option<String>,
    body: String,
}

impl Reply {
    fn ratelimit_lines(&self) -> String {
        format!(
            "RateLimit-Policy: {}\n     RateLimit: {}",
            self.policy.as_deref().unwrap_or("-"),
            self.ratelimit.as_deref().unwrap_or("-")
        )
    }
}

async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
) -> Result<Reply, Box<dyn Error>> {
    let req = Request::get(url).body(Full::new(Bytes::new()))?;
    let res = client.request(req).await?;
    let header = |name: &str| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let ratelimit = header("ratelimit");
    // `RateLimit: "demo";r=4;t=1`: r is what is left.
    let remaining = ratelimit
        .as_deref()
        .and_then(|v| v.split(";r=").nth(1))
        .and_then(|v| v.split(';').next())
        .map(str::to_owned);
    let retry_after = header("retry-after").and_then(|v| v.parse().ok());
    let policy = header("ratelimit-policy");
    let status = res.status();
    let body = res.into_body().collect().await?.to_bytes();
    Ok(Reply {
        status,
        remaining,
        retry_after,
        policy,
        ratelimit,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn print_row(n: usize, started: Instant, reply: &Reply) {
    println!(
        "{n:>3}  {:>6.2}s  {:<22}  {:>9}  {:>11}",
        started.elapsed().as_secs_f64(),
        reply.status.to_string(),
        reply.remaining.as_deref().unwrap_or("-"),
        reply
            .retry_after
            .map_or_else(|| "-".to_owned(), |s| format!("{s} s")),
    );
}
