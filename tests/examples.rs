//! Every example keeps answering its normal statuses with Redis dead: no 5xx,
//! no "Missing request extension", because the examples' handlers take the
//! decision as an `Option` and the Redis ones decide with the fallback.
//!
//! `cargo test` builds the examples; these tests run the built binaries with
//! `REDIS_URL` pointing at a port where nothing listens.
#![cfg(all(feature = "redis", feature = "axum", feature = "tonic"))]

mod support;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::http::Client;

/// The built example `name`, next to this test's own binary.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> -> target/<profile>/examples/<name>
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target directory")
        .join("examples");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run the suite with `cargo test --all-features`, which builds the examples",
        path.display()
    );
    path
}

/// A URL where no Redis answers (its password must never be printed).
fn dead_redis() -> String {
    format!("redis://:do-not-print@127.0.0.1:{}", support::free_port())
}

/// Runs an example that exits by itself, and returns its output.
fn run(name: &str, env: &[(&str, &str)]) -> String {
    let mut child = Command::new(example(name))
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the example");
    let status = wait(&mut child, Duration::from_secs(60));
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(status.success(), "{name} failed:\n{out}");
    assert!(
        !out.contains("do-not-print"),
        "{name} printed a password:\n{out}"
    );
    for line in out.lines() {
        assert!(
            !line.contains(" 500 ") && !line.contains("Missing request extension"),
            "{name}: {line}\n{out}"
        );
    }
    out
}

fn wait(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("example still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_demo_runs_its_session_on_the_fallback_with_redis_dead() {
    let out = run("demo", &[("REDIS_URL", &dead_redis())]);
    assert!(out.contains("unreachable"), "{out}");
    assert!(out.contains("429 Too Many Requests"), "{out}");
    assert!(out.contains("decided by the in-process fallback"), "{out}");
    assert!(out.contains("done: server stopped"), "{out}");
    // Without tracing or metrics, the outage is on stderr: the first failed
    // call's line comes with the first request (the demo's burst starts
    // well within a second).
    #[cfg(not(any(feature = "tracing", feature = "metrics")))]
    assert!(
        out.contains("tollgate: rate limit store (redis) error:"),
        "{out}"
    );
    assert!(!out.contains("do-not-print"), "{out}");
}

/// Two instances behind one proxy address count one bucket per client
/// address, in memory and on a live Redis.
#[test]
fn two_instances_share_one_limit_per_client() {
    let redis = support::RedisServer::start();
    for url in [String::new(), redis.url()] {
        let out = run("instances", &[("REDIS_URL", &url)]);
        let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("client ")).collect();
        assert_eq!(rows.len(), 8, "{out}");
        // 5 a minute per address, across both instances: the sixth is refused.
        assert!(rows[..5].iter().all(|r| r.contains("200 OK")), "{out}");
        assert!(rows[5].contains("429"), "{out}");
        assert!(
            rows[6].contains("200 OK") && rows[6].contains("r=4"),
            "{out}"
        );
    }
}

/// The login guard's session, which checks its own figures and fails
/// otherwise: in memory, on a live Redis, and on the fallback with Redis
/// dead.
#[test]
fn the_login_guard_counts_only_failed_logins_wherever_its_buckets_live() {
    let redis = support::RedisServer::start();
    for (store, url) in [
        ("MemoryStore", String::new()),
        ("RedisStore at", redis.url()),
        ("unreachable", dead_redis()),
    ] {
        let out = run("login_guard", &[("REDIS_URL", &url)]);
        assert!(out.contains(store), "{out}");
        assert!(out.contains("8 x 200"), "{out}");
        assert!(out.contains("5 x 401, 15 x 429"), "{out}");
        assert!(out.contains("done: only failed logins counted"), "{out}");
    }
}

#[test]
fn the_examples_that_exit_by_themselves_answer_without_5xx() {
    let url = dead_redis();
    for name in ["per_route", "custom_key", "grpc"] {
        let out = run(name, &[("REDIS_URL", &url)]);
        assert!(
            out.contains("200 OK") || out.contains("Serving"),
            "{name}:\n{out}"
        );
    }
}

#[cfg(feature = "serde")]
#[test]
fn the_config_example_reads_reloads_and_refuses_broken_files() {
    let out = run("config", &[]);
    assert!(
        out.contains("[\"health\", \"login\", \"items\", \"api\"]"),
        "{out}"
    );
    // The fourth login in a minute is over the file's 3/min; health is exempt.
    let logins: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("POST /login"))
        .collect();
    assert_eq!(logins.len(), 7, "{out}");
    assert!(logins[..3].iter().all(|l| l.contains("200 OK")), "{out}");
    assert!(logins[3].contains("429"), "{out}");
    assert!(
        out.contains("GET  /health   -> 200 OK  RateLimit-Policy: -"),
        "{out}"
    );
    // After the reload: 6 a minute, the spent bucket carried over (no
    // free burst).
    assert!(
        logins[4..]
            .iter()
            .all(|l| l.contains("429") && l.contains("q=6;w=60")),
        "{out}"
    );
    // Broken files are refused, naming the entry and the value.
    assert!(
        out.contains("invalid quota: policy \"login\": \"0/min\""),
        "{out}"
    );
    assert!(out.contains("policy \"edge\": a client_ip key"), "{out}");
    assert!(
        out.contains("policy \"login\" (entry 2) can never apply"),
        "{out}"
    );
    assert!(out.contains("done: server stopped"), "{out}");
}

#[cfg(feature = "metrics")]
#[test]
fn the_metrics_example_shows_the_fallback_deciding_with_redis_dead() {
    let out = run("metrics", &[("REDIS_URL", &dead_redis())]);
    assert!(out.contains("tollgate_decisions_total"), "{out}");
    assert!(out.contains("outcome=\"fallback_allowed\""), "{out}");
    assert!(out.contains("kind=\"connection\""), "{out}");
    assert!(out.contains("429 Too Many Requests"), "{out}");
}

#[tokio::test]
async fn axum_basic_serves_and_limits_with_redis_dead() {
    let port = support::free_port();
    let mut child = Command::new(example("axum_basic"))
        .env("REDIS_URL", dead_redis())
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start axum_basic");
    let client = Client::new();
    let url = format!("http://127.0.0.1:{port}/");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "axum_basic never listened");
        if let Some(status) = child.try_wait().unwrap() {
            panic!("axum_basic exited: {status}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let key = [("x-api-key", &b"k-acme"[..])];
    let mut statuses = Vec::new();
    while !statuses.contains(&429) && statuses.len() < 100 {
        statuses.push(client.get_with(&url, &key).await.status.as_u16());
    }
    let unknown_key = client.get(&url).await.status.as_u16();
    let health = client.get(&format!("http://127.0.0.1:{port}/health")).await;
    let _ = child.kill();
    let _ = child.wait();
    // The per-client burst of 10 (5 a second refill meanwhile), decided by the
    // fallback: at least 10 admitted, then limited, nothing else.
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    assert_eq!(statuses.last(), Some(&429), "never limited: {statuses:?}");
    assert!(statuses.len() > 10, "{statuses:?}");
    // An unknown API key is refused by the auth layer, not limited.
    assert_eq!(unknown_key, 401);
    assert_eq!(health.status.as_u16(), 200);
}
