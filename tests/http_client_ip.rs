//! Client IP keys through real sockets: the peer is always 127.0.0.1, and
//! `X-Forwarded-For` is believed only when 127.0.0.1 is configured as a trusted
//! proxy.
#![cfg(all(feature = "redis", feature = "axum"))]

mod support;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use support::RedisServer;
use support::http::{Client, TestServer};
use tollgate::Quota;
use tollgate::key::{ClientIp, Header, KeyExtractorExt, PeerIp};
use tollgate::layer::RateLimitLayer;

/// 3 a minute: nothing refills while a test runs.
fn slow() -> Quota {
    Quota::per_minute(3).unwrap()
}

async fn serve(layer: RateLimitLayer) -> TestServer {
    TestServer::axum(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await
}

fn xff(value: &str) -> [(&'static str, &[u8]); 1] {
    [("x-forwarded-for", value.as_bytes())]
}

fn keys(redis: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    keys.sort();
    keys
}

#[tokio::test]
async fn forged_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let redis = RedisServer::start();
    // Only 10.0.0.0/8 is trusted: the loopback peer is a client, not a proxy.
    let key = ClientIp::trusted_proxies(["10.0.0.0/8"]).unwrap();
    let server = serve(RateLimitLayer::new(redis.store(), slow()).key(key)).await;
    let client = Client::new();
    // A new forged address on every request does not buy a new bucket.
    for (i, forged) in ["1.1.1.1", "2.2.2.2", "10.0.0.1, 3.3.3.3"]
        .iter()
        .enumerate()
    {
        let r = client.get_with(&server.url("/"), &xff(forged)).await;
        assert_eq!(r.status, StatusCode::OK, "request {i}");
    }
    let r = client.get_with(&server.url("/"), &xff("4.4.4.4")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        keys(&redis),
        ["tollgate:{default:client-ip:127.0.0.1}:3/m:b3"]
    );
}

#[tokio::test]
async fn forwarded_for_from_a_trusted_peer_is_honoured() {
    let redis = RedisServer::start();
    let key = ClientIp::trusted_proxies(["127.0.0.1/32"]).unwrap();
    let server = serve(RateLimitLayer::new(redis.store(), slow()).key(key)).await;
    let client = Client::new();
    // The client 203.0.113.7 as our proxy reported it; whatever the client wrote
    // to the left of it is not believed.
    for forged in [
        "203.0.113.7",
        "6.6.6.6, 203.0.113.7",
        "7.7.7.7, 203.0.113.7",
    ] {
        let r = client.get_with(&server.url("/"), &xff(forged)).await;
        assert_eq!(r.status, StatusCode::OK, "{forged}");
    }
    let r = client
        .get_with(&server.url("/"), &xff("8.8.8.8, 203.0.113.7"))
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // Another client behind the same proxy has its own bucket.
    let r = client.get_with(&server.url("/"), &xff("203.0.113.8")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        keys(&redis),
        [
            "tollgate:{default:client-ip:203.0.113.7}:3/m:b3",
            "tollgate:{default:client-ip:203.0.113.8}:3/m:b3",
        ]
    );
}

#[tokio::test]
async fn a_single_address_header_is_believed_only_from_the_trusted_proxy() {
    let redis = RedisServer::start();
    // Cloudflare-style: the proxy overwrites CF-Connecting-IP, and only the
    // proxy's network is trusted. The loopback peer is not in it: a client that
    // reaches the origin directly and invents a new address each time still
    // spends from its own (the peer's) bucket.
    let key = ClientIp::header("cf-connecting-ip")
        .unwrap()
        .only_from(["10.0.0.0/8"])
        .unwrap();
    let server = serve(RateLimitLayer::new(redis.store(), slow()).key(key)).await;
    let client = Client::new();
    for (i, forged) in ["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"]
        .iter()
        .enumerate()
    {
        let r = client
            .get_with(&server.url("/"), &[("cf-connecting-ip", forged.as_bytes())])
            .await;
        let want = if i < 3 { 200 } else { 429 };
        assert_eq!(r.status, want, "request {i}");
    }
    assert_eq!(
        keys(&redis),
        ["tollgate:{default:client-ip:127.0.0.1}:3/m:b3"]
    );

    // What trust_any_peer warns about: from any peer, every invented address
    // is a fresh bucket, so this client is never limited.
    let redis = RedisServer::start();
    let key = ClientIp::header("cf-connecting-ip")
        .unwrap()
        .trust_any_peer();
    let server = serve(RateLimitLayer::new(redis.store(), slow()).key(key)).await;
    for forged in ["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4", "5.5.5.5"] {
        let r = client
            .get_with(&server.url("/"), &[("cf-connecting-ip", forged.as_bytes())])
            .await;
        assert_eq!(r.status, StatusCode::OK, "{forged}");
    }
    assert_eq!(keys(&redis).len(), 5);
}

#[tokio::test]
async fn ipv6_clients_in_one_64_share_a_bucket() {
    let redis = RedisServer::start();
    let key = ClientIp::trusted_proxies(["127.0.0.1/32"]).unwrap();
    let server = serve(RateLimitLayer::new(redis.store(), slow()).key(key)).await;
    let client = Client::new();
    for addr in [
        "2001:db8:1:2::1",
        "2001:db8:1:2:ffff::9",
        "2001:db8:1:2:abcd:ef01:2345:6789",
    ] {
        let r = client.get_with(&server.url("/"), &xff(addr)).await;
        assert_eq!(r.status, StatusCode::OK, "{addr}");
    }
    let r = client
        .get_with(&server.url("/"), &xff("2001:db8:1:2::42"))
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // The next /64 is another customer.
    let r = client
        .get_with(&server.url("/"), &xff("2001:db8:1:3::1"))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        keys(&redis),
        [
            "tollgate:{default:client-ip:2001:db8:1:2::/64}:3/m:b3",
            "tollgate:{default:client-ip:2001:db8:1:3::/64}:3/m:b3",
        ]
    );
}

