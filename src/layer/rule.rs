//! [`PolicyRule`]: one entry of a [`PolicyTable`](super::PolicyTable): which
//! requests it applies to (axum route templates, gRPC methods), and the
//! policy and key it limits them by.

use std::fmt;

use http::Method;
use http::request::Parts;

use super::grpc::grpc_method;
use super::options::Selected;
use super::rule_key::RuleKey;
use crate::error::ConfigError;
use crate::policy::Policy;
use crate::policy::check_name;
/// The longest route or gRPC method a rule accepts.
const MAX_PATTERN_LEN: usize = 1024;

/// One entry of a [`PolicyTable`](super::PolicyTable): the requests it
/// applies to, and the [`Policy`] (with, optionally, a [`RuleKey`]) it limits
/// them by, or an exemption.
///
/// A rule applies to a request when one of its [`routes`](Self::routes) or
/// [`grpc`](Self::grpc) methods matches; a rule with neither applies to every
/// request (so it must come last in its table). See the
/// [module docs](crate::layer#policy-tables) for how routes and methods are
/// matched.
///
/// ```
/// use tollgate::layer::{PolicyRule, RuleKey};
/// use tollgate::{Policy, Quota};
///
/// # fn main() -> Result<(), tollgate::ConfigError> {
/// let login = PolicyRule::new(Policy::new("login", [Quota::per_minute(5)?])?)
///     .routes(["POST /login"])?;
/// let writes = PolicyRule::new(Policy::new("writes", [Quota::per_second(2)?])?)
///     .grpc(["/shop.v1.Orders/Create", "/shop.v1.Admin/*"])?
///     .key(RuleKey::client_ip_trusted_proxies(["10.0.0.0/8"])?);
/// let health = PolicyRule::exempt("health")?.routes(["GET /health"])?;
/// assert_eq!(login.name(), "login");
/// assert!(health.is_exempt() && writes.policy().is_some());
/// assert!(PolicyRule::exempt("health")?.routes(["GET /items/:id"]).is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct PolicyRule {
    name: String,
    policy: Option<Policy>,
    key: Option<RuleKey>,
    routes: Vec<RoutePattern>,
    grpc: Vec<GrpcPattern>,
}

impl PolicyRule {
    /// Limits the requests this rule applies to by `policy` (named after it),
    /// keyed by the layer's own key until [`key`](Self::key) says otherwise.
    /// It applies to every request until [`routes`](Self::routes) or
    /// [`grpc`](Self::grpc) narrow it.
    pub fn new(policy: Policy) -> Self {
        PolicyRule {
            name: policy.name().to_owned(),
            policy: Some(policy),
            key: None,
            routes: Vec::new(),
            grpc: Vec::new(),
        }
    }

    /// Exempts the requests this rule applies to: no key, no store call, no
    /// header, as [`Choice::Exempt`](super::Choice::Exempt). `name` only names
    /// the rule (in messages), with the rules of policy names.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when `name` is not 1 to 64 bytes of `[A-Za-z0-9_-]`.
    pub fn exempt(name: &str) -> Result<Self, ConfigError> {
        check_name(name)?;
        Ok(PolicyRule {
            name: name.to_owned(),
            policy: None,
            key: None,
            routes: Vec::new(),
            grpc: Vec::new(),
        })
    }

    /// Counts requests against `key` instead of the layer's key.
    pub fn key(mut self, key: RuleKey) -> Self {
        self.key = Some(key);
        self
    }

    /// Applies the rule to these axum routes: route templates as registered
    /// on the router, optionally after a method, `"/login"`, `"POST /login"`,
    /// `"GET /items/{id}"`. A request matches when axum's `MatchedPath` is the
    /// template, and, for a method, when the request's method is it (`GET`
    /// also matches `HEAD`, which axum answers with the `GET` handler).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the route when it does not start with `/`,
    /// holds whitespace or control characters, is longer than 1024 bytes,
    /// writes a parameter the old way (`/:id`, `/*rest`: axum 0.8 writes
    /// `{id}`, `{*rest}`), or has a method that is not an upper-case HTTP
    /// token; and always without tollgate's `axum` feature, which reads
    /// `MatchedPath`.
    pub fn routes<I, S>(mut self, routes: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        for route in routes {
            let route = route.as_ref();
            let pattern = RoutePattern::parse(route).map_err(|e| e.about(named("route", route)))?;
            self.routes.push(pattern);
        }
        Ok(self)
    }

    /// Applies the rule to these gRPC methods, written as their paths:
    /// `"/package.Service/Method"`, or `"/package.Service/*"` for every method
    /// of a service. A call matches by its path alone (as
    /// [`grpc_method`](super::grpc_method) reads it), whatever its
    /// `content-type`, so a client cannot step around the rule.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the method when it is not of that form.
    pub fn grpc<I, S>(mut self, methods: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        for method in methods {
            let method = method.as_ref();
            let pattern =
                GrpcPattern::parse(method).map_err(|e| e.about(named("gRPC method", method)))?;
            self.grpc.push(pattern);
        }
        Ok(self)
    }

