//! A one-time hint for gRPC servers built without tollgate's `tonic` feature.
//!
//! tonic puts the peer address into `TcpConnectInfo` (or `TlsConnectInfo`),
//! which only the `tonic` feature reads. The feature is opt-in (it compiles
//! tonic, prost and h2 for every user otherwise), so a tonic server without it
//! finds no peer for [`PeerIp`](super::PeerIp) or
//! [`ClientIp`](super::ClientIp): every call would go without a key. The first
//! gRPC request without a peer says so, once a process, and says what to do.

use http::request::Parts;

/// Called when `parts` reached `PeerIp` or `ClientIp` without a peer address.
#[cfg(not(feature = "tonic"))]
pub(crate) fn peer_missing(parts: &Parts) {
    use std::sync::atomic::{AtomicBool, Ordering};

    static WARNED: AtomicBool = AtomicBool::new(false);
    if is_grpc(parts) && !WARNED.swap(true, Ordering::Relaxed) {
        crate::observe::grpc_peer_needs_tonic();
        #[cfg(test)]
        tests::FIRED.fetch_add(1, Ordering::Relaxed);
    }
}

/// With the feature, a missing peer is the server's to supply: nothing to hint.
#[cfg(feature = "tonic")]
pub(crate) fn peer_missing(_parts: &Parts) {}

/// Whether `parts` carries a gRPC `content-type`: `application/grpc`, with
/// `+proto`, `;` parameters or the `-web` variants. The layer's own test
/// (`layer::is_grpc`) stays in the layer, which the key module does not import.
#[cfg(not(feature = "tonic"))]
fn is_grpc(parts: &Parts) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    let Some(value) = parts.headers.get(http::header::CONTENT_TYPE) else {
        return false;
    };
    let value = value.as_bytes();
    let Some((head, rest)) = value.split_at_checked(GRPC.len()) else {
        return false;
    };
    head.eq_ignore_ascii_case(GRPC) && matches!(rest.first(), None | Some(b'+' | b';' | b'-'))
}

#[cfg(test)]
mod tests {
    // The hint exists only without the feature: each item says so.
    #[cfg(not(feature = "tonic"))]
    use std::net::SocketAddr;
    #[cfg(not(feature = "tonic"))]
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[cfg(not(feature = "tonic"))]
    use http::Request;

    #[cfg(not(feature = "tonic"))]
    use super::*;
    #[cfg(not(feature = "tonic"))]
    use crate::key::{ClientIp, KeyExtractor, PeerIp};

    /// How many times the hint was given in this test process.
    #[cfg(not(feature = "tonic"))]
    pub(super) static FIRED: AtomicUsize = AtomicUsize::new(0);

    #[cfg(not(feature = "tonic"))]
    fn request(content_type: &str) -> Parts {
        Request::post("/pkg.Service/Method")
            .header("content-type", content_type)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[cfg(not(feature = "tonic"))]
    #[test]
    fn grpc_content_types_are_told_apart() {
        for grpc in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC;x=1",
            "application/grpc-web",
        ] {
            assert!(is_grpc(&request(grpc)), "{grpc}");
        }
        for other in ["application/json", "application/grpcx", "text/plain"] {
            assert!(!is_grpc(&request(other)), "{other}");
        }
    }

    #[cfg(not(feature = "tonic"))]
    #[tokio::test]
    async fn a_grpc_request_without_a_peer_is_hinted_at_once_a_process() {
        let grpc = request("application/grpc");
        assert_eq!(PeerIp::new().extract(&grpc).await, None);
        assert_eq!(FIRED.load(Ordering::Relaxed), 1);
        assert_eq!(PeerIp::new().extract(&grpc).await, None);
        let client_ip = ClientIp::trusted_proxies(["10.0.0.0/8"]).unwrap();
        assert_eq!(client_ip.extract(&grpc).await, None);
        // With a peer, or without gRPC, there is nothing to hint at.
        let mut with_peer = request("application/grpc");
        with_peer
            .extensions
            .insert(SocketAddr::from(([192, 0, 2, 1], 5000)));
        assert!(PeerIp::new().extract(&with_peer).await.is_some());
        let _ = PeerIp::new().extract(&request("application/json")).await;
        assert_eq!(
            FIRED.load(Ordering::Relaxed),
            1,
            "the hint was given more than once"
        );
    }
}
