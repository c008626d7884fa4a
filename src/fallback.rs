//! [`Fallback`]: an in-process store that decides while the shared store
//! fails, so limits keep holding through an outage.

use crate::decision::Decision;
use crate::decision::Reservation;
use crate::error::Error;
use crate::lock::lock;
use crate::observe;
use crate::policy::Policy;
use crate::quota::MAX_PERIOD;
use crate::quota::Quota;
use crate::store::{MemoryStore, Store};
use std::fmt;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Scaled policies kept per fallback. Past this, a new one takes the place
/// of the least recently used plain one, or, when all are raised, of the
/// least recently used raised one (see [`Shares`]).
const MAX_SCALED: usize = 64;

/// Decides with an in-process [`MemoryStore`] while the store fails (an error,
/// a timeout, an open circuit breaker), with the same quotas, or with each
/// quota divided by [`share`](Self::share) instances.
///
/// Give it to [`RateLimiter::fallback`](crate::RateLimiter::fallback), or to
/// the layer with
/// [`RateLimitLayer::fallback`](crate::layer::RateLimitLayer::fallback). Decisions
/// it makes say so ([`Decision::is_fallback`]); the layer also puts the store's
/// error in the extensions as a [`StoreFailure`](crate::layer::StoreFailure).
///
/// Against the other store-error policies:
///
/// - **`Allow`** (fail open) keeps serving but limits nothing while the store
///   is down: a flood passes.
/// - **`Deny`** (fail closed) limits everything: the service is down for the
///   outage.
/// - **`Fallback`** keeps limiting each client, per instance. With `share(n)`
///   set to the number of instances, a client spread evenly over them gets
///   about its usual limit; one that reaches a single instance gets a share of
///   it; one that reaches more instances than `n` gets more. Buckets start full
///   when the fallback takes over, and the fallback's spending is not carried
///   back to the store when it returns. Its memory is bounded like any
///   `MemoryStore`.
///
/// Clones share the in-process buckets.
///
/// # Example
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::{Fallback, MemoryStore, Quota, RateLimiter, RedisStore};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Four instances share the Redis limit; while Redis is down each one
/// // enforces a quarter of it in memory.
/// let limiter = RateLimiter::new(RedisStore::from_url("redis://127.0.0.1:6379")?, Quota::per_second(100)?)
///     .fallback(Fallback::memory().share(NonZeroU32::new(4).unwrap()));
/// # let _ = limiter;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct Fallback {
    inner: Arc<Inner>,
}

struct Inner {
    store: MemoryStore,
    share: u32,
    active: AtomicBool,
    /// Per policy: the share's policy (see [`Fallback::share`]).
    scaled: Mutex<Shares>,
}

/// The shares of the policies used lately, at most [`MAX_SCALED`]. A plain
/// share is the same whenever it is made again, but a raised one is state:
/// forgotten, its policy would go back to the plain buckets until its next
/// large cost raises it again, and a client alternating costs around the
/// share's burst would spend from both sets of buckets, each refilling at
/// the share's rate. So a new policy takes the place of a plain share
/// first, and forgets a raise only when every share kept is raised.
#[derive(Default)]
struct Shares {
    kept: Vec<Kept>,
    /// Counts uses, to order them.
    clock: u64,
}

/// A policy's share.
struct Kept {
    policy: Policy,
    share: Policy,
    raised: bool,
    /// When it was last used ([`Shares::clock`]).
    used: u64,
}

impl Shares {
    /// The share kept for `policy`, marked used now.
    fn get(&mut self, policy: &Policy) -> Option<&Policy> {
        self.clock += 1;
        let now = self.clock;
        let kept = self.kept.iter_mut().find(|k| k.policy == *policy)?;
        kept.used = now;
        Some(&kept.share)
    }

