//! [`RateLimitLayer`]: configuration, checked when it is built.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use http::request::Parts;
use tower_layer::Layer;

use super::body::TextBody;
use super::config::{Config, Cost, Extractor, HeaderStyle, MissingKey, OnStoreError, Rejection};
use super::policy::{Choice, Policy};
use super::service::RateLimit;
use crate::key::{KeyExtractor, PeerIp};
use crate::{Error, Quota, Store};

/// The name of the policy made by [`RateLimitLayer::new`].
pub const DEFAULT_POLICY_NAME: &str = "default";

/// Applies [`RateLimit`] to a service: a tower [`Layer`] for axum's
/// `Router::layer` / `route_layer`, hyper services and any tower stack.
///
/// Every builder method takes the layer by value and returns it; the ones that
/// can meet a configuration mistake return `Result`, so mistakes surface at
/// start-up, never per request. See the [module docs](crate::layer) for an
/// example, the defaults and the responses.
///
/// `M` builds the bodies of the layer's own answers: [`TextBody`] by default,
/// see [`bodies`](Self::bodies).
///
/// Cheap to clone: clones share the store and the configuration.
pub struct RateLimitLayer<St, M = TextBody> {
    config: Arc<Config<St>>,
    body: PhantomData<fn() -> M>,
}

impl<St, M> Clone for RateLimitLayer<St, M> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            config: Arc::clone(&self.config),
            body: PhantomData,
        }
    }
}

impl<St, M> fmt::Debug for RateLimitLayer<St, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl<St: Store> RateLimitLayer<St> {
    /// One quota in a policy named [`DEFAULT_POLICY_NAME`], keyed by the client's
    /// socket address ([`PeerIp`]) until [`key`](Self::key) says otherwise. See
    /// the [module docs](crate::layer#defaults) for what the peer address needs.
    pub fn new(store: St, quota: Quota) -> Self {
        match Policy::new(DEFAULT_POLICY_NAME, [quota]) {
            Ok(policy) => Self::with_policy(store, policy),
            // One quota under a valid constant name cannot fail.
            Err(e) => unreachable!("{e}"),
        }
    }

    /// Limits by `policy` (its name and quotas) instead of a single quota.
    pub fn with_policy(store: St, policy: Policy) -> Self {
        RateLimitLayer {
            config: Arc::new(Config {
                store: Arc::new(store),
                policy,
                key: Extractor::new(PeerIp::new()),
                select: None,
                cost: Cost::Fixed(1),
                missing: MissingKey::default().0,
                on_store_error: OnStoreError::default(),
                headers: HeaderStyle::default(),
                rejection: Rejection::default().0,
                shadow: false,
            }),
            body: PhantomData,
        }
    }
}

