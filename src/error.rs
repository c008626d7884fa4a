//! What can go wrong: configuration mistakes, impossible requests and store trouble.

use std::fmt;
use std::time::Duration;

/// The error type of every fallible tollgate operation.
///
/// Configuration mistakes ([`Error::InvalidQuota`], [`Error::InvalidConfig`]) come
/// back when the quota, store or limiter is built, never per request. The other
/// variants answer a single check: [`Error::CostExceedsCapacity`] can never
/// succeed, [`Error::WaitTooLong`] comes from [`RateLimiter::acquire`], and the
/// store variants ([`Error::is_store_error`]) mean no decision could be made.
///
/// [`RateLimiter::acquire`]: crate::RateLimiter::acquire
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A quota was built with values that are zero, absurd, or too large to stay
    /// exact in the store's arithmetic. The message names the value.
    InvalidQuota(String),
    /// A store, limiter or layer was configured with a value it cannot use.
    InvalidConfig(String),
    /// The cost is larger than the bucket capacity: no amount of waiting admits it.
    CostExceedsCapacity {
        /// The cost asked for.
        cost: u64,
        /// The capacity of the smallest bucket it was checked against.
        capacity: u64,
    },
    /// [`RateLimiter::acquire`](crate::RateLimiter::acquire) gave up: being admitted
    /// would take longer than the caller allowed.
    WaitTooLong {
        /// How long the caller would still have had to wait at the last check.
        retry_after: Duration,
    },
    /// The store did not answer within its per-call timeout.
    Timeout(Duration),
    /// The in-memory store holds as many keys as it may and none could be forgotten.
    StoreFull {
        /// The configured key limit.
        max_keys: usize,
    },
    /// The store failed (connection refused, pool exhausted, Redis error reply).
    Store(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl Error {
    /// True when no decision could be made because the store failed, timed out or
    /// was full, as opposed to a configuration or caller error.
    ///
    /// The HTTP layer applies its store-error policy (allow or deny) to exactly
    /// these errors.
    pub fn is_store_error(&self) -> bool {
        matches!(
            self,
            Error::Timeout(_) | Error::StoreFull { .. } | Error::Store(_)
        )
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn store(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::Store(Box::new(err))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidQuota(msg) => write!(f, "invalid quota: {msg}"),
            Error::InvalidConfig(msg) => write!(f, "invalid configuration: {msg}"),
            Error::CostExceedsCapacity { cost, capacity } => write!(
                f,
                "cost {cost} exceeds the bucket capacity {capacity}: it can never be admitted"
            ),
            Error::WaitTooLong { retry_after } => write!(
                f,
                "admission would take {retry_after:?}, longer than the allowed wait"
            ),
            Error::Timeout(limit) => write!(f, "rate limit store did not answer within {limit:?}"),
            Error::StoreFull { max_keys } => write!(
                f,
                "in-memory rate limit store is full ({max_keys} keys, none refilled yet)"
            ),
            Error::Store(err) => write!(f, "rate limit store failed: {err}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Store(err) => Some(err.as_ref()),
            _ => None,
        }
    }
}
