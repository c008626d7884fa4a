//! The rate limit headers that describe a decision (IETF draft or legacy),
//! shared by HTTP and gRPC answers and by forwarded responses.

use std::borrow::Cow;
use std::cell::RefCell;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};

use super::headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
    ceil_secs, sf_integer,
};
use super::options::HeaderStyle;
use super::outcome::{After, Answer, Deferred, Marks, ShadowRejection};
use crate::decision::{Decision, QuotaState};
use crate::policy::Policy;
use crate::quota::Quota;
/// What a policy advertises, built once per policy (see [`Policy`]'s derived
/// values): the `RateLimit-Policy` field value and one item name per quota.
struct Advertised {
    header: Option<HeaderValue>,
    /// One Structured Field string per quota, `"name"` or `"name.i"`.
    items: Box<[String]>,
}

fn advertised(policy: &Policy) -> &Advertised {
    policy.derived(|policy| {
        let name = policy.name();
        let quotas = policy.quotas();
        let items: Box<[String]> = if quotas.len() == 1 {
            Box::new([format!("\"{name}\"")])
        } else {
            // Several quotas need distinct item names, or a client could not tell
            // which `r` belongs to which `q`. `.` is outside the allowed name
            // characters, so `api.1` cannot clash with a policy of that name.
            (0..quotas.len())
                .map(|i| format!("\"{name}.{i}\""))
                .collect()
        };
        let value = items
            .iter()
            .zip(quotas)
            .map(|(item, q)| {
                let (q, w) = policy_item(q);
                format!("{item};q={q};w={w}")
            })
            .collect::<Vec<_>>()
            .join(", ");
        Advertised {
            // Names are [A-Za-z0-9_-] and numbers are digits: always valid.
            header: HeaderValue::from_str(&value).ok(),
            items,
        }
    })
}

/// The quoted item name of each quota of `policy`, in order.
pub(crate) fn items(policy: &Policy) -> &[String] {
    &advertised(policy).items
}

/// The `q` and `w` a quota advertises in `RateLimit-Policy`.
///
/// `w` is the time an empty bucket takes to refill completely, in whole seconds
/// rounded up, at least 1 (the draft allows no fractions and no zero). `q` is
/// the larger of the capacity (the largest burst) and the tokens refilled in
/// `w`, rounded up. So `q / w` is never below the real refill rate, however the
/// period was rounded: `Quota::new(5, 10ms)` refills 500 a second and says
/// `q=500;w=1`, not `q=5;w=1`; and `q` is never below the burst a full bucket
/// admits at once.
fn policy_item(quota: &Quota) -> (u64, u64) {
    let w = ceil_secs(quota.refill_time()).max(1);
    let period_us = quota.period().as_micros().max(1);
    let refilled = (u128::from(quota.tokens()) * u128::from(w) * 1_000_000).div_ceil(period_us);
    let refilled = u64::try_from(refilled).unwrap_or(u64::MAX);
    (sf_integer(quota.capacity().max(refilled)), sf_integer(w))
}

/// `Retry-After` of a 429: the decision's wait rounded up, never 0.
pub(crate) fn retry_after_secs(decision: &Decision) -> u64 {
    ceil_secs(decision.retry_after()).max(1)
}

/// Seconds until `state`'s `remaining` grows by one token (`None` when full).
///
/// The store reports the time until the bucket is full; every missing token
/// beyond the next one takes `period / tokens`, so the next one is due that much
/// earlier. Rounded up, this is never earlier than the real refill.
fn next_token(state: &QuotaState) -> Option<Duration> {
    let q = state.quota();
    let missing = q
        .capacity()
        .checked_sub(state.remaining())?
        .checked_sub(1)?;
    let per_token_us = q.period().as_micros() / u128::from(q.tokens().max(1));
    let later = per_token_us.saturating_mul(u128::from(missing));
    let full = state.reset_after().as_micros();
    let us = u64::try_from(full.saturating_sub(later)).unwrap_or(u64::MAX);
    Some(Duration::from_micros(us.max(1)))
}

