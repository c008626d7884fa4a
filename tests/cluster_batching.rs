//! Batching per node on a real Redis Cluster (3 primaries, 3 replicas): a
//! batch of checks whose clients live in several slots of one primary goes
//! as one script call, and answers exactly as the checks sent one by one;
//! under load fewer calls than decisions reach the primaries; a slot moved
//! while the store holds the old slot map costs no token and no partial
//! write, and batching resumes.
//!
//! One cluster for every scenario, one after the other (a 2-core machine
//! runs six redis-servers slowly enough); each scenario has its own keys.
#![cfg(all(feature = "cluster", feature = "test-util"))]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_redis::redis;
use proptest::test_runner::TestCaseError;
use support::batches::{Check, batch_equals_one_by_one, policies, run_guarded, steps};
use support::cluster::RedisCluster;
use support::far;
use support::node::Node;
use tollgate::{MemoryStore, Policy, Quota, RateLimiter, RedisStore, Store};

const T0: u64 = 1_763_000_000_000_000;

/// Commands the primaries counted since their stats were reset, summed
/// (the replicas' `REPLCONF ACK` left out).
fn summed_calls(primaries: &[Node]) -> BTreeMap<String, u64> {
    let mut summed: BTreeMap<String, u64> = BTreeMap::new();
    for p in primaries {
        for (command, n) in p.all_calls() {
            if command != "replconf" {
                *summed.entry(command).or_default() += n;
            }
        }
    }
    summed
}

#[test]
fn cluster_batching_scenarios_on_one_shared_cluster() {
    let cluster = Arc::new(RedisCluster::start());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    cluster_batches_answer_as_their_checks_sent_one_by_one(&cluster, &runtime);
    runtime.block_on(cluster_batching_under_load_sends_fewer_calls_and_stays_exact(&cluster));
    runtime.block_on(cluster_slot_moved_under_a_stale_map_with_explicit_batches(
        &cluster,
    ));
    runtime.block_on(cluster_slot_moved_under_load_loses_no_token(Arc::clone(
        &cluster,
    )));
    runtime.block_on(
        cluster_batch_sent_on_by_ask_never_reads_a_client_left_behind(Arc::clone(&cluster)),
    );
    runtime.block_on(cluster_concurrent_checks_each_get_their_own_answer(
        &cluster,
    ));
    runtime.block_on(cluster_batches_of_1024_keep_every_key_until_its_bucket_is_full(&cluster));
}

/// Random sequences of batches over 9 clients, three on each primary (so a
/// batch spans every primary and repeats clients): the batch, sent as one
/// call per node, answers as the same checks sent one by one at the same
/// clock, and as the in-memory store. One batch of 9 checks, three per
/// primary, is three calls.
fn cluster_batches_answer_as_their_checks_sent_one_by_one(
    cluster: &RedisCluster,
    runtime: &tokio::runtime::Runtime,
) {
    let batched = cluster.store("eq:batched:");
    let single = cluster.store("eq:single:");
    let policies = policies();
    let cases = std::sync::atomic::AtomicU64::new(0);
    let run_case = |steps: &[(u64, Vec<Check>)]| -> Result<(), TestCaseError> {
        let case = cases.fetch_add(1, Ordering::Relaxed);
        let clients: Vec<String> = cluster
            .clients_on_every_primary(
                &batched,
                &policies[0].quotas()[0],
                &format!("case{case}"),
                3,
            )
            .into_iter()
            .map(|(c, _)| c)
            .collect();
        let memory = MemoryStore::new();
        let mut now = T0;
        for (elapsed, checks) in steps {
            now += elapsed;
            let list: Vec<(&str, &Policy, u64)> = checks
                .iter()
                .map(|(c, p, cost)| (clients[*c].as_str(), &policies[*p], *cost))
                .collect();
            batch_equals_one_by_one(runtime, &batched, &single, &memory, &list, now, T0)?;
        }
        Ok(())
    };
    let primaries = cluster.primaries();
    run_guarded(
        48,
        steps(9, 16),
        || {
            primaries
                .iter()
                .map(|p| p.info("stats")["expired_keys"].parse::<u64>().unwrap())
                .sum()
        },
        || {
            for p in &primaries {
                let _: () = p.cmd(&["FLUSHALL"]);
            }
        },
        run_case,
    );

    // Nine clients, three per primary, twice each: one call per primary.
    let quota = Quota::per_hour(100).unwrap();
    let policy = Policy::from(quota);
    let clients = cluster.clients_on_every_primary(&batched, &quota, "calls", 3);
    let list: Vec<(&str, &Policy, u64)> = clients
        .iter()
        .chain(&clients)
        .map(|(c, _)| (c.as_str(), &policy, 1))
        .collect();
    let primaries = cluster.primaries();
    cluster.reset_stats_all();
    let decisions = runtime.block_on(batched.check_batch_at(&list, T0)).unwrap();
    for (i, d) in decisions.iter().enumerate() {
        let expected = if i < clients.len() { 99 } else { 98 };
        assert!(d.allowed());
        assert_eq!(d.remaining(), expected, "check {i}");
    }
    for p in &primaries {
        let calls = p.all_calls();
        assert_eq!(calls.get("evalsha"), Some(&1), "{p:?}: {calls:?}");
        // Each bucket read once, written twice.
        assert_eq!(calls.get("get"), Some(&3), "{p:?}: {calls:?}");
        assert_eq!(calls.get("set"), Some(&6), "{p:?}: {calls:?}");
    }
}

