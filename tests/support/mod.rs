//! Test harness: real `redis-server` processes on free loopback ports.
//!
//! Every test that needs Redis starts its own server (`RedisServer::start()`),
//! so tests never share state and can stop, restart or freeze their server. The
//! binary comes from PATH; the process is killed when the handle drops.
//!
//! Ports are reserved process-wide and drawn outside the ephemeral range
//! (`ports`); a server counts as up only when its own process answers, and one
//! whose port was taken meanwhile starts again on another (`node`). Beyond a
//! single server: a Redis Cluster (`cluster`), Sentinel (`sentinel`) and a
//! TLS-only server (`tls`).
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Child;
use std::time::Duration;

use deadpool_redis::redis;
use redis::IntoConnectionInfo;
use tollgate::RedisStore;

use node::{Ports, Probe};

/// A redis-server process owned by one test.
pub struct RedisServer {
    child: Option<Child>,
    ports: Ports,
    argv: Vec<OsString>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a standalone server with persistence off on a free loopback port.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments
    /// (e.g. `["--cluster-enabled", "yes"]`: a cluster-enabled server also gets
    /// a reserved cluster bus port, `--cluster-port`, unless `extra` sets one).
    ///
    /// The port is reserved for this server until it drops, and if another
    /// process takes it before redis-server binds it, the server is started
    /// again on another port (see `ports.rs`).
    pub fn start_with(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory for redis-server");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let cluster = extra
            .windows(2)
            .any(|w| w[0] == "--cluster-enabled" && w[1] == "yes")
            && !extra.iter().any(|a| a == "--cluster-port");
        let (child, ports, argv) =
            node::start_process("redis-server", dir.path(), cluster, &Probe::Plain, &|p| {
                let mut argv = base_args(p.port, dir.path(), "warning");
                if let Some(bus) = p.bus {
                    argv.extend(["--cluster-port".into(), bus.to_string().into()]);
                }
                argv.extend(extra.iter().map(OsString::from));
                argv
            });
        RedisServer {
            child: Some(child),
            ports,
            argv,
            dir,
        }
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.ports.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    /// The server's working directory (its log is `redis-server.log` there).
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

    /// A `RedisStore` with its own pool and the given per-call timeout,
    /// leases off: the tests that use it watch each check reach Redis (its
    /// calls, keys, TTLs and failures); `tests/leases.rs` and
    /// `tests/lease_model.rs` test leases, which are on by default.
    pub fn store_with_timeout(&self, timeout: Duration) -> RedisStore {
        RedisStore::builder()
            .leases(false)
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
        node::parse_all_calls(&self.cmd::<String>(&["INFO", "commandstats"]))
    }

    /// `calls` of one command in `INFO commandstats` (0 when never called).
    pub fn calls(&self, command: &str) -> u64 {
        self.command_stat(command, "calls").map_or(0, |v| v as u64)
    }

    /// `expired_keys` of `INFO stats`: keys Redis expired so far.
    pub fn expired_keys(&self) -> u64 {
        let info: String = self.cmd(&["INFO", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("expired_keys:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("expired_keys in INFO stats")
    }

    /// A field (`calls`, `usec`, `usec_per_call`) of `INFO commandstats` for one command.
    pub fn command_stat(&self, command: &str, field: &str) -> Option<f64> {
        node::parse_command_stat(
            &self.cmd::<String>(&["INFO", "commandstats"]),
            command,
            field,
        )
    }

    /// Kills the server (SIGKILL): connections break at once. The port stays
    /// reserved for `restart()`.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            node::kill_child(&mut child);
        }
    }

    /// Starts the server again on the same port, empty (no persistence). If
    /// something else holds the port it waits for it a while, then panics
    /// saying so.
    pub fn restart(&mut self) {
        self.stop();
        self.child = Some(node::restart_process(
            "redis-server",
            self.dir.path(),
            self.ports,
            &Probe::Plain,
            &self.argv,
        ));
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
        assert!(node::signal(pid, sig), "kill {sig} {pid} failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // Thaws a frozen server first: it must be thawed to die promptly on
        // some kernels.
        self.stop();
        self.ports.release();
    }
}

/// The arguments every harness server gets: its port on 127.0.0.1 only,
/// persistence off, its own directory, immediate replication syncs.
pub(crate) fn base_args(port: u16, dir: &Path, loglevel: &str) -> Vec<OsString> {
    let mut argv: Vec<OsString> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "no",
        "--loglevel",
        loglevel,
        // Replicas sync at once instead of after the 5 s diskless-sync delay
        // (a replica cannot take over before its first sync).
        "--repl-diskless-sync-delay",
        "0",
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    argv.push("--dir".into());
    argv.push(dir.into());
    argv
}

/// The message of the configuration error `builder` is refused with at
/// `build`, which must be a store error that does not show the password
/// `s3cret` of the tests' URLs.
pub fn refused_at_build(builder: tollgate::store::RedisStoreBuilder) -> String {
    let e = builder.build().expect_err("a mistake");
    assert_eq!(e.kind(), tollgate::ConfigErrorKind::Store);
    let message = e.to_string();
    assert!(!message.contains("s3cret"), "{message}");
    message
}

/// A loopback port reserved for the caller for the rest of the process: no
/// server of the harness will be given it.
pub fn free_port() -> u16 {
    ports::reserve()
}

/// A TCP proxy on a free loopback port in front of a server, for network
/// failures Redis itself cannot show: `blackhole()` makes every connection open
/// so far silently drop what it carries, both ways, while its sockets stay open
/// (a half-open connection after a NAT, firewall or failover change); connections
/// made afterwards work normally. `delay_new_connections(d)` makes every new
/// connection wait `d` before anything goes through (a slow TLS handshake, a
/// loaded server), and `accepted()` counts the connections clients opened.
/// `start_delayed(upstream, d)` (or `set_delay(d)`) holds every chunk `d` in
/// each direction before passing it on, as a network that far would: a delay
/// line, so chunks keep their order and one chunk's wait does not add to the
/// next one's. `cut_connections()` closes every connection open so far, both
/// ways (a failover behind a stable address, a restarted load balancer).
pub struct Proxy {
    port: u16,
    upstream: std::sync::Arc<std::sync::atomic::AtomicU16>,
    generation: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    accepted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    corrupt: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    chunk_delay_us: std::sync::Arc<std::sync::atomic::AtomicU64>,
    cuts: std::sync::Arc<Cuts>,
}

impl Proxy {
    /// Starts forwarding a free loopback port to `127.0.0.1:upstream`, every
    /// chunk held `delay` in each direction (a round trip `2 * delay` longer).
    pub fn start_delayed(upstream: u16, delay: Duration) -> Self {
        let proxy = Proxy::start(upstream);
        proxy.set_delay(delay);
        proxy
    }

    /// Holds every chunk read from now on `delay` in each direction.
    pub fn set_delay(&self, delay: Duration) {
        self.chunk_delay_us.store(
            u64::try_from(delay.as_micros()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// Starts forwarding a free loopback port to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listener");
        let upstream = Arc::new(AtomicU16::new(upstream));
        let port = listener.local_addr().expect("proxy address").port();
        let generation = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let corrupt = Arc::new(AtomicBool::new(false));
        let corrupt_accept = Arc::clone(&corrupt);
        let cut = Arc::new(AtomicBool::new(false));
        let cut_accept = Arc::clone(&cut);
        let chunk_delay_us = Arc::new(AtomicU64::new(0));
        let chunk_delay_accept = Arc::clone(&chunk_delay_us);
        let cuts = Arc::new(Cuts::default());
        let cuts_accept = Arc::clone(&cuts);
        let (upstream_accept, gen_accept, stop_accept) = (
            Arc::clone(&upstream),
            Arc::clone(&generation),
            Arc::clone(&stop),
        );
        let (delay_accept, accepted_count) = (Arc::clone(&delay_ms), Arc::clone(&accepted));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stop_accept.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                accepted_count.fetch_add(1, Ordering::SeqCst);
                // Read before the target: a connection accepted before a
                // retarget and a cut is cut, even if it reaches the old
                // server after the cut.
                let cut_born = cuts_accept.generation();
                let target = upstream_accept.load(Ordering::SeqCst);
                let delay = Duration::from_millis(delay_accept.load(Ordering::SeqCst));
                let generation = Arc::clone(&gen_accept);
                let corrupt = Arc::clone(&corrupt_accept);
                let cut = Arc::clone(&cut_accept);
                let chunk_delay = Arc::clone(&chunk_delay_accept);
                let cuts = Arc::clone(&cuts_accept);
                std::thread::spawn(move || {
                    std::thread::sleep(delay);
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                        return;
                    };
                    // As Redis and its clients do: a chunk written while an
                    // earlier one is unacknowledged must not wait for its
                    // ACK (Nagle), which a delayed ACK holds 40 ms.
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let born = generation.load(Ordering::SeqCst);
                    cuts.register(&client, &server, cut_born);
                    for (replies, from, to) in [
                        (false, client.try_clone(), server.try_clone()),
                        (true, server.try_clone(), client.try_clone()),
                    ] {
                        let (Ok(from), Ok(to)) = (from, to) else {
                            continue;
                        };
                        let generation = Arc::clone(&generation);
                        let corrupt = Arc::clone(&corrupt);
                        let cut = Arc::clone(&cut);
                        let chunk_delay = Arc::clone(&chunk_delay);
                        let cuts = Arc::clone(&cuts);
                        let delay =
                            move || Duration::from_micros(chunk_delay.load(Ordering::SeqCst));
                        delay_line::spawn(from, to, delay, move |chunk| {
                            // Cut: nothing more passes, whichever way.
                            if cuts.generation() != cut_born {
                                return delay_line::Pass::Cut;
                            }
                            // Blackholed: the bytes vanish, the sockets stay up.
                            if generation.load(Ordering::SeqCst) != born {
                                return delay_line::Pass::Drop;
                            }
                            if replies && corrupt.load(Ordering::SeqCst) {
                                corrupt_script_reply(chunk);
                            }
                            // A script's reply (a bulk string) lost: the
                            // connection closes after Redis ran the call.
                            if replies && cut.load(Ordering::SeqCst) && chunk[0] == b'$' {
                                return delay_line::Pass::Cut;
                            }
                            delay_line::Pass::On
                        });
                    }
                });
            }
        });
        Proxy {
            port,
            upstream,
            generation,
            stop,
            delay_ms,
            accepted,
            corrupt,
            cut,
            chunk_delay_us,
            cuts,
        }
    }

    /// Closes every connection open now, both ways: clients see them end
    /// and connect again (to the current upstream). Once this returns, the
    /// proxy passes nothing more on them, either way.
    pub fn cut_connections(&self) {
        self.cuts.cut();
    }

    /// While `on`, the reply of every script call (a bulk string) is lost:
    /// the proxy closes the connection instead of passing it on, after Redis
    /// ran the call. Other replies (connection set-up, errors) pass.
    #[allow(dead_code)]
    pub fn lose_script_replies(&self, on: bool) {
        self.cut.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// From now on, the reply of a script call deciding one check of one
    /// quota (a bulk string of 4 packed doubles, and the epoch) says "allowed: 7", which no
    /// script sends: a malformed reply, as a buggy server or proxy might
    /// send. The framing stays intact.
    #[allow(dead_code)]
    pub fn corrupt_script_replies(&self) {
        self.corrupt
            .store(true, std::sync::atomic::Ordering::SeqCst);
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

    /// Connections accepted from now on carry nothing for `delay` (the client's
    /// TCP connect succeeds at once; the server's first reply comes late).
    pub fn delay_new_connections(&self, delay: Duration) {
        self.delay_ms.store(
            delay.as_millis() as u64,
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// How many connections clients have opened through the proxy.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The connections of a [`Proxy`] open since its last cut.
#[derive(Default)]
struct Cuts {
    generation: std::sync::atomic::AtomicU64,
    open: std::sync::Mutex<Vec<TcpStream>>,
}

impl Cuts {
    fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Keeps handles of a new connection's two sockets, to shut them at the
    /// next cut; one accepted before a cut that came meanwhile is shut now.
    fn register(&self, client: &TcpStream, server: &TcpStream, born: u64) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        for socket in [client, server] {
            if let Ok(handle) = socket.try_clone() {
                open.push(handle);
            }
        }
        if self.generation() != born {
            Self::shut(&mut open);
        }
    }

    fn cut(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self::shut(&mut open);
    }

    fn shut(open: &mut Vec<TcpStream>) {
        for socket in open.drain(..) {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Rewrites every `$32\r\n` or `$40\r\n` bulk string wholly inside `chunk` (one decision
/// of one quota, packed) to begin with the double 7.0.
fn corrupt_script_reply(chunk: &mut [u8]) {
    // 4 doubles, or 5 with the server's epoch after them (a standalone or
    // Sentinel store's calls).
    for header in [b"$32\r\n", b"$40\r\n"] {
        let mut i = 0;
        while let Some(at) = chunk
            .get(i..)
            .and_then(|rest| rest.windows(header.len()).position(|w| w == header))
        {
            let start = i + at + header.len();
            if let Some(first) = chunk.get_mut(start..start + 8) {
                first.copy_from_slice(&7.0f64.to_le_bytes());
            }
            i = start;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wake the accept loop so it sees the stop flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

pub mod batches;
pub mod bins;
pub mod cluster;
pub mod delay_line;
pub mod failover;
pub mod far;
pub mod grpc;
pub mod hammer;
pub mod http;
pub mod model;
pub mod node;
pub mod ports;
pub mod schedule;
pub mod sentinel;
pub mod tls;
