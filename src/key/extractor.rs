//! [`KeyExtractor`]: what every key extractor implements, and [`Kind`], the
//! namespace of its keys.

use std::borrow::Cow;
use std::fmt;
use std::fmt::Write;
use std::future::Future;

use http::request::Parts;

/// Takes a client key from a request head. See the [module docs](crate::key).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a key extractor",
    label = "not a `KeyExtractor`",
    note = "a constructor that can refuse its configuration returns `Result<_, ConfigError>`: add `?` after it (for example `ClientIp::trusted_proxies([\"10.0.0.0/8\"])?`)",
    note = "`ClientIp::hops(n)?` is unfinished: finish it with `.only_from([\"10.0.0.0/8\"])?`, the proxies whose headers are believed"
)]
pub trait KeyExtractor: Send + Sync + 'static {
    /// The namespace of this extractor's keys (`ip`, `header:x-api-key`, or
    /// [`Kind::custom`] for your own), put in front of every key it extracts so
    /// keys of different kinds never share a bucket.
    fn kind(&self) -> Kind;

    /// The client key of this request, or `None` when it has none.
    ///
    /// The layer polls this future once, without boxing it, and uses the key
    /// at once when it is ready (as every built-in extractor's and
    /// [`from_fn`](super::from_fn)'s is). A future that is not ready at that
    /// first poll is dropped, and from then on this extractor's futures are
    /// boxed and awaited inside the request's future. The requests that find
    /// the extractor not yet known to wait (the first one, and any that
    /// arrive at the same moment) extract their key again from the start, so
    /// an extractor that does real asynchronous work should be safe to
    /// cancel at its first `.await`.
    fn extract(&self, parts: &Parts) -> impl Future<Output = Option<String>> + Send;
}

/// The namespace of a [`KeyExtractor`]'s keys: the storage key of a request is
/// `policy:kind:value`, so extractors of different kinds never share a bucket.
///
/// Kinds are unambiguous by construction, whatever names you give:
///
/// - The built-in extractors have reserved kinds: `ip`, `client-ip`, `global`,
///   `route`, `header:NAME` and `ext:NAME`. Only this crate can make them.
/// - Your own extractors (and [`from_fn`](super::from_fn)) get
///   [`Kind::custom`]: `custom:NAME`. A custom extractor named `ip` is
///   `custom:ip`, never [`PeerIp`](super::PeerIp)'s `ip`.
/// - Every name you give is escaped: bytes other than ASCII letters, digits,
///   `_`, `.` and `-` become `%XX`, so a name holding `:` (`a:b` is `a%3Ab`)
///   cannot make `policy:kind:value` read as another kind and value.
/// - Combinations are written `a+b` ([`And`](super::And)) and `a/b`
///   ([`Or`](super::Or)), with parentheses around combined parts
///   (`(a+b)/c`), so each kind names exactly one extractor shape.
///
/// No kind is a prefix of another followed by `:`, so two different kinds can
/// never produce the same storage key whatever values the client sends.
///
/// ```
/// use tollgate::key::{Global, Kind, KeyExtractor, KeyExtractorExt, PeerIp, from_fn};
///
/// assert_eq!(PeerIp::new().kind(), "ip");
/// assert_eq!(Kind::custom("tenant"), "custom:tenant");
/// assert_eq!(Kind::custom("a:b"), "custom:a%3Ab");
/// let ip_lookalike = from_fn("ip", |_| Some("203.0.113.7".to_owned()));
/// assert_ne!(ip_lookalike.kind(), PeerIp::new().kind());
/// assert_eq!(ip_lookalike.or(Global).kind(), "custom:ip/global");
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
#[must_use]
pub struct Kind {
    name: Cow<'static, str>,
    /// Built by [`And`](super::And) or [`Or`](super::Or): wrapped in parentheses
    /// when combined again.
    combined: bool,
}

impl Kind {
    /// The kind of an extractor of your own: `custom:` and `name`, escaped (see
    /// the [type docs](Kind)).
    pub fn custom(name: &str) -> Self {
        Self::tagged("custom", name)
    }

    /// The kind as text, as it appears in storage keys and messages.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// A reserved kind of a built-in extractor, without a name of its own.
    pub(crate) const fn reserved(name: &'static str) -> Self {
        Kind {
            name: Cow::Borrowed(name),
            combined: false,
        }
    }

