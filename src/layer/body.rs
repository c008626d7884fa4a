//! [`ResponseBody`]: the body of every response that passes through the layer,
//! either the inner service's own or one of the layer's short answers.
//!
//! As in tower-http's `limit` middleware, wrapping the inner body lets the layer
//! answer by itself without asking anything of the inner body type beyond being
//! a body of `Bytes` chunks: axum's `Body`, tonic's `Body`, hyper's `Incoming`,
//! `http_body_util::Full<Bytes>` all work as they are.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::settle::Trailing;

pin_project! {
    /// The response body of [`RateLimit`](super::RateLimit): the inner service's
    /// body, or the text, JSON or (for gRPC) empty body of an answer the layer
    /// gave by itself.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            // A gRPC response's settlement, waiting for the trailers.
            trailing: Option<Box<Trailing>>,
        },
        Own { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body, settling `trailing` by its trailers.
    pub(crate) fn settling(body: B, trailing: Option<Box<Trailing>>) -> Self {
        ResponseBody {
            kind: Kind::Inner { body, trailing },
        }
    }

    pub(crate) fn own(data: Bytes) -> Self {
        let data = (!data.is_empty()).then_some(data);
        ResponseBody {
            kind: Kind::Own { data },
        }
    }

    /// The inner service's body, or `None` for an answer the layer gave itself.
    /// A gRPC response still waiting for its status to
    /// [settle](super::RateLimitLayer::settle) its cost keeps the cost as it
    /// stands: the layer no longer sees the trailers.
    pub fn into_inner(self) -> Option<B> {
        match self.kind {
            Kind::Inner { body, .. } => Some(body),
            Kind::Own { .. } => None,
        }
    }
}

/// What a [`ResponseBody`] holds, taken apart (see
/// [`Bodies`](super::Bodies)).
#[cfg(feature = "axum")]
pub(crate) enum Taken<B> {
    /// The inner service's body, with nothing to watch.
    Plain(B),
    /// The layer's own answer.
    Own(Option<Bytes>),
    /// The inner service's body, watched for a gRPC status in its trailers.
    Watched(ResponseBody<B>),
}

#[cfg(feature = "axum")]
impl<B> ResponseBody<B> {
    pub(crate) fn taken(self) -> Taken<B> {
        match self.kind {
            Kind::Inner {
                body,
                trailing: None,
            } => Taken::Plain(body),
            Kind::Own { data } => Taken::Own(data),
            kind @ Kind::Inner { .. } => Taken::Watched(ResponseBody { kind }),
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Own { data } => f
                .debug_struct("ResponseBody::Own")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body, trailing } => {
                let frame = ready!(body.poll_frame(cx));
                if trailing.is_some() {
                    match &frame {
                        Some(Ok(frame)) => {
                            if let Some(trailers) = frame.trailers_ref()
                                && let Some(waiting) = trailing.take()
                            {
                                waiting.finish(trailers);
                            }
                        }
                        // The end without trailers, or an error: no status
                        // will come, and the cost stands.
                        _ => *trailing = None,
                    }
                }
                Poll::Ready(frame)
            }
            KindProj::Own { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Own { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Own { data } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[tokio::test]
    async fn own_bodies_are_sent_whole_and_end() {
        let body: ResponseBody<Full<Bytes>> = ResponseBody::own(Bytes::from_static(b"limited"));
        assert_eq!(body.size_hint().exact(), Some(7));
        assert!(!body.is_end_stream());
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(bytes, "limited");
        let empty: ResponseBody<Full<Bytes>> = ResponseBody::own(Bytes::new());
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
    }

    #[tokio::test]
    async fn inner_bodies_pass_through() {
        let body = ResponseBody::settling(Full::new(Bytes::from_static(b"hello")), None);
        assert_eq!(body.size_hint().exact(), Some(5));
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(bytes, "hello");
    }
}
