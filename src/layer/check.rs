//! The decision for one request: choose the policy, extract the key, ask the
//! store, and render the layer's own answer if there is one.
//!
//! The service's `call` has one entry point, [`in_call`]. Most requests are
//! decided there: a key the store holds ([`Held`]) without taking the
//! request apart, and otherwise a check whose futures (the key extractor's,
//! `prepare`) are polled once on the stack: the built-in extractors are
//! ready at once, and so are a memory store and a Redis store's deny cache.
//! Nothing is boxed or cloned for them. The rest goes on in one boxed
//! future, which owns the request head so that the request body (`Send` but
//! not `Sync`) is never borrowed across an `.await`: [`send`] for a store
//! that has to be asked, [`check_later`] for an extractor whose future
//! waits, and for delay mode. Every path meets in [`outcome`] (what the
//! store's decision means) and [`place`] (what goes into the request).
use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Extensions, HeaderMap, Request, Response};
use tokio::sync::OwnedSemaphorePermit;

use super::config::{Config, Cost};
use super::dyn_key::{BoxFuture, Extractor};
use super::grpc;
use super::http_answer;
use super::media;
use super::options::{HeaderStyle, Missing, OnStoreError, Selected};
use super::outcome::{After, Answer, Deferred, Delayed, Marks, StoreFailure};
use super::report::shadow_report;
use super::settle::{By, Ticket};
use crate::decision::Decision;
use crate::error::Error;
use crate::limiter::Decided;
use crate::policy::Policy;
use crate::store::{Unsent, in_scratch, into_safe_key};

