//! Reading the slot map again: `CLUSTER SLOTS` through the cluster
//! connection, one read at a time, spaced (see `nodes.rs`).

use std::sync::Arc;

use redis::Value;

use super::super::store::{RedisStore, STORE};
use super::nodes::Nodes;
use crate::error::Error;
use crate::observe;

/// A read of the slot map that `Nodes::begin_refresh` allowed: ends it when
/// dropped, whether the read finished, failed, or its task never finished
/// (dropped with its runtime, or panicking).
pub(super) struct SlotRead(pub(super) Arc<Nodes>);

impl Drop for SlotRead {
    fn drop(&mut self) {
        self.0.end_refresh();
    }
}

/// Reads the slot map of `store` into `nodes` again in the background, unless
/// a read runs or one started within the refresh interval.
pub(super) fn refresh(store: &RedisStore, nodes: &Arc<Nodes>) {
    if nodes.begin_refresh(true) {
        // Owned by the task from here: a task that never finishes still
        // ends the read, so later refreshes can start.
        let read = SlotRead(Arc::clone(nodes));
        let store = store.clone();
        tokio::spawn(async move { store.read_slots(&read).await });
    }
}

impl RedisStore {
    /// Reads `CLUSTER SLOTS` through the cluster connection into the slot map,
    /// in the `read` that `begin_refresh` allowed (which ends it when
    /// dropped). A failure keeps the old map and is reported as a store error
    /// (not counted by the breaker).
    pub(super) async fn read_slots(&self, read: &SlotRead) {
        let nodes = &read.0;
        let read = self
            .bounded(
                |mut conn| async move {
                    redis::cmd("CLUSTER")
                        .arg("SLOTS")
                        .query_async::<Value>(&mut conn)
                        .await
                },
                false,
                None,
            )
            .await;
        let failure = match read {
            Ok(reply) => nodes.install(&reply).err().map(|why| {
                Error::store(
                    crate::ErrorKind::Server,
                    format!("Redis at {}: {why}", self.inner.link.host()),
                )
            }),
            Err(err) => Some(err),
        };
        if let Some(err) = failure {
            observe::store_error(STORE, &err, &self.inner.errors);
        }
    }
}