    /// Keeps `share` as `policy`'s (`raised` or plain), in place of its old
    /// one or, past [`MAX_SCALED`], of the least recently used plain share
    /// (a raised one when there is none).
    fn put(&mut self, policy: &Policy, share: Policy, raised: bool) {
        let kept = Kept {
            policy: policy.clone(),
            share,
            raised,
            used: self.clock,
        };
        if let Some(old) = self.kept.iter_mut().find(|k| k.policy == *policy) {
            *old = kept;
            return;
        }
        if self.kept.len() >= MAX_SCALED {
            let oldest = |raised: bool| {
                self.kept
                    .iter()
                    .enumerate()
                    .filter(|(_, k)| k.raised == raised)
                    .min_by_key(|(_, k)| k.used)
                    .map(|(i, _)| i)
            };
            if let Some(i) = oldest(false).or_else(|| oldest(true)) {
                self.kept.swap_remove(i);
            }
        }
        self.kept.push(kept);
    }
}

impl fmt::Debug for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fallback")
            .field("store", &self.inner.store)
            .field("share", &self.inner.share)
            .field("active", &self.inner.active.load(Ordering::Relaxed))
            .finish()
    }
}

impl Fallback {
    /// A fallback in a new [`MemoryStore`] of the default size, with the full
    /// quotas.
    pub fn memory() -> Self {
        Self::with_store(MemoryStore::new())
    }

    /// A fallback in `store`.
    pub fn with_store(store: MemoryStore) -> Self {
        Fallback {
            inner: Arc::new(Inner {
                store,
                share: 1,
                active: AtomicBool::new(false),
                scaled: Mutex::new(Shares::default()),
            }),
        }
    }

    /// Each quota divided by `instances`: the rate becomes `1 / instances` of
    /// the quota's (the period is multiplied, so refills stay exact, or, past
    /// [`MAX_PERIOD`], the share's tokens over that period, rounded up), and
    /// the burst `capacity / instances`, rounded up, at least 1.
    ///
    /// A request may cost more than that burst (a `per_second(10)` quota
    /// shared by 4 has a burst of 3; a request of cost 5 would never fit).
    /// When one does, the share's bursts are raised, once, to the largest
    /// cost the policy admits (its smallest capacity), so every request the
    /// store could admit is admitted at the share's rate, never unlimited.
    /// The raise is the policy's, for every client of it on this instance
    /// (so across `instances` instances the bursts may add up to `instances`
    /// times the policy's smallest capacity), and starts its buckets anew
    /// once: a client may be admitted one raised burst more then. A
    /// fallback keeps the shares of the 64 policies used last, raised ones
    /// first: a policy forgets its raise only when 64 raised policies were
    /// used since, and then starts its buckets anew once more at its next
    /// raise. Quotas whose shares coincide (`10/s burst 7` and `10/s burst
    /// 8` shared by 2 are both `5/s burst 4`) are one quota of the share.
    ///
    /// `instances` is never 0 (a `NonZeroU32`, as a constant:
    /// `const INSTANCES: NonZeroU32 = NonZeroU32::new(4).unwrap();`).
    pub fn share(self, instances: NonZeroU32) -> Self {
        Fallback {
            inner: Arc::new(Inner {
                store: self.inner.store.clone(),
                share: instances.get(),
                active: AtomicBool::new(false),
                scaled: Mutex::new(Shares::default()),
            }),
        }
    }

    /// The in-process store.
    pub fn store(&self) -> &MemoryStore {
        &self.inner.store
    }

    /// The number of instances each quota is shared by.
    pub fn instances(&self) -> u32 {
        self.inner.share
    }

    /// True while the store fails and this fallback decides.
    pub fn is_active(&self) -> bool {
        self.inner.active.load(Ordering::Relaxed)
    }

    /// Decides in memory for a store that failed with `error`; the policy the
    /// decision was made under comes back with it.
    pub(crate) fn check(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        error: &Error,
    ) -> Result<(Decision, Policy), Error> {
        if !self.inner.active.swap(true, Ordering::AcqRel) {
            observe::fallback(true, Some(error));
        }
        let scaled = self.scaled(policy, cost);
        let decision = self.inner.store.check_now(key, &scaled, cost)?;
        Ok((decision.marked_fallback(), scaled))
    }

