//! Finding bucket keys with a bounded `SCAN`, for operators' tools (the
//! `tollgate` command line): [`RedisStore::scan_buckets`] and
//! [`BucketScan`].
//!
//! `SCAN` visits a keyspace a few keys per call without blocking the server,
//! but a whole keyspace can be millions of keys: a scan here stops after the
//! number of keys its caller allows, and says whether it reached the end.
//! On a Redis Cluster every primary is scanned (each holds its own keys),
//! the allowance shared between them.

use std::collections::BTreeSet;

use redis::{Cmd, RedisResult, Value};

use super::connection::Conn;
use super::inspect::{number, parse_key};
use super::store::RedisStore;
use crate::error::{Error, ErrorKind};

/// The most keys one `SCAN` call is asked to visit (its `COUNT`): a call
/// takes the server well under a millisecond.
const SCAN_COUNT: u64 = 1_000;

/// What a [`RedisStore::scan_buckets`] found, and how far it went.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct BucketScan {
    keys: Vec<String>,
    nodes: usize,
    calls: u64,
    visited: u64,
    total_keys: u64,
    complete: bool,
}

impl BucketScan {
    /// The bucket keys found, sorted, each once.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The servers scanned: 1, or the primaries of a cluster.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The `SCAN` calls made.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// The keys the calls were asked to visit (the sum of their `COUNT`s):
    /// about as many as `SCAN` looked at, of every kind.
    pub fn visited(&self) -> u64 {
        self.visited
    }

    /// The keys on the scanned servers when the scan began (`DBSIZE`), of
    /// every kind.
    pub fn total_keys(&self) -> u64 {
        self.total_keys
    }

    /// Whether every server was scanned to its end; `false` when the scan
    /// stopped at its bound, so buckets it did not reach are missing.
    pub fn complete(&self) -> bool {
        self.complete
    }
}

/// Where a call goes: the one server, or the primary serving a slot.
#[derive(Clone, Copy, Debug)]
enum Node {
    Single,
    Primary(u16),
}

impl RedisStore {
    /// The keys of buckets whose client part starts with `client_start`
    /// (`"api:"`: every bucket of policy `api`; `""`: every bucket under
    /// this store's prefix), found by `SCAN` with at most about
    /// `max_visits` keys visited in all (at least one call per server).
    /// Read them with [`read_buckets`](Self::read_buckets). Writes nothing;
    /// the store's own keys (its epoch) are never listed.
    ///
    /// Each call is bounded by the store timeout; the circuit breaker
    /// neither refuses nor counts them.
    ///
    /// ```no_run
    /// use tollgate::{Policy, Quota, RedisStore};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::from_url("redis://127.0.0.1:6379")?;
    /// let api = Policy::new("api", [Quota::per_second(10)?, Quota::per_hour(1000)?])?;
    /// // The buckets of policy "api", visiting at most about 10 000 keys.
    /// let scan = store.scan_buckets("api:", 10_000).await?;
    /// let buckets = store.read_buckets(&api, scan.keys()).await?;
    /// println!("{} buckets, complete: {}", buckets.len(), scan.complete());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A store error when a call fails or times out.
    pub async fn scan_buckets(
        &self,
        client_start: &str,
        max_visits: u64,
    ) -> Result<BucketScan, Error> {
        let nodes = self.bounded(nodes_of, false, None).await?;
        let pattern = format!(
            "{}{{{}*",
            glob_escape(self.prefix()),
            glob_escape(client_start)
        );
        let share = (max_visits / nodes.len().max(1) as u64).max(1);
        let mut found = BTreeSet::new();
        let mut scan = BucketScan {
            keys: Vec::new(),
            nodes: nodes.len(),
            calls: 0,
            visited: 0,
            total_keys: 0,
            complete: true,
        };
        for node in nodes {
            let dbsize = redis::cmd("DBSIZE");
            let size = self.on(node, &dbsize).await?;
            scan.total_keys += number(&size).ok_or_else(|| self.unexpected("DBSIZE"))?;
            let (mut cursor, mut left) = (0u64, share);
            loop {
                let count = left.min(SCAN_COUNT);
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(count);
                let reply = self.on(node, &cmd).await?;
                let (next, keys) = page(reply).ok_or_else(|| self.unexpected("SCAN"))?;
                scan.calls += 1;
                scan.visited += count;
                left -= count;
                found.extend(
                    keys.into_iter()
                        .filter(|k| parse_key(self.prefix(), k).is_some()),
                );
                cursor = next;
                if cursor == 0 {
                    break;
                }
                if left == 0 {
                    scan.complete = false;
                    break;
                }
            }
        }
        scan.keys = found.into_iter().collect();
        Ok(scan)
    }

