//! Redis far away (every chunk held in a `Proxy` on the way): what a check
//! waits there, against a plain round trip through the same proxy. The
//! single-server and the cluster batching tests hold the median check to less
//! than 1.5 round trips.

use std::time::{Duration, Instant};

use deadpool_redis::redis;
use tollgate::{Policy, RedisStore, Store};

/// The median of 5 `PING`s on one connection to `url` (blocking: call it
/// outside the runtime or in `spawn_blocking`).
pub fn ping_median(url: &str) -> Duration {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_connection().unwrap();
    let mut times: Vec<Duration> = (0..5)
        .map(|_| {
            let start = Instant::now();
            let _: String = redis::cmd("PING").query(&mut conn).unwrap();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

/// One task a key, each checking its key `warm_up + measured` times in a row
/// (every check must be admitted): how long each of the last `measured`
/// checks of every task took.
pub async fn check_times(
    store: &RedisStore,
    policy: &Policy,
    keys: impl IntoIterator<Item = String>,
    warm_up: usize,
    measured: usize,
) -> Vec<Duration> {
    let tasks: Vec<_> = keys
        .into_iter()
        .map(|key| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                let mut took = Vec::with_capacity(measured);
                for n in 0..warm_up + measured {
                    let start = Instant::now();
                    let d = store.check(&key, &policy, 1).await.unwrap();
                    assert!(d.allowed(), "{d:?}");
                    if n >= warm_up {
                        took.push(start.elapsed());
                    }
                }
                took
            })
        })
        .collect();
    let mut took = Vec::new();
    for task in tasks {
        took.extend(task.await.unwrap());
    }
    took
}

/// Prints the median and p90 of `took` and asserts the median is under 1.5
/// times `ping`: a check waits about one round trip, not two.
pub fn assert_about_one_round_trip(who: &str, ping: Duration, mut took: Vec<Duration>) {
    took.sort();
    let median = took[took.len() / 2];
    println!(
        "{who}: PING {ping:?}, check median {median:?}, p90 {:?}",
        took[took.len() * 9 / 10]
    );
    assert!(
        median < ping * 3 / 2,
        "{who}: a check's median {median:?} against a round trip of {ping:?}"
    );
}
