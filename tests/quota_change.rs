//! Limits that change without a free burst, on real servers: a quota changed
//! to other figures over the same period carries each bucket over (the share
//! of the capacity a client had spent stays spent), on a memory store and on
//! Redis; across a `PolicyTable::swap` while requests flow through a real
//! socket; and between two instances sharing Redis during a rolling deploy,
//! one on the old quota and one on the new.
//!
//! Every quota here refills per hour, so what refills during a test is a
//! share of the capacity of `elapsed / 3600 s` per second at most: each
//! bound below adds what the elapsed time could have refilled, measured, not
//! assumed.
#![cfg(all(feature = "redis", feature = "axum"))]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use support::RedisServer;
use support::http::{Client, TestServer};
use tollgate::layer::{PolicyRule, PolicyTable, RateLimitLayer, RuleKey};
use tollgate::{AnyStore, MemoryStore, Policy, Quota, RateLimiter, RedisStore};

fn policy(quotas: &[&str]) -> Policy {
    Policy::new("api", quotas.iter().map(|q| q.parse::<Quota>().unwrap())).unwrap()
}

/// Whole tokens a refill of `elapsed` can add to a bucket of `capacity`
/// refilling it in an hour, rounded up: what a bound must allow for.
fn refill(elapsed: Duration, capacity: u64) -> u64 {
    (elapsed.as_secs_f64() / 3600.0 * capacity as f64).ceil() as u64
}

/// Checks `key` under `policy` until refused (at most `most` times):
/// how many were admitted.
async fn drain(store: &AnyStore, policy: &Policy, key: &str, most: u64) -> u64 {
    let limiter = RateLimiter::new(store.clone(), policy.clone());
    for n in 0..most {
        if !limiter.check(key, 1).await.unwrap().allowed() {
            return n;
        }
    }
    most
}

async fn remaining(store: &AnyStore, policy: &Policy, key: &str) -> Vec<u64> {
    let limiter = RateLimiter::new(store.clone(), policy.clone());
    let d = limiter.peek(key).await.unwrap();
    d.states().iter().map(|s| s.remaining()).collect()
}

/// Raised and lowered, a spent burst stays spent; half spent stays half
/// spent; a quota of another period, and an unchanged one, keep their own
/// buckets.
async fn a_changed_quota_carries_what_was_spent(store: AnyStore) {
    let started = Instant::now();
    let old = policy(&["5/h"]);
    let raised = policy(&["50/h burst 50"]);
    let lowered = policy(&["2/h"]);
    assert_eq!(drain(&store, &old, "spent", 10).await, 5);
    // Without carrying, the raise would hand out 50 and the lowering 2.
    let slack = refill(started.elapsed(), 50);
    assert!(drain(&store, &raised, "spent", 60).await <= slack);
    assert!(drain(&store, &lowered, "spent", 5).await <= refill(started.elapsed(), 2));
    assert!(drain(&store, &old, "spent", 5).await <= refill(started.elapsed(), 5));

    // Half of 4 spent: half of 8 after a raise, half of 2 after a lowering.
    let four = policy(&["4/h"]);
    assert_eq!(drain(&store, &four, "half", 2).await, 2);
    assert_eq!(remaining(&store, &policy(&["8/h"]), "half").await, [4]);
    assert_eq!(remaining(&store, &policy(&["2/h"]), "half").await, [1]);
    // A peek carried nothing: back under 4/h, still 2 left.
    assert_eq!(remaining(&store, &four, "half").await, [2]);
    assert_eq!(drain(&store, &policy(&["8/h"]), "half", 10).await, 4);
    assert_eq!(remaining(&store, &four, "half").await, [0]);

    // A burst apart from the rate changes the bucket's figures: carried by
    // its share all the same.
    let apart = policy(&["10/h burst 4"]);
    assert_eq!(drain(&store, &apart, "apart", 2).await, 2);
    assert_eq!(
        remaining(&store, &policy(&["10/h burst 8"]), "apart").await,
        [4]
    );
    assert_eq!(
        remaining(&store, &policy(&["20/h burst 40"]), "apart").await,
        [20]
    );
    assert_eq!(
        remaining(&store, &policy(&["10/h burst 2"]), "apart").await,
        [1]
    );
    assert_eq!(
        drain(&store, &policy(&["10/h burst 8"]), "apart", 10).await,
        4
    );
    assert_eq!(remaining(&store, &apart, "apart").await, [0]);

    // Two quotas: the per-minute one changes (carried), the per-hour one
    // does not (kept as it was).
    let pair = policy(&["4/min", "100/h"]);
    assert_eq!(drain(&store, &pair, "pair", 10).await, 4);
    let changed = policy(&["8/min burst 8", "100/h"]);
    let left = remaining(&store, &changed, "pair").await;
    assert!(
        left[0] <= 1,
        "{left:?}: at most the token a few seconds of 8/min refill"
    );
    assert_eq!(left[1], 96);
    // A new client of the changed policy gets the whole new burst.
    assert_eq!(drain(&store, &changed, "new", 20).await, 8);
}

