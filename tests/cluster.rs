//! `RedisStore` on a real Redis Cluster (3 primaries, 3 replicas, started by
//! the harness): routing, exactness, `NOSCRIPT` per node, one round trip per
//! decision, and a primary killed under load.
//!
//! Starting a cluster takes a few seconds, so one test runs the scenarios
//! that need a healthy cluster one after another on one cluster, each with a
//! key prefix of its own; the failover has a cluster of its own. The two run
//! one at a time (a 2-core machine runs twelve redis-servers at best slowly).
#![cfg(feature = "cluster")]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use support::cluster::RedisCluster;
use support::node::Node;
use support::{failover, hammer};
use tollgate::{Policy, Quota, RateLimiter, RedisStore, Store};

/// One cluster at a time in this process (each test has its own runtime;
/// tokio's mutex works across them).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_scenarios_on_one_shared_cluster() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start();
    // The round-trip count needs a cluster nobody else talks to: first.
    one_round_trip_per_decision_summed_over_the_primaries(&cluster).await;
    script_flush_on_every_node_between_calls(&cluster).await;
    several_quotas_are_all_or_nothing_on_every_node(&cluster).await;
    ten_thousand_keys_spread_over_all_primaries(&cluster).await;
    four_limiters_on_one_hot_key_never_exceed_the_quota(&cluster).await;
    the_applications_cluster_pool_works_as_seeds_do(&cluster).await;
    #[cfg(feature = "test-util")]
    refunds_and_charges_decide_as_in_memory_on_every_node(&cluster).await;
    refunds_and_charges_batched_per_node_are_exact(&cluster).await;
    leases_on_every_primary_keep_the_bound(&cluster).await;
}