/// What the service's `call` does with a request.
#[allow(
    clippy::large_enum_variant,
    reason = "returned once, into `call`'s match; boxing the request would allocate for every one"
)]
pub(crate) enum InCall<B> {
    /// Call the inner service with it, then add `After` to its response
    /// (when there is anything to add).
    Forward(Request<B>, After),
    /// Answer without calling the inner service.
    Respond(Response<Bytes>),
    /// Decided later, by this future, which owns the request head; the body
    /// waits with the response future.
    Later(BoxFuture<'static, Checked>, B),
}

/// The request head back from a check decided [`Later`](InCall::Later),
/// and what to do with the request.
pub(crate) struct Checked {
    pub(crate) parts: Parts,
    pub(crate) verdict: Verdict,
}

pub(crate) enum Verdict {
    /// Call the inner service, then add `After` to its response.
    Forward(After),
    /// Answer without calling the inner service.
    Respond(Response<Bytes>),
}

/// A request admitted ahead of its tokens (delay mode): held for `wait`,
/// taking one of the layer's slots until it is forwarded, or until the
/// request is dropped (a client that went away), whichever comes first.
struct Hold {
    wait: Duration,
    _slot: OwnedSemaphorePermit,
}

/// The check of a request, from the service's `call`: decided here when
/// nothing has to be awaited (an admitted request has its decision in its
/// extensions), or handed on as the one boxed future that decides it.
#[inline]
pub(crate) fn in_call<B>(config: &Arc<Config>, req: Request<B>) -> InCall<B> {
    if let Some(result) = held(config, req.headers()) {
        return decided(config, req, result);
    }
    let (parts, body) = req.into_parts();
    match now(config, &parts) {
        Now::Decided(result) => decided(config, Request::from_parts(parts, body), result),
        Now::Unsent(ask, unsent) => {
            InCall::Later(Box::pin(send(Arc::clone(config), parts, ask, unsent)), body)
        }
        Now::Wait => InCall::Later(Box::pin(check_later(Arc::clone(config), parts)), body),
    }
}

/// [`in_call`]'s answer for a request decided at once.
fn decided<B>(config: &Config, mut req: Request<B>, result: Result<After, Answer>) -> InCall<B> {
    match place(config, req.extensions_mut(), result) {
        Ok(after) => InCall::Forward(req, after),
        Err(answer) => {
            let (parts, _) = req.into_parts();
            InCall::Respond(respond(config, &parts, answer))
        }
    }
}

/// How far [`now`] got without waiting.
enum Now {
    /// Decided: forward (`Ok`) or answer (`Err`).
    Decided(Result<After, Answer>),
    /// The key is known, the store has to be asked: [`send`] it.
    Unsent(Ask<'static>, Unsent),
    /// Something has to be awaited (an extractor whose future waits, delay
    /// mode): [`check_later`] does it all.
    Wait,
}

/// The decision for a request without waiting for anything, the common
/// case: built-in extractors are ready at once, a memory store (and a Redis
/// store's deny cache) answers at once. Such a request's futures (the key
/// extractor's, `prepare`) live on the stack and are polled once; nothing is
/// boxed, and nothing is sent to a store here. A memory store spends the
/// request's tokens here, in the service's `call`.
fn now(config: &Config, parts: &Parts) -> Now {
    if config.delay.is_some() || config.waits.happened() {
        return Now::Wait;
    }
    let prepared = {
        let prepare = std::pin::pin!(prepare(config, parts, false));
        match prepare.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(prepared) => prepared,
            Poll::Pending => {
                config.waits.set();
                return Now::Wait;
            }
        }
    };
    match prepared {
        Prepared::Early(result) => Now::Decided(result),
        Prepared::Ask(ask) => {
            let decided = ask.with_key(|key| {
                config
                    .limiter
                    .decide_now(key, &ask.kind, &ask.policy, ask.cost)
            });
            match decided {
                Ok(decided) => Now::Decided(outcome(config, ask, decided, None)),
                Err(unsent) => Now::Unsent(ask.into_owned(), unsent),
            }
        }
    }
}

/// Sends a request's check that [`now`] left, then decides.
pub(super) async fn send(
    config: Arc<Config>,
    mut parts: Parts,
    ask: Ask<'static>,
    unsent: Unsent,
) -> Checked {
    // The limiter's named future, awaited here: an `async fn` in between
    // would keep a copy of its arguments in this boxed future while it waits.
    let key = ask.key();
    let decided = config
        .limiter
        .send(unsent, &key, &ask.kind, &ask.policy, ask.cost)
        .await;
    let result = outcome(&config, ask, decided, None);
    let verdict = verdict(&config, &mut parts, result);
    Checked { parts, verdict }
}

/// The whole check, awaiting whatever has to be awaited: an extractor whose
/// future waits, and delay mode's hold.
pub(super) async fn check_later(config: Arc<Config>, mut parts: Parts) -> Checked {
    let (result, hold) = match prepare(&config, &parts, true).await {
        Prepared::Early(result) => (result, None),
        Prepared::Ask(ask) => {
            let (decided, hold) = self::ask(&config, &ask).await;
            let delayed = hold.as_ref().map(|h| Delayed::new(h.wait));
            (outcome(&config, ask, decided, delayed), hold)
        }
    };
    let verdict = verdict(&config, &mut parts, result);
    // Delay mode: forward when the reserved tokens are due. Waiting here, in
    // the check, keeps the response future's states as they are: it polls the
    // check until the request may go on. Shadow mode never holds a request.
    if let Some(hold) = hold
        && matches!(verdict, Verdict::Forward(_))
        && !config.shadow
    {
        tokio::time::sleep(hold.wait).await;
    }
    Checked { parts, verdict }
}

/// A request whose key the store holds so that it decides at once (a
/// memory store's key, a leasing Redis store's key whose hold pays),
/// decided for less than [`now`] decides it (the request is not taken
/// apart, the storage key is not written out), to the same outcome.
/// `None`, having changed nothing, for every other request (no key, a key
/// the store does not hold as it is).
fn held(config: &Config, headers: &HeaderMap) -> Option<Result<After, Answer>> {
    let held = config.held.as_ref()?;
    // Once an extractor of this layer (a missing key's fallback) has
    // waited, every request is decided when its response future is polled.
    if config.waits.happened() {
        return None;
    }
    let value = held.header.key_in(headers)?;
    if value.is_empty() {
        return None;
    }
    // Made safe as `prepare` makes it: a value the header's extractor
    // built (hashed, as it starts with `#`) is hashed again.
    let value = match value {
        Cow::Borrowed(value) => Cow::Borrowed(value),
        Cow::Owned(value) => made_safe(value),
    };
    let policy = config.limiter.policy();
    let decision = held.check(&value, policy)?;
    let kind = config.key.name();
    config
        .limiter
        .answered(&decision, policy, kind, held.fresh());
    // The headers get this thread's copy of the policy (see
    // `Policy::thread_copy`).
    let policy = match config.headers {
        HeaderStyle::None => Cow::Borrowed(policy),
        _ => Cow::Owned(policy.thread_copy()),
    };
    let ask = Ask {
        policy,
        kind: Cow::Borrowed(kind),
        value,
        cost: held.cost,
    };
    Some(outcome(config, ask, Decided::Store(decision), None))
}

/// A value the header's extractor built, made safe as `prepare` makes it
/// (out of [`held`]'s way: a held key is seldom built).
#[cold]
fn made_safe(value: String) -> Cow<'static, str> {
    Cow::Owned(into_safe_key(value))
}

