//! What a store on a cluster adds to batching ([`PerNode`]): a queue per
//! primary (`nodes.rs`), read again when stale (`refresh.rs`), whose batches
//! go out as one call of the spread script (`spread.rs`), the checks of other
//! clients in the first one's slot apart (`slots.rs`).

use std::sync::Arc;
#[cfg(feature = "test-util")]
use std::{future::Future, pin::Pin};

use super::super::batch::{Batcher, Queued};
use super::super::encode::SlotOf;
use super::super::script::Script;
use super::super::store::{PerNode, RedisStore};
use super::nodes::Nodes;
use super::refresh;
use super::slots::{hash_slot, others_in_first_slot};
#[cfg(feature = "test-util")]
use crate::decision::Decision;
#[cfg(feature = "test-util")]
use crate::error::Error;
#[cfg(feature = "test-util")]
use crate::policy::Policy;
use crate::store::breaker::CircuitBreaker;

/// The queues per primary of a store on a cluster, and its spread scripts.
struct Queues {
    nodes: Arc<Nodes>,
    /// The script for batches over several slots of one node.
    spread: Script,
    #[cfg(feature = "test-util")]
    spread_test: Script,
}

/// The per-node queues of a store on a cluster whose batches hold at most
/// `max_batch` checks, each node behind a breaker set as `breaker`.
pub(crate) fn per_node(max_batch: usize, breaker: CircuitBreaker) -> Box<dyn PerNode> {
    Box::new(Queues {
        nodes: Arc::new(Nodes::new(max_batch, breaker)),
        spread: Script::spread(),
        #[cfg(feature = "test-util")]
        spread_test: Script::spread_with_test_clock(),
    })
}

impl PerNode for Queues {
    fn queue_for(&self, key: &str) -> Option<Arc<Batcher>> {
        self.nodes.queue_for(key)
    }

    fn refresh(&self, store: &RedisStore) {
        refresh::refresh(store, &self.nodes);
    }

    fn apart(&self, checks: &mut Vec<Queued>) -> Vec<Queued> {
        others_in_first_slot(checks, |c| c.keys.first().map(String::as_str))
    }

    fn spread(&self) -> (&Script, SlotOf) {
        (&self.spread, hash_slot)
    }

    #[cfg(feature = "test-util")]
    fn check_batch_at<'a>(
        &'a self,
        store: &'a RedisStore,
        checks: &'a [(&'a str, &'a Policy, u64)],
        now_us: u64,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Decision>, Error>> + Send + 'a>> {
        Box::pin(store.check_batch_on_nodes(&self.nodes, &self.spread_test, checks, now_us))
    }
}
