//! [`ResponseFuture`]: first the check, then the inner service.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::bodies::{Bodies, Wrapped};
use super::body::ResponseBody;
use super::check::{Checked, Verdict};
use super::dyn_key::BoxFuture;
use super::outcome::{After, Marks};
use super::report::add_report;
use super::settle::settle_now;
use crate::decision::Decision;

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): the inner
    /// service's future or the layer's own answer for a request decided in
    /// `call`; otherwise it decides the request first (a Redis call, a key
    /// extractor that waits, delay mode), then calls the inner service or
    /// answers by itself.
    pub struct ResponseFuture<S, ReqBody, M = Wrapped>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
        bodies: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        Checking {
            check: BoxFuture<'static, Checked>,
            // The inner service, already ready (swapped out in `call`), and the
            // body: both wait here until the decision is made.
            inner: Option<S>,
            body: Option<ReqBody>,
        },
        // Boxed: this future is moved several times on its way to the
        // server (its whole size each time, whatever the state), and
        // `After` would make it 120 bytes larger for every request.
        Calling {
            #[pin]
            future: S::Future,
            after: Option<Box<After>>,
        },
        // The same with nothing to add to the response (no headers, no
        // extensions, nothing to settle): its output passes through.
        Passing {
            #[pin]
            future: S::Future,
        },
        // Answered by the layer when the request came (no check to wait for).
        Answered {
            res: Option<Response<Bytes>>,
        },
        // Answered: the layer's own response went out, or the inner future ended.
        Done,
    }
}

impl<S, ReqBody, M> ResponseFuture<S, ReqBody, M>
where
    S: Service<Request<ReqBody>>,
{
    /// Calls the inner service's `future` (the request was admitted at once),
    /// then adds `after` to its response.
    pub(crate) fn calling(future: S::Future, after: After) -> Self {
        ResponseFuture {
            state: State::calling(future, after),
            bodies: PhantomData,
        }
    }

    /// Calls the inner service's `future` with nothing to add to its
    /// response.
    pub(crate) fn passing(future: S::Future) -> Self {
        ResponseFuture {
            state: State::Passing { future },
            bodies: PhantomData,
        }
    }

    /// Answers `res` (the layer decided at once not to call the service).
    pub(crate) fn answered(res: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Answered { res: Some(res) },
            bodies: PhantomData,
        }
    }

    /// Waits for `check`, then calls `inner` with the request or answers.
    pub(crate) fn new(check: BoxFuture<'static, Checked>, inner: S, body: ReqBody) -> Self {
        ResponseFuture {
            state: State::Checking {
                check,
                inner: Some(inner),
                body: Some(body),
            },
            bodies: PhantomData,
        }
    }
}

impl<S, ReqBody> State<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    /// Waits for `future`, then adds `after` to its response, if there is
    /// anything to add.
    fn calling(future: S::Future, after: After) -> Self {
        if after.is_empty() {
            State::Passing { future }
        } else {
            State::Calling {
                future,
                after: Some(Box::new(after)),
            }
        }
    }
}

impl<S, ReqBody, ResBody, M> Future for ResponseFuture<S, ReqBody, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    M: Bodies<ResBody>,
{
    type Output = Result<Response<M::Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { check, inner, body } => {
                    let Checked { parts, verdict } = ready!(check.as_mut().poll(cx));
                    let after = match verdict {
                        Verdict::Respond(res) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(
                                res.map(|data| M::body(ResponseBody::own(data)))
                            ));
                        }
                        Verdict::Forward(after) => after,
                    };
                    let (Some(mut service), Some(body)) = (inner.take(), body.take()) else {
                        // Both are taken only here, right before leaving this state.
                        polled_after_completion()
                    };
                    let future = service.call(Request::from_parts(parts, body));
                    this.state.set(State::calling(future, after));
                }
                // The inner future's answer as it is, its body wrapped at
                // most.
                StateProj::Passing { future } => {
                    let res = ready!(future.poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(res.map(M::pass));
                }
                StateProj::Calling { future, after } => {
                    let res = ready!(future.poll(cx));
                    let mut after: Option<After> = after.take().map(|after| *after);
                    this.state.set(State::Done);
                    let res = res?;
                    // The response settles the request's cost now, or, for a
                    // gRPC status still to come in the trailers, at the end
                    // of the body.
                    let (trailing, charged) = match after.as_mut().and_then(|a| a.ticket.take()) {
                        Some(ticket) => settle_now(ticket, res.status(), res.headers()),
                        None => (None, 0),
                    };
                    // A charge at the head is in the headers written below,
                    // so they never say more remains than does.
                    if charged > 0
                        && let Some(after) = after.as_mut()
                    {
                        after.decision = after.decision.take().map(|d| d.charged(charged));
                    }
                    let mut res = match trailing {
                        None => M::pass(res),
                        trailing => res.map(|body| M::body(ResponseBody::settling(body, trailing))),
                    };
                    if let Some(after) = after {
                        if let (Some(headers), Some(decision)) = (&after.headers, &after.decision) {
                            add_report(res.headers_mut(), headers.style, &headers.policy, decision);
                        }
                        // With nested layers the innermost (most specific) decision
                        // is kept, as the handler saw it in the request.
                        if let Some(decision) = after.decision
                            && after.decision_in_response
                            && res.extensions().get::<Decision>().is_none()
                        {
                            res.extensions_mut().insert(decision);
                        }
                        if let Some(marks) = after.marks {
                            let Marks {
                                failure,
                                shadow,
                                delayed,
                            } = *marks;
                            let extensions = res.extensions_mut();
                            if let Some(failure) = failure {
                                extensions.insert(failure);
                            }
                            if let Some(shadow) = shadow {
                                extensions.insert(shadow);
                            }
                            if let Some(delayed) = delayed {
                                extensions.insert(delayed);
                            }
                        }
                    }
                    return Poll::Ready(Ok(res));
                }
                StateProj::Answered { res } => {
                    let Some(res) = res.take() else {
                        polled_after_completion()
                    };
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(res.map(|data| M::body(ResponseBody::own(data)))));
                }
                StateProj::Done => polled_after_completion(),
            }
        }
    }
}

/// The `Future` contract forbids polling a finished future; like the futures
/// of std and tower, this one panics if it happens (a bug in the caller, never
/// something a request can cause).
#[cold]
fn polled_after_completion() -> ! {
    panic!("rate limit ResponseFuture polled after completion")
}
