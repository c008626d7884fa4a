//! The faults the nemesis injects, by kind.

use std::fmt;
use std::time::Duration;

use super::rng::Rng;

/// A fault the nemesis injects into the servers or the proxy in front.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// `FLUSHALL` on the primary: every bucket and hold is gone.
    Flushall,
    /// The primary killed and started again, empty (no persistence).
    Restart,
    /// The primary stopped (`SIGSTOP`) this long, then continued.
    Freeze(Duration),
    /// Every connection through the proxy closed at once.
    Cut,
    /// Every connection through the proxy silently carries nothing more.
    Blackhole,
    /// This long, every script reply is lost after Redis ran the call.
    LoseReplies(Duration),
    /// The replica promoted (`REPLICAOF NO ONE`) and the proxy moved to it.
    /// Without the last writes, replication stops `lag` before the move and
    /// the old primary's writes meanwhile are lost.
    Failover { last_writes: bool, lag: Duration },
}

impl Fault {
    /// The name a summary and `FAULT_KINDS` use.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Flushall => "flushall",
            Fault::Restart => "restart",
            Fault::Freeze(_) => "freeze",
            Fault::Cut => "cut",
            Fault::Blackhole => "blackhole",
            Fault::LoseReplies(_) => "lost-replies",
            Fault::Failover {
                last_writes: true, ..
            } => "failover",
            Fault::Failover { .. } => "failover-lossy",
        }
    }

    /// Whether the buckets may be lost (a fresh bucket afterwards). Any
    /// failover counts: the checker does not trust replication to be
    /// complete.
    pub fn loses_data(&self) -> bool {
        self.empties() || matches!(self, Fault::Failover { .. })
    }

    /// Whether the buckets are certainly gone.
    pub fn empties(&self) -> bool {
        matches!(self, Fault::Flushall | Fault::Restart)
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Freeze(d) | Fault::LoseReplies(d) => {
                write!(f, "{}({:.2}s)", self.kind(), d.as_secs_f64())
            }
            Fault::Failover {
                last_writes: false,
                lag,
            } => write!(f, "{}({:.2}s)", self.kind(), lag.as_secs_f64()),
            _ => f.write_str(self.kind()),
        }
    }
}

/// Every fault kind, by name.
pub const FAULT_KINDS: [&str; 8] = [
    "flushall",
    "restart",
    "freeze",
    "cut",
    "blackhole",
    "lost-replies",
    "failover",
    "failover-lossy",
];

/// A fault of kind `kind` (one of [`FAULT_KINDS`]), its durations drawn.
pub fn fault_of(rng: &mut Rng, kind: &str) -> Fault {
    let secs = |rng: &mut Rng, lo: f64, hi: f64| Duration::from_secs_f64(rng.uniform(lo, hi));
    match kind {
        "flushall" => Fault::Flushall,
        "restart" => Fault::Restart,
        "freeze" => Fault::Freeze(secs(rng, 0.1, 2.0)),
        "cut" => Fault::Cut,
        "blackhole" => Fault::Blackhole,
        "lost-replies" => Fault::LoseReplies(secs(rng, 0.05, 0.3)),
        "failover" => Fault::Failover {
            last_writes: true,
            lag: Duration::ZERO,
        },
        "failover-lossy" => Fault::Failover {
            last_writes: false,
            lag: secs(rng, 0.05, 0.5),
        },
        other => panic!("unknown fault kind {other:?} (known: {FAULT_KINDS:?})"),
    }
}
