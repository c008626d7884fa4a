//! The checker: every window of a key's history within the bucket's bound.
//!
//! A token bucket of capacity `C` refilling `r` tokens a second (of Redis's
//! clock, the host's wall clock: the caller scales `r` by how fast that
//! ran against the monotonic clock operations are timed on) holds at
//! most `C` at any moment, so between two moments `a` and `b` it can hand
//! out at most `C + r·(b − a)` tokens, plus whatever refunds gave back in
//! between. Only local times are known: an operation took effect somewhere
//! in `[invoke, complete]`. So the checker counts, for a window `[a, b]`,
//! only the admissions *certainly* inside it (invoked at or after `a`,
//! completed by `b`), and every refund that *may* have taken effect inside
//! it (invoked by `b`, completed at or after `a`; a refund that failed may
//! still run later, so it counts for every window after its invoke). A
//! scheduling delay only widens `[invoke, complete]`, which can only drop
//! an admission from a window or add a refund to it: the checker never
//! blames the limiter for a slow machine.
//!
//! A fresh bucket breaks the bound: a loss of data (a flush, a restart
//! without persistence, a failover) or a reset of the key. So a key's
//! history is cut into segments at each such event, and only windows inside
//! one segment are checked: from the event's completion to the next event's
//! invoke (one that failed may take effect at any time later: nothing after
//! it is checked). In each segment every window whose ends are an
//! admission's invoke and an admission's completion is checked (those are
//! the tightest: moving `a` up to the first admission inside or `b` down to
//! the last keeps the count and lowers the bound), in O(n²) per segment.
//!
//! A reset is not a loss: it lets a client in on purpose, and, as
//! `src/docs/redis.md` says, the other instances spend what they held on the
//! key until their leases run out (at most half a bucket: the script keeps
//! each bucket's holds within that). So with leases, a window that opens
//! within the longest lease's life after a reset counts half a bucket more
//! ([`Bucket::reset_grace`]). After a loss of data nothing more is counted:
//! a held token spent beside a fresh bucket is over-admission.
//!
//! Refused, failed and peeked checks admit nothing, and charges only take
//! tokens, so both are left out of the bound; they are what under-admission
//! is measured against (`offered`).

use std::time::Duration;

use super::history::{Op, What};

/// Over the bound by more than this (floating-point slack): a violation.
const SLACK: f64 = 1e-6;

/// The bucket every key of a schedule has.
#[derive(Clone, Copy, Debug)]
pub struct Bucket {
    pub capacity: u64,
    /// Tokens per second.
    pub rate: f64,
    /// With leases: how long after a reset other instances may still spend
    /// what they held on the key (their longest lease's life; zero
    /// without leases).
    pub reset_grace: Duration,
}

impl Bucket {
    /// Tokens held outside a bucket: at most half of it.
    fn stale(&self) -> u64 {
        self.capacity / 2
    }
}

/// One window and its bound.
#[derive(Clone, Debug)]
pub struct Window {
    pub a: Duration,
    pub b: Duration,
    /// Tokens admitted certainly inside, by this many checks.
    pub admitted: u64,
    pub checks: usize,
    pub capacity: u64,
    pub refill: f64,
    /// Tokens refunds may have given back inside.
    pub refunds: u64,
    /// Tokens held before the bucket was fresh that may be spent inside.
    pub held: u64,
}

impl Window {
    pub fn bound(&self) -> f64 {
        self.capacity as f64 + self.refill + self.refunds as f64 + self.held as f64
    }

    pub fn excess(&self) -> f64 {
        self.admitted as f64 - self.bound()
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[{:.3}s, {:.3}s] admitted {} tokens ({} checks) > bound {:.1} \
             (capacity {} + refill {:.1} + refunds {} + held before {})",
            self.a.as_secs_f64(),
            self.b.as_secs_f64(),
            self.admitted,
            self.checks,
            self.bound(),
            self.capacity,
            self.refill,
            self.refunds,
            self.held,
        )
    }
}

/// One stretch of a key's history with one bucket, and what it admitted.
#[derive(Clone, Debug)]
pub struct Segment {
    pub key: usize,
    /// What made the bucket fresh: `start`, `reset` or a data-losing fault.
    pub opened_by: &'static str,
    pub from: Duration,
    pub to: Duration,
    /// Tokens admitted and asked for by checks wholly inside.
    pub admitted: u64,
    pub offered: u64,
    /// The bound over the whole segment.
    pub allowed: f64,
    /// Windows over their bound.
    pub violations: u64,
    /// The window furthest over its bound (or nearest to it).
    pub worst: Option<Window>,
}

/// An operation that may give a key a fresh bucket, somewhere in
/// `[from, to]`; `to` is `None` when it failed (it may still take effect).
struct Fresh {
    from: Duration,
    to: Option<Duration>,
    kind: &'static str,
}

/// A check that admitted: when it certainly falls.
#[derive(Clone, Copy)]
struct Admission {
    invoke: Duration,
    complete: Duration,
    cost: u64,
}

/// A refund: when it may take effect.
#[derive(Clone, Copy)]
struct Refund {
    invoke: Duration,
    complete: Option<Duration>,
    amount: u64,
}

