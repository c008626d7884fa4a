//! The store's side of leases (`lease/`): a check decided from a hold,
//! and the lease requests and reports sent in the background, each a
//! decision batched with the checks in flight.

use std::sync::atomic::Ordering;

use super::decode::LeaseReply;
use super::encode::{ROOMY, Reports, Spend};
use super::lease::{Asked, Errand, Grant, LeaseRequest, LeaseStats, Leases, WHOLE};
use super::store::RedisStore;
use crate::decision::Decision;
use crate::error::ErrorKind;
use crate::policy::Policy;
use crate::quota::micros;
use crate::store::bucket::Spent;
use crate::store::key::safe_key;
use crate::store::table::KeyStart;

impl RedisStore {
    /// A check decided in process from a hold (leases on), and what it
    /// leaves to send in the background.
    pub(super) fn leased(&self, key: &str, policy: &Policy, cost: u64) -> Option<Decision> {
        let leases = self.inner.leases.as_ref()?;
        if !leases.pays_on(policy) {
            return None;
        }
        let mut errand = Errand::default();
        let name = safe_key(key);
        let decision = leases.check(&name, policy, cost, &mut errand);
        self.run_errand(errand);
        decision
    }

    /// A check of the key `start` + `value` under `policy` decided from a
    /// hold, when the leases hold that key with tokens that pay for `cost`
    /// now: the decision [`leased`](Self::leased) would make, as the figures
    /// of `policy`'s one quota (`Spent::decision` builds it), for less (the
    /// key's storage keys are not written out). `None`, having changed
    /// nothing, for any other key: check it the general way. `start` is a
    /// layer's `policy:kind:` ([`lease_start`](Self::lease_start)), `cost` at least 1 and at most `policy`'s
    /// smallest capacity, and leases pay on `policy`
    /// ([`leases_pay_on`](Self::leases_pay_on)).
    pub(crate) fn check_held(
        &self,
        start: &KeyStart,
        value: &str,
        policy: &Policy,
        cost: u64,
    ) -> Option<Spent> {
        let leases = self.inner.leases.as_ref()?;
        let mut errand = Errand::default();
        let decision = leases.check_held(start, value, policy, cost, &mut errand);
        // Most checks leave nothing to do: the errand is moved only when
        // it has something to send.
        if !errand.is_empty() {
            self.run_errand(errand);
        }
        decision
    }

    /// `start`, a layer's `policy:kind:` (a safe key's), as
    /// [`check_held`](Self::check_held) takes it; `None` when this store
    /// does not lease.
    pub(crate) fn lease_start(&self, start: &str) -> Option<KeyStart> {
        Some(self.inner.leases.as_ref()?.start(start))
    }

    /// Whether this store leases, and leases may pay on `policy` (see
    /// [`check_held`](Self::check_held)).
    pub(crate) fn leases_pay_on(&self, policy: &Policy) -> bool {
        self.inner
            .leases
            .as_ref()
            .is_some_and(|leases| leases.pays_on(policy))
    }

