//! The servers a schedule runs against, and how each fault is done to them.
//!
//! A standalone schedule has a primary (and, when it may fail over, a
//! replica) that every instance reaches through one [`Proxy`], as
//! applications reach Redis behind a stable address. A cluster schedule
//! reaches the nodes directly; it can only freeze a primary.

use std::time::{Duration, Instant};

use tollgate::RedisStore;
use tollgate::store::RedisStoreBuilder;

use super::fault::Fault;
use crate::support::{Proxy, RedisServer, node};

/// What a schedule's instances connect to and the nemesis breaks.
pub trait Target: Send + 'static {
    /// A store builder connected to the target; the schedule adds the rest.
    fn builder(&self) -> RedisStoreBuilder;

    /// Does `fault` (blocking), and returns once it is over.
    fn inflict(&mut self, fault: Fault);
}

/// A primary and maybe a replica, behind a proxy.
pub struct Standalone {
    servers: Vec<RedisServer>,
    primary: usize,
    proxy: Proxy,
}

impl Standalone {
    /// A primary, with a replica in sync when `replicated`.
    pub fn start(replicated: bool) -> Self {
        let primary = RedisServer::start();
        let proxy = Proxy::start(primary.port());
        let mut servers = vec![primary];
        if replicated {
            let replica = RedisServer::start();
            follow(&replica, servers[0].port());
            wait_for_link(&replica);
            servers.push(replica);
        }
        Standalone {
            servers,
            primary: 0,
            proxy,
        }
    }

    fn primary(&mut self) -> &mut RedisServer {
        &mut self.servers[self.primary]
    }

    /// Promotes the replica and moves the proxy to it. With the last
    /// writes, writes wait on the old primary until the replica has them
    /// all; without, the replica is cut off `lag` before the move, and what
    /// the old primary took meanwhile is lost. The old primary then
    /// follows the new one, so the next failover can go back.
    fn fail_over(&mut self, last_writes: bool, lag: Duration) {
        let (old, new) = (self.primary, 1 - self.primary);
        if last_writes {
            let _: () = self.servers[old].cmd(&["CLIENT", "PAUSE", "10000", "WRITE"]);
            wait_for_offset(&self.servers[old], &self.servers[new]);
        }
        let _: () = self.servers[new].cmd(&["REPLICAOF", "NO", "ONE"]);
        std::thread::sleep(lag);
        self.proxy.retarget(self.servers[new].port());
        self.proxy.cut_connections();
        if last_writes {
            let _: () = self.servers[old].cmd(&["CLIENT", "UNPAUSE"]);
        }
        follow(&self.servers[old], self.servers[new].port());
        self.primary = new;
    }
}

impl Target for Standalone {
    fn builder(&self) -> RedisStoreBuilder {
        RedisStore::builder().url(self.proxy.url())
    }

    fn inflict(&mut self, fault: Fault) {
        match fault {
            Fault::Flushall => {
                let _: () = self.primary().cmd(&["FLUSHALL"]);
            }
            Fault::Restart => self.primary().restart(),
            Fault::Freeze(d) => {
                self.primary().freeze();
                std::thread::sleep(d);
                self.primary().thaw();
            }
            Fault::Cut => self.proxy.cut_connections(),
            Fault::Blackhole => self.proxy.blackhole(),
            Fault::LoseReplies(d) => {
                self.proxy.lose_script_replies(true);
                std::thread::sleep(d);
                self.proxy.lose_script_replies(false);
            }
            Fault::Failover { last_writes, lag } => {
                assert!(self.servers.len() == 2, "a failover needs a replica");
                self.fail_over(last_writes, lag);
            }
        }
    }
}

fn follow(replica: &RedisServer, primary: u16) {
    let _: () = replica.cmd(&["REPLICAOF", "127.0.0.1", &primary.to_string()]);
}

fn replication_field(server: &RedisServer, field: &str) -> Option<String> {
    let info: String = server.cmd(&["INFO", "replication"]);
    node::info_field(&info, field).map(str::to_owned)
}

/// Waits (up to 10 s) until `replica` has synced with its primary.
fn wait_for_link(replica: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while replication_field(replica, "master_link_status").as_deref() != Some("up") {
        assert!(Instant::now() < deadline, "the replica never synced");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (up to 2 s) until `replica` has every write `primary` made. If it
/// does not (it may still be syncing after an earlier fault), the failover
/// goes on: the checker counts every failover as a loss anyway.
fn wait_for_offset(primary: &RedisServer, replica: &RedisServer) {
    let offset = |server: &RedisServer, field: &str| -> i64 {
        replication_field(server, field)
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1)
    };
    let target = offset(primary, "master_repl_offset");
    let deadline = Instant::now() + Duration::from_secs(2);
    while offset(replica, "slave_repl_offset") < target && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A Redis Cluster whose nodes the instances reach directly: the primary
/// of the first hot key can be frozen (shorter than the node timeout, so no
/// failover) or have its clients' connections killed (`CLIENT KILL`: a
/// reply Redis had not yet sent is lost, and a client may send the call
/// again).
#[cfg(feature = "cluster")]
pub struct ClusterTarget {
    pub seeds: Vec<String>,
    /// The primary that serves the first hot key.
    pub hot: node::Node,
}

#[cfg(feature = "cluster")]
impl Target for ClusterTarget {
    fn builder(&self) -> RedisStoreBuilder {
        RedisStore::builder().cluster(self.seeds.clone())
    }

    fn inflict(&mut self, fault: Fault) {
        match fault {
            Fault::Freeze(d) => {
                self.hot.freeze();
                std::thread::sleep(d);
                self.hot.thaw();
            }
            Fault::Cut => {
                let _: u64 = self.hot.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
            }
            other => panic!("a cluster schedule cannot do {other}"),
        }
    }
}
