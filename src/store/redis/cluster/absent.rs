//! What the store's generic code names of `cluster/` when the cargo feature
//! `cluster` is off: types that cannot be made, so that the code's cluster
//! branches compile and are never taken (`mod.rs` picks this file or the
//! real module).

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

/// Where cluster connections would come from: never, in this build.
pub(crate) enum ClusterSource {}

impl ClusterSource {
    pub(crate) async fn connect(&self) -> Result<ClusterConn, RedisError> {
        match *self {}
    }

    pub(crate) fn resends(&self) -> bool {
        match *self {}
    }
}

/// A cluster connection: none in this build.
#[derive(Clone)]
pub(crate) enum ClusterConn {}

impl ClusterConn {
    pub(crate) fn for_refund(self) -> Option<ClusterConn> {
        match self {}
    }

    pub(crate) async fn on_primary_of(self, _: u16, _: &Cmd) -> RedisResult<Value> {
        match self {}
    }
}

impl ConnectionLike for ClusterConn {
    fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> RedisFuture<'a, Value> {
        match *self {}
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a Pipeline,
        _: usize,
        _: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match *self {}
    }

    fn get_db(&self) -> i64 {
        match *self {}
    }
}
