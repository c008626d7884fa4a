//! The harness and RedisStore work together at all: one check, one key, one TTL.
#![cfg(feature = "redis")]

mod support;

use support::RedisServer;
use tollgate::{Quota, RateLimiter};

#[tokio::test]
async fn a_check_creates_one_key_with_a_ttl() {
    let server = RedisServer::start();
    // 3 a minute: the key lives 20 s, so the commands below see it however
    // slow the machine (at 3 a second it lived 334 ms).
    let limiter = RateLimiter::new(server.store(), Quota::per_minute(3).unwrap());
    let d = limiter.check("smoke", 1).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 2);
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    // Behind the policy's name (a bare quota's policy is `default`).
    assert_eq!(keys, vec!["tollgate:{default:smoke}:3/m:b3".to_string()]);
    let ttl: i64 = server.cmd(&["PTTL", &keys[0]]);
    // Full again in 20 s: a TTL of 20 000 ms, plus a margin of 1 ms.
    assert!(ttl > 0 && ttl <= 20_000 + 1, "ttl {ttl}");
}
