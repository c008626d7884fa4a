//! [`from_fn`]: a key from a closure over the request head.

use std::borrow::Cow;
use std::fmt;

use http::request::Parts;

use super::extractor::{KeyExtractor, Kind};

/// A key from a closure over the request head; see [`from_fn`].
#[derive(Clone)]
#[must_use]
pub struct FromFn<F> {
    kind: Kind,
    f: F,
}

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromFn").field("kind", &self.kind).finish()
    }
}

/// A key extractor from a closure: `from_fn("tenant", |parts| ...)`. `kind` names
/// the key family; its kind is [`Kind::custom`] of it (`custom:tenant`), so a
/// closure named `ip` never shares a bucket with [`PeerIp`](super::PeerIp). For
/// an asynchronous lookup, implement [`KeyExtractor`] directly.
pub fn from_fn<F>(kind: impl Into<Cow<'static, str>>, f: F) -> FromFn<F>
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    FromFn {
        kind: Kind::custom(&kind.into()),
        f,
    }
}

impl<F> KeyExtractor for FromFn<F>
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn kind(&self) -> Kind {
        self.kind.clone()
    }

    async fn extract(&self, parts: &Parts) -> Option<String> {
        (self.f)(parts)
    }
}
