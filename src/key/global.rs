//! [`Global`]: one bucket shared by every request.

use http::request::Parts;

use super::extractor::{KeyExtractor, Kind};

/// One bucket for everything: every request gets the key `global`.
#[derive(Clone, Copy, Debug, Default)]
#[must_use]
pub struct Global;

impl KeyExtractor for Global {
    fn kind(&self) -> Kind {
        Kind::reserved("global")
    }

    async fn extract(&self, _parts: &Parts) -> Option<String> {
        Some("global".to_owned())
    }
}
