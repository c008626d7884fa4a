//! `check_batch_at` on a cluster (cargo feature `test-util`): the checks
//! grouped by the node that serves their client's slot, one call per node,
//! as batching sends them under load.

use std::sync::Arc;

use super::super::encode::{Batch, Spend};
use super::super::script::Script;
use super::super::store::RedisStore;
use super::nodes::Nodes;
use super::refresh::SlotRead;
use super::slots::{hash_slot, others_in_first_slot};
use crate::decision::Decision;
use crate::error::Error;
use crate::policy::Policy;
use crate::store::contract::validate;
use crate::store::redis::batch::Batcher;
impl RedisStore {
    /// `check_batch_at` on a cluster: one call per node of the slot map, as
    /// `drain` sends them (one by one after a call the node refused).
    pub(super) async fn check_batch_on_nodes(
        &self,
        nodes: &Arc<Nodes>,
        spread_test_script: &Script,
        checks: &[(&str, &Policy, u64)],
        now_us: u64,
    ) -> Result<Vec<Decision>, Error> {
        if !nodes.has_map() && nodes.begin_refresh(false) {
            let read = SlotRead(Arc::clone(nodes));
            self.read_slots(&read).await;
        }
        // Per node (by its queue), its checks in order: index, first key.
        type Members = Vec<(usize, String)>;
        let mut groups: Vec<(Option<Arc<Batcher>>, Members)> = Vec::new();
        for (i, (key, policy, cost)) in checks.iter().enumerate() {
            validate(policy, *cost)?;
            let first = self
                .keys_of(key, policy)
                .into_iter()
                .next()
                .unwrap_or_default();
            let queue = nodes.queue_for(&first);
            let same = |g: &Option<Arc<Batcher>>| match (g, &queue) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            };
            match groups.iter_mut().find(|(g, _)| same(g)) {
                Some((_, members)) => members.push((i, first)),
                None => groups.push((queue, vec![(i, first)])),
            }
        }
        let mut out: Vec<Option<Decision>> = checks.iter().map(|_| None).collect();
        for (_, mut members) in groups {
            // As `drain` does: other clients of the first one's slot apart,
            // and one by one after a call the node refused.
            let mut alone = others_in_first_slot(&mut members, |(_, k)| Some(k.as_str()));
            let spread = members.len() > 1;
            let mut batch = if spread {
                Batch::with_capacity(members.len(), Some(now_us), Some(hash_slot))
            } else {
                Batch::new(Some(now_us))
            };
            for (i, _) in &members {
                let (key, policy, cost) = checks.get(*i).copied().ok_or_else(|| {
                    Error::store(crate::ErrorKind::Server, "check index out of range")
                })?;
                let keys: Vec<String> = self.keys_of(key, policy);
                batch.push(keys, policy, &Spend::check(cost));
            }
            let script = if spread {
                spread_test_script
            } else {
                &self.inner.test_script
            };
            let call = &batch;
            // `None`: the node does not serve every key.
            let outcomes = self
                .guarded(
                    |mut conn| async move { call.run(&mut conn, script).await },
                    |reply| {
                        if call.not_local(&reply) {
                            Ok(None)
                        } else {
                            self.read(call, &reply).map(Some)
                        }
                    },
                )
                .await?;
            if let Some(outcomes) = outcomes {
                for ((i, _), (decision, _)) in members.iter().zip(outcomes) {
                    if let Some(slot) = out.get_mut(*i) {
                        *slot = Some(decision);
                    }
                }
            } else {
                alone.append(&mut members);
                if nodes.begin_refresh(false) {
                    let read = SlotRead(Arc::clone(nodes));
                    self.read_slots(&read).await;
                }
            }
            alone.sort_unstable_by_key(|(i, _)| *i);
            for (i, _) in alone {
                if let (Some((key, policy, cost)), Some(slot)) = (checks.get(i), out.get_mut(i)) {
                    *slot = Some(self.decide(key, policy, *cost, Some(now_us)).await?);
                }
            }
        }
        out.into_iter()
            .map(|d| {
                d.ok_or_else(|| Error::store(crate::ErrorKind::Server, "check left undecided"))
            })
            .collect()
    }
}
