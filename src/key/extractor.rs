//! [`KeyExtractor`]: what every key extractor implements.

use std::borrow::Cow;
use std::future::Future;

use http::request::Parts;

/// Takes a client key from a request head. See the [module docs](crate::key).
pub trait KeyExtractor: Send + Sync + 'static {
    /// A short name for this kind of key (`"ip"`, `"header:x-api-key"`), put in
    /// front of every key it extracts so keys of different kinds never collide.
    fn kind(&self) -> Cow<'static, str>;

    /// The client key of this request, or `None` when it has none.
    fn extract(&self, parts: &Parts) -> impl Future<Output = Option<String>> + Send;
}
