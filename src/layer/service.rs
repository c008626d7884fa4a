//! [`RateLimit`]: the middleware service.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::bodies::{Bodies, Wrapped};
use super::check::{InCall, held_in_call, in_call};
use super::config::Config;
use super::future::ResponseFuture;

/// Rate limits requests to the inner service `S`.
///
/// Built by [`RateLimitLayer`](super::RateLimitLayer); see the
/// [module docs](crate::layer) for an example and the responses it sends. Its
/// responses carry a [`ResponseBody`](super::ResponseBody) around the inner
/// service's body, so the layer can answer by itself whatever that body type
/// is; with `M` = [`AxumBody`](super::AxumBody)
/// ([`RateLimitLayer::axum_body`](super::RateLimitLayer::axum_body)) they keep
/// axum's `Body` (see [`Bodies`]).
#[must_use]
pub struct RateLimit<S, M = Wrapped> {
    inner: S,
    pub(super) config: Arc<Config>,
    bodies: PhantomData<fn() -> M>,
}

impl<S, M> RateLimit<S, M> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        RateLimit {
            inner,
            config,
            bodies: PhantomData,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming the middleware.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, M> Clone for RateLimit<S, M> {
    fn clone(&self) -> Self {
        RateLimit::new(self.inner.clone(), Arc::clone(&self.config))
    }
}

impl<S: fmt::Debug, M> fmt::Debug for RateLimit<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, ReqBody, ResBody, M> Service<Request<ReqBody>> for RateLimit<S, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    M: Bodies<ResBody>,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        // A key the store holds (the common case), decided without moving
        // the request.
        if let Some(result) = held_in_call(&self.config, &mut req) {
            return match result {
                Ok(after) if after.is_empty() => ResponseFuture::passing(self.inner.call(req)),
                Ok(after) => ResponseFuture::calling(self.inner.call(req), after),
                Err(res) => ResponseFuture::answered(res),
            };
        }
        match in_call(&self.config, req) {
            // Decided at once (the common case): the service driven to
            // readiness is called right away, or not at all. Each future is
            // built where it is returned: the inner future is not moved
            // again on its way out.
            InCall::Forward(req, after) if after.is_empty() => {
                ResponseFuture::passing(self.inner.call(req))
            }
            InCall::Forward(req, after) => ResponseFuture::calling(self.inner.call(req), after),
            InCall::Respond(res) => ResponseFuture::answered(res),
            // The decision comes later: the service that was driven to
            // readiness is `self.inner`; take it for this request and leave a
            // fresh clone behind (tower-service docs, "Be careful when cloning
            // inner services").
            InCall::Later(check, body) => {
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::new(check, inner, body)
            }
        }
    }
}