#[tokio::test]
async fn api_key_or_client_ip_keeps_the_two_apart() {
    let redis = RedisServer::start();
    let key = Header::new("x-api-key")
        .unwrap()
        .verbatim()
        .or(PeerIp::new());
    let server = serve(RateLimitLayer::new(redis.store(), slow()).key(key)).await;
    let client = Client::new();
    for _ in 0..3 {
        let r = client
            .get_with(&server.url("/"), &[("x-api-key", b"k-1")])
            .await;
        assert_eq!(r.status, StatusCode::OK);
    }
    // Keyless requests from the same machine fall back to its IP: a fresh bucket.
    for _ in 0..3 {
        assert_eq!(client.get(&server.url("/")).await.status, StatusCode::OK);
    }
    assert_eq!(client.get(&server.url("/")).await.status, 429);
    // Each alternative is tagged, so an API key can never pose as an address.
    assert_eq!(
        keys(&redis),
        [
            "tollgate:{default:header:x-api-key/ip:0:k-1}:3/m:b3",
            "tollgate:{default:header:x-api-key/ip:1:127.0.0.1}:3/m:b3",
        ]
    );
}

#[tokio::test]
async fn the_default_key_is_the_peer_address_from_connect_info() {
    let redis = RedisServer::start();
    let server = serve(RateLimitLayer::new(redis.store(), slow())).await;
    let client = Client::new();
    for _ in 0..3 {
        assert_eq!(client.get(&server.url("/")).await.status, StatusCode::OK);
    }
    // Forwarding headers mean nothing to PeerIp.
    let r = client.get_with(&server.url("/"), &xff("203.0.113.9")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(keys(&redis), ["tollgate:{default:ip:127.0.0.1}:3/m:b3"]);
}
