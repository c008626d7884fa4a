//! Combining extractors: [`And`] (a bucket per pair, such as route and client) and
//! [`Or`] (the first extractor that finds a key), built with
//! [`KeyExtractorExt`].

use http::request::Parts;

use super::extractor::{KeyExtractor, Kind};
use crate::store::safe_key;

/// `.and()` and `.or()` on every [`KeyExtractor`].
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate::key::{FromExtension, KeyExtractor, KeyExtractorExt, PeerIp, from_fn};
///
/// /// The signed-in user, put in the request extensions by your auth layer.
/// #[derive(Clone)]
/// struct User(u64);
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let user = || FromExtension::new("user", |u: &User| u.0.to_string());
/// // One bucket per HTTP method and user (per route: `tollgate::key::Route`).
/// let method = from_fn("method", |parts| Some(parts.method.to_string()));
/// let per_method_and_user = method.and(user());
/// // The user when signed in, else the client address.
/// let user_or_ip = user().or(PeerIp::new());
///
/// let (mut parts, ()) = Request::get("/orders").body(()).unwrap().into_parts();
/// parts.extensions.insert(SocketAddr::from(([203, 0, 113, 7], 40_000)));
/// assert_eq!(per_method_and_user.extract(&parts).await, None);
/// assert_eq!(user_or_ip.extract(&parts).await.as_deref(), Some("1:203.0.113.7"));
///
/// parts.extensions.insert(User(42));
/// assert_eq!(per_method_and_user.kind(), "custom:method+ext:user");
/// assert_eq!(per_method_and_user.extract(&parts).await.as_deref(), Some("3:GET:42"));
/// assert_eq!(user_or_ip.extract(&parts).await.as_deref(), Some("0:42"));
/// # }
/// ```
pub trait KeyExtractorExt: KeyExtractor + Sized {
    /// Keys requests by both keys together; see [`And`].
    fn and<B: KeyExtractor>(self, other: B) -> And<Self, B> {
        And::new(self, other)
    }

    /// Keys requests by this key, or by `other` when this one is missing; see
    /// [`Or`].
    fn or<B: KeyExtractor>(self, other: B) -> Or<Self, B> {
        Or::new(self, other)
    }
}

impl<K: KeyExtractor> KeyExtractorExt for K {}

/// Both keys at once: a bucket per pair, such as one per route and client.
///
/// The key is missing when either key is missing. Each part is made safe with
/// [`safe_key`] (so the combined key stays bounded), and the first is prefixed
/// with its length, `len:first:second`: parts may contain any separator, and
/// without the length `("a:b", "c")` and `("a", "b:c")` would share a bucket. The
/// kind is `first+second`. Build it with [`KeyExtractorExt::and`].
#[derive(Clone, Debug)]
#[must_use]
pub struct And<A, B> {
    first: A,
    second: B,
}

impl<A: KeyExtractor, B: KeyExtractor> And<A, B> {
    /// Keys requests by the keys of `first` and `second` together.
    pub fn new(first: A, second: B) -> Self {
        And { first, second }
    }
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for And<A, B> {
    fn kind(&self) -> Kind {
        Kind::combined(&self.first.kind(), '+', &self.second.kind())
    }

    async fn extract(&self, parts: &Parts) -> Option<String> {
        let first = present(self.first.extract(parts).await)?;
        let second = present(self.second.extract(parts).await)?;
        let first = safe_key(&first);
        Some(format!("{}:{first}:{}", first.len(), safe_key(&second)))
    }
}

/// The first key found: `primary`'s, or else `fallback`'s, such as the verified
/// user for signed-in requests and the client IP for the rest.
///
/// The primary key must be one the client cannot mint: with
/// `Header::new("x-api-key")?.or(ClientIp::...)` a client skips its address's
/// bucket by sending any API key, and gets a fresh bucket per new key (see
/// [the recipes](super#recipes-who-gets-a-bucket)).
///
/// [`KeyExtractor::kind`] is fixed per extractor, so the key itself says which
/// side answered: `0:` for the primary, `1:` for the fallback. An API key equal
/// to some IP address therefore never shares that IP's bucket. The kind is
/// `primary/fallback`. Build it with [`KeyExtractorExt::or`]; chains nest
/// (`a.or(b).or(c)` answers `0:0:`, `0:1:` or `1:`).
#[derive(Clone, Debug)]
#[must_use]
pub struct Or<A, B> {
    primary: A,
    fallback: B,
}

impl<A: KeyExtractor, B: KeyExtractor> Or<A, B> {
    /// Keys requests by `primary`, or by `fallback` when `primary` has no key.
    pub fn new(primary: A, fallback: B) -> Self {
        Or { primary, fallback }
    }
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn kind(&self) -> Kind {
        Kind::combined(&self.primary.kind(), '/', &self.fallback.kind())
    }

