//! [`Window`]: how many script calls of one queue may be in flight at once,
//! following the calls' round trips as a delay-based congestion window does
//! (TCP Vegas): the rule is in `batch.rs`'s module docs.

use std::time::Duration;

use tokio::time::Instant;

/// The fewest calls in flight on a lone node: two, so Redis never waits for
/// the next batch while one's reply travels.
pub(crate) const MIN_IN_FLIGHT: usize = 2;
/// The most calls in flight on one queue: enough for a node a few
/// milliseconds away under a few dozen concurrent checks.
pub(crate) const MAX_IN_FLIGHT: usize = 64;
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
    #[cfg(feature = "cluster")]
    pub(crate) fn set_floor(&mut self, floor: usize) {
        let floor = floor.clamp(1, MAX_IN_FLIGHT);
        if floor != self.floor {
            self.floor = floor;
            self.limit = floor;
        }
    }

    /// Learns from a call that took `round_trip` and ended at `now`;
    /// `waiting`: checks queued behind the limit meanwhile.
    pub(crate) fn sample(&mut self, round_trip: Duration, now: Instant, waiting: bool) {
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
        if round_trip > base * 2 {
            // Calls queue (in Redis or in this process): batch harder.
            self.limit = self.limit.saturating_sub(1).max(self.floor);
        } else if waiting && round_trip <= base + base / 2 {
            // The time is the network's: one more call would not wait.
            self.limit = (self.limit + 1).min(MAX_IN_FLIGHT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAR: Duration = Duration::from_millis(2);
    const NEAR: Duration = Duration::from_micros(50);

    #[test]
    fn round_trips_near_the_base_open_the_window_while_checks_wait() {
        let mut w = Window::new();
        let now = Instant::now();
        for _ in 0..10 {
            w.sample(FAR, now, true);
        }
        assert_eq!(w.limit(), MIN_IN_FLIGHT + 10);
        // Without checks waiting it stays: demand, not the network, caps it.
        w.sample(FAR + FAR / 4, now, false);
        assert_eq!(w.limit(), MIN_IN_FLIGHT + 10);
        for _ in 0..200 {
            w.sample(FAR, now, true);
        }
        assert_eq!(w.limit(), MAX_IN_FLIGHT);
    }

    #[test]
    fn round_trips_well_above_the_base_close_it_to_the_floor() {
        let mut w = Window::new();
        let now = Instant::now();
        for _ in 0..20 {
            w.sample(NEAR, now, true);
        }
        assert_eq!(w.limit(), MIN_IN_FLIGHT + 20);
        for _ in 0..100 {
            w.sample(NEAR * 3, now, true);
        }
        assert_eq!(w.limit(), MIN_IN_FLIGHT);
        // Between 1.5 and 2 times the base: it holds.
        w.sample(NEAR * 7 / 4, now, true);
        assert_eq!(w.limit(), MIN_IN_FLIGHT);
    }

    #[test]
    fn the_base_forgets_a_round_trip_after_two_epochs() {
        let mut w = Window::new();
        let t0 = Instant::now();
        w.sample(NEAR, t0, true);
        // The path got slower: until the old base ages out, calls look queued.
        w.sample(FAR, t0 + EPOCH, true);
        assert_eq!(w.limit(), MIN_IN_FLIGHT);
        w.sample(FAR, t0 + EPOCH * 2, true);
        w.sample(FAR, t0 + EPOCH * 2, true);
        assert_eq!(w.limit(), MIN_IN_FLIGHT + 2);
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn a_new_floor_restarts_the_limit() {
        let mut w = Window::new();
        let now = Instant::now();
        for _ in 0..5 {
            w.sample(FAR, now, true);
        }
        w.set_floor(1);
        assert_eq!(w.limit(), 1);
        w.set_floor(1);
        w.sample(FAR, now, true);
        assert_eq!(w.limit(), 2);
        for _ in 0..5 {
            w.sample(FAR * 3, now, true);
        }
        assert_eq!(w.limit(), 1);
    }
}
