//! What a client is limited by: a named list of quotas, decided together.

use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::error::ConfigError;
use crate::observe::DecisionKeys;

use crate::quota::Quota;
/// Longest policy name accepted by [`Policy::new`].
pub const MAX_POLICY_NAME_LEN: usize = 64;

/// The name of a policy made from a single [`Quota`] (`Policy::from(quota)`).
pub const DEFAULT_POLICY_NAME: &str = "default";

/// A named, non-empty set of distinct quotas, decided together (all or nothing)
/// for each check.
///
/// The name appears in the `RateLimit-Policy` and `RateLimit` response headers,
/// in metrics labels, and at the front of every storage key the HTTP layer makes
/// (`name:key-kind:key`), so two policies never share a bucket even when they
/// have the same quotas and the same client key.
///
/// A policy is checked when it is built: the name must be 1 to
/// [`MAX_POLICY_NAME_LEN`] bytes of `[A-Za-z0-9_-]`, and the quota list non-empty
/// with one quota per period (a key's buckets are told apart by period, so
/// a quota changed to other figures of its period carries them over). Build
/// policies once at start-up; clones are cheap (one reference count) and
/// nothing is validated per request.
///
/// # Example
///
/// ```
/// use tollgate::{Policy, Quota};
///
/// # fn main() -> Result<(), tollgate::ConfigError> {
/// // One quota: the policy is called "default".
/// let simple: Policy = Quota::per_second(10)?.into();
/// assert_eq!(simple.name(), "default");
///
/// // Several quotas, all or nothing: 2 a second and 500 an hour.
/// let search = Policy::new("search", [Quota::per_second(2)?, Quota::per_hour(500)?])?;
/// assert_eq!(search.quotas().len(), 2);
/// assert_eq!(search.max_cost(), 2);
/// assert!(Policy::new("bad name", [Quota::per_second(2)?]).is_err());
/// assert!(Policy::new("empty", []).is_err());
/// // Two quotas of one period: write one over another (2/s is 120/min).
/// assert!(Policy::new("twice", [Quota::per_second(2)?, Quota::per_second(5)?]).is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct Policy {
    inner: Arc<Inner>,
}

struct Inner {
    name: Box<str>,
    quotas: Box<[Quota]>,
    smallest: u64,
    /// Per quota, the end of its buckets' storage keys: `}:` and the quota's
    /// period (`}:1s`), or its figures (`}:10/s:b20`) in a policy that does
    /// not carry buckets over, written once instead of per check.
    #[cfg(feature = "redis")]
    key_tails: Box<[Box<str>]>,
    /// Values derived once per policy by the HTTP layer (its header values), so
    /// they are not rebuilt for every request.
    derived: OnceLock<Box<dyn std::any::Any + Send + Sync>>,
    /// The metrics keys of its decisions, made once.
    decision_keys: DecisionKeys,
}

impl Policy {
    /// A policy called `name` enforcing every quota in `quotas` at once.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when the name is empty, too long or has other
    /// characters than `[A-Za-z0-9_-]`, or when `quotas` is empty or has two
    /// quotas of one period. A policy's buckets are told apart by their
    /// quotas' periods: a quota changed to other figures over the same period
    /// carries its buckets over (see [`PolicyTable::swap`](crate::layer::PolicyTable::swap)),
    /// so two quotas of one period would be one bucket. Any rate can be
    /// written over another period (`10/s` is `600/min`).
    pub fn new(name: &str, quotas: impl IntoIterator<Item = Quota>) -> Result<Self, ConfigError> {
        check_name(name)?;
        let quotas: Vec<Quota> = quotas.into_iter().collect();
        if quotas.is_empty() {
            return Err(ConfigError::policy(format!(
                "policy {name:?} needs at least one quota"
            )));
        }
        for (i, q) in quotas.iter().enumerate() {
            if let Some(other) = quotas.iter().skip(i + 1).find(|o| o.same_period(q)) {
                let what = if other.same_bucket(q) {
                    format!("lists the quota {q} twice")
                } else {
                    format!(
                        "has two quotas over one period ({q} and {other}): a policy's \
                         quotas are told apart by their periods, so write one over \
                         another (10/s is also 600/min)"
                    )
                };
                return Err(ConfigError::policy(format!("policy {name:?} {what}")));
            }
        }
        Ok(Self::build(name, quotas.into()))
    }

