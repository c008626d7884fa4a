//! `RedisStore` over TLS (`rediss://`, rustls) against a TLS-only
//! redis-server with a CA made at run time: checks work when the server's
//! certificate verifies, and fail with an error that names the server (and
//! never the password) when it does not.
#![cfg(feature = "tls")]

mod support;

use std::time::Duration;

use support::tls::{TlsRedis, store_trusting};
use tollgate::{ErrorKind, Quota, RateLimiter, RedisStore};

#[tokio::test]
async fn tls_checks_over_rediss_with_the_servers_ca() {
    if !support::bins::has_tls() {
        return support::bins::no_tls("tls_checks_over_rediss_with_the_servers_ca");
    }
    let server = TlsRedis::start();
    for (i, url) in [server.url(), server.localhost_url()]
        .into_iter()
        .enumerate()
    {
        let store = store_trusting(url.clone(), server.ca_pem());
        store.ping().await.unwrap_or_else(|e| panic!("{url}: {e}"));
        let limiter = RateLimiter::new(store, Quota::per_hour(2).unwrap());
        let key = format!("user:{i}");
        assert_eq!(limiter.check(&key, 1).await.unwrap().remaining(), 1);
        assert_eq!(limiter.check(&key, 1).await.unwrap().remaining(), 0);
        assert!(!limiter.check(&key, 1).await.unwrap().allowed());
    }
    // The decisions were made by the script on the TLS server.
    assert!(server.calls("evalsha") + server.calls("eval") >= 6);
}

/// A certificate that does not verify (signed by another CA, or by a CA the
/// system does not trust) is refused during the handshake: nothing reaches
/// Redis, and the error is a connection error that names the server and
/// says why, without the URL's password.
#[tokio::test]
async fn tls_a_certificate_that_does_not_verify_fails_clearly_naming_the_host() {
    if !support::bins::has_tls() {
        return support::bins::no_tls(
            "tls_a_certificate_that_does_not_verify_fails_clearly_naming_the_host",
        );
    }
    let server = TlsRedis::start();
    let url = format!("rediss://app:s3cret@127.0.0.1:{}", server.port());
    let host = format!("127.0.0.1:{}", server.port());
    server.reset_stats();
    let wrong_ca = store_trusting(url.clone(), server.wrong_ca_pem());
    let system_roots = RedisStore::builder()
        .leases(false)
        .url(url.clone())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for (what, store) in [("wrong CA", wrong_ca), ("system roots", system_roots)] {
        let e = store.ping().await.expect_err(what);
        let message = e.to_string();
        println!("{what}: {message}");
        assert_eq!(e.kind(), ErrorKind::Connection, "{what}: {message}");
        assert!(message.contains(&host), "{what}: {message}");
        assert!(
            message.contains("certificate"),
            "{what}: the reason is missing: {message}"
        );
        assert!(!message.contains("s3cret"), "{what}: {message}");
        let limiter = RateLimiter::new(store, Quota::per_second(5).unwrap());
        let e = limiter.check("k", 1).await.expect_err(what);
        assert!(e.is_store_error());
        assert!(e.to_string().contains(&host), "{e}");
        assert!(!format!("{e:?}").contains("s3cret"), "{e:?}");
    }
    // Refused in the handshake: no command reached the server.
    assert_eq!(server.all_calls(), Default::default());
}

#[test]
fn tls_configuration_mistakes_are_refused_at_build() {
    if !support::bins::has_tls() {
        return support::bins::no_tls("tls_configuration_mistakes_are_refused_at_build");
    }
    let refused = support::refused_at_build;
    let ca = TlsRedis::start().ca_pem();
    let m = refused(
        RedisStore::builder()
            .leases(false)
            .url("redis://:s3cret@127.0.0.1:6379")
            .tls_root_certificates(ca.clone()),
    );
    assert!(m.contains("rediss://"), "{m}");
    let m = refused(
        RedisStore::builder()
            .leases(false)
            .url("rediss://:s3cret@127.0.0.1:6379")
            .tls_root_certificates(b"not a certificate".to_vec()),
    );
    assert!(m.contains("no certificate"), "{m}");
    let m = refused(
        RedisStore::builder()
            .leases(false)
            .url("rediss://:s3cret@127.0.0.1:6379/#insecure"),
    );
    assert!(m.contains("#insecure"), "{m}");
    let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379")
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let m = refused(
        RedisStore::builder()
            .leases(false)
            .pool(pool)
            .tls_root_certificates(ca),
    );
    assert!(m.contains("pool"), "{m}");
    let debug = format!(
        "{:?}",
        RedisStore::builder()
            .leases(false)
            .url("rediss://:s3cret@127.0.0.1:6379")
    );
    assert!(!debug.contains("s3cret"), "{debug}");
}
