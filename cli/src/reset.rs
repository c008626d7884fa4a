//! `tollgate reset`: forgets one key's buckets, so its next check finds
//! them full.

use serde_json::json;
use tollgate::store::BucketState;
use tollgate::{Policy, RateLimiter, RedisStore};

use crate::fail::Failure;
use crate::key::bucket_keys;
use crate::outcome::Outcome;

/// Resets `key`'s buckets under `policy`, saying what instances held of
/// them: holds die with the buckets, but their holders may still spend
/// what they held until the holds expire.
pub(crate) async fn reset(
    store: &RedisStore,
    policy: &Policy,
    key: &str,
) -> Result<Outcome, Failure> {
    let keys = bucket_keys(store, policy, key);
    let before = store.read_buckets(policy, &keys).await?;
    let stored = before.iter().flatten().count();
    let held = before
        .iter()
        .flatten()
        .map(BucketState::held)
        .max()
        .unwrap_or(0);
    RateLimiter::new(store.clone(), policy.clone())
        .reset(key)
        .await?;
    let mut text = format!(
        "reset key {key} of policy {}: {stored} of {} buckets were stored; all are full now\n",
        policy.name(),
        keys.len()
    );
    if held > 0 {
        text.push_str(&format!(
            "instances held up to {held} tokens of them with leases: they may still spend \
             those until their holds expire\n"
        ));
    }
    let json = json!({
        "policy": policy.name(),
        "key": key,
        "reset": true,
        "buckets_stored": stored,
        "buckets": keys.len(),
        "held": held,
    });
    Ok(Outcome::done(text, json))
}
