//! [`RateLimiter`]: the engine without tower, for queues, jobs and databases.

use std::cell::Cell;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::decision::Decision;
use crate::decision::Reservation;
use crate::error::Error;
use crate::fallback::Fallback;
use crate::observe;
use crate::policy::Policy;
use crate::quota::Quota;
use crate::store::bucket::Spent;
use crate::store::bucket::signed;
use crate::store::{AnyStore, HeldKeys, Store, Unsent};

/// A check [`RateLimiter::decide_now`] could not answer at once: what is
/// left to [`send`](RateLimiter::send).
pub(crate) struct ToSend(Unsent);

mod decide;
mod decided;

pub(crate) use decided::Decided;

/// Checks keys against a [`Policy`] (one quota or several) in a store.
///
/// Takes any store ([`MemoryStore`](crate::MemoryStore),
/// [`RedisStore`](crate::RedisStore), [`AnyStore`]) and does not carry its
/// type. Keys are yours to choose; the limiter stores each one behind its
/// policy's name (`name:key`), as the HTTP layer does, so two limiters whose
/// policies have different names never share a bucket, even with the same
/// quotas and keys (`login` and `signup` for `user:42`), while limiters of
/// one policy name on one store do. A policy built from a bare [`Quota`] is
/// named [`DEFAULT_POLICY_NAME`](crate::DEFAULT_POLICY_NAME). The
/// layer's keys are `name:kind:value`, so a limiter's key `ip:10.0.0.1`
/// under a policy of the layer's name is the layer's bucket of that client:
/// choose keys accordingly (to share a bucket with the layer, or not).
///
/// Cheap to clone: clones share the store and the policy.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tollgate::{MemoryStore, Policy, Quota, RateLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // 10 per second and 1000 per hour for each key, decided together.
/// let limiter = RateLimiter::new(
///     MemoryStore::new(),
///     Policy::new("tenants", [Quota::per_second(10)?, Quota::per_hour(1000)?])?,
/// );
/// let d = limiter.check("tenant-7", 1).await?;
/// assert!(d.allowed());
/// // Wait (up to 2 s) for 10 more tokens instead of failing.
/// limiter.acquire("tenant-7", 10, Duration::from_secs(2)).await?;
/// limiter.reset("tenant-7").await?;
/// assert_eq!(limiter.peek("tenant-7").await?.remaining(), 10);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct RateLimiter {
    store: AnyStore,
    policy: Policy,
    fallback: Option<Fallback>,
    /// How [`check`](Self::check) decides one token for a key the store
    /// holds, made at the first check (`None` inside when the store holds
    /// no key so, see [`AnyStore::held_keys`]), and shared by clones made
    /// before it. Made at the first check, not here: a memory store numbers
    /// only the key starts in use.
    held: Arc<OnceLock<Option<HeldKeys>>>,
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("store", &self.store)
            .field("policy", &self.policy)
            .field("fallback", &self.fallback)
            .finish_non_exhaustive()
    }
}

impl RateLimiter {
    /// A limiter over `store` enforcing `policy`: a single [`Quota`] (`.into()`
    /// is implied) or a [`Policy`] of several, decided all or nothing.
    pub fn new(store: impl Into<AnyStore>, policy: impl Into<Policy>) -> Self {
        RateLimiter {
            store: store.into(),
            policy: policy.into(),
            fallback: None,
            held: Arc::default(),
        }
    }

