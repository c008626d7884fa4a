//! The bottom of the gRPC answers: the status codes the layer uses, and the
//! trailers-only response they go in.

use std::fmt::Write;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderName, HeaderValue, Response};

use crate::layer::media::Grpc;

/// `grpc-retry-pushback-ms`: the metadata through which a server tells gRPC
/// clients with a retry policy how long to wait before retrying (gRFC A6,
/// "Pushback"). The value is ASCII integer milliseconds; a negative value tells
/// the client not to retry at all.
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

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
}
