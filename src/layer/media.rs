//! Which kind of gRPC a request or a response is, by its media type: read by
//! the check (to answer a call in gRPC), by the gRPC answers (their
//! `content-type`) and by settling (a status that comes in the trailers).

use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderValue, Method};

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
    /// The `content-type` of an answer to a call of this kind.
    pub(crate) fn content_type(self) -> HeaderValue {
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
    flavor_of(&parts.method, &parts.headers)
}

/// [`flavor`] of a request's method and headers.
pub(crate) fn flavor_of(method: &Method, headers: &http::HeaderMap) -> Option<Grpc> {
    if method != Method::POST {
        return None;
    }
    media_type(headers.get(CONTENT_TYPE)?.as_bytes())
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
