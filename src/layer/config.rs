//! The runtime configuration every service clone reads, shared behind one
//! `Arc`.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::request::Parts;
use tokio::sync::Semaphore;

use super::dyn_key::Extractor;
use super::held::Held;
use super::options::{Delay, HeaderStyle, Missing, OnStoreError, Reject, Rejection, Selected};
use super::settle::Settler;
use crate::limiter::RateLimiter;
/// A layer's delay mode at work: its settings and the slots of the requests
/// it holds, shared by the layer's clones.
#[derive(Clone)]
pub(crate) struct Holding {
    pub(crate) delay: Delay,
    pub(crate) slots: Arc<Semaphore>,
}

impl Holding {
    pub(crate) fn new(delay: Delay) -> Self {
        Holding {
            delay,
            slots: Arc::new(Semaphore::new(delay.waiting_limit())),
        }
    }

    /// Requests held (or being reserved) now.
    pub(crate) fn waiting(&self) -> usize {
        self.delay
            .waiting_limit()
            .saturating_sub(self.slots.available_permits())
    }
}

pub(crate) type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;
pub(crate) type SelectFn = dyn Fn(&Parts) -> Selected + Send + Sync;

#[derive(Clone)]
pub(crate) enum Cost {
    Fixed(u64),
    Dynamic(Arc<CostFn>),
}

/// Everything a service clone needs, shared behind one `Arc`.
///
/// Laid out in this order (`repr(C)`): what `call` reads for every request
/// a memory store decides at once (`held`, `waits`, `headers`,
/// `decision_in_response`, the limiter) comes first, on the fewest cache
/// lines.
#[derive(Clone)]
#[repr(C)]
pub(crate) struct Config {
    /// What a request whose key the store holds (a memory store's, or a
    /// leasing Redis store's with a hold that pays) is decided with, when
    /// this configuration allows it (see [`Held`]); set by the layer
    /// after every change.
    pub(crate) held: Option<Held>,
    /// Set once a request's key extractor waited: from then on every request
    /// is checked in its response future, without a try in `call` (which
    /// would run the policy choice twice).
    pub(crate) waits: Waits,
    pub(crate) headers: HeaderStyle,
    /// The decision also goes into the inner service's responses.
    pub(crate) decision_in_response: bool,
    /// The decision goes into the request's extensions (on by default).
    pub(crate) decision_in_request: bool,
    /// The store and the default policy.
    pub(crate) limiter: RateLimiter,
    pub(crate) key: Extractor,
    pub(crate) select: Option<Arc<SelectFn>>,
    pub(crate) cost: Cost,
    pub(crate) missing: Missing,
    pub(crate) on_store_error: OnStoreError,
    pub(crate) rejection: Reject,
    pub(crate) shadow: bool,
    /// Delay mode, when set.
    pub(crate) delay: Option<Holding>,
    pub(crate) settle: Option<Settler>,
}

/// Whether an extractor of the layer has waited. Held in the configuration
/// itself, not behind an `Arc` of its own: `call` reads it for every
/// request, next to the fields it reads anyway, and a pointer to follow would
/// be one more cache line per request. The layer's services share it with
/// their configuration; a layer changed after it was built starts with the
/// value its original had then.
#[derive(Default)]
pub(crate) struct Waits(AtomicBool);

impl Waits {
    #[inline]
    pub(crate) fn happened(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    #[inline]
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Clone for Waits {
    fn clone(&self) -> Self {
        Waits(AtomicBool::new(self.happened()))
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("store", self.limiter.store())
            .field("policy", self.limiter.policy())
            .field("key", &self.key)
            .field("per_request_policy", &self.select.is_some())
            .field(
                "cost",
                &match self.cost {
                    Cost::Fixed(n) => Cow::Owned(n.to_string()),
                    Cost::Dynamic(_) => Cow::Borrowed("per request"),
                },
            )
            .field("on_missing_key", &self.missing)
            .field("on_store_error", &self.on_store_error)
            .field("headers", &self.headers)
            .field("decision_in_response", &self.decision_in_response)
            .field("decision_in_request", &self.decision_in_request)
            .field("rejection", &Rejection(self.rejection.clone()))
            .field("shadow", &self.shadow)
            .field("delay", &self.delay.as_ref().map(|h| h.delay))
            .field("settles", &self.settle.is_some())
            .finish()
    }
}
