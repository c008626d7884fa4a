//! A login endpoint limited by failed attempts only: `cargo run --example login_guard`.
//!
//! `POST /login/{account}` with the password as the body answers 200 or 401.
//! Two layers settle each request's cost by its response, so successful
//! logins are free:
//!
//! - **per account**: 5 wrong passwords per 15 minutes, whoever sends them,
//!   then the account is locked out for 15 minutes (`Quota::lockout`);
//! - **per client address**: 20 wrong passwords per 15 minutes, whichever
//!   accounts they are for (a client trying one password on many accounts).
//!
//! Both count only 401 answers: a request is charged when it arrives, as
//! always, and refunded once its answer is anything else. Charging first is
//! what bounds a flood: of 20 wrong passwords sent at once, at most 5 reach
//! the password check before the rest are refused, however long it takes.
//!
//! The example serves on a free loopback port, runs a short session against
//! itself, prints what happened and exits (non-zero if the limits did not
//! hold). Buckets live in memory, or in Redis when `REDIS_URL` is set; with
//! Redis unreachable the in-process fallback decides.

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use axum::{Router, extract::Path, http::StatusCode, routing::post};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tollgate::layer::RateLimitLayer;
use tollgate::{AnyStore, Fallback, MemoryStore, Policy, Quota, RedisStore, key};

const PASSWORD: &str = "correct horse battery staple";

type HttpClient = Client<HttpConnector, Full<Bytes>>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let store: AnyStore = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            let store = RedisStore::from_url(&url)?;
            if let Err(e) = store.ping().await {
                println!("store: RedisStore, unreachable ({e}); the fallback decides");
            } else {
                println!("store: RedisStore at {}", store.host());
            }
            store.into()
        }
        _ => {
            println!("store: MemoryStore");
            MemoryStore::new().into()
        }
    };
    let fifteen_minutes = Duration::from_secs(15 * 60);
    // The account named in the path; the layer hashes what it does not
    // accept as a key, so a hostile name costs nothing.
    let account = key::from_fn("account", |parts| {
        let name = parts.uri.path().strip_prefix("/login/")?;
        (!name.is_empty()).then(|| name.to_owned())
    });
    let per_account = RateLimitLayer::new(
        store.clone(),
        Policy::new(
            "login-account",
            [Quota::new(5, fifteen_minutes)?.lockout(fifteen_minutes)?],
        )?,
    )
    .key(account)
    .count_only_statuses([401])?
    .fallback(Fallback::memory());
    // Keyed by the peer address, the default (behind a proxy, use
    // key::ClientIp with the proxy's networks).
    let per_address = RateLimitLayer::new(
        store,
        Policy::new("login-address", [Quota::new(20, fifteen_minutes)?])?,
    )
    .count_only_statuses([401])?
    .fallback(Fallback::memory());

    let app = Router::new()
        .route("/login/{account}", post(login))
        .layer(per_account)
        .layer(per_address)
        .into_make_service_with_connect_info::<SocketAddr>();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();

    // Successful logins cost nothing: more than 5 in a row pass.
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(login_as(&client, &base, "bob", PASSWORD).await?.0);
    }
    println!("bob, 8 correct passwords:        {}", summary(&statuses));
    expect(
        statuses.iter().all(|s| *s == 200),
        "bob's logins were refused",
    )?;

    // 20 wrong passwords at once: 5 reach the check, the rest are refused.
    let attempts: Vec<_> = (0..20)
        .map(|i| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(
                async move { login_as(&client, &base, "alice", &format!("guess {i}")).await },
            )
        })
        .collect();
    let mut statuses = Vec::new();
    for attempt in attempts {
        statuses.push(attempt.await??.0);
    }
    println!("alice, 20 wrong passwords at once: {}", summary(&statuses));
    let wrong = statuses.iter().filter(|s| **s == 401).count();
    expect(wrong <= 5, "more than 5 wrong passwords reached the check")?;
    expect(
        statuses.iter().all(|s| *s == 401 || *s == 429),
        "an attempt got neither 401 nor 429",
    )?;

    // The account is locked now, even for the right password.
    let (status, retry) = login_as(&client, &base, "alice", PASSWORD).await?;
    println!(
        "alice, correct password:         {status} (Retry-After: {} s)",
        retry.as_deref().unwrap_or("-")
    );
    expect(status == 429, "alice's account was not locked")?;
    // Locked out for 15 minutes from the refusal that locked it (not the 3
    // minutes a token takes to refill).
    let retry: u64 = retry.as_deref().unwrap_or("0").parse()?;
    expect(
        retry > 890,
        "alice's account was not locked out for 15 minutes",
    )?;

    // One address trying many accounts: its 20 failures run out.
    let mut failures = wrong;
    let mut refused_by_address = None;
    for account in ["carol", "dave", "erin", "frank", "grace"] {
        for _ in 0..5 {
            let (status, _) = login_as(&client, &base, account, "guess").await?;
            if status == 401 {
                failures += 1;
            } else if status == 429 && refused_by_address.is_none() {
                refused_by_address = Some((account, failures));
            }
        }
    }
    let (account, after) = refused_by_address.ok_or("the address was never limited")?;
    println!("this address, other accounts:     refused from {account} on, after {after} failures");
    // Exactly 20 where settlements are made at once (memory, the fallback);
    // on Redis a refund still in flight may make it a little earlier, never
    // later.
    expect(
        after <= 20,
        "the address was limited after more than 20 failures",
    )?;

    server.abort();
    println!("done: only failed logins counted");
    Ok(())
}

/// Checks the password (in a real service: a slow hash against the stored
/// one, which the limits protect).
async fn login(Path(_account): Path<String>, password: String) -> StatusCode {
    tokio::time::sleep(Duration::from_millis(20)).await;
    if password == PASSWORD {
        StatusCode::OK
    } else {
        StatusCode::UNAUTHORIZED
    }
}

/// The status and `Retry-After` of one login.
async fn login_as(
    client: &HttpClient,
    base: &str,
    account: &str,
    password: &str,
) -> Result<(u16, Option<String>), Box<dyn Error + Send + Sync>> {
    let req = Request::post(format!("{base}/login/{account}"))
        .body(Full::new(Bytes::from(password.to_owned())))?;
    let res = client.request(req).await?;
    let retry = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let status = res.status().as_u16();
    res.into_body().collect().await?;
    Ok((status, retry))
}

fn summary(statuses: &[u16]) -> String {
    let mut counts: Vec<(u16, usize)> = Vec::new();
    for s in statuses {
        match counts.iter_mut().find(|(c, _)| c == s) {
            Some((_, n)) => *n += 1,
            None => counts.push((*s, 1)),
        }
    }
    counts.sort();
    let parts: Vec<String> = counts.iter().map(|(s, n)| format!("{n} x {s}")).collect();
    parts.join(", ")
}

fn expect(ok: bool, what: &str) -> Result<(), Box<dyn Error + Send + Sync>> {
    if ok { Ok(()) } else { Err(what.into()) }
}
