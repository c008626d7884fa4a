//! [`Header`]: a key from one request header, such as an API key.

use http::HeaderName;
use http::request::Parts;
use std::borrow::Cow;

use super::extractor::{KeyExtractor, Kind};
use crate::store::{hashed_key, safe_key};

/// The value of one request header, such as an API key or a gRPC metadata entry.
///
/// **The client chooses this key.** Each new value is a new, full bucket and a
/// new entry in the store, so on its own `Header` limits only clients that keep
/// sending the same value: one that sends a random API key per request is never
/// limited, and fills Redis as it goes. Use it for values the client cannot
/// vary at will (a header your gateway sets, API keys already checked before
/// the rate limit), and keep a per-address limit in front; for verified
/// identities key on what your auth layer stored ([`FromExtension`](super::FromExtension)).
/// See [the recipes](super#recipes-who-gets-a-bucket).
///
/// - **Hashed by default.** Header keys are often credentials, so the value is
///   stored as `#` and 128 bits of its SHA-256: an API key never appears in
///   `KEYS`, `MONITOR` or the slow log. [`Header::verbatim`] keeps short, plain
///   values readable (for non-secret headers such as a tenant id); long, binary
///   or unsafe values are hashed either way, so the stored key is bounded
///   whatever the client sends.
/// - **One value.** An empty value, or a header sent more than once, counts as
///   missing: with several lines a client could pair the value an auth layer
///   checks with a fresh one for every request, and so a fresh bucket.
#[derive(Clone, Debug)]
#[must_use]
pub struct Header {
    name: HeaderName,
    verbatim: bool,
}

impl Header {
    /// Keys requests by the header `name`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`](crate::ConfigError) when `name` is not a valid header
    /// name: a configuration mistake, caught at start-up.
    pub fn new(name: &str) -> Result<Self, crate::ConfigError> {
        Self::try_new_inner(name)
    }

    /// The old name of [`new`](Self::new), which returns the error now.
    #[deprecated(since = "0.1.0", note = "`Header::new` returns the error now")]
    pub fn try_new(name: &str) -> Result<Self, crate::ConfigError> {
        Self::try_new_inner(name)
    }

    fn try_new_inner(name: &str) -> Result<Self, crate::ConfigError> {
        HeaderName::from_bytes(name.as_bytes())
            .map(|name| Header {
                name,
                verbatim: false,
            })
            .map_err(|_| crate::ConfigError::key(format!("{name:?} is not a valid header name")))
    }

    /// Keeps values that are short and plain (see [`safe_key`](crate::store::safe_key))
    /// readable in the store instead of hashing them. Only for headers that are
    /// not secrets.
    pub fn verbatim(mut self) -> Self {
        self.verbatim = true;
        self
    }
}

impl KeyExtractor for Header {
    fn kind(&self) -> Kind {
        Kind::tagged("header", self.name.as_str())
    }

    async fn extract(&self, parts: &Parts) -> Option<String> {
        self.key_of(parts).map(Cow::into_owned)
    }
}

