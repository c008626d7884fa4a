//! What a request is limited by: a named list of quotas, chosen per request.

use std::fmt;
use std::sync::Arc;

use http::HeaderValue;

use crate::limiter::check_quotas;
use crate::{Error, Quota};

/// Longest policy name accepted by [`Policy::new`].
pub const MAX_POLICY_NAME_LEN: usize = 64;

/// A named set of quotas, decided together (all or nothing) for each request.
///
/// The name appears in the `RateLimit-Policy` and `RateLimit` response headers and
/// at the front of every storage key (`name:key-kind:key`), so two policies never
/// share a bucket even when they have the same quotas and the same client key.
///
/// A policy is checked when it is built: the name must be 1 to
/// [`MAX_POLICY_NAME_LEN`] bytes of `[A-Za-z0-9_-]`, and the quota list non-empty
/// without duplicates. Build policies once at start-up and clone them into the
/// closure given to [`RateLimitLayer::policy`](crate::layer::RateLimitLayer::policy);
/// clones are cheap and nothing is validated per request.
///
/// ```
/// use tollgate::Quota;
/// use tollgate::layer::Policy;
///
/// # fn main() -> Result<(), tollgate::Error> {
/// let search = Policy::new("search", [Quota::per_second(2)?, Quota::per_hour(500)?])?;
/// assert_eq!(search.name(), "search");
/// assert!(Policy::new("bad name", [Quota::per_second(2)?]).is_err());
/// assert!(Policy::new("empty", []).is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Policy {
    inner: Arc<Inner>,
}

struct Inner {
    name: Box<str>,
    quotas: Arc<[Quota]>,
    smallest: u64,
    /// The `RateLimit-Policy` field value, built once: it never changes.
    header: HeaderValue,
    /// One Structured Field string per quota, `"name"` or `"name.i"`.
    items: Box<[String]>,
}

impl Policy {
    /// A policy called `name` enforcing every quota in `quotas` at once.
    pub fn new(name: &str, quotas: impl IntoIterator<Item = Quota>) -> Result<Self, Error> {
        check_name(name)?;
        let quotas = check_quotas(quotas)?;
        let smallest = quotas.iter().map(Quota::capacity).min().unwrap_or(0);
        let items: Box<[String]> = if quotas.len() == 1 {
            Box::new([format!("\"{name}\"")])
        } else {
            // Several quotas need distinct item names, or a client could not tell
            // which `r` belongs to which `q`. `.` is outside the allowed name
            // characters, so `api.1` cannot clash with a policy of that name.
            (0..quotas.len())
                .map(|i| format!("\"{name}.{i}\""))
                .collect()
        };
        let value = items
            .iter()
            .zip(quotas.iter())
            .map(|(item, q)| {
                format!(
                    "{item};q={};w={}",
                    super::response::sf_integer(q.capacity()),
                    window_secs(q)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let header = HeaderValue::from_str(&value)
            .map_err(|e| Error::InvalidConfig(format!("policy {name:?}: {e}")))?;
        Ok(Policy {
            inner: Arc::new(Inner {
                name: name.into(),
                quotas,
                smallest,
                header,
                items,
            }),
        })
    }

    /// The policy name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The quotas, in the order given.
    pub fn quotas(&self) -> &[Quota] {
        &self.inner.quotas
    }

    /// The smallest capacity: the largest cost a request may ever be admitted with.
    pub fn max_cost(&self) -> u64 {
        self.inner.smallest
    }

    pub(crate) fn header(&self) -> &HeaderValue {
        &self.inner.header
    }

    /// The quoted item name of each quota, in order.
    pub(crate) fn items(&self) -> &[String] {
        &self.inner.items
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name())
            .field("quotas", &self.quotas())
            .finish()
    }
}

/// The `w` of a quota: seconds for an empty bucket to refill completely, rounded
/// up (the draft allows no fractions and no zero).
pub(crate) fn window_secs(q: &Quota) -> u64 {
    super::response::ceil_secs(q.refill_time()).max(1)
}

fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= MAX_POLICY_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidConfig(format!(
            "policy name {name:?} must be 1 to {MAX_POLICY_NAME_LEN} bytes of [A-Za-z0-9_-]"
        )))
    }
}

/// What the [`policy`](crate::layer::RateLimitLayer::policy) closure decides for
/// one request.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Choice {
    /// Limit by the layer's own policy (the one given to
    /// [`RateLimitLayer::new`](crate::layer::RateLimitLayer::new)).
    Default,
    /// Limit by this policy.
    Policy(Policy),
    /// Do not limit this request: no key is extracted, the store is not asked and
    /// no rate limit header is added (health checks, internal callers).
    Exempt,
}

impl From<Policy> for Choice {
    fn from(policy: Policy) -> Self {
        Choice::Policy(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn names_are_checked() {
        let q = Quota::per_second(1).unwrap();
        assert!(Policy::new("api_v2-x", [q]).is_ok());
        for bad in ["", "a b", "a.b", "a{b}", "é", &"x".repeat(65)] {
            assert!(Policy::new(bad, [q]).is_err(), "{bad:?}");
        }
        assert!(Policy::new(&"x".repeat(64), [q]).is_ok());
        assert!(Policy::new("dup", [q, q]).is_err());
    }

    #[test]
    fn policy_header_lists_every_quota() {
        let one = Policy::new("default", [Quota::per_second(10).unwrap()]).unwrap();
        assert_eq!(one.header(), "\"default\";q=10;w=1");
        let two = Policy::new(
            "api",
            [
                Quota::per_second(10).unwrap().burst(20).unwrap(),
                Quota::new(1000, Duration::from_secs(86_400)).unwrap(),
            ],
        )
        .unwrap();
        assert_eq!(two.header(), "\"api.0\";q=20;w=2, \"api.1\";q=1000;w=86400");
        // A window under a second still says 1, never 0.
        let fast = Policy::new("f", [Quota::new(5, Duration::from_millis(10)).unwrap()]).unwrap();
        assert_eq!(fast.header(), "\"f\";q=5;w=1");
        assert_eq!(two.max_cost(), 20);
    }
}
