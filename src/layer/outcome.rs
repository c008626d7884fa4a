//! What the check found for one request, as data: the layer's own answers
//! ([`Answer`]) and what is added to a forwarded request ([`After`]). Rendering
//! them is the job of `http_answer.rs` and `grpc/` (answers) and `future.rs`
//! (a forwarded response's fields).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::options::HeaderStyle;
use super::settle::Ticket;
use crate::decision::Decision;
use crate::error::Error;
use crate::policy::Policy;
/// In [shadow mode](super::RateLimitLayer::shadow), what the layer would have
/// answered to a request it forwarded without a decision: put into the request
/// and response extensions, so a rollout shows these requests too. (Requests over
/// the limit carry their [`Decision`], with `allowed() == false`.)
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShadowRejection {
    /// No key (400 / `INVALID_ARGUMENT`); `kind` names the key kinds looked for.
    MissingKey {
        /// The key kinds that were looked for.
        kind: String,
    },
    /// The cost exceeds a capacity of the policy (429 that no wait would help).
    CostTooHigh {
        /// The request's cost.
        cost: u64,
        /// The smallest capacity of the chosen policy.
        capacity: u64,
    },
}

/// Put into the request and response extensions when the store could not decide
/// (whatever [`OnStoreError`](super::OnStoreError) says), so logging and metrics
/// can count outages. Cheap to clone.
#[derive(Clone)]
#[must_use]
pub struct StoreFailure(Arc<Error>);

impl StoreFailure {
    pub(crate) fn new(error: Error) -> Self {
        StoreFailure(Arc::new(error))
    }

    /// The store's error.
    pub fn error(&self) -> &Error {
        &self.0
    }
}

impl fmt::Debug for StoreFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoreFailure").field(&self.0).finish()
    }
}

impl fmt::Display for StoreFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// In [delay mode](super#delay-mode), how long the layer held a request
/// before forwarding it (its tokens were reserved ahead of their refill); in
/// shadow mode, how long it would have held it. Put into the request and
/// response extensions of every request held for a non-zero wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Delayed {
    wait: Duration,
}

impl Delayed {
    pub(crate) fn new(wait: Duration) -> Self {
        Delayed { wait }
    }

    /// How long the request was held, counted from the store's answer.
    pub fn wait(&self) -> Duration {
        self.wait
    }
}

/// An outcome the layer answers itself instead of calling the inner service.
pub(crate) enum Answer {
    /// Over the limit: 429. `kind` is the kind of key the bucket belongs to.
    TooMany {
        policy: Policy,
        decision: Decision,
        kind: Arc<str>,
    },
    /// The request's cost exceeds a capacity of its policy: it can never pass.
    CostTooHigh {
        cost: u64,
        policy: Policy,
        kind: String,
    },
    /// No key to limit by.
    MissingKey { kind: String },
    /// The store failed and the layer is configured to deny.
    StoreDown(StoreFailure),
}

/// The rate limit fields of a forwarded request's response, rendered from
/// the decision when the response comes ([`After::headers`]): the style and
/// the policy, 16 bytes. It is part of [`After`], which is moved several
/// times per request before it waits, so it is kept small (rendered fields
/// are over 200 bytes).
#[derive(Debug)]
pub(crate) struct Deferred {
    pub(crate) style: HeaderStyle,
    pub(crate) policy: Policy,
}

impl Deferred {
    /// The fields `policy` gives a decision in `style`; none for
    /// [`HeaderStyle::None`].
    pub(crate) fn new(style: HeaderStyle, policy: Cow<'_, Policy>) -> Option<Self> {
        (style != HeaderStyle::None).then(|| Deferred {
            style,
            policy: policy.into_owned(),
        })
    }
}

/// What is added to a forwarded request and to the inner service's response.
///
/// It is moved several times per request before it waits, boxed, with the
/// inner service's future, so it is kept within 128 bytes (what is copied
/// without a call to `memcpy`): what only some requests carry is boxed
/// ([`Marks`]).
#[derive(Default)]
pub(crate) struct After {
    /// Rendered from `decision` onto the response.
    pub(crate) headers: Option<Deferred>,
    /// Kept for the response only when its headers or extensions need it
    /// (the request extensions get it either way).
    pub(crate) decision: Option<Decision>,
    /// `decision` goes into the response extensions too.
    pub(crate) decision_in_response: bool,
    /// The request's cost, to settle by its response (a layer with
    /// [`settle`](super::RateLimitLayer::settle) only).
    pub(crate) ticket: Option<Box<Ticket>>,
    pub(crate) marks: Option<Box<Marks>>,
}

impl After {
    /// Nothing to add to the response: no headers, no extensions, nothing
    /// to settle.
    pub(crate) fn is_empty(&self) -> bool {
        self.headers.is_none()
            && self.decision.is_none()
            && self.ticket.is_none()
            && self.marks.is_none()
    }
}

/// What a forwarded request carries in its extensions, and its response in
/// theirs, only when the store failed, in shadow mode, or in delay mode.
#[derive(Default)]
pub(crate) struct Marks {
    pub(crate) failure: Option<StoreFailure>,
    pub(crate) shadow: Option<ShadowRejection>,
    pub(crate) delayed: Option<Delayed>,
}

impl Marks {
    /// Marks with `failure`, `shadow` and `delayed`, if there is any.
    pub(crate) fn new(
        failure: Option<StoreFailure>,
        shadow: Option<ShadowRejection>,
        delayed: Option<Delayed>,
    ) -> Option<Box<Self>> {
        (failure.is_some() || shadow.is_some() || delayed.is_some()).then(|| {
            Box::new(Marks {
                failure,
                shadow,
                delayed,
            })
        })
    }
}