impl Header {
    /// The key of `parts`, as [`extract`](KeyExtractor::extract) makes it,
    /// borrowed from the request when it is kept as it is (a short, plain
    /// value with [`verbatim`](Self::verbatim)): the layer uses it without
    /// a copy of its own.
    pub(crate) fn key_of<'p>(&self, parts: &'p Parts) -> Option<Cow<'p, str>> {
        self.key_in(&parts.headers)
    }

    /// [`key_of`](Self::key_of) from the request's headers alone.
    pub(crate) fn key_in<'p>(&self, headers: &'p http::HeaderMap) -> Option<Cow<'p, str>> {
        // A header sent twice is no key. When no name of the request has
        // two values (the common case), the value found first is the only
        // one: no second look.
        let value = if headers.len() == headers.keys_len() {
            headers.get(&self.name)?
        } else {
            let mut values = headers.get_all(&self.name).iter();
            let value = values.next()?;
            if values.next().is_some() {
                return None;
            }
            value
        };
        if value.is_empty() {
            return None;
        }
        if !self.verbatim {
            return Some(Cow::Owned(hashed_key(value.as_bytes())));
        }
        // `safe_key_bytes`, for less: a safe key is visible ASCII, which
        // `to_str` checks more cheaply than UTF-8 validation, and a value
        // that is not is hashed either way.
        Some(match value.to_str() {
            Ok(text) => safe_key(text),
            Err(_) => Cow::Owned(hashed_key(value.as_bytes())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(req: http::request::Builder) -> Parts {
        req.body(()).unwrap().into_parts().0
    }

    #[tokio::test]
    async fn header_values_are_hashed_unless_verbatim() {
        let p = parts(Request::get("/").header("x-api-key", "sk_live_abc123"));
        let hashed = Header::new("x-api-key").unwrap().extract(&p).await.unwrap();
        assert!(
            hashed.starts_with('#') && !hashed.contains("abc123"),
            "{hashed}"
        );
        let plain = Header::new("x-api-key")
            .unwrap()
            .verbatim()
            .extract(&p)
            .await;
        assert_eq!(plain.as_deref(), Some("sk_live_abc123"));
    }

    #[tokio::test]
    async fn a_header_sent_twice_is_missing() {
        let p = parts(
            Request::get("/")
                .header("x-api-key", "a")
                .header("x-api-key", "b"),
        );
        assert_eq!(Header::new("x-api-key").unwrap().extract(&p).await, None);
        // Another header sent twice leaves a key sent once as it is.
        let p = parts(
            Request::get("/")
                .header("x-api-key", "a")
                .header("accept", "text/plain")
                .header("accept", "text/html"),
        );
        let key = Header::new("x-api-key")
            .unwrap()
            .verbatim()
            .extract(&p)
            .await;
        assert_eq!(key.as_deref(), Some("a"));
        // And a key sent twice among headers sent once each is still missing.
        let p = parts(
            Request::get("/")
                .header("accept", "text/plain")
                .header("x-api-key", "a")
                .header("x-api-key", "a"),
        );
        assert_eq!(Header::new("x-api-key").unwrap().extract(&p).await, None);
    }

    #[tokio::test]
    async fn header_values_are_bounded_and_safe() {
        let h = Header::new("x-api-key").unwrap().verbatim();
        let long = "a".repeat(64 * 1024);
        let p = parts(Request::get("/").header("x-api-key", long.as_str()));
        assert_eq!(h.extract(&p).await.unwrap().len(), 33);
        let p = parts(Request::get("/").header("x-api-key", &b"\xff{}"[..]));
        assert!(h.extract(&p).await.unwrap().starts_with('#'));
        let p = parts(Request::get("/").header("x-api-key", ""));
        assert_eq!(h.extract(&p).await, None);
        assert_eq!(h.extract(&parts(Request::get("/"))).await, None);
    }

    #[test]
    fn bad_header_names_are_configuration_errors() {
        assert!(Header::new("bad header").is_err());
    }

    proptest::proptest! {
        #![proptest_config(crate::hostile_input::config())]

        #[test]
        fn values_of_64k_give_short_safe_keys(
            value in crate::hostile_input::header_bytes(),
            verbatim in proptest::bool::ANY,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let h = if verbatim { Header::new("x-api-key").unwrap().verbatim() } else { Header::new("x-api-key").unwrap() };
            let p = parts(Request::get("/").header("x-api-key", value.as_slice()));
            let key = crate::hostile_input::within_budget("header", || rt.block_on(h.extract(&p)));
            match key {
                None => proptest::prop_assert!(value.is_empty()),
                Some(key) => {
                    proptest::prop_assert!(key.len() <= crate::store::MAX_RAW_KEY_LEN);
                    proptest::prop_assert_eq!(crate::store::safe_key(&key).len(), key.len());
                    if verbatim {
                        proptest::prop_assert_eq!(key, crate::store::safe_key_bytes(&value));
                    } else {
                        proptest::prop_assert!(key.starts_with('#') && key.len() == 33);
                    }
                }
            }
        }
    }
}
