//! A real Redis Cluster: 3 primaries and 3 replicas on free loopback ports,
//! created with `redis-cli --cluster create`, for tests of the store against a
//! cluster and its failovers.
//!
//! ```ignore
//! let cluster = RedisCluster::start();
//! let old = cluster.kill_primary_for_key("tollgate:{user}:...");
//! let new = cluster.wait_for_failover(&old);
//! ```
//!
//! Every node runs with `--cluster-node-timeout` [`NODE_TIMEOUT_MS`] (a killed
//! or frozen primary is replaced about 2-3 s later; so is one frozen, or starved
//! of CPU, for longer than that) and `--cluster-replica-validity-factor 0` (a
//! replica always may take over, however long it was cut off from its primary).
//! Everything stops when the cluster drops.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use deadpool_redis::redis;

use super::base_args;
use super::node::Node;

/// `--cluster-node-timeout` of [`RedisCluster::start`], in milliseconds.
pub const NODE_TIMEOUT_MS: u64 = 1500;
/// Bound of every wait (cluster ready, failover), generous for busy CI.
const WAIT_LIMIT: Duration = Duration::from_secs(45);
const POLL: Duration = Duration::from_millis(50);
const SLOTS: u32 = 16384;

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLine {
    /// The node id.
    pub id: String,
    /// The client port (of `ip:port@cport`).
    pub port: u16,
    /// Flags: `myself`, `master`, `slave`, `fail?`, `fail`, ...
    pub flags: Vec<String>,
    /// The primary's id for a replica.
    pub master: Option<String>,
    /// `connected` or `disconnected`.
    pub link: String,
    /// Slot ranges (inclusive); migrating/importing markers left out.
    pub slots: Vec<(u16, u16)>,
}

impl NodeLine {
    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// A primary, not flagged failing.
    pub fn is_healthy_primary(&self) -> bool {
        self.has("master") && !self.has("fail") && !self.has("fail?")
    }

    /// A replica, not flagged failing.
    pub fn is_healthy_replica(&self) -> bool {
        self.has("slave") && !self.has("fail") && !self.has("fail?")
    }
}

/// Parses a `CLUSTER NODES` reply.
pub fn parse_cluster_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let addr = f[1].split(['@', ',']).next()?;
            let port = addr.rsplit_once(':')?.1.parse().ok()?;
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => {
                        let n = s.parse().ok()?;
                        Some((n, n))
                    }
                })
                .collect();
            Some(NodeLine {
                id: f[0].to_string(),
                port,
                flags: f[2].split(',').map(str::to_string).collect(),
                master: (f[3] != "-").then(|| f[3].to_string()),
                link: f[7].to_string(),
                slots,
            })
        })
        .collect()
}

/// One range of `CLUSTER SLOTS`: first and last slot, the primary's port and
/// the replicas' ports.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SlotRange {
    pub start: u16,
    pub end: u16,
    pub primary: u16,
    pub replicas: Vec<u16>,
}

/// Parses a `CLUSTER SLOTS` reply (sorted by first slot, replicas sorted).
pub fn parse_cluster_slots(value: redis::Value) -> Result<Vec<SlotRange>, String> {
    fn port_of(node: &redis::Value) -> Result<u16, String> {
        let fields: Vec<redis::Value> =
            redis::from_redis_value_ref(node).map_err(|e| e.to_string())?;
        let port = fields.get(1).ok_or("a node without a port")?;
        redis::from_redis_value_ref(port).map_err(|e| e.to_string())
    }
    let ranges: Vec<Vec<redis::Value>> =
        redis::from_redis_value(value).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for r in ranges {
        if r.len() < 3 {
            return Err(format!("short CLUSTER SLOTS entry {r:?}"));
        }
        let start: u16 = redis::from_redis_value_ref(&r[0]).map_err(|e| e.to_string())?;
        let end: u16 = redis::from_redis_value_ref(&r[1]).map_err(|e| e.to_string())?;
        let primary = port_of(&r[2])?;
        let mut replicas = r[3..].iter().map(port_of).collect::<Result<Vec<_>, _>>()?;
        replicas.sort_unstable();
        out.push(SlotRange {
            start,
            end,
            primary,
            replicas,
        });
    }
    out.sort();
    Ok(out)
}

/// A Redis Cluster of 3 primaries and 3 replicas, one replica per primary.
pub struct RedisCluster {
    nodes: Vec<Node>,
    /// The slot map last seen consistent (at start and after each failover).
    slots: Mutex<Vec<SlotRange>>,
}

