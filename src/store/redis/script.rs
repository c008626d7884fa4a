//! The token bucket script: its arguments, how it is sent (`EVALSHA`, and
//! `EVAL` when the server has not cached it) and what its reply means.

use redis::aio::ConnectionLike;
use redis::{RedisError, ServerErrorKind};

use crate::decision::{Decision, QuotaState};
use crate::error::{Error, ErrorKind};
use crate::{Policy, Quota};

/// The token bucket script as production runs it: the clock is Redis `TIME`.
pub(crate) const SOURCE: &str = include_str!("../../../lua/token_bucket.lua");

/// The line of [`SOURCE`] that reads the clock.
#[cfg(feature = "test-util")]
const CLOCK_LINE: &str = "local now = redis.call(\"TIME\") -- tollgate:clock";

/// A script and its SHA-1, as `EVALSHA` needs it.
#[derive(Debug)]
pub(crate) struct Script {
    source: String,
    sha: String,
}

impl Script {
    /// The production script.
    pub(crate) fn production() -> Self {
        Self::new(SOURCE.to_owned())
    }

    /// The test variant (feature `test-util`): reads a microsecond clock from
    /// `ARGV[2]` when it is not empty. It is another script with another SHA,
    /// so production calls, which send the production script's SHA, can never
    /// run it.
    #[cfg(feature = "test-util")]
    pub(crate) fn with_test_clock() -> Self {
        let clock = "local now = ARGV[2] ~= \"\" and \
                     {math.floor(tonumber(ARGV[2]) / 1000000), tonumber(ARGV[2]) % 1000000} \
                     or redis.call(\"TIME\")";
        Self::new(SOURCE.replacen(CLOCK_LINE, clock, 1))
    }

    fn new(source: String) -> Self {
        let sha = redis::Script::new(&source).get_hash().to_owned();
        Script { source, sha }
    }
}

/// One call of the script: its keys and arguments.
pub(crate) struct Call {
    keys: Vec<String>,
    args: Vec<u64>,
    clock: Option<u64>,
}

impl Call {
    /// A check of `cost` against every quota of `policy`, with one key per
    /// quota. `clock` (tests only) replaces Redis `TIME`.
    pub(crate) fn check(keys: Vec<String>, policy: &Policy, cost: u64, clock: Option<u64>) -> Self {
        let mut args = Vec::with_capacity(1 + 3 * policy.quotas().len());
        args.push(cost);
        for q in policy.quotas() {
            args.extend([q.capacity(), q.num(), q.den()]);
        }
        Call { keys, args, clock }
    }

    /// Runs the call with `EVALSHA`; a server that does not have the script
    /// (after a restart, a failover or `SCRIPT FLUSH`; in a cluster, each node
    /// has its own cache) gets it with `EVAL` on the same keys, which also
    /// caches it on that very node.
    pub(crate) async fn run<C: ConnectionLike>(
        &self,
        conn: &mut C,
        script: &Script,
    ) -> Result<Vec<i64>, RedisError> {
        match self.command("EVALSHA", &script.sha).query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.command("EVAL", &script.source).query_async(conn).await
            }
            other => other,
        }
    }

    fn command(&self, name: &str, script: &str) -> redis::Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(script).arg(self.keys.len()).arg(&self.keys);
        cmd.arg(self.args.first().copied().unwrap_or(0));
        match self.clock {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        cmd.arg(self.args.get(1..).unwrap_or(&[]));
        cmd
    }
}

/// The decision a reply of the script describes: `allowed`, then per quota
/// `remaining`, `retry_after_us`, `reset_after_us`.
pub(crate) fn decision(quotas: &[Quota], reply: &[i64]) -> Result<Decision, Error> {
    let malformed = || {
        Error::store(
            ErrorKind::Server,
            format!("unexpected reply from the rate limit script: {reply:?}"),
        )
    };
    let (allowed, rest) = reply.split_first().ok_or_else(malformed)?;
    if rest.len() != quotas.len() * 3 {
        return Err(malformed());
    }
    let states = quotas
        .iter()
        .zip(rest.chunks_exact(3))
        .map(|(q, c)| match *c {
            [remaining, retry, reset] => {
                let n = |v: i64| u64::try_from(v).map_err(|_| malformed());
                Ok(QuotaState::new(*q, n(remaining)?, n(retry)?, n(reset)?))
            }
            _ => Err(malformed()),
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(Decision::new(*allowed == 1, states))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_of_the_wrong_shape_are_store_errors() {
        let q = [Quota::per_second(1).unwrap()];
        assert!(decision(&q, &[1, 0, 0, 0]).is_ok());
        for bad in [&[][..], &[1, 0, 0], &[1, -1, 0, 0], &[1, 0, 0, 0, 0]] {
            let err = decision(&q, bad).unwrap_err();
            assert!(err.is_store_error(), "{err:?}");
        }
    }

    #[cfg(feature = "test-util")]
    #[test]
    fn the_test_clock_is_another_script() {
        let test = Script::with_test_clock();
        let production = Script::production();
        assert_ne!(test.sha, production.sha);
        assert!(!test.source.contains(CLOCK_LINE));
        assert!(production.source.contains(CLOCK_LINE));
        // Outside comments, production never reads the clock argument.
        let code = |s: &str| {
            s.lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert!(!code(&production.source).contains("ARGV[2]"));
        assert!(code(&test.source).contains("ARGV[2]"));
    }
}
