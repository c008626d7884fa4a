//! A request before the store is asked: what it asks of the store (its
//! policy, key and cost, [`KeyedRequest`]), and [`prepare`], which finds them.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;
use std::thread::LocalKey;

use http::request::Parts;

use super::config::{Config, Cost};
use super::dyn_key::Extractor;
use super::options::{Missing, Selected};
use super::outcome::{After, Answer};
use crate::policy::Policy;
use crate::store::safe_key;

/// What a request asks of the store: its policy, key and cost; the key
/// borrowed from the request (`'p`) when it can be.
pub(crate) struct KeyedRequest<'p> {
    /// Borrowed from the layer's configuration unless a table rule chose it.
    pub(super) policy: Cow<'p, Policy>,
    /// The kind of the key's extractor (for answers and reports), borrowed
    /// as the policy is.
    pub(super) kind: Cow<'p, Arc<str>>,
    /// The client key, made safe. The storage key is `policy:kind:value`.
    pub(super) value: Cow<'p, str>,
    pub(super) cost: u64,
}

thread_local! {
    /// Where [`KeyedRequest::with_key`] writes storage keys: one buffer per
    /// thread, grown to the longest key it has held, so a check decided at
    /// once allocates no key of its own.
    static KEY: RefCell<String> = const { RefCell::new(String::new()) };
}

impl KeyedRequest<'_> {
    /// The same, owning its key: for a check that outlives the request
    /// head's borrow.
    pub(super) fn into_owned(self) -> KeyedRequest<'static> {
        KeyedRequest {
            policy: Cow::Owned(self.policy.into_owned()),
            kind: Cow::Owned(self.kind.into_owned()),
            value: Cow::Owned(self.value.into_owned()),
            cost: self.cost,
        }
    }

    /// The storage key, `name:kind:value`, on the heap: for the checks that
    /// keep it (a store that has to be asked, a settlement).
    pub(super) fn key(&self) -> String {
        self.policy.key_of(&[&self.kind, &self.value])
    }

    /// Runs `f` on the storage key, written into this thread's buffer (or,
    /// should `f` ever check a key itself, onto the heap): a store that
    /// decides at once needs the key no longer than that.
    pub(super) fn with_key<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        let write = |key: &mut String| self.policy.write_key(key, &[&self.kind, &self.value]);
        in_scratch(&KEY, write, f)
    }
}

/// A request before the store is asked.
pub(super) enum Prepared<'p> {
    /// Decided without the store: `Ok` forwards (exempt, or no key and
    /// missing keys are allowed), `Err` answers.
    Early(Result<After, Answer>),
    Keyed(KeyedRequest<'p>),
}

/// Chooses the policy, extracts the key (without waiting unless `wait`: a
/// waiting extractor then leaves this pending for good) and prices the
/// request.
pub(super) async fn prepare<'p>(config: &'p Config, parts: &'p Parts, wait: bool) -> Prepared<'p> {
    let (policy, own_key) = match &config.select {
        None => (Cow::Borrowed(config.limiter.policy()), None),
        Some(select) => match select(parts) {
            Selected::Default => (Cow::Borrowed(config.limiter.policy()), None),
            Selected::Policy(p) => (Cow::Owned(p), None),
            Selected::Keyed(p, key) => (Cow::Owned(p), Some(key)),
            Selected::Exempt => return Prepared::Early(Ok(After::default())),
        },
    };
    // A table rule with a key of its own uses it; everything else the layer's.
    let key = own_key.as_ref().unwrap_or(&config.key);
    let (fallback, value) = match present_key(key.extract(parts, wait).await) {
        Some(value) => (None, value),
        None => match &config.missing {
            Missing::Allow => return Prepared::Early(Ok(After::default())),
            Missing::Reject => return Prepared::Early(Err(missing(key))),
            Missing::Fallback(other) => match present_key(other.extract(parts, wait).await) {
                Some(value) => (Some(other), value),
                None => {
                    return Prepared::Early(Err(Answer::MissingKey {
                        kind: format!("{} or {}", key.kind(), other.kind()),
                    }));
                }
            },
        },
    };
    // The kind is borrowed from the configuration unless a rule's own key
    // found it.
    let kind = match (fallback, &own_key) {
        (Some(other), _) => Cow::Borrowed(other.name()),
        (None, None) => Cow::Borrowed(config.key.name()),
        (None, Some(own)) => Cow::Owned(Arc::clone(own.name())),
    };
    let cost = match &config.cost {
        Cost::Fixed(n) => *n,
        Cost::Dynamic(f) => f(parts),
    };
    if cost > policy.max_cost() {
        return Prepared::Early(Err(too_costly(cost, policy.into_owned(), &kind)));
    }
    // The value is made safe here: `from_fn` extractors return whatever
    // their closure built. A borrowed one is a `Header`'s, already made safe
    // (see `Extractor::extract`). The policy name comes first in the storage
    // key: policies with different names never share a bucket.
    let value = match value {
        Cow::Borrowed(value) => Cow::Borrowed(value),
        Cow::Owned(value) => Cow::Owned(into_safe(value)),
    };
    Prepared::Keyed(KeyedRequest {
        policy,
        kind,
        value,
        cost,
    })
}

/// A key that is there and not empty.
fn present_key(key: Option<Cow<'_, str>>) -> Option<Cow<'_, str>> {
    key.filter(|k| !k.is_empty())
}

fn missing(key: &Extractor) -> Answer {
    Answer::MissingKey {
        kind: key.kind().to_owned(),
    }
}

pub(super) fn too_costly(cost: u64, policy: Policy, kind: &str) -> Answer {
    Answer::CostTooHigh {
        cost,
        policy,
        kind: kind.to_owned(),
    }
}

/// [`safe_key`] of an owned value: the value itself when it is safe, without
/// a copy.
pub(super) fn into_safe(value: String) -> String {
    let hashed = match safe_key(&value) {
        Cow::Borrowed(_) => None,
        Cow::Owned(hashed) => Some(hashed),
    };
    hashed.unwrap_or(value)
}

/// Runs `f` on the string `write` makes, written into `buffer`: one per
/// thread, grown to the longest string it has held, so a check that needs a
/// key only for the length of `f` allocates none. Should `f` use the same
/// buffer itself, its string goes on the heap.
fn in_scratch<R>(
    buffer: &'static LocalKey<RefCell<String>>,
    write: impl Fn(&mut String),
    f: impl FnOnce(&str) -> R,
) -> R {
    buffer.with(|buffer| match buffer.try_borrow_mut() {
        Ok(mut scratch) => {
            scratch.clear();
            write(&mut scratch);
            f(&scratch)
        }
        Err(_) => {
            let mut own = String::new();
            write(&mut own);
            f(&own)
        }
    })
}
