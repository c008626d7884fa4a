//! [`RateLimitLayer`]: configuration, checked when it is built.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use tower_layer::Layer;

#[cfg(feature = "axum")]
use super::bodies::AxumBody;
use super::config::{Config, Cost, Holding, Waits};
use super::dyn_key::Extractor;
use super::held::Held;
use super::options::{Choice, Delay, HeaderStyle, MissingKey, OnStoreError, Rejection};
use super::service::RateLimit;
use super::settle::{ResponseHead, Settle, Settler};
use super::table::PolicyTable;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::key::{KeyExtractor, PeerIp};
use crate::limiter::RateLimiter;
use crate::policy::Policy;
use crate::store::AnyStore;
/// Applies [`RateLimit`] to a service: a tower [`Layer`] for axum's
/// `Router::layer` / `route_layer`, tonic's `Server::builder().layer`, hyper
/// services and any tower stack.
///
/// It holds any store ([`MemoryStore`](crate::MemoryStore),
/// [`RedisStore`](crate::RedisStore), [`AnyStore`](crate::AnyStore)) without
/// carrying its type, so a layer built from a store chosen at runtime is still a
/// `RateLimitLayer`. Every builder method takes the layer by value and returns
/// it; the two that check a value ([`fixed_cost`](Self::fixed_cost) and
/// [`count_only_statuses`](Self::count_only_statuses)) return a
/// `Result<Self, ConfigError>`, so mistakes surface at start-up, never per
/// request. [`axum_body`](Self::axum_body) ends the configuration. See the
/// [module docs](crate::layer) for an example, the defaults and the responses.
///
/// Cheap to clone: clones share the store and the configuration.
#[derive(Clone)]
#[must_use]
pub struct RateLimitLayer {
    config: Arc<Config>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl RateLimitLayer {
    /// Limits requests by `policy` (a single [`Quota`](crate::Quota), which
    /// becomes a policy named [`DEFAULT_POLICY_NAME`](crate::DEFAULT_POLICY_NAME),
    /// or a [`Policy`] of several quotas decided all or nothing), with buckets in
    /// `store`, keyed by the client's socket address ([`PeerIp`]) until
    /// [`key`](Self::key) says otherwise. See the
    /// [module docs](crate::layer#defaults) for what the peer address needs.
    pub fn new(store: impl Into<AnyStore>, policy: impl Into<Policy>) -> Self {
        Self::from_limiter(RateLimiter::new(store, policy))
    }

    /// A layer over the store and policy of an existing [`RateLimiter`], so
    /// code outside tower shares its buckets.
    pub fn from_limiter(limiter: RateLimiter) -> Self {
        if limiter.policy().name() == crate::policy::DEFAULT_POLICY_NAME {
            crate::observe::unnamed_layer();
        }
        let layer = RateLimitLayer {
            config: Arc::new(Config {
                limiter,
                key: Extractor::new(PeerIp::new()),
                select: None,
                cost: Cost::Fixed(1),
                missing: MissingKey::default().0,
                on_store_error: OnStoreError::default(),
                headers: HeaderStyle::default(),
                decision_in_response: false,
                decision_in_request: true,
                rejection: Rejection::default().0,
                shadow: false,
                delay: None,
                settle: None,
                waits: Waits::default(),
                held: None,
            }),
        };
        layer.with(|_| ())
    }

    fn with(mut self, change: impl FnOnce(&mut Config)) -> Self {
        let config = Arc::make_mut(&mut self.config);
        change(config);
        config.held = held(config);
        self
    }

    /// The policy applied when the [`select_policy`](Self::select_policy) closure does not
    /// choose another one.
    pub fn default_policy(&self) -> &Policy {
        self.config.limiter.policy()
    }

    /// Which client a request counts against. The default, [`PeerIp`], is the
    /// socket peer; behind proxies use [`ClientIp`](crate::key::ClientIp), for an
    /// API key [`Header`](crate::key::Header), for one bucket shared by everyone
    /// [`Global`](crate::key::Global), or your own [`KeyExtractor`].
    pub fn key(self, key: impl KeyExtractor) -> Self {
        self.with(|c| c.key = Extractor::new(key))
    }

    /// Chooses the policy per request (per route, method, customer tier), or
    /// exempts the request. Build the [`Policy`] values once and clone them into
    /// the closure: it runs for every request and must not block.
    ///
    /// Choose from trusted data only (the route, the method, what your auth layer
    /// put in the extensions): each policy has its own buckets, so a tier taken
    /// from a header the client writes lets the client pick the larger quota, or
    /// spend from several.
    ///
    /// For limits kept as data (a configuration file, changed while serving),
    /// see [`policy_table`](Self::policy_table); the two replace each other.
    pub fn select_policy<F>(self, select: F) -> Self
    where
        F: Fn(&Parts) -> Choice + Send + Sync + 'static,
    {
        self.with(|c| c.select = Some(Arc::new(move |parts: &Parts| select(parts).into())))
    }

    /// The old name of [`select_policy`](Self::select_policy) (a setter
    /// named like [`RateLimiter::policy`](crate::RateLimiter::policy), a
    /// getter).
    #[deprecated(since = "0.1.0", note = "renamed `select_policy`")]
    pub fn policy<F>(self, select: F) -> Self
    where
        F: Fn(&Parts) -> Choice + Send + Sync + 'static,
    {
        self.select_policy(select)
    }

    /// Chooses the policy (and, for rules that have one, the key) of each
    /// request from `table`: its first rule that applies to the request, or
    /// the layer's own policy and key when none does. The table can be
    /// replaced while serving ([`PolicyTable::swap`] on a clone you keep),
    /// without rebuilding the layer or the router. Replaces a
    /// [`select_policy`](Self::select_policy) closure, and the other way round.
    ///
    /// See the [module docs](crate::layer#policy-tables).
    pub fn policy_table(self, table: PolicyTable) -> Self {
        self.with(|c| c.select = Some(Arc::new(move |parts: &Parts| table.select(parts))))
    }

    /// The weight of each request in tokens, computed from its head (1 when not
    /// set). A cost of 0 means free: the store is asked, nothing is spent, the
    /// request passes and the headers show the current state. So compute the cost
    /// from trusted data, or never let it fall to 0 (`.max(1)`) when a client can
    /// influence it: a client that can make its cost 0 is not limited. A cost above the
    /// chosen policy's smallest capacity can never be admitted: the layer answers
    /// 429 without `Retry-After` (gRPC: `RESOURCE_EXHAUSTED` with a pushback of
    /// `-1`, "do not retry"), and never asks the store.
    pub fn cost<F>(self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        self.with(|c| c.cost = Cost::Dynamic(Arc::new(cost)))
    }

    /// The same weight for every request.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when it exceeds a capacity of the default policy: no
    /// request could ever be admitted.
    pub fn fixed_cost(self, cost: u64) -> Result<Self, ConfigError> {
        let policy = self.default_policy();
        if cost > policy.max_cost() {
            return Err(ConfigError::layer(format!(
                "fixed cost {cost} exceeds the capacity {} of policy {:?}: no request \
                 could ever be admitted",
                policy.max_cost(),
                policy.name()
            )));
        }
        Ok(self.with(|c| c.cost = Cost::Fixed(cost)))
    }

    /// What to do when the key extractor finds no key: reject (the default),
    /// allow, or fall back to another extractor. See [`MissingKey`].
    pub fn on_missing_key(self, missing: MissingKey) -> Self {
        self.with(|c| c.missing = missing.0)
    }

    /// While the store cannot decide, decides with `fallback`, in process
    /// (per instance; see [`Fallback`](crate::Fallback) for the trade-offs),
    /// as [`RateLimiter::fallback`](crate::RateLimiter::fallback) does:
    /// decisions it makes say so ([`Decision::is_fallback`](crate::Decision::is_fallback)).
    /// If it cannot decide either, the request is forwarded.
    pub fn fallback(self, fallback: crate::Fallback) -> Self {
        #[allow(deprecated, reason = "the variant is how the layer keeps it")]
        self.on_store_error(OnStoreError::Fallback(fallback))
    }

    /// What to do when the store cannot decide: [`OnStoreError::Allow`] (the
    /// default) forwards the request, [`OnStoreError::Deny`] answers 503 (gRPC:
    /// `UNAVAILABLE`); [`fallback`](Self::fallback) decides in process.
    pub fn on_store_error(self, policy: OnStoreError) -> Self {
        self.with(|c| {
            #[allow(deprecated, reason = "the variant is how the layer keeps a fallback")]
            if let OnStoreError::Fallback(fallback) = &policy {
                c.limiter = c.limiter.clone().fallback(fallback.clone());
            }
            c.on_store_error = policy;
        })
    }

    /// Which rate limit headers to send ([`HeaderStyle::Ietf`] by default).
    pub fn headers(self, style: HeaderStyle) -> Self {
        self.with(|c| c.headers = style)
    }

    /// Also puts each request's [`Decision`] into the extensions of the
    /// response the inner service returns, for outer layers that read it
    /// there (a logging or metrics middleware around this one). Off by
    /// default: handlers read the `Decision` in the request extensions,
    /// where it always is, and the layer's own answers (429, gRPC
    /// `RESOURCE_EXHAUSTED`) always carry it. A forwarded response usually
    /// has no extension map: making one for every request (three allocations,
    /// freed with the response) is a cost most services have no reader for.
    /// See the [module docs](crate::layer#extensions).
    pub fn decision_in_response(self) -> Self {
        self.with(|c| c.decision_in_response = true)
    }

    /// Whether each forwarded request carries its [`Decision`] in its
    /// extensions, for handlers to read (on by default). A request
    /// usually arrives with no extension map, and making one costs three
    /// allocations (the map, its table, the boxed decision), freed with the
    /// request: about 60 ns a request in process, a third of what the
    /// layer costs over a service that does nothing (see BENCHMARKS.md).
    /// Turn it off when no handler or inner layer reads the decision there;
    /// the layer's own answers (429, gRPC `RESOURCE_EXHAUSTED`) still carry
    /// it, and so do forwarded responses with
    /// [`decision_in_response`](Self::decision_in_response). A handler that
    /// extracts it anyway (axum's `Extension<Decision>`) then fails, so
    /// this stays on unless you are sure. The marks of a delayed,
    /// store-failed or shadow-refused request
    /// ([`Delayed`](super::Delayed), [`StoreFailure`](super::StoreFailure),
    /// [`ShadowRejection`](super::ShadowRejection)) go into the request's
    /// extensions either way.
    pub fn decision_in_request(self, on: bool) -> Self {
        self.with(|c| c.decision_in_request = on)
    }

    /// How to answer an HTTP request over its limit ([`Rejection::text`] by
    /// default). gRPC calls always get a gRPC status instead.
    pub fn rejection(self, rejection: Rejection) -> Self {
        self.with(|c| c.rejection = rejection.0)
    }

    /// Shadow mode: decide, spend and send the headers as usual, put the
    /// [`Decision`](crate::Decision) in the request extensions, but never answer in place
    /// of the inner service: over-limit, keyless and store-failed requests are
    /// all forwarded. For rolling out a limit and watching what it would do:
    /// over-limit requests carry a `Decision` with `allowed() == false`, store
    /// failures a [`StoreFailure`](super::StoreFailure), and requests without a
    /// key or with a cost no wait would admit a
    /// [`ShadowRejection`](super::ShadowRejection).
    pub fn shadow(self) -> Self {
        self.with(|c| c.shadow = true)
    }

    /// Delay mode (traffic shaping): a request that can be admitted within
    /// `max_wait` is reserved in one store call, held until its tokens are
    /// due, then forwarded, so a burst leaves at the refill rate instead of
    /// being refused; a request that would wait longer gets the usual 429
    /// (gRPC `RESOURCE_EXHAUSTED`). Give a [`Duration`](std::time::Duration)
    /// for the default bound of [`DEFAULT_MAX_WAITING`](super::DEFAULT_MAX_WAITING)
    /// requests held at once, or a [`Delay`] with its own. Each call starts a
    /// new count of held requests, shared by this layer's clones.
    ///
    /// What a full bound, a client that goes away while held, the headers
    /// and shadow mode do: see the [module docs](crate::layer#delay-mode).
    pub fn delay(self, delay: impl Into<Delay>) -> Self {
        let holding = Holding::new(delay.into());
        self.with(|c| c.delay = Some(holding))
    }

    /// Settles each admitted request's cost by its response: `settle` sees
    /// the response's status and headers (for gRPC, its `grpc-status`, also
    /// from trailers that come after the body) and the request's
    /// [`Decision`], and answers [`Settle::Keep`], [`Settle::Refund`] (the
    /// request does not count) or [`Settle::Charge`] (it costs more). For
    /// limits on what matters: failed logins, bad API keys, a price known
    /// only after the work.
    ///
    /// The request is charged when it is admitted, as always, and settled
    /// after: a flood of concurrent attempts is bounded while their
    /// responses are still coming. A refund fills the buckets up to their
    /// capacity at most; a charge may take them into debt, down to minus
    /// their capacity. A settlement goes where the decision was made (the
    /// store, or the fallback's share); on Redis it is one script call,
    /// batched with the checks in flight, sent without making the response
    /// wait; a response that keeps its cost costs nothing. See the
    /// [module docs](crate::layer#settling-by-the-response).
    pub fn settle<F>(self, settle: F) -> Self
    where
        F: Fn(&ResponseHead<'_>, &Decision) -> Settle + Send + Sync + 'static,
    {
        self.with(|c| c.settle = Some(Settler(Arc::new(settle))))
    }

    /// Counts only requests that fail: a response of status 400 or above,
    /// or a gRPC status other than `OK` (also a call whose status never
    /// came). Successful requests are refunded. "5 failed logins per
    /// account per 15 minutes".
    pub fn count_only_failures(self) -> Self {
        self.settle(|response, _| {
            if response.is_success() {
                Settle::Refund
            } else {
                Settle::Keep
            }
        })
    }

    /// Counts only requests that succeed (status below 400, gRPC `OK`);
    /// failed ones are refunded.
    pub fn count_only_successes(self) -> Self {
        self.settle(|response, _| {
            if response.is_success() {
                Settle::Keep
            } else {
                Settle::Refund
            }
        })
    }

    /// Counts only responses of these HTTP statuses (for example `[401,
    /// 403]`); others are refunded. For gRPC, use
    /// [`settle`](Self::settle) with [`ResponseHead::grpc_status`] (a gRPC
    /// call's HTTP status is 200 whatever its outcome).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when the list is empty or holds a number that is
    /// not an HTTP status (100 to 599): every request would be refunded,
    /// and the limit would never limit.
    pub fn count_only_statuses(
        self,
        statuses: impl IntoIterator<Item = u16>,
    ) -> Result<Self, ConfigError> {
        let statuses: Vec<u16> = statuses.into_iter().collect();
        if statuses.is_empty() {
            return Err(ConfigError::layer(
                "count_only_statuses: no status given, so every request would be refunded"
                    .to_owned(),
            ));
        }
        if let Some(bad) = statuses.iter().find(|s| !(100..=599).contains(*s)) {
            return Err(ConfigError::layer(format!(
                "count_only_statuses: {bad} is not an HTTP status (100 to 599); no \
                 response would have it, so every request would be refunded"
            )));
        }
        Ok(self.settle(move |response, _| {
            if statuses.contains(&response.status().as_u16()) {
                Settle::Keep
            } else {
                Settle::Refund
            }
        }))
    }

    /// In [delay mode](Self::delay), how many requests this layer (with its
    /// clones) holds now, or is reserving for; 0 otherwise.
    pub fn waiting(&self) -> usize {
        self.config.delay.as_ref().map_or(0, Holding::waiting)
    }

    /// The same layer for axum services, whose responses keep axum's `Body`
    /// instead of a [`ResponseBody`](super::ResponseBody) around it: the last
    /// call of the configuration.
    ///
    /// axum's `Router::layer` and `route_layer` turn every other body type
    /// into a `Body` by boxing it, once per response, and every frame then
    /// passes through both. With this, a forwarded response's body is passed
    /// on as it is, which saves that allocation and those calls. The layer's
    /// own answers become `Body`s of their bytes (one allocation, as before),
    /// and the one forwarded body still wrapped (and so boxed) is a gRPC
    /// response whose cost is settled by the status in its trailers
    /// ([`settle`](Self::settle)).
    ///
    /// The inner service must answer `Response<axum::body::Body>`, as axum's
    /// routers, routes and handlers do; anything else keeps the default
    /// layer. The layer returned is configured: keep a clone of this one to
    /// read [`waiting`](Self::waiting) (the two share their state), or call
    /// it on the returned layer.
    ///
    /// ```
    /// use axum::{Router, routing::get};
    /// use tollgate::{MemoryStore, Quota, RateLimitLayer};
    ///
    /// let limit = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(10).unwrap());
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .layer(limit.axum_body());
    /// ```
    #[cfg(feature = "axum")]
    pub fn axum_body(self) -> AxumRateLimitLayer {
        AxumRateLimitLayer { layer: self }
    }
}

/// What `check::held` needs, when `config` allows it (see [`Held`]).
fn held(config: &Config) -> Option<Held> {
    if config.select.is_some() || config.delay.is_some() || config.settle.is_some() || config.shadow
    {
        return None;
    }
    let Cost::Fixed(cost) = config.cost else {
        return None;
    };
    let header = config.key.header()?.clone();
    let policy = config.limiter.policy();
    // The storage keys' start: `name:kind:`, before every value.
    let start = policy.key_of(&[config.key.name(), ""]);
    let keys = config.limiter.store().held_keys(&start, policy, cost)?;
    Some(Held { header, keys })
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.config))
    }
}