/// What to do with the request once decided: answer it, or forward it with
/// the decision (and whatever else) in its extensions.
fn verdict(config: &Config, parts: &mut Parts, result: Result<After, Answer>) -> Verdict {
    match place(config, &mut parts.extensions, result) {
        Ok(after) => Verdict::Forward(after),
        Err(answer) => Verdict::Respond(respond(config, parts, answer)),
    }
}

/// A decided request's result with its decision and marks put into the
/// request's `extensions` when it is forwarded. Shadow mode reports
/// everything but never stands between client and service: what would have
/// been answered is forwarded with its report.
fn place(
    config: &Config,
    extensions: &mut Extensions,
    result: Result<After, Answer>,
) -> Result<After, Answer> {
    let mut after = match result {
        Ok(after) => after,
        Err(answer) if config.shadow => shadow_report(answer, config.headers),
        Err(answer) => return Err(answer),
    };
    if let Some(decision) = after.decision.take() {
        after.decision_in_response = config.decision_in_response;
        let headers = after.headers.is_some();
        after.decision = place_decision(config, extensions, decision, headers);
    }
    if let Some(marks) = &after.marks {
        if let Some(delayed) = marks.delayed {
            extensions.insert(delayed);
        }
        if let Some(failure) = &marks.failure {
            extensions.insert(failure.clone());
        }
        if let Some(shadow) = &marks.shadow {
            extensions.insert(shadow.clone());
        }
    }
    Ok(after)
}

/// Puts an admitted request's decision into its `extensions`, where
/// handlers read it, and gives it back only if the response needs it too:
/// for its rate limit headers (`headers`) or its extensions.
fn place_decision(
    config: &Config,
    extensions: &mut Extensions,
    decision: Decision,
    headers: bool,
) -> Option<Decision> {
    if headers || config.decision_in_response {
        extensions.insert(decision.clone());
        Some(decision)
    } else {
        extensions.insert(decision);
        None
    }
}

/// The layer's own answer to a request, over gRPC or HTTP as it came.
fn respond(config: &Config, parts: &Parts, answer: Answer) -> Response<Bytes> {
    match media::flavor(parts) {
        Some(kind) => grpc::render(answer, kind, config.headers),
        None => http_answer::render(answer, config.headers, &config.rejection),
    }
}

/// What a request asks of the store: its policy, key and cost; the key
/// borrowed from the request (`'p`) when it can be.
pub(crate) struct Ask<'p> {
    /// Borrowed from the layer's configuration unless a table rule chose it.
    policy: Cow<'p, Policy>,
    /// The kind of the key's extractor (for answers and reports), borrowed
    /// as the policy is.
    kind: Cow<'p, Arc<str>>,
    /// The client key, made safe. The storage key is `policy:kind:value`.
    value: Cow<'p, str>,
    cost: u64,
}

thread_local! {
    /// Where [`Ask::with_key`] writes storage keys: one buffer per thread,
    /// grown to the longest key it has held, so a check decided at once
    /// allocates no key of its own.
    static KEY: RefCell<String> = const { RefCell::new(String::new()) };
}

