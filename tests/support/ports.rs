//! Loopback ports for test servers, handed out without races inside a process
//! and made unlikely between processes.
//!
//! The old way (bind port 0, read the port, close, let redis-server bind it
//! later) has two holes: two tests of one process could be handed the same port
//! before either server bound it, and a port freed by a killed server could be
//! handed to another test before `restart()` bound it again. Here:
//!
//! - a process-wide registry holds every port handed out until its owner is
//!   dropped (a stopped but restartable server keeps its port), and nothing in
//!   the registry is ever handed out again;
//! - ports are drawn at random from below the kernel's ephemeral range
//!   (`/proc/sys/net/ipv4/ip_local_port_range`, 32768-60999 by default), so the
//!   thousands of outgoing client connections the tests make never take a
//!   server's port, and parallel test processes (cargo-nextest) rarely draw the
//!   same one;
//! - a port is only handed out if it can be bound right now;
//! - what is left (another process binding the port between the check and
//!   redis-server's own bind) is handled by the callers: `start` retries on a
//!   fresh port when redis-server says "Address already in use", `restart`
//!   retries the same port for a while (see `node::start_process`).

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::{Mutex, OnceLock};

static RESERVED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Ports drawn at random come from here (inclusive), or from port 0 when the
/// machine leaves no room outside the ephemeral range (`None`).
pub fn random_range() -> Option<(u16, u16)> {
    static RANGE: OnceLock<Option<(u16, u16)>> = OnceLock::new();
    *RANGE.get_or_init(|| {
        let (lo, hi) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| {
                let mut it = s.split_whitespace().map(|n| n.parse::<u32>().ok());
                Some((it.next()??, it.next()??))
            })?;
        // At least 2000 ports on one side, staying clear of the well-known and
        // commonly configured ports below 10000.
        if lo >= 12_000 {
            Some((10_000, u16::try_from(lo - 1).ok()?))
        } else if hi <= 63_535 {
            Some((u16::try_from(hi + 1).ok()?, 65_535))
        } else {
            None
        }
    })
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // Every RandomState has fresh keys: a different hash for the same input.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.finish()
}

fn candidate() -> u16 {
    match random_range() {
        Some((lo, hi)) => lo + (random_u64() % (u64::from(hi - lo) + 1)) as u16,
        None => TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port"),
    }
}

/// A loopback port no live or restartable server of this process holds and that
/// could be bound a moment ago. It stays reserved until [`release`].
pub fn reserve() -> u16 {
    for _ in 0..10_000 {
        let port = candidate();
        let mut reserved = RESERVED.lock().unwrap_or_else(|e| e.into_inner());
        if reserved.contains(&port) {
            continue;
        }
        // Bound and closed at once: redis-server binds it with SO_REUSEADDR too,
        // so the closed listener leaves nothing in its way.
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        reserved.insert(port);
        return port;
    }
    panic!("no free loopback port found in 10000 tries");
}

/// Gives a port back once its server is gone for good.
pub fn release(port: u16) {
    RESERVED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&port);
}

/// Whether a port is reserved now (for tests of the harness).
pub fn is_reserved(port: u16) -> bool {
    RESERVED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&port)
}
