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
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::request::Parts;
use http::{Extensions, HeaderMap, Request, Response};

use super::config::Config;
use super::decide::{ask_store, outcome};
use super::dyn_key::BoxFuture;
use super::grpc;
use super::held::Held;
use super::http_answer;
use super::media;
use super::options::HeaderStyle;
use super::outcome::{After, Answer, Deferred, Delayed};
use super::prepare::{KeyedRequest, Prepared, into_safe, prepare};
use super::report::shadow_report;
use crate::decision::Decision;
use crate::limiter::Decided;
use crate::limiter::ToSend;
use crate::policy::Policy;
use crate::store::bucket::Spent;

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

/// The check of a request, from the service's `call`: decided here when
/// nothing has to be awaited (an admitted request has its decision in its
/// extensions), or handed on as the one boxed future that decides it.
#[inline]
pub(crate) fn in_call<B>(config: &Arc<Config>, req: Request<B>) -> InCall<B> {
    let (parts, body) = req.into_parts();
    match now(config, &parts) {
        Now::Decided(result) => decided(config, Request::from_parts(parts, body), result),
        Now::ToSend(request, unsent) => InCall::Later(
            Box::pin(send(Arc::clone(config), parts, request, unsent)),
            body,
        ),
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
    ToSend(KeyedRequest<'static>, ToSend),
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
        Prepared::Keyed(request) => {
            let decided = request.with_key(|key| {
                config
                    .limiter
                    .decide_now(key, &request.kind, &request.policy, request.cost)
            });
            match decided {
                Ok(decided) => Now::Decided(outcome(config, request, decided, None)),
                Err(unsent) => Now::ToSend(request.into_owned(), unsent),
            }
        }
    }
}

/// Sends a request's check that [`now`] left, then decides.
pub(super) async fn send(
    config: Arc<Config>,
    mut parts: Parts,
    request: KeyedRequest<'static>,
    unsent: ToSend,
) -> Checked {
    // The limiter's named future, awaited here: an `async fn` in between
    // would keep a copy of its arguments in this boxed future while it waits.
    let key = request.key();
    let decided = config
        .limiter
        .send(unsent, &key, &request.kind, &request.policy, request.cost)
        .await;
    let result = outcome(&config, request, decided, None);
    let verdict = verdict(&config, &mut parts, result);
    Checked { parts, verdict }
}

/// The whole check, awaiting whatever has to be awaited: an extractor whose
/// future waits, and delay mode's hold.
pub(super) async fn check_later(config: Arc<Config>, mut parts: Parts) -> Checked {
    let (result, slot) = match prepare(&config, &parts, true).await {
        Prepared::Early(result) => (result, None),
        Prepared::Keyed(request) => {
            let (decided, slot) = ask_store(&config, &request).await;
            let delayed = slot.as_ref().map(|s| Delayed::new(s.wait));
            (outcome(&config, request, decided, delayed), slot)
        }
    };
    let verdict = verdict(&config, &mut parts, result);
    // Delay mode: forward when the reserved tokens are due. Waiting here, in
    // the check, keeps the response future's states as they are: it polls the
    // check until the request may go on. Shadow mode never holds a request.
    if let Some(slot) = slot
        && matches!(verdict, Verdict::Forward(_))
        && !config.shadow
    {
        tokio::time::sleep(slot.wait).await;
    }
    Checked { parts, verdict }
}

/// The check of a request whose key the store holds so that it decides at
/// once (a memory store's key, a leasing Redis store's key whose hold
/// pays), from the service's `call` before [`in_call`]: decided for less
/// than [`now`] decides it (the request is neither moved nor taken apart,
/// the storage key is not written out), to the same outcome, with an
/// admitted request's decision in its extensions: forward it with the
/// `After` (`Ok`), or answer it (`Err`). `None`, having changed nothing,
/// for every other request (no key, a key the store does not hold as it
/// is): check it with [`in_call`].
#[inline]
pub(crate) fn held_in_call<B>(
    config: &Config,
    req: &mut Request<B>,
) -> Option<Result<After, Response<Bytes>>> {
    // As `place` places it: a layer with held keys is not in shadow mode
    // (see `layer::held`), so a refusal is answered.
    Some(match held(config, req.headers())? {
        Ok(Admitted::Held(spent, policy)) => {
            Ok(held_placed(config, req.extensions_mut(), spent, policy))
        }
        Ok(Admitted::After(after)) => Ok(placed(config, req.extensions_mut(), after)),
        Err(answer) => Err(refused(config, req, answer)),
    })
}

/// As [`placed`] places an admitted request's decision, for one
/// [`held_in_call`] admitted with `spent` (by `held`) under `policy`: the
/// decision is built where it goes (the request's extensions, the
/// response's headers), not moved there through every call (a held check
/// leaves nothing else to place: no ticket, no marks; see `layer::held`).
#[inline]
fn held_placed(
    config: &Config,
    extensions: &mut Extensions,
    (held, spent): (&Held, Spent),
    policy: Cow<'_, Policy>,
) -> After {
    let headers = Deferred::new(config.headers, policy);
    let decision = place_decision(
        config,
        extensions,
        || held.decision(spent),
        headers.is_some(),
    );
    After {
        ticket: None,
        headers,
        decision,
        decision_in_response: config.decision_in_response,
        marks: None,
    }
}

/// The answer to a request [`held_in_call`] refused (out of its way: most
/// requests are admitted).
#[cold]
fn refused<B>(config: &Config, req: &Request<B>, answer: Answer) -> Response<Bytes> {
    match media::flavor_of(req.method(), req.headers()) {
        Some(kind) => grpc::render(answer, kind, config.headers),
        None => http_answer::render(answer, config.headers, &config.rejection),
    }
}

/// [`held_in_call`]'s decision, before it is placed.
#[inline(always)]
fn held<'c>(config: &'c Config, headers: &HeaderMap) -> Option<Result<Admitted<'c>, Answer>> {
    let held = config.held.as_ref()?;
    debug_assert!(!config.shadow, "held keys in shadow mode");
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
    let spent = held.check(&value, policy)?;
    let kind = config.key.name();
    config
        .limiter
        .answered(spent.allowed, policy, kind, held.fresh());
    // The headers get this thread's copy of the policy (see
    // `Policy::thread_copy`).
    let policy = match config.headers {
        HeaderStyle::None => Cow::Borrowed(policy),
        _ => Cow::Owned(policy.thread_copy()),
    };
    if !spent.allowed {
        let request = KeyedRequest {
            policy,
            kind: Cow::Borrowed(kind),
            value,
            cost: held.keys.cost(),
        };
        return Some(held_refused(config, request, held.decision(spent)).map(Admitted::After));
    }
    // As `outcome` builds it: a layer with held keys settles nothing by
    // the response and marks nothing (see `layer::held`), and the
    // decision is built where `held_placed` places it.
    Some(Ok(Admitted::Held((held, spent), policy)))
}