impl Ask<'_> {
    /// The same, owning its key: for a check that outlives the request
    /// head's borrow.
    fn into_owned(self) -> Ask<'static> {
        Ask {
            policy: Cow::Owned(self.policy.into_owned()),
            kind: Cow::Owned(self.kind.into_owned()),
            value: Cow::Owned(self.value.into_owned()),
            cost: self.cost,
        }
    }

    /// The storage key, `name:kind:value`, on the heap: for the checks that
    /// keep it (a store that has to be asked, a settlement).
    fn key(&self) -> String {
        bucket_key(self.policy.name(), &self.kind, &self.value)
    }

    /// Runs `f` on the storage key, written into this thread's buffer (or,
    /// should `f` ever check a key itself, onto the heap): a store that
    /// decides at once needs the key no longer than that.
    fn with_key<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        let write = |key: &mut String| {
            key.push_str(self.policy.name());
            key.push(':');
            key.push_str(&self.kind);
            key.push(':');
            key.push_str(&self.value);
        };
        in_scratch(&KEY, write, f)
    }
}

/// A request before the store is asked.
enum Prepared<'p> {
    /// Decided without the store: `Ok` forwards (exempt, or no key and
    /// missing keys are allowed), `Err` answers.
    Early(Result<After, Answer>),
    Ask(Ask<'p>),
}

/// Chooses the policy, extracts the key (without waiting unless `wait`: a
/// waiting extractor then leaves this pending for good) and prices the
/// request.
async fn prepare<'p>(config: &'p Config, parts: &'p Parts, wait: bool) -> Prepared<'p> {
    let (policy, own_key) = match &config.select {
        None => (Cow::Borrowed(config.limiter.policy()), None),
        Some(select) => match select(parts) {
            Selected::Default => (Cow::Borrowed(config.limiter.policy()), None),
            Selected::Policy(p) => (Cow::Owned(p), None),
            Selected::Keyed(p, key) => (Cow::Owned(p), Some(key)),
            Selected::Exempt => return Prepared::Early(Ok(After::default())),
        },
    };
    // A table rule with a key of its own uses it; everything else the layer's.
    let key = own_key.as_ref().unwrap_or(&config.key);
    let (fallback, value) = match present_key(key.extract(parts, wait).await) {
        Some(value) => (None, value),
        None => match &config.missing {
            Missing::Allow => return Prepared::Early(Ok(After::default())),
            Missing::Reject => return Prepared::Early(Err(missing(key))),
            Missing::Fallback(other) => match present_key(other.extract(parts, wait).await) {
                Some(value) => (Some(other), value),
                None => {
                    return Prepared::Early(Err(Answer::MissingKey {
                        kind: format!("{} or {}", key.kind(), other.kind()),
                    }));
                }
            },
        },
    };
    // The kind is borrowed from the configuration unless a rule's own key
    // found it.
    let kind = match (fallback, &own_key) {
        (Some(other), _) => Cow::Borrowed(other.name()),
        (None, None) => Cow::Borrowed(config.key.name()),
        (None, Some(own)) => Cow::Owned(Arc::clone(own.name())),
    };
    let cost = match &config.cost {
        Cost::Fixed(n) => *n,
        Cost::Dynamic(f) => f(parts),
    };
    if cost > policy.max_cost() {
        return Prepared::Early(Err(too_costly(cost, policy.into_owned(), &kind)));
    }
    // The value is made safe here: `from_fn` extractors return whatever
    // their closure built. A borrowed one is a `Header`'s, already made safe
    // (see `Extractor::extract`). The policy name comes first in the storage
    // key: policies with different names never share a bucket.
    let value = match value {
        Cow::Borrowed(value) => Cow::Borrowed(value),
        Cow::Owned(value) => Cow::Owned(into_safe_key(value)),
    };
    Prepared::Ask(Ask {
        policy,
        kind,
        value,
        cost,
    })
}