    /// Reserves in memory for a store that failed with `error` (see
    /// [`Store::reserve`]); the policy the reservation was made under comes
    /// back with it.
    pub(crate) async fn reserve(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        max_wait: std::time::Duration,
        error: &Error,
    ) -> Result<(Reservation, Policy), Error> {
        if !self.inner.active.swap(true, Ordering::AcqRel) {
            observe::fallback(true, Some(error));
        }
        let scaled = self.scaled(policy, cost);
        let reservation = self
            .inner
            .store
            .reserve(key, &scaled, cost, max_wait)
            .await?;
        let wait = reservation.wait();
        let decision = reservation.into_decision().marked_fallback();
        let wait_us = if decision.allowed() {
            crate::quota::micros(wait)
        } else {
            0
        };
        Ok((Reservation::new(decision, wait_us), scaled))
    }

    /// An adjustment after the fact (`delta` tokens spent, or given back when
    /// negative) of `key`'s buckets under `policy` at this instance's share:
    /// for a refund or charge of a request this fallback may have decided.
    pub(crate) fn adjust(&self, key: &str, policy: &Policy, delta: i64) {
        // A refund of `c` goes to the share its check of `c` was decided
        // under; a charge to the share as it is (never raised by it).
        let cost = if delta < 0 {
            delta.unsigned_abs().min(policy.max_cost())
        } else {
            0
        };
        let scaled = self.scaled(policy, cost);
        self.adjust_scaled(key, &scaled, delta);
    }

    /// An adjustment under `scaled`, the policy a decision of this fallback
    /// was made under.
    pub(crate) fn adjust_scaled(&self, key: &str, scaled: &Policy, delta: i64) {
        self.inner.store.adjust_now(key, scaled, delta);
    }

    /// The store answered: if this fallback was deciding, it stops.
    pub(crate) fn store_answered(&self) {
        if self.inner.active.load(Ordering::Relaxed)
            && self.inner.active.swap(false, Ordering::AcqRel)
        {
            observe::fallback(false, None);
        }
    }

    /// `policy` at this instance's share, raised (once) to bursts of the
    /// policy's largest cost when `cost` exceeds the share's burst (see
    /// [`share`](Self::share)).
    fn scaled(&self, policy: &Policy, cost: u64) -> Policy {
        if self.inner.share == 1 {
            return policy.clone();
        }
        let mut cache = lock(&self.inner.scaled);
        if let Some(scaled) = cache.get(policy)
            && cost <= scaled.max_cost()
        {
            return scaled.clone();
        }
        let plain = scale_policy(policy, self.inner.share, 1);
        // One raise, to the largest cost the policy admits, whatever the
        // cost that asks: a client choosing its costs finds no fresh bucket
        // per cost, only the raised one.
        let raised = cost > plain.max_cost();
        let scaled = if raised {
            scale_policy(policy, self.inner.share, policy.max_cost())
        } else {
            plain
        };
        cache.put(policy, scaled.clone(), raised);
        scaled
    }
}

/// `policy` at `1 / instances` of its quotas, each with a burst of at least
/// `floor` (capped at the quota's own capacity), quotas that coincide kept
/// once.
fn scale_policy(policy: &Policy, instances: u32, floor: u64) -> Policy {
    let mut quotas: Vec<Quota> = Vec::with_capacity(policy.quotas().len());
    for q in policy.quotas() {
        let scaled = scale(*q, instances, floor);
        // Shares of one period (only the longest period, where shares of
        // long quotas end) would be one bucket: kept once, with the fewer
        // tokens, the smaller burst and the longest lock-out of the two.
        match quotas.iter_mut().find(|q| q.same_period(&scaled)) {
            Some(kept) => *kept = stricter(*kept, scaled),
            None => quotas.push(scaled),
        }
    }
    // Distinct scaled quotas and a checked name: this cannot fail. If it ever
    // did, the whole quota per instance still limits.
    Policy::new(policy.name(), quotas).unwrap_or_else(|_| policy.clone())
}

