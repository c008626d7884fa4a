//! [`Window`]: how many script calls of one queue may be in flight at once,
//! following the calls' round trips against what a call costs, as a
//! congestion window follows the bandwidth-delay product: the rule is in
//! `batch.rs`'s module docs.

use std::time::Duration;

use tokio::time::Instant;

/// The fewest calls in flight on a lone node: two, so Redis never waits for
/// the next batch while one's reply travels.
pub(crate) const MIN_IN_FLIGHT: usize = 2;
/// The most calls in flight on one queue: enough for a node a few
/// milliseconds away under a few dozen concurrent checks.
pub(crate) const MAX_IN_FLIGHT: usize = 64;
/// What one script call costs, Redis's work and this process's (a task, the
/// command written, the reply read, two system calls): a few microseconds in
/// Redis, some tens here. A round trip worth fewer than two of these is
/// mostly calls' own work, and checks batch; one worth many is mostly the
/// network's, and that many calls can fly without waiting for each other.
pub(crate) const CALL_COST: Duration = Duration::from_micros(50);
/// A round trip this many times the base says calls queue (Redis or this
/// process is saturated, wherever Redis is): batch harder.
const QUEUED: u32 = 4;
/// The base round trip is the least of the last one or two epochs.
const EPOCH: Duration = Duration::from_secs(5);

/// The in-flight limit of one queue and what it learned of round trips.
#[derive(Debug)]
pub(crate) struct Window {
    limit: usize,
    floor: usize,
    /// The least round trip of the current epoch, and of the one before.
    current: Option<Duration>,
    previous: Option<Duration>,
    epoch: Option<Instant>,
}

impl Window {
    pub(crate) fn new() -> Self {
        Window {
            limit: MIN_IN_FLIGHT,
            floor: MIN_IN_FLIGHT,
            current: None,
            previous: None,
            epoch: None,
        }
    }

    /// The calls that may be in flight now.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Sets the fewest calls in flight (at least one); a new floor also
    /// restarts the limit from it, so a queue that must batch harder (a
    /// cluster gaining primaries) does so at once. The base round trip stays.
    #[allow(
        dead_code,
        reason = "only a cluster store's queues (cluster/nodes.rs) change it"
    )]
    pub(crate) fn set_floor(&mut self, floor: usize) {
        let floor = floor.clamp(1, MAX_IN_FLIGHT);
        if floor != self.floor {
            self.floor = floor;
            self.limit = floor;
        }
    }

    /// Learns from a call that took `round_trip` and ended at `now`;
    /// `waiting`: the checks queued behind the limit meanwhile.
    pub(crate) fn sample(&mut self, round_trip: Duration, now: Instant, waiting: usize) {
        match self.epoch {
            Some(start) if now.saturating_duration_since(start) < EPOCH => {}
            _ => {
                self.previous = self.current.take();
                self.epoch = Some(now);
            }
        }
        let current = self.current.map_or(round_trip, |m| m.min(round_trip));
        self.current = Some(current);
        let base = self.previous.map_or(current, |p| p.min(current));
        // The calls the base round trip holds at a call's cost: the most
        // that fly without waiting for each other's work.
        let fit = usize::try_from(base.as_nanos() / CALL_COST.as_nanos())
            .unwrap_or(usize::MAX)
            .clamp(self.floor, MAX_IN_FLIGHT);
        if round_trip > base * QUEUED {
            // Calls queue: halve, as a congestion window does on congestion.
            self.limit = (self.limit / 2).max(self.floor);
        } else if self.limit > fit {
            self.limit = fit;
        } else {
            // Room for the checks that waited, each in a call of its own
            // next time, at most doubling per call (slow start): checks that
            // came together (and so wait together) need not take a round
            // trip each to spread out, and a burst on a near node does not
            // open the window at once.
            let more = waiting.min(self.limit);
            self.limit = self.limit.saturating_add(more).min(fit).max(self.limit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node 4 ms away: room for every call.
    const FAR: Duration = Duration::from_millis(4);
    /// On loopback: round trips of a few calls' cost.
    const NEAR: Duration = Duration::from_micros(60);

    #[test]
    fn a_far_node_opens_the_window_while_checks_wait() {
        let mut w = Window::new();
        let now = Instant::now();
        for _ in 0..10 {
            w.sample(FAR, now, 1);
        }
        assert_eq!(w.limit(), MIN_IN_FLIGHT + 10);
        // Without checks waiting it stays: demand, not the network, caps it.
        w.sample(FAR * 2, now, 0);
        assert_eq!(w.limit(), MIN_IN_FLIGHT + 10);
        for _ in 0..200 {
            w.sample(FAR * 3, now, 1);
        }
        assert_eq!(
            w.limit(),
            MAX_IN_FLIGHT,
            "3 x the base is noise, not a queue"
        );
    }

    #[test]
    fn checks_that_waited_together_double_the_window_per_call() {
        let mut w = Window::new();
        w.sample(FAR, Instant::now(), 14);
        assert_eq!(w.limit(), 4);
        w.sample(FAR, Instant::now(), 1);
        assert_eq!(w.limit(), 5);
        for _ in 0..4 {
            w.sample(FAR, Instant::now(), 1000);
        }
        assert_eq!(w.limit(), MAX_IN_FLIGHT);
    }

    #[test]
    fn a_near_node_keeps_the_floor_so_checks_batch() {
        let mut w = Window::new();
        let now = Instant::now();
        for rtt in [NEAR, NEAR * 2, NEAR, NEAR * 5, NEAR] {
            for _ in 0..50 {
                w.sample(rtt, now, 1);
            }
        }
        assert_eq!(w.limit(), MIN_IN_FLIGHT);
    }

    #[test]
    fn round_trips_far_above_the_base_close_the_window() {
        let mut w = Window::new();
        let now = Instant::now();
        for _ in 0..20 {
            w.sample(FAR, now, 1);
        }
        assert_eq!(w.limit(), MIN_IN_FLIGHT + 20);
        for _ in 0..100 {
            w.sample(FAR * 5, now, 1);
        }
        assert_eq!(w.limit(), MIN_IN_FLIGHT);
    }

    #[test]
    fn the_base_forgets_a_round_trip_after_two_epochs() {
        let mut w = Window::new();
        let t0 = Instant::now();
        w.sample(NEAR, t0, 1);
        // The path got slower: until the old base ages out, calls look queued.
        w.sample(FAR, t0 + EPOCH, 1);
        assert_eq!(w.limit(), MIN_IN_FLIGHT);
        w.sample(FAR, t0 + EPOCH * 2, 1);
        w.sample(FAR, t0 + EPOCH * 2, 1);
        assert_eq!(w.limit(), MIN_IN_FLIGHT + 2);
        // And faster again: the window closes to what the new base holds.
        for _ in 0..100 {
            w.sample(NEAR, t0 + EPOCH * 2, 1);
        }
        assert_eq!(w.limit(), MIN_IN_FLIGHT);
    }

    #[test]
    fn a_new_floor_restarts_the_limit() {
        let mut w = Window::new();
        let now = Instant::now();
        for _ in 0..5 {
            w.sample(FAR, now, 1);
        }
        w.set_floor(1);
        assert_eq!(w.limit(), 1);
        w.set_floor(1);
        w.sample(FAR, now, 1);
        assert_eq!(w.limit(), 2);
        for _ in 0..5 {
            w.sample(FAR * 5, now, 1);
        }
        assert_eq!(w.limit(), 1);
    }
}
