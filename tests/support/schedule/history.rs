//! The record of a schedule: every operation with the local times it was
//! invoked and completed, and what it answered.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What an operation was.
#[derive(Clone, Debug)]
pub enum What {
    /// A check of `cost` on key `key`; `admitted` only when it answered
    /// allowed (an error admits nothing).
    Check {
        key: usize,
        cost: u64,
        admitted: bool,
    },
    /// `RateLimiter::refund` of `amount` tokens.
    Refund { key: usize, amount: u64 },
    /// `RateLimiter::charge` of `amount` tokens.
    Charge { key: usize, amount: u64 },
    /// `RateLimiter::reset` of a key: a fresh bucket.
    Reset { key: usize },
    /// A fault; `loss` when buckets may be lost (a fresh bucket for every
    /// key), `empties` when they certainly are; `held`: the tokens the
    /// instances held unspent just before (what a lost bucket exposes).
    Fault {
        name: &'static str,
        loss: bool,
        empties: bool,
        held: u64,
    },
}

/// One operation. Times are from the history's origin, on this host's
/// monotonic clock: the operation took effect, if at all, somewhere in
/// `[invoke, complete]`, or, when it failed, possibly at any time after
/// `invoke` (a call that timed out may still run).
#[derive(Clone, Debug)]
pub struct Op {
    pub instance: Option<usize>,
    pub invoke: Duration,
    pub complete: Duration,
    /// What a failed operation answered.
    pub error: Option<String>,
    pub what: What,
}

impl Op {
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:8.4} {:8.4} ",
            self.invoke.as_secs_f64(),
            self.complete.as_secs_f64()
        )?;
        match self.instance {
            Some(i) => write!(f, "i{i} ")?,
            None => f.write_str("nemesis ")?,
        }
        match &self.what {
            What::Check {
                key,
                cost,
                admitted,
            } => {
                let answer = if *admitted { "admitted" } else { "refused" };
                write!(f, "check k{key} cost {cost}: {answer}")?;
            }
            What::Refund { key, amount } => write!(f, "refund k{key} {amount}")?,
            What::Charge { key, amount } => write!(f, "charge k{key} {amount}")?,
            What::Reset { key } => write!(f, "reset k{key}")?,
            What::Fault {
                name, loss, held, ..
            } => {
                let lost = if *loss { " (data lost)" } else { "" };
                write!(f, "{name}{lost}, {held} tokens held before")?;
            }
        }
        match &self.error {
            Some(e) => write!(f, " ERROR {e}"),
            None => Ok(()),
        }
    }
}

/// Operations recorded by many tasks at once.
#[derive(Debug)]
pub struct History {
    origin: Instant,
    ops: Mutex<Vec<Op>>,
}

impl History {
    pub fn new() -> Self {
        History {
            origin: Instant::now(),
            ops: Mutex::new(Vec::new()),
        }
    }

    /// Now, from the origin: take it just before invoking an operation.
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Records an operation invoked at `invoke` that completed just now
    /// (with `error` if it failed).
    pub fn record(
        &self,
        instance: Option<usize>,
        invoke: Duration,
        error: Option<String>,
        what: What,
    ) {
        let complete = self.now();
        let op = Op {
            instance,
            invoke,
            complete,
            error,
            what,
        };
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).push(op);
    }

    /// Every operation recorded, by invoke time.
    pub fn ops(&self) -> Vec<Op> {
        let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner()).clone();
        ops.sort_by_key(|o| o.invoke);
        ops
    }
}
