//! `tollgate peek`: every quota's remaining tokens, reset time and holds
//! for one key, spending nothing.

use std::fmt::Write;

use serde_json::json;
use tollgate::store::BucketState;
use tollgate::{Policy, RateLimiter, RedisStore};

use crate::fail::Failure;
use crate::key::bucket_keys;
use crate::outcome::Outcome;
use crate::show::{human, millis};

/// Peeks at `key`'s buckets under `policy`: the figures a check of no cost
/// answers, and the holds read from the buckets themselves.
pub(crate) async fn peek(
    store: &RedisStore,
    policy: &Policy,
    key: &str,
) -> Result<Outcome, Failure> {
    let limiter = RateLimiter::new(store.clone(), policy.clone());
    let decision = limiter.peek(key).await?;
    let keys = bucket_keys(store, policy, key);
    let buckets = store.read_buckets(policy, &keys).await?;
    let mut text = format!("policy {}, key {key}\n", policy.name());
    let _ = writeln!(
        text,
        "{:<20} {:>10} {:>10} {:>9} {:>6} {:>6}",
        "quota", "remaining", "limit", "full in", "held", "holds"
    );
    let mut quotas = Vec::new();
    let mut hold_lines = String::new();
    for ((state, storage_key), bucket) in decision.states().iter().zip(&keys).zip(&buckets) {
        let quota = state.quota().to_string();
        let holds = bucket.as_ref().map(BucketState::holds).unwrap_or_default();
        let held = bucket.as_ref().map_or(0, BucketState::held);
        let _ = writeln!(
            text,
            "{quota:<20} {:>10} {:>10} {:>9} {held:>6} {:>6}",
            state.remaining(),
            state.limit(),
            human(state.reset_after()),
            holds.len(),
        );
        for hold in holds {
            let _ = writeln!(
                hold_lines,
                "  hold {} on {quota}: {} tokens, expires in {}",
                hold.id(),
                hold.tokens(),
                human(hold.expires_in())
            );
        }
        quotas.push(json!({
            "quota": quota,
            "storage_key": storage_key,
            "stored": bucket.is_some(),
            "limit": state.limit(),
            "remaining": state.remaining(),
            "reset_after_ms": millis(state.reset_after()),
            "held": held,
            "holds": holds.iter().map(|h| json!({
                "id": h.id(),
                "tokens": h.tokens(),
                "expires_in_ms": millis(h.expires_in()),
            })).collect::<Vec<_>>(),
        }));
    }
    text.push_str(&hold_lines);
    let json = json!({
        "policy": policy.name(),
        "key": key,
        "remaining": decision.remaining(),
        "limit": decision.limit(),
        "reset_after_ms": millis(decision.reset_after()),
        "quotas": quotas,
    });
    Ok(Outcome::done(text, json))
}
