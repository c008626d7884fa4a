//! [`HeldKeys`]: what a layer gets from its store once, when it is built,
//! to decide the keys the store holds at once: a memory store's keys seen
//! before, a leasing Redis store's keys whose hold pays.
//!
//! The layer names a start (`policy:kind:`, its storage keys' start) and
//! then checks values: the store hashes the start once, and a check of a
//! value it holds is decided without writing the key out. Everything the
//! fast paths need is inside; the layer sees none of it.

use super::any::AnyStore;
use super::bucket::Spent;
use super::memory::MemoryStore;
#[cfg(feature = "redis")]
use super::redis::RedisStore;
use super::table::KeyStart;
use crate::decision::Decision;
use crate::policy::Policy;
use crate::quota::Quota;

/// A store's fast path for one layer's keys: one policy of one quota, a
/// fixed cost, keys that begin with one start.
#[derive(Clone)]
pub(crate) struct HeldKeys {
    at: At,
    quota: Quota,
    cost: u64,
}

#[derive(Clone)]
enum At {
    /// A memory store, the start hashed with its seed.
    Memory(MemoryStore, KeyStart),
    /// A Redis store whose leases pay on the policy, and the start as its
    /// leases take it.
    #[cfg(feature = "redis")]
    Leased(RedisStore, KeyStart),
}

impl AnyStore {
    /// The fast path for checks of `cost` under `policy` of keys that begin
    /// with `start`, when this store has one for them: `policy` has one
    /// quota, `cost` is at most its capacity, and the store is a memory
    /// store, or a Redis store whose leases pay on `policy` (then `cost` is
    /// at least 1 and `start` a safe key's).
    pub(crate) fn held_keys(&self, start: &str, policy: &Policy, cost: u64) -> Option<HeldKeys> {
        let [quota] = policy.quotas() else {
            return None;
        };
        if cost > policy.max_cost() {
            return None;
        }
        let at = match self.as_memory() {
            Some(memory) => At::Memory(memory.clone(), memory.key_start(start)?),
            None => leased(self, start, policy, cost)?,
        };
        Some(HeldKeys {
            at,
            quota: *quota,
            cost,
        })
    }
}

#[cfg(feature = "redis")]
fn leased(store: &AnyStore, start: &str, policy: &Policy, cost: u64) -> Option<At> {
    let redis = store.as_redis()?;
    if cost == 0 || !redis.leases_pay_on(policy) || !super::key::is_safe(start.as_bytes()) {
        return None;
    }
    Some(At::Leased(redis.clone(), redis.lease_start(start)?))
}

#[cfg(not(feature = "redis"))]
fn leased(_: &AnyStore, _: &str, _: &Policy, _: u64) -> Option<At> {
    None
}

impl HeldKeys {
    /// The decision on the key `start` + `value` (`value` made safe as a
    /// layer makes it) under `policy` (the one this was built for), when
    /// the store holds that key so that it can decide it at once: as the
    /// general check would. `None`, having changed nothing, for every other
    /// key. Its answer is not yet a [`Decision`]: the caller builds that
    /// where it places it ([`decision`](Self::decision)), so it is written
    /// once, not moved through every call (it is four words until then).
    #[inline]
    pub(crate) fn decide(&self, value: &str, policy: &Policy) -> Option<Spent> {
        match &self.at {
            At::Memory(store, start) => {
                let _ = policy;
                store.check_held(start, value, &self.quota, self.cost)
            }
            #[cfg(feature = "redis")]
            At::Leased(store, start) => store.check_held(start, value, policy, self.cost),
        }
    }

    /// The decision `spent` (an answer of [`decide`](Self::decide)) is.
    #[inline]
    pub(crate) fn decision(&self, spent: Spent) -> Decision {
        spent.decision(&self.quota)
    }

    /// [`decide`](Self::decide) of a key as its caller gave it, not made
    /// safe: `None` for a key that is not safe (see `store::key`), whose
    /// storage key is made safe whole, so it goes the whole way.
    #[inline]
    pub(crate) fn decide_as_is(&self, key: &str, policy: &Policy) -> Option<Spent> {
        if !super::key::is_safe(key.as_bytes()) {
            return None;
        }
        self.decide(key, policy)
    }

    /// Whether the store itself answers (not a hold of a store that is
    /// asked otherwise): a memory store's decision ends a fallback's
    /// outage, a decision from a hold does not (see `RateLimiter::conclude`).
    pub(crate) fn fresh(&self) -> bool {
        matches!(self.at, At::Memory(..))
    }

    /// The cost of every check.
    pub(crate) fn cost(&self) -> u64 {
        self.cost
    }
}
