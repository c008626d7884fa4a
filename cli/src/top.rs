//! `tollgate top`: the buckets of a policy nearest their limit, found with a
//! bounded `SCAN`.

use std::cmp::Ordering;
use std::fmt::Write;

use serde_json::json;
use tollgate::store::{BucketScan, BucketState};
use tollgate::{Policy, RedisStore};

use crate::fail::Failure;
use crate::outcome::Outcome;
use crate::show::{human, millis};

/// What `top` was asked: the policy, how many buckets to show, how many
/// keys the scan may visit.
#[derive(Debug)]
pub(crate) struct Top<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) limit: usize,
    pub(crate) scan: u64,
}

/// Lists the buckets of the policy nearest their limit: the least left of
/// their capacity first, then the longest until full.
pub(crate) async fn top(store: &RedisStore, ask: &Top<'_>) -> Result<Outcome, Failure> {
    let name = ask.policy.name();
    let start = format!("{name}:");
    let scan = store.scan_buckets(&start, ask.scan).await?;
    let read = store.read_buckets(ask.policy, scan.keys()).await?;
    let mut buckets: Vec<BucketState> = read.into_iter().flatten().collect();
    // Keys of quotas the policy does not have (an older configuration), or
    // gone since the scan found them.
    let other = scan.keys().len() - buckets.len();
    buckets.sort_by(nearest_first);
    let found = buckets.len();
    buckets.truncate(ask.limit);

    let mut text = format!(
        "policy {}: {} of {found} buckets, nearest their limit first\n",
        name,
        buckets.len()
    );
    let _ = writeln!(
        text,
        "{:<32} {:<16} {:>9} {:>9} {:>9} {:>6}",
        "key", "quota", "remaining", "limit", "full in", "held"
    );
    let rows: Vec<_> = buckets
        .iter()
        .map(|b| {
            let key = b.client().strip_prefix(&start).unwrap_or(b.client());
            let quota = b.quota().to_string();
            let _ = writeln!(
                text,
                "{key:<32} {quota:<16} {:>9} {:>9} {:>9} {:>6}",
                b.remaining(),
                b.quota().capacity(),
                human(b.reset_after()),
                b.held()
            );
            json!({
                "key": key,
                "quota": quota,
                "storage_key": b.storage_key(),
                "limit": b.quota().capacity(),
                "remaining": b.remaining(),
                "reset_after_ms": millis(b.reset_after()),
                "held": b.held(),
                "holds": b.holds().len(),
            })
        })
        .collect();
    text.push_str(&summary(&scan, ask.scan, other));
    let json = json!({
        "policy": name,
        "buckets": rows,
        "scan": {
            "bounded": true,
            "max_visits": ask.scan,
            "complete": scan.complete(),
            "nodes": scan.nodes(),
            "calls": scan.calls(),
            "visited": scan.visited(),
            "total_keys": scan.total_keys(),
            "buckets_found": found,
            "keys_not_shown": other,
        },
    });
    Ok(Outcome::done(text, json))
}

/// The least left of its capacity first (compared exactly, as fractions),
/// then the longest until full, then by key.
fn nearest_first(a: &BucketState, b: &BucketState) -> Ordering {
    let share = |x: &BucketState, y: &BucketState| {
        u128::from(x.remaining()) * u128::from(y.quota().capacity())
    };
    share(a, b)
        .cmp(&share(b, a))
        .then(b.reset_after().cmp(&a.reset_after()))
        .then(a.storage_key().cmp(b.storage_key()))
}

/// How far the scan went, and that it was bounded.
fn summary(scan: &BucketScan, max_visits: u64, other: usize) -> String {
    let calls = match scan.calls() {
        1 => "1 SCAN call".to_owned(),
        n => format!("{n} SCAN calls"),
    };
    let servers = match scan.nodes() {
        1 => "1 server".to_owned(),
        n => format!("{n} primaries"),
    };
    let mut text = if scan.complete() {
        format!(
            "scan: {calls} on {servers} went through all {} keys, within its bound \
             (--scan {max_visits}): every bucket of the policy was found\n",
            scan.total_keys()
        )
    } else {
        format!(
            "scan: {calls} on {servers} visited about {} of {} keys and stopped at its bound \
             (--scan {max_visits}): buckets it did not reach are not shown (raise --scan to \
             go further)\n",
            scan.visited(),
            scan.total_keys()
        )
    };
    if other > 0 {
        let _ = writeln!(
            text,
            "{other} keys of the policy's name are not shown: kept for quotas it does not \
             have (an older configuration?), or gone since the scan"
        );
    }
    text
}