/// Leases on a cluster: 4 stores (instances) offer 6 keys, spread over the
/// primaries, twice their rate for 2 s. Lease requests and reports go in
/// each node's batches; per key, the admissions stay within capacity + rate
/// x the Redis time of the key's primary between a reading before the first
/// check and one after the last, and most are made in process.
async fn leases_on_every_primary_keep_the_bound(cluster: &RedisCluster) {
    use std::sync::atomic::{AtomicU64, Ordering};
    const KEYS: usize = 6;
    let stores: Vec<RedisStore> = (0..4)
        .map(|_| {
            cluster
                .store_builder("leased:")
                .leases(true)
                .lease_period(Duration::from_millis(200))
                .build()
                .unwrap()
        })
        .collect();
    let quota = Quota::per_second(400).unwrap();
    let policy = Arc::new(Policy::from(quota));
    let owners: Vec<_> = (0..KEYS)
        .map(|k| cluster.primary_for_key(&stores[0].bucket_key(&format!("k{k}"), &quota)))
        .collect();
    let ports: std::collections::BTreeSet<u16> = owners.iter().map(|o| o.port()).collect();
    assert!(ports.len() > 1, "all keys on one primary: pick others");
    let before: Vec<u64> = owners.iter().map(|o| o.time_us()).collect();
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for store in &stores {
        for k in 0..KEYS {
            let (store, policy, admitted) =
                (store.clone(), Arc::clone(&policy), Arc::clone(&admitted));
            // 200 checks a second per store and key: 800 against 400.
            tasks.push(tokio::spawn(async move {
                let start = tokio::time::Instant::now();
                let mut next = start;
                while start.elapsed() < Duration::from_secs(2) {
                    let d = store.check(&format!("k{k}"), &policy, 1).await.unwrap();
                    if d.allowed() {
                        admitted[k].fetch_add(1, Ordering::Relaxed);
                    }
                    next += Duration::from_millis(5);
                    tokio::time::sleep_until(next).await;
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    for (k, owner) in owners.iter().enumerate() {
        let after = owner.time_us();
        let n = admitted[k].load(Ordering::Relaxed);
        let bound = quota.capacity() + (after - before[k]) * 400 / 1_000_000;
        assert!(n <= bound, "key k{k}: {n} admitted, over the bound {bound}");
    }
    let local: u64 = stores.iter().map(|s| s.lease_stats().local_decisions).sum();
    let requests: u64 = stores.iter().map(|s| s.lease_stats().requests).sum();
    println!("cluster leases: {local} decisions in process, {requests} lease requests");
    assert!(local > 0, "no decision was made in process");
}

/// Checks, refunds and charges on 60 clients spread over the primaries, at
/// a clock the test sets: every decision is the memory store's (which the
/// model tests hold to the model), debt and the clamps included.
#[cfg(feature = "test-util")]
async fn refunds_and_charges_decide_as_in_memory_on_every_node(cluster: &RedisCluster) {
    use tollgate::MemoryStore;
    let store = cluster.store("settle-clock:");
    let memory = MemoryStore::new();
    let policy = Policy::new(
        "settle",
        [Quota::per_second(5).unwrap(), Quota::per_hour(40).unwrap()],
    )
    .unwrap();
    // A fixed pseudo-random walk (an LCG): the same steps on every run.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    };
    let mut now: u64 = 1_763_000_000_000_000;
    for step in 0..600 {
        now += next(400_000);
        let key = format!("client-{}", next(60));
        let op = next(4);
        if op == 0 {
            // A refund of up to 5 tokens, or a charge of up to 12.
            let delta = next(18) as i64 - 5;
            memory.adjust_at(&key, &policy, delta, now);
            store.adjust_at(&key, &policy, delta, now).await.unwrap();
        }
        let cost = if op == 0 { 0 } else { next(4) };
        let want = memory.check_at(&key, &policy, cost, now).unwrap();
        let got = store.check_at(&key, &policy, cost, now).await.unwrap();
        assert_eq!(got, want, "step {step}, {key}, op {op}, cost {cost}");
    }
}

/// The production path: 60 clients at once, each checked for 3 tokens,
/// refunded 2 and charged 1 through `RateLimiter`, batched per node: every
/// bucket ends 2 tokens down, exactly.
async fn refunds_and_charges_batched_per_node_are_exact(cluster: &RedisCluster) {
    let limiter = RateLimiter::new(
        cluster.store("settle:"),
        Policy::new(
            "settle",
            [Quota::new(10, Duration::from_secs(86_400)).unwrap()],
        )
        .unwrap(),
    );
    let tasks: Vec<_> = (0..60)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let key = format!("client-{i}");
                let decision = limiter.check(&key, 3).await.unwrap();
                assert!(decision.allowed());
                limiter.refund(&key, 2, &decision).await.unwrap();
                limiter.charge(&key, 1, &decision).await.unwrap();
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    for i in 0..60 {
        let left = limiter
            .peek(&format!("client-{i}"))
            .await
            .unwrap()
            .remaining();
        assert_eq!(left, 8, "client-{i}");
    }
}

/// After warm-up, K decisions sent one after the other are K `EVALSHA`s
/// summed over the primaries (nothing is in flight, so nothing is batched);
/// everything else the primaries count is what the script runs inside Redis
/// (one `TIME`, a `GET` per quota, a `SET` per admitted quota). Then K
/// decisions from 10 tasks at once: batched per node, at most K `EVALSHA`s
/// (and an `EVAL` per primary that loads the batch script), one `TIME` each,
/// at most one `GET` per bucket. The replicas serve
/// nothing: they only apply the primaries' writes.
async fn one_round_trip_per_decision_summed_over_the_primaries(cluster: &RedisCluster) {
    let policy = Policy::new(
        "trips",
        [
            Quota::per_second(1000).unwrap(),
            Quota::per_hour(100_000).unwrap(),
        ],
    )
    .unwrap();
    let store = cluster.store("trips:");
    let limiter = RateLimiter::new(store.clone(), policy.clone());
    let clients = cluster.limiter_clients_on_every_primary(&limiter, "c", 10);
    // Warm-up: the connections to every primary, the script on every primary,
    // the store's slot map.
    for (client, _) in &clients {
        let _ = limiter.check(client, 1).await.unwrap();
    }
    // Asked now: the harness's own CLUSTER NODES would count otherwise.
    let (primaries, replicas) = (cluster.primaries(), cluster.replicas());
    let summed = |primaries: &[Node]| {
        let mut summed: BTreeMap<String, u64> = BTreeMap::new();
        for p in primaries {
            let mut calls = p.all_calls();
            // The replicas' acknowledgements (REPLCONF ACK, once a second)
            // come over the replication link, not from the store.
            calls.remove("replconf");
            // The store's first read of the slot map runs in the background
            // after the warm-up's first check, and may land after the reset;
            // it is no round trip of a decision, and there is one.
            let map_reads = calls.remove("cluster|slots").unwrap_or(0);
            assert!(map_reads <= 1, "{p:?}: {map_reads} slot map reads");
            assert!(
                calls.get("evalsha").is_some_and(|n| *n > 0),
                "{p:?} decided nothing: {calls:?}"
            );
            for (command, n) in calls {
                *summed.entry(command).or_default() += n;
            }
        }
        summed
    };
    cluster.reset_stats_all();

    const K: u64 = 150;
    for i in 0..K {
        let (client, _) = &clients[i as usize % clients.len()];
        let _ = limiter.check(client, 1).await.unwrap();
    }
    let mut sequential = summed(&primaries);
    println!("cluster: commands on the primaries for {K} decisions in a row: {sequential:?}");
    // Inside the script: one TIME per decision, a GET per quota, a SET per
    // quota of an admitted decision. They are not round trips.
    assert_eq!(sequential.remove("time"), Some(K));
    assert_eq!(sequential.remove("get"), Some(2 * K));
    assert!(sequential.remove("set").is_some_and(|set| set <= 2 * K));
    assert_eq!(
        sequential,
        BTreeMap::from([("evalsha".to_string(), K)]),
        "commands sent to the primaries for {K} decisions"
    );

    cluster.reset_stats_all();
    let tasks: Vec<_> = (0..10)
        .map(|t| {
            let (limiter, clients) = (limiter.clone(), clients.clone());
            tokio::spawn(async move {
                for i in 0..K / 10 {
                    let (client, _) = &clients[(t * 7 + i as usize) % clients.len()];
                    let _ = limiter.check(client, 1).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let mut concurrent = summed(&primaries);
    println!("cluster: commands on the primaries for {K} decisions from 10 tasks: {concurrent:?}");
    let calls = concurrent.remove("evalsha").unwrap_or(0);
    // The first batches of several clients on each primary load the batch
    // script there: NOSCRIPT, then EVAL (both calls a primary has in flight
    // may find it missing).
    let reloads = concurrent.remove("eval").unwrap_or(0);
    assert!(reloads <= 2 * 3, "{reloads} EVALs");
    // One TIME per call (an EVALSHA, or the EVAL that completes it after
    // NOSCRIPT); each bucket read once per call (a client twice in one batch
    // is read once).
    assert_eq!(concurrent.remove("time"), Some(calls));
    assert!(concurrent.remove("get").is_some_and(|get| get <= 2 * K));
    assert!(concurrent.remove("set").is_some_and(|set| set <= 2 * K));
    assert!(concurrent.is_empty(), "{concurrent:?}");
    assert!((1..=K).contains(&calls), "{calls} calls for {K} decisions");
    for r in &replicas {
        let calls = r.all_calls();
        for command in ["evalsha", "eval", "get", "time"] {
            assert!(
                !calls.contains_key(command),
                "replica {r:?} served {command}: {calls:?}"
            );
        }
    }
}

/// Each node has its own script cache. After `SCRIPT FLUSH` on every node,
/// the first call on each primary gets `NOSCRIPT` and is answered with
/// `EVAL` on the same keys, routed to the same node, which caches the script
/// there: one `EVAL` per primary, never `SCRIPT LOAD`, and the buckets are
/// intact.
async fn script_flush_on_every_node_between_calls(cluster: &RedisCluster) {
    let quota = Quota::new(100, Duration::from_secs(24 * 3600)).unwrap();
    let store = cluster.store("flush:");
    let limiter = RateLimiter::new(store.clone(), quota);
    let clients = cluster.limiter_clients_on_every_primary(&limiter, "f", 4);
    for round in 1..=3u64 {
        for n in cluster.nodes() {
            let _: () = n.cmd(&["SCRIPT", "FLUSH"]);
        }
        cluster.reset_stats_all();
        // One by one: two calls racing on one node would both see NOSCRIPT.
        for (client, _) in &clients {
            let d = limiter.check(client, 1).await.unwrap();
            assert!(d.allowed());
            assert_eq!(d.remaining(), 100 - round, "{client} lost its bucket");
        }
        for p in cluster.primaries() {
            let calls = p.all_calls();
            assert_eq!(
                calls.get("eval"),
                Some(&1),
                "round {round}: {p:?} should reload the script once: {calls:?}"
            );
            assert!(!calls.contains_key("script|load"), "{calls:?}");
        }
        for r in cluster.replicas() {
            assert_eq!(r.calls("eval"), 0, "{r:?}");
        }
    }
}

/// Two quotas of one client share a slot (the `{hash tag}`), so one script
/// call decides both, on whichever primary owns the client, without
/// `CROSSSLOT`; a denial by one quota spends nothing from the other; a reset
/// deletes both.
async fn several_quotas_are_all_or_nothing_on_every_node(cluster: &RedisCluster) {
    // Refills of under a token an hour: the counts below are exact.
    let day = Duration::from_secs(24 * 3600);
    let half_day = Duration::from_secs(12 * 3600);
    let policy = Policy::new(
        "pair",
        [
            Quota::new(1000, day).unwrap(),
            Quota::new(3, half_day).unwrap(),
        ],
    )
    .unwrap();
    let store = cluster.store("pair:");
    let clients = cluster.clients_on_every_primary(&store, &policy.quotas()[0], "m", 5);
    for (client, owner) in &clients {
        for quota in policy.quotas() {
            let key = store.bucket_key(client, quota);
            assert_eq!(cluster.primary_for_key(&key).port(), *owner, "{key}");
        }
        for i in 1..=3u64 {
            let d = store.check(client, &policy, 1).await.unwrap();
            assert!(d.allowed(), "{client} check {i}");
            assert_eq!(d.states()[0].remaining(), 1000 - i);
            assert_eq!(d.states()[1].remaining(), 3 - i);
        }
        let d = store.check(client, &policy, 1).await.unwrap();
        assert!(!d.allowed(), "{client}: the second quota is spent");
        // The denial charged neither bucket.
        assert_eq!(d.states()[0].remaining(), 997, "{:?}", d.states());
        assert_eq!(d.states()[1].remaining(), 0, "{:?}", d.states());
        let d = store.check(client, &policy, 0).await.unwrap();
        assert_eq!(d.states()[0].remaining(), 997, "{:?}", d.states());
        let node = cluster.node(*owner);
        let pattern = format!("pair:{{{client}}}:*");
        let keys: Vec<String> = node.cmd(&["KEYS", &pattern]);
        assert_eq!(keys.len(), 2, "{client}'s buckets on {node:?}: {keys:?}");
        // A reset deletes both buckets with one DEL on that node.
        store.reset(client, &policy).await.unwrap();
        let keys: Vec<String> = node.cmd(&["KEYS", &pattern]);
        assert!(keys.is_empty(), "{keys:?}");
        let d = store.check(client, &policy, 1).await.unwrap();
        assert_eq!(d.states()[1].remaining(), 2, "{:?}", d.states());
    }
}

/// 10 000 clients land on all three primaries, about a third each.
async fn ten_thousand_keys_spread_over_all_primaries(cluster: &RedisCluster) {
    const CLIENTS: usize = 10_000;
    let store = cluster.store("spread:");
    let limiter = RateLimiter::new(store, Quota::per_hour(10).unwrap());
    let tasks: Vec<_> = (0..50)
        .map(|t| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                for i in (t..CLIENTS).step_by(50) {
                    let d = limiter.check(&format!("client:{i}"), 1).await.unwrap();
                    assert!(d.allowed());
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let per_primary: BTreeMap<u16, usize> = cluster
        .key_names_per_primary()
        .into_iter()
        .map(|(port, keys)| {
            (
                port,
                keys.iter().filter(|k| k.starts_with("spread:")).count(),
            )
        })
        .collect();
    println!("cluster: {CLIENTS} keys per primary: {per_primary:?}");
    assert_eq!(per_primary.len(), 3);
    assert_eq!(per_primary.values().sum::<usize>(), CLIENTS);
    for (port, n) in &per_primary {
        // A third is 3333; CRC16 over 10 000 keys strays by ~50.
        assert!(
            (2_500..=4_200).contains(n),
            "primary {port} holds {n} of {CLIENTS}: {per_primary:?}"
        );
    }
}

/// The bound of `tests/concurrency.rs` on a cluster: 4 limiters, each with
/// its own cluster connection (as 4 application instances), 64 tasks on one
/// hot key for 3 seconds.
async fn four_limiters_on_one_hot_key_never_exceed_the_quota(cluster: &RedisCluster) {
    let limiters: Vec<_> = (0..4)
        .map(|_| RateLimiter::new(cluster.store("exact:"), hammer::quota()))
        .collect();
    for l in &limiters {
        let _ = l.peek("warm-up").await.unwrap();
    }
    // The limiters keep the key behind their policy's name.
    let key = cluster
        .store("exact:")
        .bucket_key("default:hot", &hammer::quota());
    let owner = cluster.primary_for_key(&key);
    let outcome = hammer::hammer(&limiters, move || owner.time_us()).await;
    hammer::assert_bounds("cluster", &outcome);
}

/// The application's own deadpool-redis cluster pool: one connection taken
/// and kept, decisions routed as with seeds.
async fn the_applications_cluster_pool_works_as_seeds_do(cluster: &RedisCluster) {
    let pool = deadpool_redis::cluster::Config::from_urls(cluster.seed_urls())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("cluster pool");
    let store = RedisStore::builder()
        .leases(false)
        .cluster_pool(pool.clone())
        .prefix("pool:")
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    assert!(store.ping().await.is_ok());
    let quota = Quota::per_hour(5).unwrap();
    for (client, owner) in cluster.clients_on_every_primary(&store, &quota, "p", 2) {
        let d = store.check(&client, &Policy::from(quota), 1).await.unwrap();
        assert_eq!(d.remaining(), 4);
        let key = store.bucket_key(&client, &quota);
        let exists: i64 = cluster.node(owner).cmd(&["EXISTS", &key]);
        assert_eq!(exists, 1, "{key} on port {owner}");
    }
    // Taken from the pool for good: the pool holds nothing.
    assert_eq!(pool.status().size, 0);
    // deadpool-redis builds its cluster client with redis-rs's 16 retries,
    // which resend a call after a broken connection: a refund is never sent
    // on it, and its tokens stay spent.
    let limiter = RateLimiter::new(store, quota);
    let decision = limiter.check("refunded", 3).await.unwrap();
    let refused = limiter.refund("refunded", 2, &decision).await.unwrap_err();
    assert!(refused.to_string().contains("cluster pool"), "{refused}");
    assert_eq!(limiter.peek("refunded").await.unwrap().remaining(), 2);
    // Charges, which only limit more when resent, go as checks do.
    limiter.charge("refunded", 1, &decision).await.unwrap();
    assert_eq!(limiter.peek("refunded").await.unwrap().remaining(), 1);
}

/// Redis runs a refund and the connection breaks before its reply comes
/// back (a proxy in front of the key's primary, announced in its place,
/// cuts it): the refund is made once. redis-rs's cluster client resends a
/// call on its own after a broken connection, up to its retries (16 by
/// default), which would give back 1 token a time up to the full bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_whose_reply_is_lost_is_made_once_on_a_cluster() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start_without_replicas();
    let quota = Quota::per_hour(10).unwrap();
    let finder = RateLimiter::new(cluster.store("cut:"), quota);
    let (key, owner) = cluster.limiter_clients_on_every_primary(&finder, "k", 1)[0].clone();
    let owner = cluster.node(owner);
    // Asked now: the harness finds nodes by the ports they announce.
    let primaries = cluster.primaries();
    let proxy = support::Proxy::start(owner.port());
    let bus = owner.bus_port().expect("a cluster node has a bus port");
    let _: () = owner.cmd(&[
        "CONFIG",
        "SET",
        "cluster-announce-port",
        &proxy.port().to_string(),
        "cluster-announce-bus-port",
        &bus.to_string(),
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !primaries.iter().all(|p| {
        let slots = support::cluster::parse_cluster_slots(p.cmd(&["CLUSTER", "SLOTS"]));
        slots.is_ok_and(|s| s.iter().any(|r| r.primary == proxy.port()))
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "the nodes never announced the proxy"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Connected from now on: through the proxy.
    let limiter = RateLimiter::new(cluster.store("cut:"), quota);
    let decision = limiter.check(&key, 5).await.unwrap();
    assert_eq!(decision.remaining(), 5);
    let script_calls = || owner.calls("evalsha") + owner.calls("eval");
    let before = script_calls();
    proxy.lose_script_replies(true);
    let lost = limiter.refund(&key, 1, &decision).await;
    // A resend still on its way reaches Redis meanwhile (the proxy cuts
    // replies only), and is counted below.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.lose_script_replies(false);
    assert!(lost.is_err(), "{lost:?}");
    assert_eq!(script_calls() - before, 1, "the refund was sent once");
    assert_eq!(limiter.peek(&key).await.unwrap().remaining(), 6);
}

/// How the primary of the hot key fails.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// SIGKILL: its sockets close, clients see it at once.
    Kill,
    /// SIGKILL after its replica was cut off for this long (the replica
    /// frozen, its link dropped, so it cannot reconnect): the primary's
    /// writes of that time never reach the replica that takes over.
    KillWithLaggingReplica(Duration),
    /// SIGSTOP: its sockets stay open and nothing answers, as when a host or
    /// its network dies without a word (a half-open connection).
    Freeze,
}

/// A primary fails while 8 tasks check keys on every node: its replica is
/// promoted, every limiter decides again within seconds, every error on the
/// way is a store error, and what was admitted too much is what the old
/// primary had acknowledged but not yet replicated (see
/// `tests/support/failover.rs`).
///
/// Three times on one cluster, each on a shard that still has a replica: a
/// plain kill (on loopback the replica is microseconds behind: as a rule
/// nothing is lost), a kill after the replica was cut off for 300 ms (the
/// over-admission a lagging replica allows, measured), and a frozen primary
/// (a connection that never answers nor closes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_primary_killed_under_load_fails_over() {
    let _serial = SERIAL.lock().await;
    let cluster = Arc::new(RedisCluster::start());
    let lag = Duration::from_millis(300);
    for fault in [
        Fault::Kill,
        Fault::KillWithLaggingReplica(lag),
        Fault::Freeze,
    ] {
        let report = fail_a_primary_under_load(&cluster, fault).await;
        // Seen: 0.04-2.0 s. Recovery can chain a probe's timeout (1 s), the
        // connection replaced at most once a second, a connect to a frozen
        // node and a breaker cool-down: room for a busy machine.
        assert!(
            report.promoted_to_resumed <= Duration::from_secs(10),
            "{fault:?}: checks resumed {:?} after the promotion",
            report.promoted_to_resumed
        );
        if let Fault::KillWithLaggingReplica(_) = fault {
            // The cut-off replica missed the admissions of the last 300 ms:
            // the measurement must see them, or it proves nothing.
            assert!(
                report.lost_seen > 0,
                "the replica missed nothing: {report:?}"
            );
        }
    }
}

/// One failover under load, on the shard of a hot key whose primary still
/// has a replica.
async fn fail_a_primary_under_load(cluster: &Arc<RedisCluster>, fault: Fault) -> failover::Report {
    let prefix = format!("{fault:?}:")
        .to_ascii_lowercase()
        .replace(['(', ')', ' ', '.'], "");
    let timeout = Duration::from_secs(1);
    let limiters: Vec<_> = (0..2)
        .map(|_| {
            RateLimiter::new(
                cluster
                    .store_builder(&prefix)
                    .timeout(timeout)
                    .build()
                    .expect("cluster store"),
                failover::quota(),
            )
        })
        .collect();
    let store = cluster
        .store_builder(&prefix)
        .timeout(timeout)
        .build()
        .expect("cluster store");
    let quota = failover::quota();
    let replica_of = |primary: &Node| {
        cluster
            .replicas()
            .into_iter()
            .find(|r| r.info("replication")["master_port"] == primary.port().to_string())
    };
    let (hot, victim, heir) = (0..)
        .find_map(|i| {
            let hot = format!("hot{i}");
            // The limiters keep the key behind their policy's name.
            let victim =
                cluster.primary_for_key(&store.bucket_key(&format!("default:{hot}"), &quota));
            replica_of(&victim).map(|heir| (hot, victim, heir))
        })
        .unwrap();
    let others: Vec<String> = cluster
        .limiter_clients_on_every_primary(&limiters[0], "o", 4)
        .into_iter()
        .map(|(client, _)| client)
        .collect();
    for l in &limiters {
        let _ = l.check(&hot, 1).await.unwrap();
        for o in &others {
            let _ = l.check(o, 1).await.unwrap();
        }
    }
    let survivor = cluster
        .primaries()
        .into_iter()
        .find(|p| *p != victim)
        .unwrap();
    let kill = {
        let (victim, heir) = (victim.clone(), heir.clone());
        move || match fault {
            Fault::Kill => victim.kill(),
            Fault::KillWithLaggingReplica(lag) => {
                heir.freeze();
                let _: i64 = victim.cmd(&["CLIENT", "KILL", "TYPE", "replica"]);
                std::thread::sleep(lag);
                victim.kill();
                heir.thaw();
            }
            Fault::Freeze => victim.freeze(),
        }
    };
    let promoted = {
        let cluster = Arc::clone(cluster);
        let victim = victim.clone();
        move || {
            let new = cluster.wait_for_failover(&victim);
            assert_eq!(new, heir);
            println!("cluster: {victim:?} replaced by {new:?}");
        }
    };
    let report = failover::kill_under_load(
        &format!("cluster, {fault:?}"),
        &limiters,
        &hot,
        &others,
        move || survivor.time_us(),
        kill,
        promoted,
    )
    .await;
    assert_ne!(
        cluster.primary_for_key(&store.bucket_key(&format!("default:{hot}"), &quota)),
        victim
    );
    // A frozen primary stays out of the way: gone for good.
    victim.kill();
    report
}

#[test]
fn cluster_configuration_mistakes_are_refused_at_build() {
    let refused = support::refused_at_build;
    let none: [&str; 0] = [];
    let m = refused(RedisStore::builder().leases(false).cluster(none));
    assert!(m.contains("at least one seed"), "{m}");
    let m = refused(
        RedisStore::builder()
            .leases(false)
            .cluster(["redis://:s3cret@127.0.0.1:7000/3"]),
    );
    assert!(m.contains("only database 0"), "{m}");
    let m = refused(
        RedisStore::builder()
            .leases(false)
            .cluster(["redis://:s3cret@127.0.0.1:notaport"]),
    );
    assert!(m.contains("127.0.0.1"), "{m}");
    let m = refused(
        RedisStore::builder()
            .leases(false)
            .cluster(["redis://:s3cret@10.0.0.1:7000", "redis://:other@10.0.0.2"]),
    );
    assert!(m.contains("password"), "{m}");
    let m = refused(
        RedisStore::builder()
            .leases(false)
            .cluster(["redis://:s3cret@10.0.0.1:7000", "rediss://10.0.0.2"]),
    );
    assert!(m.contains("mix"), "{m}");
    // Nothing connects before the first check: unreachable seeds build.
    let store = RedisStore::from_cluster_urls(["redis://:s3cret@10.0.0.1:7000"]).unwrap();
    assert!(store.host().contains("10.0.0.1:7000"), "{}", store.host());
    assert!(!format!("{store:?}").contains("s3cret"));
    let debug = format!(
        "{:?}",
        RedisStore::builder()
            .leases(false)
            .cluster(["redis://:s3cret@10.0.0.1:7000"])
    );
    assert!(!debug.contains("s3cret"), "{debug}");
}

/// A primary that hangs (frozen: its connections neither answer nor close)
/// while the others answer: the store's breaker, which their answers keep
/// closed, never opens for it, so the node has a breaker of its own. After
/// a few timeouts its clients' checks fail at once (to the fallback, or the
/// store-error policy), while the other primaries' clients go on.
#[cfg(feature = "test-util")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_fails_fast_while_the_others_answer() {
    use tollgate::Error;
    use tollgate::store::CircuitBreaker;
    let _serial = SERIAL.lock().await;
    // No failover during the test: the node stays frozen.
    let cluster = RedisCluster::start_with_node_timeout(60_000);
    let never = Duration::from_secs(60);
    let store = cluster
        .store_builder("hung:")
        .timeout(Duration::from_millis(300))
        // No probe during the test: once open, every check fails at once.
        .circuit_breaker(CircuitBreaker::new().first_probe(never).max_cooldown(never))
        .build()
        .expect("cluster store");
    let quota = Quota::per_second(1_000_000).unwrap();
    let policy = Policy::from(quota);
    let clients = cluster.clients_on_every_primary(&store, &quota, "c", 1);
    for _ in 0..200 {
        for (client, _) in &clients {
            assert!(store.check(client, &policy, 1).await.unwrap().allowed());
        }
        if store.has_slot_map() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(store.has_slot_map(), "the store never read the slot map");
    let (hung, port) = clients[0].clone();
    let node = cluster.node(port);
    node.freeze();
    let (mut timeouts, mut fast) = (0, 0);
    for _ in 0..40 {
        for (client, _) in &clients[1..] {
            let d = store.check(client, &policy, 1).await;
            assert!(d.is_ok_and(|d| d.allowed()), "a healthy primary's client");
        }
        match store.check(&hung, &policy, 1).await {
            Err(Error::Timeout(_)) => timeouts += 1,
            Err(Error::CircuitOpen { .. }) => fast += 1,
            other => panic!("the hung primary's client: {other:?}"),
        }
    }
    node.thaw();
    assert!(timeouts <= 3, "{timeouts} checks waited the whole timeout");
    assert_eq!(fast + timeouts, 40);

    // Recovery: the node's breaker lets one check through as its probe, on
    // its own, and closes once the node answers; callers that give up while
    // their check is the probe (the node still frozen) do not stop that.
    let quick = Duration::from_millis(100);
    let store = cluster
        .store_builder("hung2:")
        .timeout(Duration::from_millis(300))
        .circuit_breaker(CircuitBreaker::new().first_probe(quick).max_cooldown(quick))
        .build()
        .expect("cluster store");
    for _ in 0..200 {
        for (client, _) in &clients {
            let _ = store.check(client, &policy, 1).await;
        }
        if store.has_slot_map() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(store.has_slot_map(), "the store never read the slot map");
    node.freeze();
    let mut opened = false;
    for _ in 0..50 {
        if let Err(Error::CircuitOpen { .. }) = store.check(&hung, &policy, 1).await {
            opened = true;
            break;
        }
    }
    assert!(opened, "the node's breaker never opened");
    for _ in 0..10 {
        let _ = tokio::time::timeout(quick / 2, store.check(&hung, &policy, 1)).await;
        tokio::time::sleep(quick).await;
    }
    node.thaw();
    let thawed = std::time::Instant::now();
    while store.check(&hung, &policy, 1).await.is_err() {
        assert!(
            thawed.elapsed() < Duration::from_secs(20),
            "the hung primary's clients were refused for good after it came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
