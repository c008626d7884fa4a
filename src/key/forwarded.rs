//! Reading the proxy chain from `X-Forwarded-For`, `Forwarded` (RFC 7239) or a
//! single-address header, without trusting any of it: this module only parses;
//! [`ClientIp`](super::ClientIp) decides which hop to believe.
//!
//! Header values are hostile. Parsing never panics, never allocates per entry, and
//! reads at most [`MAX_HOPS`] entries from the right (the only end a trusted
//! proxy can have written), however long the header or however many header
//! lines there are.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::{HeaderMap, HeaderName};

use super::ip::canonical;

/// At most this many proxy hops, counted from the right, are read from a forwarding
/// header; entries further left are ignored. Real chains are a handful of proxies,
/// and the cap bounds the work a forged header can cause.
pub const MAX_HOPS: usize = 64;

/// Longest entry parsed as an address (a bracketed IPv6 address with a zone and a
/// port fits easily); longer entries are unparsable without looking further.
const MAX_NODE_LEN: usize = 128;

/// One entry of a forwarding header, as the proxy that wrote it reported its client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hop {
    /// A parsed, canonical address.
    Ip(IpAddr),
    /// `unknown`, an obfuscated `_name`, an element without `for=`, or anything
    /// unparsable: the proxy did not say who its client was.
    Opaque,
}

/// Which list header the chain is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ListHeader {
    XForwardedFor,
    Forwarded,
}

/// The rightmost [`MAX_HOPS`] entries of `header` over all its header lines,
/// **rightmost first**. Empty list elements are not entries (RFC 9110 section
/// 5.6.1).
///
/// Lines and elements are split from the right: the right end was written by
/// trusted proxies and is well formed, the left end by the client. Split from
/// the left, a client's unbalanced quote would swallow the commas a proxy
/// appended after it (`for=1.1.1.1;x="` followed by the proxy's
/// `, for="[2001:db8::17]"` would read as one element claiming `1.1.1.1`).
/// From the right, client bytes are reached only after every trusted element
/// has been read, and the scan stops after [`MAX_HOPS`] elements.
pub(crate) fn hops_from_right(headers: &HeaderMap, header: &ListHeader) -> Vec<Hop> {
    let (name, quoted) = match header {
        ListHeader::XForwardedFor => (HeaderName::from_static("x-forwarded-for"), false),
        ListHeader::Forwarded => (http::header::FORWARDED, true),
    };
    headers
        .get_all(name)
        .iter()
        .rev()
        .flat_map(|line| rsplit_list(line.as_bytes(), quoted))
        .take(MAX_HOPS)
        .map(|element| match header {
            ListHeader::XForwardedFor => parse_node(element),
            ListHeader::Forwarded => parse_forwarded_element(element),
        })
        .collect()
}

/// The rightmost address of a header a proxy sets to one address (`X-Real-IP`,
/// `CF-Connecting-IP`): if the proxy appended a line or a list element instead of
/// replacing the header, the rightmost one is the proxy's. `None` when the header
/// is absent.
pub(crate) fn single(headers: &HeaderMap, name: &HeaderName) -> Option<Hop> {
    let line = headers.get_all(name).iter().next_back()?;
    let element = rsplit_list(line.as_bytes(), false).next();
    Some(element.map_or(Hop::Opaque, parse_node))
}

/// Splits a comma-separated header list into trimmed, non-empty elements, from
/// right to left. With `quoted`, commas inside quoted strings (RFC 9110 section
/// 5.6.4) do not split.
fn rsplit_list(value: &[u8], quoted: bool) -> impl Iterator<Item = &[u8]> {
    let mut rest = value;
    std::iter::from_fn(move || {
        while !rest.is_empty() {
            let (head, element) = match last_separator(rest, quoted) {
                Some(comma) => (
                    rest.get(..comma).unwrap_or_default(),
                    rest.get(comma + 1..).unwrap_or_default(),
                ),
                None => (&[][..], rest),
            };
            rest = head;
            let element = trim_ows(element);
            if !element.is_empty() {
                return Some(element);
            }
        }
        None
    })
}

