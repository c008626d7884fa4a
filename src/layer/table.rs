//! [`PolicyTable`]: an ordered list of [`PolicyRule`]s that chooses the
//! policy and key of each request, and can be replaced while serving.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use http::request::Parts;

use super::options::Selected;
use super::rule::{PolicyRule, called_method, matched_route};
use crate::error::ConfigError;
/// The limits of a layer as data: rules tried in order, the first that
/// applies to a request choosing its policy and key. Install it with
/// [`RateLimitLayer::policy_table`](super::RateLimitLayer::policy_table);
/// replace its rules while serving with [`swap`](Self::swap). With the `serde`
/// cargo feature it reads from and writes to configuration files (TOML, YAML,
/// JSON, environment variables through a serde source) as a list of rules.
///
/// Clones share the rules: keep one clone to swap, give another to the
/// layer. A request that no rule applies to is limited by the layer's own
/// policy and key, as [`Choice::Default`](super::Choice::Default) is. See the
/// [module docs](crate::layer#policy-tables) for the file format, how routes
/// and gRPC methods match, and what a swap does to buckets.
///
/// ```
/// use tollgate::layer::{PolicyRule, PolicyTable, RateLimitLayer};
/// use tollgate::{MemoryStore, Policy, Quota};
///
/// # fn main() -> Result<(), tollgate::ConfigError> {
/// let rules = |per_minute| -> Result<PolicyTable, tollgate::ConfigError> {
///     PolicyTable::new([
///         PolicyRule::exempt("health")?.routes(["GET /health"])?,
///         PolicyRule::new(Policy::new("login", [Quota::per_minute(per_minute)?])?)
///             .routes(["POST /login"])?,
///     ])
/// };
/// let table = rules(5)?;
/// let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(10)?)
///     .policy_table(table.clone());
/// // Later, from a configuration reload: the layer sees the new rules at once.
/// table.swap(rules(10)?);
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
#[must_use]
pub struct PolicyTable {
    rules: Arc<RwLock<Arc<[PolicyRule]>>>,
}

impl PolicyTable {
    /// A table of `rules`, tried in order.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the entries (1-based) when two rules have the
    /// same name (names are the buckets' namespace), when a rule's policy is
    /// named `default` (kept for a bare quota's, see [`Policy::carries`](crate::Policy::carries)), when
    /// a rule follows one that applies to every request (it could never
    /// apply), or when an exemption has a key.
    pub fn new(rules: impl IntoIterator<Item = PolicyRule>) -> Result<Self, ConfigError> {
        let rules: Vec<PolicyRule> = rules.into_iter().collect();
        check(&rules)?;
        Ok(PolicyTable {
            rules: Arc::new(RwLock::new(rules.into())),
        })
    }

    /// Replaces the rules of this table, and of every clone of it, by those
    /// of `new`, atomically: a request chooses under the old rules or the
    /// new, never a mix. Requests already decided keep their decision.
    ///
    /// Buckets are named by policy, key kind and the period of each quota: a
    /// quota changed to other figures over the same period keeps its
    /// buckets, each carried into the new figures by the share of its
    /// capacity spent (a client that had spent its burst gets none of the
    /// new one); a changed period, name or key starts fresh, full buckets.
    /// See the [module docs](crate::layer#changing-limits-at-runtime).
    pub fn swap(&self, new: PolicyTable) {
        let rules = new.snapshot();
        *self.rules.write().unwrap_or_else(PoisonError::into_inner) = rules;
    }

    /// The rules now, in order.
    pub fn rules(&self) -> Vec<PolicyRule> {
        self.snapshot().to_vec()
    }