    /// Decides with `fallback` while the store fails (see [`Fallback`]); such
    /// decisions answer [`Decision::is_fallback`] `true`.
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = Some(fallback);
        self
    }

    /// The policy this limiter checks.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The quotas this limiter checks.
    pub fn quotas(&self) -> &[Quota] {
        self.policy.quotas()
    }

    /// The store behind this limiter.
    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    /// The fallback set with [`fallback`](Self::fallback), if any.
    pub fn configured_fallback(&self) -> Option<&Fallback> {
        self.fallback.as_ref()
    }

    /// The old name of [`configured_fallback`](Self::configured_fallback)
    /// (it returns a [`Fallback`], not a store).
    #[deprecated(since = "0.1.0", note = "renamed `configured_fallback`")]
    pub fn fallback_store(&self) -> Option<&Fallback> {
        self.configured_fallback()
    }

    /// Spends `cost` tokens from `key`'s buckets if every quota has them; a denied
    /// check spends nothing. A cost of 0 only looks. When the store fails and a
    /// [`fallback`](Self::fallback) is set, the fallback decides.
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        cooperate().await;
        if cost == 1
            && let Some((held, answer)) = self.check_held(key)
        {
            return Ok(held.decision(answer));
        }
        let key = self.named(key);
        match self.decide(&key, "limiter", &self.policy, cost).await {
            Decided::Store(decision) | Decided::Fallback { decision, .. } => Ok(decision),
            Decided::Failed(error) => Err(error),
        }
    }

    /// Reserves `cost` tokens, possibly ahead of their refill, if they are all
    /// due within `max_wait` (see [`Store::reserve`]): one store call, no
    /// waiting. An admitted reservation has spent the tokens; the caller waits
    /// [`Reservation::wait`] before using them. A refused one spent nothing and
    /// says how long it would have had to wait. With a
    /// [`fallback`](Self::fallback), the fallback reserves while the store fails.
    pub async fn reserve(
        &self,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Reservation, Error> {
        // As in `check`: a reservation answered at once still yields now and
        // then.
        cooperate().await;
        let key = self.named(key);
        let (decided, wait) = self
            .decide_within(&key, "limiter", &self.policy, cost, max_wait)
            .await;
        let wait_us = crate::quota::micros(wait);
        match decided {
            Decided::Store(decision) | Decided::Fallback { decision, .. } => {
                Ok(Reservation::new(decision, wait_us))
            }
            Decided::Failed(error) => Err(error),
        }
    }

    /// Like [`check`](Self::check), but waits until `cost` is admitted, as Guava's
    /// `RateLimiter.acquire` does: one store call reserves the tokens (possibly
    /// ahead of their refill), then this sleeps until they are due. Callers are
    /// served in the order the store took their reservations, across instances
    /// too, so none starves. Fails at once with [`Error::WaitTooLong`] (having
    /// spent nothing) when the tokens would not be due within `max_wait`.
    ///
    /// If the caller stops waiting (the future is dropped), the reserved tokens
    /// stay spent.
    pub async fn acquire(
        &self,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        let reservation = self.reserve(key, cost, max_wait).await?;
        if !reservation.admitted() {
            return Err(Error::WaitTooLong {
                retry_after: reservation.wait(),
            });
        }
        if !reservation.wait().is_zero() {
            tokio::time::sleep(reservation.wait()).await;
        }
        Ok(reservation.into_decision())
    }

    /// Gives `cost` tokens back to `key`'s buckets: a request admitted
    /// earlier, by `decision`, that should not count after all (a successful
    /// login under a limit of failed ones). Each bucket is filled up to its
    /// capacity at most, so the bucket admits no more than if that request
    /// had never come.
    ///
    /// The refund goes where `decision` was made: the store, or the
    /// [`fallback`](Self::fallback) that admitted it while the store failed
    /// ([`Decision::is_fallback`]); never to a bucket that was not charged:
    /// a `decision` that was not admitted spent nothing, and its refund
    /// changes nothing (and returns `Ok`).
    /// On a [`RedisStore`](crate::RedisStore) it is one script call, batched
    /// with the checks in flight. A refund the store fails to make leaves the
    /// tokens spent (limiting more, never less) and returns the error.
    pub async fn refund(&self, key: &str, cost: u64, decision: &Decision) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        // Never more than a request may cost: a larger refund is no more
        // than that.
        let cost = cost.min(self.policy.max_cost());
        self.adjust(&self.named(key), &self.policy, -signed(cost), decision)
            .await
    }

    /// Spends `cost` more tokens from `key`'s buckets, whatever they hold,
    /// for a request admitted by `decision`: a cost known only once the work
    /// is done (a query's real price). A bucket may go into debt, down to
    /// minus its capacity at most (the most one request may cost); later
    /// checks wait until the debt is refilled. Made where `decision` was
    /// made, in one store call, as [`refund`](Self::refund) is. A `decision`
    /// that was not admitted let no work be done: charging it changes
    /// nothing (and returns `Ok`), as the layer never settles a request it
    /// refused.
    pub async fn charge(&self, key: &str, cost: u64, decision: &Decision) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        let cost = cost.min(crate::quota::MAX_EXACT);
        self.adjust(&self.named(key), &self.policy, signed(cost), decision)
            .await
    }

    /// `delta` tokens spent from (or, negative, given back to) `key`'s
    /// buckets under `policy`, where `decision` was made; nothing for a
    /// decision that was not admitted. Counted in the metrics once made.
    async fn adjust(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        decision: &Decision,
    ) -> Result<(), Error> {
        if !decision.allowed() {
            return Ok(());
        }
        match (&self.fallback, decision.is_fallback()) {
            (Some(fallback), true) => fallback.adjust(key, policy, delta),
            _ => self.store.adjust(key, policy, delta).await?,
        }
        observe::settled(policy.name(), delta);
        Ok(())
    }

    /// The state of `key`'s buckets, spending nothing.
    pub async fn peek(&self, key: &str) -> Result<Decision, Error> {
        self.check(key, 0).await
    }

    /// Forgets `key`'s buckets: the next check finds them full.
    pub async fn reset(&self, key: &str) -> Result<(), Error> {
        self.store.reset(&self.named(key), &self.policy).await
    }

    /// `key` behind the policy's name: what the store keeps its buckets
    /// under (the layer's keys are `name:kind:value`).
    fn named(&self, key: &str) -> String {
        self.policy.key_of(&[key])
    }

    /// [`check`](Self::check) of one token for a key the store holds so
    /// that it decides at once (a memory store's key, a leasing Redis
    /// store's key whose hold pays), without writing out its storage key,
    /// to the decision `decide` would make (built by the held keys,
    /// returned with them), reported as it reports it. `None`, having
    /// changed nothing, for every other key.
    #[inline]
    fn check_held(&self, key: &str) -> Option<(&HeldKeys, Spent)> {
        let held = self
            .held
            .get_or_init(|| self.store.held_keys(&self.named(""), &self.policy, 1))
            .as_ref()?;
        let answer = held.decide_as_is(key, &self.policy)?;
        self.answered(answer.allowed, &self.policy, "limiter", held.fresh());
        Some((held, answer))
    }
}