    /// Sends what the in-process path left to do, in the background: a
    /// lease request and reports, each a decision batched with the checks
    /// in flight, a confirmation of the server's epoch, and a sweep of the
    /// holds of keys gone quiet.
    pub(crate) fn run_errand(&self, errand: Errand) {
        if errand.is_empty() {
            return;
        }
        let Some(leases) = self.inner.leases.as_ref() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Nothing can be sent: the key must not stay asking, and the
            // epoch must not stay confirming.
            if let Some(LeaseRequest { asked, .. }) = &errand.lease {
                let _ = leases.answered(asked, None);
            }
            if errand.verify
                && let Some(epoch) = &self.inner.epoch
            {
                epoch.verified();
            }
            return;
        };
        // A lease request confirms the epoch as well as a call of no
        // decisions would.
        if errand.verify && errand.lease.is_none() {
            let store = self.clone();
            runtime.spawn(async move { store.confirm_epoch().await });
        }
        if errand.sweep {
            let store = self.clone();
            runtime.spawn(async move {
                if let Some(leases) = &store.inner.leases {
                    let reports = leases.sweep();
                    store.run_errand(Errand {
                        reports,
                        ..Errand::default()
                    });
                }
            });
        }
        if let Some(LeaseRequest {
            mut asked,
            want,
            carried,
            life,
            roomy_want,
        }) = errand.lease
        {
            asked.id = leases.id();
            leases.counters.requests.fetch_add(1, Ordering::Relaxed);
            let store = self.clone();
            // The guard answers "no lease" if the task is dropped unfinished
            // (a runtime shutting down), so the key is not left asking.
            let guard = Asking {
                store: self.clone(),
                asked: Some(asked),
                verifies: errand.verify,
            };
            let life_us = micros(life);
            // Sent no later than this (the task may start later): a hold
            // counted from it ends no later than one counted from the send.
            let sent = leases.now();
            runtime.spawn(async move {
                let mut guard = guard;
                let Some(asking) = guard.asked.as_ref() else {
                    return;
                };
                // A hold spent whole is reported as spending "everything":
                // the script debits no more than the hold.
                let spend = Spend::Lease {
                    cost: 0,
                    want,
                    life_us,
                    id: asking.id,
                    reports: (carried.is_some() || asking.partial.is_some()).then(|| {
                        Box::new(Reports {
                            whole: carried.map(|id| (id, WHOLE)),
                            partial: asking.partial,
                        })
                    }),
                    roomy_want,
                };
                let answer = store
                    .send(asking.keys.clone(), &asking.policy, spend, None)
                    .await;
                // Only a call that may have reached Redis can have left a
                // hold to give back: not one the breaker stopped. (A reply
                // the store could not read, a `Server` error, was a reply:
                // the lease may have been granted.)
                let maybe_ran = matches!(
                    &answer,
                    Err(e) if matches!(
                        e.kind(),
                        ErrorKind::Timeout | ErrorKind::Connection | ErrorKind::Server
                    )
                );
                let grant = answer.ok().map(|(_, packed)| {
                    let reply = LeaseReply::packed(packed);
                    // The script says which size and life it granted.
                    Grant {
                        granted: reply.granted,
                        sent,
                        life: if reply.roomy { life * ROOMY } else { life },
                        roomy: reply.roomy,
                        found: reply.found,
                    }
                });
                if std::mem::take(&mut guard.verifies)
                    && let Some(epoch) = &store.inner.epoch
                {
                    epoch.verified();
                }
                let Some(asked) = guard.asked.take() else {
                    return;
                };
                let unused = match &store.inner.leases {
                    Some(leases) => leases.answered(&asked, grant),
                    None => Vec::new(),
                };
                store.run_errand(Errand {
                    reports: unused,
                    ..Errand::default()
                });
                // The call failed, yet Redis may have run it (a timeout after
                // it was sent): a hold this instance will never use is given
                // back rather than left to its expiry (up to 64 lease
                // periods). A report of an id its buckets do not hold does
                // nothing. While Redis stalls the report fails too, so it is
                // tried again a period later, a few times.
                // A report that finds nothing is sent once more, a period
                // later: after a connection was replaced, the new one's
                // report may reach Redis before the lease still queued on the
                // old one.
                if maybe_ran && let Some(leases) = &store.inner.leases {
                    let period = leases.period();
                    let mut not_found = 0;
                    for tries_left in (0..GIVE_BACK_TRIES).rev() {
                        let spend = Spend::Report {
                            spent: 0,
                            id: asked.id,
                        };
                        match store
                            .send(asked.keys.clone(), &asked.policy, spend, None)
                            .await
                        {
                            Ok((_, 1)) => break,
                            Ok(_) => not_found += 1,
                            Err(_) => {}
                        }
                        if tries_left == 0 || not_found == 2 {
                            break;
                        }
                        tokio::time::sleep(period).await;
                    }
                }
            });
        }
        for report in errand.reports {
            let store = self.clone();
            runtime.spawn(async move {
                let spend = Spend::Report {
                    spent: report.spent,
                    id: report.id,
                };
                let keys = report.keys.clone();
                let found = store
                    .send(keys, &report.policy, spend, None)
                    .await
                    .ok()
                    .map(|(_, found)| found == 1);
                if let Some(leases) = &store.inner.leases {
                    leases.reported(&report, found);
                }
            });
        }
    }

    /// A call of no decisions, whose reply confirms the server's epoch (or
    /// tells a new one): holds are spent only within a second of one.
    async fn confirm_epoch(&self) {
        let Some(epoch) = self.inner.epoch.as_ref() else {
            return;
        };
        let batch = super::encode::Batch::new(None);
        let script = &self.inner.script;
        let call = &batch;
        let _ = self
            .admitted(
                self.inner.breaker.admit_without_probe(),
                0,
                None,
                |mut conn| async move { call.run(&mut conn, script).await },
            )
            .await;
        epoch.verified();
    }

    /// What this store's leases have done so far; all zero when leases are
    /// off (see [`RedisStoreBuilder::leases`](crate::store::RedisStoreBuilder::leases)).
    pub fn lease_stats(&self) -> LeaseStats {
        self.inner
            .leases
            .as_ref()
            .map(Leases::stats)
            .unwrap_or_default()
    }
}

/// How many times the report giving back a lease whose call failed is
/// sent, a lease period apart, until one finds the hold (or two answers
/// found none).
const GIVE_BACK_TRIES: u32 = 4;

/// A lease request under way; dropped unanswered, it answers "none".
struct Asking {
    store: RedisStore,
    asked: Option<Asked>,
    /// The request stands for the epoch's confirmation that was due (see
    /// [`Errand::verify`]): its end gives the turn back.
    verifies: bool,
}

impl Drop for Asking {
    fn drop(&mut self) {
        if self.verifies
            && let Some(epoch) = &self.store.inner.epoch
        {
            epoch.verified();
        }
        if let (Some(asked), Some(leases)) = (self.asked.take(), &self.store.inner.leases) {
            let _ = leases.answered(&asked, None);
        }
    }
}
