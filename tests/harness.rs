//! The test harness itself, against real servers: ports handed out without
//! races, Redis Cluster, Sentinel and TLS. Only redis-cli and plain synchronous
//! redis-rs connections: the harness needs none of redis-rs's cluster,
//! sentinel or TLS support (the store's own tests use those features).
#![cfg(feature = "redis")]

mod support;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use support::RedisServer;
use support::cluster::RedisCluster;
use support::node::{self, Probe};
use support::ports;
use support::sentinel::SentinelSet;
use support::tls::TlsRedis;

fn pid_of(port: u16) -> u32 {
    Probe::Plain.pid(port).expect("INFO server")
}

#[test]
fn ports_twenty_servers_started_at_once_get_distinct_ports_and_all_answer() {
    let servers: Vec<RedisServer> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..20).map(|_| s.spawn(RedisServer::start)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ports: BTreeSet<u16> = servers.iter().map(RedisServer::port).collect();
    assert_eq!(ports.len(), 20, "{ports:?}");
    // Each port is answered by its own process.
    let pids: BTreeSet<u32> = servers.iter().map(|s| pid_of(s.port())).collect();
    assert_eq!(pids.len(), 20);
    for s in &servers {
        assert!(ports::is_reserved(s.port()));
        let pong: String = s.cmd(&["PING"]);
        assert_eq!(pong, "PONG");
        // Outside the kernel's ephemeral range: client connections never take it.
        if let Some((lo, hi)) = ports::random_range() {
            assert!((lo..=hi).contains(&s.port()), "port {}", s.port());
        }
    }
    drop(servers);
    for p in ports {
        assert!(!ports::is_reserved(p), "port {p} still reserved after drop");
    }
}

#[test]
fn ports_restart_keeps_the_port_and_starts_empty() {
    let mut server = RedisServer::start();
    let port = server.port();
    let _: () = server.cmd(&["SET", "k", "v"]);
    let before = pid_of(port);
    server.restart();
    assert_eq!(server.port(), port);
    assert!(ports::is_reserved(port));
    assert_ne!(pid_of(port), before, "a new process");
    let v: Option<String> = server.cmd(&["GET", "k"]);
    assert_eq!(v, None);
    // Stopped, the port stays reserved: nobody else is handed it.
    server.stop();
    assert!(ports::is_reserved(port));
    server.restart();
    let pong: String = server.cmd(&["PING"]);
    assert_eq!(pong, "PONG");
}

/// A restart whose port another process holds for a moment waits for it.
#[test]
fn ports_restart_waits_while_another_process_holds_the_port() {
    let mut server = RedisServer::start();
    let port = server.port();
    server.stop();
    let squatter = TcpListener::bind(("127.0.0.1", port)).expect("the stopped server's port");
    let released = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        let at = Instant::now();
        drop(squatter);
        at
    });
    server.restart();
    let up = Instant::now();
    assert!(
        up >= released.join().unwrap(),
        "started before the port was free"
    );
    assert_eq!(server.port(), port);
    let pong: String = server.cmd(&["PING"]);
    assert_eq!(pong, "PONG");
}

/// A restart whose port stays taken gives up with a message that says so.
#[test]
fn ports_restart_fails_clearly_when_the_port_stays_taken() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, ports, argv) =
        node::start_process("squatted server", dir.path(), false, &Probe::Plain, &|p| {
            support::base_args(p.port, dir.path(), "warning")
        });
    node::kill_child(&mut child);
    let _squatter = TcpListener::bind(("127.0.0.1", ports.port)).expect("the killed server's port");
    let t = Instant::now();
    let panic = std::panic::catch_unwind(|| {
        node::restart_process_within(
            "squatted server",
            dir.path(),
            ports,
            &Probe::Plain,
            &argv,
            Duration::from_millis(500),
        )
    })
    .expect_err("restart on a taken port");
    assert!(t.elapsed() >= Duration::from_millis(500));
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "squatted server cannot restart on its port {}",
            ports.port
        )),
        "{message}"
    );
    assert!(message.contains("another process has held it"), "{message}");
    assert!(message.contains("Address already in use"), "{message}");
    ports.release();
}

