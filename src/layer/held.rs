//! What a layer needs to decide a request whose key its store holds (a
//! memory store's key, or a Redis store's key with a lease that pays) in
//! the service's `call`, for less than the general check (see
//! `check::held`): built with the layer, for a configuration that
//! allows it.

use crate::decision::Decision;
use crate::key::Header;
use crate::policy::Policy;
use crate::store::HeldKeys;
use crate::store::bucket::Spent;

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
    /// The store's fast path for the layer's keys.
    pub(crate) keys: HeldKeys,
}

impl Held {
    /// The decision on the key `value` (made safe as `prepare` makes it)
    /// under `policy` (the layer's), when the store holds that key so that
    /// it can decide it at once: as the general check would. `None`, having
    /// changed nothing, for every other key.
    ///
    /// As figures (see `HeldKeys::decide`): [`decision`](Self::decision)
    /// builds the decision where it is placed.
    #[inline]
    pub(crate) fn check(&self, value: &str, policy: &Policy) -> Option<Spent> {
        self.keys.decide(value, policy)
    }

    /// The decision `spent` (an answer of [`check`](Self::check)) is.
    #[inline]
    pub(crate) fn decision(&self, spent: Spent) -> Decision {
        self.keys.decision(spent)
    }

    /// Whether the store itself answered (not a hold of a store that is
    /// asked otherwise): a memory store's decision ends a fallback's
    /// outage, a decision from a hold does not (see `RateLimiter::conclude`).
    pub(crate) fn fresh(&self) -> bool {
        self.keys.fresh()
    }
}
