//! Which bucket: the key a `RateLimiter` of the policy takes, from `--key`
//! or from a layer's kind and value.

use tollgate::store::{hashed_key, safe_key};
use tollgate::{Policy, RedisStore};

use crate::args::KeyArgs;
use crate::fail::Failure;

/// The key as a `RateLimiter` of the policy takes it: `--key` as given, or
/// `KIND:VALUE` with the value made safe (or hashed) as the layer makes it.
pub(crate) fn limiter_key(args: &KeyArgs) -> Result<String, Failure> {
    let key = match (&args.key, &args.kind, &args.value, &args.hashed_value) {
        (Some(key), None, None, None) => key.clone(),
        (None, Some(kind), Some(value), None) => format!("{kind}:{}", safe_key(value)),
        (None, Some(kind), None, Some(value)) => {
            format!("{kind}:{}", hashed_key(value.as_bytes()))
        }
        _ => {
            return Err(Failure::usage(
                "name the bucket with --key KEY, or --kind KIND with --value VALUE or \
                 --hashed-value VALUE",
            ));
        }
    };
    if key.is_empty() {
        return Err(Failure::usage("the key is empty"));
    }
    Ok(key)
}

/// What the store keeps `key`'s buckets under: the policy's name first,
/// as `RateLimiter` names them.
pub(crate) fn named(policy: &str, key: &str) -> String {
    format!("{policy}:{key}")
}

/// The storage keys of `key`'s buckets under `policy`, one per quota.
pub(crate) fn bucket_keys(store: &RedisStore, policy: &Policy, key: &str) -> Vec<String> {
    store.bucket_keys(&named(policy.name(), key), policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(
        key: Option<&str>,
        kind: Option<&str>,
        value: Option<&str>,
        hashed: Option<&str>,
    ) -> KeyArgs {
        KeyArgs {
            key: key.map(str::to_owned),
            kind: kind.map(str::to_owned),
            value: value.map(str::to_owned),
            hashed_value: hashed.map(str::to_owned),
        }
    }

    #[test]
    fn layer_keys_are_made_as_the_layer_makes_them() {
        let key = |a| limiter_key(&a).unwrap();
        assert_eq!(key(args(Some("user:42"), None, None, None)), "user:42");
        assert_eq!(
            key(args(None, Some("ip"), Some("203.0.113.7"), None)),
            "ip:203.0.113.7"
        );
        // A route template has braces: the layer hashes it.
        assert_eq!(
            key(args(None, Some("route"), Some("/items/{id}"), None)),
            format!("route:{}", safe_key("/items/{id}"))
        );
        // A header's value is hashed even when it would be safe.
        assert_eq!(
            key(args(None, Some("header:x-api-key"), None, Some("k-123"))),
            format!("header:x-api-key:{}", hashed_key(b"k-123"))
        );
        assert!(limiter_key(&args(None, Some("ip"), None, None)).is_err());
        assert!(limiter_key(&args(Some(""), None, None, None)).is_err());
    }
}
