//! The lease map's unit tests.

use std::sync::Arc;
use std::time::Duration;

use super::entry::{self, SHORT_NAME};
use super::sizing::decay;
use super::*;
use crate::decision::Decision;
use crate::policy::Policy;
use crate::quota::Quota;
use crate::store::key::safe_key;

pub(super) fn leases() -> Leases {
    let config = LeaseConfig {
        period: Duration::from_secs(1),
        max_keys: 100,
    };
    Leases::new(config, "test", None, Arc::from("t:"))
}

/// A grant of a request sent now (`leases`'s clock).
pub(super) fn grant(leases: &Leases, granted: u64, life: Duration) -> Grant {
    Grant {
        granted,
        sent: leases.now(),
        life,
        roomy: false,
        found: false,
    }
}

pub(super) fn policy(quotas: &[Quota]) -> Policy {
    Policy::new("p", quotas.iter().copied()).unwrap()
}

/// One check of `key` under `policy`: decided here or not, and the
/// errand it leaves.
pub(super) fn check(leases: &Leases, key: &str, policy: &Policy) -> (Option<Decision>, Errand) {
    let mut errand = Errand::default();
    let name = safe_key(key);
    let decided = leases.check(&name, policy, 1, &mut errand);
    (decided, errand)
}

/// Checks `key` until it asks for a lease, and answers it with a hold
/// of `granted` (id `id`).
pub(super) fn held(leases: &Leases, key: &str, policy: &Policy, id: u64, granted: u64) {
    let ask = (0..4)
        .find_map(|_| check(leases, key, policy).1.lease)
        .expect("a key checked four times at once asks for a lease");
    let back = leases.answered(
        &Asked { id, ..ask.asked },
        Some(grant(leases, granted, Duration::from_secs(60))),
    );
    assert!(back.is_empty(), "the hold is the key's");
}

#[test]
fn slow_quotas_get_no_leases() {
    let leases = leases();
    // At a 1 s period: 2 tokens a second pays, fewer does not.
    assert!(leases.pays_on(&policy(&[Quota::per_second(2).unwrap()])));
    assert!(leases.pays_on(&policy(&[Quota::per_hour(7_200).unwrap()])));
    assert!(!leases.pays_on(&policy(&[Quota::per_hour(7_199).unwrap()])));
    assert!(!leases.pays_on(&policy(&[Quota::per_hour(100).unwrap()])));
    let both = [
        Quota::per_second(100).unwrap(),
        Quota::per_hour(100).unwrap(),
    ];
    assert!(!leases.pays_on(&policy(&both)), "every quota must pay");
}

#[test]
fn a_key_seen_a_few_times_gets_no_lease() {
    let leases = leases();
    let p = policy(&[Quota::per_second(100).unwrap()]);
    for n in 1..=3 {
        let (decided, errand) = check(&leases, "few", &p);
        assert!(decided.is_none());
        assert!(errand.lease.is_none(), "check {n} asks for no lease");
    }
    // A fourth check at once shows demand: now it does.
    assert!(check(&leases, "few", &p).1.lease.is_some());
}

/// `look` at the entry of `key` under `policy` (`None`: no entry).
pub(super) fn with_entry<R>(
    leases: &Leases,
    key: &str,
    policy: &Policy,
    look: impl FnOnce(&entry::Entry) -> R,
) -> Option<R> {
    let name = safe_key(key);
    let hash = leases.hash(name.as_bytes());
    let shard = leases.table.shard(hash);
    shard
        .entries
        .find(hash, |e| e.is(name.as_bytes(), policy, &leases.starts))
        .map(look)
}

/// Whether the entry of `key` under `policy` has its cold part (`None`:
/// no entry).
fn has_cold(leases: &Leases, key: &str, policy: &Policy) -> Option<bool> {
    with_entry(leases, key, policy, |e| e.cold.is_some())
}

#[test]
fn a_key_that_never_asked_for_a_lease_has_no_cold_part() {
    let leases = leases();
    let p = policy(&[Quota::per_second(100).unwrap()]);
    for _ in 0..3 {
        check(&leases, "few", &p);
    }
    assert_eq!(has_cold(&leases, "few", &p), Some(false));
    // Its lease request makes it, and the answer finds it by its serial.
    held(&leases, "few", &p, 7, 50);
    assert_eq!(has_cold(&leases, "few", &p), Some(true));
    assert!(
        check(&leases, "few", &p).0.is_some(),
        "decided from the hold"
    );
    // A name too long for the entry's line keeps it in the cold part.
    let long = "l".repeat(SHORT_NAME + 1);
    check(&leases, &long, &p);
    assert_eq!(has_cold(&leases, &long, &p), Some(true));
}