/// What the store's decision means for the request: `Ok` to forward it (in
/// delay mode, once its hold is over), `Err` to answer it.
fn outcome(
    config: &Config,
    ask: Ask<'_>,
    decided: Decided,
    delayed: Option<Delayed>,
) -> Result<After, Answer> {
    let Ask {
        policy,
        kind,
        value,
        cost,
    } = ask;
    // An admitted request carries what settles its cost by its response,
    // with its storage key.
    let key = config
        .settle
        .is_some()
        .then(|| bucket_key(policy.name(), &kind, &value));
    let ticket = |decision: &Decision, policy: &Policy, by: By| {
        config.settle.as_ref().zip(key).map(|(settler, key)| {
            Ticket::new(
                settler,
                &config.limiter,
                key,
                policy.clone(),
                cost,
                by,
                decision.clone(),
            )
        })
    };
    let after = match decided {
        Decided::Store(decision) if decision.allowed() => After {
            ticket: ticket(&decision, &policy, By::Store),
            headers: Deferred::new(config.headers, policy),
            decision: Some(decision),
            decision_in_response: false,
            marks: Marks::new(None, None, delayed),
        },
        Decided::Store(decision) => {
            return Err(Answer::TooMany {
                policy: policy.into_owned(),
                decision,
                kind: kind.into_owned(),
            });
        }
        // The fallback decided under this instance's share of the quotas:
        // the headers describe that share.
        Decided::Fallback {
            decision,
            policy,
            error,
        } if decision.allowed() => After {
            ticket: ticket(&decision, &policy, By::Fallback(policy.clone())),
            headers: Deferred::new(config.headers, Cow::Owned(policy)),
            decision: Some(decision),
            decision_in_response: false,
            marks: Marks::new(Some(StoreFailure::new(error)), None, delayed),
        },
        Decided::Fallback {
            decision, policy, ..
        } => {
            return Err(Answer::TooMany {
                policy,
                decision,
                kind: Arc::clone(&kind),
            });
        }
        Decided::Failed(Error::CostExceedsCapacity { .. }) => {
            return Err(too_costly(cost, policy.into_owned(), &kind));
        }
        // Every other error means no decision could be made; the layer never
        // turns it into a service error. (A full MemoryStore evicts rather
        // than refuse a new key: no error needs to be answered differently.)
        Decided::Failed(err) => {
            let failure = StoreFailure::new(err);
            #[allow(deprecated, reason = "the variant is how the layer keeps a fallback")]
            match config.on_store_error {
                OnStoreError::Allow | OnStoreError::Fallback(_) => After {
                    marks: Marks::new(Some(failure), None, None),
                    ..After::default()
                },
                OnStoreError::Deny => return Err(Answer::StoreDown(failure)),
            }
        }
    };
    Ok(after)
}

/// Asks the store: a check or, in delay mode, a reservation that may wait up
/// to the layer's `max_wait`, holding one of its slots while it waits.
///
/// A request that finds every slot taken is checked as if delay mode were
/// off: admitted if it needs no wait, refused (429) otherwise. So the bound
/// never refuses a request its bucket admits now, and never holds more. A
/// free request (cost 0) only looks, and is never held.
async fn ask(config: &Config, ask: &Ask<'_>) -> (Decided, Option<Hold>) {
    let key = &ask.key();
    let Ask {
        policy, kind, cost, ..
    } = ask;
    let slot = match &config.delay {
        Some(holding) if *cost > 0 => Arc::clone(&holding.slots)
            .try_acquire_owned()
            .ok()
            .map(|slot| (holding.delay.max_wait(), slot)),
        _ => None,
    };
    let Some((max_wait, slot)) = slot else {
        return (config.limiter.decide(key, kind, policy, *cost).await, None);
    };
    // Boxed: delay mode's future is large, and would otherwise be part of
    // every request's check future.
    let (decided, wait) = Box::pin(
        config
            .limiter
            .decide_within(key, kind, policy, *cost, max_wait),
    )
    .await;
    // Admitted with tokens due now: nothing to hold, the slot goes back.
    let hold = (!wait.is_zero()).then_some(Hold { wait, _slot: slot });
    (decided, hold)
}

/// `name:kind:value`, built without the formatting machinery.
fn bucket_key(name: &str, kind: &str, value: &str) -> String {
    let mut key = String::with_capacity(name.len() + kind.len() + value.len() + 2);
    key.push_str(name);
    key.push(':');
    key.push_str(kind);
    key.push(':');
    key.push_str(value);
    key
}

/// A key that is there and not empty.
fn present_key(key: Option<Cow<'_, str>>) -> Option<Cow<'_, str>> {
    key.filter(|k| !k.is_empty())
}

fn missing(key: &Extractor) -> Answer {
    Answer::MissingKey {
        kind: key.kind().to_owned(),
    }
}

fn too_costly(cost: u64, policy: Policy, kind: &str) -> Answer {
    Answer::CostTooHigh {
        cost,
        policy,
        kind: kind.to_owned(),
    }
}