/// What [`held`] forwards: an admitted check's figures (with the held
/// keys that build its decision) under the policy its headers get, or what
/// [`outcome`] forwards a refusal with (never, as it stands: `outcome`
/// answers a store's refusal, and a layer with held keys is not in shadow
/// mode; the held path follows whatever `outcome` decides all the same).
enum Admitted<'c> {
    Held((&'c Held, Spent), Cow<'c, Policy>),
    After(After),
}

/// [`held`]'s refusal, as [`outcome`] makes it (out of its way: most
/// requests are admitted).
#[cold]
fn held_refused(
    config: &Config,
    request: KeyedRequest<'_>,
    decision: Decision,
) -> Result<After, Answer> {
    outcome(config, request, Decided::Store(decision), None)
}

/// A value the header's extractor built, made safe as `prepare` makes it
/// (out of [`held`]'s way: a held key is seldom built).
#[cold]
fn made_safe(value: String) -> Cow<'static, str> {
    Cow::Owned(into_safe(value))
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
    match result {
        Ok(after) => Ok(placed(config, extensions, after)),
        Err(answer) if config.shadow => Ok(placed(
            config,
            extensions,
            shadow_report(answer, config.headers),
        )),
        Err(answer) => Err(answer),
    }
}

/// [`place`] for a request that is forwarded.
#[inline(always)]
fn placed(config: &Config, extensions: &mut Extensions, mut after: After) -> After {
    if let Some(decision) = after.decision.take() {
        after.decision_in_response = config.decision_in_response;
        let headers = after.headers.is_some();
        after.decision = place_decision(config, extensions, || decision, headers);
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
    after
}

/// Puts an admitted request's decision into its `extensions`, where
/// handlers read it (unless the layer was told not to), and gives it back
/// only if the response needs it too: for its rate limit headers
/// (`headers`) or its extensions. The decision is built (`decision`) only
/// where it goes.
#[inline]
fn place_decision(
    config: &Config,
    extensions: &mut Extensions,
    decision: impl FnOnce() -> Decision,
    headers: bool,
) -> Option<Decision> {
    let response = headers || config.decision_in_response;
    match (config.decision_in_request, response) {
        (true, true) => {
            let decision = decision();
            extensions.insert(decision.clone());
            Some(decision)
        }
        (true, false) => {
            extensions.insert(decision());
            None
        }
        (false, true) => Some(decision()),
        (false, false) => None,
    }
}

/// The layer's own answer to a request, over gRPC or HTTP as it came.
fn respond(config: &Config, parts: &Parts, answer: Answer) -> Response<Bytes> {
    match media::flavor(parts) {
        Some(kind) => grpc::render(answer, kind, config.headers),
        None => http_answer::render(answer, config.headers, &config.rejection),
    }
}
