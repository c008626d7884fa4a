//! What a check answers: admitted or not, and the numbers behind it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::quota::{Quota, ceil_div};
/// The answer to one check.
///
/// When several quotas were checked at once, the accessors describe the most
/// restrictive one ([`Decision::quota`]): for a denial, the quota that forces the
/// longest wait; for an admission, the one with the fewest tokens left.
/// [`Decision::states`] lists every quota.
///
/// # Example
///
/// ```
/// use tollgate::{MemoryStore, Quota, RateLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_minute(2)?);
/// let first = limiter.check("client-1", 1).await?;
/// assert!(first.allowed());
/// assert_eq!((first.limit(), first.remaining()), (2, 1));
/// limiter.check("client-1", 1).await?;
/// let third = limiter.check("client-1", 1).await?;
/// assert!(!third.allowed());
/// assert!(third.retry_after().as_secs() >= 29); // one token every 30 s
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct Decision {
    allowed: bool,
    /// The index of the most restrictive state (a `u32`, so the decision
    /// packs into 80 bytes: it is moved several times per request).
    binding: u32,
    states: States,
    fallback: bool,
}

/// Every quota's state: held inline for one quota (the common case, so a
/// decision allocates nothing and a clone is a copy), shared otherwise (a
/// clone counts a reference). One quota is always `One`, so the derived
/// equality compares states.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum States {
    One(QuotaState),
    Many(Arc<[QuotaState]>),
}

impl States {
    fn as_slice(&self) -> &[QuotaState] {
        match self {
            States::One(state) => std::slice::from_ref(state),
            States::Many(states) => states,
        }
    }
}

impl From<Vec<QuotaState>> for States {
    fn from(states: Vec<QuotaState>) -> Self {
        match states.as_slice() {
            [one] => States::One(*one),
            _ => States::Many(states.into()),
        }
    }
}

/// One quota's part in a [`Decision`].
#[derive(Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct QuotaState {
    quota: Quota,
    remaining: u64,
    /// The waits in microseconds, as the stores count them (a `Duration`
    /// would take twice the room).
    retry_after_us: u64,
    reset_after_us: u64,
}

impl fmt::Debug for QuotaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaState")
            .field("quota", &self.quota)
            .field("remaining", &self.remaining)
            .field("retry_after", &self.retry_after())
            .field("reset_after", &self.reset_after())
            .finish()
    }
}

impl QuotaState {
    #[inline]
    pub(crate) fn new(
        quota: Quota,
        remaining: u64,
        retry_after_us: u64,
        reset_after_us: u64,
    ) -> Self {
        QuotaState {
            quota,
            remaining,
            retry_after_us,
            reset_after_us,
        }
    }

    /// The quota this state belongs to.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The bucket capacity.
    pub fn limit(&self) -> u64 {
        self.quota.capacity()
    }

    /// Whole tokens left in this bucket after the check (with leases, what
    /// this instance can still spend: see [`Decision::remaining`]).
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// How long until this bucket holds the cost asked for; zero when it does now.
    pub fn retry_after(&self) -> Duration {
        Duration::from_micros(self.retry_after_us)
    }

    /// How long until this bucket is full again. Waits and resets are
    /// reported up to 2^53 µs (about 285 years), by every store alike.
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_after_us)
    }
}

impl Decision {
    /// Builds a decision from every quota's state. `states` must not be empty.
    #[inline]
    pub(crate) fn new(allowed: bool, states: impl Into<States>) -> Self {
        let states = states.into();
        // One state binds (the common case, without a search).
        let binding = if let States::One(_) = states {
            0
        } else if allowed {
            most_restrictive(states.as_slice(), |s| {
                (std::cmp::Reverse(s.remaining), s.reset_after_us)
            })
        } else {
            most_restrictive(states.as_slice(), |s| {
                (std::cmp::Reverse(0), s.retry_after_us)
            })
        };
        Decision {
            allowed,
            binding,
            states,
            fallback: false,
        }
    }

    /// This (admitted) decision after `n` more tokens were charged from
    /// each of its buckets (a settlement at the response's head): `n` fewer
    /// remain, and every bucket is full again that much later (never later
    /// than from minus its capacity, as deep as a charge goes). The most
    /// restrictive quota is found again.
    pub(crate) fn charged(self, n: u64) -> Self {
        let charge = |s: &QuotaState| {
            let q = s.quota;
            let from_empty = ceil_div(q.capacity().saturating_mul(q.den()), q.num());
            let deepest = from_empty.saturating_mul(2);
            let later = ceil_div(n.saturating_mul(q.den()), q.num());
            QuotaState::new(
                q,
                s.remaining.saturating_sub(n),
                s.retry_after_us,
                s.reset_after_us.saturating_add(later).min(deepest),
            )
        };
        let states: Vec<QuotaState> = self.states.as_slice().iter().map(charge).collect();
        let charged = Decision::new(self.allowed, states);
        Decision {
            fallback: self.fallback,
            ..charged
        }
    }

    /// This decision, marked as made by the in-process fallback.
    pub(crate) fn marked_fallback(mut self) -> Self {
        self.fallback = true;
        self
    }

