//! A check, a reservation or an adjustment of a [`RedisStore`], as far as
//! the process decides it (a hold of a lease, a remembered denial, the
//! breaker), then sent to Redis.

use super::encode::Spend;
use super::lease::Errand;
use super::store::{RedisStore, STORE};
use crate::decision::Decision;
use crate::error::Error;
use crate::observe;
use crate::policy::Policy;
use crate::store::contract::validate;
use crate::store::key::safe_key;

impl RedisStore {
    pub(super) async fn decide(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        clock: Option<u64>,
    ) -> Result<Decision, Error> {
        self.reserve_inner(key, policy, cost, 0, clock)
            .await
            .map(|(decision, _)| decision)
    }

    /// A decision that may take on debt for `max_wait_us` (0: a plain check),
    /// and the wait until its tokens are due.
    pub(super) async fn reserve_inner(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        max_wait_us: u64,
        clock: Option<u64>,
    ) -> Result<(Decision, u64), Error> {
        validate(policy, cost)?;
        let cacheable = clock.is_none() && max_wait_us == 0 && cost > 0;
        if cacheable && let Some(decision) = self.leased(key, policy, cost) {
            return Ok((decision, 0));
        }
        let keys = self.keys_of(key, policy);
        if cacheable && let Some(decision) = self.cached_denial(&keys, policy, cost) {
            return Ok((decision, 0));
        }
        self.send(keys, policy, Spend::Take { cost, max_wait_us }, clock)
            .await
    }

    /// An adjustment after the fact: `delta` tokens spent from `key`'s
    /// buckets whatever they hold (a charge) or, when negative, given back
    /// (a refund), in one script call batched with the checks in flight.
    pub(crate) async fn adjust(&self, key: &str, policy: &Policy, delta: i64) -> Result<(), Error> {
        self.adjust_inner(key, policy, delta, None).await
    }

    pub(super) async fn adjust_inner(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        clock: Option<u64>,
    ) -> Result<(), Error> {
        if delta == 0 {
            return Ok(());
        }
        // A refund is given back first to this instance's holds, from what
        // it spent of them and has not reported: Redis still counts those
        // tokens as in the bucket, so a refund there would be clamped away
        // and the report would then debit them all.
        let mut delta = delta;
        if delta < 0
            && clock.is_none()
            && let Some(leases) = &self.inner.leases
        {
            let (given, reports) = leases.refund(&safe_key(key), policy, delta.unsigned_abs());
            self.run_errand(Errand {
                reports,
                ..Errand::default()
            });
            delta += i64::try_from(given).unwrap_or(0);
            if delta == 0 {
                return Ok(());
            }
        }
        let keys = self.keys_of(key, policy);
        self.send(keys, policy, Spend::Adjust(delta), clock)
            .await
            .map(|_| ())
    }

    /// A denial of `cost` the deny cache still holds for `keys`, made for
    /// `policy`'s quotas.
    fn cached_denial(&self, keys: &[String], policy: &Policy, cost: u64) -> Option<Decision> {
        let decision = self
            .inner
            .denials
            .as_ref()?
            .lookup(keys, policy.quotas(), cost)?;
        observe::deny_cache_hit(STORE);
        Some(decision)
    }

    /// A plain check as far as it goes without waiting: the deny cache's
    /// answer, [`Error::CircuitOpen`] while the breaker refuses calls, or the
    /// storage keys to send with [`send`](Self::send).
    pub(crate) fn check_now(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<Result<Decision, Error>, Vec<String>> {
        if let Err(err) = validate(policy, cost) {
            return Ok(Err(err));
        }
        if cost > 0
            && let Some(decision) = self.leased(key, policy, cost)
        {
            return Ok(Ok(decision));
        }
        let keys = self.keys_of(key, policy);
        if cost > 0
            && let Some(decision) = self.cached_denial(&keys, policy, cost)
        {
            return Ok(Ok(decision));
        }
        if let Some(retry_in) = self.inner.breaker.refusing() {
            let err = Error::CircuitOpen { retry_in };
            observe::store_error(STORE, &err, &self.inner.errors);
            return Ok(Err(err));
        }
        Err(keys)
    }
}
