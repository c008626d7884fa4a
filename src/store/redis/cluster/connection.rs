//! A cluster's connections: where they come from ([`ClusterSource`]: the
//! store's own clients, or the application's cluster pool) and what the
//! store does with one ([`ClusterConn`]): calls routed by their first key's
//! slot, refunds on a connection that never resends, commands sent to the
//! primary of a slot.

use std::task::Poll;

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

/// Where a store's cluster connections come from.
#[allow(
    clippy::large_enum_variant,
    reason = "one per store, made once at start-up and never moved after"
)]
pub(crate) enum ClusterSource {
    /// Redis Cluster clients, from seed URLs (their timeouts set by the
    /// builder): one that follows `MOVED`/`ASK` and retries, and one that
    /// never sends a call again (see [`ClusterConn::for_refund`]).
    Clients {
        routed: ClusterClient,
        once: ClusterClient,
    },
    /// The application's deadpool-redis cluster pool; one cluster connection
    /// is taken and kept. Its client resends calls on its own (see
    /// [`resends`](Self::resends)).
    Pool(deadpool_redis::cluster::Pool),
}

impl ClusterSource {
    pub(crate) async fn connect(&self) -> Result<ClusterConn, RedisError> {
        match self {
            ClusterSource::Clients { routed, once } => {
                // Both at once: a seed that never answers costs each the
                // same wait, which must fit in one connect timeout.
                let (routed, once) =
                    both(routed.get_async_connection(), once.get_async_connection()).await;
                Ok(ClusterConn {
                    routed: routed?,
                    once: Some(once?),
                })
            }
            ClusterSource::Pool(pool) => {
                let pooled = pool.get().await.map_err(|e| match e {
                    deadpool_redis::cluster::PoolError::Backend(e) => e,
                    other => RedisError::from(std::io::Error::other(other.to_string())),
                })?;
                Ok(ClusterConn {
                    routed: deadpool_redis::cluster::Connection::take(pooled),
                    once: None,
                })
            }
        }
    }

    /// Whether every connection from here may send a call again on its own
    /// (an application's cluster pool).
    pub(crate) fn resends(&self) -> bool {
        matches!(self, ClusterSource::Pool(_))
    }
}

/// The outcomes of `a` and `b`, run together.
async fn both<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    let (mut done_a, mut done_b) = (None, None);
    std::future::poll_fn(|cx| {
        if done_a.is_none()
            && let Poll::Ready(out) = a.as_mut().poll(cx)
        {
            done_a = Some(out);
        }
        if done_b.is_none()
            && let Poll::Ready(out) = b.as_mut().poll(cx)
        {
            done_b = Some(out);
        }
        match (done_a.take(), done_b.take()) {
            (Some(a), Some(b)) => Poll::Ready((a, b)),
            (a, b) => {
                (done_a, done_b) = (a, b);
                Poll::Pending
            }
        }
    })
    .await
}

/// A cluster connection: routes each command to the primary of its first
/// key's slot. `once`, made with no retries, is for the calls that must
/// never be sent twice (`None` on an application's cluster pool).
#[derive(Clone)]
pub(crate) struct ClusterConn {
    routed: ClusterConnection,
    once: Option<ClusterConnection>,
}

impl ClusterConn {
    /// The connection for a call that gives tokens back: the one whose
    /// client never sends a call again (see `Conn::for_call`); `None` on an
    /// application's cluster pool, which has none.
    pub(crate) fn for_refund(self) -> Option<ClusterConn> {
        self.once.map(|c| ClusterConn {
            routed: c.clone(),
            once: Some(c),
        })
    }

    /// `cmd` sent to the primary that serves `slot`.
    pub(crate) async fn on_primary_of(mut self, slot: u16, cmd: &Cmd) -> RedisResult<Value> {
        let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
        self.routed
            .route_command(cmd.clone(), RoutingInfo::SingleNode(route))
            .await
    }
}

impl ConnectionLike for ClusterConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.routed.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.routed.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.routed.get_db()
    }
}