impl RedisCluster {
    /// Starts 6 cluster nodes, creates the cluster (as `redis-cli --cluster
    /// create ... --cluster-replicas 1` would) and waits until every node is `ok`, all
    /// 16384 slots are assigned, all nodes agree on the slot map and the roles,
    /// and each primary has one replica that is in sync.
    pub fn start() -> Self {
        Self::start_with_node_timeout(NODE_TIMEOUT_MS)
    }

    /// [`RedisCluster::start`] with another `--cluster-node-timeout`: larger
    /// for tests that freeze a primary briefly and want no failover.
    pub fn start_with_node_timeout(node_timeout_ms: u64) -> Self {
        Self::start_with(node_timeout_ms, 1)
    }

    /// 3 primaries without replicas (`--cluster-replicas 0`), otherwise as
    /// [`RedisCluster::start`]: what cluster mode costs, apart from
    /// replication, in benchmarks.
    pub fn start_without_replicas() -> Self {
        Self::start_with(NODE_TIMEOUT_MS, 0)
    }

    fn start_with(node_timeout_ms: u64, replicas: usize) -> Self {
        // Spawned one after the other; each is up in a few milliseconds.
        let nodes: Vec<Node> = (1..=3 * (1 + replicas))
            .map(|i| {
                Node::start(&format!("cluster node {i}"), true, &|p, dir| {
                    let mut argv = base_args(p.port, dir, "notice");
                    let bus = p.bus.expect("bus port").to_string();
                    let timeout = node_timeout_ms.to_string();
                    argv.extend(
                        [
                            "--cluster-enabled",
                            "yes",
                            "--cluster-config-file",
                            "nodes.conf",
                            "--cluster-port",
                            &bus,
                            "--cluster-node-timeout",
                            &timeout,
                            "--cluster-replica-validity-factor",
                            "0",
                            // CLUSTER SLOTS lists a replica only once its
                            // replication offset is not 0, which on an idle
                            // primary takes its first ping to its replicas
                            // (every 10 s by default).
                            "--repl-ping-replica-period",
                            "1",
                        ]
                        .map(OsString::from),
                    );
                    argv
                })
            })
            .collect();
        let cluster = RedisCluster {
            nodes,
            slots: Mutex::new(Vec::new()),
        };
        cluster.create(replicas);
        cluster
    }

    /// Creates the cluster with the cluster commands themselves (what
    /// `redis-cli --cluster create` sends, which a `redis-cli` older than
    /// the server cannot: before 7.0 its `CLUSTER MEET` names no bus port):
    /// every node meets the first, the first three take a third of the slots
    /// each, and each of the others replicates one of them.
    fn create(&self, replicas: usize) {
        let first = &self.nodes[0];
        for node in &self.nodes[1..] {
            let port = node.port().to_string();
            let bus = node.bus_port().expect("bus port").to_string();
            let _: String = first.cmd(&["CLUSTER", "MEET", "127.0.0.1", &port, &bus]);
        }
        self.wait_until("every node to know every other", |c| {
            for node in &c.nodes {
                let known = parse_cluster_nodes(&node.cmd::<String>(&["CLUSTER", "NODES"]));
                if known.len() < c.nodes.len() {
                    return Err(format!("{node:?} knows {} nodes", known.len()));
                }
            }
            Ok(())
        });
        let primaries = &self.nodes[..3];
        for (i, node) in primaries.iter().enumerate() {
            let from = (SLOTS as usize * i / 3).to_string();
            let to = (SLOTS as usize * (i + 1) / 3 - 1).to_string();
            let _: String = node.cmd(&["CLUSTER", "ADDSLOTSRANGE", &from, &to]);
        }
        for (i, node) in self.nodes[3..].iter().enumerate().take(3 * replicas) {
            let primary = self.id_of(&primaries[i % 3]);
            // The replica must know the primary as one first (the slots'
            // news travels by gossip).
            self.wait_until("a replica to see its primary's slots", |_| {
                node.try_cmd::<String>(&["CLUSTER", "REPLICATE", &primary])
                    .map_err(|e| e.to_string())
            });
        }
        let map = self.wait_until("the new cluster to be ready", |c| {
            c.ready_view(if replicas > 0 { 3 } else { 0 })
        });
        *self.slots.lock().unwrap_or_else(|e| e.into_inner()) = map;
    }

