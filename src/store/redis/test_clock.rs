//! The test-clock API of [`RedisStore`] (cargo feature `test-util`): checks,
//! reservations and adjustments at a microsecond clock the test chooses, run
//! by a variant of the script that production calls never run.

use std::time::Duration;

use super::decode::LeaseReply;
use super::encode::{Batch, Reports, Spend};
use super::store::RedisStore;
use crate::decision::Decision;
use crate::decision::Reservation;
use crate::error::Error;
use crate::policy::Policy;
use crate::quota::micros;
use crate::store::contract::validate;
impl RedisStore {
    /// Whether a store on a cluster has read the slot map it batches per
    /// node by (cargo feature `test-util`); false elsewhere.
    pub fn has_slot_map(&self) -> bool {
        self.inner
            .nodes
            .as_ref()
            .is_some_and(|nodes| nodes.queue_for("{slot map}").is_some())
    }

    /// `check` with an explicit microsecond clock instead of Redis `TIME`, for
    /// tests that control time (cargo feature `test-util`). It runs a variant of
    /// the script that production calls never run.
    pub async fn check_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        now_us: u64,
    ) -> Result<Decision, Error> {
        self.decide(key, policy, cost, Some(now_us)).await
    }

    /// Several checks in one script call, decided in order at the microsecond
    /// `now_us` (cargo feature `test-util`): what batching sends under load.
    ///
    /// On a Redis Cluster the checks are grouped by the node that serves
    /// their client's slot, by the store's slot map (read first if it has
    /// none), and each group is one call, as batching does under load.
    pub async fn check_batch_at(
        &self,
        checks: &[(&str, &Policy, u64)],
        now_us: u64,
    ) -> Result<Vec<Decision>, Error> {
        if let Some(nodes) = &self.inner.nodes {
            return nodes.check_batch_at(self, checks, now_us).await;
        }
        let mut batch = Batch::new(Some(now_us));
        for (key, policy, cost) in checks {
            validate(policy, *cost)?;
            let keys: Vec<String> = self.keys_of(key, policy);
            batch.push(keys, policy, &Spend::check(*cost));
        }
        let script = &self.inner.test_script;
        let call = &batch;
        let outcomes = self
            .guarded(
                |mut conn| async move { call.run(&mut conn, script).await },
                |reply| self.read(call, &reply),
            )
            .await?;
        Ok(outcomes.into_iter().map(|(decision, _)| decision).collect())
    }

    /// `reserve` with an explicit microsecond clock (cargo feature `test-util`).
    pub async fn reserve_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        max_wait: Duration,
        now_us: u64,
    ) -> Result<Reservation, Error> {
        let (decision, wait) = self
            .reserve_inner(key, policy, cost, micros(max_wait), Some(now_us))
            .await?;
        Ok(Reservation::new(decision, wait))
    }

    /// A refund (`delta` below 0) or a charge of `key`'s buckets at an
    /// explicit microsecond clock (cargo feature `test-util`), as the layer's
    /// `settle` and `RateLimiter::refund` and `charge` make them.
    pub async fn adjust_at(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        now_us: u64,
    ) -> Result<(), Error> {
        self.adjust_inner(key, policy, delta, Some(now_us)).await
    }

    /// One lease request as the store's leases send it, at an explicit
    /// microsecond clock (cargo feature `test-util`): a check of `cost` on
    /// `key`'s buckets that, admitted, also holds at most `want` tokens for
    /// the hold named `id` for `life`, first reporting `report` (a hold's
    /// id and the tokens it spent, the rest released), if any, then
    /// `partial` (another hold's id and the tokens it spent so far, the rest
    /// kept held), if any; with a `roomy_want` (0: none),
    /// asking for that many tokens instead, for 32 times `life`, when
    /// every bucket is at least 3/4 free besides the cost. Returns the
    /// decision, the tokens granted, whether the reported hold was there
    /// (the partial report's, if there was one),
    /// and whether the roomy size and life were granted. Ids are
    /// the caller's to keep unique, below 2^63 (the store's own leases
    /// count up from a random point).
    #[allow(
        clippy::too_many_arguments,
        reason = "a test tool mirroring the script call"
    )]
    pub async fn lease_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        want: u64,
        life: Duration,
        id: u64,
        report: Option<(u64, u64)>,
        partial: Option<(u64, u64)>,
        roomy_want: u64,
        now_us: u64,
    ) -> Result<(Decision, u64, bool, bool), Error> {
        validate(policy, cost)?;
        let keys = self.keys_of(key, policy);
        let spend = Spend::Lease {
            cost,
            want,
            life_us: micros(life),
            id,
            reports: (report.is_some() || partial.is_some()).then(|| {
                Box::new(Reports {
                    whole: report,
                    partial,
                })
            }),
            roomy_want,
        };
        let (decision, packed) = self.send(keys, policy, spend, Some(now_us)).await?;
        let reply = LeaseReply::packed(packed);
        Ok((decision, reply.granted, reply.found, reply.roomy))
    }

    /// The report of hold `id` of `key`'s buckets, which spent `spent`
    /// tokens, at an explicit microsecond clock (cargo feature
    /// `test-util`): whether the hold was there.
    pub async fn report_at(
        &self,
        key: &str,
        policy: &Policy,
        id: u64,
        spent: u64,
        now_us: u64,
    ) -> Result<bool, Error> {
        let keys = self.keys_of(key, policy);
        let spend = Spend::Report { spent, id };
        let (_, found) = self.send(keys, policy, spend, Some(now_us)).await?;
        Ok(found == 1)
    }
}