/// 3 000 checks from 40 tasks through two stores (two application
/// instances) over 300 clients on every primary: fewer script calls than
/// decisions reach the primaries, and every bucket holds exactly what was
/// taken from it (buckets of 1 000 tokens refilling over 30 days: the run
/// adds no token).
async fn cluster_batching_under_load_sends_fewer_calls_and_stays_exact(cluster: &RedisCluster) {
    let quota = Quota::new(1000, Duration::from_secs(30 * 24 * 3600)).unwrap();
    let stores = [cluster.store("load:"), cluster.store("load:")];
    let limiters: Vec<RateLimiter> = stores
        .iter()
        .map(|s| RateLimiter::new(s.clone(), quota))
        .collect();
    let clients: Arc<Vec<String>> = Arc::new((0..300).map(|i| format!("user:{i}")).collect());
    // Warm-up: connections, scripts and slot maps; one token each.
    for l in &limiters {
        let _ = l.check("warm-up", 1).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let primaries = cluster.primaries();
    cluster.reset_stats_all();
    const TASKS: usize = 40;
    const EACH: usize = 75;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let limiter = limiters[t % 2].clone();
            let clients = Arc::clone(&clients);
            tokio::spawn(async move {
                let mut admitted = 0;
                for i in 0..EACH {
                    let client = &clients[(t * EACH + i) % clients.len()];
                    if limiter.check(client, 1).await.unwrap().allowed() {
                        admitted += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    let decisions = (TASKS * EACH) as u64;
    let calls = summed_calls(&primaries);
    // A call is an EVALSHA, followed by an EVAL where the node lacked the
    // script (NOSCRIPT): each sent command counts here.
    let evalsha = calls.get("evalsha").copied().unwrap_or(0);
    let sent = evalsha + calls.get("eval").copied().unwrap_or(0);
    println!(
        "cluster batching: {decisions} decisions, {sent} script commands ({:.3} per decision): {calls:?}",
        sent as f64 / decisions as f64
    );
    assert_eq!(admitted, decisions, "every check fits its bucket");
    assert!(
        sent < decisions,
        "{sent} commands for {decisions} decisions"
    );
    assert_eq!(calls.get("time"), Some(&evalsha), "one TIME per call");
    // Each of the 300 buckets lost exactly the checks it answered: 10 each.
    for client in clients.iter() {
        // The limiters keep each key behind their policy's name.
        let d = stores[0]
            .check(&format!("default:{client}"), &quota.into(), 0)
            .await
            .unwrap();
        assert_eq!(d.remaining(), 990, "{client}");
    }
}

/// The slot of a client moves to another primary while the store holds the
/// old map: the batch the store sends to the old primary is refused there
/// before anything is written, its checks go one by one (routed to their
/// slots), and the answers are those of the in-memory store; the store then
/// reads the new map, and the next batch for the new primary is one call.
async fn cluster_slot_moved_under_a_stale_map_with_explicit_batches(cluster: &RedisCluster) {
    let quota = Quota::per_hour(20).unwrap();
    let policy = Policy::from(quota);
    let store = cluster.store("stale:");
    let clients = cluster.clients_on_every_primary(&store, &quota, "s", 3);
    let primaries = cluster.primaries();
    let (x, from) = clients[0].clone();
    let to = primaries.iter().find(|p| p.port() != from).unwrap().clone();
    let on = |port: u16| -> Vec<String> {
        clients
            .iter()
            .filter(|(c, p)| *p == port && *c != x)
            .map(|(c, _)| c.clone())
            .collect()
    };
    let (a, b) = (on(from), on(to.port()));
    let memory = MemoryStore::new();
    let mut now = T0;
    let run = async |names: Vec<&str>, now: u64| {
        let list: Vec<(&str, &Policy, u64)> = names.iter().map(|c| (*c, &policy, 1)).collect();
        let together = store.check_batch_at(&list, now).await.unwrap();
        for (i, c) in names.iter().enumerate() {
            let mem = memory.check_at(c, &policy, 1, now - T0).unwrap();
            assert_eq!(together[i], mem, "check {i} ({c}) of {names:?}");
        }
    };
    // The store reads the map; x and a's clients go together.
    run(
        vec![a[0].as_str(), x.as_str(), a[1].as_str(), b[0].as_str()],
        now,
    )
    .await;

    let slot = cluster.keyslot(&store.bucket_key(&x, &quota));
    cluster.move_slot(slot, &to);
    assert_eq!(cluster.primary_for_slot(slot), to);

    // The stale map puts x with a's clients, on the old primary.
    now += 1_000;
    cluster.reset_stats_all();
    run(
        vec![
            a[0].as_str(),
            x.as_str(),
            a[1].as_str(),
            x.as_str(),
            b[0].as_str(),
        ],
        now,
    )
    .await;
    let old = cluster.node(from);
    let calls = old.all_calls();
    // The refused batch, then a's two checks alone; only they wrote there.
    assert_eq!(calls.get("evalsha"), Some(&3), "{calls:?}");
    assert_eq!(calls.get("set"), Some(&2), "{calls:?}");
    let calls = to.all_calls();
    // x twice and b's check, each alone (b's was a batch of one).
    assert_eq!(calls.get("evalsha"), Some(&3), "{calls:?}");
    assert_eq!(calls.get("set"), Some(&3), "{calls:?}");

    // The store read the new map: x goes with b's clients, one call.
    now += 1_000;
    cluster.reset_stats_all();
    run(
        vec![
            x.as_str(),
            b[0].as_str(),
            x.as_str(),
            b[1].as_str(),
            a[0].as_str(),
        ],
        now,
    )
    .await;
    assert_eq!(to.all_calls().get("evalsha"), Some(&1));
    assert_eq!(old.all_calls().get("evalsha"), Some(&1));
}

/// 24 tasks through two stores check 300 clients (one of them, `hot`, every
/// fourth check) while `hot`'s slot moves to another primary, with both
/// stores holding the old map: every client is admitted exactly
/// `min(checks, 50)` times and its bucket holds the rest; then, under load
/// again, fewer calls than decisions reach the primaries.
async fn cluster_slot_moved_under_load_loses_no_token(cluster: Arc<RedisCluster>) {
    let quota = Quota::new(50, Duration::from_secs(30 * 24 * 3600)).unwrap();
    // No deny cache: every check of the spent hot client goes to Redis, so
    // batches hold it before, during and after the move.
    let store = |prefix: &str| {
        cluster
            .store_builder(prefix)
            .deny_cache(0)
            .build()
            .expect("cluster store")
    };
    let stores = [store("move:"), store("move:")];
    let limiters: Vec<RateLimiter> = stores
        .iter()
        .map(|s| RateLimiter::new(s.clone(), quota))
        .collect();
    for l in &limiters {
        let _ = l.peek("warm-up").await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for l in &limiters {
        let _ = l.peek("warm-up").await.unwrap();
    }
    let hot = "hot".to_string();
    // The limiters keep the key behind their policy's name.
    let slot = cluster.keyslot(&stores[0].bucket_key(&format!("default:{hot}"), &quota));
    let from = cluster.primary_for_slot(slot);
    let to = cluster
        .primaries()
        .into_iter()
        .find(|p| *p != from)
        .unwrap();
    let clients: Arc<Vec<String>> = Arc::new((0..300).map(|i| format!("m:{i}")).collect());

    let load = |limiters: Vec<RateLimiter>, done: Arc<AtomicBool>, at_least: usize| {
        let clients = Arc::clone(&clients);
        let hot = hot.clone();
        (0..24usize)
            .map(|t| {
                let limiter = limiters[t % limiters.len()].clone();
                let (clients, hot, done) = (Arc::clone(&clients), hot.clone(), Arc::clone(&done));
                tokio::spawn(async move {
                    let mut seen: BTreeMap<String, (u64, u64)> = BTreeMap::new();
                    let mut i = 0;
                    while i < at_least || !done.load(Ordering::Acquire) {
                        let client = if i % 4 == 0 {
                            &hot
                        } else {
                            &clients[(t * 7919 + i) % clients.len()]
                        };
                        let d = limiter.check(client, 1).await.unwrap();
                        let e = seen.entry(client.clone()).or_default();
                        e.0 += 1;
                        e.1 += u64::from(d.allowed());
                        i += 1;
                    }
                    seen
                })
            })
            .collect::<Vec<_>>()
    };

    let primaries = cluster.primaries();
    cluster.reset_stats_all();
    let moved = Arc::new(AtomicBool::new(false));
    let tasks = load(limiters.clone(), Arc::clone(&moved), 200);
    let mover = {
        let (cluster, to, moved) = (Arc::clone(&cluster), to.clone(), Arc::clone(&moved));
        tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(100));
            cluster.move_slot(slot, &to);
            moved.store(true, Ordering::Release);
        })
    };
    let mut totals: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for t in tasks {
        for (client, (checks, admitted)) in t.await.unwrap() {
            let e = totals.entry(client).or_default();
            e.0 += checks;
            e.1 += admitted;
        }
    }
    mover.await.unwrap();
    assert_eq!(cluster.primary_for_slot(slot), to);
    // A refused call's prologue stops at the first key this node does not
    // serve: Redis rejects that GET (it counts in `rejected_calls`).
    let calls = summed_calls(&primaries);
    let refused: u64 = primaries
        .iter()
        .map(|p| p.command_stat("get", "rejected_calls").unwrap_or(0.0) as u64)
        .sum();
    println!(
        "cluster slot move under load: {} checks of {hot}, {} admitted; \
         {refused} batches refused by a node that did not serve every key: {calls:?}",
        totals[&hot].0, totals[&hot].1
    );
    assert!(refused > 0, "the stale map was never used: {calls:?}");
    assert!(totals[&hot].0 > 50, "{hot} was not contended");
    for (client, (checks, admitted)) in &totals {
        assert_eq!(*admitted, (*checks).min(50), "{client}: {checks} checks");
        let d = stores[0]
            .check(&format!("default:{client}"), &quota.into(), 0)
            .await
            .unwrap();
        assert_eq!(d.remaining(), 50 - admitted, "{client}");
    }

    // Batching resumed: under load again, fewer calls than decisions.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fresh: Vec<RateLimiter> = stores
        .iter()
        .map(|s| RateLimiter::new(s.clone(), Quota::per_hour(100_000).unwrap()))
        .collect();
    cluster.reset_stats_all();
    let done = Arc::new(AtomicBool::new(true));
    let mut decisions = 0;
    for t in load(fresh, done, 100) {
        decisions += t.await.unwrap().values().map(|(c, _)| c).sum::<u64>();
    }
    let calls = summed_calls(&primaries);
    let sent = calls.get("evalsha").copied().unwrap_or(0) + calls.get("eval").copied().unwrap_or(0);
    println!("cluster after the move: {decisions} decisions, {sent} calls: {calls:?}");
    assert!(sent < decisions, "{sent} calls for {decisions} decisions");
}

/// Two clients whose buckets share a slot: `x` (no bucket yet) and `y` (its
/// bucket spent), while that slot migrates and `y` has not moved yet. A call
/// with both that the old primary sends on with `ASK` (for `x`, which it
/// lacks) must not reach the new primary with `y` undeclared, where `ASKING`
/// lets a script read `y` as missing (a full bucket: tokens created, and the
/// migration of `y` then fails with `BUSYKEY`, as it did before the fix).
/// The store sends `y` apart, to the old primary, and it is denied.
async fn cluster_batch_sent_on_by_ask_never_reads_a_client_left_behind(cluster: Arc<RedisCluster>) {
    let quota = Quota::per_hour(2).unwrap();
    let policy = Policy::from(quota);
    let store = cluster.store("ask:");
    // Two clients in one slot.
    let mut by_slot: BTreeMap<u16, String> = BTreeMap::new();
    let (x, y, slot) = (0..)
        .find_map(|i| {
            let client = format!("c{i}");
            let slot = cluster.keyslot(&store.bucket_key(&client, &quota));
            by_slot
                .insert(slot, client.clone())
                .map(|other| (client, other, slot))
        })
        .unwrap();
    let memory = MemoryStore::new();
    for now in [T0, T0 + 1] {
        let d = store.check_at(&y, &policy, 1, now).await.unwrap();
        assert_eq!(d, memory.check_at(&y, &policy, 1, now - T0).unwrap());
    }
    // The store's slot map: read now, before the move starts.
    let _ = store
        .check_batch_at(&[(&y, &policy, 0)], T0 + 2)
        .await
        .unwrap();
    let _ = memory.check_at(&y, &policy, 0, 2).unwrap();
    let from = cluster.primary_for_slot(slot);
    let to = cluster
        .primaries()
        .into_iter()
        .find(|p| *p != from)
        .unwrap();
    cluster.open_slot_move(slot, &to);
    let finish = {
        let (cluster, from, to) = (Arc::clone(&cluster), from.clone(), to.clone());
        let key = store.bucket_key(&y, &quota);
        tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(300));
            cluster.migrate_keys(&from, &to, &[key]);
            cluster.close_slot_move(slot, &from, &to);
        })
    };
    let now = T0 + 3;
    let list: Vec<(&str, &Policy, u64)> = vec![(&x, &policy, 1), (&y, &policy, 1)];
    let started = std::time::Instant::now();
    let together = store.check_batch_at(&list, now).await;
    let waited = started.elapsed();
    finish.await.unwrap();
    println!("cluster: a batch over a migrating slot took {waited:?}");
    let together = together.unwrap();
    for (i, (client, policy, cost)) in list.iter().enumerate() {
        let mem = memory.check_at(client, policy, *cost, now - T0).unwrap();
        assert_eq!(
            together[i], mem,
            "{client} ({i} of {x} and {y}, slot {slot})"
        );
    }
    assert!(!together[1].allowed(), "{y} was spent");
}