/// How many checks spend one unit of tokio's cooperative budget.
const CHECKS_A_UNIT: u8 = 8;

thread_local! {
    /// Checks on this thread since the budget was last spent.
    static SINCE_SPENT: Cell<u8> = const { Cell::new(0) };
}

/// Spends a unit of tokio's cooperative budget every [`CHECKS_A_UNIT`]
/// checks of this thread. A check answered without I/O (a memory store, a
/// remembered denial, the fallback, a hold) would never yield: a loop of
/// them could keep a runtime's worker from every other task and timer.
/// Spending the budget makes such a loop yield now and then: after 1 024
/// checks (128 units, tokio's budget a task poll) at most, a tenth of a
/// millisecond at the memory store's pace. A unit at every check made a
/// loop yield every 128 checks, which cost one check in ten its time here
/// (a turn of the runtime's driver for every 128 decisions of a few tens
/// of ns).
async fn cooperate() {
    let due = SINCE_SPENT.with(|since| {
        let n = since.get() + 1;
        let due = n == CHECKS_A_UNIT;
        since.set(if due { 0 } else { n });
        due
    });
    if due {
        tokio::task::coop::consume_budget().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use tokio::time::Instant;

    /// A check of one token (decided from the key the store holds) spends
    /// from the bucket every other check, `peek` and `reset` use: the same
    /// storage key, for a safe key and for keys made safe whole.
    #[tokio::test(start_paused = true)]
    async fn a_check_of_one_token_spends_from_the_bucket_every_check_uses() {
        let policy = Policy::new("api", [Quota::per_hour(10).unwrap()]).unwrap();
        let limiter = RateLimiter::new(MemoryStore::new(), policy);
        for key in ["tenant-7", "a b", "#x", "\u{e9}t\u{e9}"] {
            assert_eq!(limiter.check(key, 2).await.unwrap().remaining(), 8, "{key}");
            assert_eq!(limiter.check(key, 1).await.unwrap().remaining(), 7, "{key}");
            assert_eq!(limiter.check(key, 1).await.unwrap().remaining(), 6, "{key}");
            assert_eq!(limiter.peek(key).await.unwrap().remaining(), 6, "{key}");
            limiter.reset(key).await.unwrap();
            assert_eq!(limiter.check(key, 1).await.unwrap().remaining(), 9, "{key}");
            assert_eq!(limiter.check(key, 3).await.unwrap().remaining(), 6, "{key}");
            assert_eq!(limiter.check(key, 1).await.unwrap().remaining(), 5, "{key}");
        }
        // Every key has a bucket of its own.
        assert_eq!(limiter.check("other", 1).await.unwrap().remaining(), 9);
    }

    /// A denied check charged nothing: a refund of it gives nothing back,
    /// and a charge of it charges nothing.
    #[tokio::test(start_paused = true)]
    async fn settling_a_denied_decision_changes_nothing() {
        let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_hour(2).unwrap());
        assert!(limiter.check("k", 2).await.unwrap().allowed());
        let denied = limiter.check("k", 1).await.unwrap();
        assert!(!denied.allowed());
        limiter.refund("k", 1, &denied).await.unwrap();
        limiter.charge("k", 2, &denied).await.unwrap();
        let next = limiter.check("k", 1).await.unwrap();
        assert!(!next.allowed());
        // One token of 2 an hour is due in 30 minutes, as before.
        assert_eq!(next.retry_after(), Duration::from_secs(1_800));
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_waits_for_the_refill() {
        let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_second(2).unwrap());
        let _ = limiter.check("k", 2).await.unwrap();
        let start = Instant::now();
        let d = limiter
            .acquire("k", 1, Duration::from_secs(1))
            .await
            .unwrap();
        assert!(d.allowed());
        assert_eq!(start.elapsed(), Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_gives_up_without_sleeping_past_max_wait() {
        let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_minute(1).unwrap());
        let _ = limiter.check("k", 1).await.unwrap();
        let start = Instant::now();
        let err = limiter
            .acquire("k", 1, Duration::from_secs(59))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::WaitTooLong { retry_after } if retry_after == Duration::from_secs(60))
        );
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_without_a_representable_deadline_waits_as_long_as_needed() {
        let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_minute(1).unwrap());
        let _ = limiter.check("k", 1).await.unwrap();
        let d = limiter.acquire("k", 1, Duration::MAX).await.unwrap();
        assert!(d.allowed());
    }

    #[tokio::test(start_paused = true)]
    async fn refunds_fill_up_to_capacity_and_charges_take_debt() {
        // 10 a second: one token every 100 ms.
        let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_second(10).unwrap());
        let d = limiter.check("k", 4).await.unwrap();
        assert_eq!(d.remaining(), 6);
        limiter.refund("k", 3, &d).await.unwrap();
        assert_eq!(limiter.peek("k").await.unwrap().remaining(), 9);
        // Never above the capacity, however much is refunded.
        limiter.refund("k", 1_000, &d).await.unwrap();
        assert_eq!(limiter.peek("k").await.unwrap().remaining(), 10);
        // A charge beyond what is left goes into debt: 5 tokens owed, so
        // the next token is 600 ms away.
        limiter.charge("k", 15, &d).await.unwrap();
        let denied = limiter.check("k", 1).await.unwrap();
        assert!(!denied.allowed());
        assert_eq!(denied.retry_after(), Duration::from_millis(600));
        // At most one bucket of debt (10 tokens owed): the next token is
        // 1.1 s away.
        limiter.charge("k", 1_000_000, &d).await.unwrap();
        let denied = limiter.check("k", 1).await.unwrap();
        assert_eq!(denied.retry_after(), Duration::from_millis(1_100));
    }

    /// A refund goes where its decision was made: one the fallback admitted
    /// while the store failed goes to the fallback's bucket, never to the
    /// store's, which was not charged.
    #[tokio::test]
    async fn a_refund_goes_where_its_decision_was_made() {
        let fallback_store = MemoryStore::new();
        let store = MemoryStore::new();
        let quota = Quota::per_hour(10).unwrap();
        let limiter = RateLimiter::new(store.clone(), quota)
            .fallback(Fallback::with_store(fallback_store.clone()));
        let by_store = limiter.check("k", 3).await.unwrap();
        assert!(!by_store.is_fallback());
        // A decision the fallback made (as it would while the store fails).
        let by_fallback = limiter
            .configured_fallback()
            .unwrap()
            .check(
                "default:k",
                limiter.policy(),
                2,
                &Error::Timeout(Duration::ZERO),
            )
            .unwrap()
            .0;
        assert!(by_fallback.is_fallback());
        limiter.refund("k", 2, &by_fallback).await.unwrap();
        let policy = limiter.policy().clone();
        let left = |s: &MemoryStore| s.check_now("default:k", &policy, 0).unwrap().remaining();
        assert_eq!((left(&store), left(&fallback_store)), (7, 10));
        limiter.refund("k", 3, &by_store).await.unwrap();
        assert_eq!((left(&store), left(&fallback_store)), (10, 10));
    }

    #[tokio::test]
    async fn cost_above_capacity_is_impossible_not_a_wait() {
        let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_second(5).unwrap());
        let err = limiter.check("k", 6).await.unwrap_err();
        assert!(matches!(
            err,
            Error::CostExceedsCapacity {
                cost: 6,
                capacity: 5
            }
        ));
        let err = limiter
            .acquire("k", 6, Duration::from_secs(60))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::CostExceedsCapacity { .. }));
    }
}
