//! [`Clock`]: microseconds since a clock was made, for the checks decided
//! in process: the memory store's, and the lease map's and server epoch's
//! of a Redis store (one clock between those two, so their times compare).
//!
//! A check reads the clock once, and on most machines reading it is the
//! largest part of a check decided in process: `clock_gettime` (what
//! `std::time::Instant` and tokio's read) takes about 30 ns even through the
//! vDSO, a third of a whole decision. The production clock reads the CPU's
//! time-stamp counter instead (quanta, as governor does: about 12 ns), scaled
//! to nanoseconds by a calibration made once per process (up to 200 ms, the
//! first time a store is built). quanta reads the counter on x86-64 CPUs
//! that report it invariant (and RDTSCP) and on aarch64, the OS's monotonic
//! clock elsewhere.
//!
//! With the `test-util` feature (and in the crate's own unit tests) the clock
//! is tokio's [`Instant`](tokio::time::Instant), so tests can pause and
//! advance time (`tokio::time::pause`, `start_paused`).
//!
//! The counter is not promised to be monotonic as the OS's clock is: another
//! core's reading may be a little behind, and a suspend may reset it. The
//! engine is exact under any clock: a reading earlier than a bucket's stamp
//! refills nothing. A clock behind the times of lease holds would keep them
//! longer: on one server or Sentinel, the server epoch spends no hold
//! confirmed after the clock's reading, and ends every hold granted before
//! a clock that fell behind the OS's (see `redis::epoch`). A cluster's
//! lease map has no epoch, and no such guard (leases are off on a cluster
//! by default).

/// Microseconds since the clock was made.
#[derive(Clone, Debug)]
pub(crate) struct Clock {
    #[cfg(not(any(test, feature = "test-util")))]
    clock: quanta::Clock,
    #[cfg(not(any(test, feature = "test-util")))]
    epoch: u64,
    #[cfg(any(test, feature = "test-util"))]
    epoch: tokio::time::Instant,
}

impl Clock {
    /// A clock at 0 now.
    pub(crate) fn new() -> Self {
        #[cfg(not(any(test, feature = "test-util")))]
        {
            let clock = quanta::Clock::new();
            let epoch = clock.raw();
            Clock { clock, epoch }
        }
        #[cfg(any(test, feature = "test-util"))]
        Clock {
            epoch: tokio::time::Instant::now(),
        }
    }

    /// Microseconds since the clock was made.
    #[inline]
    pub(crate) fn now_us(&self) -> u64 {
        #[cfg(not(any(test, feature = "test-util")))]
        {
            self.clock.delta_as_nanos(self.epoch, self.clock.raw()) / 1_000
        }
        #[cfg(any(test, feature = "test-util"))]
        crate::quota::micros(self.epoch.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_counts_real_time_in_microseconds() {
        let clock = Clock::new();
        let start = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (us, real) = (clock.now_us(), start.elapsed());
        assert!(us >= 20_000, "{us} us after 20 ms");
        assert!(
            u128::from(us) <= real.as_micros() + 1_000,
            "{us} us after {real:?}"
        );
    }
}
