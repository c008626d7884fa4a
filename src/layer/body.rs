//! How the layer's own answers (429, 503, 400, gRPC statuses) get the inner
//! service's body type.
//!
//! The layer keeps the inner service's response body type, so it must build
//! bodies of that type. [`TextBody`], the default, needs `B: From<Bytes>` (axum's
//! `Body`, `http_body_util::Full<Bytes>`, `String`-free hyper services) and sends
//! the short text or JSON. [`EmptyBody`] needs only `B: Default` and sends the
//! status and headers with an empty body, for body types without `From<Bytes>`
//! such as tonic's `Body`. Choose with
//! [`RateLimitLayer::bodies`](crate::layer::RateLimitLayer::bodies).
//!
//! Answers to gRPC calls are trailers-only, so their body is empty whichever is
//! chosen: on tonic's server `EmptyBody` loses nothing. `TextBody` cannot cover
//! tonic's `Body` itself: Rust refuses an impl for it next to the blanket one
//! (error E0119, "upstream crates may add a new impl of trait `From<Bytes>`").

use bytes::Bytes;

/// Turns the bytes of an answer the layer built into a body of type `B`.
///
/// Implement it for your own marker type to convert bodies another way.
pub trait MakeBody<B> {
    /// The body for `bytes` (the rendered text or JSON, possibly empty).
    fn make_body(bytes: Bytes) -> B;
}

/// The default: bodies carry the layer's text (`B: From<Bytes>`).
#[derive(Clone, Copy, Debug, Default)]
pub struct TextBody;

impl<B: From<Bytes>> MakeBody<B> for TextBody {
    fn make_body(bytes: Bytes) -> B {
        B::from(bytes)
    }
}

/// Empty bodies (`B: Default`): status and headers only.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmptyBody;

impl<B: Default> MakeBody<B> for EmptyBody {
    fn make_body(_bytes: Bytes) -> B {
        B::default()
    }
}
