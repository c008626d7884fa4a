//! The `tollgate` binary against real servers from the crate's test harness
//! (`tests/support`): one redis-server, a Redis Cluster, a TLS-only server
//! and Sentinel. Each test runs the built binary with `--url` of its
//! servers and reads its output and exit code; none prints a password.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;
use support::RedisServer;
use support::cluster::RedisCluster;
use support::sentinel::SentinelSet;
use support::tls::TlsRedis;
use tollgate::{Policy, Quota, RateLimiter, RedisStore};

/// What one run of the binary did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    /// Asserts the exit code, showing the whole run otherwise.
    fn exits(self, code: i32) -> Self {
        assert_eq!(self.code, code, "{self:?}");
        self
    }
}

/// Runs `tollgate ARGS`, with nothing from this process's environment that
/// the binary reads.
fn tollgate(args: &[&str]) -> Run {
    tollgate_with_env(args, &[])
}

fn tollgate_with_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("TOLLGATE_PRIMARY_PASSWORD")
        .envs(env.iter().copied())
        .output()
        .expect("run tollgate");
    Run {
        code: out.status.code().expect("an exit code, not a signal"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `ARGS` after `--url URL`, with the policy "api" of 3 a minute and 100 an
/// hour: slow enough that nothing refills during a test.
fn api<'a>(url: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec![
        "--url", url, "--policy", "api", "-q", "3/min", "-q", "100/h",
    ];
    all.extend_from_slice(args);
    all
}