#[test]
fn a_full_map_evicts_a_key_without_holds_first() {
    let config = LeaseConfig {
        period: Duration::from_secs(1),
        max_keys: 128,
    };
    let leases = Leases::new(config, "test", None, Arc::from("t:"));
    let p = policy(&[Quota::per_second(100).unwrap()]);
    // 16 shards of 8 keys; the held one is never the one evicted while
    // the first 8 looked at include a key without holds.
    held(&leases, "kept", &p, 7, 50);
    for i in 0..1000 {
        check(&leases, &format!("k{i}"), &p);
        assert_eq!(has_cold(&leases, "kept", &p), Some(true), "after k{i}");
        let len: usize = leases.table.shards().map(|s| s.entries.len()).sum();
        assert!(len <= 128, "{len} keys in a map of 128");
    }
    assert!(
        check(&leases, "kept", &p).0.is_some(),
        "its hold still pays"
    );
}

#[test]
fn a_lease_answered_after_a_reset_is_given_back_not_used() {
    let p = policy(&[Quota::per_second(100).unwrap()]);
    for reset in [false, true] {
        let leases = leases();
        let ask = (0..4)
            .find_map(|_| check(&leases, "c", &p).1.lease)
            .expect("a lease is asked for");
        if reset {
            leases.forget("c", &p, false, &mut Errand::default());
            // A check of the fresh bucket makes a fresh entry.
            assert!(check(&leases, "c", &p).0.is_none());
        }
        let back = leases.answered(
            &Asked { id: 7, ..ask.asked },
            Some(grant(&leases, 10, Duration::from_secs(60))),
        );
        let decided = check(&leases, "c", &p).0;
        if reset {
            let [back] = &back[..] else {
                panic!("the hold comes back to be reported")
            };
            assert_eq!((back.id, back.spent, back.left), (7, 0, 10));
            assert!(decided.is_none(), "the fresh entry spends no old hold");
            assert_eq!(leases.stats().outstanding, 0);
        } else {
            assert!(back.is_empty());
            assert!(decided.is_some(), "without a reset the hold is used");
        }
    }
}

#[test]
fn the_hold_that_ends_first_is_spent_first() {
    let leases = leases();
    let p = policy(&[Quota::per_second(100).unwrap()]);
    let ask = (0..4)
        .find_map(|_| check(&leases, "c", &p).1.lease)
        .expect("a lease is asked for");
    let answer = |id, granted, life| {
        let asked = Asked {
            id,
            name: ask.asked.name.clone(),
            keys: ask.asked.keys.clone(),
            policy: ask.asked.policy.clone(),
            ..ask.asked
        };
        leases.answered(&asked, Some(grant(&leases, granted, life)))
    };
    // A roomy hold, then a plain one behind it that ends much sooner.
    assert!(answer(1, 10, Duration::from_secs(60)).is_empty());
    assert!(answer(2, 5, Duration::from_secs(2)).is_empty());
    for left in (0..5).rev() {
        let decided = check(&leases, "c", &p).0.expect("decided here");
        assert_eq!(decided.remaining(), left, "spent from the plain hold");
    }
    let decided = check(&leases, "c", &p).0.expect("decided here");
    assert_eq!(decided.remaining(), 9, "then from the roomy one");
}

#[test]
fn a_reset_forgets_the_holds_of_every_policy_on_its_buckets() {
    let leases = leases();
    let per_second = Quota::per_second(10).unwrap();
    let reset = policy(&[per_second]);
    let sharing = policy(&[per_second, Quota::per_hour(1000).unwrap()]);
    let apart = policy(&[Quota::per_minute(20).unwrap()]);
    // Other figures over the same period: the same bucket.
    let changed = policy(&[Quota::per_second(20).unwrap()]);
    held(&leases, "c", &reset, 1, 5);
    held(&leases, "c", &sharing, 2, 5);
    held(&leases, "c", &apart, 3, 5);
    held(&leases, "c", &changed, 5, 5);
    // Another key whose name starts with this one's.
    held(&leases, "c2", &sharing, 4, 5);
    let mut errand = Errand::default();
    leases.forget("c", &reset, false, &mut errand);
    // The reset policy's hold went with its buckets; the sharing
    // policy's is reported, for its other bucket, and so is the changed
    // policy's (held under other figures).
    let mut ids: Vec<u64> = errand.reports.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [2, 5]);
    assert!(check(&leases, "c", &reset).0.is_none());
    assert!(check(&leases, "c", &changed).0.is_none());
    assert!(check(&leases, "c", &sharing).0.is_none());
    assert!(check(&leases, "c", &apart).0.is_some());
    assert!(check(&leases, "c2", &sharing).0.is_some());
}

/// A reset forgets a key's holds before its `DEL` and again after it:
/// a lease asked for by a check in between, and granted by Redis on the
/// old buckets just before the `DEL` deleted them (its answer coming
/// before the `DEL`'s), is never spent, and is reported (a report of a
/// hold the `DEL` took finds nothing).
#[test]
fn a_lease_granted_between_a_resets_forget_and_its_del_is_not_spent() {
    let leases = leases();
    let p = policy(&[Quota::per_second(100).unwrap()]);
    held(&leases, "c", &p, 1, 10);
    // The reset: forgotten before the DEL is sent.
    leases.forget("c", &p, false, &mut Errand::default());
    // Checks meanwhile make a fresh entry, which asks for a lease;
    // Redis grants it on the old buckets, and the answer arrives.
    held(&leases, "c", &p, 2, 10);
    // The DEL ran; the reset ends by forgetting again.
    let mut errand = Errand::default();
    leases.forget("c", &p, true, &mut errand);
    let ids: Vec<u64> = errand.reports.iter().map(|r| r.id).collect();
    assert_eq!(ids, [2], "the hold granted meanwhile is reported");
    assert!(
        check(&leases, "c", &p).0.is_none(),
        "a hold the DEL took was spent"
    );
}

