//! The test-clock API of [`RedisStore`] (cargo feature `test-util`): checks,
//! reservations and adjustments at a microsecond clock the test chooses, run
//! by a variant of the script that production calls never run.

use std::time::Duration;

use super::encode::{Batch, Spend};
use super::store::RedisStore;
use crate::decision::Decision;
use crate::decision::Reservation;
use crate::error::Error;
use crate::policy::Policy;
use crate::quota::micros;
use crate::store::contract::validate;
impl RedisStore {
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
            let keys: Vec<String> = policy
                .quotas()
                .iter()
                .map(|q| self.bucket_key(key, q))
                .collect();
            batch.push(keys, policy, Spend::check(*cost));
        }
        let script = &self.inner.test_script;
        let call = &batch;
        let reply = self
            .guarded(|mut conn| async move { call.run(&mut conn, script).await })
            .await?;
        Ok(batch
            .outcomes(&reply)?
            .into_iter()
            .map(|(decision, _)| decision)
            .collect())
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
}
