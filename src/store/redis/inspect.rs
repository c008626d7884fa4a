//! Reading buckets as they are, by storage key, for operators' tools (the
//! `tollgate` command line): [`RedisStore::read_buckets`] and
//! [`BucketState`].
//!
//! A bucket is stored under a key that names its quota's period (a named
//! policy's, `}:1s`) or figures (the unnamed `default` policy's,
//! `}:10/s:b20`) as `"<level>:<stamp>:<full>,<num>[:<id,h,e>;...]"` (see
//! `lua/token_bucket.lua`): its level in units of `1 / den` token when it
//! was last written, the microsecond of Redis `TIME` it was written at, the
//! figures of the quota it was written under, and the holds of instances'
//! leases. Reading one carries it into the policy's quota (if it was written
//! under other figures), refills it to the server's `TIME` and debits the
//! holds whose expiry has passed, as the script does before a check, and
//! writes nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;
use tokio::task::JoinSet;

use super::store::RedisStore;
use crate::error::{Error, ErrorKind};
use crate::policy::Policy;
use crate::quota::{MAX_REPORTED_US, Quota};
use crate::store::bucket::{Level, signed};

/// Reads every key it is given and the server's clock, in one call on the
/// node that serves them (keys of one client share a slot). `false` for a
/// key with nothing stored.
const READ: &str = "local t = redis.call('TIME') \
    local out = {t[1], t[2]} \
    for i = 1, #KEYS do out[#out + 1] = redis.call('GET', KEYS[i]) end \
    return out";

/// The most read calls in flight at once: enough to pipeline on one
/// connection, few enough to leave room for the application's checks.
const IN_FLIGHT: usize = 32;

/// One bucket as Redis holds it now: what a check could spend, what
/// instances hold, and when it is full again. Made by
/// [`RedisStore::read_buckets`], whose docs show an example.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct BucketState {
    key: String,
    client: String,
    quota: Quota,
    remaining: u64,
    held: u64,
    reset_after: Duration,
    holds: Vec<BucketHold>,
}

impl BucketState {
    /// The storage key read.
    pub fn storage_key(&self) -> &str {
        &self.key
    }

    /// The client part of the key, between its braces: the key a check
    /// names, made safe ([`safe_key`](crate::store::safe_key)), after its
    /// policy's name (`api:user:42`, `api:ip:203.0.113.7`).
    pub fn client(&self) -> &str {
        &self.client
    }

    /// The quota the bucket was read under: the policy's quota of the
    /// period the key names.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// Whole tokens a check may spend now: the level less what every
    /// instance holds, as a check's `remaining` counts them; none while the
    /// bucket is stamped ahead of the server's clock (locked out,
    /// [`Quota::lockout`]).
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Whole tokens set aside for instances by their leases.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Time until the bucket is full again, holds debited, if nothing is
    /// spent meanwhile (zero: full).
    pub fn reset_after(&self) -> Duration {
        self.reset_after
    }

    /// The holds on the bucket that have not expired.
    pub fn holds(&self) -> &[BucketHold] {
        &self.holds
    }
}

/// Tokens of a bucket set aside for one instance by a lease (see
/// [leases](crate::store#leases)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct BucketHold {
    id: String,
    tokens: u64,
    expires_in: Duration,
}

impl BucketHold {
    /// The hold's id, as the script wrote it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whole tokens held.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Time until the hold expires and, unless its holder reports first, is
    /// debited whole.
    pub fn expires_in(&self) -> Duration {
        self.expires_in
    }
}

