//! Limits from a configuration file, reloaded while serving, then a scripted
//! run: `cargo run --example config --features serde`.
//!
//! Reads `examples/limits.toml` (or the file given as the first argument)
//! into a `PolicyTable`, builds the layer from it and serves an axum app on a
//! free loopback port. A scripted client shows each entry at work, then the
//! example "reloads" the file with a changed login quota: the table is
//! swapped while the server runs, without rebuilding the router. Last, it
//! reads two broken files to show that mistakes are refused at start-up,
//! naming the entry and the value. It exits when done.
//!
//! Buckets live in memory here; `RedisStore::from_url(..)` shares them
//! between instances (see the `demo` example).

use std::error::Error;
use std::net::SocketAddr;
use std::path::PathBuf;

use axum::Router;
use axum::routing::{get, post};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tollgate::layer::{PolicyTable, RateLimitLayer};
use tollgate::{MemoryStore, Policy, Quota};

/// What the application reads from its configuration file: here only the
/// limits, which could sit next to any other settings.
#[derive(serde::Deserialize)]
struct Settings {
    policy: PolicyTable,
}

fn read(text: &str) -> Result<PolicyTable, toml::de::Error> {
    toml::from_str::<Settings>(text).map(|s| s.policy)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let path = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/limits.toml"))
        });
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    // A mistake stops the server from starting, with a message that names
    // the entry, the value, and where it is in the file.
    let table = read(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("limits from {}: {table:?}", path.display());

    // The layer's own policy covers requests no entry applies to; this file
    // ends with an entry for every request, so here it never does.
    let fallback = Policy::new("unlisted", [Quota::per_second(5)?])?;
    let layer = RateLimitLayer::new(MemoryStore::new(), fallback).policy_table(table.clone());
    let app = Router::new()
        .route("/", get(|| async { "home\n" }))
        .route("/login", post(|| async { "welcome\n" }))
        .route("/items/{id}", get(|| async { "item\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(layer)
        // The peer address is the default key: axum's ConnectInfo.
        .into_make_service_with_connect_info::<SocketAddr>();
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

    println!("\n-- as configured");
    for (method, path) in [
        ("GET", "/health"),
        ("GET", "/health"),
        ("POST", "/login"),
        ("POST", "/login"),
        ("POST", "/login"),
        ("POST", "/login"),
        ("GET", "/items/1"),
        ("GET", "/items/2"),
        ("GET", "/"),
    ] {
        send(&client, &base, method, path).await?;
    }

    // A reload: the same file with logins at 6 a minute. The changed quota
    // carries each bucket over by the share spent; the others keep theirs.
    let reloaded = read(&text.replace("\"3/min\"", "\"6/min\""))?;
    table.swap(reloaded);
    println!(
        "\n-- reloaded: login is 6/min now (the bucket carried over: 3 of 3 spent is 6 of 6 spent, no free burst)"
    );
    for _ in 0..3 {
        send(&client, &base, "POST", "/login").await?;
    }

    println!("\n-- files that are refused at start-up");
    for broken in [
        "[[policy]]\nname = \"login\"\nquotas = [\"0/min\"]\nroutes = [\"POST /login\"]\n",
        "[[policy]]\nname = \"edge\"\nquotas = [\"10/s\"]\nkey = { kind = \"client_ip\", header = \"x-real-ip\" }\n",
        "[[policy]]\nname = \"api\"\nquotas = [\"10/s\"]\n\n[[policy]]\nname = \"login\"\nquotas = [\"3/min\"]\nroutes = [\"POST /login\"]\n",
    ] {
        match read(broken) {
            Ok(_) => println!("accepted?!\n{broken}"),
            Err(e) => println!("{}\n", e.to_string().trim_end()),
        }
    }

    drop(client);
    let _ = stop.send(());
    server.await??;
    println!("done: server stopped");
    Ok(())
}

async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    base: &str,
    method: &str,
    path: &str,
) -> Result<(), Box<dyn Error>> {
    let req = Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .body(Full::new(Bytes::new()))?;
    let res = client.request(req).await?;
    let status = res.status();
    let policy = res
        .headers()
        .get("ratelimit-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let body = res.into_body().collect().await?.to_bytes();
    println!(
        "{method:<4} {path:<9} -> {status}  RateLimit-Policy: {policy}  {}",
        String::from_utf8_lossy(&body).trim_end()
    );
    Ok(())
}