/// The production path on a cluster (`check`: a queue per primary, spread
/// batches, answers handed back): 33 clients, 11 on each primary, drained
/// to 33 levels (client `i` holds `i` tokens), check at once; each caller
/// gets its own client's answer, in fewer script calls than checks.
async fn cluster_concurrent_checks_each_get_their_own_answer(cluster: &RedisCluster) {
    let store = cluster.store("own:");
    let quota = Quota::per_hour(100).unwrap();
    let policy = Policy::from(quota);
    let clients: Vec<String> = cluster
        .clients_on_every_primary(&store, &quota, "own", 11)
        .into_iter()
        .map(|(c, _)| c)
        .collect();
    for (i, c) in (0u64..).zip(&clients) {
        let d = store.check(c, &policy, 100 - i).await.unwrap();
        assert!(d.allowed() && d.remaining() == i, "{c}: {d:?}");
    }
    let primaries = cluster.primaries();
    cluster.reset_stats_all();
    let barrier = Arc::new(tokio::sync::Barrier::new(clients.len()));
    let tasks: Vec<_> = clients
        .iter()
        .map(|c| {
            let (store, policy, c) = (store.clone(), policy.clone(), c.clone());
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                store.check(&c, &policy, 1).await.unwrap()
            })
        })
        .collect();
    for ((i, c), task) in (0u64..).zip(&clients).zip(tasks) {
        let d = task.await.unwrap();
        if i == 0 {
            assert!(!d.allowed() && d.remaining() == 0, "{c}: {d:?}");
        } else {
            assert!(d.allowed(), "{c}: {d:?}");
            assert_eq!(d.remaining(), i - 1, "{c}: {d:?}");
        }
    }
    let calls = summed_calls(&primaries);
    let sent = calls.get("evalsha").copied().unwrap_or(0) + calls.get("eval").copied().unwrap_or(0);
    println!(
        "cluster: {} concurrent checks in {sent} script calls: {calls:?}",
        clients.len()
    );
    assert!(
        sent < clients.len() as u64,
        "{sent} script calls for {} checks",
        clients.len()
    );
}