#[tokio::test]
async fn a_changed_quota_carries_what_was_spent_in_memory() {
    a_changed_quota_carries_what_was_spent(MemoryStore::new().into()).await;
}

#[tokio::test]
async fn a_changed_quota_carries_what_was_spent_on_redis() {
    let server = RedisServer::start();
    a_changed_quota_carries_what_was_spent(server.store().into()).await;
    // The bucket is kept under one key per period, written with the
    // figures of the quota it was last written under.
    let keys: Vec<String> = server.cmd(&["KEYS", "*{api:half}*"]);
    assert_eq!(keys, ["tollgate:{api:half}:1h"]);
    let value: String = server.cmd(&["GET", "tollgate:{api:half}:1h"]);
    // 8/h: a token is 450 000 000 units (num 1), a full bucket 8 of them.
    assert!(value.ends_with(":3600000000,1"), "under 8/h: {value}");
}

/// The app: one route, limited by `table` keyed by the `x-user` header.
async fn serve(store: AnyStore, table: PolicyTable) -> TestServer {
    let layer = RateLimitLayer::new(store, Quota::per_hour(1000).unwrap()).policy_table(table);
    TestServer::axum(
        Router::new()
            .route("/x", get(|| async { "ok" }))
            .layer(layer),
    )
    .await
}

fn table(quota: &str) -> PolicyTable {
    let rule = PolicyRule::new(policy(&[quota])).key(RuleKey::header("x-user").unwrap());
    PolicyTable::new([rule]).unwrap()
}

/// Admissions counted by the policy that decided them (its `q=` in the
/// `RateLimit-Policy` header), from four clients sending as fast as they
/// can until stopped.
struct Flow {
    stop: Arc<AtomicBool>,
    admitted: Arc<[AtomicU64; 3]>,
    refused: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The quota before, after a raise (a rate and a burst of other figures:
/// the bucket is carried by its share) and after a lowering.
const QUOTAS: [&str; 3] = ["5/h", "50/h burst 40", "2/h"];

fn flow(server: &TestServer, user: &'static str) -> Flow {
    let stop = Arc::new(AtomicBool::new(false));
    let admitted: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let refused = Arc::new(AtomicU64::new(0));
    let tasks = (0..4)
        .map(|_| {
            let (stop, admitted, refused) = (
                Arc::clone(&stop),
                Arc::clone(&admitted),
                Arc::clone(&refused),
            );
            let (client, url) = (Client::new(), server.url("/x"));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let reply = client.get_with(&url, &[("x-user", user.as_bytes())]).await;
                    let policy = reply.header("ratelimit-policy").unwrap_or("").to_owned();
                    match reply.status.as_u16() {
                        200 => {
                            let at = ["q=5;", "q=40;", "q=2;"]
                                .iter()
                                .position(|q| policy.contains(q))
                                .expect("a policy of the table");
                            admitted[at].fetch_add(1, Ordering::Relaxed);
                        }
                        429 => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("status {other}"),
                    }
                }
            })
        })
        .collect();
    Flow {
        stop,
        admitted,
        refused,
        tasks,
    }
}

