//! What went wrong, and the exit code that says so.

use std::fmt;
use std::process::ExitCode;

/// A command that could not be carried out.
#[derive(Debug)]
pub(crate) struct Failure {
    kind: Kind,
    message: String,
}

/// Whose mistake: the command's, or the store's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The command, the URL, the limits file or a quota: exit code 2.
    Usage,
    /// The store: unreachable, timed out, an error from Redis: exit code 3.
    Store,
}

impl Failure {
    /// A mistake in what was asked.
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Failure {
            kind: Kind::Usage,
            message: message.into(),
        }
    }

    /// The exit code: 2 for a mistake in what was asked, 3 for the store.
    pub(crate) fn exit_code(&self) -> ExitCode {
        match self.kind {
            Kind::Usage => ExitCode::from(2),
            Kind::Store => ExitCode::from(3),
        }
    }

    /// `usage` or `store`, for JSON.
    pub(crate) fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::Usage => "usage",
            Kind::Store => "store",
        }
    }

    /// What went wrong, in one line.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A configuration mistake (URL, prefix, quota, policy): the library's
/// message, which never shows a password.
impl From<tollgate::ConfigError> for Failure {
    fn from(e: tollgate::ConfigError) -> Self {
        Failure::usage(e.to_string())
    }
}

/// A check's error: a cost no bucket can hold is the command's mistake;
/// anything else is the store's (its message names the server, never a
/// password).
impl From<tollgate::Error> for Failure {
    fn from(e: tollgate::Error) -> Self {
        let kind = if e.is_store_error() {
            Kind::Store
        } else {
            Kind::Usage
        };
        Failure {
            kind,
            message: e.to_string(),
        }
    }
}
