//! [`ResponseFuture`]: first the check, then the inner service.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::check::{After, Checked, Verdict};
use super::config::BoxFuture;
use super::response::apply_report;

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): decides the
    /// request, then calls the inner service or answers by itself.
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
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

impl<S, ReqBody> ResponseFuture<S, ReqBody>
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
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Bytes>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { check, inner, body } => {
                    let Checked { parts, verdict } = ready!(check.as_mut().poll(cx));
                    let after = match verdict {
                        Verdict::Respond(res) => return Poll::Ready(Ok(res.map(ResBody::from))),
                        Verdict::Forward(after) => after,
                    };
                    let (Some(mut service), Some(body)) = (inner.take(), body.take()) else {
                        // Only reachable when polled again after completing, which
                        // the Future contract forbids; answer rather than panic.
                        return Poll::Ready(Ok(internal_error()));
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
                        if let Some(decision) = after.decision {
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

fn internal_error<B: From<Bytes>>() -> Response<B> {
    let mut res = Response::new(B::from(Bytes::new()));
    *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    res
}