/// A quota of `a`'s period (that of `b`) admitting no more than either:
/// the fewer tokens, the smaller burst, the longer lock-out.
fn stricter(a: Quota, b: Quota) -> Quota {
    let tokens = a.tokens().min(b.tokens());
    let lockout = a.lockout_time().max(b.lockout_time());
    let made = Quota::new(tokens, a.period())
        .and_then(|q| q.burst(a.capacity().min(b.capacity())))
        .and_then(|q| match lockout {
            Some(time) => q.lockout(time),
            None => Ok(q),
        });
    // Figures no larger than a quota's that was made: this cannot fail. If
    // it ever did, the share with fewer tokens still limits.
    made.unwrap_or(if a.tokens() <= b.tokens() { a } else { b })
}

/// `quota` at `1 / instances` of its rate and burst (see [`Fallback::share`]),
/// with a burst of at least `floor`, at most the quota's capacity.
fn scale(quota: Quota, instances: u32, floor: u64) -> Quota {
    let n = u64::from(instances);
    let capacity = quota
        .capacity()
        .div_ceil(n)
        .max(floor.min(quota.capacity()))
        .max(1);
    let longer = quota
        .period()
        .checked_mul(instances)
        .filter(|p| *p <= MAX_PERIOD)
        .and_then(|period| Quota::new(quota.tokens(), period).ok());
    // Past MAX_PERIOD: fewer tokens instead, the share's rate rounded up to
    // whole tokens, over the quota's own period or over the longest one,
    // whichever comes closer to the share (`3/w` shared by 60 is 3 a year,
    // not 1 a week, 20 times the share; `2000/w` shared by 60 is 34 a
    // week). A count that cannot be kept exact over its period is rounded
    // up to a power of two (at most twice the share), and as a last resort
    // the share is 1 token a year: never the whole quota.
    let per = |tokens: u128, period: Duration| {
        Quota::new(u64::try_from(tokens).ok()?.max(1), period).ok()
    };
    let own = || per(u128::from(quota.tokens().div_ceil(n)), quota.period());
    let year = || {
        let over = quota.period().as_micros() * u128::from(n);
        per(
            (u128::from(quota.tokens()) * MAX_PERIOD.as_micros()).div_ceil(over),
            MAX_PERIOD,
        )
    };
    // Tokens per second, to compare two shares.
    let rate = |q: &Quota| q.tokens() as f64 / q.period().as_secs_f64();
    let closest = match (own(), year()) {
        (Some(a), Some(b)) => Some(if rate(&b) < rate(&a) { b } else { a }),
        (a, b) => a.or(b),
    };
    let rounded = || {
        let tokens = quota
            .tokens()
            .div_ceil(n)
            .max(1)
            .checked_next_power_of_two()?;
        per(u128::from(tokens), quota.period())
    };
    let share = longer
        .or(closest)
        .or_else(rounded)
        .or_else(|| Quota::new(1, MAX_PERIOD).ok());
    // A burst that cannot be made (too large to keep exact) leaves the
    // share's default burst (its tokens), never the whole quota's. The
    // share locks out as the quota does (per instance), where its lock-out
    // can be kept exact at the share's rate.
    share
        .map(|q| q.burst(capacity).unwrap_or(q))
        .map(|q| match quota.lockout_time() {
            Some(time) => q.lockout(time).unwrap_or(q),
            None => q,
        })
        .unwrap_or(quota)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn shares_divide_rate_and_burst() {
        let q = Quota::per_second(100).unwrap().burst(50).unwrap();
        let s = scale(q, 4, 1);
        assert_eq!(s.capacity(), 13);
        assert_eq!(s.tokens(), 100);
        assert_eq!(s.period(), Duration::from_secs(4));
        // 25 a second: 13 tokens refill in 0.52 s.
        assert_eq!(s.refill_time(), Duration::from_millis(520));
        // A lock-out stays the quota's, on the share; shares that coincide
        // (one bucket) keep the longest lock-out of theirs.
        let locked = q.lockout(Duration::from_secs(60)).unwrap();
        let s = scale(locked, 4, 1);
        assert_eq!(s.lockout_time(), Some(Duration::from_secs(60)));
        assert_eq!(s.capacity(), 13);
        // Shares of one period (the longest, where long quotas' shares end)
        // are one bucket: the fewer tokens, the smaller burst, the longest
        // lock-out. 3 a week and 13 in 30 days, shared by 60: 3 and 8 a year.
        let weekly = Quota::new(3, Duration::from_secs(7 * 86_400))
            .unwrap()
            .lockout(Duration::from_secs(60))
            .unwrap();
        let monthly = Quota::new(13, Duration::from_secs(30 * 86_400))
            .unwrap()
            .burst(2)
            .unwrap();
        let shared = scale_policy(&Policy::new("p", [weekly, monthly]).unwrap(), 60, 1);
        assert_eq!(shared.quotas().len(), 1, "{shared:?}");
        let q = shared.quotas()[0];
        assert_eq!((q.period(), q.tokens(), q.capacity()), (MAX_PERIOD, 3, 1));
        assert_eq!(q.lockout_time(), Some(Duration::from_secs(60)));
        // A yearly quota cannot take a longer period: fewer tokens instead.
        let yearly = Quota::new(10, MAX_PERIOD).unwrap();
        let s = scale(yearly, 3, 1);
        assert_eq!((s.tokens(), s.period(), s.capacity()), (4, MAX_PERIOD, 4));
        // 3 a week shared by 60: past a year, so 3 a year (52.3 weeks of the
        // share's rate, 2.6 tokens, rounded up), not 1 a week.
        let week = Duration::from_secs(7 * 86_400);
        let weekly = Quota::new(3, week).unwrap();
        let s = scale(weekly, 60, 1);
        assert_eq!((s.tokens(), s.period(), s.capacity()), (3, MAX_PERIOD, 1));
        // 2000 a week shared by 60: 34 a week (1743 a year is not exact).
        let busy = Quota::new(2000, week).unwrap();
        let s = scale(busy, 60, 1);
        assert_eq!((s.tokens(), s.period()), (34, week));
        // Whatever the numbers, never more than twice the share's rate (a
        // power of two at worst), and never the whole quota.
        for (tokens, days, n) in [
            (10_000, 30, 20),
            (4_999, 7, 60),
            (500, 1, 400),
            (2000, 7, 60),
            (7, 200, 3),
        ] {
            let q = Quota::new(tokens, Duration::from_secs(days * 86_400)).unwrap();
            let s = scale(q, n, 1);
            let rate = |q: &Quota| q.tokens() as f64 / q.period().as_secs_f64();
            assert!(
                rate(&s) <= 2.0 * rate(&q) / f64::from(n),
                "{q:?} / {n}: {s:?}"
            );
            assert!(
                rate(&s) >= rate(&q) / f64::from(n) * 0.999,
                "{q:?} / {n}: {s:?}"
            );
        }
        assert_eq!(scale(q, 1, 1), q);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cost_above_the_shares_burst_is_admitted_at_the_shares_rate() {
        // 10 a second shared by 4: 2.5 a second, burst 3. A request of cost 5
        // raises the burst, once, to the policy's largest cost, 10: two now,
        // the next one 2 s later.
        let fallback = Fallback::memory().share(NonZeroU32::new(4).unwrap());
        let policy = Policy::from(Quota::per_second(10).unwrap());
        let error = Error::Timeout(Duration::from_millis(1));
        for _ in 0..2 {
            let (d, scaled) = fallback.check("k", &policy, 5, &error).unwrap();
            assert!(d.allowed() && d.is_fallback());
            assert_eq!(scaled.quotas()[0].capacity(), 10);
            assert_eq!(scaled.quotas()[0].refill_time(), Duration::from_secs(4));
        }
        let (d, _) = fallback.check("k", &policy, 5, &error).unwrap();
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_secs(2));
        // Other costs share the raised bucket: no fresh bucket per cost.
        for cost in [1, 4, 6, 9] {
            let (d, scaled) = fallback.check("k", &policy, cost, &error).unwrap();
            assert!(!d.allowed(), "cost {cost}");
            assert_eq!(scaled.quotas()[0].capacity(), 10);
        }
        // Never above the quota's own capacity.
        assert_eq!(scale(Quota::per_second(10).unwrap(), 4, 50).capacity(), 10);
    }

    /// A client asking for 10 and 11 tokens in turn, every millisecond for
    /// 3 s, on a policy of 40/s shared by 4 (10/s, burst 10, raised to 40 by
    /// the cost of 11): the tokens it was admitted.
    async fn alternating(fallback: &Fallback, policy: &Policy) -> u64 {
        let error = Error::Timeout(Duration::from_millis(1));
        // As a limiter names its keys: buckets of one key and quota are one.
        let key = format!("{}:client", policy.name());
        let (mut admitted, mut cost) = (0, 10);
        for _ in 0..3_000 {
            let (d, _) = fallback.check(&key, policy, cost, &error).unwrap();
            if d.allowed() {
                admitted += cost;
            }
            cost = 21 - cost;
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        admitted
    }

    #[tokio::test(start_paused = true)]
    async fn past_64_policies_a_share_is_raised_once_as_for_the_first() {
        let fallback = Fallback::memory().share(NonZeroU32::new(4).unwrap());
        let error = Error::Timeout(Duration::from_millis(1));
        let policies: Vec<Policy> = (0..=MAX_SCALED)
            .map(|i| Policy::new(&format!("p{i}"), [Quota::per_second(40).unwrap()]).unwrap())
            .collect();
        // Every policy used once: the last one finds the shares full.
        for policy in &policies {
            let key = format!("{}:other", policy.name());
            assert!(fallback.check(&key, policy, 1, &error).unwrap().0.allowed());
        }
        // The plain burst once (10), the raised one (40), 3 s at 10/s: 80.
        let first = alternating(&fallback, &policies[0]).await;
        let last = alternating(&fallback, &policies[MAX_SCALED]).await;
        assert!(first <= 80, "{first}");
        assert_eq!(last, first);
    }

    #[tokio::test(start_paused = true)]
    async fn a_raise_outlives_plain_shares_used_since() {
        let fallback = Fallback::memory().share(NonZeroU32::new(4).unwrap());
        let error = Error::Timeout(Duration::from_millis(1));
        let hot = Policy::new("hot", [Quota::per_second(40).unwrap()]).unwrap();
        let (_, scaled) = fallback.check("client", &hot, 11, &error).unwrap();
        assert_eq!(scaled.max_cost(), 40);
        for i in 0..2 * MAX_SCALED {
            let plain = Policy::new(&format!("p{i}"), [Quota::per_second(40).unwrap()]).unwrap();
            let (_, scaled) = fallback
                .check(&format!("p{i}:other"), &plain, 1, &error)
                .unwrap();
            assert_eq!(scaled.max_cost(), 10);
        }
        // Still raised: a cost of 1 spends from the raised bucket.
        let (d, scaled) = fallback.check("client", &hot, 1, &error).unwrap();
        assert_eq!(scaled.max_cost(), 40);
        assert_eq!(d.remaining(), 28);
    }

    #[tokio::test]
    async fn decisions_say_they_came_from_the_fallback_and_use_the_share() {
        let fallback = Fallback::memory().share(NonZeroU32::new(2).unwrap());
        let policy = Policy::from(Quota::per_minute(4).unwrap());
        let error = Error::Timeout(Duration::from_millis(1));
        for left in [1, 0] {
            let (d, scaled) = fallback.check("k", &policy, 1, &error).unwrap();
            assert!(d.is_fallback() && d.allowed());
            assert_eq!(d.remaining(), left);
            assert_eq!(scaled.quotas()[0].capacity(), 2);
        }
        assert!(fallback.is_active());
        let (d, _) = fallback.check("k", &policy, 1, &error).unwrap();
        assert!(!d.allowed());
        fallback.store_answered();
        assert!(!fallback.is_active());
    }
}
