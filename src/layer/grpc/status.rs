//! The bottom of the gRPC answers: which kind of gRPC call a request is, the
//! status codes the layer uses, and the trailers-only response they go in.

use std::fmt::Write;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::request::Parts;
use http::{HeaderName, HeaderValue, Method, Response};

/// `grpc-retry-pushback-ms`: the metadata through which a server tells gRPC
/// clients with a retry policy how long to wait before retrying (gRFC A6,
/// "Pushback"). The value is ASCII integer milliseconds; a negative value tells
/// the client not to retry at all.
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// Which kind of gRPC call a request is, so the answer carries a `content-type`
/// its client accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Grpc {
    /// `application/grpc...`
    Native,
    /// `application/grpc-web` and `application/grpc-web+proto`.
    Web,
    /// `application/grpc-web-text...`: base64 bodies, but the answer has none.
    WebText,
}

impl Grpc {
    fn content_type(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Grpc::Native => "application/grpc",
            Grpc::Web => "application/grpc-web",
            Grpc::WebText => "application/grpc-web-text",
        })
    }
}

/// The gRPC kind of a request, or `None` for every other HTTP request.
///
/// A gRPC call is a `POST` whose media type is a gRPC one: `application/grpc`,
/// `application/grpc-web` or `application/grpc-web-text`, each with an optional
/// `+suffix` (`+proto`) and parameters. Anything else, such as a
/// `GET /popular` carrying `Content-Type: application/grpc`, is an ordinary
/// HTTP request and gets an HTTP answer: a gRPC answer is an HTTP 200, which a
/// cache in front of the service would store and serve to everyone.
///
/// The HTTP version is not asked for. gRPC-Web runs over HTTP/1.1 by design,
/// and native gRPC reaches a service over HTTP/1.1 too, after a translator:
/// tonic-web turns a gRPC-Web call into `application/grpc` without changing
/// its version, so a limit inside it would otherwise answer a browser's call
/// with a bare 429. A `POST` answer is not stored by caches unless it says so,
/// and every answer of the layer says `no-store`.
pub(crate) fn flavor(parts: &Parts) -> Option<Grpc> {
    if parts.method != Method::POST {
        return None;
    }
    media_type(parts.headers.get(CONTENT_TYPE)?.as_bytes())
}

/// The gRPC kind a `content-type` value names: the type before any `;`
/// parameters and `+suffix`, compared without regard to case (RFC 9110 section
/// 8.3.1). `application/grpcx` or `application/grpc-webby` are not gRPC.
pub(crate) fn media_type(value: &[u8]) -> Option<Grpc> {
    let essence = value
        .split(|b| *b == b';')
        .next()
        .unwrap_or_default()
        .split(|b| *b == b'+')
        .next()
        .unwrap_or_default();
    let essence = trim_ows(essence);
    let is = |name: &[u8]| essence.eq_ignore_ascii_case(name);
    if is(b"application/grpc") {
        Some(Grpc::Native)
    } else if is(b"application/grpc-web") {
        Some(Grpc::Web)
    } else if is(b"application/grpc-web-text") {
        Some(Grpc::WebText)
    } else {
        None
    }
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

/// The gRPC status codes the layer answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    InvalidArgument = 3,
    ResourceExhausted = 8,
    Unavailable = 14,
}

/// What `grpc-retry-pushback-ms` says.
pub(crate) enum Pushback {
    /// Retry after this many milliseconds.
    After(u64),
    /// Do not retry: no wait would help (gRFC A6: a negative pushback).
    Never,
}

/// HTTP 200 with the status in the only header block and an empty body, which
/// ends the stream: a gRPC "trailers-only" response. It carries
/// `Cache-Control: no-store`, as every answer of the layer does: it is a 200,
/// and no cache between client and service may keep it.
pub(crate) fn trailers_only(
    grpc: Grpc,
    code: Code,
    message: &str,
    pushback: Option<Pushback>,
) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, grpc.content_type());
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(GRPC_STATUS, HeaderValue::from(code as u16));
    if let Ok(message) = HeaderValue::try_from(percent_encode(message)) {
        headers.insert(GRPC_MESSAGE, message);
    }
    match pushback {
        Some(Pushback::After(ms)) => {
            headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
        }
        Some(Pushback::Never) => {
            headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
        }
        None => {}
    }
    res
}