    /// True when the in-process [`Fallback`](crate::Fallback) made this
    /// decision because the store failed: it holds for this instance only.
    pub fn is_fallback(&self) -> bool {
        self.fallback
    }

    fn binding(&self) -> Option<&QuotaState> {
        let binding = usize::try_from(self.binding).ok()?;
        self.states.as_slice().get(binding)
    }

    /// True when the cost was admitted (and consumed from every quota).
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// The capacity of the most restrictive quota.
    pub fn limit(&self) -> u64 {
        self.binding().map_or(0, QuotaState::limit)
    }

    /// Whole tokens left in the most restrictive quota after this call. A denied
    /// call consumed nothing, so this is what is left now.
    ///
    /// **With leases** (a [`RedisStore`](crate::RedisStore)'s default), a
    /// decision made in process from tokens Redis holds for this instance
    /// reports what *this instance* can still spend from its hold, never
    /// more than the shared bucket has, but usually less: consecutive
    /// requests may read 39, 38, then 11 as the instance moves between its
    /// hold and the bucket in Redis. It never overstates what is left; a
    /// client that must see the whole bucket's count counts on a store with
    /// `.leases(false)`.
    pub fn remaining(&self) -> u64 {
        self.binding().map_or(0, QuotaState::remaining)
    }

    /// How long until the same cost would be admitted (if nobody else spends in the
    /// meantime); zero when allowed.
    pub fn retry_after(&self) -> Duration {
        if self.allowed {
            return Duration::ZERO;
        }
        self.binding()
            .map_or(Duration::ZERO, QuotaState::retry_after)
    }

    /// How long until the most restrictive quota's bucket is full again.
    pub fn reset_after(&self) -> Duration {
        self.binding()
            .map_or(Duration::ZERO, QuotaState::reset_after)
    }

    /// The most restrictive quota, the one the other accessors describe.
    pub fn quota(&self) -> Option<&Quota> {
        self.binding().map(QuotaState::quota)
    }

    /// Every quota checked, in the order they were given.
    pub fn states(&self) -> &[QuotaState] {
        self.states.as_slice()
    }
}

/// The answer to a reservation: tokens taken now, possibly ahead of their
/// refill, and when they are due. See
/// [`RateLimiter::acquire`](crate::RateLimiter::acquire).
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct Reservation {
    decision: Decision,
    wait: Duration,
}

impl Reservation {
    pub(crate) fn new(decision: Decision, wait_us: u64) -> Self {
        let wait = if decision.allowed() {
            Duration::from_micros(wait_us)
        } else {
            decision.retry_after()
        };
        Reservation { decision, wait }
    }

    /// True when the tokens were reserved (and spent: the wait is the caller's
    /// to keep).
    pub fn admitted(&self) -> bool {
        self.decision.allowed()
    }

    /// When admitted, how long until the reserved tokens are due (zero when they
    /// are there now). When not, the wait it would have needed: longer than the
    /// caller allowed, and nothing was spent.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// The decision behind the reservation.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The decision, by value.
    pub fn into_decision(self) -> Decision {
        self.decision
    }
}

fn most_restrictive<K: Ord>(states: &[QuotaState], key: impl Fn(&QuotaState) -> K) -> u32 {
    states
        .iter()
        .enumerate()
        .max_by_key(|(i, s)| (key(s), std::cmp::Reverse(*i)))
        .and_then(|(i, _)| u32::try_from(i).ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(remaining: u64, retry: u64, reset: u64) -> QuotaState {
        QuotaState::new(Quota::per_second(10).unwrap(), remaining, retry, reset)
    }

    /// A charge at the head: fewer remain, and the bucket is full again
    /// later, down to minus its capacity (twice the time from empty).
    #[test]
    fn a_charge_takes_what_remains_and_pushes_the_reset_back() {
        // 10 a second: a token every 100 ms, full from empty in 1 s.
        let d = Decision::new(true, States::One(state(4, 0, 600_000)));
        let c = d.clone().charged(3);
        assert_eq!(
            (c.remaining(), c.reset_after()),
            (1, Duration::from_millis(900))
        );
        let c = d.clone().charged(9);
        assert_eq!(
            (c.remaining(), c.reset_after()),
            (0, Duration::from_millis(1_500))
        );
        let c = d.charged(50);
        assert_eq!(
            (c.remaining(), c.reset_after()),
            (0, Duration::from_secs(2))
        );
    }

    #[test]
    fn denial_reports_the_longest_wait() {
        let d = Decision::new(
            false,
            vec![state(0, 100, 900), state(5, 0, 100), state(0, 500, 700)],
        );
        assert_eq!(d.retry_after(), Duration::from_micros(500));
        assert_eq!(d.reset_after(), Duration::from_micros(700));
    }

    #[test]
    fn admission_reports_the_fewest_remaining() {
        let d = Decision::new(
            true,
            vec![state(7, 0, 100), state(3, 0, 50), state(3, 0, 90)],
        );
        assert_eq!(d.remaining(), 3);
        assert_eq!(d.reset_after(), Duration::from_micros(90));
        assert_eq!(d.retry_after(), Duration::ZERO);
    }
}
