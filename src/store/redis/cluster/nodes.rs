//! Batching on a Redis Cluster, per node: which primary serves each slot, and
//! one queue of checks per primary.
//!
//! - **Grouped by node.** A check goes into the queue of the primary that
//!   serves its client's slot (the CRC16 of the `{hash tag}`), by the last
//!   slot map the store read (`CLUSTER SLOTS`, through the cluster
//!   connection). Each queue has its own calls in flight, so a slow node does
//!   not hold up the others, and its own in-flight window, which follows
//!   that node's round trips (see `batch.rs`). The window's floor is
//!   [`MIN_IN_FLIGHT`](super::super::window::MIN_IN_FLIGHT) with one primary, one
//!   each with several. Two calls keep a lone node busy while a reply
//!   travels; with several primaries the others work meanwhile, and one call
//!   at a time makes each busy node's batches about twice as deep, which
//!   costs Redis less per decision (`cargo bench --bench cluster --features
//!   cluster` prints each primary's batch depth). A node far away opens its
//!   window from there as a lone node's does.
//! - **One call, one node, several slots.** A batch goes out as one call of
//!   `Script::spread`, routed by its first check's slot; the script checks that
//!   the node serves every other key before it writes anything.
//! - **A stale map costs speed, never answers.** If the node does not serve
//!   every key (a slot moved, a failover split slots differently), the call
//!   writes nothing and says so; its checks are then sent one by one, each
//!   routed to its own slot (redis-rs follows `MOVED` and `ASK`), and the map
//!   is read again. Without a map (before the first read) checks are sent one
//!   by one.
//! - **Migrations.** A call declares the keys of its first slot, and checks
//!   of other clients in that slot go apart: after `ASK` the slot's new
//!   primary runs the call with `ASKING` and would read an undeclared,
//!   not yet moved key of that slot as missing. The same holds for a second
//!   slot imported into that primary at the same moment: left open (one
//!   slot moves at a time with `redis-cli --cluster reshard`).
//! - **Read again** when the store has none, after such a call, and after a
//!   batch failed (a failover, a replaced connection), at most once per
//!   [`REFRESH_INTERVAL`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::super::batch::Batcher;
use super::slots::hash_slot;
use crate::store::breaker::{Breaker, CircuitBreaker};

/// Hash slots of a Redis Cluster.
const SLOTS: usize = super::slots::SLOTS as usize;
/// A slot no primary serves in the map.
const UNSERVED: u16 = u16::MAX;
/// At most one read of the slot map per this interval.
pub(crate) const REFRESH_INTERVAL: Duration = Duration::from_millis(100);
/// The `store` label of a cluster node's breaker, in tracing and metrics.
const NODE: &str = "redis-node";

/// Which primary serves each slot, and each primary's queue.
struct SlotMap {
    /// Per slot: the index of its primary in `queues`, or [`UNSERVED`].
    owners: Vec<u16>,
    /// Per primary: its node id (or address) and its queue.
    queues: Vec<(String, Arc<Batcher>)>,
}

/// The per-node queues of a store on a cluster.
pub(crate) struct Nodes {
    max_batch: usize,
    /// Each node's breaker is made from the store's settings.
    breaker: CircuitBreaker,
    map: Mutex<Option<Arc<SlotMap>>>,
    refreshing: AtomicBool,
    refreshed_at: Mutex<Option<Instant>>,
}

impl Nodes {
    pub(crate) fn new(max_batch: usize, breaker: CircuitBreaker) -> Self {
        Nodes {
            max_batch,
            breaker,
            map: Mutex::new(None),
            refreshing: AtomicBool::new(false),
            refreshed_at: Mutex::new(None),
        }
    }

