//! The bottom of the gRPC answers: which kind of gRPC call a request is, the
//! status codes the layer uses, and the trailers-only response they go in.

use std::fmt::Write;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Response};

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

/// The gRPC kind of a request, from its headers, or `None` for other HTTP
/// requests.
pub(crate) fn flavor(headers: &HeaderMap) -> Option<Grpc> {
    let value = headers.get(CONTENT_TYPE)?.as_bytes();
    // Media types are case-insensitive (RFC 9110 section 8.3.1).
    let starts = |prefix: &[u8]| {
        value
            .get(..prefix.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
    };
    if starts(b"application/grpc-web-text") {
        Some(Grpc::WebText)
    } else if starts(b"application/grpc-web") {
        Some(Grpc::Web)
    } else if starts(b"application/grpc") {
        Some(Grpc::Native)
    } else {
        None
    }
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
/// ends the stream: a gRPC "trailers-only" response.
pub(crate) fn trailers_only(
    grpc: Grpc,
    code: Code,
    message: &str,
    pushback: Option<Pushback>,
) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, grpc.content_type());
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
    use http::Request;

    fn headers(content_type: &str) -> HeaderMap {
        let req = Request::post("/").header(CONTENT_TYPE, content_type);
        req.body(()).unwrap().into_parts().0.headers
    }

    #[test]
    fn grpc_calls_are_told_by_their_content_type() {
        let kind = |ct| flavor(&headers(ct));
        assert_eq!(kind("application/grpc"), Some(Grpc::Native));
        assert_eq!(kind("application/grpc+proto"), Some(Grpc::Native));
        assert_eq!(kind("Application/GRPC"), Some(Grpc::Native));
        assert_eq!(kind("application/grpc-web+proto"), Some(Grpc::Web));
        assert_eq!(kind("application/grpc-web-text"), Some(Grpc::WebText));
        assert_eq!(kind("application/json"), None);
        assert_eq!(kind("application/grp"), None);
        assert_eq!(flavor(&HeaderMap::new()), None);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("retry in 5 ms"), "retry in 5 ms");
        assert_eq!(percent_encode("100% é\n"), "100%25 %C3%A9%0A");
    }
}
