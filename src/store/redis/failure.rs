//! Redis errors sorted into what the store does about them and what it
//! reports: the bottom of the Redis store, importing nothing from it.

use std::fmt;
use std::sync::Arc;

use redis::{ErrorKind as RedisKind, RedisError, ServerErrorKind};

use crate::error::{Error, ErrorKind};

/// A Redis error and the server it came from (never the URL's password).
#[derive(Debug)]
pub(crate) struct AtHost {
    pub(crate) host: Arc<str>,
    pub(crate) error: RedisError,
}

impl fmt::Display for AtHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redis at {}: {}", self.host, self.error)
    }
}

impl std::error::Error for AtHost {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Errors that mean this connection will not work again: broken sockets, and a
/// server that is no longer the primary (`READONLY`, `MASTERDOWN`) after a
/// failover behind a stable address. A retry on a new connection is safe for
/// the latter: the script's first write failed, so it wrote nothing.
///
/// A reply the store cannot read (`Parse`: not the script's shape, from a
/// proxy or another server) is not one: redis-rs counts it as needing a
/// reconnect, but Redis ran the call, and sending it again would spend its
/// tokens twice.
pub(crate) fn is_connection_error(e: &RedisError) -> bool {
    if e.kind() == RedisKind::Parse {
        return false;
    }
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || matches!(
            e.kind(),
            RedisKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
        || matches!(
            script_call_code(e).as_deref(),
            Some("READONLY" | "MASTERDOWN")
        )
}

/// The code of the error a script's `redis.call` met, when the server wraps
/// it in a script error: Redis 6.2 answers `ERR Error running script (call to
/// f_...): @user_script:266: @user_script: 266: -OOM command not allowed ...`
/// where Redis 7 and Valkey answer the `OOM ...` error itself.
fn script_call_code(e: &RedisError) -> Option<String> {
    wrapped_code(&e.to_string()).map(str::to_owned)
}

/// The code after the last `: -` of a wrapped script error's message.
fn wrapped_code(message: &str) -> Option<&str> {
    let (_, inner) = message
        .split_once("Error running script")?
        .1
        .rsplit_once(": -")?;
    inner
        .split_whitespace()
        .next()
        .filter(|code| code.bytes().all(|b| b.is_ascii_uppercase()))
}

/// What kind of failure a Redis error is. Sentinels that name no usable
/// primary (during a failover) are a connection failure: there is nobody to
/// connect to yet.
pub(crate) fn kind_of(e: &RedisError) -> ErrorKind {
    if e.code() == Some("OOM") || script_call_code(e).as_deref() == Some("OOM") {
        ErrorKind::OutOfMemory
    } else if e.is_timeout() {
        ErrorKind::Timeout
    } else if is_connection_error(e)
        || matches!(
            e.kind(),
            RedisKind::MasterNameNotFoundBySentinel | RedisKind::EmptySentinelList
        )
    {
        ErrorKind::Connection
    } else {
        ErrorKind::Server
    }
}

/// `e`, from the server at `host`, as a store error of its kind.
pub(crate) fn classify(e: RedisError, host: &Arc<str>) -> Error {
    Error::store(
        kind_of(&e),
        AtHost {
            host: Arc::clone(host),
            error: e,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::{RedisError, RedisKind, is_connection_error, wrapped_code};

    /// A reply that is not the script's shape was still a reply: the call
    /// ran, so it is no broken connection (which would resend it).
    #[test]
    fn an_unreadable_reply_is_not_a_broken_connection() {
        let parse = RedisError::from((RedisKind::Parse, "odd reply", "an integer".to_owned()));
        assert!(!is_connection_error(&parse));
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(is_connection_error(&io));
    }

    #[test]
    fn redis_6_script_errors_give_the_code_of_the_call_they_wrap() {
        let oom = "Error running script (call to f_adee3758): @user_script:266: \
                   @user_script: 266: -OOM command not allowed when used memory > 'maxmemory'.";
        assert_eq!(wrapped_code(oom), Some("OOM"));
        let readonly = "ResponseError: Error running script (call to f_1): @user_script:2: \
                        @user_script: 2: -READONLY You can't write against a read only replica.";
        assert_eq!(wrapped_code(readonly), Some("READONLY"));
        // A script's own error, or any other error, wraps no code.
        assert_eq!(
            wrapped_code("Error running script (call to f_1): @user_script:3: bad"),
            None
        );
        assert_eq!(wrapped_code("OOM command not allowed: -READONLY"), None);
    }
}
