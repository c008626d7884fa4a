//! Redis Sentinel: one primary, one replica and three sentinels (quorum 2) on
//! free loopback ports, for tests of failover behind Sentinel.
//!
//! The sentinels use `down-after-milliseconds` [`DOWN_AFTER_MS`] and
//! `failover-timeout` [`FAILOVER_TIMEOUT_MS`]: a killed primary is replaced
//! about 2-3 s later (longer when the sentinels' first leader election splits:
//! they try again after twice the failover timeout). Each sentinel has its own
//! config file, which it rewrites (ids, known replicas and sentinels, epochs).
//! Everything stops when the set drops.

use std::ffi::OsString;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use deadpool_redis::redis;

use super::base_args;
use super::node::Node;

/// The name the sentinels monitor the primary under.
pub const MASTER_NAME: &str = "tollgate-primary";
/// `sentinel down-after-milliseconds`.
pub const DOWN_AFTER_MS: u64 = 1000;
/// `sentinel failover-timeout`.
pub const FAILOVER_TIMEOUT_MS: u64 = 3000;
/// Bound of every wait (set ready, failover), generous for busy CI.
const WAIT_LIMIT: Duration = Duration::from_secs(45);
const POLL: Duration = Duration::from_millis(50);

/// A primary, a replica and three sentinels watching them.
pub struct SentinelSet {
    data: Vec<Node>,
    sentinels: Vec<Node>,
    /// The primary's port last seen by every sentinel.
    known_primary: Mutex<u16>,
}

