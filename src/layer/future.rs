//! [`ResponseFuture`]: first the check, then the inner service.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::{MakeBody, TextBody};
use super::check::{After, Checked, Verdict};
use super::config::BoxFuture;
use super::response::apply_report;

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): decides the
    /// request, then calls the inner service or answers by itself.
    pub struct ResponseFuture<S, ReqBody, M = TextBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
        body: PhantomData<fn() -> M>,
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
        Calling {
            #[pin]
            future: S::Future,
            after: Option<After>,
        },
    }
}

impl<S, ReqBody, M> ResponseFuture<S, ReqBody, M>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn new(check: BoxFuture<'static, Checked>, inner: S, body: ReqBody) -> Self {
        ResponseFuture {
            state: State::Checking {
                check,
                inner: Some(inner),
                body: Some(body),
            },
            body: PhantomData,
        }
    }
}

impl<S, ReqBody, ResBody, M> Future for ResponseFuture<S, ReqBody, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    M: MakeBody<ResBody>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { check, inner, body } => {
                    let Checked { parts, verdict } = ready!(check.as_mut().poll(cx));
                    let after = match verdict {
                        Verdict::Respond(res) => return Poll::Ready(Ok(res.map(M::make_body))),
                        Verdict::Forward(after) => after,
                    };
                    let (Some(mut service), Some(body)) = (inner.take(), body.take()) else {
                        // Only reachable when polled again after completing, which
                        // the Future contract forbids; answer rather than panic.
                        return Poll::Ready(Ok(internal_error::<ResBody, M>()));
                    };
                    let future = service.call(Request::from_parts(parts, body));
                    this.state.set(State::Calling {
                        future,
                        after: Some(after),
                    });
                }
                StateProj::Calling { future, after } => {
                    let mut res = ready!(future.poll(cx))?;
                    if let Some(after) = after.take() {
                        apply_report(res.headers_mut(), after.headers);
                        // With nested layers the innermost (most specific) decision
                        // is kept, as the handler saw it in the request.
                        if let Some(decision) = after.decision
                            && res.extensions().get::<crate::Decision>().is_none()
                        {
                            res.extensions_mut().insert(decision);
                        }
                        if let Some(failure) = after.failure {
                            res.extensions_mut().insert(failure);
                        }
                    }
                    return Poll::Ready(Ok(res));
                }
            }
        }
    }
}

fn internal_error<B, M: MakeBody<B>>() -> Response<B> {
    let mut res = Response::new(M::make_body(Bytes::new()));
    *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    res
}
