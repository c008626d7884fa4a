//! What a layer needs to decide a request whose key a memory store holds
//! in the service's `call`, for less than the general check (see
//! `check::check_held`): built with the layer, for a configuration that
//! allows it.

use crate::key::Header;
use crate::quota::Quota;
use crate::store::{KeyPrefix, MemoryStore};

/// A layer that can use `check::check_held`: one policy of one quota, a
/// fixed cost, a [`Header`] key, a memory store, and nothing that waits,
/// chooses or settles (no policy closure or table, no delay, shadow or
/// settle mode).
///
/// In the order `check_held` reads it (`repr(C)`, see `Config`).
#[derive(Clone)]
#[repr(C)]
pub(crate) struct Held {
    pub(crate) header: Header,
    /// `name:kind:`, the storage keys' start, hashed with the store's seed.
    pub(crate) prefix: KeyPrefix,
    pub(crate) store: MemoryStore,
    pub(crate) quota: Quota,
    pub(crate) cost: u64,
}