impl SentinelSet {
    /// Starts the primary, the replica (`--replicaof`) and waits for its first
    /// sync, then the three sentinels, and waits until each of them sees the
    /// primary up, the replica and the two other sentinels.
    pub fn start() -> Self {
        let primary = Node::start("sentinel-set primary", false, &|p, dir| {
            base_args(p.port, dir, "notice")
        });
        let primary_port = primary.port();
        let replica = Node::start("sentinel-set replica", false, &|p, dir| {
            let mut argv = base_args(p.port, dir, "notice");
            argv.extend(
                ["--replicaof", "127.0.0.1", &primary_port.to_string()].map(OsString::from),
            );
            argv
        });
        // A sentinel learns replicas from the primary's INFO, which it asks at
        // once when it connects and then only every 10 s: the replica must be
        // attached before the sentinels start.
        wait_until(
            "the replica's first sync",
            || {
                let repl: String = replica
                    .try_cmd(&["INFO", "replication"])
                    .map_err(|e| e.to_string())?;
                match super::node::info_field(&repl, "master_link_status") {
                    Some("up") => Ok(()),
                    other => Err(format!("master_link_status {other:?}")),
                }
            },
            || report(&[&primary, &replica]),
        );
        let sentinels: Vec<Node> = (1..=3)
            .map(|i| {
                Node::start(&format!("sentinel {i}"), false, &|p, dir| {
                    let conf = dir.join("sentinel.conf");
                    std::fs::write(
                        &conf,
                        format!(
                            "port {port}\n\
                             bind 127.0.0.1\n\
                             protected-mode no\n\
                             daemonize no\n\
                             loglevel notice\n\
                             dir {dir}\n\
                             sentinel resolve-hostnames no\n\
                             sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
                             sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                             sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
                             sentinel parallel-syncs {MASTER_NAME} 1\n",
                            port = p.port,
                            dir = dir.display(),
                        ),
                    )
                    .expect("sentinel config file");
                    vec![conf.into(), "--sentinel".into()]
                })
            })
            .collect();
        let set = SentinelSet {
            data: vec![primary, replica],
            sentinels,
            known_primary: Mutex::new(primary_port),
        };
        set.wait(
            "the sentinels to see the primary, the replica and each other",
            |s| {
                for sentinel in &s.sentinels {
                    let m = master_fields(sentinel)?;
                    let field = |k: &str| m.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_str());
                    if field("port") != Some(&primary_port.to_string())
                        || field("flags") != Some("master")
                        || field("num-slaves") != Some("1")
                        || field("num-other-sentinels") != Some("2")
                    {
                        return Err(format!("{sentinel:?} sees {m:?}"));
                    }
                    let replicas: Vec<Vec<String>> = sentinel
                        .try_cmd(&["SENTINEL", "REPLICAS", MASTER_NAME])
                        .map_err(|e| e.to_string())?;
                    let flags: Vec<&str> = replicas
                        .iter()
                        .filter_map(|r| r.windows(2).find(|w| w[0] == "flags").map(|w| &*w[1]))
                        .collect();
                    if flags != ["slave"] {
                        return Err(format!("{sentinel:?} sees replicas with flags {flags:?}"));
                    }
                }
                Ok(())
            },
        );
        set
    }

    fn wait<T>(&self, what: &str, check: impl Fn(&Self) -> Result<T, String>) -> T {
        let all: Vec<&Node> = self.data.iter().chain(&self.sentinels).collect();
        wait_until(what, || check(self), || report(&all))
    }

    /// A store that finds the primary through the sentinels, with its own
    /// connections and the given timeout.
    #[cfg(feature = "sentinel")]
    pub fn store(&self, timeout: Duration) -> tollgate::RedisStore {
        tollgate::RedisStore::builder()
            .leases(false)
            .sentinel(self.sentinel_urls(), self.master_name())
            .timeout(timeout)
            .build()
            .expect("sentinel store")
    }

    /// `redis://127.0.0.1:PORT` of the three sentinels.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Node::url).collect()
    }

    /// The sentinels.
    pub fn sentinels(&self) -> &[Node] {
        &self.sentinels
    }

    /// The name the sentinels monitor the primary under.
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// The two data nodes, the first primary first.
    pub fn data_nodes(&self) -> &[Node] {
        &self.data
    }

    /// The data node the sentinels name as primary now.
    pub fn primary(&self) -> Node {
        let port = self.current_primary_port();
        self.data
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("the sentinels name port {port}, not a node of this set"))
            .clone()
    }

    /// The other data node: the replica, or after a failover the old primary
    /// (dead if it was killed).
    pub fn replica(&self) -> Node {
        let port = self.current_primary_port();
        self.data
            .iter()
            .find(|n| n.port() != port)
            .expect("two data nodes")
            .clone()
    }

    /// The primary's port as the first sentinel that answers reports it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    pub fn current_primary_port(&self) -> u16 {
        let mut errors = Vec::new();
        for s in self.sentinels.iter().filter(|s| s.is_up()) {
            match primary_port_of(s) {
                Ok(port) => return port,
                Err(e) => errors.push(format!("{s:?}: {e}")),
            }
        }
        panic!("no sentinel named the primary: {errors:?}");
    }

    /// Kills (SIGKILL) the current primary; returns its port.
    pub fn kill_primary(&self) -> u16 {
        let primary = self.primary();
        primary.kill();
        primary.port()
    }

    /// Waits until every sentinel that is up names a new primary (not the one
    /// last seen), the same one, and it answers `ROLE` as a master; returns its
    /// port. Panics after a bounded wait, with the sentinels' logs.
    pub fn wait_for_failover(&self) -> u16 {
        let old = *self.known_primary.lock().unwrap_or_else(|e| e.into_inner());
        let new = self.wait(&format!("a failover away from port {old}"), |s| {
            let mut named = Vec::new();
            for sentinel in s.sentinels.iter().filter(|n| n.is_up()) {
                named.push(primary_port_of(sentinel)?);
            }
            let port = *named.first().ok_or("no sentinel is up")?;
            if port == old || named.iter().any(|p| *p != port) {
                return Err(format!("the sentinels name ports {named:?}"));
            }
            let node = s
                .data
                .iter()
                .find(|n| n.port() == port)
                .ok_or_else(|| format!("port {port} is not a node of this set"))?;
            let role: Vec<redis::Value> = node.try_cmd(&["ROLE"]).map_err(|e| e.to_string())?;
            match role.first() {
                Some(redis::Value::BulkString(b)) if b == b"master" => Ok(port),
                other => Err(format!("port {port} says ROLE {other:?}")),
            }
        });
        *self.known_primary.lock().unwrap_or_else(|e| e.into_inner()) = new;
        new
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        // Sentinels first, so that none starts a failover while the rest stop.
        for n in self.sentinels.iter().chain(&self.data) {
            n.kill();
        }
    }
}

/// `SENTINEL MASTER` as field/value pairs.
fn master_fields(sentinel: &Node) -> Result<Vec<(String, String)>, String> {
    let flat: Vec<String> = sentinel
        .try_cmd(&["SENTINEL", "MASTER", MASTER_NAME])
        .map_err(|e| format!("{sentinel:?}: {e}"))?;
    Ok(flat
        .chunks(2)
        .filter_map(|kv| Some((kv.first()?.clone(), kv.get(1)?.clone())))
        .collect())
}

fn primary_port_of(sentinel: &Node) -> Result<u16, String> {
    let addr: Vec<String> = sentinel
        .try_cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
        .map_err(|e| e.to_string())?;
    addr.get(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("GET-MASTER-ADDR-BY-NAME answered {addr:?}"))
}

fn report(nodes: &[&Node]) -> String {
    nodes
        .iter()
        .map(|n| {
            format!(
                "--- {n:?}\n{}\n",
                super::node::log_tail(&super::node::log_path(n.dir()), 12)
            )
        })
        .collect()
}

fn wait_until<T>(
    what: &str,
    check: impl Fn() -> Result<T, String>,
    report: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        match check() {
            Ok(v) => return v,
            Err(why) if Instant::now() > deadline => panic!(
                "timed out after {WAIT_LIMIT:?} waiting for {what}: {why}\n{}",
                report()
            ),
            Err(_) => std::thread::sleep(POLL),
        }
    }
}
