//! How a client key becomes a storage key. Request data is hostile: a key never
//! reaches Redis raw.
//!
//! A key made only of `[A-Za-z0-9._:@/=+#-]`, not starting with `#`, and at most
//! [`MAX_RAW_KEY_LEN`] bytes is kept as it is, so keys stay readable in
//! `redis-cli`. Anything else (long, binary, braces that would move the
//! `{hash tag}`, spaces) becomes `#` and the first 128 bits of its SHA-256 in hex.
//! Only hashed keys start with `#`, so a hashed key never equals a raw one, and a
//! hashed part can be embedded in a longer raw key (`policy:header:#1f...`). A
//! value that already starts with `#` is hashed again when made safe on its own
//! (the layer does this to every extracted value): deterministic and bounded,
//! and it stops a client-written `#...` from posing as a hashed key.

use sha2::{Digest, Sha256};
use std::borrow::Cow;

/// Longest client key kept verbatim; longer ones are hashed.
pub const MAX_RAW_KEY_LEN: usize = 96;

/// The storage-safe form of a client key: bounded length, no braces, no bytes that
/// need escaping.
pub fn safe_key(key: &str) -> Cow<'_, str> {
    if is_safe(key.as_bytes()) {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(hashed(key.as_bytes()))
    }
}

/// [`safe_key`] for a value that may not be UTF-8 (a raw header).
pub fn safe_key_bytes(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(s) if is_safe(key) => s.to_owned(),
        _ => hashed(key),
    }
}

/// Whether `key` is its own storage-safe form ([`safe_key`] keeps it as it is).
#[inline]
pub(crate) fn is_safe(key: &[u8]) -> bool {
    key.first().is_some_and(|b| *b != b'#') && key.len() <= MAX_RAW_KEY_LEN && is_safe_tail(key)
}

/// Whether every byte of `bytes` may be in a safe key (anywhere but first,
/// for `#`): a safe key followed by such bytes is safe, up to
/// [`MAX_RAW_KEY_LEN`] bytes.
pub(crate) fn is_safe_tail(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .all(|b| SAFE.get(usize::from(*b)) == Some(&true))
}

/// The bytes a raw key may hold, `[A-Za-z0-9._:@/=+#-]`, as a table: every
/// request's key is checked byte by byte, at least once.
static SAFE: [bool; 256] = safe_table();

#[expect(clippy::indexing_slicing, reason = "b < 256, the table's length")]
const fn safe_table() -> [bool; 256] {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        #[expect(clippy::cast_possible_truncation, reason = "b < 256")]
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'.' | b'_' | b':' | b'@' | b'/' | b'=' | b'+' | b'#' | b'-'
            );
        b += 1;
    }
    table
}

/// The hashed form of any key, `#` and 128 bits of SHA-256 in hex, whether or not
/// it would be safe raw: for values that should not be readable in the store,
/// such as credentials.
pub fn hashed_key(key: &[u8]) -> String {
    hashed(key)
}

fn hashed(key: &[u8]) -> String {
    let digest = Sha256::digest(key);
    // Hex digit by digit, not `write!`: the formatting machinery cost more than the
    // hash itself (`cargo bench --bench layer`, hashed against verbatim).
    let mut out = String::with_capacity(33);
    out.push('#');
    for byte in digest.iter().take(16) {
        // Both halves are below 16, so from_digit always has a digit.
        out.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(byte & 0x0f), 16).unwrap_or('0'));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_keys_are_the_first_128_bits_of_sha256_in_hex() {
        // SHA-256("abc") = ba7816bf8f01cfea414140de5dae2223b00361a3...: stored
        // keys must not change between versions.
        assert_eq!(hashed_key(b"abc"), "#ba7816bf8f01cfea414140de5dae2223");
        assert_eq!(safe_key("a b"), hashed_key(b"a b"));
    }

    #[test]
    fn the_mask_holds_exactly_the_allowed_bytes() {
        for b in 0..=255u8 {
            let allowed = b.is_ascii_alphanumeric() || b"._:@/=+#-".contains(&b);
            assert_eq!(is_safe(&[b'a', b]), allowed, "byte {b}");
        }
    }

    #[test]
    fn safe_keys_stay_readable() {
        assert_eq!(safe_key("user:42"), "user:42");
        assert_eq!(safe_key("ip:2001:db8::/64"), "ip:2001:db8::/64");
    }

    #[test]
    fn hostile_keys_are_hashed_and_bounded() {
        for k in [
            "a{b}c",
            "",
            "has space",
            "#123",
            "é",
            &"x".repeat(MAX_RAW_KEY_LEN + 1),
        ] {
            let s = safe_key(k);
            assert!(s.starts_with('#') && s.len() == 33, "{k:?} -> {s}");
            assert!(!s.contains('{') && !s.contains('}'));
        }
        assert_ne!(safe_key("a{b"), safe_key("a{c"));
        assert_eq!(safe_key_bytes(b"\xff\xfe{"), safe_key_bytes(b"\xff\xfe{"));
        assert_eq!(safe_key_bytes(b"user:1"), "user:1");
    }

    #[test]
    fn hashed_parts_embed_in_raw_keys() {
        let part = safe_key("a}{b").into_owned();
        let composed = format!("policy:header:{part}");
        assert_eq!(safe_key(&composed), composed.as_str());
        // A raw key that looks like a hash is hashed itself, so it cannot pose as one.
        assert_ne!(safe_key(&part), part.as_str());
    }

    proptest::proptest! {
        #![proptest_config(crate::hostile_input::config())]

        #[test]
        fn keys_of_64k_are_made_short_and_safe(value in crate::hostile_input::header_bytes()) {
            let from_bytes = crate::hostile_input::within_budget("safe_key_bytes", || safe_key_bytes(&value));
            let text = String::from_utf8_lossy(&value);
            let from_text = crate::hostile_input::within_budget("safe_key", || safe_key(&text).into_owned());
            for key in [&from_bytes, &from_text] {
                proptest::prop_assert!(key.len() <= MAX_RAW_KEY_LEN);
                let braces = key.contains('{') || key.contains('}');
                proptest::prop_assert!(!braces, "braces in {}", key);
                proptest::prop_assert!(key.bytes().all(|b| b.is_ascii_graphic()));
            }
            proptest::prop_assert_eq!(hashed_key(&value).len(), 33);
        }
    }
}