impl<St, M> RateLimitLayer<St, M> {
    fn with(mut self, change: impl FnOnce(&mut Config<St>)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// The policy applied when the [`policy`](Self::policy) closure does not
    /// choose another one.
    pub fn default_policy(&self) -> &Policy {
        &self.config.policy
    }

    /// Several quotas for the default policy, decided all or nothing (for
    /// example 10 a second and 1000 an hour). Fails when the list is empty, names
    /// a quota twice, or a fixed cost exceeds a capacity.
    pub fn quotas(self, quotas: impl IntoIterator<Item = Quota>) -> Result<Self, Error> {
        let policy = Policy::new(self.config.policy.name(), quotas)?;
        check_fixed_cost(&self.config.cost, &policy)?;
        Ok(self.with(|c| c.policy = policy))
    }

    /// Renames the default policy ([`DEFAULT_POLICY_NAME`] otherwise). The name
    /// goes into the response headers and the storage keys; it must be 1 to 64
    /// bytes of `[A-Za-z0-9_-]`.
    pub fn name(self, name: &str) -> Result<Self, Error> {
        let policy = Policy::new(name, self.config.policy.quotas().iter().copied())?;
        Ok(self.with(|c| c.policy = policy))
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
    pub fn policy<F>(self, select: F) -> Self
    where
        F: Fn(&Parts) -> Choice + Send + Sync + 'static,
    {
        self.with(|c| c.select = Some(Arc::new(select)))
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

    /// The same weight for every request. Fails when it exceeds a capacity of the
    /// default policy.
    pub fn fixed_cost(self, cost: u64) -> Result<Self, Error> {
        let cost = Cost::Fixed(cost);
        check_fixed_cost(&cost, &self.config.policy)?;
        Ok(self.with(|c| c.cost = cost))
    }

    /// What to do when the key extractor finds no key: reject (the default),
    /// allow, or fall back to another extractor. See [`MissingKey`].
    pub fn on_missing_key(self, missing: MissingKey) -> Self {
        self.with(|c| c.missing = missing.0)
    }

    /// What to do when the store cannot decide: [`OnStoreError::Allow`] (the
    /// default) forwards the request, [`OnStoreError::Deny`] answers 503 (gRPC:
    /// `UNAVAILABLE`).
    pub fn on_store_error(self, policy: OnStoreError) -> Self {
        self.with(|c| c.on_store_error = policy)
    }

    /// Which rate limit headers to send ([`HeaderStyle::Ietf`] by default).
    pub fn headers(self, style: HeaderStyle) -> Self {
        self.with(|c| c.headers = style)
    }

    /// How to answer an HTTP request over its limit ([`Rejection::text`] by
    /// default). gRPC calls always get a gRPC status instead.
    pub fn rejection(self, rejection: Rejection) -> Self {
        self.with(|c| c.rejection = rejection.0)
    }

    /// Chooses how the bodies of the layer's own answers are built: [`TextBody`]
    /// (the default, for body types with `From<Bytes>` such as axum's) or
    /// [`EmptyBody`](super::EmptyBody) (for body types with only `Default`, such
    /// as tonic's: `Server::builder().layer(limit.bodies::<EmptyBody>())`). See
    /// [`MakeBody`](super::MakeBody) and the
    /// [module docs](crate::layer#bodies-and-tonics-server).
    pub fn bodies<M2>(self) -> RateLimitLayer<St, M2> {
        RateLimitLayer {
            config: self.config,
            body: PhantomData,
        }
    }

    /// Shadow mode: decide, spend and send the headers as usual, put the
    /// [`Decision`](crate::Decision) in the extensions, but never answer in place
    /// of the inner service: over-limit, keyless and store-failed requests are
    /// all forwarded. For rolling out a limit and watching what it would do:
    /// over-limit requests carry a `Decision` with `allowed() == false`, store
    /// failures a [`StoreFailure`](super::StoreFailure), and requests without a
    /// key or with a cost no wait would admit a
    /// [`ShadowRejection`](super::ShadowRejection).
    pub fn shadow(self) -> Self {
        self.with(|c| c.shadow = true)
    }
}

fn check_fixed_cost(cost: &Cost, policy: &Policy) -> Result<(), Error> {
    match cost {
        Cost::Fixed(n) if *n > policy.max_cost() => Err(Error::CostExceedsCapacity {
            cost: *n,
            capacity: policy.max_cost(),
        }),
        _ => Ok(()),
    }
}

impl<S, St, M> Layer<S> for RateLimitLayer<St, M> {
    type Service = RateLimit<S, St, M>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    #[test]
    fn configuration_mistakes_surface_when_built() {
        let q = Quota::per_second(5).unwrap();
        let layer = RateLimitLayer::new(MemoryStore::new(), q);
        assert!(layer.clone().quotas([]).is_err());
        assert!(layer.clone().quotas([q, q]).is_err());
        assert!(layer.clone().name("no spaces").is_err());
        assert!(layer.clone().fixed_cost(6).is_err());
        let layer = layer.fixed_cost(5).unwrap();
        assert!(
            layer
                .clone()
                .quotas([Quota::per_second(4).unwrap()])
                .is_err()
        );
        let layer = layer.name("api").unwrap();
        assert_eq!(layer.default_policy().name(), "api");
        let debug = format!("{layer:?}");
        assert!(debug.contains("api") && debug.contains("ip"), "{debug}");
    }
}