    fn map(&self) -> MutexGuard<'_, Option<Arc<SlotMap>>> {
        crate::lock::lock(&self.map)
    }

    /// The queue of the primary that serves `key`'s slot by the last map;
    /// `None` without a map or when the map has no primary for the slot.
    pub(crate) fn queue_for(&self, key: &str) -> Option<Arc<Batcher>> {
        let map = self.map().clone()?;
        let owner = *map.owners.get(usize::from(hash_slot(key.as_bytes())))?;
        map.queues
            .get(usize::from(owner))
            .map(|(_, queue)| Arc::clone(queue))
    }

    /// Whether the store has read a slot map yet.
    #[cfg(feature = "test-util")]
    pub(crate) fn has_map(&self) -> bool {
        self.map().is_some()
    }

    /// Whether a read of the slot map may start now: none runs and, if
    /// `spaced`, none started within [`REFRESH_INTERVAL`]. If so, the caller
    /// reads it, maybe [`install`](Self::install)s it, and ends the read with
    /// [`end_refresh`](Self::end_refresh), from a drop guard (`refresh.rs`), so
    /// a read whose task never finishes still ends.
    pub(crate) fn begin_refresh(&self, spaced: bool) -> bool {
        let mut at = crate::lock::lock(&self.refreshed_at);
        let now = Instant::now();
        if spaced && at.is_some_and(|at| now.duration_since(at) < REFRESH_INTERVAL) {
            return false;
        }
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return false;
        }
        *at = Some(now);
        true
    }

    /// Ends a read of the slot map, however it went.
    pub(crate) fn end_refresh(&self) {
        self.refreshing.store(false, Ordering::Release);
    }

    /// Installs the slot map of a `CLUSTER SLOTS` reply, keeping the queue of
    /// every primary that stays (its checks and calls in flight go on). A
    /// reply it cannot read leaves the old map.
    pub(crate) fn install(&self, reply: &Value) -> Result<(), String> {
        self.parse(reply).map(|map| {
            *self.map() = Some(Arc::new(map));
        })
    }

    fn parse(&self, reply: &Value) -> Result<SlotMap, String> {
        let Value::Array(ranges) = reply else {
            return Err(format!("CLUSTER SLOTS replied {reply:?}"));
        };
        let old: HashMap<String, Arc<Batcher>> = self
            .map()
            .as_ref()
            .map(|m| m.queues.iter().cloned().collect())
            .unwrap_or_default();
        let mut owners = vec![UNSERVED; SLOTS];
        let mut queues: Vec<(String, Arc<Batcher>)> = Vec::new();
        for range in ranges {
            let (start, end, node) = parse_range(range)
                .ok_or_else(|| format!("unexpected CLUSTER SLOTS entry {range:?}"))?;
            let index = match queues.iter().position(|(id, _)| *id == node) {
                Some(i) => i,
                None => {
                    let queue = old
                        .get(&node)
                        .cloned()
                        .unwrap_or_else(|| Arc::new(node_queue(self.max_batch, self.breaker)));
                    queues.push((node, queue));
                    queues.len() - 1
                }
            };
            let index = u16::try_from(index).map_err(|_| "too many primaries".to_string())?;
            for owner in owners.iter_mut().take(end + 1).skip(start) {
                *owner = index;
            }
        }
        let in_flight = if queues.len() > 1 {
            1
        } else {
            super::super::window::MIN_IN_FLIGHT
        };
        for (_, queue) in &queues {
            queue.set_min_in_flight(in_flight);
        }
        Ok(SlotMap { owners, queues })
    }
}

/// The queue of one cluster node, behind a breaker of its own.
fn node_queue(max_batch: usize, breaker: CircuitBreaker) -> Batcher {
    let mut queue = Batcher::new(max_batch);
    queue.node = Some(Arc::new(Breaker::new(breaker, NODE)));
    queue
}