    /// The rule's name: its policy's, or the name of an exemption.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The policy, or `None` for an exemption.
    pub fn policy(&self) -> Option<&Policy> {
        self.policy.as_ref()
    }

    /// True for an [`exempt`](Self::exempt) rule.
    pub fn is_exempt(&self) -> bool {
        self.policy.is_none()
    }

    /// True when the rule names no route and no gRPC method: it applies to
    /// every request.
    pub fn applies_to_all(&self) -> bool {
        self.routes.is_empty() && self.grpc.is_empty()
    }

    pub(crate) fn rule_key(&self) -> Option<&RuleKey> {
        self.key.as_ref()
    }

    /// The routes as written (normalised: `POST /login`).
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn route_texts(&self) -> impl Iterator<Item = String> + '_ {
        self.routes.iter().map(ToString::to_string)
    }

    /// The gRPC methods as written.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn grpc_texts(&self) -> impl Iterator<Item = String> + '_ {
        self.grpc.iter().map(ToString::to_string)
    }

    /// True when the rule applies to a request of `method`, whose route
    /// template (if axum matched one) is `route` and whose path names the
    /// gRPC method `call` (if it does).
    pub(crate) fn matches(
        &self,
        method: &Method,
        route: Option<&str>,
        call: Option<(&str, &str)>,
    ) -> bool {
        if self.applies_to_all() {
            return true;
        }
        let by_route = route.is_some_and(|r| self.routes.iter().any(|p| p.matches(method, r)));
        by_route || call.is_some_and(|c| self.grpc.iter().any(|p| p.matches(c)))
    }

    /// What the layer does with a request this rule applies to.
    pub(crate) fn selected(&self) -> Selected {
        match (&self.policy, &self.key) {
            (None, _) => Selected::Exempt,
            (Some(policy), None) => Selected::Policy(policy.clone()),
            (Some(policy), Some(key)) => Selected::Keyed(policy.clone(), key.extractor().clone()),
        }
    }
}

/// `route "..."` or `gRPC method "..."`, shortened, for messages.
fn named(what: &str, text: &str) -> String {
    let shown: String = text.chars().take(80).collect();
    if shown.len() < text.len() {
        format!("{what} {shown:?}...")
    } else {
        format!("{what} {shown:?}")
    }
}

/// The axum route template of a request, when axum routed it.
#[cfg(feature = "axum")]
pub(crate) fn matched_route(parts: &Parts) -> Option<&str> {
    parts
        .extensions
        .get::<axum::extract::MatchedPath>()
        .map(axum::extract::MatchedPath::as_str)
}

/// Without axum there is no route template (and rules have no routes).
#[cfg(not(feature = "axum"))]
pub(crate) fn matched_route(_parts: &Parts) -> Option<&str> {
    None
}

/// The gRPC method a request's path names, if any.
pub(crate) fn called_method(parts: &Parts) -> Option<(&str, &str)> {
    grpc_method(parts)
}

/// `[METHOD ]/template`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RoutePattern {
    method: Option<Method>,
    template: String,
}

impl RoutePattern {
    fn parse(text: &str) -> Result<Self, ConfigError> {
        if !cfg!(feature = "axum") {
            return Err(ConfigError::layer(
                "routes match axum's MatchedPath, which needs tollgate's `axum` feature \
                 (gRPC methods go in `grpc`)",
            ));
        }
        let (method, template) = match text.split_once(' ') {
            Some((method, template)) => (Some(method), template.trim_start_matches(' ')),
            None => (None, text),
        };
        let method = method.map(parse_method).transpose()?;
        check_path(template)?;
        if template
            .split('/')
            .any(|segment| segment.starts_with(':') || segment.starts_with('*'))
        {
            return Err(ConfigError::layer(
                "axum 0.8 writes route parameters as {id} and {*rest}, never :id or *rest, \
                 so this route would match nothing",
            ));
        }
        Ok(RoutePattern {
            method,
            template: template.to_owned(),
        })
    }

    fn matches(&self, method: &Method, route: &str) -> bool {
        let method_ok = match &self.method {
            None => true,
            Some(m) if *m == Method::GET => *method == Method::GET || *method == Method::HEAD,
            Some(m) => m == method,
        };
        method_ok && self.template == route
    }
}

impl fmt::Display for RoutePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.method {
            Some(method) => write!(f, "{method} {}", self.template),
            None => f.write_str(&self.template),
        }
    }
}