/// `check`, `peek`, `reset` and `top` on one server: exit codes, the wait
/// of a refused check, the figures of peek and top, a layer's key given by
/// kind and value, and top's bound.
#[test]
fn peek_check_reset_and_top_on_one_server() {
    let server = RedisServer::start();
    let url = server.url();
    for left in ["2 of 3 left", "1 of 3 left", "0 of 3 left"] {
        let run = tollgate(&api(&url, &["check", "--key", "user:1"])).exits(0);
        assert!(
            run.stdout.starts_with("admitted") && run.stdout.contains(left),
            "{run:?}"
        );
    }
    let refused = tollgate(&api(&url, &["check", "--key", "user:1"])).exits(1);
    assert!(
        refused.stdout.contains("refused") && refused.stdout.contains("retry in"),
        "{refused:?}"
    );
    let refused = tollgate(&api(&url, &["check", "--key", "user:1", "--json"])).exits(1);
    let json = refused.json();
    assert_eq!(json["allowed"], false);
    let wait = json["retry_after_ms"].as_u64().unwrap();
    assert!(
        wait > 0 && wait <= 20_000,
        "one token of 3 a minute: {json}"
    );
    tollgate(&api(&url, &["check", "--key", "user:2", "--cost", "2"])).exits(0);
    // A cost no bucket can hold is a mistake in the command, not a refusal.
    let run = tollgate(&api(&url, &["check", "--key", "user:2", "--cost", "4"])).exits(2);
    assert!(run.stderr.contains("exceeds"), "{run:?}");

    let peek = tollgate(&api(&url, &["peek", "--key", "user:1", "--json"]))
        .exits(0)
        .json();
    assert_eq!(peek["quotas"][0]["quota"], "3/min");
    assert_eq!(peek["quotas"][0]["remaining"], 0);
    assert_eq!(peek["quotas"][0]["stored"], true);
    assert_eq!(peek["quotas"][0]["storage_key"], "tollgate:{api:user:1}:1m");
    assert_eq!(peek["quotas"][1]["remaining"], 97);
    let text = tollgate(&api(&url, &["peek", "--key", "user:1"]))
        .exits(0)
        .stdout;
    assert!(
        text.contains("policy api, key user:1") && text.contains("3/min"),
        "{text}"
    );

    // A layer's key whose value is hashed (braces), given as the request
    // carried it, then as `top` shows it.
    tollgate(&api(
        &url,
        &["check", "--kind", "route", "--value", "/items/{id}"],
    ))
    .exits(0);
    let top = tollgate(&api(&url, &["top", "--json"])).exits(0).json();
    let keys: Vec<&str> = top["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys[0], "user:1", "nearest its limit first: {top}");
    assert_eq!(top["buckets"][0]["quota"], "3/min");
    assert_eq!(top["scan"]["complete"], true);
    assert_eq!(top["scan"]["nodes"], 1);
    let route = keys
        .iter()
        .find(|k| k.starts_with("route:#"))
        .expect("the route's bucket");
    let peek = tollgate(&api(&url, &["peek", "--key", route, "--json"]))
        .exits(0)
        .json();
    assert_eq!(peek["quotas"][0]["remaining"], 2);
    // Keys name periods, not figures: top reads them under the policy's
    // quotas, so it needs them.
    let all = tollgate(&api(&url, &["top", "--json"])).exits(0).json();
    assert_eq!(all["buckets"].as_array().unwrap().len(), 6);
    let run = tollgate(&["--url", &url, "--policy", "api", "top"]).exits(2);
    assert!(run.stderr.contains("no limits"), "{run:?}");
    let text = tollgate(&api(&url, &["top"])).exits(0).stdout;
    assert!(
        text.contains("every bucket of the policy was found"),
        "{text}"
    );

    // A keyspace larger than the bound: top says it stopped.
    let mut mset = vec!["MSET".to_owned()];
    for i in 0..5_000 {
        mset.extend([format!("other:{i}"), "x".to_owned()]);
    }
    let mset: Vec<&str> = mset.iter().map(String::as_str).collect();
    let _: () = server.cmd(&mset);
    let bounded = tollgate(&api(&url, &["top", "--scan", "200"]))
        .exits(0)
        .stdout;
    assert!(bounded.contains("stopped at its bound"), "{bounded}");
    let json = tollgate(&api(&url, &["top", "--scan", "200", "--json"]))
        .exits(0)
        .json();
    assert_eq!(json["scan"]["complete"], false);
    assert_eq!(json["scan"]["visited"], 200);
    assert!(
        json["scan"]["total_keys"].as_u64().unwrap() >= 5_000,
        "{json}"
    );

    let reset = tollgate(&api(&url, &["reset", "--key", "user:1"])).exits(0);
    assert!(reset.stdout.contains("full now"), "{reset:?}");
    let peek = tollgate(&api(&url, &["peek", "--key", "user:1", "--json"]))
        .exits(0)
        .json();
    assert_eq!(peek["quotas"][0]["remaining"], 3);
    assert_eq!(peek["quotas"][0]["stored"], false);
    tollgate(&api(&url, &["check", "--key", "user:1"])).exits(0);
}

/// The holds of instances' leases show in peek, and reset says the
/// holders may still spend them.
#[test]
fn peek_shows_the_holds_of_leases_and_reset_tells_of_them() {
    let server = RedisServer::start();
    let url = server.url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = RedisStore::builder()
        .url(url.clone())
        .leases(true)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let policy = Policy::new("hot", [Quota::per_second(1_000).unwrap()]).unwrap();
    let limiter = RateLimiter::new(store, policy);
    // An instance in steady use of the key, until the test is done.
    let stop = Arc::new(AtomicBool::new(false));
    let busy = runtime.spawn({
        let (limiter, stop) = (limiter.clone(), Arc::clone(&stop));
        async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = limiter.check("client", 1).await;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    let args = ["--url", &url, "--policy", "hot", "-q", "1000/s"];
    let peek = |extra: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(extra);
        tollgate(&all)
    };
    let mut seen = None;
    for _ in 0..100 {
        let json = peek(&["peek", "--key", "client", "--json"]).exits(0).json();
        if !json["quotas"][0]["holds"].as_array().unwrap().is_empty() {
            seen = Some(json);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let json = seen.expect("a hold within 5 s of steady checks");
    let hold = &json["quotas"][0]["holds"][0];
    assert!(hold["tokens"].as_u64().unwrap() > 0, "{json}");
    assert!(hold["expires_in_ms"].as_u64().unwrap() > 0, "{json}");
    assert!(json["quotas"][0]["held"].as_u64().unwrap() > 0, "{json}");
    let text = peek(&["peek", "--key", "client"]).exits(0).stdout;
    assert!(text.contains("hold "), "{text}");
    // The instance leases again after each reset: one of a few resets
    // finds a hold.
    let told = (0..50).any(|_| {
        let reset = peek(&["reset", "--key", "client"]).exits(0);
        std::thread::sleep(Duration::from_millis(50));
        reset
            .stdout
            .contains("they may still spend those until their holds expire")
    });
    assert!(told, "no reset told of the holds");
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(busy).unwrap();
}

/// Mistakes exit 2, a store that fails exits 3, each with a message that
/// names the server or the value and never shows the password.
#[test]
fn mistakes_and_failures_are_told_without_the_password() {
    let no_password = |run: &Run| {
        assert!(
            !run.stdout.contains("s3cret") && !run.stderr.contains("s3cret"),
            "{run:?}"
        );
    };
    let bad_url = tollgate(&api(
        "redis://:s3cret@127.0.0.1:notaport",
        &["peek", "-k", "a"],
    ))
    .exits(2);
    assert!(
        bad_url.stderr.contains("Redis URL redis://:***@"),
        "{bad_url:?}"
    );
    no_password(&bad_url);

    let port = support::free_port();
    let dead = format!("redis://user:s3cret@127.0.0.1:{port}");
    for command in ["peek", "check", "reset"] {
        let run = tollgate(&api(&dead, &[command, "-k", "a"])).exits(3);
        assert!(run.stderr.contains(&format!("127.0.0.1:{port}")), "{run:?}");
        no_password(&run);
    }
    let run = tollgate(&api(&dead, &["top", "--json"])).exits(3);
    assert_eq!(run.json()["error"]["kind"], "store");
    no_password(&run);
    // From the environment, and in --help, which shows no value of it.
    let run = tollgate_with_env(
        &["-p", "api", "-q", "1/s", "peek", "-k", "a"],
        &[("REDIS_URL", &dead)],
    )
    .exits(3);
    no_password(&run);
    let help = tollgate_with_env(&["--help"], &[("REDIS_URL", &dead)]).exits(0);
    assert!(help.stdout.contains("Exit codes"), "{help:?}");
    no_password(&help);

    let run = tollgate(&[
        "--url", &dead, "-p", "api", "-q", "0/s", "peek", "-k", "a", "--json",
    ])
    .exits(2);
    let json = run.json();
    assert_eq!(json["error"]["kind"], "usage");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"0/s\""),
        "{json}"
    );
    let run = tollgate(&[
        "--url", &dead, "-p", "bad name", "-q", "1/s", "peek", "-k", "a",
    ])
    .exits(2);
    assert!(run.stderr.contains("bad name"), "{run:?}");
    let run = tollgate(&["-p", "api", "-q", "1/s", "peek", "-k", "a"]).exits(2);
    assert!(run.stderr.contains("--url"), "{run:?}");
    tollgate(&["--url", &dead, "peek", "-k", "a"]).exits(2);
    // clap's own mistakes exit 2 as well.
    tollgate(&["--url", &dead, "-p", "api", "-q", "1/s", "peek"]).exits(2);
}

/// The limits come from the application's file, routes and exempt entries
/// and all.
#[test]
fn limits_come_from_the_applications_file() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.toml");
    std::fs::write(
        &file,
        r#"
[server]
listen = "0.0.0.0:8080"

[[policy]]
name = "health"
exempt = true
routes = ["GET /health"]

[[policy]]
name = "login"
quotas = ["2/min", "20/h"]
routes = ["POST /login"]

[[policy]]
name = "api"
quotas = ["10/s burst 20"]
"#,
    )
    .unwrap();
    let config = file.to_str().unwrap();
    let login = ["--url", &url, "--config", config, "--policy", "login"];
    let with = |extra: &[&str]| {
        let mut all = login.to_vec();
        all.extend_from_slice(extra);
        tollgate(&all)
    };
    with(&["check", "--kind", "ip", "--value", "10.0.0.1"]).exits(0);
    with(&["check", "--key", "ip:10.0.0.1"]).exits(0);
    with(&["check", "--key", "ip:10.0.0.1"]).exits(1);
    let peek = with(&["peek", "--key", "ip:10.0.0.1", "--json"])
        .exits(0)
        .json();
    assert_eq!(peek["quotas"][1]["quota"], "20/h");
    assert_eq!(peek["quotas"][1]["remaining"], 18);
    let top = with(&["top", "--json"]).exits(0).json();
    assert_eq!(top["buckets"][0]["key"], "ip:10.0.0.1");

    let several = tollgate(&["--url", &url, "--config", config, "peek", "-k", "a"]).exits(2);
    assert!(several.stderr.contains("login, api"), "{several:?}");
    let exempt = tollgate(&[
        "--url", &url, "-c", config, "-p", "health", "peek", "-k", "a",
    ])
    .exits(2);
    assert!(exempt.stderr.contains("exempt"), "{exempt:?}");
    let unknown =
        tollgate(&["--url", &url, "-c", config, "-p", "nope", "peek", "-k", "a"]).exits(2);
    assert!(unknown.stderr.contains("no policy \"nope\""), "{unknown:?}");
    std::fs::write(
        &file,
        "[[policy]]\nname = \"x\"\nquotas = [\"1/fortnight\"]\n",
    )
    .unwrap();
    let broken = tollgate(&["--url", &url, "-c", config, "peek", "-k", "a"]).exits(2);
    assert!(broken.stderr.contains("fortnight"), "{broken:?}");
}

/// The same commands on a Redis Cluster, whose buckets are spread over
/// three primaries: one cluster for every check (it takes seconds to start).
#[test]
fn peek_check_reset_and_top_on_a_cluster() {
    let cluster = RedisCluster::start();
    let seeds = cluster.seed_urls();
    let store = RedisStore::from_cluster_urls(seeds.clone()).unwrap();
    let policy = Policy::new("api", [Quota::per_minute(3).unwrap()]).unwrap();
    let limiter = RateLimiter::new(store, policy);
    let clients = cluster.limiter_clients_on_every_primary(&limiter, "user", 2);
    let mut args: Vec<&str> = vec!["--cluster", "--policy", "api", "-q", "3/min"];
    for seed in &seeds {
        args.extend(["--url", seed]);
    }
    let with = |extra: &[&str]| {
        let mut all = args.clone();
        all.extend_from_slice(extra);
        tollgate(&all)
    };
    for (client, _) in &clients {
        with(&["check", "--key", client]).exits(0);
    }
    let (full, _) = &clients[1];
    with(&["check", "--key", full, "--cost", "2"]).exits(0);
    let refused = with(&["check", "--key", full]).exits(1);
    assert!(refused.stdout.contains("retry in"), "{refused:?}");

    let top = with(&["top", "--json"]).exits(0).json();
    assert_eq!(top["scan"]["nodes"], 3, "{top}");
    assert_eq!(top["scan"]["complete"], true, "{top}");
    let buckets = top["buckets"].as_array().unwrap();
    assert_eq!(
        buckets.len(),
        clients.len(),
        "every primary's buckets: {top}"
    );
    assert_eq!(buckets[0]["key"], full.as_str());
    assert_eq!(buckets[0]["remaining"], 0);
    let text = with(&["top"]).exits(0).stdout;
    assert!(text.contains("on 3 primaries"), "{text}");

    let peek = with(&["peek", "--key", full, "--json"]).exits(0).json();
    assert_eq!(peek["quotas"][0]["remaining"], 0);
    with(&["reset", "--key", full]).exits(0);
    let peek = with(&["peek", "--key", full, "--json"]).exits(0).json();
    assert_eq!(peek["quotas"][0]["remaining"], 3);
    let top = with(&["top", "--json", "--limit", "1"]).exits(0).json();
    assert_eq!(top["buckets"][0]["remaining"], 2);
}

/// TLS with the server's CA; another CA is refused, as a store failure.
#[test]
fn tls_with_the_servers_ca_and_not_with_another() {
    if !support::bins::has_tls() {
        return support::bins::no_tls("tls_with_the_servers_ca_and_not_with_another");
    }
    let server = TlsRedis::start();
    let url = server.url();
    let ca = server.ca_path();
    let ca = ca.to_str().unwrap();
    tollgate(&api(&url, &["--ca-file", ca, "check", "-k", "a"])).exits(0);
    let peek = tollgate(&api(&url, &["--ca-file", ca, "peek", "-k", "a", "--json"]))
        .exits(0)
        .json();
    assert_eq!(peek["quotas"][0]["remaining"], 2);
    let wrong = server.wrong_ca_path();
    let run = tollgate(&api(
        &url,
        &["--ca-file", wrong.to_str().unwrap(), "peek", "-k", "a"],
    ))
    .exits(3);
    assert!(
        run.stderr.contains(&format!("127.0.0.1:{}", server.port())),
        "{run:?}"
    );
}

/// Through Sentinel: the primary the sentinels name.
#[test]
fn check_and_peek_through_sentinel() {
    let set = SentinelSet::start();
    let mut args: Vec<&str> = vec!["--sentinel", set.master_name(), "-p", "api", "-q", "3/min"];
    let urls = set.sentinel_urls();
    for url in &urls {
        args.extend(["--url", url]);
    }
    let with = |extra: &[&str]| {
        let mut all = args.clone();
        all.extend_from_slice(extra);
        tollgate(&all)
    };
    with(&["check", "-k", "a", "--cost", "3"]).exits(0);
    with(&["check", "-k", "a"]).exits(1);
    let primary: Option<String> = set.primary().cmd(&["GET", "tollgate:{api:a}:1m"]);
    assert!(primary.is_some(), "the bucket is on the primary");
    let peek = with(&["peek", "-k", "a", "--json"]).exits(0).json();
    assert_eq!(peek["quotas"][0]["remaining"], 0);
}
