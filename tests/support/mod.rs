//! Test harness: real `redis-server` processes on free loopback ports.
//!
//! Every test that needs Redis starts its own server (`RedisServer::start()`),
//! so tests never share state and can stop, restart or freeze their server. The
//! binary comes from PATH; the process is killed when the handle drops.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use redis::IntoConnectionInfo;
use tollgate::RedisStore;

/// How to get redis-server, printed when it is missing.
const INSTALL_HINT: &str = "redis-server was not found on PATH. The integration tests start \
     their own Redis servers; install one first, for example `apt-get install -y redis-server` \
     (Debian/Ubuntu) or `brew install redis` (macOS).";

/// A redis-server process owned by one test.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a standalone server with persistence off on a free loopback port.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments
    /// (e.g. `["--cluster-enabled", "yes"]`).
    pub fn start_with(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory for redis-server");
        let mut server = RedisServer {
            child: None,
            port: free_port(),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--protected-mode", "no", "--loglevel", "warning"])
        .arg("--dir")
        .arg(self.dir.path())
        .args(&self.extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL_HINT}"),
            Err(e) => panic!("could not start redis-server: {e}"),
        };
        if let Err(why) = wait_ready(self.port, Duration::from_secs(10)) {
            let _ = child.kill();
            let stderr = child
                .stderr
                .take()
                .map(|s| {
                    BufReader::new(s)
                        .lines()
                        .map_while(Result::ok)
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .unwrap_or_default();
            panic!(
                "redis-server on port {} did not come up: {why}\n{stderr}",
                self.port
            );
        }
        self.child = Some(child);
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A new deadpool-redis pool for this server.
    pub fn pool(&self) -> deadpool_redis::Pool {
        deadpool_redis::Config::from_url(self.url())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .expect("pool")
    }

    /// A `RedisStore` with its own pool and a generous timeout for busy CI
    /// machines (tests about timeouts set their own).
    pub fn store(&self) -> RedisStore {
        self.store_with_timeout(Duration::from_secs(5))
    }

    /// A `RedisStore` with its own pool and the given per-call timeout.
    pub fn store_with_timeout(&self, timeout: Duration) -> RedisStore {
        RedisStore::builder()
            .pool(self.pool())
            .timeout(timeout)
            .build()
            .expect("store")
    }

    /// A plain synchronous connection for inspecting the server. It sends no
    /// `CLIENT SETINFO` when it connects, so inspecting the server adds nothing to
    /// `INFO commandstats` but the inspecting command itself.
    pub fn conn(&self) -> redis::Connection {
        let info = self.url().into_connection_info().expect("connection info");
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        redis::Client::open(info.set_redis_settings(settings))
            .expect("client")
            .get_connection()
            .expect("connection to the test redis-server")
    }

    /// Runs a command and returns its reply.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.try_cmd(args).expect("command")
    }

    /// Runs a command and returns its reply or the error Redis answered.
    pub fn try_cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let (name, rest) = args.split_first().expect("a command");
        redis::cmd(name).arg(rest).query(&mut self.conn())
    }

    /// The server's clock (`TIME`) in microseconds since the epoch.
    pub fn time_us(&self) -> u64 {
        let t: Vec<u64> = self.cmd(&["TIME"]);
        t[0] * 1_000_000 + t[1]
    }

    /// Zeroes `INFO commandstats` (`CONFIG RESETSTAT`).
    pub fn reset_stats(&self) {
        let _: () = self.cmd(&["CONFIG", "RESETSTAT"]);
    }

    /// `calls` of every command in `INFO commandstats`, by name (`evalsha`,
    /// `script|load`, ...), leaving out the `INFO` and `CONFIG|RESETSTAT` calls the
    /// harness itself makes to read and reset them.
    pub fn all_calls(&self) -> BTreeMap<String, u64> {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter_map(|l| {
                let (name, fields) = l.split_once(':')?;
                let calls = fields
                    .split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .find(|(k, _)| *k == "calls")?
                    .1
                    .parse()
                    .ok()?;
                Some((name.to_string(), calls))
            })
            .filter(|(name, _)| name != "info" && name != "config|resetstat")
            .collect()
    }

    /// `calls` of one command in `INFO commandstats` (0 when never called).
    pub fn calls(&self, command: &str) -> u64 {
        self.command_stat(command, "calls").map_or(0, |v| v as u64)
    }

    /// A field (`calls`, `usec`, `usec_per_call`) of `INFO commandstats` for one command.
    pub fn command_stat(&self, command: &str, field: &str) -> Option<f64> {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{}:", command.to_ascii_lowercase());
        let line = info.lines().find(|l| l.starts_with(&prefix))?;
        line[prefix.len()..]
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == field)
            .and_then(|(_, v)| v.parse().ok())
    }

    /// Kills the server (SIGKILL): connections break at once.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty (no persistence).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Thaws a frozen server (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("server is running").id();
        let ok = Command::new("kill")
            .arg(sig)
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(ok.success(), "kill {sig} {pid} failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_ref() {
            // A frozen server must be thawed to die promptly on some kernels.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .status();
        }
        self.stop();
    }
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn wait_ready(port: u16, limit: Duration) -> Result<(), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + limit;
    let mut last = String::from("never answered");
    while Instant::now() < deadline {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(_) => {
                let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                    .map_err(|e| e.to_string())?;
                match client
                    .get_connection()
                    .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                {
                    Ok(_) => return Ok(()),
                    Err(e) => last = e.to_string(),
                }
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(last)
}

/// A TCP proxy on a free loopback port in front of a server, for network
/// failures Redis itself cannot show: `blackhole()` makes every connection open
/// so far silently drop what it carries, both ways, while its sockets stay open
/// (a half-open connection after a NAT, firewall or failover change); connections
/// made afterwards work normally.
pub struct Proxy {
    port: u16,
    upstream: std::sync::Arc<std::sync::atomic::AtomicU16>,
    generation: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    /// Starts forwarding a free loopback port to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listener");
        let upstream = Arc::new(AtomicU16::new(upstream));
        let upstream_accept = Arc::clone(&upstream);
        let port = listener.local_addr().expect("proxy address").port();
        let generation = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (gen_accept, stop_accept) = (Arc::clone(&generation), Arc::clone(&stop));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stop_accept.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let target = upstream_accept.load(Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let born = gen_accept.load(Ordering::SeqCst);
                for (from, to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ] {
                    let (Ok(mut from), Ok(mut to)) = (from, to) else {
                        continue;
                    };
                    let generation = Arc::clone(&gen_accept);
                    std::thread::spawn(move || {
                        use std::io::{Read, Write};
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            // Blackholed: the bytes vanish, the sockets stay up.
                            if generation.load(Ordering::SeqCst) != born {
                                continue;
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Proxy {
            port,
            upstream,
            generation,
            stop,
        }
    }

    /// The proxy's loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sends connections made from now on to `127.0.0.1:upstream`; those open
    /// now stay with the old server (a failover behind a stable address).
    pub fn retarget(&self, upstream: u16) {
        self.upstream
            .store(upstream, std::sync::atomic::Ordering::SeqCst);
    }

    /// Silently drops all traffic of the connections open now.
    pub fn blackhole(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wake the accept loop so it sees the stop flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

pub mod grpc;
pub mod http;