/// `grpc-message` is percent-encoded UTF-8: every byte outside printable ASCII,
/// and `%` itself, becomes `%XX` (gRPC over HTTP/2, "Status-Message"). The
/// messages are the layer's own, but a key kind (from `from_fn`) may hold anything.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Version};

    fn parts(method: Method, version: Version, content_type: &[u8]) -> Parts {
        let req = Request::builder()
            .method(method)
            .version(version)
            .header(CONTENT_TYPE, content_type);
        req.body(()).unwrap().into_parts().0
    }

    fn h2_post(content_type: &str) -> Option<Grpc> {
        flavor(&parts(
            Method::POST,
            Version::HTTP_2,
            content_type.as_bytes(),
        ))
    }

    #[test]
    fn grpc_calls_are_told_by_their_content_type() {
        assert_eq!(h2_post("application/grpc"), Some(Grpc::Native));
        assert_eq!(h2_post("application/grpc+proto"), Some(Grpc::Native));
        assert_eq!(h2_post("Application/GRPC"), Some(Grpc::Native));
        assert_eq!(
            h2_post("application/grpc; charset=utf-8"),
            Some(Grpc::Native)
        );
        assert_eq!(h2_post("application/grpc-web+proto"), Some(Grpc::Web));
        assert_eq!(h2_post("application/grpc-web-text"), Some(Grpc::WebText));
        assert_eq!(
            h2_post("application/grpc-web-text+proto"),
            Some(Grpc::WebText)
        );
        for other in [
            "application/json",
            "application/grp",
            "application/grpcx",
            "application/grpc-webby",
            "text/application/grpc",
            "",
        ] {
            assert_eq!(h2_post(other), None, "{other:?}");
        }
        let (none, ()) = Request::post("/")
            .version(Version::HTTP_2)
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(flavor(&none), None);
    }

    #[test]
    fn only_posts_are_grpc_calls_whatever_the_version() {
        for method in [Method::GET, Method::HEAD, Method::PUT, Method::OPTIONS] {
            for ct in [&b"application/grpc"[..], b"application/grpc-web"] {
                let p = parts(method.clone(), Version::HTTP_2, ct);
                assert_eq!(flavor(&p), None, "{method} {ct:?}");
            }
        }
        // gRPC-Web is made for HTTP/1.1, and tonic-web hands it on as native
        // gRPC in the same version.
        for version in [Version::HTTP_10, Version::HTTP_11, Version::HTTP_3] {
            let p = parts(Method::POST, version, b"application/grpc");
            assert_eq!(flavor(&p), Some(Grpc::Native), "{version:?}");
            let p = parts(Method::POST, version, b"application/grpc-web+proto");
            assert_eq!(flavor(&p), Some(Grpc::Web), "{version:?}");
        }
    }

    #[test]
    fn trailers_only_answers_are_never_cached() {
        let res = trailers_only(Grpc::Web, Code::InvalidArgument, "no key", None);
        assert_eq!(res.headers()[CACHE_CONTROL], "no-store");
        assert_eq!(res.status(), http::StatusCode::OK);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("retry in 5 ms"), "retry in 5 ms");
        assert_eq!(percent_encode("100% é\n"), "100%25 %C3%A9%0A");
    }

    proptest::proptest! {
        #![proptest_config(crate::hostile_input::config())]

        #[test]
        fn any_content_type_is_classified_within_budget(
            value in crate::hostile_input::header_bytes(),
            method in proptest::sample::select(vec![Method::POST, Method::GET, Method::PUT]),
            version in proptest::sample::select(vec![Version::HTTP_11, Version::HTTP_2]),
        ) {
            let p = parts(method.clone(), version, &value);
            let grpc = crate::hostile_input::within_budget("flavor", || flavor(&p));
            if grpc.is_some() {
                // Only a POST whose media type begins with a gRPC one.
                proptest::prop_assert_eq!(method, Method::POST);
                let lower = String::from_utf8_lossy(&value).to_ascii_lowercase();
                proptest::prop_assert!(lower.trim_start().starts_with("application/grpc"));
            }
        }
    }
}