impl RedisStore {
    /// The buckets of `policy` stored under `storage_keys` (as
    /// [`bucket_key`](Self::bucket_key) makes them, or as a
    /// [`scan_buckets`](Self::scan_buckets) finds them), refilled to the
    /// server's clock, in the order given. Writes nothing.
    ///
    /// A key names its quota's period, not its figures: each bucket is read
    /// under the policy's quota of that period, carried into it as the next
    /// check would carry it if it was written under other figures (see
    /// [changing limits](crate::layer::PolicyTable::swap)).
    ///
    /// `None` for a key under which no bucket is stored (a check would find
    /// it full), that is not a bucket key of this store's prefix, or whose
    /// period is none of the policy's quotas'. The keys of one client are
    /// read in one call, on the node that serves them; several clients'
    /// calls run side by side, each bounded by the store timeout. The
    /// circuit breaker neither refuses nor counts them.
    ///
    /// ```no_run
    /// use tollgate::{Policy, Quota, RedisStore};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::from_url("redis://127.0.0.1:6379")?;
    /// let policy = Policy::new("api", [Quota::per_second(10)?])?;
    /// let keys = store.bucket_keys("api:user:42", &policy);
    /// for bucket in store.read_buckets(&policy, &keys).await?.into_iter().flatten() {
    ///     println!("{} left, {} held", bucket.remaining(), bucket.held());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A store error when a call fails or times out.
    pub async fn read_buckets(
        &self,
        policy: &Policy,
        storage_keys: &[String],
    ) -> Result<Vec<Option<BucketState>>, Error> {
        // Keys by client, so that each call's keys share a cluster slot.
        let mut groups: BTreeMap<String, Vec<(usize, String, Quota)>> = BTreeMap::new();
        for (i, key) in storage_keys.iter().enumerate() {
            let read = parse_key(self.prefix(), key)
                .and_then(|(client, slot)| Some((client, quota_of(policy, slot)?)));
            if let Some((client, quota)) = read {
                groups
                    .entry(client.to_owned())
                    .or_default()
                    .push((i, key.clone(), quota));
            }
        }
        let mut out = vec![None; storage_keys.len()];
        let mut calls = JoinSet::new();
        let mut groups = groups.into_iter();
        loop {
            while calls.len() < IN_FLIGHT {
                let Some((client, keys)) = groups.next() else {
                    break;
                };
                let store = self.clone();
                calls.spawn(async move { store.read_group(client, keys).await });
            }
            let Some(done) = calls.join_next().await else {
                break;
            };
            let read = done.map_err(|e| {
                Error::store(ErrorKind::Server, format!("a bucket read stopped: {e}"))
            })??;
            for (i, state) in read {
                if let Some(slot) = out.get_mut(i) {
                    *slot = state;
                }
            }
        }
        Ok(out)
    }

    /// One client's keys, read in one call.
    async fn read_group(
        &self,
        client: String,
        keys: Vec<(usize, String, Quota)>,
    ) -> Result<Vec<(usize, Option<BucketState>)>, Error> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(READ).arg(keys.len());
        for (_, key, _) in &keys {
            cmd.arg(key);
        }
        let cmd = &cmd;
        let reply: Vec<Value> = self
            .bounded(
                |mut conn| async move { cmd.query_async(&mut conn).await },
                false,
                None,
            )
            .await?;
        let unreadable = || {
            Error::store(
                ErrorKind::Server,
                format!(
                    "Redis at {}: unexpected reply to a bucket read",
                    self.host()
                ),
            )
        };
        let mut values = reply.iter();
        let (Some(secs), Some(micros)) = (values.next(), values.next()) else {
            return Err(unreadable());
        };
        let now = number(secs)
            .zip(number(micros))
            .and_then(|(s, us)| s.checked_mul(1_000_000)?.checked_add(us))
            .ok_or_else(unreadable)?;
        Ok(keys
            .into_iter()
            .zip(values)
            .map(|((i, key, quota), value)| {
                let state = match value {
                    Value::BulkString(bytes) => std::str::from_utf8(bytes)
                        .ok()
                        .and_then(|text| state_of(&key, &client, quota, text, now)),
                    _ => None,
                };
                (i, state)
            })
            .collect())
    }
}

/// An unsigned number in a reply, sent as text or as an integer.
pub(super) fn number(value: &Value) -> Option<u64> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

/// The client part and the tail of a bucket key `{prefix}{{client}}:{tail}`
/// (a quota's period, `1s`, or its figures, `10/s:b20`, see
/// `Policy::carries`); `None` for any other key.
pub(super) fn parse_key<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, &'k str)> {
    let rest = key.strip_prefix(prefix)?.strip_prefix('{')?;
    let (client, tail) = rest.split_once('}')?;
    let tail = tail.strip_prefix(':')?;
    let well_formed = !client.is_empty()
        && tail.starts_with(|c: char| c.is_ascii_digit())
        && tail
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'/' || b == b':');
    well_formed.then_some((client, tail))
}

/// `policy`'s quota whose buckets' keys end in `tail`.
fn quota_of(policy: &Policy, tail: &str) -> Option<Quota> {
    policy
        .key_tails()
        .iter()
        .position(|t| t.strip_prefix("}:") == Some(tail))
        .and_then(|i| policy.quotas().get(i))
        .copied()
}

