//! The test harness itself, against real servers: ports handed out without
//! races. Only redis-cli and plain synchronous redis-rs connections.
#![cfg(feature = "redis")]

mod support;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use support::RedisServer;
use support::node::{self, Probe};
use support::ports;

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
                let other = std::process::Command::new("redis-server")
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
