//! What a layer needs to decide a request whose key its store holds (a
//! memory store's key, or a Redis store's key with a lease that pays) in
//! the service's `call`, for less than the general check (see
//! `check::held`): built with the layer, for a configuration that
//! allows it.

use crate::decision::Decision;
use crate::key::Header;
use crate::policy::Policy;
use crate::quota::Quota;
use crate::store::{KeyPrefix, MemoryStore};
#[cfg(feature = "redis")]
use crate::store::{LeaseStart, RedisStore};

/// A layer that can use `check::held`: one policy of one quota, a
/// fixed cost, a [`Header`] key, a memory store or a Redis store whose
/// leases pay on the policy, and nothing that waits, chooses or settles (no
/// policy closure or table, no delay, shadow or settle mode).
///
/// In the order `check::held` reads it (`repr(C)`, see `Config`).
#[derive(Clone)]
#[repr(C)]
pub(crate) struct Held {
    pub(crate) header: Header,
    pub(crate) store: HeldStore,
    pub(crate) quota: Quota,
    pub(crate) cost: u64,
}

/// The store a held key is looked up in, with the storage keys' start
/// (`name:kind:`).
#[derive(Clone)]
pub(crate) enum HeldStore {
    /// The start hashed with the store's seed.
    Memory(MemoryStore, KeyPrefix),
    /// A store whose leases pay on the layer's policy, and the start (a
    /// safe key's) as its leases take it.
    #[cfg(feature = "redis")]
    Leased(RedisStore, LeaseStart),
}

impl Held {
    /// The decision on the key `value` (made safe as `prepare` makes it)
    /// under `policy` (the layer's), when the store holds that key so that
    /// it can decide it at once: as the general check would. `None`, having
    /// changed nothing, for every other key.
    #[inline]
    pub(crate) fn check(&self, value: &str, policy: &Policy) -> Option<Decision> {
        match &self.store {
            HeldStore::Memory(store, prefix) => {
                let _ = policy;
                store.check_held(prefix, value, &self.quota, self.cost)
            }
            #[cfg(feature = "redis")]
            HeldStore::Leased(store, start) => store.check_held(start, value, policy, self.cost),
        }
    }

    /// Whether the store itself answered (not a hold of a store that is
    /// asked otherwise): a memory store's decision ends a fallback's
    /// outage, a decision from a hold does not (see `RateLimiter::settle`).
    pub(crate) fn fresh(&self) -> bool {
        matches!(self.store, HeldStore::Memory(..))
    }
}
