//! [`from_fn`]: a key from a closure over the request head.

use std::borrow::Cow;
use std::fmt;

use http::request::Parts;

use super::extractor::KeyExtractor;

/// A key from a closure over the request head; see [`from_fn`].
#[derive(Clone)]
#[must_use]
pub struct FromFn<F> {
    kind: Cow<'static, str>,
    f: F,
}

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromFn").field("kind", &self.kind).finish()
    }
}

/// A key extractor from a closure: `from_fn("tenant", |parts| ...)`. `kind` names
/// the key family (see [`KeyExtractor::kind`]). For an asynchronous lookup,
/// implement [`KeyExtractor`] directly.
pub fn from_fn<F>(kind: impl Into<Cow<'static, str>>, f: F) -> FromFn<F>
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    FromFn {
        kind: kind.into(),
        f,
    }
}

impl<F> KeyExtractor for FromFn<F>
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn kind(&self) -> Cow<'static, str> {
        self.kind.clone()
    }

    async fn extract(&self, parts: &Parts) -> Option<String> {
        (self.f)(parts)
    }
}