    /// A reserved tag (`header`, `ext`) followed by an escaped name.
    pub(crate) fn tagged(tag: &'static str, name: &str) -> Self {
        let mut out = String::with_capacity(tag.len() + 1 + name.len());
        out.push_str(tag);
        out.push(':');
        escape_into(&mut out, name);
        Kind {
            name: Cow::Owned(out),
            combined: false,
        }
    }

    /// `first` and `second` joined by `op` (`+` or `/`).
    pub(crate) fn combined(first: &Kind, op: char, second: &Kind) -> Self {
        let mut out = String::new();
        first.write_part(&mut out);
        out.push(op);
        second.write_part(&mut out);
        Kind {
            name: Cow::Owned(out),
            combined: true,
        }
    }

    fn write_part(&self, out: &mut String) {
        if self.combined {
            out.push('(');
            out.push_str(&self.name);
            out.push(')');
        } else {
            out.push_str(&self.name);
        }
    }
}

/// Appends `name` with every byte outside `[A-Za-z0-9_.-]` written `%XX`.
fn escape_into(out: &mut String, name: &str) {
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
            out.push(char::from(b));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl fmt::Debug for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kind({:?})", self.name)
    }
}

impl AsRef<str> for Kind {
    fn as_ref(&self) -> &str {
        &self.name
    }
}

impl PartialEq<str> for Kind {
    fn eq(&self, other: &str) -> bool {
        self.name == other
    }
}

impl PartialEq<&str> for Kind {
    fn eq(&self, other: &&str) -> bool {
        self.name == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_names_are_escaped_and_tagged() {
        assert_eq!(Kind::custom("tenant"), "custom:tenant");
        assert_eq!(Kind::custom("a:b"), "custom:a%3Ab");
        assert_eq!(Kind::custom("100%"), "custom:100%25");
        assert_eq!(Kind::custom("é+/()"), "custom:%C3%A9%2B%2F%28%29");
        assert_eq!(Kind::custom(""), "custom:");
        assert_ne!(Kind::custom("ip"), Kind::reserved("ip"));
    }

    #[test]
    fn combinations_are_bracketed() {
        let a = Kind::reserved("ip");
        let b = Kind::tagged("header", "x-api-key");
        let ab = Kind::combined(&a, '+', &b);
        assert_eq!(ab, "ip+header:x-api-key");
        let left = Kind::combined(&ab, '/', &a);
        let right = Kind::combined(&a, '+', &Kind::combined(&b, '/', &a));
        assert_eq!(left, "(ip+header:x-api-key)/ip");
        assert_eq!(right, "ip+(header:x-api-key/ip)");
    }

    /// Kinds of every shape, from names that try to look like other kinds.
    fn kinds() -> Vec<Kind> {
        let mut atoms = vec![
            Kind::reserved("ip"),
            Kind::reserved("client-ip"),
            Kind::reserved("global"),
            Kind::reserved("route"),
        ];
        for name in ["ip", "a", "a:b", "b", "a%3Ab", "header", "x+y", "(ip)", ""] {
            atoms.push(Kind::custom(name));
            atoms.push(Kind::tagged("ext", name));
            atoms.push(Kind::tagged("header", name));
        }
        let mut all = atoms.clone();
        for a in atoms.iter().take(8) {
            for b in atoms.iter().take(8) {
                for op in ['+', '/'] {
                    let ab = Kind::combined(a, op, b);
                    all.push(Kind::combined(&ab, op, a));
                    all.push(Kind::combined(a, op, &ab));
                    all.push(ab);
                }
            }
        }
        all
    }

    #[test]
    fn no_kind_is_another_followed_by_a_separator() {
        // `policy:kind:value` is unambiguous when no kind, followed by `:`, is a
        // prefix of a different kind: the value then cannot be read as part of
        // the kind.
        let all = kinds();
        for a in &all {
            let with_colon = format!("{a}:");
            for b in &all {
                if a != b {
                    assert!(!b.as_str().starts_with(&with_colon), "{a} / {b}");
                    assert_ne!(a.as_str(), b.as_str());
                }
            }
        }
    }
}