    fn build(name: &str, quotas: Box<[Quota]>) -> Self {
        let smallest = quotas.iter().map(Quota::capacity).min().unwrap_or(0);
        #[cfg(feature = "redis")]
        let key_tails = quotas
            .iter()
            .map(|q| match carries(name) {
                true => format!("}}:{}", q.slot()),
                false => format!("}}:{}", q.figures()),
            })
            .map(String::into_boxed_str)
            .collect();
        Policy {
            inner: Arc::new(Inner {
                name: name.into(),
                quotas,
                smallest,
                #[cfg(feature = "redis")]
                key_tails,
                derived: OnceLock::new(),
                decision_keys: DecisionKeys::new(name),
            }),
        }
    }

    /// An equal policy of this thread's own (its derived values made again,
    /// once per thread), kept for the next calls: a clone of it counts a
    /// reference no other thread touches. Cloning a policy shared by the
    /// threads that serve requests, and dropping the clone, would move its
    /// count's cache line between them on every request (and the derived
    /// header values' counts with it). Up to four policies are kept per
    /// thread, the first ones asked for.
    pub(crate) fn thread_copy(&self) -> Policy {
        const KEPT: usize = 4;
        thread_local! {
            static COPIES: RefCell<Vec<(Policy, Policy)>> = const { RefCell::new(Vec::new()) };
        }
        COPIES
            .try_with(|copies| {
                let Ok(mut copies) = copies.try_borrow_mut() else {
                    return self.clone();
                };
                if let Some((_, copy)) = copies
                    .iter()
                    .find(|(of, _)| Arc::ptr_eq(&of.inner, &self.inner))
                {
                    return copy.clone();
                }
                if copies.len() >= KEPT {
                    return self.clone();
                }
                let copy = Self::build(self.name(), self.quotas().into());
                copies.push((self.clone(), copy.clone()));
                copy
            })
            .unwrap_or_else(|_| self.clone())
    }

    /// The policy name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The metrics keys of its decisions.
    pub(crate) fn decision_keys(&self) -> &DecisionKeys {
        &self.inner.decision_keys
    }

    /// Writes the key a store keeps `parts`' buckets under to `out`: the
    /// policy's name, then each part, `:` before each (`name:key` for a
    /// [`RateLimiter`](crate::RateLimiter), `name:kind:value` for a layer).
    /// The one place the format is written.
    pub(crate) fn write_key(&self, out: &mut String, parts: &[&str]) {
        out.push_str(self.name());
        for part in parts {
            out.push(':');
            out.push_str(part);
        }
    }

    /// [`write_key`](Self::write_key) to a new string of the right size.
    pub(crate) fn key_of(&self, parts: &[&str]) -> String {
        let len = parts.iter().map(|p| p.len() + 1).sum::<usize>();
        let mut key = String::with_capacity(self.name().len() + len);
        self.write_key(&mut key, parts);
        key
    }

    /// Whether a quota of this policy changed to other figures over its
    /// period carries its buckets over (see
    /// [`PolicyTable::swap`](crate::layer::PolicyTable::swap)): true for a
    /// named policy, whose name is the limit's identity as its figures
    /// change; false for [`DEFAULT_POLICY_NAME`] (a policy made from a bare
    /// [`Quota`], which has no identity but its figures: two of them on one
    /// store keep buckets of their own, and a changed quota starts fresh
    /// ones).
    pub fn carries(&self) -> bool {
        carries(self.name())
    }

    /// The quotas, in the order given.
    pub fn quotas(&self) -> &[Quota] {
        &self.inner.quotas
    }

    /// Per quota, in order, the end of its storage keys: `}:` and its
    /// period (or figures, see [`carries`](Self::carries)).
    #[cfg(feature = "redis")]
    pub(crate) fn key_tails(&self) -> &[Box<str>] {
        &self.inner.key_tails
    }

