//! [`Bodies`]: the body type of the responses that leave the layer, the
//! default [`Wrapped`] or, for axum, [`AxumBody`].

use super::body::ResponseBody;
#[cfg(feature = "axum")]
use super::body::Taken;
use super::sealed::Sealed;

/// The body type of the responses that leave the layer, for an inner service
/// whose responses carry a `B`: the type parameter `M` of
/// [`RateLimit<S, M>`](super::RateLimit).
///
/// - [`Wrapped`], the default: a [`ResponseBody<B>`] around the inner body,
///   whatever its type, so the layer can answer by itself.
/// - [`AxumBody`] (feature `axum`): axum's own `Body`, passed on as it is; the
///   layer's answers are `Body`s too. Chosen with
///   [`RateLimitLayer::axum_body`](super::RateLimitLayer::axum_body).
///
/// Sealed: the layer's bodies are one of these.
pub trait Bodies<B>: Sealed {
    /// The body of every response the layer returns.
    type Body;

    #[doc(hidden)]
    fn body(body: ResponseBody<B>) -> Self::Body;

    /// A response of the inner service the layer adds nothing to.
    #[doc(hidden)]
    #[inline]
    fn pass(res: http::Response<B>) -> http::Response<Self::Body> {
        res.map(|body| Self::body(ResponseBody::settling(body, None)))
    }
}

/// Responses carry a [`ResponseBody`] around the inner service's body (the
/// default; see [`Bodies`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Wrapped;

impl Sealed for Wrapped {}

impl<B> Bodies<B> for Wrapped {
    type Body = ResponseBody<B>;

    fn body(body: ResponseBody<B>) -> Self::Body {
        body
    }
}

/// Responses keep axum's `Body` (see [`Bodies`] and
/// [`RateLimitLayer::axum_body`](super::RateLimitLayer::axum_body)): the
/// inner service's body is passed on as it is, and the layer's answers are
/// `Body`s of their own bytes. A gRPC response settled by its trailers
/// ([`settle`](super::RateLimitLayer::settle)) is the one body still
/// wrapped, into a `Body` of its own.
#[cfg(feature = "axum")]
#[derive(Clone, Copy, Debug, Default)]
pub struct AxumBody;

#[cfg(feature = "axum")]
impl Sealed for AxumBody {}

#[cfg(feature = "axum")]
impl Bodies<axum::body::Body> for AxumBody {
    type Body = axum::body::Body;

    /// As it is: no body to wrap, no response to take apart.
    #[inline]
    fn pass(res: http::Response<axum::body::Body>) -> http::Response<Self::Body> {
        res
    }

    fn body(body: ResponseBody<axum::body::Body>) -> Self::Body {
        match body.taken() {
            Taken::Plain(body) => body,
            Taken::Own(data) => axum::body::Body::from(data.unwrap_or_default()),
            Taken::Watched(body) => axum::body::Body::new(body),
        }
    }
}
