//! The bottom of the layer: header names and how numbers are written into
//! header fields. Imports nothing from the layer.

use std::time::Duration;

use http::HeaderName;

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit`: capacity of the most restrictive quota.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`: tokens left in the most restrictive quota.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`: seconds until the most restrictive quota is full again.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The `Retry-After` of a store failure answered with 503.
pub const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A duration in whole seconds, rounded up: a client told `0` retries at once.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A duration in whole milliseconds, rounded up, for the same reason.
pub(crate) fn ceil_millis(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// RFC 9651 integers have at most 15 digits; a quota may count up to 2^52
/// tokens, so larger values are reported as the largest integer the syntax has.
pub(crate) fn sf_integer(v: u64) -> u64 {
    v.min(999_999_999_999_999)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_micros(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn milliseconds_round_up() {
        assert_eq!(ceil_millis(Duration::ZERO), 0);
        assert_eq!(ceil_millis(Duration::from_micros(1)), 1);
        assert_eq!(ceil_millis(Duration::from_millis(250)), 250);
        assert_eq!(ceil_millis(Duration::from_micros(250_001)), 251);
        assert_eq!(ceil_millis(Duration::MAX), u64::MAX);
    }

    #[test]
    fn integers_fit_structured_fields() {
        assert_eq!(sf_integer(1 << 52), 999_999_999_999_999);
        assert_eq!(sf_integer(42), 42);
    }
}
