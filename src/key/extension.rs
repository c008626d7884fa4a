//! [`FromExtension`]: a key from a value an earlier layer put in the request
//! extensions, such as the authenticated user or tenant.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use http::request::Parts;

use super::extractor::{KeyExtractor, Kind};
use crate::store::safe_key;

/// Keys requests by a value of type `T` in the request extensions, put there by an
/// authentication layer that runs before the rate limit (a user id, a tenant, an
/// API client).
///
/// [`FromExtension::new`] turns the value into a key with a closure, which may answer
/// a `String` or an `Option<String>` (`None` for, say, anonymous users);
/// [`FromExtension::display`] uses the value's [`Display`](fmt::Display). A request
/// without the extension, or whose value gives an empty key, has no key. Keys are
/// made safe with [`safe_key`]: short, plain values stay readable, anything else
/// is hashed.
///
/// The kind is `ext:` and the name you give (escaped as [`Kind`] says), rather
/// than the Rust type name,
/// which is not stable across compiler versions and would silently move every
/// client to a new bucket.
///
/// ```
/// use http::Request;
/// use tollgate::key::{FromExtension, KeyExtractor};
///
/// #[derive(Clone)]
/// struct User { id: u64, plan: &'static str }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let by_user = FromExtension::new("user", |user: &User| user.id.to_string());
/// let by_plan = FromExtension::new("plan", |user: &User| {
///     (user.plan != "free").then(|| user.plan.to_owned())
/// });
///
/// let (mut parts, ()) = Request::get("/").body(()).unwrap().into_parts();
/// assert_eq!(by_user.extract(&parts).await, None);
/// parts.extensions.insert(User { id: 42, plan: "pro" });
/// assert_eq!(by_user.extract(&parts).await.as_deref(), Some("42"));
/// assert_eq!(by_user.kind(), "ext:user");
/// assert_eq!(by_plan.extract(&parts).await.as_deref(), Some("pro"));
/// # }
/// ```
#[must_use]
pub struct FromExtension<T, F = fn(&T) -> String> {
    kind: Kind,
    f: F,
    // fn() -> T: the extractor holds no T, so it is Send and Sync whatever T is.
    _value: PhantomData<fn() -> T>,
}

impl<T, F: Clone> Clone for FromExtension<T, F> {
    fn clone(&self) -> Self {
        FromExtension {
            kind: self.kind.clone(),
            f: self.f.clone(),
            _value: PhantomData,
        }
    }
}

impl<T, F> fmt::Debug for FromExtension<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromExtension")
            .field("kind", &self.kind)
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T, F, R> FromExtension<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> R + Send + Sync + 'static,
    R: Into<Option<String>>,
{
    /// Keys requests by `f` applied to the `T` in the request extensions. `name`
    /// becomes the kind (`ext:name`).
    pub fn new(name: impl Into<Cow<'static, str>>, f: F) -> Self {
        FromExtension {
            kind: Kind::tagged("ext", &name.into()),
            f,
            _value: PhantomData,
        }
    }
}

impl<T> FromExtension<T, fn(&T) -> String>
where
    T: fmt::Display + Send + Sync + 'static,
{
    /// Keys requests by the [`Display`](fmt::Display) form of the `T` in the
    /// request extensions: `FromExtension::<TenantId>::display("tenant")`.
    pub fn display(name: impl Into<Cow<'static, str>>) -> Self {
        let to_string: fn(&T) -> String = |value| value.to_string();
        FromExtension::new(name, to_string)
    }
}

impl<T, F, R> KeyExtractor for FromExtension<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> R + Send + Sync + 'static,
    R: Into<Option<String>>,
{
    fn kind(&self) -> Kind {
        self.kind.clone()
    }

    async fn extract(&self, parts: &Parts) -> Option<String> {
        let value = parts.extensions.get::<T>()?;
        let key = (self.f)(value).into()?;
        (!key.is_empty()).then(|| safe_key(&key).into_owned())
    }
}

/// The old name of [`FromExtension`] (it clashed with `axum::Extension`).
#[deprecated(since = "0.1.0", note = "renamed `FromExtension`")]
pub type Extension<T, F = fn(&T) -> String> = FromExtension<T, F>;

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    #[derive(Clone)]
    struct Tenant(String);

    impl fmt::Display for Tenant {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.0)
        }
    }

    fn with(tenant: &str) -> Parts {
        let (mut parts, ()) = Request::get("/").body(()).unwrap().into_parts();
        parts.extensions.insert(Tenant(tenant.to_owned()));
        parts
    }

    #[tokio::test]
    async fn display_values_become_safe_keys() {
        let e = FromExtension::<Tenant>::display("tenant");
        assert_eq!(e.kind(), "ext:tenant");
        assert_eq!(e.extract(&with("acme-7")).await.as_deref(), Some("acme-7"));
        let hostile = e.extract(&with("a{b} c")).await.unwrap();
        assert!(hostile.starts_with('#') && hostile.len() == 33);
        let long = e.extract(&with(&"x".repeat(64 * 1024))).await.unwrap();
        assert_eq!(long.len(), 33);
        assert_eq!(e.extract(&with("")).await, None);
        let (parts, ()) = Request::get("/").body(()).unwrap().into_parts();
        assert_eq!(e.extract(&parts).await, None);
    }

    #[tokio::test]
    async fn closures_may_decline() {
        let e = FromExtension::new("paid", |t: &Tenant| (t.0 != "free").then(|| t.0.clone()));
        assert_eq!(e.extract(&with("free")).await, None);
        assert_eq!(e.extract(&with("gold")).await.as_deref(), Some("gold"));
        let debug = format!("{e:?}");
        assert!(
            debug.contains("ext:paid") && debug.contains("Tenant"),
            "{debug}"
        );
    }

    proptest::proptest! {
        #![proptest_config(crate::hostile_input::config())]

        #[test]
        fn values_of_64k_give_short_safe_keys(value in crate::hostile_input::header_bytes()) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let tenant = String::from_utf8_lossy(&value).into_owned();
            let e = FromExtension::<Tenant>::display("tenant");
            let p = with(&tenant);
            let k = crate::hostile_input::within_budget("extension", || rt.block_on(e.extract(&p)));
            match k {
                None => proptest::prop_assert!(tenant.is_empty()),
                Some(k) => {
                    proptest::prop_assert!(k.len() <= crate::store::MAX_RAW_KEY_LEN);
                    proptest::prop_assert_eq!(crate::store::safe_key(&k).len(), k.len());
                }
            }
        }
    }
}