/// The `t` of one `RateLimit` item. On an admission: seconds until one more token
/// is available (omitted when the bucket is full). On a denial: seconds until this
/// quota holds the request's cost (omitted for quotas that already hold it), so
/// `Retry-After`, the longest of these, is never earlier than any `t`.
fn item_t(decision: &Decision, state: &QuotaState) -> Option<u64> {
    if decision.allowed() {
        next_token(state).map(ceil_secs)
    } else {
        let wait = state.retry_after();
        (!wait.is_zero()).then(|| ceil_secs(wait))
    }
}

/// The `RateLimit` field value: one item per quota, in the policy's order.
///
/// Written into a string of exactly its length: a header value made from a
/// buffer with room to spare takes a second allocation (`Bytes` keeps the
/// spare room in a block of its own).
pub(crate) fn ratelimit_value(policy: &Policy, decision: &Decision) -> String {
    let items = items(policy);
    let len = items
        .iter()
        .zip(decision.states())
        .map(|(item, state)| {
            let t = item_t(decision, state).map_or(0, |t| ";t=".len() + digits(t));
            item.len() + ";r=".len() + digits(sf_integer(state.remaining())) + t
        })
        .sum::<usize>()
        + ", ".len() * items.len().saturating_sub(1);
    let mut out = String::with_capacity(len);
    let mut digits = itoa::Buffer::new();
    for (item, state) in items.iter().zip(decision.states()) {
        if !out.is_empty() {
            out.push_str(", ");
        }
        out.push_str(item);
        out.push_str(";r=");
        out.push_str(digits.format(sf_integer(state.remaining())));
        if let Some(t) = item_t(decision, state) {
            out.push_str(";t=");
            out.push_str(digits.format(t));
        }
    }
    out
}

/// A `RateLimit` value a thread wrote for a one-quota policy, and what it
/// says.
struct Written {
    item: Box<str>,
    r: u64,
    t: Option<u64>,
    value: HeaderValue,
}

/// How many values a thread keeps (see [`one_item_value`]).
const KEPT: usize = 32;

thread_local! {
    /// See [`one_item_value`]: the value of `r` and `t` in slot
    /// [`slot`]`(r, t)`.
    static WRITTEN: RefCell<[Option<Written>; KEPT]> =
        const { RefCell::new([const { None }; KEPT]) };
}