/// A [`RateLimitLayer`] whose responses keep axum's `Body`: see
/// [`RateLimitLayer::axum_body`].
#[cfg(feature = "axum")]
#[derive(Clone)]
#[must_use]
pub struct AxumRateLimitLayer {
    layer: RateLimitLayer,
}

#[cfg(feature = "axum")]
impl AxumRateLimitLayer {
    /// The policy of requests that no table rule or selector chose: see
    /// [`RateLimitLayer::default_policy`].
    pub fn default_policy(&self) -> &Policy {
        self.layer.default_policy()
    }

    /// In delay mode, how many requests this layer (with its clones and the
    /// layer it was made from) holds now: see [`RateLimitLayer::waiting`].
    pub fn waiting(&self) -> usize {
        self.layer.waiting()
    }
}

#[cfg(feature = "axum")]
impl fmt::Debug for AxumRateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AxumRateLimitLayer")
            .field(&self.layer)
            .finish()
    }
}

#[cfg(feature = "axum")]
impl<S> Layer<S> for AxumRateLimitLayer {
    type Service = RateLimit<S, AxumBody>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.layer.config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;
    use crate::store::MemoryStore;
    #[test]
    fn configuration_mistakes_surface_when_built() {
        let q = Quota::per_second(5).unwrap();
        let layer = RateLimitLayer::new(MemoryStore::new(), q);
        let err = layer.clone().fixed_cost(6).unwrap_err();
        assert!(err.to_string().contains("fixed cost 6"), "{err}");
        assert!(layer.fixed_cost(5).is_ok());
        let api = Policy::new("api", [q]).unwrap();
        let layer = RateLimitLayer::from_limiter(RateLimiter::new(MemoryStore::new(), api))
            .key(crate::key::PeerIp::new());
        assert_eq!(layer.default_policy().name(), "api");
        let debug = format!("{layer:?}");
        assert!(debug.contains("api") && debug.contains("ip"), "{debug}");
    }
}