/// When another process's redis-server takes the port between its reservation
/// and our bind, our server exits ("Address already in use"), the other one
/// answers on the port but is not taken for ours (its pid differs), and ours
/// starts again on a fresh port.
#[test]
fn ports_start_moves_to_a_fresh_port_when_another_server_took_it() {
    let dir = tempfile::tempdir().unwrap();
    let intruder: Mutex<Option<std::process::Child>> = Mutex::new(None);
    let attempts: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let (mut child, ports, _) =
        node::start_process("raced server", dir.path(), false, &Probe::Plain, &|p| {
            let mut attempts = attempts.lock().unwrap();
            attempts.push(p.port);
            if attempts.len() == 1 {
                // Another process binds the port first.
                let other = std::process::Command::new(support::bins::redis_server())
                    .args(["--port", &p.port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no"])
                    .current_dir(dir.path())
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                let deadline = Instant::now() + Duration::from_secs(10);
                while Probe::Plain.pid(p.port) != Ok(other.id()) {
                    assert!(Instant::now() < deadline, "the intruder never came up");
                    std::thread::sleep(Duration::from_millis(10));
                }
                *intruder.lock().unwrap() = Some(other);
            }
            support::base_args(p.port, dir.path(), "warning")
        });
    let attempts = attempts.into_inner().unwrap();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(ports.port, attempts[1]);
    assert_ne!(attempts[0], attempts[1]);
    assert_eq!(pid_of(ports.port), child.id());
    node::kill_child(&mut child);
    node::kill_child(intruder.lock().unwrap().as_mut().unwrap());
    ports.release();
}

#[test]
fn ports_cluster_enabled_server_gets_a_reserved_bus_port() {
    let server = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let slot: i64 = server.cmd(&["CLUSTER", "KEYSLOT", "a"]);
    assert_eq!(slot, 15495);
    let nodes: String = server.cmd(&["CLUSTER", "NODES"]);
    let bus: u16 = nodes
        .split_once('@')
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .expect("ip:port@cport");
    assert_ne!(bus, server.port());
    assert!(ports::is_reserved(bus));
}

#[test]
fn cluster_starts_with_all_slots_and_three_primaries_each_with_a_synced_replica() {
    let t = Instant::now();
    let cluster = RedisCluster::start();
    eprintln!("cluster ready in {:?}", t.elapsed());

    assert_eq!(cluster.seed_urls().len(), 6);
    assert!(
        cluster
            .seed_urls()
            .iter()
            .all(|u| u.starts_with("redis://127.0.0.1:"))
    );
    let slots = cluster.slots();
    assert_eq!(slots.len(), 3, "{slots:?}");
    assert_eq!(slots[0].start, 0);
    assert_eq!(slots[2].end, 16383);
    assert!(slots.windows(2).all(|w| w[0].end + 1 == w[1].start));
    let primaries = cluster.primaries();
    let replicas = cluster.replicas();
    assert_eq!(primaries.len(), 3);
    assert_eq!(replicas.len(), 3);
    let primary_ports: BTreeSet<u16> = primaries.iter().map(|n| n.port()).collect();
    let served: BTreeSet<u16> = slots.iter().map(|r| r.primary).collect();
    assert_eq!(primary_ports, served);
    // One replica per primary, each linked to it.
    let mut masters_of_replicas = BTreeSet::new();
    for r in &replicas {
        let repl = r.info("replication");
        assert_eq!(repl["role"], "slave");
        assert_eq!(repl["master_link_status"], "up");
        masters_of_replicas.insert(repl["master_port"].parse::<u16>().unwrap());
    }
    assert_eq!(masters_of_replicas, primary_ports);
    for r in &slots {
        assert_eq!(r.replicas.len(), 1, "{r:?}");
    }

    // primary_for_key names the node that takes the key without a redirect;
    // the others answer MOVED.
    cluster.reset_stats_all();
    let keys: Vec<String> = (0..30)
        .map(|i| format!("tollgate:{{client{i}}}:k"))
        .collect();
    for key in &keys {
        let owner = cluster.primary_for_key(key);
        let _: () = owner.cmd(&["SET", key, "1"]);
        for other in primaries.iter().filter(|n| **n != owner) {
            let err = other.try_cmd::<()>(&["SET", key, "1"]).unwrap_err();
            assert!(
                err.to_string().to_ascii_uppercase().contains("MOVED"),
                "{err}"
            );
        }
    }
    let per_primary = cluster.keys_per_primary();
    assert_eq!(per_primary.values().sum::<u64>(), keys.len() as u64);
    assert!(per_primary.values().all(|n| *n > 0), "{per_primary:?}");
    assert_eq!(cluster.calls_primaries("set"), keys.len() as u64);
    // The replicas applied the same writes.
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.calls_all("set") != 2 * keys.len() as u64 {
        assert!(Instant::now() < deadline, "replicas never caught up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn cluster_without_replicas_has_three_primaries_serving_every_slot() {
    let cluster = RedisCluster::start_without_replicas();
    assert_eq!(cluster.seed_urls().len(), 3);
    assert!(cluster.replicas().is_empty());
    let slots = cluster.slots();
    assert_eq!(slots.len(), 3, "{slots:?}");
    assert_eq!(slots[0].start, 0);
    assert_eq!(slots[2].end, 16383);
    assert!(slots.windows(2).all(|w| w[0].end + 1 == w[1].start));
    assert!(slots.iter().all(|r| r.replicas.is_empty()), "{slots:?}");
    let primaries: BTreeSet<u16> = cluster.primaries().iter().map(|n| n.port()).collect();
    assert_eq!(primaries.len(), 3);
    assert_eq!(primaries, slots.iter().map(|r| r.primary).collect());
    for p in cluster.primaries() {
        assert_eq!(p.info("replication")["connected_slaves"], "0");
    }
}

#[test]
fn cluster_failover_after_killing_a_primary() {
    let cluster = RedisCluster::start();
    let key = "tollgate:{failover}:k";
    let _: () = cluster.primary_for_key(key).cmd(&["SET", key, "1"]);
    let old = cluster.primary_for_key(key);
    // Its replica, which must take over.
    let heir = cluster
        .replicas()
        .into_iter()
        .find(|r| r.info("replication")["master_port"] == old.port().to_string())
        .expect("a replica of the primary");
    let acked: i64 = old.cmd(&["WAIT", "1", "5000"]);
    assert_eq!(acked, 1, "the replica never acknowledged the write");

    let killed = cluster.kill_primary_for_key(key);
    assert_eq!(killed, old);
    assert!(!old.is_alive());
    let t = Instant::now();
    let new = cluster.wait_for_failover(&old);
    eprintln!("cluster failover in {:?}", t.elapsed());
    assert_eq!(new, heir);
    assert_eq!(cluster.primary_for_key(key), new);
    assert_eq!(cluster.primaries().len(), 3);
    assert!(!cluster.primaries().contains(&old));
    let v: String = new.cmd(&["GET", key]);
    assert_eq!(v, "1", "the replica had the write");
    let _: () = new.cmd(&["SET", key, "2"]);

    // The old primary comes back as a replica of the new one.
    old.restart();
    let map = cluster.wait_until_consistent();
    let range = map.iter().find(|r| r.primary == new.port()).unwrap();
    assert_eq!(range.replicas, vec![old.port()]);
}

#[test]
fn sentinel_set_names_its_primary_replica_and_sentinels() {
    let t = Instant::now();
    let set = SentinelSet::start();
    eprintln!("sentinel set ready in {:?}", t.elapsed());

    assert_eq!(set.sentinel_urls().len(), 3);
    let primary = set.primary();
    let replica = set.replica();
    assert_eq!(set.current_primary_port(), primary.port());
    assert_eq!(primary, set.data_nodes()[0]);
    assert_eq!(
        replica.info("replication")["master_port"],
        primary.port().to_string()
    );
    for s in set.sentinels() {
        let addr: Vec<String> = s.cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", set.master_name()]);
        assert_eq!(
            addr,
            vec!["127.0.0.1".to_string(), primary.port().to_string()]
        );
    }
    let _: () = primary.cmd(&["SET", "k", "v"]);
    let acked: i64 = primary.cmd(&["WAIT", "1", "5000"]);
    assert_eq!(acked, 1);
    let v: String = replica.cmd(&["GET", "k"]);
    assert_eq!(v, "v");
}

#[test]
fn sentinel_failover_after_killing_the_primary() {
    let set = SentinelSet::start();
    let old = set.current_primary_port();
    let heir = set.replica().port();
    let killed = set.kill_primary();
    assert_eq!(killed, old);
    let t = Instant::now();
    let new = set.wait_for_failover();
    eprintln!("sentinel failover in {:?}", t.elapsed());
    assert_eq!(new, heir);
    assert_eq!(set.current_primary_port(), new);
    assert_eq!(set.primary().port(), new);
    let role: Vec<redis::Value> = set.primary().cmd(&["ROLE"]);
    assert_eq!(role[0], redis::Value::BulkString(b"master".to_vec()));
    let _: () = set.primary().cmd(&["SET", "k", "after"]);
}

#[test]
fn tls_server_answers_with_the_right_ca_and_refuses_the_wrong_one() {
    if !support::bins::has_tls() {
        return support::bins::no_tls(
            "tls_server_answers_with_the_right_ca_and_refuses_the_wrong_one",
        );
    }
    let t = Instant::now();
    let mut server = TlsRedis::start();
    eprintln!("TLS redis-server ready in {:?}", t.elapsed());

    assert_eq!(
        server.url(),
        format!("rediss://127.0.0.1:{}", server.port())
    );
    assert!(server.ca_pem().starts_with(b"-----BEGIN CERTIFICATE-----"));
    assert_eq!(std::fs::read(server.ca_path()).unwrap(), server.ca_pem());
    assert_ne!(server.ca_pem(), server.wrong_ca_pem());
    assert_eq!(server.cmd(&["PING"]), "PONG");

    // Verified against the wrong CA: the handshake fails, nothing reaches Redis.
    server.reset_stats();
    let out = server.cli_with_ca(&server.wrong_ca_path(), &["PING"]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{said}");
    assert!(!said.contains("PONG"), "{said}");
    assert!(said.contains("certificate verify failed"), "{said}");
    assert_eq!(server.calls("ping"), 0);

    // The certificate names localhost too.
    let out = std::process::Command::new(support::bins::redis_cli())
        .arg("--tls")
        .arg("--cacert")
        .arg(server.ca_path())
        .args(["-h", "localhost", "-p", &server.port().to_string(), "PING"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "PONG");

    // No plain-text RESP on the TLS port.
    let plain = redis::Client::open(format!("redis://127.0.0.1:{}", server.port()))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .and_then(|mut c| {
            c.set_read_timeout(Some(Duration::from_secs(2)))?;
            redis::cmd("PING").query::<String>(&mut c)
        });
    assert!(plain.is_err(), "{plain:?}");

    assert_eq!(server.cmd(&["SET", "k", "v"]), "OK");
    assert!(server.try_cmd(&["NOSUCHCOMMAND"]).is_err());
    assert_eq!(server.calls("set"), 1);

    let port = server.port();
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.cmd(&["GET", "k"]), "");
}