/// Where a value of `r` and `t` is kept: consecutive `r`s in consecutive
/// slots.
fn slot(r: u64, t: Option<u64>) -> usize {
    let t = t.map_or(0, |t| t.wrapping_add(1));
    let mixed = r.wrapping_add(t.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    usize::try_from(mixed % KEPT as u64).unwrap_or(0)
}

/// The `RateLimit` header value of a one-quota policy's item. A thread
/// keeps the values it wrote last, one for each of [`KEPT`] slots, and
/// gives one again (a counted reference, no formatting) when the next value
/// says the same: clients with room to spare, the common case, all hear the
/// same `r` and `t` (`r` one below the capacity for a client whose bucket
/// refilled since its last request), and decisions made from a lease's
/// hold say what is left of it, a few small numbers that come back again
/// and again across keys (one kept value rewrote nearly every one of
/// them). `value` writes it when it is not kept.
fn one_item_value(
    item: &str,
    r: u64,
    t: Option<u64>,
    value: impl Fn() -> String,
) -> Option<HeaderValue> {
    let write = || HeaderValue::try_from(value()).ok();
    // Written anew while the thread's locals are torn down, or should the
    // cell be in use.
    let kept = WRITTEN.try_with(|written| {
        let Ok(mut written) = written.try_borrow_mut() else {
            return write();
        };
        let Some(kept) = written.get_mut(slot(r, t)) else {
            return write();
        };
        if let Some(w) = kept.as_ref()
            && w.r == r
            && w.t == t
            && *w.item == *item
        {
            return Some(w.value.clone());
        }
        let value = write()?;
        match kept.as_mut() {
            Some(w) => {
                if *w.item != *item {
                    w.item = item.into();
                }
                (w.r, w.t, w.value) = (r, t, value.clone());
            }
            None => {
                *kept = Some(Written {
                    item: item.into(),
                    r,
                    t,
                    value: value.clone(),
                });
            }
        }
        Some(value)
    });
    kept.unwrap_or_else(|_| write())
}

/// How many decimal digits `n` is written with.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Adds the rate limit headers describing `decision` under `policy` to a
/// response's headers. The draft's fields are lists, so nested layers (a
/// global and a per-route limit) append their items; the legacy
/// single-value fields hold the most restrictive layer's values (the fewest
/// remaining; of equals, the first set, the innermost).
pub(crate) fn add_report(
    target: &mut HeaderMap,
    style: HeaderStyle,
    policy: &Policy,
    decision: &Decision,
) {
    match style {
        HeaderStyle::Ietf => {
            if let Some(header) = &advertised(policy).header {
                target.append(RATELIMIT_POLICY, header.clone());
            }
            // Item names, `;r=`, `;t=`, digits and ", ": always a valid value.
            let value = match (items(policy), decision.states()) {
                ([item], [state]) => one_item_value(
                    item,
                    sf_integer(state.remaining()),
                    item_t(decision, state),
                    || ratelimit_value(policy, decision),
                ),
                _ => HeaderValue::try_from(ratelimit_value(policy, decision)).ok(),
            };
            if let Some(v) = value {
                target.append(RATELIMIT, v);
            }
        }
        HeaderStyle::Legacy => {
            let fields = [
                (X_RATELIMIT_LIMIT, decision.limit()),
                (X_RATELIMIT_REMAINING, decision.remaining()),
                (X_RATELIMIT_RESET, ceil_secs(decision.reset_after())),
            ];
            // One value each: the most restrictive layer's (the fewest
            // remaining), so nested layers never say more remains than the
            // tightest of them allows. Fields a service set itself that do
            // not read as a count are replaced too.
            let theirs = target
                .get(&X_RATELIMIT_REMAINING)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if theirs.is_none_or(|theirs| decision.remaining() < theirs) {
                for (name, value) in fields {
                    target.insert(name, value.into());
                }
            }
        }
        HeaderStyle::None => {}
    }
}

/// What shadow mode forwards instead of `answer`: the report and the decision
/// or failure, without the response.
pub(crate) fn shadow_report(answer: Answer, style: HeaderStyle) -> After {
    match answer {
        Answer::TooMany {
            policy, decision, ..
        } => After {
            headers: Deferred::new(style, Cow::Owned(policy)),
            decision: Some(decision),
            ..After::default()
        },
        Answer::StoreDown(failure) => After {
            marks: Marks::new(Some(failure), None, None),
            ..After::default()
        },
        Answer::CostTooHigh { cost, policy, .. } => {
            let shadow = ShadowRejection::CostTooHigh {
                cost,
                capacity: policy.max_cost(),
            };
            After {
                marks: Marks::new(None, Some(shadow), None),
                ..After::default()
            }
        }
        Answer::MissingKey { kind } => After {
            marks: Marks::new(None, Some(ShadowRejection::MissingKey { kind }), None),
            ..After::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nested layers in the legacy style: the fields say what the tightest
    /// layer leaves, whichever writes first.
    #[test]
    fn legacy_fields_hold_the_most_restrictive_layers_values() {
        let store = MemoryStore::new();
        let tight = policy(&[Quota::per_minute(10).unwrap()]);
        let loose = policy(&[Quota::per_minute(100).unwrap()]);
        let t = store.decide_at("t", &tight, 10, 0).unwrap();
        let l = store.decide_at("l", &loose, 1, 0).unwrap();
        for order in [[(&loose, &l), (&tight, &t)], [(&tight, &t), (&loose, &l)]] {
            let mut headers = HeaderMap::new();
            for (p, d) in order {
                add_report(&mut headers, HeaderStyle::Legacy, p, d);
            }
            assert_eq!(headers[X_RATELIMIT_REMAINING], "0");
            assert_eq!(headers[X_RATELIMIT_LIMIT], "10");
            assert_eq!(headers.get_all(X_RATELIMIT_REMAINING).iter().count(), 1);
        }
        // A service's own field that is not a count is replaced.
        let mut headers = HeaderMap::new();
        headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from_static("lots"));
        add_report(&mut headers, HeaderStyle::Legacy, &loose, &l);
        assert_eq!(headers[X_RATELIMIT_REMAINING], "99");
    }

    /// The headers a report of `decision` adds to an empty map.
    fn map(style: HeaderStyle, policy: &Policy, decision: &Decision) -> HeaderMap {
        let mut headers = HeaderMap::new();
        add_report(&mut headers, style, policy, decision);
        headers
    }
    use crate::quota::Quota;
    use crate::store::{MemoryStore, Store};
    fn policy(quotas: &[Quota]) -> Policy {
        Policy::new("p", quotas.iter().copied()).unwrap()
    }

    fn header(p: &Policy) -> &HeaderValue {
        advertised(p).header.as_ref().unwrap()
    }

    #[test]
    fn policy_header_lists_every_quota() {
        let one = Policy::new("default", [Quota::per_second(10).unwrap()]).unwrap();
        assert_eq!(header(&one), "\"default\";q=10;w=1");
        let two = Policy::new(
            "api",
            [
                Quota::per_second(10).unwrap().burst(20).unwrap(),
                Quota::new(1000, Duration::from_secs(86_400)).unwrap(),
            ],
        )
        .unwrap();
        assert_eq!(header(&two), "\"api.0\";q=20;w=2, \"api.1\";q=1000;w=86400");
        assert_eq!(two.max_cost(), 20);
    }

    /// `q` and `w` of a quota of `tokens` per `period_ms`, with `burst`.
    fn advertised_for(tokens: u64, period_ms: u64, burst: Option<u64>) -> String {
        let mut q = Quota::new(tokens, Duration::from_millis(period_ms)).unwrap();
        if let Some(b) = burst {
            q = q.burst(b).unwrap();
        }
        let (q, w) = policy_item(&q);
        format!("q={q};w={w}")
    }

    #[test]
    fn the_advertised_rate_never_understates_the_real_one() {
        // 5 per 10 ms is 500 a second: w cannot go below 1 s, so q grows.
        assert_eq!(advertised_for(5, 10, None), "q=500;w=1");
        // 5 per 250 ms is 20 a second.
        assert_eq!(advertised_for(5, 250, None), "q=20;w=1");
        // 3 per 1.5 s refills in 1.5 s, said as 2 s: 4 in 2 s is the real 2/s.
        assert_eq!(advertised_for(3, 1_500, None), "q=4;w=2");
        // A burst larger than the tokens per period: 10/s with bursts of 25
        // refills in 2.5 s, said as 3 s, in which 30 tokens come back.
        assert_eq!(advertised_for(10, 1_000, Some(25)), "q=30;w=3");
        // Whole seconds need no rounding: q stays the capacity.
        assert_eq!(advertised_for(10, 1_000, Some(20)), "q=20;w=2");
        assert_eq!(advertised_for(100, 3_600_000, None), "q=100;w=3600");
        // A burst far above the refill over w is advertised as it is.
        assert_eq!(advertised_for(5, 10, Some(1_000)), "q=1000;w=2");
    }

    proptest::proptest! {
        #[test]
        fn advertised_items_never_understate_rate_or_burst(
            tokens in 1u64..100_000,
            period_ms in 1u64..10_000_000,
            extra in 0u64..1_000,
        ) {
            let Ok(base) = Quota::new(tokens, Duration::from_millis(period_ms)) else {
                return Ok(());
            };
            let Ok(quota) = base.burst(tokens + extra) else { return Ok(()) };
            let (q, w) = policy_item(&quota);
            proptest::prop_assert!(w >= 1 && q >= 1);
            proptest::prop_assert!(q >= quota.capacity());
            // q / w >= tokens / period, as exact integers.
            proptest::prop_assert!(
                u128::from(q) * u128::from(period_ms) >= u128::from(tokens) * u128::from(w) * 1000
            );
            // And not wildly above: rounding w up adds under a second of refill.
            let refill_ms = quota.refill_time().as_millis();
            proptest::prop_assert!(u128::from(w) * 1000 < refill_ms + 2000);
        }
    }

    #[test]
    fn digits_count_decimal_digits() {
        for n in [0, 9, 10, 99, 100, 12_345, u64::MAX] {
            assert_eq!(digits(n), n.to_string().len(), "{n}");
        }
    }

    /// Each value is written into a string of exactly its length, so its
    /// header value takes one allocation, not two.
    #[test]
    fn ratelimit_values_fill_their_string_exactly() {
        let store = MemoryStore::new();
        let p = policy(&[Quota::per_second(2).unwrap(), Quota::per_hour(100).unwrap()]);
        let one = policy(&[Quota::per_second(1_000_000).unwrap()]);
        for (policy, costs) in [(&p, [1, 1, 1]), (&one, [0, 1, 999_999])] {
            for (i, cost) in costs.into_iter().enumerate() {
                let d = store.decide_at("k", policy, cost, i as u64).unwrap();
                let value = ratelimit_value(policy, &d);
                assert_eq!(value.capacity(), value.len(), "{value}");
            }
        }
    }

    /// A one-quota value is written as the general one, and given again
    /// while it says the same; a value that says anything else (another
    /// policy's item, another `r` or `t`) is written anew.
    #[test]
    fn one_item_values_are_reused_only_while_they_say_the_same() {
        let store = MemoryStore::new();
        let p = policy(&[Quota::per_second(10).unwrap()]);
        let other = Policy::new("other", [Quota::per_second(10).unwrap()]).unwrap();
        let header =
            |policy: &Policy, d: &Decision| map(HeaderStyle::Ietf, policy, d)[RATELIMIT].clone();
        let first = store.decide_at("a", &p, 1, 0).unwrap();
        assert_eq!(header(&p, &first), ratelimit_value(&p, &first).as_str());
        // Another client in the same state: the same bytes, not a copy.
        let same = store.decide_at("b", &p, 1, 0).unwrap();
        let (x, y) = (header(&p, &first), header(&p, &same));
        assert_eq!(x, y);
        assert_eq!(x.as_bytes().as_ptr(), y.as_bytes().as_ptr());
        // Another remaining, another policy: written anew, and right.
        let second = store.decide_at("a", &p, 1, 0).unwrap();
        assert_eq!(header(&p, &second), "\"p\";r=8;t=1");
        let elsewhere = store.decide_at("o", &other, 1, 0).unwrap();
        assert_eq!(header(&other, &elsewhere), "\"other\";r=9;t=1");
        assert_eq!(header(&p, &first), "\"p\";r=9;t=1");
        // Values that alternate are each kept: decisions from holds of
        // different sizes.
        let (nine, eight) = (header(&p, &first), header(&p, &second));
        for _ in 0..3 {
            let again = (header(&p, &first), header(&p, &second));
            assert_eq!(again.0.as_bytes().as_ptr(), nine.as_bytes().as_ptr());
            assert_eq!(again.1.as_bytes().as_ptr(), eight.as_bytes().as_ptr());
        }
        // A denial's value too.
        let _ = store.decide_at("c", &p, 10, 0).unwrap();
        let denied = store.decide_at("c", &p, 1, 0).unwrap();
        assert!(!denied.allowed());
        assert_eq!(header(&p, &denied), ratelimit_value(&p, &denied).as_str());
    }

    #[tokio::test]
    async fn admitted_items_report_the_next_token() {
        // 1 per 10 s, burst 5: after two spends, one more token in 10 s, full in 20 s.
        let q = Quota::new(1, Duration::from_secs(10))
            .unwrap()
            .burst(5)
            .unwrap();
        let store = MemoryStore::new();
        let p = policy(&[q]);
        let mut d = store.decide_at("k", &p, 1, 0).unwrap();
        assert_eq!(ratelimit_value(&p, &d), "\"p\";r=4;t=10");
        d = store.decide_at("k", &p, 1, 0).unwrap();
        assert_eq!(d.reset_after(), Duration::from_secs(20));
        assert_eq!(ratelimit_value(&p, &d), "\"p\";r=3;t=10");
        // Halfway to the next token.
        d = store.decide_at("k", &p, 0, 5_000_000).unwrap();
        assert_eq!(ratelimit_value(&p, &d), "\"p\";r=3;t=5");
        // A full bucket has nothing more to come: no t.
        let fresh = store.check("other", &p, 0).await.unwrap();
        assert_eq!(ratelimit_value(&p, &fresh), "\"p\";r=5");
    }

    #[test]
    fn denied_items_never_point_later_than_retry_after() {
        let fast = Quota::per_second(2).unwrap();
        let slow = Quota::per_hour(100).unwrap();
        let store = MemoryStore::new();
        let p = policy(&[fast, slow]);
        let _ = store.decide_at("k", &p, 2, 0).unwrap();
        let d = store.decide_at("k", &p, 1, 100_000).unwrap();
        assert!(!d.allowed());
        // Only the exhausted quota has a t; the hourly one still has tokens.
        assert_eq!(ratelimit_value(&p, &d), "\"p.0\";r=0;t=1, \"p.1\";r=98");
        assert_eq!(retry_after_secs(&d), 1);
    }

    #[test]
    fn legacy_headers_use_the_binding_quota() {
        let q = Quota::per_minute(6).unwrap();
        let store = MemoryStore::new();
        let p = policy(&[q]);
        let d = store.decide_at("k", &p, 1, 0).unwrap();
        let mut h = map(HeaderStyle::Legacy, &p, &d);
        assert_eq!(h[X_RATELIMIT_LIMIT], "6");
        assert_eq!(h[X_RATELIMIT_REMAINING], "5");
        assert_eq!(h[X_RATELIMIT_RESET], "10");
        assert_eq!(h.len(), 3);
        assert!(map(HeaderStyle::None, &p, &d).is_empty());
        // An outer layer's legacy fields leave the inner (first) layer's be.
        let outer = policy(&[Quota::per_minute(60).unwrap()]);
        let later = store.decide_at("o", &outer, 1, 0).unwrap();
        add_report(&mut h, HeaderStyle::Legacy, &outer, &later);
        assert_eq!(h[X_RATELIMIT_LIMIT], "6");
        assert_eq!(h[X_RATELIMIT_REMAINING], "5");
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn nested_reports_append_list_fields() {
        let q = Quota::per_second(3).unwrap();
        let store = MemoryStore::new();
        let p = policy(&[q]);
        let d = store.decide_at("k", &p, 1, 0).unwrap();
        let mut target = map(HeaderStyle::Ietf, &p, &d);
        let outer = Policy::new("outer", [q]).unwrap();
        add_report(&mut target, HeaderStyle::Ietf, &outer, &d);
        assert_eq!(target.get_all(RATELIMIT).iter().count(), 2);
        assert_eq!(target.get_all(RATELIMIT_POLICY).iter().count(), 2);
    }
}