fn parse_method(text: &str) -> Result<Method, ConfigError> {
    let token = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    let method = token
        .then(|| Method::from_bytes(text.as_bytes()).ok())
        .flatten();
    method.ok_or_else(|| {
        ConfigError::layer(format!(
            "method {:?} must be an HTTP method in upper case, as requests write it (GET, POST)",
            text.chars().take(20).collect::<String>()
        ))
    })
}

fn check_path(path: &str) -> Result<(), ConfigError> {
    if !path.starts_with('/') {
        return Err(ConfigError::layer("must start with /"));
    }
    if path.len() > MAX_PATTERN_LEN {
        return Err(ConfigError::layer(format!(
            "is longer than {MAX_PATTERN_LEN} bytes"
        )));
    }
    if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ConfigError::layer(
            "holds whitespace or a control character",
        ));
    }
    Ok(())
}

/// `/service/method` or `/service/*`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct GrpcPattern {
    service: String,
    /// `None` for every method of the service.
    method: Option<String>,
}

impl GrpcPattern {
    fn parse(text: &str) -> Result<Self, ConfigError> {
        let parts = text
            .strip_prefix('/')
            .and_then(|rest| rest.split_once('/'))
            .filter(|(service, method)| {
                !service.is_empty() && !method.is_empty() && !method.contains('/')
            });
        let Some((service, method)) = parts else {
            return Err(ConfigError::layer(
                "write a gRPC method as \"/package.Service/Method\", or \
                 \"/package.Service/*\" for all of a service's",
            ));
        };
        check_path(text)?;
        Ok(GrpcPattern {
            service: service.to_owned(),
            method: (method != "*").then(|| method.to_owned()),
        })
    }

    fn matches(&self, (service, method): (&str, &str)) -> bool {
        self.service == service && self.method.as_deref().is_none_or(|m| m == method)
    }
}

impl fmt::Display for GrpcPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let method = self.method.as_deref().unwrap_or("*");
        write!(f, "/{}/{method}", self.service)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;
    fn rule() -> PolicyRule {
        PolicyRule::new(Policy::new("p", [Quota::per_second(1).unwrap()]).unwrap())
    }

    #[cfg(feature = "axum")]
    #[test]
    fn routes_match_templates_and_methods() {
        let r = rule()
            .routes(["POST /login", "/items/{id}", "GET /search"])
            .unwrap();
        assert!(r.matches(&Method::POST, Some("/login"), None));
        assert!(!r.matches(&Method::GET, Some("/login"), None));
        assert!(r.matches(&Method::DELETE, Some("/items/{id}"), None));
        assert!(!r.matches(&Method::GET, Some("/items/7"), None));
        assert!(r.matches(&Method::HEAD, Some("/search"), None));
        // No template (not routed by axum, or a 404): no route matches.
        assert!(!r.matches(&Method::POST, None, None));
        assert_eq!(
            r.route_texts().collect::<Vec<_>>(),
            ["POST /login", "/items/{id}", "GET /search"]
        );
    }

    #[test]
    fn grpc_methods_match_by_path() {
        let r = rule()
            .grpc(["/shop.v1.Orders/Create", "/shop.v1.Admin/*"])
            .unwrap();
        assert!(r.matches(&Method::POST, None, Some(("shop.v1.Orders", "Create"))));
        assert!(!r.matches(&Method::POST, None, Some(("shop.v1.Orders", "List"))));
        assert!(r.matches(&Method::POST, None, Some(("shop.v1.Admin", "Purge"))));
        assert!(!r.matches(&Method::POST, None, Some(("shop.v1.Administer", "X"))));
        assert_eq!(
            r.grpc_texts().collect::<Vec<_>>(),
            ["/shop.v1.Orders/Create", "/shop.v1.Admin/*"]
        );
    }

    #[test]
    fn a_rule_without_routes_applies_to_everything() {
        assert!(rule().applies_to_all());
        assert!(rule().matches(&Method::GET, None, None));
    }

    #[cfg(feature = "axum")]
    #[test]
    fn bad_patterns_are_refused_by_name() {
        for (bad, why) in [
            ("login", "must start with /"),
            ("get /login", "upper case"),
            ("POST  /a b", "whitespace"),
            ("/items/:id", "{id}"),
            ("/files/*rest", "{*rest}"),
        ] {
            let err = rule().routes([bad]).unwrap_err().to_string();
            assert!(
                err.contains(&format!("route {bad:?}")) && err.contains(why),
                "{err}"
            );
        }
        for bad in [
            "/",
            "shop.Orders/Create",
            "/shop.Orders",
            "/shop.Orders/",
            "/a/b/c",
            "//m",
        ] {
            let err = rule().grpc([bad]).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
        let long = format!("/{}", "a".repeat(2000));
        assert!(
            rule()
                .routes([long])
                .unwrap_err()
                .to_string()
                .contains("longer than")
        );
        assert!(PolicyRule::exempt("bad name").is_err());
    }
}