impl Flow {
    /// Waits until `n` more requests were refused (at most 30 s).
    async fn refusals(&self, n: u64) {
        let target = self.refused.load(Ordering::Relaxed) + n;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.refused.load(Ordering::Relaxed) < target {
            assert!(Instant::now() < deadline, "requests stopped flowing");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn finish(self) -> [u64; 3] {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        [0, 1, 2].map(|i| self.admitted[i].load(Ordering::Relaxed))
    }
}

/// A limit raised, then lowered, by `PolicyTable::swap` while a client's
/// requests keep coming: a client that had spent its burst gets none of
/// the raised quota's (nor of the lowered one's); another client gets the
/// raised burst whole.
async fn a_swap_while_requests_flow_hands_out_no_burst(store: AnyStore) {
    let table = table(QUOTAS[0]);
    let server = serve(store, table.clone()).await;
    let started = Instant::now();
    let spender = flow(&server, "spender");
    spender.refusals(50).await;
    table.swap(self::table(QUOTAS[1]));
    spender.refusals(200).await;
    table.swap(self::table(QUOTAS[2]));
    spender.refusals(100).await;
    let [old, raised, lowered] = spender.finish().await;
    let elapsed = started.elapsed();
    assert!(
        (1..=5).contains(&old),
        "{old}: the old burst (less what a lease may have held unspent)"
    );
    // Without carrying, the raise would admit 40 and the lowering 2 more.
    assert!(
        raised <= refill(elapsed, 50),
        "{raised} admitted after the raise"
    );
    assert!(
        lowered <= refill(elapsed, 2),
        "{lowered} admitted after the lowering"
    );
    // The swaps took: a client new to the raised quota gets its burst.
    table.swap(self::table(QUOTAS[1]));
    let newcomer = flow(&server, "newcomer");
    newcomer.refusals(20).await;
    let [_, raised, _] = newcomer.finish().await;
    let most = 40 + refill(started.elapsed(), 50);
    assert!(raised > 5 && raised <= most, "{raised} of the raised burst");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_while_requests_flow_hands_out_no_burst_in_memory() {
    a_swap_while_requests_flow_hands_out_no_burst(MemoryStore::new().into()).await;
}

/// On Redis as production runs it: leases on (in-process holds, debited
/// whole when their bucket is carried into new figures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_while_requests_flow_hands_out_no_burst_on_redis_with_leases() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .pool(server.pool())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    a_swap_while_requests_flow_hands_out_no_burst(store.into()).await;
}

/// A rolling deploy: two instances (stores, pools, leases on) share one
/// Redis, one still on the old quota and one on the new. Every check
/// carries the client's bucket into its own instance's figures (holds
/// debited whole), so the two together spend at most one bucket: each
/// admission under 5/h takes a fifth of it and each under 50/h burst 40 a
/// fortieth, `8 x old + new <= 40`, where two buckets would admit 5 and 40.
#[tokio::test]
async fn instances_on_the_old_and_the_new_quota_share_one_bucket() {
    let server = RedisServer::start();
    let instance = |quota: &str| {
        let store = RedisStore::builder()
            .pool(server.pool())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        RateLimiter::new(store, policy(&[quota]))
    };
    let (old, new) = (instance("5/h"), instance("50/h burst 40"));
    let started = Instant::now();
    let (mut by_old, mut by_new) = (0u64, 0u64);
    // Alternating, then each alone until refused twice in a row.
    for round in 0..200 {
        let (a, b) = (
            old.check("c", 1).await.unwrap(),
            new.check("c", 1).await.unwrap(),
        );
        by_old += u64::from(a.allowed());
        by_new += u64::from(b.allowed());
        if round > 60 && !a.allowed() && !b.allowed() {
            break;
        }
    }
    let share = 8 * by_old + by_new;
    let bound = 40 + refill(started.elapsed(), 50);
    assert!(
        share <= bound,
        "{by_old} old and {by_new} new admissions: {share} > {bound}"
    );
    assert!(by_old > 0 && by_new > 0, "both spent: {by_old} {by_new}");
    // Either instance finds the bucket spent.
    assert_eq!(old.peek("c").await.unwrap().remaining(), 0);
    assert!(new.peek("c").await.unwrap().remaining() <= refill(started.elapsed(), 50));
}

/// A request decided before a swap settles (a refund or a charge) under the
/// figures that decided it, after a check under the new ones: the bucket
/// stays under the new figures. Written back under the old ones, it would
/// refill at their rate until the next check: here a full bucket of 100
/// after 1 s, where the new figures refill 1 a second.
async fn a_late_settlement_keeps_the_new_figures(store: AnyStore) {
    let old = RateLimiter::new(store.clone(), policy(&["100/s burst 100"]));
    let new = RateLimiter::new(store.clone(), policy(&["1/s burst 100"]));
    // Decided under the old figures, then the swap, then the client
    // empties the bucket under the new ones.
    let decided = old.check("late", 1).await.unwrap();
    assert!(decided.allowed());
    assert!(drain(&store, new.policy(), "late", 200).await >= 98);
    let started = Instant::now();
    old.charge("late", 1, &decided).await.unwrap();
    old.refund("late", 1, &decided).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let left = new.peek("late").await.unwrap().remaining();
    // 1 a second under the new figures, and the token the refund gave back.
    let most = started.elapsed().as_secs() + 2;
    assert!(left <= most, "{left} left, at most {most}");
}

#[tokio::test]
async fn a_late_settlement_keeps_the_new_figures_in_memory() {
    a_late_settlement_keeps_the_new_figures(MemoryStore::new().into()).await;
}

#[tokio::test]
async fn a_late_settlement_keeps_the_new_figures_on_redis() {
    let server = RedisServer::start();
    a_late_settlement_keeps_the_new_figures(server.store().into()).await;
}

/// Two limits made from bare quotas of one period (both named `default`) on
/// one store, checking the same keys, count apart: an unnamed policy's
/// buckets are its figures', and nothing is carried between them. Hourly
/// quotas, so a slow machine's checks see no token refilled (at 10 a
/// second, a drain that took over 100 ms admitted one more).
async fn bare_quotas_of_one_period_count_apart(store: AnyStore) {
    let started = Instant::now();
    let wide = RateLimiter::new(store.clone(), "10/h burst 100".parse::<Quota>().unwrap());
    let narrow = RateLimiter::new(store.clone(), "10/h".parse::<Quota>().unwrap());
    assert_eq!(drain(&store, wide.policy(), "k", 200).await, 100);
    assert_eq!(drain(&store, narrow.policy(), "k", 200).await, 10);
    let left = wide.peek("k").await.unwrap().remaining();
    assert!(left <= refill(started.elapsed(), 10), "{left} left");
}

#[tokio::test]
async fn bare_quotas_of_one_period_count_apart_in_memory() {
    bare_quotas_of_one_period_count_apart(MemoryStore::new().into()).await;
}

#[tokio::test]
async fn bare_quotas_of_one_period_count_apart_on_redis() {
    let server = RedisServer::start();
    bare_quotas_of_one_period_count_apart(server.store().into()).await;
}

/// While learning after a loss of Redis data (see the store's leases), a
/// bucket read carries a stand-in hold, debited whole when learning ends. A
/// late settlement that keeps a bucket under its other figures writes that
/// hold with it, as a check writes it: dropped, the debit it stands for
/// would be lost.
#[tokio::test]
async fn a_late_settlement_while_learning_keeps_the_stand_in_hold() {
    use tollgate::Store;

    let server = RedisServer::start();
    // Leases on, as in production: a hold granted gives the server an epoch.
    let store = RedisStore::builder()
        .pool(server.pool())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let leasable = Policy::from(Quota::new(200, Duration::from_secs(10)).unwrap());
    let started = Instant::now();
    while store.lease_stats().outstanding == 0 {
        let _ = store.check("warm", &leasable, 1).await;
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no hold granted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let decided_under_old = policy(&["100/h"]);
    // Other figures (full 1.8e9 units, not 3.6e9): a carried bucket.
    let new = policy(&["200/h burst 100"]);
    let old = RateLimiter::new(store.clone(), decided_under_old.clone());
    let decided = old.check("late", 1).await.unwrap();
    assert!(decided.allowed());
    let _: String = server.cmd(&["FLUSHALL"]);
    // Learning now: the check under the new figures writes the stand-in
    // hold (its id starts with `~`), then the late refund keeps it.
    assert!(store.check("api:late", &new, 1).await.unwrap().allowed());
    let key = store.bucket_keys("api:late", &new).remove(0);
    let value: String = server.cmd(&["GET", &key]);
    assert!(value.contains(":~"), "{value}");
    old.refund("late", 1, &decided).await.unwrap();
    let value: String = server.cmd(&["GET", &key]);
    assert!(value.contains(":~"), "the stand-in hold went: {value}");
}