/// Batches of up to 1024 checks over three quotas (three keys a check): the
/// spread script reads thousands of keys before its body decides. Every
/// key must outlive its bucket's refill: it expires (`PEXPIRETIME`) no
/// sooner than its stamp plus the time to full, or a later call would read
/// it as a full bucket and hand out tokens early. The spread prologue reads
/// `TIME` before any key, so this holds whatever the prologue costs (see
/// `lua/cluster_batch.lua`).
async fn cluster_batches_of_1024_keep_every_key_until_its_bucket_is_full(cluster: &RedisCluster) {
    // One unit of level a microsecond (a token every `den` µs), so a
    // bucket's time to full is `full - level` µs exactly.
    let quotas = [
        (
            Quota::per_minute(1).unwrap().burst(10).unwrap(),
            60_000_000u64,
        ),
        (Quota::per_hour(10).unwrap(), 360_000_000),
        (
            Quota::new(5, Duration::from_secs(86_400)).unwrap(),
            17_280_000_000,
        ),
    ];
    let policy = Policy::new("three", quotas.iter().map(|(q, _)| *q)).unwrap();
    let store = cluster
        .store_builder("big:")
        .timeout(Duration::from_secs(30))
        .max_batch(1024)
        .build()
        .expect("cluster store");
    // The units of each quota, by the tail of its bucket keys.
    let units: Vec<(String, u64, u64)> = store
        .bucket_keys("c", &policy)
        .into_iter()
        .zip(&quotas)
        .map(|(key, (q, den))| {
            (
                key[key.find('}').unwrap()..].to_string(),
                q.capacity() * den,
                *den,
            )
        })
        .collect();
    let _ = store.check("warm-up", &policy, 0).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let primaries = cluster.primaries();
    cluster.reset_stats_all();
    // Every primary holds its clients for a moment, so the checks queue
    // behind the first call of each and go in large batches, however many
    // calls the store would otherwise keep in flight on a fast machine.
    for p in &primaries {
        let _: () = p.cmd(&["CLIENT", "PAUSE", "300", "ALL"]);
    }
    const CLIENTS: usize = 3_000;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move { store.check(&format!("b:{i}"), &policy, 1).await.unwrap() })
        })
        .collect();
    for t in tasks {
        let d = t.await.unwrap();
        assert!(d.allowed(), "{d:?}");
    }
    let calls = summed_calls(&primaries);
    let sent = calls.get("evalsha").copied().unwrap_or(0) + calls.get("eval").copied().unwrap_or(0);
    let per_call: Vec<f64> = primaries
        .iter()
        .filter_map(|p| p.command_stat("evalsha", "usec_per_call"))
        .collect();
    println!(
        "cluster: {CLIENTS} checks of 3 quotas with max_batch 1024: {sent} script calls, \
         {per_call:?} us per EVALSHA by primary: {calls:?}"
    );
    assert!(
        sent <= (CLIENTS / 100) as u64,
        "{sent} script calls for {CLIENTS} checks: no large batches"
    );

    let mut checked = 0;
    for p in &primaries {
        let keys: Vec<String> = p.cmd(&["KEYS", "big:*"]);
        let mut conn = p.conn();
        for key in keys {
            let Some((_, full, den)) = units.iter().find(|(t, _, _)| key.ends_with(t.as_str()))
            else {
                continue;
            };
            let (value, expires_ms): (Option<String>, i64) = redis::pipe()
                .cmd("GET")
                .arg(&key)
                .cmd("PEXPIRETIME")
                .arg(&key)
                .query(&mut conn)
                .unwrap();
            let Some(value) = value else { continue };
            let mut fields = value.split(':');
            let (level, stamp) = (fields.next().unwrap(), fields.next().unwrap());
            let (level, stamp): (u64, u64) = (level.parse().unwrap(), stamp.parse().unwrap());
            assert_eq!(*full - level, *den, "{key}: one token spent");
            let full_at = stamp + (full - level);
            let expires_us = u64::try_from(expires_ms).unwrap() * 1_000;
            assert!(
                expires_us >= full_at,
                "{key} expires at {expires_us} us, {} us before its bucket is full ({value})",
                full_at - expires_us
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 3 * CLIENTS, "keys checked");
}

/// With the cluster far away (a proxy holding every chunk 25 ms each way in
/// front of each of 3 primaries, announced in their place), a check under
/// moderate concurrency waits about one round trip, not one for its node's
/// call to end and then its own: 2 and then 6 callers per primary each check
/// in a loop, and after a warm-up the median check takes less than 1.5 times
/// a plain `PING` through a proxy. With one call at a time per primary, the
/// median is about two round trips.
#[test]
fn cluster_far_away_a_check_waits_one_round_trip_not_two() {
    const WARM_UP: usize = 10;
    const MEASURED: usize = 12;
    let cluster = RedisCluster::start_without_replicas();
    let quota = Quota::per_second(1_000_000).unwrap();
    let policy = Policy::from(quota);
    // Clients on every primary, found while the map still names the nodes.
    let seed = cluster.store("far:");
    let clients: Vec<String> = cluster
        .clients_on_every_primary(&seed, &quota, "far", 6)
        .into_iter()
        .map(|(client, _)| client)
        .collect();
    let primaries = cluster.primaries();
    let proxies: Vec<support::Proxy> = primaries
        .iter()
        .map(|p| support::Proxy::start_delayed(p.port(), Duration::from_millis(25)))
        .collect();
    for (p, proxy) in primaries.iter().zip(&proxies) {
        let port = proxy.port().to_string();
        let _: () = p.cmd(&["CONFIG", "SET", "cluster-announce-port", &port]);
    }
    let proxied: Vec<u16> = proxies.iter().map(support::Proxy::port).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !primaries.iter().all(|p| {
        let slots = support::cluster::parse_cluster_slots(p.cmd(&["CLUSTER", "SLOTS"]));
        slots.is_ok_and(|s| s.iter().all(|r| proxied.contains(&r.primary)))
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "the nodes never announced the proxies"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let ping = far::ping_median(&proxies[0].url());
    let store = RedisStore::builder()
        .leases(false)
        .cluster(proxies.iter().map(support::Proxy::url))
        .prefix("far:")
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for callers in [6, 18] {
        let keys = clients[..callers].to_vec();
        let took = runtime.block_on(far::check_times(&store, &policy, keys, WARM_UP, MEASURED));
        far::assert_about_one_round_trip(&format!("{callers} callers on 3 primaries"), ping, took);
    }
}
