//! PeerIp and ClientIp behind a real axum server on a loopback socket: the peer
//! comes from the `ConnectInfo` axum really inserts, and repeated and binary
//! forwarding headers arrive as hyper really parses them.
#![cfg(feature = "axum")]

use std::net::SocketAddr;

use axum::Router;
use axum::extract::Request;
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::key::{ClientIp, KeyExtractor, PeerIp};

/// Serves `/peer`, `/trusted` (loopback and 10/8 are proxies), `/untrusted` (only
/// 10/8 is) and `/forwarded`, each answering the key its extractor finds, or `-`
/// for none.
async fn serve() -> SocketAddr {
    async fn answer(key: impl KeyExtractor, req: Request) -> String {
        let (parts, _body) = req.into_parts();
        key.extract(&parts).await.unwrap_or_else(|| "-".into())
    }
    let app = Router::new()
        .route("/peer", get(|req| answer(PeerIp::new(), req)))
        .route(
            "/trusted",
            get(|req| {
                answer(
                    ClientIp::trusted_proxies(["127.0.0.0/8", "10.0.0.0/8"]).unwrap(),
                    req,
                )
            }),
        )
        .route(
            "/untrusted",
            get(|req| answer(ClientIp::trusted_proxies(["10.0.0.0/8"]).unwrap(), req)),
        )
        .route(
            "/forwarded",
            get(|req| {
                let key = ClientIp::trusted_proxies(["127.0.0.1", "10.0.0.0/8"])
                    .unwrap()
                    .forwarded();
                answer(key, req)
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// Sends a raw HTTP/1.1 request, so header lines and bytes are exactly ours, and
/// returns the response body.
async fn get_raw(addr: SocketAddr, path: &str, headers: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut request =
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n").into_bytes();
    request.extend_from_slice(headers);
    request.extend_from_slice(b"\r\n");
    stream.write_all(&request).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn keys_over_a_real_socket() {
    let addr = serve().await;
    let xff = b"X-Forwarded-For: 6.6.6.6, 203.0.113.7\r\nX-Forwarded-For: 10.0.0.1\r\n";

    assert_eq!(get_raw(addr, "/peer", xff).await, "127.0.0.1");
    assert_eq!(get_raw(addr, "/trusted", xff).await, "203.0.113.7");
    // The loopback peer is not a trusted proxy here: its headers are ignored.
    assert_eq!(get_raw(addr, "/untrusted", xff).await, "127.0.0.1");

    let forwarded = b"Forwarded: for=1.1.1.1;x=\", for=\"[2001:db8:cafe::17]:4711\"\r\n\
                      Forwarded: for=10.0.0.1;proto=https\r\n";
    assert_eq!(
        get_raw(addr, "/forwarded", forwarded).await,
        "2001:db8:cafe::/64"
    );

    let mut hostile = b"X-Forwarded-For: \xff\xfe".to_vec();
    hostile.extend(std::iter::repeat_n(b',', 16 * 1024));
    hostile.extend_from_slice(b" 198.51.100.4\r\n");
    assert_eq!(get_raw(addr, "/trusted", &hostile).await, "198.51.100.4");
}
