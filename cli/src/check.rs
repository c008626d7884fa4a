//! `tollgate check`: spends tokens from one key's buckets, as a check in
//! the application would, and exits 0 when admitted, 1 when refused.

use std::process::ExitCode;

use serde_json::json;
use tollgate::{Policy, RateLimiter, RedisStore};

use crate::fail::Failure;
use crate::outcome::Outcome;
use crate::show::{human, millis};

/// Checks `cost` tokens for `key` under `policy`. A refused check spent
/// nothing and tells how long until it would be admitted.
pub(crate) async fn check(
    store: &RedisStore,
    policy: &Policy,
    key: &str,
    cost: u64,
) -> Result<Outcome, Failure> {
    let limiter = RateLimiter::new(store.clone(), policy.clone());
    let decision = limiter.check(key, cost).await?;
    let (text, code) = if decision.allowed() {
        let text = format!(
            "admitted: {cost} for key {key} of policy {}, {} of {} left\n",
            policy.name(),
            decision.remaining(),
            decision.limit()
        );
        (text, ExitCode::SUCCESS)
    } else {
        let text = format!(
            "refused: {cost} for key {key} of policy {}, retry in {}\n",
            policy.name(),
            human(decision.retry_after())
        );
        (text, ExitCode::from(1))
    };
    let quotas: Vec<_> = decision
        .states()
        .iter()
        .map(|s| {
            json!({
                "quota": s.quota().to_string(),
                "limit": s.limit(),
                "remaining": s.remaining(),
                "retry_after_ms": millis(s.retry_after()),
                "reset_after_ms": millis(s.reset_after()),
            })
        })
        .collect();
    let json = json!({
        "policy": policy.name(),
        "key": key,
        "cost": cost,
        "allowed": decision.allowed(),
        "limit": decision.limit(),
        "remaining": decision.remaining(),
        "retry_after_ms": millis(decision.retry_after()),
        "reset_after_ms": millis(decision.reset_after()),
        "quotas": quotas,
    });
    Ok(Outcome { text, json, code })
}
