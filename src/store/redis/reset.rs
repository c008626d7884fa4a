//! A reset of a [`RedisStore`]'s buckets: the `DEL`, and what the process
//! remembers of them (denials, holds) forgotten before and after it.

use redis::Value;

use super::lease::Errand;
use super::store::RedisStore;
use crate::error::Error;
use crate::policy::Policy;
use crate::store::deny_cache::DenyCache;

impl RedisStore {
    /// Deletes `key`'s buckets under `policy` ([`Store::reset`]), with what
    /// the process remembers of them: denials and holds.
    ///
    /// [`Store::reset`]: crate::store::Store::reset
    pub(super) async fn reset_buckets(&self, key: &str, policy: &Policy) -> Result<(), Error> {
        let keys = self.keys_of(key, policy);
        if let Some(cache) = &self.inner.denials {
            cache.forget(&keys);
        }
        // Held tokens of a reset bucket are gone with it: forgotten here,
        // with those of the key's other policies on a bucket of this one
        // (theirs are reported, for their other buckets); and again once
        // the DEL is over, or this future dropped: a lease asked for
        // meanwhile may have been granted on the old buckets just before
        // the DEL took them.
        if let Some(leases) = &self.inner.leases {
            let mut errand = Errand::default();
            leases.forget(key, policy, false, &mut errand);
            self.run_errand(errand);
        }
        let _forget_after = ForgetAfter {
            store: self,
            key,
            policy,
        };
        let mut del = redis::cmd("DEL");
        del.arg(&keys);
        let del = &del;
        // Never the breaker's probe: while the breaker is open a reset fails
        // at once instead of waiting for a hung Redis.
        let admit = self.inner.breaker.admit_without_probe();
        // A check sent before the buckets were deleted may be denied by the
        // old ones and answered after: its denial is not cached. Fenced once
        // the DEL is over, or when this future is dropped before (the DEL
        // may run anyway).
        let _fence = FenceOnDrop {
            cache: self.inner.denials.as_ref(),
            keys: &keys,
        };
        self.admitted(admit, 1, None, |mut conn| async move {
            del.query_async::<Value>(&mut conn).await
        })
        .await
        .map(drop)
    }
}

/// Forgets the holds on a reset key's buckets again when dropped: after
/// the reset's `DEL`, or with the reset's future (see `Leases::forget`).
struct ForgetAfter<'a> {
    store: &'a RedisStore,
    key: &'a str,
    policy: &'a Policy,
}

impl Drop for ForgetAfter<'_> {
    fn drop(&mut self) {
        if let Some(leases) = &self.store.inner.leases {
            let mut errand = Errand::default();
            leases.forget(self.key, self.policy, true, &mut errand);
            self.store.run_errand(errand);
        }
    }
}

/// Fences the deny cache off `keys` when dropped (see [`DenyCache::fence`]).
struct FenceOnDrop<'a> {
    cache: Option<&'a DenyCache>,
    keys: &'a [String],
}

impl Drop for FenceOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(cache) = self.cache {
            cache.fence(self.keys);
        }
    }
}