    async fn extract(&self, parts: &Parts) -> Option<String> {
        if let Some(key) = present(self.primary.extract(parts).await) {
            return Some(format!("0:{}", safe_key(&key)));
        }
        let key = present(self.fallback.extract(parts).await)?;
        Some(format!("1:{}", safe_key(&key)))
    }
}

/// An empty key is no key: otherwise every request without one would share
/// a single bucket.
fn present(key: Option<String>) -> Option<String> {
    key.filter(|k| !k.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Global, Header, from_fn};
    use http::Request;

    fn parts(req: http::request::Builder) -> Parts {
        req.body(()).unwrap().into_parts().0
    }

    fn constant(kind: &'static str, key: &'static str) -> impl KeyExtractor {
        from_fn(kind, move |_| Some(key.to_owned()))
    }

    #[tokio::test]
    async fn and_needs_both_and_cannot_be_confused() {
        let p = parts(Request::get("/"));
        let ab = constant("a", "x:y").and(constant("b", "z"));
        let ab2 = constant("a", "x").and(constant("b", "y:z"));
        assert_eq!(ab.kind(), "custom:a+custom:b");
        assert_eq!(ab.extract(&p).await.as_deref(), Some("3:x:y:z"));
        assert_ne!(ab.extract(&p).await, ab2.extract(&p).await);
        let missing = constant("a", "x").and(Header::new("x-api-key").unwrap());
        assert_eq!(missing.extract(&p).await, None);
        let missing = Header::new("x-api-key").unwrap().and(constant("a", "x"));
        assert_eq!(missing.extract(&p).await, None);
    }

    #[tokio::test]
    async fn and_parts_are_safe_and_bounded() {
        let p = parts(Request::get("/"));
        let huge: &'static str = "{".repeat(64 * 1024).leak();
        let k = constant("a", huge)
            .and(constant("b", huge))
            .extract(&p)
            .await
            .unwrap();
        assert!(k.len() < 80 && !k.contains('{'), "{k}");
    }

    #[tokio::test]
    async fn or_takes_the_first_present_key_and_says_which() {
        let api_or_ip = Header::new("x-api-key")
            .unwrap()
            .verbatim()
            .or(constant("ip", "203.0.113.7"));
        assert_eq!(api_or_ip.kind(), "header:x-api-key/custom:ip");
        let with_key = parts(Request::get("/").header("x-api-key", "203.0.113.7"));
        let without = parts(Request::get("/"));
        let by_key = api_or_ip.extract(&with_key).await;
        let by_ip = api_or_ip.extract(&without).await;
        assert_eq!(by_key.as_deref(), Some("0:203.0.113.7"));
        assert_eq!(by_ip.as_deref(), Some("1:203.0.113.7"));
        let empty = from_fn("e", |_| Some(String::new())).or(constant("ip", "1.2.3.4"));
        assert_eq!(empty.extract(&without).await.as_deref(), Some("1:1.2.3.4"));
        let none = Header::new("a").unwrap().or(Header::new("b").unwrap());
        assert_eq!(none.extract(&without).await, None);
        let chain = Header::new("a")
            .unwrap()
            .or(Header::new("b").unwrap().verbatim())
            .or(Global);
        assert_eq!(chain.extract(&without).await.as_deref(), Some("1:global"));
        let b = parts(Request::get("/").header("b", "v"));
        assert_eq!(chain.extract(&b).await.as_deref(), Some("0:1:v"));
    }

    /// A combined key holds only bytes a raw key may hold: its parts are safe,
    /// and so are the separators and the length. Two parts together can pass
    /// [`crate::store::MAX_RAW_KEY_LEN`], so the key may be hashed when the
    /// layer makes it safe, but only for its length.
    fn only_its_length_is_unsafe(key: &str) -> bool {
        // Each piece short enough to be kept raw, behind a first byte that is.
        let pieces = key.as_bytes().chunks(crate::store::MAX_RAW_KEY_LEN - 1);
        !key.starts_with('#')
            && pieces.into_iter().all(|piece| {
                let probe = [b"0", piece].concat();
                crate::store::safe_key_bytes(&probe).as_bytes() == probe.as_slice()
            })
    }

    proptest::proptest! {
        #![proptest_config(crate::hostile_input::config())]

        #[test]
        fn combined_keys_of_64k_parts_stay_short_and_safe(
            a in crate::hostile_input::header_bytes(),
            b in crate::hostile_input::header_bytes(),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let a = String::from_utf8_lossy(&a).into_owned();
            let b = String::from_utf8_lossy(&b).into_owned();
            let (a2, b2) = (a.clone(), b.clone());
            let first = from_fn("a", move |_| Some(a2.clone()));
            let second = from_fn("b", move |_| Some(b2.clone()));
            let p = parts(Request::get("/"));
            let and = first.and(second);
            let k = crate::hostile_input::within_budget("and", || rt.block_on(and.extract(&p)));
            if let Some(k) = k {
                proptest::prop_assert!(k.len() <= 2 * crate::store::MAX_RAW_KEY_LEN + 4, "{}", k);
                proptest::prop_assert!(only_its_length_is_unsafe(&k), "{}", k);
            } else {
                proptest::prop_assert!(a.is_empty() || b.is_empty());
            }
            let (a3, b3) = (a.clone(), b.clone());
            let or = from_fn("a", move |_| Some(a3.clone())).or(from_fn("b", move |_| Some(b3.clone())));
            let k = crate::hostile_input::within_budget("or", || rt.block_on(or.extract(&p)));
            if let Some(k) = k {
                proptest::prop_assert!(k.len() <= crate::store::MAX_RAW_KEY_LEN + 2, "{}", k);
                proptest::prop_assert!(only_its_length_is_unsafe(&k), "{}", k);
            }
        }
    }
}
