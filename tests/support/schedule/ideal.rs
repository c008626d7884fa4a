//! What an exact bucket that never failed would have admitted of the same
//! checks: the yardstick of under-admission. Each check is decided at its
//! invoke time; settlements, resets, flushes and restarts take effect when
//! they completed (failed ones never); a failover keeps the bucket. Timing makes it an estimate, not a bound:
//! a ratio near 1 is the goal, and one well below says the limiter (or an
//! outage) refused what a bucket would have admitted.

use std::time::Duration;

use super::check::Bucket;
use super::history::{Op, What};

enum Event {
    Check(u64),
    /// Tokens given back (positive) or charged (negative).
    Settle(f64),
    Fresh,
}

/// Tokens an exact bucket would have admitted, over every key.
pub fn ideal(ops: &[Op], keys: usize, bucket: Bucket) -> u64 {
    (0..keys).map(|key| replay(&events(ops, key), bucket)).sum()
}

fn events(ops: &[Op], key: usize) -> Vec<(Duration, Event)> {
    let mut events: Vec<(Duration, Event)> = ops
        .iter()
        .filter_map(|op| match op.what {
            What::Check { key: k, cost, .. } if k == key => Some((op.invoke, Event::Check(cost))),
            _ if !op.ok() => None,
            What::Refund { key: k, amount } if k == key => {
                Some((op.complete, Event::Settle(amount as f64)))
            }
            What::Charge { key: k, amount } if k == key => {
                Some((op.complete, Event::Settle(-(amount as f64))))
            }
            What::Reset { key: k } if k == key => Some((op.complete, Event::Fresh)),
            What::Fault { empties: true, .. } => Some((op.complete, Event::Fresh)),
            _ => None,
        })
        .collect();
    events.sort_by_key(|(t, _)| *t);
    events
}

fn replay(events: &[(Duration, Event)], bucket: Bucket) -> u64 {
    let capacity = bucket.capacity as f64;
    let (mut level, mut last, mut admitted) = (capacity, Duration::ZERO, 0);
    for (t, event) in events {
        level = capacity.min(level + bucket.rate * (*t - last).as_secs_f64());
        last = *t;
        match event {
            Event::Check(cost) if level >= *cost as f64 => {
                level -= *cost as f64;
                admitted += cost;
            }
            Event::Check(_) => {}
            // A charge takes at most one bucket of debt, as the stores do.
            Event::Settle(tokens) => level = (level + tokens).clamp(-capacity, capacity),
            Event::Fresh => level = capacity,
        }
    }
    admitted
}