/// The bucket stored as `text` under `key`, brought up to `now` as the
/// script brings it before a check: refilled, expired holds debited whole.
/// `None` when `text` does not read (the script takes it as a full bucket).
fn state_of(key: &str, client: &str, quota: Quota, text: &str, now: u64) -> Option<BucketState> {
    let mut parts = text.splitn(4, ':');
    let level: i64 = parts.next()?.parse().ok()?;
    let stamp: u64 = parts.next()?.parse().ok()?;
    // The figures it was written under, `full,num`: the quota's own when
    // it names none.
    let kept = match parts.next() {
        Some(figures) => {
            let (full, num) = figures.split_once(',')?;
            let full = full.parse::<u64>().ok().filter(|f| *f > 0)?;
            let num = num.parse::<u64>().ok().filter(|n| *n > 0)?;
            (full, num)
        }
        None => (quota.full(), quota.num()),
    };
    let mut read = Vec::new();
    for hold in parts.next().unwrap_or("").split(';') {
        let mut fields = hold.split(',');
        let (Some(id), Some(units), Some(expiry)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (Ok(units), Ok(expiry)) = (units.parse::<u64>(), expiry.parse::<u64>()) else {
            continue;
        };
        if !id.is_empty() {
            read.push((id, units, expiry));
        }
    }
    let mut level = Level { level, stamp };
    if kept != (quota.full(), quota.num()) {
        // Carried as the script carries it: refilled under the figures it
        // was kept under, holds debited whole, then carried.
        let (full, num) = kept;
        let held: u64 = read.iter().map(|(_, units, _)| units).sum();
        level = level.refilled_by(full, num, now);
        level.level -= signed(held);
        level = level.carried(full, quota.full());
        read.clear();
    }
    let mut level = level.refilled(&quota, now);
    let mut holds = Vec::new();
    let mut held_units: u64 = 0;
    for (id, units, expiry) in read {
        if expiry <= now {
            level.level -= signed(units);
        } else {
            held_units = held_units.saturating_add(units);
            holds.push(BucketHold {
                id: id.to_owned(),
                tokens: units / quota.den(),
                expires_in: Duration::from_micros(expiry - now),
            });
        }
    }
    let free = Level {
        level: level.level - signed(held_units),
        stamp: level.stamp,
    };
    // A bucket stamped ahead (locked out until then, `Quota::lockout`, or
    // written by a clock ahead of this one) refills nothing before its stamp:
    // it is shown with nothing remaining, full only after it. (Keys do not
    // name lock-outs, so a clock's step cannot be told from a lock-out.)
    let ahead = free.stamp.saturating_sub(now);
    let reset_us = match free.until_full_us(&quota) {
        0 if ahead == 0 => 0,
        to_full => (ahead + to_full).min(MAX_REPORTED_US),
    };
    Some(BucketState {
        key: key.to_owned(),
        client: client.to_owned(),
        quota,
        remaining: match ahead {
            0 => free.level.max(0).unsigned_abs() / quota.den(),
            _ => 0,
        },
        held: held_units / quota.den(),
        reset_after: Duration::from_micros(reset_us),
        holds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(text: &str) -> Quota {
        text.parse().unwrap()
    }

    #[test]
    fn keys_are_read_back_into_client_and_period() {
        for (q, slot) in [
            ("10/s", "1s"),
            ("10/s burst 20", "1s"),
            ("3/1500ms", "1500ms"),
            ("2/15min", "15m"),
            ("1/day", "1d"),
            ("7/2500us", "2500us"),
            ("5/h", "1h"),
        ] {
            let q = quota(q);
            let key = format!("tollgate:{{api:user:42}}:{}", q.slot());
            assert_eq!(
                parse_key("tollgate:", &key),
                Some(("api:user:42", slot)),
                "{key}"
            );
        }
        for other in [
            "tollgate:epoch",
            "other:{api:k}:1s",
            "tollgate:{}:1s",
            "tollgate:{api:k}:",
            "tollgate:{api:k}:s",
            "tollgate:{api:k}:1s;x",
            "tollgate:{api:k}1s",
        ] {
            assert_eq!(parse_key("tollgate:", other), None, "{other}");
        }
        let policy = Policy::new("api", [quota("10/s"), quota("100/h")]).unwrap();
        assert_eq!(quota_of(&policy, "1h"), Some(quota("100/h")));
        assert_eq!(quota_of(&policy, "1m"), None);
        // An unnamed policy's keys name the figures.
        assert_eq!(
            parse_key("tollgate:", "tollgate:{default:k}:10/s:b20"),
            Some(("default:k", "10/s:b20"))
        );
        let bare = Policy::from(quota("10/s burst 20"));
        assert_eq!(quota_of(&bare, "10/s:b20"), Some(quota("10/s burst 20")));
        assert_eq!(quota_of(&bare, "1s"), None);
    }

    #[test]
    fn a_bucket_written_under_other_figures_is_read_carried_into_the_quota() {
        // Written under 10/s (full 1 000 000 units of 1/100 000 token) with
        // 2.5 of its 10 tokens left, read under 20/s burst 40 (full
        // 2 000 000 units of 1/50 000): a quarter, 10 tokens.
        let old = quota("10/s");
        let new = quota("20/s burst 40");
        let figures = format!("{},{}", old.full(), old.num());
        let text = format!("{}:1000000:{figures}", 250_000);
        let state = state_of("k", "c", new, &text, 1_000_000).unwrap();
        assert_eq!(state.remaining(), 10);
        assert_eq!(state.quota(), &new);
        // Holds are debited whole: 1 of the 2.5 tokens was held.
        let text = format!("{}:1000000:{figures}:a,100000,9000000", 250_000);
        let state = state_of("k", "c", new, &text, 1_000_000).unwrap();
        assert_eq!((state.remaining(), state.held()), (6, 0));
        // Refilled under the old figures first: 0.5 s of 10/s is 5 tokens,
        // 7.5 of 10, so 30 of 40.
        let text = format!("{}:1000000:{figures}", 250_000);
        let state = state_of("k", "c", new, &text, 1_500_000).unwrap();
        assert_eq!(state.remaining(), 30);
        // Under its own figures nothing is carried.
        let text = format!("{}:1000000:{figures}", 250_000);
        assert_eq!(
            state_of("k", "c", old, &text, 1_000_000)
                .unwrap()
                .remaining(),
            2
        );
    }

    #[test]
    fn a_bucket_is_refilled_to_now_and_capped_at_full() {
        // 10 a second: a token is 100_000 units of 1/den (den = 100_000).
        let q = quota("10/s");
        let den = q.den();
        let state = state_of("k", "c", q, &format!("{}:1000000", 2 * den), 1_250_000).unwrap();
        // 2 tokens, and 2.5 refilled in 250 ms: 4 whole ones.
        assert_eq!(state.remaining(), 4);
        // 5.5 tokens missing, 100 ms each.
        assert_eq!(state.reset_after(), Duration::from_millis(550));
        let full = state_of("k", "c", q, "0:0", 5_000_000).unwrap();
        assert_eq!((full.remaining(), full.reset_after()), (10, Duration::ZERO));
    }

    #[test]
    fn holds_count_until_they_expire_and_are_then_debited_whole() {
        let q = quota("10/s");
        let den = q.den();
        // Full at 10 tokens; one live hold of 3 and one expired of 2.
        let text = format!(
            "{}:1000:{},{}:a1,{},9000000;b2,{},500",
            10 * den,
            q.full(),
            q.num(),
            3 * den,
            2 * den
        );
        let state = state_of("k", "c", q, &text, 1000).unwrap();
        assert_eq!(state.held(), 3);
        assert_eq!(state.remaining(), 5);
        assert_eq!(state.holds().len(), 1);
        assert_eq!(state.holds()[0].id(), "a1");
        assert_eq!(state.holds()[0].tokens(), 3);
        assert_eq!(
            state.holds()[0].expires_in(),
            Duration::from_micros(8_999_000)
        );
        assert_eq!(state.reset_after(), Duration::from_millis(500));
    }

    #[test]
    fn debt_and_a_stamp_ahead_of_the_clock_read_as_the_script_reads_them() {
        let q = quota("10/s");
        let den = signed(q.den());
        // 3 tokens owed, stamped 1 s ahead (a failover to a slower clock).
        let state = state_of("k", "c", q, &format!("{}:2000000", -3 * den), 1_000_000).unwrap();
        assert_eq!(state.remaining(), 0);
        assert_eq!(state.reset_after(), Duration::from_millis(1_000 + 1_300));
    }

    #[test]
    fn unreadable_values_are_no_bucket() {
        let q = quota("10/s");
        for text in [
            "", "x:1", "1", "nan:1", "1:0:0,1", "1:0:5,0", "1:0:x", "1:0:5", "1:0:-5,1",
        ] {
            assert_eq!(state_of("k", "c", q, text, 0), None, "{text:?}");
        }
        // An unreadable hold is left out, as the script leaves it.
        let state = state_of("k", "c", q, "100:0:1000000,1:zz;a,1", 0).unwrap();
        assert!(state.holds().is_empty());
    }
}