    /// `cmd` sent to `node`, bounded by the store timeout.
    async fn on(&self, node: Node, cmd: &Cmd) -> Result<Value, Error> {
        self.bounded(|conn| send(conn, node, cmd), false, None)
            .await
    }

    fn unexpected(&self, command: &str) -> Error {
        Error::store(
            ErrorKind::Server,
            format!("Redis at {}: unexpected reply to {command}", self.host()),
        )
    }
}

/// The servers to scan: this one, or every primary of a cluster (by a slot
/// it serves, read from `CLUSTER SLOTS`).
async fn nodes_of(mut conn: Conn) -> RedisResult<Vec<Node>> {
    if !conn.is_composite() {
        return Ok(vec![Node::Single]);
    }
    let reply: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn)
        .await?;
    Ok(primaries(&reply).into_iter().map(Node::Primary).collect())
}

/// One slot of each primary in a `CLUSTER SLOTS` reply: the first of its
/// first range.
fn primaries(reply: &Value) -> Vec<u16> {
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    let mut seen: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            continue;
        };
        let (Some(Value::Int(start)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(2))
        else {
            continue;
        };
        let address = format!("{primary:?}");
        if let Ok(slot) = u16::try_from(*start)
            && !seen.iter().any(|(a, _)| *a == address)
        {
            seen.push((address, slot));
        }
    }
    seen.into_iter().map(|(_, slot)| slot).collect()
}

/// `cmd` on `node`: on a cluster, routed to the primary of the node's slot.
async fn send(conn: Conn, node: Node, cmd: &Cmd) -> RedisResult<Value> {
    match (conn, node) {
        (Conn::Cluster(cluster), Node::Primary(slot)) => cluster.on_primary_of(slot, cmd).await,
        (mut conn, _) => cmd.query_async(&mut conn).await,
    }
}

/// A `SCAN` reply: the next cursor and the keys.
fn page(reply: Value) -> Option<(u64, Vec<String>)> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let mut parts = parts.into_iter();
    let cursor = number(&parts.next()?)?;
    let Value::Array(keys) = parts.next()? else {
        return None;
    };
    let keys = keys
        .into_iter()
        .filter_map(|k| match k {
            Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
            _ => None,
        })
        .collect();
    Some((cursor, keys))
}

/// `text` with the characters `SCAN`'s `MATCH` reads as a pattern escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn patterns_match_only_what_they_say() {
        assert_eq!(glob_escape("api:"), "api:");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn a_scan_page_is_its_cursor_and_keys() {
        let reply = Value::Array(vec![bulk("17"), Value::Array(vec![bulk("a"), bulk("b")])]);
        assert_eq!(page(reply), Some((17, vec!["a".into(), "b".into()])));
        assert_eq!(page(Value::Nil), None);
    }

    #[test]
    fn each_primary_is_scanned_once() {
        let node = |port: i64| Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk("id")]);
        let range = |start: i64, end: i64, port: i64| {
            Value::Array(vec![
                Value::Int(start),
                Value::Int(end),
                node(port),
                node(port + 100),
            ])
        };
        let reply = Value::Array(vec![
            range(0, 5460, 7000),
            range(5461, 10922, 7001),
            range(10923, 16383, 7002),
            range(16000, 16001, 7000),
        ]);
        assert_eq!(primaries(&reply), vec![0, 5461, 10923]);
    }
}
