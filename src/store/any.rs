//! [`AnyStore`]: any of this crate's stores, chosen at runtime.

use super::contract::Store;
use super::memory::MemoryStore;
#[cfg(feature = "redis")]
use super::redis::{RedisStore, Spend};
use super::sealed::Sealed;
#[cfg(feature = "redis")]
use std::future::Future;
use std::time::Duration;

use crate::decision::Decision;
use crate::decision::Reservation;
use crate::error::Error;
use crate::policy::Policy;
/// Any of this crate's stores, chosen at runtime; what
/// [`RateLimiter`](crate::RateLimiter) and [`RateLimitLayer`](crate::RateLimitLayer)
/// hold. See the [module docs](crate::store#choosing-a-store-at-runtime).
///
/// Converts from every store with `.into()`; calls go straight to the store
/// inside, with no allocation. Clones share the buckets.
#[derive(Clone, Debug)]
#[must_use]
pub struct AnyStore {
    inner: Inner,
}

#[derive(Clone, Debug)]
enum Inner {
    Memory(MemoryStore),
    #[cfg(feature = "redis")]
    Redis(RedisStore),
}

impl AnyStore {
    /// The in-memory store inside, if that is what this is.
    pub fn as_memory(&self) -> Option<&MemoryStore> {
        match &self.inner {
            Inner::Memory(store) => Some(store),
            #[cfg(feature = "redis")]
            Inner::Redis(_) => None,
        }
    }

    /// The Redis store inside, if that is what this is.
    #[cfg(feature = "redis")]
    pub fn as_redis(&self) -> Option<&RedisStore> {
        match &self.inner {
            Inner::Redis(store) => Some(store),
            Inner::Memory(_) => None,
        }
    }
}

/// A check that [`AnyStore::check_now`] could not answer without waiting:
/// what is left to send. (A memory store always answers at once.)
pub(crate) enum Unsent {
    /// The storage keys of a Redis check.
    #[cfg(feature = "redis")]
    Redis(Vec<String>),
}

impl AnyStore {
    /// Adjusts `key`'s buckets by `delta` tokens at once when this store
    /// can (a memory store: true); false, having done nothing, for a store
    /// that has to be asked.
    pub(crate) fn adjust_at_once(&self, key: &str, policy: &Policy, delta: i64) -> bool {
        match &self.inner {
            Inner::Memory(store) => {
                store.adjust_now(key, policy, delta);
                true
            }
            #[cfg(feature = "redis")]
            Inner::Redis(_) => false,
        }
    }

    /// [`Store::check`] as far as it goes without waiting: the decision (a
    /// memory store's, or a Redis store's deny cache), or what is left to
    /// send with [`send_unsent`](Self::send_unsent). Nothing is sent to a
    /// store here, so dropping an [`Unsent`] spends nothing.
    pub(crate) fn check_now(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<Result<Decision, Error>, Unsent> {
        match &self.inner {
            Inner::Memory(store) => Ok(store.check_now(key, policy, cost)),
            #[cfg(feature = "redis")]
            Inner::Redis(store) => store.check_now(key, policy, cost).map_err(Unsent::Redis),
        }
    }

    /// Sends what [`check_now`](Self::check_now) left, for the same key,
    /// policy and cost: the decision, and the wait (always 0 for a check).
    ///
    /// Not an `async fn`: the future returned is the Redis store's own, so a
    /// waiting check holds no copy of these arguments (see
    /// `store/redis/sending.rs`).
    #[cfg(feature = "redis")]
    pub(crate) fn send_unsent<'a>(
        &'a self,
        unsent: Unsent,
        policy: &'a Policy,
        cost: u64,
    ) -> impl Future<Output = Result<(Decision, u64), Error>> + Send + 'a {
        match unsent {
            Unsent::Redis(keys) => match &self.inner {
                Inner::Redis(store) => store.send(keys, policy, Spend::check(cost), None),
                Inner::Memory(_) => super::redis::Sending::failed(Error::store(
                    crate::ErrorKind::Server,
                    "a Redis check was sent to a memory store",
                )),
            },
        }
    }

    /// Without Redis nothing is ever left to send ([`Unsent`] has no value).
    #[cfg(not(feature = "redis"))]
    pub(crate) fn send_unsent(
        &self,
        unsent: Unsent,
        _policy: &Policy,
        _cost: u64,
    ) -> std::future::Ready<Result<(Decision, u64), Error>> {
        match unsent {}
    }
}

impl AnyStore {
    /// An adjustment after the fact: `delta` tokens spent from `key`'s
    /// buckets under `policy` (a charge) or, when negative, given back (a
    /// refund). At once in a memory store; one batched script call in Redis.
    pub(crate) async fn adjust(&self, key: &str, policy: &Policy, delta: i64) -> Result<(), Error> {
        match &self.inner {
            Inner::Memory(store) => {
                store.adjust_now(key, policy, delta);
                Ok(())
            }
            #[cfg(feature = "redis")]
            Inner::Redis(store) => Box::pin(store.adjust(key, policy, delta)).await,
        }
    }
}

impl From<MemoryStore> for AnyStore {
    fn from(store: MemoryStore) -> Self {
        AnyStore {
            inner: Inner::Memory(store),
        }
    }
}

#[cfg(feature = "redis")]
impl From<RedisStore> for AnyStore {
    fn from(store: RedisStore) -> Self {
        AnyStore {
            inner: Inner::Redis(store),
        }
    }
}

impl Sealed for AnyStore {}

impl Store for AnyStore {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, Error> {
        match &self.inner {
            Inner::Memory(store) => store.check(key, policy, cost).await,
            #[cfg(feature = "redis")]
            // Boxed: a Redis check's future (batching, timeout, breaker) is
            // kilobytes, and an unboxed one would make every memory check's
            // future, and the layer's, as large, copied on every request.
            Inner::Redis(store) => Box::pin(store.check(key, policy, cost)).await,
        }
    }

    async fn reserve(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Reservation, Error> {
        match &self.inner {
            Inner::Memory(store) => store.reserve(key, policy, cost, max_wait).await,
            #[cfg(feature = "redis")]
            Inner::Redis(store) => Box::pin(store.reserve(key, policy, cost, max_wait)).await,
        }
    }

    async fn reset(&self, key: &str, policy: &Policy) -> Result<(), Error> {
        match &self.inner {
            Inner::Memory(store) => store.reset(key, policy).await,
            #[cfg(feature = "redis")]
            Inner::Redis(store) => Box::pin(store.reset(key, policy)).await,
        }
    }
}