/// A hold used up while the lease request carrying its partial report
/// is under way: the answer finding that report leaves the held count
/// right (it once took the partial tokens off a second time, which
/// wrapped the count and made the next grant panic on overflow in a
/// debug build), and the hold's final report debits only the rest.
#[test]
fn a_partial_report_answered_after_its_hold_was_used_up_counts_once() {
    let leases = leases();
    let p = policy(&[Quota::per_second(10).unwrap()]);
    held(&leases, "c", &p, 1, 20);
    // Spend until a lease is asked for; it carries a partial report.
    let mut ask = None;
    let mut spent = 0;
    while ask.is_none() {
        let (decided, errand) = check(&leases, "c", &p);
        assert!(decided.is_some(), "decided from the hold");
        spent += 1;
        ask = errand.lease;
    }
    let ask = ask.unwrap();
    assert_eq!(ask.asked.partial, Some((1, spent)));
    // Spend the rest of the hold while the request is under way.
    while spent < 20 {
        let (decided, _) = check(&leases, "c", &p);
        assert!(decided.is_some(), "decided from the hold");
        spent += 1;
    }
    // The next check finds it used up: it waits, spent whole, to be
    // reported.
    assert!(check(&leases, "c", &p).0.is_none());
    assert_eq!(leases.stats().held, 0);
    let partial = ask.asked.partial.unwrap().1;
    let back = leases.answered(
        &Asked { id: 2, ..ask.asked },
        Some(Grant {
            found: true,
            ..grant(&leases, 5, Duration::from_secs(60))
        }),
    );
    assert!(back.is_empty());
    assert_eq!(
        leases.stats().held,
        5,
        "the new hold's 5 tokens, and no more"
    );
    // A refund taken from the used-up hold: its report says it spent
    // what the partial report did not debit, less the refund (Redis
    // holds 20 - partial of it, and would clamp a larger figure there,
    // losing the refund).
    let (given, reports) = leases.refund(&safe_key("c"), &p, 3);
    assert_eq!(given, 3);
    let [first] = &reports[..] else {
        panic!("one report: {}", reports.len())
    };
    assert_eq!((first.id, first.spent), (1, 20 - partial - 3));
}

/// Every shard gets keys, and within a shard the tags the table gives
/// its slots (a hash's top 7 bits) still take most of their 128
/// values: the shard is not chosen by the same bits.
#[test]
fn shards_spread_keys_without_narrowing_their_tags() {
    let leases = Leases::new(
        LeaseConfig {
            period: Duration::from_secs(1),
            max_keys: DEFAULT_LEASE_KEYS,
        },
        "test",
        None,
        Arc::from("t:"),
    );
    let shards = leases.table.shard_count();
    assert_eq!(shards, 16);
    let mut tags = vec![std::collections::HashSet::new(); shards];
    for i in 0..16_000 {
        let hash = leases.hash(format!("p:header:x-client:c{i}").as_bytes());
        tags[leases.table.shard_index(hash)].insert(hash >> 57);
    }
    for (i, tags) in tags.iter().enumerate() {
        assert!(tags.len() >= 100, "shard {i}: {} tags of 128", tags.len());
    }
}

/// `decay` is `exp(-x)` to within 1e-14 on both sides of where its
/// series gives way to the library's.
#[test]
fn decay_is_exp() {
    for i in 0..=4096 {
        let x = f64::from(i) / 65536.0;
        assert!((decay(x) - (-x).exp()).abs() < 1e-14, "{x}");
    }
    assert_eq!(decay(0.0), 1.0);
    assert_eq!(decay(1.0), (-1.0f64).exp());
}

#[tokio::test(start_paused = true)]
async fn a_grant_of_nothing_keeps_the_key_from_asking_for_a_period() {
    let leases = leases();
    let p = policy(&[Quota::per_second(100).unwrap()]);
    let ask = (0..4)
        .find_map(|_| check(&leases, "dry", &p).1.lease)
        .expect("a key checked four times at once asks for a lease");
    let back = leases.answered(
        &Asked { id: 7, ..ask.asked },
        Some(grant(&leases, 0, Duration::from_secs(60))),
    );
    assert!(back.is_empty(), "nothing granted, nothing to give back");
    for n in 0..10 {
        let (decided, errand) = check(&leases, "dry", &p);
        assert!(decided.is_none(), "no hold to decide from");
        assert!(errand.lease.is_none(), "check {n} within the period asks");
    }
    tokio::time::advance(Duration::from_millis(1_001)).await;
    assert!(
        (0..4).any(|_| check(&leases, "dry", &p).1.lease.is_some()),
        "a period later it asks again"
    );
}
