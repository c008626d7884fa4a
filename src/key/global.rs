//! [`Global`]: one bucket shared by every request.

use std::borrow::Cow;

use http::request::Parts;

use super::extractor::KeyExtractor;

/// One bucket for everything: every request gets the key `global`.
#[derive(Clone, Copy, Debug, Default)]
#[must_use]
pub struct Global;

impl KeyExtractor for Global {
    fn kind(&self) -> Cow<'static, str> {
        Cow::Borrowed("global")
    }

    async fn extract(&self, _parts: &Parts) -> Option<String> {
        Some("global".to_owned())
    }
}
