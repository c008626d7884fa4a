//! The connection a Redis store holds, and its lifecycle.
//!
//! - **One connection, held.** Every call runs on a clone of one multiplexed
//!   connection, so concurrent calls pipeline on its socket; there is no pool
//!   checkout (and no `PING`) per call.
//! - **Connecting runs outside the calls.** A connect is a task of its own with
//!   its own timeout ([`connect_timeout`](super::RedisStoreBuilder::connect_timeout)):
//!   a call waits for it at most its own timeout, and a connect slower than that
//!   still completes and serves later calls. One connect runs at a time, so the
//!   calls in flight after a restart share it. After a failed connect the next
//!   one waits a backoff (50 ms doubling to 250 ms); calls in between fail at
//!   once with the last connect error instead of piling up, except the circuit
//!   breaker's probe, which connects at once: it is there to find out whether
//!   the store is back.
//! - **A slow call does not drop a healthy connection.** After a timeout the
//!   connection is checked with a `PING` in the background, and dropped only if
//!   that fails or a second call in a row times out. A connection that breaks
//!   (I/O error, `READONLY` or `MASTERDOWN` after a failover) is dropped at once.
//! - **redis-rs's own response timeout** is set to four times the store's
//!   timeout (at least one second): it never decides before the store's
//!   timeout does, and only frees the replies that never come.
//! - **A cluster connection is replaced, never dropped.** redis-rs follows
//!   `MOVED`/`ASK`, reconnects a node whose socket closed and refreshes the
//!   slot map; but a node that stops answering without closing its sockets
//!   (a dead host, a partition) keeps its slots' calls timing out, since a
//!   timeout makes redis-rs neither reconnect nor ask for the slot map. So
//!   after a timeout or an error redis-rs gave up on, a new cluster
//!   connection (new sockets, a fresh slot map from the seeds) is made in the
//!   background, at most once a second, while the old one keeps serving the
//!   other nodes' calls; it takes over once it is up. A refund goes on a
//!   second cluster connection, made without redis-rs's retries
//!   ([`Conn::for_call`]).
//! - **Sentinel** is asked for the primary on every connect, so the connect
//!   after a failover (a broken socket, `READONLY` from the demoted primary)
//!   finds the new one.
//!
//! Files, bottom up, one job each:
//! - `conn.rs`: a connection of any topology ([`Conn`]), and the one a call
//!   that gives tokens back goes on.
//! - `source.rs`: where connections come from ([`Source`]) and redis-rs's
//!   response timeout for those the store does not make itself.
//! - `state.rs`: what the clones of one store share ([`Inner`]): the held
//!   connection (`HeldConn`), the connect under way, the backoff.
//! - `connect.rs`: one connect, a task of its own, and the guard that ends
//!   it however its task ends.
//! - `link.rs`: [`Link`], the lifecycle: getting the held connection, and
//!   what a success, a broken connection or a timeout does to it.

mod conn;
mod connect;
mod link;
mod source;
mod state;

pub(crate) use conn::{Conn, RESENDS};
pub(crate) use link::Link;
pub(crate) use source::Source;
#[allow(
    unused_imports,
    reason = "used by cluster/ when the cluster feature is on"
)]
pub(crate) use source::response_timeout;
pub(crate) use state::Inner;