/// Every segment of every key of a history, checked.
pub fn check(ops: &[Op], keys: usize, bucket: Bucket) -> Vec<Segment> {
    let end = ops.iter().map(|o| o.complete).max().unwrap_or_default();
    (0..keys)
        .flat_map(|key| {
            let refunds = refunds_of(ops, key);
            spans(&fresh_events(ops, key), end)
                .into_iter()
                .map(move |(from, to, opened_by)| Segment {
                    key,
                    opened_by,
                    from,
                    to,
                    admitted: 0,
                    offered: 0,
                    allowed: 0.0,
                    violations: 0,
                    worst: None,
                })
                .map(move |segment| check_segment(ops, segment, &refunds, bucket))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn fresh_events(ops: &[Op], key: usize) -> Vec<Fresh> {
    let mut events: Vec<Fresh> = ops
        .iter()
        .filter_map(|op| {
            let kind = match op.what {
                What::Fault {
                    name, loss: true, ..
                } => name,
                What::Reset { key: k } if k == key => "reset",
                _ => return None,
            };
            Some(Fresh {
                from: op.invoke,
                to: op.ok().then_some(op.complete),
                kind,
            })
        })
        .collect();
    events.sort_by_key(|e| e.from);
    events
}

/// The stretches between fresh buckets, as `(from, to, opened_by)`.
fn spans(events: &[Fresh], end: Duration) -> Vec<(Duration, Duration, &'static str)> {
    let mut spans = Vec::new();
    let mut from = Some(Duration::ZERO);
    let mut opened_by = "start";
    for event in events {
        if let Some(f) = from.filter(|f| *f < event.from) {
            spans.push((f, event.from, opened_by));
        }
        // Overlapping events: the stretch starts when the last one is done.
        from = match (from, event.to) {
            (Some(f), Some(t)) => Some(f.max(t)),
            _ => None,
        };
        opened_by = event.kind;
    }
    if let Some(f) = from.filter(|f| *f < end) {
        spans.push((f, end, opened_by));
    }
    spans
}

fn refunds_of(ops: &[Op], key: usize) -> Vec<Refund> {
    let mut refunds: Vec<Refund> = ops
        .iter()
        .filter_map(|op| match op.what {
            What::Refund { key: k, amount } if k == key => Some(Refund {
                invoke: op.invoke,
                complete: op.ok().then_some(op.complete),
                amount,
            }),
            _ => None,
        })
        .collect();
    refunds.sort_by_key(|r| r.invoke);
    refunds
}

/// Tokens of `refunds` that may take effect inside `[a, b]`.
fn refunded(refunds: &[Refund], a: Duration, b: Duration) -> u64 {
    refunds
        .iter()
        .filter(|r| r.invoke <= b && r.complete.is_none_or(|c| c >= a))
        .map(|r| r.amount)
        .sum()
}

fn check_segment(ops: &[Op], mut segment: Segment, refunds: &[Refund], bucket: Bucket) -> Segment {
    let inside = |op: &&Op| op.invoke >= segment.from && op.complete <= segment.to;
    let mut admissions = Vec::new();
    for op in ops.iter().filter(inside) {
        if let What::Check {
            key,
            cost,
            admitted,
        } = op.what
            && key == segment.key
        {
            segment.offered += cost;
            if admitted {
                segment.admitted += cost;
                admissions.push(Admission {
                    invoke: op.invoke,
                    complete: op.complete,
                    cost,
                });
            }
        }
    }
    let span = segment.to.saturating_sub(segment.from).as_secs_f64();
    segment.allowed = bucket.capacity as f64
        + bucket.rate * span
        + refunded(refunds, segment.from, segment.to) as f64;
    // Held tokens may still be spent within the grace after a fresh bucket.
    let grace = match segment.opened_by {
        "reset" => bucket.reset_grace,
        _ => Duration::ZERO,
    };
    let stale_until = segment.from + grace;
    let (violations, worst) = sweep(&mut admissions, refunds, bucket, stale_until);
    segment.violations = violations;
    segment.worst = worst;
    segment
}

/// Every window from an admission's invoke to an admission's completion:
/// how many are over their bound, and the one furthest over. Windows that
/// open before `stale_until` may see held tokens spent.
fn sweep(
    admissions: &mut [Admission],
    refunds: &[Refund],
    bucket: Bucket,
    stale_until: Duration,
) -> (u64, Option<Window>) {
    admissions.sort_by_key(|x| x.complete);
    let mut starts: Vec<Duration> = admissions.iter().map(|x| x.invoke).collect();
    starts.sort();
    starts.dedup();
    let mut violations = 0;
    let mut worst: Option<Window> = None;
    for a in starts {
        // Refunds done before `a` are in the bucket's level at `a`, which
        // is at most its capacity; the others count once invoked by `b`.
        let live: Vec<Refund> = refunds
            .iter()
            .copied()
            .filter(|r| r.complete.is_none_or(|c| c >= a))
            .collect();
        let (mut next_refund, mut refunds_in) = (0, 0);
        let (mut admitted, mut checks) = (0, 0);
        for x in admissions.iter().filter(|x| x.invoke >= a) {
            admitted += x.cost;
            checks += 1;
            let b = x.complete;
            while let Some(r) = live.get(next_refund).filter(|r| r.invoke <= b) {
                refunds_in += r.amount;
                next_refund += 1;
            }
            let window = Window {
                a,
                b,
                admitted,
                checks,
                capacity: bucket.capacity,
                refill: bucket.rate * (b - a).as_secs_f64(),
                refunds: refunds_in,
                held: if a < stale_until { bucket.stale() } else { 0 },
            };
            if window.excess() > SLACK {
                violations += 1;
            }
            if worst.as_ref().is_none_or(|w| window.excess() > w.excess()) {
                worst = Some(window);
            }
        }
    }
    (violations, worst)
}
