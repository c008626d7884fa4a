//! The storage keys of a client's buckets: `{prefix}{{client}}:` and, per
//! quota, its period (a policy that carries buckets over) or its figures.

use super::store::RedisStore;
use crate::policy::Policy;
use crate::quota::Quota;
use crate::store::key::safe_key;

impl RedisStore {
    /// The storage key of `key`'s bucket for `quota` in a policy that does
    /// not carry buckets over ([`Policy::carries`]: one made from a bare
    /// `Quota`, named `default`), whose keys name the quota's figures
    /// (`tollgate:{default:user:42}:10/s:b20`). [`bucket_keys`](Self::bucket_keys)
    /// gives the keys of any policy.
    pub fn bucket_key(&self, key: &str, quota: &Quota) -> String {
        storage_key(
            &self.inner.prefix,
            &safe_key(key),
            &format!("}}:{}", quota.figures()),
        )
    }

    /// The storage keys of `key`'s buckets under `policy`, one per quota in
    /// order: named by the quota's period (`tollgate:{api:user:42}:1s`) in a
    /// policy that carries buckets over ([`Policy::carries`]), by its figures
    /// otherwise.
    pub fn bucket_keys(&self, key: &str, policy: &Policy) -> Vec<String> {
        self.keys_of(key, policy)
    }
    /// The storage keys of `key`'s buckets, one per quota of `policy`.
    pub(super) fn keys_of(&self, key: &str, policy: &Policy) -> Vec<String> {
        let key = safe_key(key);
        policy
            .key_tails()
            .iter()
            .map(|tail| storage_key(&self.inner.prefix, &key, tail))
            .collect()
    }
}

/// `{prefix}{{{key}` and the quota's `tail` (`}:` and its period), in one
/// allocation.
pub(super) fn storage_key(prefix: &str, key: &str, tail: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1 + key.len() + tail.len());
    out.push_str(prefix);
    out.push('{');
    out.push_str(key);
    out.push_str(tail);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store that never connects (nothing here calls Redis), keys under
    /// `app:rl:`.
    fn store() -> RedisStore {
        RedisStore::builder()
            .url("redis://127.0.0.1:1")
            .prefix("app:rl:")
            .build()
            .unwrap()
    }

    #[test]
    fn a_checks_keys_are_the_bucket_keys_of_its_quotas() {
        let store = store();
        let policy = Policy::new(
            "p",
            [
                Quota::per_second(10).unwrap(),
                Quota::per_hour(1_000).unwrap().burst(50).unwrap(),
            ],
        )
        .unwrap();
        let bare = Policy::from(Quota::per_second(10).unwrap().burst(20).unwrap());
        for key in ["user:42", "a key with spaces", &"x".repeat(300)] {
            let expected: Vec<String> = bare
                .quotas()
                .iter()
                .map(|q| store.bucket_key(key, q))
                .collect();
            assert_eq!(store.keys_of(key, &bare), expected);
            assert_eq!(store.bucket_keys(key, &bare), expected);
            assert_eq!(store.bucket_keys(key, &policy), store.keys_of(key, &policy));
        }
        // A named policy's keys name periods; an unnamed one's, figures.
        assert_eq!(
            store.bucket_keys("user:42", &policy),
            ["app:rl:{user:42}:1s", "app:rl:{user:42}:1h"]
        );
        assert_eq!(
            store.bucket_key("user:42", &bare.quotas()[0]),
            "app:rl:{user:42}:10/s:b20"
        );
    }

    /// The lease map writes a key's storage keys out from the store's
    /// prefix, the key's storage-safe name and its policy when it asks for
    /// a lease (it keeps none): the keys the store's own checks use, for a
    /// key that is its own safe form and for one that is not.
    #[test]
    fn a_lease_asks_for_the_keys_the_store_checks() {
        let store = store();
        let leases = store
            .inner
            .leases
            .as_ref()
            .expect("leases are on by default");
        let named = Policy::new(
            "p",
            [
                Quota::per_second(100).unwrap(),
                Quota::per_minute(6_000).unwrap().burst(500).unwrap(),
            ],
        )
        .unwrap();
        let bare = Policy::from(Quota::per_second(100).unwrap().burst(200).unwrap());
        for policy in [&named, &bare] {
            for key in ["user:42", "a key with spaces", &"x".repeat(300)] {
                let name = safe_key(key);
                let ask = (0..8)
                    .find_map(|_| {
                        let mut errand = crate::store::redis::lease::Errand::default();
                        let _ = leases.check(&name, policy, 1, &mut errand);
                        errand.lease
                    })
                    .expect("a key checked at once asks for a lease");
                assert_eq!(ask.asked.keys, store.keys_of(key, policy), "{key}");
            }
        }
    }
}
