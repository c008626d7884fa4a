//! [`Store`]: what every store promises, and the checks they all share.

use std::fmt;
use std::future::Future;

use std::time::Duration;

use super::sealed::Sealed;
use crate::decision::Decision;
use crate::decision::Reservation;
use crate::error::Error;
use crate::policy::Policy;

/// A place that keeps token buckets and decides checks against them atomically:
/// [`MemoryStore`](super::MemoryStore), [`RedisStore`](crate::RedisStore) or
/// [`AnyStore`](super::AnyStore). Sealed: see the
/// [module docs](crate::store#why-store-is-sealed).
///
/// `key` is the client key (any string: stores make it safe with
/// [`safe_key`](super::safe_key)). A check spends `cost` tokens from the bucket
/// of every quota of `policy`, or from none if any lacks them; a cost of 0 only
/// looks. A cost above a capacity is [`Error::CostExceedsCapacity`]. Buckets of
/// different quotas never mix.
pub trait Store: Sealed + Clone + fmt::Debug + Send + Sync + 'static {
    /// Spends `cost` tokens from every quota's bucket for `key`, or none if any
    /// quota lacks them.
    fn check(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// Reserves `cost` tokens from every quota's bucket for `key`, possibly
    /// ahead of their refill: admitted when they are all due within `max_wait`
    /// (the buckets then owe them, and later reservations queue behind), refused
    /// otherwise, spending nothing. The order of reservations is the order the
    /// store decides them in, so waiters are served first come, first served,
    /// across instances too.
    fn reserve(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Reservation, Error>> + Send;

    /// Forgets `key`'s buckets for the quotas of `policy`: the next check sees
    /// them full.
    fn reset(&self, key: &str, policy: &Policy) -> impl Future<Output = Result<(), Error>> + Send;
}

/// A cost above a capacity can never succeed: refused before any store is asked.
pub(crate) fn validate(policy: &Policy, cost: u64) -> Result<(), Error> {
    if cost > policy.max_cost() {
        return Err(Error::CostExceedsCapacity {
            cost,
            capacity: policy.max_cost(),
        });
    }
    Ok(())
}