    /// Whether `other` counts a key's buckets as this one does: the same
    /// buckets (key tails) under the same rates and bursts, so that what one
    /// holds of them in process the other may spend. Compared by address
    /// first.
    #[cfg(feature = "redis")]
    pub(crate) fn same_counting(&self, other: &Policy) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
            || (self.key_tails() == other.key_tails()
                && self
                    .quotas()
                    .iter()
                    .zip(other.quotas())
                    .all(|(a, b)| a.same_bucket(b)))
    }

    /// The smallest capacity: the largest cost a check may ever be admitted with.
    pub fn max_cost(&self) -> u64 {
        self.inner.smallest
    }

    /// A value derived from this policy once and kept with it (the HTTP layer's
    /// header values). `T` must be the same type at every call site.
    pub(crate) fn derived<T: Send + Sync + 'static>(&self, make: impl FnOnce(&Self) -> T) -> &T {
        let any = self.inner.derived.get_or_init(|| Box::new(make(self)));
        match any.downcast_ref::<T>() {
            Some(value) => value,
            // Only one module derives values, always of one type.
            None => unreachable!("policy values derived as two different types"),
        }
    }
}

fn carries(name: &str) -> bool {
    name != DEFAULT_POLICY_NAME
}

impl From<Quota> for Policy {
    /// A policy of one quota, named [`DEFAULT_POLICY_NAME`].
    fn from(quota: Quota) -> Self {
        Policy::build(DEFAULT_POLICY_NAME, Box::new([quota]))
    }
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name() && self.quotas() == other.quotas()
    }
}

impl Eq for Policy {}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name())
            .field("quotas", &self.quotas())
            .finish()
    }
}

pub(crate) fn check_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_POLICY_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::policy(format!(
            "policy name {name:?} must be 1 to {MAX_POLICY_NAME_LEN} bytes of [A-Za-z0-9_-]"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        let q = Quota::per_second(1).unwrap();
        assert!(Policy::new("api_v2-x", [q]).is_ok());
        for bad in ["", "a b", "a.b", "a{b}", "é", &"x".repeat(65)] {
            assert!(Policy::new(bad, [q]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn quota_lists_are_checked() {
        let q = Quota::per_second(1).unwrap();
        let empty = Policy::new("p", []).unwrap_err();
        assert!(empty.to_string().contains("at least one quota"), "{empty}");
        let twice = Policy::new("p", [q, q]).unwrap_err();
        assert!(twice.to_string().contains("twice"), "{twice}");
        // Lock-outs aside, the same bucket: refused as well.
        let locked = q.lockout(std::time::Duration::from_secs(1)).unwrap();
        let twice = Policy::new("p", [q, locked]).unwrap_err();
        assert!(twice.to_string().contains("twice"), "{twice}");
        // Two quotas of one period would be one bucket: refused, saying how
        // to write them.
        let burst = Quota::per_second(5).unwrap().burst(50).unwrap();
        let period = Policy::new("p", [q, burst]).unwrap_err();
        let text = period.to_string();
        assert!(
            text.contains("over one period (1/s and 5/s burst 50)"),
            "{text}"
        );
        assert!(text.contains("600/min"), "{text}");
        assert!(Policy::new("p", [q, Quota::per_minute(300).unwrap().burst(50).unwrap()]).is_ok());
    }

    #[test]
    fn a_quota_is_a_default_policy() {
        let q = Quota::per_minute(3).unwrap();
        let p = Policy::from(q);
        assert_eq!(p.name(), DEFAULT_POLICY_NAME);
        assert_eq!(p.quotas(), &[q]);
        assert_eq!(p, Policy::new("default", [q]).unwrap());
    }

    #[test]
    fn derived_values_are_made_once() {
        let p = Policy::from(Quota::per_minute(3).unwrap());
        let calls = std::sync::atomic::AtomicUsize::new(0);
        for _ in 0..3 {
            let v: &String = p.derived(|p| {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                p.name().to_owned()
            });
            assert_eq!(v, "default");
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Clones share the derived values.
        let clone = p.clone();
        let v: &String = clone.derived(|_| unreachable!());
        assert_eq!(v, "default");
    }
}
