//! A connection of any topology ([`Conn`]): one server's multiplexed
//! connection or a cluster's, used through redis-rs's `ConnectionLike`.

use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use super::super::cluster::ClusterConn;

/// Why a refund is refused on an application's cluster pool.
pub(crate) const RESENDS: &str = "a script call giving tokens back is never sent on an \
     application's cluster pool: its client (deadpool-redis builds it with redis-rs's \
     default of 16 retries) may send it again after a broken connection, and Redis may \
     have run it already; build the store with .cluster(seed_urls) instead";

/// A connection of any topology, used through redis-rs's `ConnectionLike`.
#[derive(Clone)]
pub(crate) enum Conn {
    Multiplexed(MultiplexedConnection),
    /// A Redis Cluster's (cargo feature `cluster`): routes each command to
    /// the primary of its first key's slot.
    Cluster(ClusterConn),
}

impl Conn {
    /// Whether the connection is many connections (a cluster): one failing
    /// node says nothing about the others, so it is replaced in the background
    /// instead of dropped.
    pub(crate) fn is_composite(&self) -> bool {
        match self {
            Conn::Multiplexed(_) => false,
            Conn::Cluster(_) => true,
        }
    }

    /// The connection for a call: this one, or for a call that gives tokens
    /// back (`gives_back`, see `Batch::run`), one whose client never sends
    /// it again. redis-rs's cluster client resends a call itself after a
    /// broken connection or a timeout (as after a redirect), up to its
    /// `retries`, and Redis may have run it before the connection broke: a
    /// refund goes on the store's second cluster connection, made with
    /// `retries(0)`, where every failure comes back to the store, which
    /// never resends a refund. A multiplexed connection resends nothing
    /// itself. An application's cluster pool has no second connection: an
    /// error, and nothing is sent.
    pub(crate) fn for_call(self, gives_back: bool) -> Result<Conn, RedisError> {
        if !gives_back {
            return Ok(self);
        }
        match self {
            Conn::Cluster(cluster) => cluster.for_refund().map(Conn::Cluster).ok_or_else(|| {
                RedisError::from((redis::ErrorKind::Client, "not sent", RESENDS.to_owned()))
            }),
            conn => Ok(conn),
        }
    }

    pub(super) fn set_response_timeout(&mut self, timeout: Duration) {
        match self {
            Conn::Multiplexed(c) => c.set_response_timeout(timeout),
            // Set on the cluster client when the store builds it; an
            // application's cluster pool keeps the application's settings.
            Conn::Cluster(_) => {}
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Multiplexed(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Multiplexed(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Multiplexed(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
