//! How a check ended ([`Decided`]): by the store, by the fallback while the
//! store fails, or without a decision; and its report to tracing and
//! metrics.

use crate::decision::Decision;
use crate::error::Error;
use crate::observe::{self, Outcome};
use crate::policy::Policy;

/// How a check ended, for callers that need more than `Result<Decision>`.
#[derive(Debug)]
pub(crate) enum Decided {
    /// The store decided.
    Store(Decision),
    /// The store failed with `error`; the fallback decided, under `policy`
    /// (the quotas scaled to this instance's share).
    Fallback {
        decision: Decision,
        policy: Policy,
        error: Error,
    },
    /// No decision: the store failed (and the fallback too, if any), or the
    /// cost can never be admitted.
    Failed(Error),
}

/// What the fallback's `answer` decides for a store that failed with
/// `error`.
pub(super) fn fell_back(answer: Result<(Decision, Policy), Error>, error: Error) -> Decided {
    match answer {
        Ok((decision, policy)) => Decided::Fallback {
            decision,
            policy,
            error,
        },
        // The fallback refused the request itself (never a store problem):
        // answer that, rather than forward it unlimited.
        Err(refused) if !refused.is_store_error() => Decided::Failed(refused),
        Err(_) => Decided::Failed(error),
    }
}

/// Reports a decision to tracing and metrics.
pub(super) fn report(policy: &Policy, key_kind: &str, decided: &Decided) {
    let outcome = match decided {
        Decided::Store(d) if d.allowed() => Outcome::Allowed,
        Decided::Store(_) => Outcome::Limited,
        Decided::Fallback { decision, .. } if decision.allowed() => Outcome::FallbackAllowed,
        Decided::Fallback { .. } => Outcome::FallbackLimited,
        Decided::Failed(e) if e.is_store_error() => Outcome::StoreError,
        Decided::Failed(_) => Outcome::Limited,
    };
    observe::decision(policy.name(), policy.decision_keys(), key_kind, outcome);
}
