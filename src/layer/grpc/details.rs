//! `grpc-status-details-bin` (feature `tonic`): the `google.rpc.Status` of an
//! answer with `RetryInfo` and `QuotaFailure`, encoded by tonic-types so that
//! any gRPC client can decode it (tonic: `tonic_types::StatusExt`).

use std::time::Duration;

use http::{HeaderMap, HeaderName};
use tonic_types::{ErrorDetails, QuotaViolation, StatusExt};

use super::status::Code;
use crate::decision::Decision;
use crate::layer::report::items;
use crate::policy::Policy;
/// One entry of `QuotaFailure`.
pub(super) type Violation = QuotaViolation;

const GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// Adds `grpc-status-details-bin` with `retry` as `RetryInfo` and `violations`
/// as `QuotaFailure` (each left out when absent or empty).
pub(super) fn insert(
    headers: &mut HeaderMap,
    code: Code,
    message: &str,
    retry: Option<Duration>,
    violations: Vec<Violation>,
) {
    let mut details = ErrorDetails::new();
    if retry.is_some() {
        details.set_retry_info(retry);
    }
    if !violations.is_empty() {
        details.set_quota_failure(violations);
    }
    let status =
        tonic::Status::with_error_details(tonic::Code::from_i32(code as i32), message, details);
    // tonic writes the details as unpadded base64, as its own server does; the
    // other headers it would write are already there.
    let mut encoded = HeaderMap::new();
    if status.add_header(&mut encoded).is_ok()
        && let Some(value) = encoded.remove(GRPC_STATUS_DETAILS)
    {
        headers.insert(GRPC_STATUS_DETAILS, value);
    }
}

/// One violation per quota the call did not fit in (those with a wait), so a
/// client sees which limit it hit.
pub(super) fn exhausted(policy: &Policy, decision: &Decision, kind: &str) -> Vec<QuotaViolation> {
    items(policy)
        .iter()
        .zip(decision.states())
        .filter(|(_, state)| !state.retry_after().is_zero())
        .map(|(item, state)| {
            let description = format!("{} exhausted", describe(policy, item, state.quota()));
            violation(kind, item, state.quota(), description)
        })
        .collect()
}

/// One violation per quota whose capacity is below the call's cost.
pub(super) fn too_costly(policy: &Policy, cost: u64, kind: &str) -> Vec<QuotaViolation> {
    items(policy)
        .iter()
        .zip(policy.quotas())
        .filter(|(_, quota)| quota.capacity() < cost)
        .map(|(item, quota)| {
            let description = format!(
                "{}: this call costs {cost}, more than it can ever hold",
                describe(policy, item, quota)
            );
            violation(kind, item, quota, description)
        })
        .collect()
}

/// `subject` is what the bucket is keyed by (the key kind, such as `ip`), never
/// the client's key itself; `quota_id` is the item name of the `RateLimit`
/// headers (`api`, or `api.0` in a policy of several quotas).
fn violation(kind: &str, item: &str, quota: &crate::Quota, description: String) -> QuotaViolation {
    QuotaViolation {
        subject: kind.to_owned(),
        description,
        quota_id: unquoted(item).to_owned(),
        quota_value: i64::try_from(quota.capacity()).unwrap_or(i64::MAX),
        ..QuotaViolation::default()
    }
}

/// `policy api: 10/s burst 20`, or `policy api, quota api.1: ...`: the
/// quota in its text form, as a configuration file writes it.
fn describe(policy: &Policy, item: &str, quota: &crate::Quota) -> String {
    let item = unquoted(item);
    let name = if item == policy.name() {
        format!("policy {item}")
    } else {
        format!("policy {}, quota {item}", policy.name())
    };
    format!("{name}: {quota}")
}

/// Item names are Structured Field strings (`"api"`); the details want the name.
fn unquoted(item: &str) -> &str {
    item.trim_matches('"')
}

#[cfg(test)]
mod tests {
    use super::super::{Grpc, cost_too_high, too_many};
    use super::*;
    use crate::layer::HeaderStyle;
    use crate::quota::Quota;
    use crate::store::MemoryStore;
    #[test]
    fn details_decode_with_tonic_types() {
        let fast = Quota::per_second(4).unwrap();
        let slow = Quota::per_hour(100).unwrap();
        let policy = Policy::new("api", [fast, slow]).unwrap();
        let store = MemoryStore::new();
        let _ = store.decide_at("k", &policy, 4, 0).unwrap();
        let decision = store.decide_at("k", &policy, 1, 100).unwrap();
        let res = too_many(Grpc::Native, &policy, decision, "ip", HeaderStyle::Ietf);
        let status = tonic::Status::from_header_map(res.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            status.message(),
            "rate limit exceeded: policy api, retry in 250 ms"
        );
        let retry = status.get_details_retry_info().unwrap();
        assert_eq!(retry.retry_delay, Some(Duration::from_millis(250)));
        let failure = status.get_details_quota_failure().unwrap();
        // Only the per-second quota is exhausted; the hourly one still has room.
        assert_eq!(failure.violations.len(), 1);
        let v = &failure.violations[0];
        assert_eq!(v.subject, "ip");
        assert_eq!(v.quota_id, "api.0");
        assert_eq!(v.quota_value, 4);
        assert_eq!(v.description, "policy api, quota api.0: 4/s exhausted");
    }

    #[test]
    fn a_call_too_costly_has_no_retry_info() {
        let policy = Policy::new("bulk", [Quota::per_second(5).unwrap()]).unwrap();
        let res = cost_too_high(Grpc::Native, &policy, 9, "header:x-api-key");
        let status = tonic::Status::from_header_map(res.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.get_details_retry_info().is_none());
        let failure = status.get_details_quota_failure().unwrap();
        assert_eq!(failure.violations[0].quota_id, "bulk");
        assert_eq!(failure.violations[0].subject, "header:x-api-key");
    }
}