/// One `CLUSTER SLOTS` entry: first and last slot, and the primary's node id
/// (its address if the reply has no id).
fn parse_range(range: &Value) -> Option<(usize, usize, String)> {
    let Value::Array(fields) = range else {
        return None;
    };
    let number = |v: &Value| match v {
        Value::Int(n) => usize::try_from(*n).ok().filter(|n| *n < SLOTS),
        _ => None,
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    };
    let start = number(fields.first()?)?;
    let end = number(fields.get(1)?)?;
    let Value::Array(primary) = fields.get(2)? else {
        return None;
    };
    let node = match primary.get(2).and_then(text) {
        Some(id) if !id.is_empty() => id,
        _ => format!("{}:{}", text(primary.first()?)?, text(primary.get(1)?)?),
    };
    (start <= end).then_some((start, end, node))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: i64, end: i64, port: i64, id: &str) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(id.as_bytes().to_vec()),
            ]),
        ])
    }

    #[test]
    fn a_new_map_keeps_the_queues_of_the_primaries_that_stay() {
        let nodes = Nodes::new(8, CircuitBreaker::new());
        assert!(nodes.queue_for("{a}").is_none(), "no map yet");
        let first = Value::Array(vec![
            range(0, 8000, 7000, "n1"),
            range(8001, 16383, 7001, "n2"),
        ]);
        nodes.install(&first).unwrap();
        let a = nodes.queue_for("{a}").unwrap(); // slot 15495
        let b = nodes.queue_for("{b}").unwrap(); // slot 3300
        assert!(!Arc::ptr_eq(&a, &b));
        // n2 takes slots 0-4000 ({b} among them) from n1.
        let second = Value::Array(vec![
            range(0, 4000, 7001, "n2"),
            range(4001, 8000, 7000, "n1"),
            range(8001, 16383, 7001, "n2"),
        ]);
        nodes.install(&second).unwrap();
        assert!(Arc::ptr_eq(&nodes.queue_for("{b}").unwrap(), &a));
        assert!(Arc::ptr_eq(&nodes.queue_for("{a}").unwrap(), &a));
        assert!(nodes.install(&Value::Nil).is_err());
        assert!(Arc::ptr_eq(&nodes.queue_for("{a}").unwrap(), &a));
    }

    type Answer = tokio::sync::oneshot::Receiver<Result<(crate::Decision, u64), crate::Error>>;

    /// A check of `{a}` and where its answer would go.
    fn pending() -> (super::super::super::batch::Queued, Answer) {
        let (reply, answered) = tokio::sync::oneshot::channel();
        let check = super::super::super::batch::Queued {
            keys: vec!["{a}".into()],
            policy: crate::Policy::from(crate::Quota::per_second(1).unwrap()),
            spend: super::super::super::encode::Spend::check(1),
            sent: Instant::now(),
            reply,
        };
        (check, answered)
    }

    /// How many checks in a row go out at once on `queue` (at most 4).
    fn sent_at_once(queue: &Batcher) -> usize {
        let mut answers = Vec::new();
        let mut sent = 0;
        for _ in 0..4 {
            let (check, answered) = pending();
            answers.push(answered);
            sent += usize::from(queue.enqueue(check).starts_a_call());
        }
        sent
    }

    #[test]
    fn a_kept_queue_whose_limit_falls_gives_back_the_extra_call() {
        let nodes = Nodes::new(8, CircuitBreaker::new());
        nodes
            .install(&Value::Array(vec![range(0, 16383, 7000, "n1")]))
            .unwrap();
        let queue = nodes.queue_for("{a}").unwrap();
        let mut answers = Vec::new();
        let mut sent = Vec::new();
        for _ in 0..4 {
            let (check, answered) = pending();
            answers.push(answered);
            sent.push(queue.enqueue(check).starts_a_call());
        }
        assert_eq!(sent, [true, true, false, false], "two calls, two queued");
        // A second primary joins: n1's queue stays, with one call at a time.
        nodes
            .install(&Value::Array(vec![
                range(0, 8000, 7001, "n2"),
                range(8001, 16383, 7000, "n1"),
            ]))
            .unwrap();
        assert!(Arc::ptr_eq(&nodes.queue_for("{a}").unwrap(), &queue));
        // The first call to end gives its slot back; the other takes the
        // queued checks, and new ones wait for it.
        assert!(queue.next(None).is_none());
        assert_eq!(queue.next(None).map(|b| b.len()), Some(2));
        let (check, answered) = pending();
        answers.push(answered);
        assert!(!queue.enqueue(check).starts_a_call());
        assert_eq!(queue.next(None).map(|b| b.len()), Some(1));
        assert!(queue.next(None).is_none());
        assert_eq!(sent_at_once(&queue), 1);
    }

    #[test]
    fn a_lone_primary_gets_two_calls_at_once_and_each_of_several_one() {
        let nodes = Nodes::new(8, CircuitBreaker::new());
        nodes
            .install(&Value::Array(vec![range(0, 16383, 7000, "n1")]))
            .unwrap();
        assert_eq!(sent_at_once(&nodes.queue_for("{a}").unwrap()), 2);
        let nodes = Nodes::new(8, CircuitBreaker::new());
        nodes
            .install(&Value::Array(vec![
                range(0, 8000, 7000, "n1"),
                range(8001, 16383, 7001, "n2"),
            ]))
            .unwrap();
        assert_eq!(sent_at_once(&nodes.queue_for("{a}").unwrap()), 1);
        assert_eq!(sent_at_once(&nodes.queue_for("{b}").unwrap()), 1);
    }

    #[test]
    fn a_drain_that_ends_early_gives_its_slot_back() {
        let queue = Arc::new(Batcher::new(8));
        let mut answers = Vec::new();
        for _ in 0..2 {
            let (check, answered) = pending();
            answers.push(answered);
            assert!(queue.enqueue(check).starts_a_call());
        }
        // Both calls' drains end without `next` (a panic, a dropped task).
        drop(super::super::super::batch::Slot::new(Arc::clone(&queue)));
        drop(super::super::super::batch::Slot::new(Arc::clone(&queue)));
        assert_eq!(sent_at_once(&queue), 2, "the queue did not stall");
    }

    #[test]
    fn refreshes_are_one_at_a_time_and_spaced() {
        let nodes = Nodes::new(8, CircuitBreaker::new());
        assert!(nodes.begin_refresh(true));
        assert!(!nodes.begin_refresh(true));
        assert!(!nodes.begin_refresh(false), "one at a time");
        nodes.end_refresh();
        assert!(!nodes.begin_refresh(true), "within the interval");
        assert!(nodes.begin_refresh(false));
    }
}
