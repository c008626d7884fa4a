//! What can go wrong, by phase: [`ConfigError`] while building quotas, policies,
//! stores, extractors and layers; [`Error`] when a check runs.
//!
//! The two are separate types, as deadpool separates its `BuildError` from its
//! `PoolError`: a caller of [`RateLimiter::check`](crate::RateLimiter::check)
//! never has to match a mistake that can only happen at start-up, and a
//! configuration mistake can never reach a request.

use std::fmt;
use std::time::Duration;

/// A configuration mistake, found when a quota, policy, key extractor, store or
/// layer is built, never per request.
///
/// It is a type of its own, apart from [`Error`], as deadpool keeps its
/// `BuildError` apart from its `PoolError`: code that checks requests never has
/// to match a mistake that can only happen at start-up.
///
/// The message names the offending value and says why it was refused. It never
/// contains a secret: URLs are shown without their password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    kind: ConfigErrorKind,
    message: String,
}

/// What a [`ConfigError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// A [`Quota`](crate::Quota): zero, absurd, or too large to count exactly.
    Quota,
    /// A [`Policy`](crate::Policy): its name or its list of quotas.
    Policy,
    /// A key extractor: a header name, a network, a prefix length.
    Key,
    /// A store: a URL, a prefix, a timeout, a size.
    Store,
    /// A layer or limiter option, such as a fixed cost above a capacity.
    Layer,
}

impl ConfigError {
    pub(crate) fn new(kind: ConfigErrorKind, message: impl Into<String>) -> Self {
        ConfigError {
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn quota(message: impl Into<String>) -> Self {
        Self::new(ConfigErrorKind::Quota, message)
    }

    pub(crate) fn policy(message: impl Into<String>) -> Self {
        Self::new(ConfigErrorKind::Policy, message)
    }

    pub(crate) fn key(message: impl Into<String>) -> Self {
        Self::new(ConfigErrorKind::Key, message)
    }

    pub(crate) fn store(message: impl Into<String>) -> Self {
        Self::new(ConfigErrorKind::Store, message)
    }

    pub(crate) fn layer(message: impl Into<String>) -> Self {
        Self::new(ConfigErrorKind::Layer, message)
    }

    /// The same mistake, said of `what` (`policy "login"`, a quota's text), so
    /// the message names the entry it came from.
    pub(crate) fn about(self, what: impl fmt::Display) -> Self {
        ConfigError {
            kind: self.kind,
            message: format!("{what}: {}", self.message),
        }
    }

    /// What the mistake is about.
    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }

    /// The explanation, without the `invalid ...:` prefix of `Display`.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            ConfigErrorKind::Quota => "quota",
            ConfigErrorKind::Policy => "policy",
            ConfigErrorKind::Key => "key extractor",
            ConfigErrorKind::Store => "store configuration",
            ConfigErrorKind::Layer => "rate limit configuration",
        };
        write!(f, "invalid {what}: {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Why a check could not be answered with a [`Decision`](crate::Decision).
///
/// [`Error::CostExceedsCapacity`] can never succeed, [`Error::WaitTooLong`] comes
/// from [`RateLimiter::acquire`], and the store variants
/// ([`Error::is_store_error`]) mean no decision could be made.
///
/// [`RateLimiter::acquire`]: crate::RateLimiter::acquire
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
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
    /// The store's circuit breaker is open after repeated failures: the store
    /// was not asked, so the answer came at once. The next probe goes out in
    /// about `retry_in`.
    CircuitOpen {
        /// Time until the breaker lets the next probe through.
        retry_in: Duration,
    },
    /// The store failed (connection refused, Redis error reply). [`Error::kind`]
    /// tells what kind of failure.
    Store(Box<dyn std::error::Error + Send + Sync + 'static>),
}

/// What kind of failure an [`Error`] is, for metrics labels and policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::CostExceedsCapacity`].
    CostExceedsCapacity,
    /// [`Error::WaitTooLong`].
    WaitTooLong,
    /// [`Error::Timeout`].
    Timeout,
    /// [`Error::CircuitOpen`].
    CircuitOpen,
    /// The store could not be reached: refused, reset, or dropped connections.
    Connection,
    /// Redis refused a write because it is out of memory (`OOM` under
    /// `maxmemory-policy noeviction`): admissions fail, denials still answer.
    OutOfMemory,
    /// Any other error reply from the store.
    Server,
}

impl ErrorKind {
    /// A short lowercase name (`timeout`, `connection`, `out_of_memory`...), as
    /// used in metrics labels and log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::CostExceedsCapacity => "cost_exceeds_capacity",
            ErrorKind::WaitTooLong => "wait_too_long",
            ErrorKind::Timeout => "timeout",
            ErrorKind::CircuitOpen => "circuit_open",
            ErrorKind::Connection => "connection",
            ErrorKind::OutOfMemory => "out_of_memory",
            ErrorKind::Server => "server",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A store failure with its kind decided where it happened, boxed into
/// [`Error::Store`].
#[derive(Debug)]
pub(crate) struct Classified {
    pub(crate) kind: ErrorKind,
    pub(crate) source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl fmt::Display for Classified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.source.fmt(f)
    }
}

impl std::error::Error for Classified {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.source()
    }
}

impl Error {
    /// True when no decision could be made because the store failed, timed out
    /// or its circuit breaker was open, as opposed to a request that can never be
    /// admitted or waited too long.
    ///
    /// The HTTP layer applies its store-error policy to exactly these errors.
    pub fn is_store_error(&self) -> bool {
        matches!(
            self,
            Error::Timeout(_) | Error::CircuitOpen { .. } | Error::Store(_)
        )
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::CostExceedsCapacity { .. } => ErrorKind::CostExceedsCapacity,
            Error::WaitTooLong { .. } => ErrorKind::WaitTooLong,
            Error::Timeout(_) => ErrorKind::Timeout,
            Error::CircuitOpen { .. } => ErrorKind::CircuitOpen,
            Error::Store(err) => err
                .downcast_ref::<Classified>()
                .map_or(ErrorKind::Server, |c| c.kind),
        }
    }

    /// A store failure of `kind`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn store(
        kind: ErrorKind,
        err: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Error::Store(Box::new(Classified {
            kind,
            source: err.into(),
        }))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::CostExceedsCapacity { cost, capacity } => write!(
                f,
                "cost {cost} exceeds the bucket capacity {capacity}: it can never be admitted"
            ),
            Error::WaitTooLong { retry_after } => write!(
                f,
                "admission would take {retry_after:?}, longer than the allowed wait"
            ),
            Error::Timeout(limit) => write!(f, "rate limit store did not answer within {limit:?}"),
            Error::CircuitOpen { retry_in } => write!(
                f,
                "rate limit store circuit breaker is open after repeated failures; \
                 next probe in {retry_in:?}"
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_errors_say_what_and_why() {
        let e = ConfigError::quota("tokens per period must be at least 1");
        assert_eq!(e.kind(), ConfigErrorKind::Quota);
        assert_eq!(
            e.to_string(),
            "invalid quota: tokens per period must be at least 1"
        );
        assert_eq!(e.message(), "tokens per period must be at least 1");
    }
}