    fn snapshot(&self) -> Arc<[PolicyRule]> {
        Arc::clone(&self.rules.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// What the first rule that applies to `parts` chooses.
    pub(crate) fn select(&self, parts: &Parts) -> Selected {
        let route = matched_route(parts);
        let call = called_method(parts);
        let rules = self.rules.read().unwrap_or_else(PoisonError::into_inner);
        rules
            .iter()
            .find(|rule| rule.matches(&parts.method, route, call))
            .map_or(Selected::Default, PolicyRule::selected)
    }
}

/// Runs at start-up and on every table a reload builds, never per request.
fn check(rules: &[PolicyRule]) -> Result<(), ConfigError> {
    let entry =
        |(j, rule): (usize, &PolicyRule)| format!("policy {:?} (entry {})", rule.name(), j + 1);
    for (i, rule) in rules.iter().enumerate() {
        let mut before = rules.iter().enumerate().take(i);
        if let Some(first) = before.clone().find(|(_, r)| r.name() == rule.name()) {
            return Err(ConfigError::policy(format!(
                "{} and entry {} have the same name: a name is its buckets' namespace, so \
                 each must be unique (list several routes in one entry to share a budget)",
                entry(first),
                i + 1
            )));
        }
        if let Some(all) = before.find(|(_, r)| r.applies_to_all()) {
            return Err(ConfigError::policy(format!(
                "{} can never apply: {} before it applies to every request (put it last)",
                entry((i, rule)),
                entry(all)
            )));
        }
        if !rule.is_exempt() && rule.name() == crate::policy::DEFAULT_POLICY_NAME {
            return Err(ConfigError::policy(format!(
                "{}: the name \"default\" is kept for the policy of a bare quota, whose \
                 buckets are told apart by their figures and start fresh when they change; \
                 name the entry for what it limits, so that a changed quota carries its \
                 buckets over",
                entry((i, rule))
            )));
        }
        if rule.is_exempt() && rule.applies_to_all() {
            return Err(ConfigError::policy(format!(
                "{} exempts every request (it names no route and no gRPC method), so the \
                 layer would never limit: give it the routes to exempt",
                entry((i, rule))
            )));
        }
        if rule.is_exempt() && rule.rule_key().is_some() {
            return Err(ConfigError::policy(format!(
                "{} exempts requests, so it takes no key",
                entry((i, rule))
            )));
        }
    }
    Ok(())
}

impl fmt::Debug for PolicyTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules = self.snapshot();
        f.debug_list()
            .entries(rules.iter().map(PolicyRule::name))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::RuleKey;
    use crate::policy::Policy;
    use crate::quota::Quota;
    use http::Request;

    fn limit(name: &str) -> PolicyRule {
        PolicyRule::new(Policy::new(name, [Quota::per_second(1).unwrap()]).unwrap())
    }

    fn chosen(table: &PolicyTable, req: http::request::Builder) -> String {
        let (parts, ()) = req.body(()).unwrap().into_parts();
        match table.select(&parts) {
            Selected::Default => "default".into(),
            Selected::Exempt => "exempt".into(),
            Selected::Policy(p) => p.name().into(),
            Selected::Keyed(p, key) => format!("{}:{}", p.name(), key.kind()),
        }
    }

    /// An exemption without routes would switch the limit off for every
    /// request: refused at start-up, naming the entry.
    #[test]
    fn an_exemption_of_every_request_is_refused() {
        let err = PolicyTable::new([
            limit("api").grpc(["/x.Api/Get"]).unwrap(),
            PolicyRule::exempt("health").unwrap(),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("\"health\" (entry 2)"), "{err}");
        assert!(
            PolicyTable::new([PolicyRule::exempt("health")
                .unwrap()
                .grpc(["/grpc.health.v1.Health/*"])
                .unwrap()])
            .is_ok()
        );
    }

    #[test]
    fn the_first_rule_that_applies_chooses() {
        let table = PolicyTable::new([
            PolicyRule::exempt("health")
                .unwrap()
                .grpc(["/grpc.health.v1.Health/*"])
                .unwrap(),
            limit("writes")
                .grpc(["/shop.v1.Orders/Create"])
                .unwrap()
                .key(RuleKey::global()),
            limit("rest"),
        ])
        .unwrap();
        assert_eq!(
            chosen(&table, Request::post("/grpc.health.v1.Health/Check")),
            "exempt"
        );
        assert_eq!(
            chosen(&table, Request::post("/shop.v1.Orders/Create")),
            "writes:global"
        );
        assert_eq!(
            chosen(&table, Request::post("/shop.v1.Orders/List")),
            "rest"
        );
        let empty = PolicyTable::default();
        assert_eq!(chosen(&empty, Request::get("/")), "default");
        // A swap shows in every clone.
        let clone = empty.clone();
        empty.swap(table);
        assert_eq!(chosen(&clone, Request::get("/")), "rest");
        assert_eq!(format!("{clone:?}"), "[\"health\", \"writes\", \"rest\"]");
    }

    #[test]
    fn a_table_entry_may_not_take_the_bare_quotas_name() {
        // Its buckets would be told apart by figures, and a changed quota
        // would start them fresh: the burst a reload must not hand out.
        let err = PolicyTable::new([limit("api").grpc(["/x.Y/Z"]).unwrap(), limit("default")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("policy \"default\" (entry 2)"), "{err}");
        assert!(err.contains("kept for the policy of a bare quota"), "{err}");
        let exempt = PolicyRule::exempt("default")
            .unwrap()
            .grpc(["/grpc.health.v1.Health/*"])
            .unwrap();
        assert!(PolicyTable::new([exempt, limit("api")]).is_ok());
    }

    #[test]
    fn tables_refuse_what_could_never_work_naming_the_entries() {
        let err = PolicyTable::new([limit("a"), limit("b").grpc(["/x.Y/Z"]).unwrap()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("policy \"b\" (entry 2) can never apply: policy \"a\" (entry 1)"),
            "{err}"
        );
        let err = PolicyTable::new([
            limit("a").grpc(["/x.Y/Z"]).unwrap(),
            limit("a").grpc(["/x.Y/W"]).unwrap(),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("policy \"a\" (entry 1) and entry 2 have the same name"),
            "{err}"
        );
        let err = PolicyTable::new([PolicyRule::exempt("h")
            .unwrap()
            .grpc(["/x.H/Get"])
            .unwrap()
            .key(RuleKey::global())])
        .unwrap_err()
        .to_string();
        assert!(err.contains("takes no key"), "{err}");
    }
}
