//! The layer's key extractor behind one type: [`KeyExtractor`] returns
//! `impl Future`, which cannot be called through `dyn`, so the layer keeps
//! its extractors as [`Extractor`]s.

use std::any::Any;
use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use http::request::Parts;

use crate::key::{Header, KeyExtractor, Kind};

/// A boxed future, as the object-safe extractor wrapper returns.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`KeyExtractor`] returns `impl Future`, which cannot be called through `dyn`;
/// this wrapper can, so the layer keeps one type whatever extractor it is given.
trait DynKey: Send + Sync {
    fn extract<'a>(&'a self, parts: &'a Parts) -> BoxFuture<'a, Option<String>>;

    /// Polls the extractor's future once, where it stands (no box): every
    /// built-in extractor, and `from_fn`, is ready at once.
    fn extract_now(&self, parts: &Parts) -> Poll<Option<String>>;
}

impl<K: KeyExtractor> DynKey for K {
    fn extract<'a>(&'a self, parts: &'a Parts) -> BoxFuture<'a, Option<String>> {
        Box::pin(KeyExtractor::extract(self, parts))
    }

    fn extract_now(&self, parts: &Parts) -> Poll<Option<String>> {
        let future = std::pin::pin!(KeyExtractor::extract(self, parts));
        future.poll(&mut Context::from_waker(Waker::noop()))
    }
}

/// A key extractor with its kind read once, at configuration time.
#[derive(Clone)]
pub(crate) struct Extractor {
    kind: Kind,
    /// `kind` as text, shared by the requests that name it.
    name: Arc<str>,
    inner: Arc<dyn DynKey>,
    /// Set when the extractor's future was once not ready at its first
    /// poll: from then on it is boxed and awaited (see [`Extraction`]).
    waits: Arc<AtomicBool>,
    /// The extractor itself when it is a [`Header`], whose key the layer
    /// borrows from the request instead of taking a copy.
    header: Option<Header>,
}

impl Extractor {
    pub(crate) fn new(key: impl KeyExtractor) -> Self {
        let kind = key.kind();
        let header = (&key as &dyn Any).downcast_ref::<Header>().cloned();
        Extractor {
            name: Arc::from(kind.as_str()),
            kind,
            inner: Arc::new(key),
            waits: Arc::new(AtomicBool::new(false)),
            header,
        }
    }

    pub(crate) fn kind(&self) -> &str {
        self.kind.as_str()
    }

    /// The extractor itself when it is a [`Header`].
    pub(crate) fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }

    /// The kind, shared.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The key of `parts`. The extractor's future is polled once where it
    /// stands; one that is not ready then is dropped, and it (and every later
    /// one of this extractor) is boxed and awaited instead, or, when `wait`
    /// is false (the layer's try without waiting), left for later:
    /// [`Extraction::NotNow`].
    ///
    /// A [`Header`]'s key is borrowed from the request when it is kept as it
    /// is (the same key its `extract` returns, without the copy).
    pub(crate) fn extract<'a, 'p: 'a>(
        &'a self,
        parts: &'p Parts,
        wait: bool,
    ) -> Extraction<'a, 'p> {
        if let Some(header) = &self.header {
            return Extraction::Ready(Some(header.key_of(parts)));
        }
        if !self.waits.load(Ordering::Relaxed) {
            match self.inner.extract_now(parts) {
                Poll::Ready(key) => return Extraction::Ready(Some(key.map(Cow::Owned))),
                Poll::Pending => self.waits.store(true, Ordering::Relaxed),
            }
        }
        if wait {
            Extraction::Later(self.inner.extract(parts))
        } else {
            Extraction::NotNow
        }
    }
}

/// The key of one request (borrowed from the request `'p`, or owned):
/// extracted at once, or a future to await.
pub(crate) enum Extraction<'a, 'p> {
    Ready(Option<Option<Cow<'p, str>>>),
    Later(BoxFuture<'a, Option<String>>),
    /// Not extracted: the extractor waits, and the caller does not.
    NotNow,
}

impl<'p> Future for Extraction<'_, 'p> {
    type Output = Option<Cow<'p, str>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Extraction::Ready(key) => Poll::Ready(key.take().flatten()),
            Extraction::Later(future) => future.as_mut().poll(cx).map(|key| key.map(Cow::Owned)),
            Extraction::NotNow => Poll::Pending,
        }
    }
}

impl fmt::Debug for Extractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.as_str())
    }
}