    /// Polls `check` until it returns `Ok`, at most [`WAIT_LIMIT`]; panics with
    /// its last complaint, the nodes' views and the tails of their logs.
    fn wait_until<T>(&self, what: &str, check: impl Fn(&Self) -> Result<T, String>) -> T {
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            match check(self) {
                Ok(v) => return v,
                Err(why) if Instant::now() > deadline => {
                    let mut report = String::new();
                    for n in &self.nodes {
                        let view = if n.is_up() {
                            n.try_cmd::<String>(&["CLUSTER", "NODES"])
                                .unwrap_or_else(|e| e.to_string())
                        } else {
                            "(down)".to_string()
                        };
                        report.push_str(&format!(
                            "--- {n:?}\n{view}\n{}\n",
                            super::node::log_tail(&super::node::log_path(n.dir()), 8)
                        ));
                    }
                    panic!("timed out after {WAIT_LIMIT:?} waiting for {what}: {why}\n{report}");
                }
                Err(_) => std::thread::sleep(POLL),
            }
        }
    }

    /// Ok with the slot map once every node that is up says `cluster_state:ok`
    /// with all slots assigned and none failing, all agree on `CLUSTER SLOTS`
    /// and on every node's role in `CLUSTER NODES`, none flags a node that is
    /// up as failing, `want_replicated` primaries (at least) have a replica,
    /// every replica that is up is listed under its primary in `CLUSTER SLOTS`,
    /// and every replica's link to its primary is up.
    fn ready_view(&self, want_replicated: usize) -> Result<Vec<SlotRange>, String> {
        let up: Vec<&Node> = self.nodes.iter().filter(|n| n.is_up()).collect();
        let mut first: Option<(Vec<SlotRange>, Vec<NodeLine>)> = None;
        // One connection per node and poll.
        let mut conns = Vec::new();
        for n in &up {
            let mut conn = n.try_conn().map_err(|e| format!("{n:?}: {e}"))?;
            let mut q = |args: &[&str]| -> Result<redis::Value, String> {
                redis::cmd(args[0])
                    .arg(&args[1..])
                    .query(&mut conn)
                    .map_err(|e| format!("{n:?}: {args:?}: {e}"))
            };
            let info: String =
                redis::from_redis_value(q(&["CLUSTER", "INFO"])?).map_err(|e| e.to_string())?;
            for (field, want) in [
                ("cluster_state", "ok".to_string()),
                ("cluster_slots_assigned", SLOTS.to_string()),
                ("cluster_slots_ok", SLOTS.to_string()),
            ] {
                let got = super::node::info_field(&info, field).unwrap_or("?");
                if got != want {
                    return Err(format!("{n:?} says {field}:{got}"));
                }
            }
            let slots = parse_cluster_slots(q(&["CLUSTER", "SLOTS"])?)
                .map_err(|e| format!("{n:?}: CLUSTER SLOTS: {e}"))?;
            let covered: u32 = slots
                .iter()
                .map(|r| u32::from(r.end) - u32::from(r.start) + 1)
                .sum();
            if covered != SLOTS {
                return Err(format!("{n:?}: CLUSTER SLOTS covers {covered} slots"));
            }
            // Roles as every node sees them: id, primary or replica (and of
            // whom), slots. Flags like `myself` and links differ by design.
            let mut roles = parse_cluster_nodes(
                &redis::from_redis_value::<String>(q(&["CLUSTER", "NODES"])?)
                    .map_err(|e| e.to_string())?,
            );
            // A node that is up must not be flagged failing by anyone (the
            // flag is cleared a ping after the node's new role is known).
            if let Some(l) = roles.iter().find(|l| {
                (l.has("fail") || l.has("fail?")) && up.iter().any(|u| u.port() == l.port)
            }) {
                return Err(format!("{n:?} flags {} as {:?}", l.port, l.flags));
            }
            for l in &mut roles {
                l.flags.retain(|f| f == "master" || f == "slave");
                l.link.clear();
            }
            roles.sort_by(|a, b| a.id.cmp(&b.id));
            match &first {
                None => first = Some((slots, roles)),
                Some((s, r)) if *s == slots && *r == roles => {}
                Some(_) => return Err(format!("{n:?} disagrees with {:?}", up[0])),
            }
            conns.push(conn);
        }
        let (slots, roles) = first.ok_or("no node is up")?;
        // The live primaries and replicas agree with the processes.
        let replicated = slots.iter().filter(|r| !r.replicas.is_empty()).count();
        if replicated < want_replicated {
            return Err(format!(
                "{replicated} of the slot ranges have a replica: {slots:?}"
            ));
        }
        for (n, conn) in up.iter().zip(&mut conns) {
            let line = roles
                .iter()
                .find(|l| l.port == n.port())
                .ok_or_else(|| format!("{n:?} is not in the cluster"))?;
            if line.has("slave") {
                // `CLUSTER SLOTS` lists a replica only once it is not flagged
                // failing and its replication offset, as gossiped, is not 0:
                // a replica that just synced is missing from it for a while.
                let primary = line
                    .master
                    .as_ref()
                    .and_then(|id| roles.iter().find(|l| &l.id == id))
                    .map(|l| l.port);
                if let Some(range) = slots.iter().find(|r| Some(r.primary) == primary)
                    && !range.replicas.contains(&n.port())
                {
                    return Err(format!(
                        "{n:?} replicates {primary:?} but CLUSTER SLOTS leaves it out: {slots:?}"
                    ));
                }
                let repl: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(conn)
                    .map_err(|e| format!("{n:?}: {e}"))?;
                let link = super::node::info_field(&repl, "master_link_status");
                let syncing = super::node::info_field(&repl, "master_sync_in_progress");
                if link != Some("up") || syncing != Some("0") {
                    return Err(format!(
                        "{n:?}: master_link_status:{link:?} master_sync_in_progress:{syncing:?}"
                    ));
                }
            }
        }
        Ok(slots)
    }

    /// `per_primary` clients named `{name}:{i}` whose buckets, as `limiter`
    /// keeps them (behind its policy's name, for its first quota), live on
    /// each primary, in turn, with the port of their primary.
    #[allow(dead_code)]
    pub fn limiter_clients_on_every_primary(
        &self,
        limiter: &tollgate::RateLimiter,
        name: &str,
        per_primary: usize,
    ) -> Vec<(String, u16)> {
        let store = limiter.store().as_redis().expect("a Redis limiter");
        let quota = limiter.quotas()[0];
        let policy = limiter.policy().name().to_owned();
        self.clients_where(store, &quota, name, per_primary, |client| {
            format!("{policy}:{client}")
        })
    }

    /// `per_primary` clients named `{name}:{i}` whose buckets (for `quota`,
    /// keyed by `store`) live on each primary, in turn (one of each primary,
    /// then the next of each...), with the port of their primary.
    pub fn clients_on_every_primary(
        &self,
        store: &tollgate::RedisStore,
        quota: &tollgate::Quota,
        name: &str,
        per_primary: usize,
    ) -> Vec<(String, u16)> {
        self.clients_where(store, quota, name, per_primary, str::to_owned)
    }

    /// The clients of `clients_on_every_primary`, each stored under
    /// `stored(client)`.
    fn clients_where(
        &self,
        store: &tollgate::RedisStore,
        quota: &tollgate::Quota,
        name: &str,
        per_primary: usize,
        stored: impl Fn(&str) -> String,
    ) -> Vec<(String, u16)> {
        let primaries: Vec<u16> = self.primaries().iter().map(Node::port).collect();
        let mut found: BTreeMap<u16, Vec<String>> = BTreeMap::new();
        for i in 0.. {
            let client = format!("{name}:{i}");
            let owner = self
                .primary_for_key(&store.bucket_key(&stored(&client), quota))
                .port();
            let list = found.entry(owner).or_default();
            if list.len() < per_primary {
                list.push(client);
            }
            if primaries
                .iter()
                .all(|p| found.get(p).is_some_and(|l| l.len() == per_primary))
            {
                break;
            }
        }
        (0..per_primary)
            .flat_map(|i| {
                primaries
                    .iter()
                    .map(|p| (found[p][i].clone(), *p))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// A builder of a store on the cluster (its seeds) with a key prefix and a
    /// timeout generous for a busy 2-core machine (5 s); tests add what else
    /// they need before `build`.
    #[cfg(feature = "cluster")]
    pub fn store_builder(&self, prefix: &str) -> tollgate::store::RedisStoreBuilder {
        tollgate::RedisStore::builder()
            .leases(false)
            .cluster(self.seed_urls())
            .prefix(prefix)
            .timeout(Duration::from_secs(5))
    }

    /// A store on the cluster with its own connections: `store_builder`, built.
    #[cfg(feature = "cluster")]
    pub fn store(&self, prefix: &str) -> tollgate::RedisStore {
        self.store_builder(prefix).build().expect("cluster store")
    }

    /// `redis://127.0.0.1:PORT` of every node, primaries and replicas, in start
    /// order: seeds for a cluster client.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// All 6 nodes in start order, whatever their role or state.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node on `port`.
    pub fn node(&self, port: u16) -> Node {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node of this cluster on port {port}"))
            .clone()
    }

    /// `CLUSTER NODES` as one node that is up sees it.
    pub fn view(&self) -> Vec<NodeLine> {
        let n = self.any_up();
        parse_cluster_nodes(&n.cmd::<String>(&["CLUSTER", "NODES"]))
    }

    fn any_up(&self) -> Node {
        self.nodes
            .iter()
            .find(|n| n.is_up())
            .expect("every node of the cluster is down or frozen")
            .clone()
    }

    /// The running primaries that own slots, as a node that is up sees them,
    /// by port.
    pub fn primaries(&self) -> Vec<Node> {
        self.by_role(|l| l.has("master") && !l.slots.is_empty())
    }

    /// The running replicas, as a node that is up sees them, by port.
    pub fn replicas(&self) -> Vec<Node> {
        self.by_role(|l| l.has("slave"))
    }

    fn by_role(&self, keep: impl Fn(&NodeLine) -> bool) -> Vec<Node> {
        let mut out: Vec<Node> = self
            .view()
            .iter()
            .filter(|l| keep(l))
            .map(|l| self.node(l.port))
            .filter(Node::is_alive)
            .collect();
        out.sort_by_key(Node::port);
        out
    }

    /// The slot of a key (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &str) -> u16 {
        self.any_up().cmd(&["CLUSTER", "KEYSLOT", key])
    }

    /// The slot map (`CLUSTER SLOTS` of a node that is up).
    pub fn slots(&self) -> Vec<SlotRange> {
        parse_cluster_slots(self.any_up().cmd(&["CLUSTER", "SLOTS"])).expect("CLUSTER SLOTS")
    }

    /// The primary serving `key`'s slot now (`CLUSTER KEYSLOT` + `CLUSTER SLOTS`).
    pub fn primary_for_key(&self, key: &str) -> Node {
        let slot = self.keyslot(key);
        let range = self
            .slots()
            .into_iter()
            .find(|r| r.start <= slot && slot <= r.end)
            .unwrap_or_else(|| panic!("slot {slot} is not assigned"));
        self.node(range.primary)
    }

    /// The primary that serves `slot` now.
    pub fn primary_for_slot(&self, slot: u16) -> Node {
        let range = self
            .slots()
            .into_iter()
            .find(|r| r.start <= slot && slot <= r.end)
            .unwrap_or_else(|| panic!("slot {slot} is not assigned"));
        self.node(range.primary)
    }

    /// Moves `slot` to the primary `to`, as `redis-cli --cluster reshard`
    /// does: `IMPORTING` on `to`, `MIGRATING` on its owner, every key of the
    /// slot moved with `MIGRATE`, then `SETSLOT .. NODE` on both and on every
    /// other primary; waits until every node agrees. Clients that hold the
    /// old slot map get `ASK` meanwhile and `MOVED` after.
    pub fn move_slot(&self, slot: u16, to: &Node) {
        let from = self.open_slot_move(slot, to);
        loop {
            let keys: Vec<String> =
                from.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"]);
            if keys.is_empty() {
                break;
            }
            self.migrate_keys(&from, to, &keys);
        }
        self.close_slot_move(slot, &from, to);
    }

    /// The first step of [`move_slot`](Self::move_slot): `slot` `IMPORTING`
    /// on `to` and `MIGRATING` on its owner, which is returned. Its keys stay
    /// where they are until [`migrate_keys`](Self::migrate_keys).
    pub fn open_slot_move(&self, slot: u16, to: &Node) -> Node {
        let from = self.primary_for_slot(slot);
        assert_ne!(&from, to, "slot {slot} is on {to:?} already");
        let s = slot.to_string();
        let _: () = to.cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &self.id_of(&from)]);
        let _: () = from.cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &self.id_of(to)]);
        from
    }

    /// Moves `keys` from `from` to `to` with `MIGRATE`.
    pub fn migrate_keys(&self, from: &Node, to: &Node, keys: &[String]) {
        let port = to.port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        let _: redis::Value = from.cmd(&args);
    }

    /// The last step of [`move_slot`](Self::move_slot): `SETSLOT .. NODE` on
    /// `to`, `from` and every other primary; waits until every node agrees.
    pub fn close_slot_move(&self, slot: u16, from: &Node, to: &Node) {
        let (s, to_id) = (slot.to_string(), self.id_of(to));
        let _: () = to.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        let _: () = from.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        for p in self.primaries() {
            if p != *from && p != *to {
                let _: () = p.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
            }
        }
        self.wait_until_consistent();
    }

    /// The node id of `node`.
    pub fn id_of(&self, node: &Node) -> String {
        self.view()
            .into_iter()
            .find(|l| l.port == node.port())
            .unwrap_or_else(|| panic!("{node:?} is not in the cluster"))
            .id
    }

    /// `DBSIZE` of every primary, by port.
    pub fn keys_per_primary(&self) -> BTreeMap<u16, u64> {
        self.primaries()
            .iter()
            .map(|n| (n.port(), n.cmd(&["DBSIZE"])))
            .collect()
    }

    /// The keys (`KEYS *`) of every primary, by port, sorted.
    pub fn key_names_per_primary(&self) -> BTreeMap<u16, Vec<String>> {
        self.primaries()
            .iter()
            .map(|n| {
                let mut keys: Vec<String> = n.cmd(&["KEYS", "*"]);
                keys.sort();
                (n.port(), keys)
            })
            .collect()
    }

    /// Zeroes `INFO commandstats` on every node that is up.
    pub fn reset_stats_all(&self) {
        for n in self.nodes.iter().filter(|n| n.is_up()) {
            n.reset_stats();
        }
    }

    /// `calls` of `command` summed over every node that is up. Replicas count
    /// the writes they apply from their primary (`set`, `pexpire`, ... but not
    /// `evalsha`: scripts replicate as their effects): see
    /// [`RedisCluster::calls_primaries`].
    pub fn calls_all(&self, command: &str) -> u64 {
        self.nodes
            .iter()
            .filter(|n| n.is_up())
            .map(|n| n.calls(command))
            .sum()
    }

    /// `calls` of `command` summed over the primaries.
    pub fn calls_primaries(&self, command: &str) -> u64 {
        self.primaries()
            .iter()
            .filter(|n| n.is_up())
            .map(|n| n.calls(command))
            .sum()
    }

    /// Kills (SIGKILL) the primary serving `key` and returns it.
    pub fn kill_primary_for_key(&self, key: &str) -> Node {
        let node = self.primary_for_key(key);
        node.kill();
        node
    }

    /// Waits until a replica has taken over the slots `old` served (after
    /// `old` was killed or frozen) and the cluster is `ok` on every node that
    /// is up, all agreeing; returns the new primary. Panics after a bounded
    /// wait, with the nodes' views and logs.
    pub fn wait_for_failover(&self, old: &Node) -> Node {
        let before = self.slots.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let served = before
            .iter()
            .find(|r| r.primary == old.port())
            .unwrap_or_else(|| panic!("{old:?} served no slots when last seen: {before:?}"))
            .start;
        let map = self.wait_until(&format!("a failover of {old:?}"), |c| {
            let map = c.ready_view(0)?;
            let owner = map
                .iter()
                .find(|r| r.start <= served && served <= r.end)
                .map(|r| r.primary)
                .ok_or("slot unassigned")?;
            if owner == old.port() {
                return Err(format!("slot {served} still belongs to {old:?}"));
            }
            let role: Vec<redis::Value> = c
                .node(owner)
                .try_cmd(&["ROLE"])
                .map_err(|e| e.to_string())?;
            match role.first() {
                Some(redis::Value::BulkString(b)) if b == b"master" => Ok(map),
                other => Err(format!("port {owner} says ROLE {other:?}")),
            }
        });
        let range = map
            .iter()
            .find(|r| r.start <= served && served <= r.end)
            .expect("checked above");
        let new = self.node(range.primary);
        *self.slots.lock().unwrap_or_else(|e| e.into_inner()) = map;
        new
    }

    /// Waits until the cluster is consistent again, e.g. after a killed node
    /// was restarted and rejoined as a replica; returns the slot map.
    pub fn wait_until_consistent(&self) -> Vec<SlotRange> {
        let map = self.wait_until("the cluster to be consistent", |c| c.ready_view(0));
        *self.slots.lock().unwrap_or_else(|e| e.into_inner()) = map.clone();
        map
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        // Thawed and killed now, even if a test still holds Node clones.
        for n in &self.nodes {
            n.kill();
        }
    }
}
