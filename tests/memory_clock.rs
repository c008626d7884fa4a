//! `MemoryStore`'s production clock counts real time, neither faster nor
//! slower: in every feature set (without `test-util` it is the CPU's
//! time-stamp counter, or the OS's monotonic clock where that is not
//! reliable; with it, tokio's `Instant`).

use std::time::Duration;

use tollgate::{MemoryStore, Quota, RateLimiter};

#[tokio::test]
async fn a_drained_bucket_refills_in_real_time() {
    // One token a second, a bucket of one.
    let limiter = RateLimiter::new(MemoryStore::new(), Quota::per_second(1).unwrap());
    assert!(limiter.check("k", 1).await.unwrap().allowed());
    // At once: nothing has refilled (a clock running fast would have).
    let refused = limiter.check("k", 1).await.unwrap();
    assert!(!refused.allowed(), "{refused:?}");
    let wait = refused.retry_after();
    assert!(
        wait > Duration::ZERO && wait <= Duration::from_secs(1),
        "{wait:?}"
    );
    // Once that wait is over, the token is back (a clock running slow, or
    // not at all, would still refuse).
    tokio::time::sleep(wait + Duration::from_millis(20)).await;
    let admitted = limiter.check("k", 1).await.unwrap();
    assert!(admitted.allowed(), "{admitted:?}");
}
