//! [`Sending`]: the future of a check on its way to Redis, as
//! [`RedisStore::send`](super::RedisStore) starts it.
//!
//! A named future instead of an `async fn`: a check that the layer could not
//! decide in `call` is boxed with everything it awaits, and every `async fn`
//! between the layer and the batch keeps its own copy of its arguments for as
//! long as the check waits. With the route chosen before the future is made,
//! the box holds the batched wait itself and nothing around it (see the size
//! test in `layer/service.rs`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::Decision;
use crate::error::Error;

/// A boxed future of a decision and its wait.
pub(crate) type Boxed<'a> =
    Pin<Box<dyn Future<Output = Result<(Decision, u64), Error>> + Send + 'a>>;

pin_project! {
    /// A check queued for the next batched call (`B`), or anything else,
    /// boxed: a call of its own (its redis-rs futures are kilobytes, and
    /// rare) or an answer known before anything was sent.
    #[project = SendingProj]
    pub(crate) enum Sending<'a, B> {
        Batched { #[pin] future: B },
        Alone { future: Boxed<'a> },
    }
}

impl<B> Sending<'_, B> {
    /// A future that answers `error` at once (a path no check should take).
    pub(crate) fn failed(error: Error) -> Self {
        Sending::Alone {
            future: Box::pin(std::future::ready(Err(error))),
        }
    }
}

impl<B> Future for Sending<'_, B>
where
    B: Future<Output = Result<(Decision, u64), Error>>,
{
    type Output = Result<(Decision, u64), Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            SendingProj::Batched { future } => future.poll(cx),
            SendingProj::Alone { future } => future.as_mut().poll(cx),
        }
    }
}