/// Index of the last comma outside a quoted string, scanning from the right.
fn last_separator(value: &[u8], quoted: bool) -> Option<usize> {
    let mut in_quotes = false;
    for (i, b) in value.iter().enumerate().rev() {
        match b {
            b'"' if quoted && !is_escaped(value, i) => in_quotes = !in_quotes,
            b',' if !in_quotes => return Some(i),
            _ => {}
        }
    }
    None
}

/// Whether the byte at `i` is escaped: preceded by an odd number of backslashes.
/// Each run of backslashes is counted by at most the one quote after it, so a
/// scan stays linear.
fn is_escaped(value: &[u8], i: usize) -> bool {
    let before = value.get(..i).unwrap_or_default();
    before.iter().rev().take_while(|b| **b == b'\\').count() % 2 == 1
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// One `Forwarded` element (`for=192.0.2.43;proto=https;by=...`): its `for` node.
/// Parameter names are case-insensitive. An element without `for`, or with more
/// than one (RFC 7239 section 4 forbids repeats), says nothing reliable.
fn parse_forwarded_element(element: &[u8]) -> Hop {
    let mut node = None;
    for pair in split_pairs(element) {
        let Some(eq) = pair.iter().position(|b| *b == b'=') else {
            continue;
        };
        let (name, value) = pair.split_at(eq);
        if !trim_ows(name).eq_ignore_ascii_case(b"for") {
            continue;
        }
        if node.is_some() {
            return Hop::Opaque;
        }
        node = Some(value.get(1..).unwrap_or_default());
    }
    match node.and_then(unquote) {
        Some(node) if node.eq_ignore_ascii_case(b"unknown") || node.starts_with(b"_") => {
            Hop::Opaque
        }
        Some(node) => parse_node(node),
        None => Hop::Opaque,
    }
}

/// Splits an element at `;` outside quoted strings.
fn split_pairs(element: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(element);
    std::iter::from_fn(move || {
        let current = rest?;
        let mut in_quotes = false;
        let mut escaped = false;
        for (i, b) in current.iter().enumerate() {
            match b {
                _ if escaped => escaped = false,
                b'\\' if in_quotes => escaped = true,
                b'"' => in_quotes = !in_quotes,
                b';' if !in_quotes => {
                    rest = current.get(i + 1..);
                    return current.get(..i);
                }
                _ => {}
            }
        }
        rest = None;
        Some(current)
    })
}

/// A token, or a quoted string without escapes (no valid node needs one, so a
/// backslash marks the value as unparsable rather than something to decode).
fn unquote(value: &[u8]) -> Option<&[u8]> {
    let value = trim_ows(value);
    match value {
        [b'"', inner @ .., b'"'] if !inner.contains(&b'\\') && !inner.contains(&b'"') => {
            Some(inner)
        }
        [b'"', ..] => None,
        _ => Some(value),
    }
}

/// An address as proxies write it: `192.0.2.43`, `192.0.2.43:4711`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:4711`, optionally with an IPv6 zone id
/// (`fe80::1%eth0`), which is dropped. Anything else is [`Hop::Opaque`].
pub(crate) fn parse_node(node: &[u8]) -> Hop {
    if node.len() > MAX_NODE_LEN {
        return Hop::Opaque;
    }
    let Ok(node) = std::str::from_utf8(node) else {
        return Hop::Opaque;
    };
    parse_node_str(node).map_or(Hop::Opaque, |ip| Hop::Ip(canonical(ip)))
}

fn parse_node_str(node: &str) -> Option<IpAddr> {
    if let Some(bracketed) = node.strip_prefix('[') {
        let (v6, after) = bracketed.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        return parse_v6(v6).map(IpAddr::V6);
    }
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some((v4, port)) = node.split_once(':')
        && is_port(port)
        && let Ok(v4) = v4.parse::<Ipv4Addr>()
    {
        return Some(IpAddr::V4(v4));
    }
    parse_v6(node).map(IpAddr::V6)
}

/// IPv6 with an optional `%zone`: the zone names an interface of the sender, not
/// a client, so it is dropped.
fn parse_v6(s: &str) -> Option<Ipv6Addr> {
    let addr = s.split_once('%').map_or(s, |(addr, _zone)| addr);
    addr.parse().ok()
}

/// RFC 7239 ports are up to five digits, or an obfuscated `_port`.
fn is_port(s: &str) -> bool {
    let digits = (1..=5).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
    digits || s.starts_with('_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> Hop {
        Hop::Ip(s.parse().unwrap())
    }

    fn map(name: &str, lines: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for line in lines {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(line).unwrap(),
            );
        }
        h
    }

    #[test]
    fn nodes_in_every_written_form() {
        assert_eq!(parse_node(b"192.0.2.43"), ip("192.0.2.43"));
        assert_eq!(parse_node(b"192.0.2.43:4711"), ip("192.0.2.43"));
        assert_eq!(parse_node(b"2001:db8::1"), ip("2001:db8::1"));
        assert_eq!(parse_node(b"[2001:db8::1]"), ip("2001:db8::1"));
        assert_eq!(parse_node(b"[2001:db8::1]:4711"), ip("2001:db8::1"));
        assert_eq!(parse_node(b"[2001:db8::1]:_p"), ip("2001:db8::1"));
        assert_eq!(parse_node(b"fe80::1%eth0"), ip("fe80::1"));
        assert_eq!(parse_node(b"[fe80::1%25eth0]:80"), ip("fe80::1"));
        assert_eq!(parse_node(b"::ffff:192.0.2.1"), ip("192.0.2.1"));
        for bad in [
            &b"unknown"[..],
            b"_hidden",
            b"192.0.2.43:",
            b"192.0.2.43:123456",
            b"[2001:db8::1",
            b"[2001:db8::1]x",
            b"[192.0.2.1]",
            b"1.2.3.4.5",
            b"\xff\xfe",
            b"",
        ] {
            assert_eq!(parse_node(bad), Hop::Opaque, "{bad:?}");
        }
        let long = format!("1.2.3.4{}", " ".repeat(200));
        assert_eq!(parse_node(long.as_bytes()), Hop::Opaque);
    }

    #[test]
    fn xff_lines_are_read_in_order() {
        let h = map(
            "x-forwarded-for",
            &[b"198.51.100.1, 10.0.0.1", b" , 10.0.0.2,,", b"bogus"],
        );
        assert_eq!(
            hops_from_right(&h, &ListHeader::XForwardedFor),
            [
                Hop::Opaque,
                ip("10.0.0.2"),
                ip("10.0.0.1"),
                ip("198.51.100.1"),
            ]
        );
    }

    #[test]
    fn forwarded_elements_and_parameters() {
        let h = map(
            "forwarded",
            &[
                b"for=192.0.2.43, For=\"[2001:db8:cafe::17]:4711\";proto=https",
                b"by=10.0.0.1;FOR=unknown, for=_hidden;by=x, proto=http",
                b"for=\"192.0.2.60:_obf\";by=\"a,b;c\" , for=1.1.1.1;for=2.2.2.2",
                b"for=\"unterminated, for=3.3.3.3",
                b"for=\"quo\\\"te\", for=\"10.9.9.9\"",
            ],
        );
        let mut hops = hops_from_right(&h, &ListHeader::Forwarded);
        hops.reverse();
        assert_eq!(
            hops,
            [
                ip("192.0.2.43"),
                ip("2001:db8:cafe::17"),
                Hop::Opaque, // unknown
                Hop::Opaque, // obfuscated
                Hop::Opaque, // no for=
                ip("192.0.2.60"),
                Hop::Opaque, // repeated for=
                Hop::Opaque, // the unbalanced quote and what precedes it
                ip("3.3.3.3"),
                Hop::Opaque, // escapes are not valid in a node
                ip("10.9.9.9"),
            ]
        );
    }

    #[test]
    fn client_quotes_cannot_swallow_proxy_elements() {
        // The proxy appended its element to the client's line; the client left a
        // quote open (or an escaped one) hoping to hide it and surface its own `for`.
        for line in [
            &b"for=1.1.1.1;x=\", for=\"[2001:db8::17]:4711\""[..],
            b"for=1.1.1.1;x=\"\\\", for=\"[2001:db8::17]:4711\"",
            b"for=\"1.1.1.1, for=\"[2001:db8::17]:4711\"",
            b"for=1.1.1.1, for=\", for=\"[2001:db8::17]:4711\"",
        ] {
            let h = map("forwarded", &[line]);
            let hops = hops_from_right(&h, &ListHeader::Forwarded);
            assert_eq!(hops.first(), Some(&ip("2001:db8::17")), "{line:?}");
        }
        let h = map("forwarded", &[b"for=\"1.1.1.1\\\", for=2.2.2.2"]);
        let hops = hops_from_right(&h, &ListHeader::Forwarded);
        assert_eq!(hops.first(), Some(&ip("2.2.2.2")));
    }

    #[test]
    fn only_the_rightmost_hops_are_kept() {
        let many: Vec<String> = (0..200)
            .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
            .collect();
        let h = map("x-forwarded-for", &[many.join(",").as_bytes()]);
        let hops = hops_from_right(&h, &ListHeader::XForwardedFor);
        assert_eq!(hops.len(), MAX_HOPS);
        assert_eq!(hops.first(), Some(&ip("10.0.0.199")));
        assert_eq!(hops.last(), Some(&ip("10.0.0.136")));
    }

    #[test]
    fn hostile_values_stay_bounded() {
        let commas = ",".repeat(64 * 1024);
        let junk = vec![b'\xfe'; 64 * 1024];
        let quotes = "\"".repeat(64 * 1024);
        let mut lines: Vec<&[u8]> = vec![commas.as_bytes(), &junk, quotes.as_bytes()];
        let flood = "1.2.3.4,".repeat(8 * 1024);
        lines.push(flood.as_bytes());
        for name in ["x-forwarded-for", "forwarded"] {
            let h = map(name, &lines);
            for header in [ListHeader::XForwardedFor, ListHeader::Forwarded] {
                assert!(hops_from_right(&h, &header).len() <= MAX_HOPS);
            }
        }
        let many_lines: Vec<&[u8]> = vec![b"10.0.0.1"; 5000];
        let h = map("x-forwarded-for", &many_lines);
        assert_eq!(
            hops_from_right(&h, &ListHeader::XForwardedFor).len(),
            MAX_HOPS
        );
    }

    #[test]
    fn single_takes_the_rightmost_value() {
        let name = HeaderName::from_static("x-real-ip");
        assert_eq!(single(&HeaderMap::new(), &name), None);
        let h = map("x-real-ip", &[b"203.0.113.9"]);
        assert_eq!(single(&h, &name), Some(ip("203.0.113.9")));
        let h = map("x-real-ip", &[b"1.1.1.1", b"6.6.6.6, 203.0.113.9"]);
        assert_eq!(single(&h, &name), Some(ip("203.0.113.9")));
        let h = map("x-real-ip", &[b""]);
        assert_eq!(single(&h, &name), Some(Hop::Opaque));
    }

    mod hostile_input {
        use super::*;
        use crate::hostile_input::{config, header_bytes, within_budget};
        use proptest::prelude::*;

        fn lines(values: &[Vec<u8>], name: &str) -> HeaderMap {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    HeaderValue::from_bytes(v).unwrap(),
                );
            }
            h
        }

        proptest! {
            #![proptest_config(config())]

            #[test]
            fn list_headers_of_64k_are_parsed_within_bounds(
                values in proptest::collection::vec(header_bytes(), 1..3),
            ) {
                for (name, header) in [
                    ("x-forwarded-for", ListHeader::XForwardedFor),
                    ("forwarded", ListHeader::Forwarded),
                ] {
                    let h = lines(&values, name);
                    let hops = within_budget(name, || hops_from_right(&h, &header));
                    prop_assert!(hops.len() <= MAX_HOPS);
                    let single = within_budget(name, || single(&h, &HeaderName::from_static("x-forwarded-for")));
                    if name == "x-forwarded-for" {
                        prop_assert!(single.is_some());
                    }
                }
            }

            #[test]
            fn nodes_of_64k_are_opaque_or_addresses(value in header_bytes()) {
                let hop = within_budget("parse_node", || parse_node(&value));
                if let Hop::Ip(ip) = hop {
                    // Only short, well-formed nodes parse; the address is canonical.
                    prop_assert!(value.len() <= MAX_NODE_LEN);
                    prop_assert_eq!(ip, canonical(ip));
                }
            }
        }
    }
}
