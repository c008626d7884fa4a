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
pub(crate) fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || matches!(
            e.kind(),
            RedisKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
}

/// What kind of failure a Redis error is. Sentinels that name no usable
/// primary (during a failover) are a connection failure: there is nobody to
/// connect to yet.
pub(crate) fn kind_of(e: &RedisError) -> ErrorKind {
    if e.code() == Some("OOM") {
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
