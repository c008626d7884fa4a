//! One call of the script ([`Batch`]): the keys and arguments of one or more
//! decisions, the command they make, and how it is sent (`EVALSHA`, and
//! `EVAL` when the server has not cached the script).

use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::ConnectionLike;
use redis::{RedisError, ServerErrorKind};

use super::decode::{self, Numbers};
use super::script::Script;
use crate::decision::Decision;
use crate::error::Error;
use crate::policy::Policy;
use crate::quota::Quota;
use crate::store::bucket::{debt_for, signed};
/// What one decision of a script call asks of its buckets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Spend {
    /// Spend `cost` from every bucket if each holds it (0: only look);
    /// `max_wait_us` above 0 makes it a reservation that may take on the
    /// debt that many microseconds refill.
    Take { cost: u64, max_wait_us: u64 },
    /// Spend `delta` tokens whatever the buckets hold, or give them back
    /// when negative: a settlement after the fact (the script's `adjust`).
    Adjust(i64),
    /// A check of `cost` that, admitted, also sets aside a hold of at most
    /// `want` tokens on every bucket for this instance, named `id`, for
    /// `life_us` microseconds of Redis time (see [`super::lease`]). Sent
    /// again, it is answered as it was the first time. It may carry the
    /// report of an earlier hold of the same buckets and a partial one of
    /// another (see [`Reports`]; boxed, so that a check's future, which
    /// holds a `Spend`, stays small). With a
    /// `roomy_want` (0: none), a lease
    /// on buckets that are all at least 3/4 free besides its cost asks for
    /// that many tokens instead, for [`ROOMY`] times the life; the reply
    /// says which it got.
    Lease {
        cost: u64,
        want: u64,
        life_us: u64,
        id: u64,
        reports: Option<Box<Reports>>,
        roomy_want: u64,
    },
    /// Hold `id` spent `spent` tokens: debit them and release the rest.
    Report { spent: u64, id: u64 },
}

/// The reports a lease request carries, made before its hold is set aside:
/// `whole`, a hold's id and what it spent, the rest released (the
/// script's `report`); `partial`, another hold's id and what it spent so
/// far, the rest kept held. The reply's "found" is the partial report's if
/// there is one, the other's otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reports {
    pub(crate) whole: Option<(u64, u64)>,
    pub(crate) partial: Option<(u64, u64)>,
}

impl Spend {
    /// A plain check of `cost`.
    pub(crate) fn check(cost: u64) -> Self {
        Spend::Take {
            cost,
            max_wait_us: 0,
        }
    }
}

/// How many periods a roomy lease covers, and so how many times its plain
/// life it lives: a lease on buckets that are all at least 3/4 free
/// (nobody near the limit; the script decides, with the buckets in front of
/// it), so that a key in steady use asks for a lease every half minute or so
/// instead of every period.
pub(crate) const ROOMY: u32 = 32;

/// How a spread batch finds a key's hash slot: the cluster's CRC16
/// (`cluster/slots.rs`), handed in by the cluster code.
pub(crate) type SlotOf = fn(&[u8]) -> u16;

/// One call of the script: the keys and arguments of one or more decisions,
/// decided in order.
pub(crate) struct Batch {
    clock: Option<u64>,
    /// For the spread script (`cluster/spread.rs`): how to find a key's
    /// slot, as keys go in `ARGV` and only those of the first key's slot are
    /// declared; `None`: every key declared.
    spread: Option<SlotOf>,
    /// The distinct quotas of the batch; decisions refer to them by index.
    quotas: Vec<Quota>,
    /// Per decision: its keys, one per quota (moved in, and handed back by
    /// [`take_keys`](Self::take_keys)).
    keys: Vec<Vec<String>>,
    /// How many keys `keys` holds.
    key_count: usize,
    /// Per decision: its policy, whose quotas read the reply back.
    shapes: Vec<Policy>,
    /// Per decision: how many numbers its reply has after its quotas'
    /// figures (a lease: its grant, and whether its report found its hold
    /// and whether it got its roomy size; a report: whether it found its
    /// hold).
    extra: Vec<u8>,
    /// Per decision: n, cost, then per quota: 1-based quota index, debt
    /// (-1 on every quota of an adjustment, whose cost is signed).
    args: Vec<i64>,
    /// Whether every decision is a check (no debt) of one quota, the same
    /// for all: then the call takes the script's compact form.
    compact: bool,
    /// Whether a decision gives tokens back (a refund): such a call is never
    /// sent twice (see [`run`](Self::run)).
    refunds: bool,
    /// Whether [`run`](Self::run) sent it already.
    sent: AtomicBool,
}

impl Batch {
    /// An empty batch. `clock` (tests only) replaces Redis `TIME`.
    pub(crate) fn new(clock: Option<u64>) -> Self {
        Batch {
            clock,
            spread: None,
            quotas: Vec::new(),
            keys: Vec::new(),
            key_count: 0,
            shapes: Vec::new(),
            extra: Vec::new(),
            args: Vec::new(),
            compact: true,
            refunds: false,
            sent: AtomicBool::new(false),
        }
    }

    /// An empty batch with room for `n` decisions of one quota each; `clock`
    /// (tests only) replaces Redis `TIME`, and `spread` makes it a batch for
    /// the spread script, whose decisions' clients may be in several slots
    /// of one cluster node.
    pub(crate) fn with_capacity(n: usize, clock: Option<u64>, spread: Option<SlotOf>) -> Self {
        Batch {
            clock,
            spread,
            quotas: Vec::with_capacity(1),
            keys: Vec::with_capacity(n),
            key_count: 0,
            shapes: Vec::with_capacity(n),
            extra: Vec::with_capacity(n),
            args: Vec::with_capacity(4 * n),
            compact: true,
            refunds: false,
            sent: AtomicBool::new(false),
        }
    }

    /// Whether `reply` says that the node does not serve every key of this
    /// batch (it then wrote nothing).
    pub(crate) fn not_local(&self, reply: &[i64]) -> bool {
        self.spread.is_some() && reply == [-1]
    }

    /// Adds a decision (`spend`) against every quota of `policy`, with one
    /// key per quota.
    pub(crate) fn push(&mut self, keys: impl Into<Vec<String>>, policy: &Policy, spend: &Spend) {
        let quotas = policy.quotas();
        let keys = keys.into();
        self.key_count += keys.len();
        self.keys.push(keys);
        // Every number is below 2^53 (costs and debts are kept exact).
        let (cost, marker, max_wait_us) = match *spend {
            Spend::Take { cost, max_wait_us } => (signed(cost), 0, max_wait_us),
            Spend::Adjust(delta) => {
                self.refunds |= delta < 0;
                (delta, -1, 0)
            }
            Spend::Lease { cost, .. } => (signed(cost), -2, 0),
            Spend::Report { spent, .. } => (signed(spent), -3, 0),
        };
        self.args.push(quotas.len() as i64);
        self.args.push(cost);
        for q in quotas {
            let index = match self.quotas.iter().position(|known| known == q) {
                Some(i) => i,
                None => {
                    self.quotas.push(*q);
                    self.quotas.len() - 1
                }
            };
            self.args.push(index as i64 + 1);
            self.args.push(match spend {
                Spend::Take { .. } if max_wait_us > 0 => signed(debt_for(q, max_wait_us)),
                _ => marker,
            });
        }
        match *spend {
            Spend::Lease {
                want,
                life_us,
                id,
                ref reports,
                roomy_want,
                ..
            } => {
                let Reports { whole, partial } = reports.as_deref().copied().unwrap_or_default();
                let (rid, rspent) = whole.unwrap_or((0, 0));
                // A partial report's spent tokens go as a negative number.
                // (A partial report of nothing is none: 0 would read as a
                // whole report, releasing the hold.)
                let (pid, pspent) = partial.filter(|&(_, spent)| spent > 0).unwrap_or((0, 0));
                let roomy_life_us = life_us.saturating_mul(u64::from(ROOMY));
                self.args.extend([
                    signed(id),
                    signed(want),
                    signed(life_us),
                    signed(rid),
                    signed(rspent),
                    signed(roomy_want),
                    signed(roomy_life_us),
                    signed(pid),
                    -signed(pspent),
                ]);
            }
            Spend::Report { id, .. } => self.args.push(signed(id)),
            _ => {}
        }
        self.extra.push(match *spend {
            Spend::Lease { .. } => 2,
            Spend::Report { .. } => 1,
            _ => 0,
        });
        self.compact &= quotas.len() == 1
            && quotas.iter().all(|q| q.lockout_us() == 0)
            && matches!(spend, Spend::Take { max_wait_us: 0, .. })
            && self.quotas.len() == 1;
        self.shapes.push(policy.clone());
    }

    /// The decisions' keys, in order, taken out of the batch (which then
    /// holds none): to hand each check its keys back after the call.
    pub(crate) fn take_keys(&mut self) -> Vec<Vec<String>> {
        self.key_count = 0;
        std::mem::take(&mut self.keys)
    }

    /// How many decisions the batch holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shapes.len()
    }

    /// Runs the batch with `EVALSHA`; a server that does not have the script
    /// (after a restart, a failover or `SCRIPT FLUSH`; in a cluster, each node
    /// has its own cache) gets it with `EVAL` on the same keys, which also
    /// caches it on that very node.
    ///
    /// A call that gives tokens back runs once at most: the store resends a
    /// call whose connection broke, and Redis may have run it before the
    /// reply was lost, so a refund sent again could be made twice (a check
    /// sent again only spends twice, which limits more). Such a call fails
    /// instead, and its tokens stay spent.
    pub(crate) async fn run<C: ConnectionLike>(
        &self,
        conn: &mut C,
        script: &Script,
    ) -> Result<Vec<i64>, RedisError> {
        if self.refunds && self.sent.swap(true, Ordering::Relaxed) {
            return Err(RedisError::from((
                redis::ErrorKind::Client,
                "not sent again",
                "a script call giving tokens back is never resent: it may have run".to_owned(),
            )));
        }
        // Neither a spread batch (a cluster's) nor one on a test clock
        // carries an epoch.
        let epoch = script
            .epoch
            .as_deref()
            .filter(|_| self.spread.is_none() && self.clock.is_none());
        let sent = epoch.map(|e| (e.now(), e.argument()));
        let spec = epoch
            .zip(sent.as_ref())
            .map(|(epoch, (_, (spec, _)))| (spec.as_str(), epoch.key()));
        let reply = match self
            .command("EVALSHA", &script.sha, spec)
            .query_async(conn)
            .await
        {
            Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.command("EVAL", &script.source, spec)
                    .query_async(conn)
                    .await
            }
            other => other,
        };
        let Numbers(mut numbers) = reply?;
        // The reply ends with the server's epoch (see `epoch.rs`).
        if let (Some(epoch), Some((at, (_, checks)))) = (epoch, sent) {
            match numbers.pop().map(u64::try_from) {
                Some(Ok(heard)) => epoch.heard(at, heard, checks),
                // Not an epoch: the reply is malformed, and reads as such.
                _ => numbers.push(i64::MIN),
            }
        }
        Ok(numbers)
    }

    /// The call's command: `name` (`EVALSHA` or `EVAL`) of `script` (its SHA
    /// or its source), with the epoch argument and the epoch key `epoch`
    /// (see `epoch.rs`): `None` sends none, and declares no epoch key.
    pub(super) fn command(
        &self,
        name: &str,
        script: &str,
        epoch: Option<(&str, &str)>,
    ) -> redis::Cmd {
        // Sized up front, so building a batch's command never grows it: the
        // name, the script, the key count, the keys (a spread batch's twice:
        // its declared ones, and all of them after the arguments), the
        // clock, the quota count, three numbers per quota, the decision
        // count, the decisions' numbers and a spread batch's key count (at
        // most 20 digits each).
        let numbers = 5 + 4 * self.quotas.len() + self.args.len();
        let copies = if self.spread.is_some() { 2 } else { 1 };
        let bytes = name.len()
            + script.len()
            + copies * self.keys.iter().flatten().map(String::len).sum::<usize>()
            + 20 * numbers;
        let mut cmd = redis::Cmd::with_capacity(3 + copies * self.key_count + numbers, bytes);
        cmd.arg(name);
        if let Some(hash_slot) = self.spread {
            // Every key in the first key's slot is declared, the others are
            // not. The declared keys route the call, and Redis treats them
            // as one while that slot migrates: the old primary serves them
            // only if it holds them all (else `ASK` or `TRYAGAIN`), the new
            // one only after `ASKING` and then with the keys it holds. An
            // undeclared key of that slot would be read as missing on the
            // new primary under `ASKING`, while its bucket is still on the
            // old one.
            let first = self
                .keys
                .iter()
                .flatten()
                .next()
                .map(|k| hash_slot(k.as_bytes()));
            let declared: Vec<&String> = self
                .keys
                .iter()
                .flatten()
                .filter(|k| Some(hash_slot(k.as_bytes())) == first)
                .collect();
            cmd.arg(script).arg(declared.len()).arg(declared);
        } else {
            cmd.arg(script)
                .arg(self.key_count + usize::from(epoch.is_some()));
            for key in self.keys.iter().flatten() {
                cmd.arg(key);
            }
            if let Some((_, key)) = epoch {
                cmd.arg(key);
            }
        }
        match (self.clock, epoch) {
            (Some(now), _) => cmd.arg(now),
            (None, Some((argument, _))) => cmd.arg(argument),
            (None, None) => cmd.arg(""),
        };
        // With a lock-out anywhere, -Q and four numbers per quota (see the
        // script's header).
        if self.quotas.iter().any(|q| q.lockout_us() > 0) {
            cmd.arg(-(self.quotas.len() as i64));
            for q in &self.quotas {
                cmd.arg(q.full())
                    .arg(q.num())
                    .arg(q.den())
                    .arg(q.lockout_us());
            }
        } else {
            cmd.arg(self.quotas.len());
            for q in &self.quotas {
                cmd.arg(q.full()).arg(q.num()).arg(q.den());
            }
        }
        if self.compact {
            // -D, then each decision's cost (see the script's header).
            cmd.arg(-(self.shapes.len() as i64));
            for decision in self.args.chunks_exact(4) {
                if let [_, cost, _, _] = decision {
                    cmd.arg(*cost);
                }
            }
        } else {
            cmd.arg(self.shapes.len()).arg(&self.args);
        }
        if self.spread.is_some() {
            for key in self.keys.iter().flatten() {
                cmd.arg(key);
            }
            cmd.arg(self.key_count);
        }
        cmd
    }

    /// What the reply says of each decision, in order: the decision and, for
    /// an admitted reservation, the wait until its tokens are due (for a
    /// lease: [`LeaseReply::packed`](super::decode::LeaseReply); for a
    /// report: 1 if its hold was there).
    pub(crate) fn outcomes(&self, reply: &[i64]) -> Result<Vec<(Decision, u64)>, Error> {
        decode::outcomes(&self.shapes, &self.extra, reply)
    }
}

/// The arguments of `cmd` as text.
#[cfg(test)]
pub(super) fn args(cmd: &redis::Cmd) -> Vec<String> {
    cmd.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => "<cursor>".to_owned(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_shared_by_decisions_are_sent_once() {
        let q = Quota::per_second(10).unwrap();
        let h = Quota::per_hour(100).unwrap();
        let both = Policy::new("both", [q, h]).unwrap();
        let mut batch = Batch::new(None);
        batch.push(["a".to_owned()], &q.into(), &Spend::check(1));
        batch.push(
            ["b".to_owned(), "c".to_owned()],
            &both,
            &Spend::Take {
                cost: 2,
                max_wait_us: 1_000,
            },
        );
        assert_eq!(batch.quotas, [q, h]);
        assert_eq!(batch.len(), 2);
        // n, cost, then (index, debt) per quota.
        assert_eq!(
            batch.args,
            [
                1,
                1,
                1,
                0,
                2,
                2,
                1,
                debt_for(&q, 1_000) as i64,
                2,
                debt_for(&h, 1_000) as i64
            ]
        );
        let reply = [1, 9, 0, 100_000, 1, 8, 500, 200_000, 98, 0, 72_000_000];
        let out = batch.outcomes(&reply).unwrap();
        assert!(out[0].0.allowed() && out[1].0.allowed());
        assert_eq!(out[1].1, 500);
        assert_eq!(out[1].0.retry_after(), std::time::Duration::ZERO);
    }

    #[test]
    fn checks_of_one_quota_take_the_compact_form_and_others_the_long_one() {
        let q = Quota::per_second(10).unwrap();
        let h = Quota::per_hour(100).unwrap();
        let decisions = |batch: &Batch| {
            let args = args(&batch.command("EVALSHA", "sha", None));
            // EVALSHA, sha, key count, keys, clock, quota count, 3 per quota.
            let start = 3 + batch.key_count + 2 + 3 * batch.quotas.len();
            args[start..].to_vec()
        };
        let mut checks = Batch::new(None);
        checks.push(["a".to_owned()], &q.into(), &Spend::check(1));
        checks.push(["b".to_owned()], &q.into(), &Spend::check(3));
        checks.push(["a".to_owned()], &q.into(), &Spend::check(0));
        assert_eq!(decisions(&checks), ["-3", "1", "3", "0"]);
        // A reservation (debt), a second quota, or a decision over two
        // quotas: the long form, n, cost, then (index, debt) per quota.
        let mut reservation = Batch::new(None);
        reservation.push(["a".to_owned()], &q.into(), &Spend::check(1));
        reservation.push(
            ["b".to_owned()],
            &q.into(),
            &Spend::Take {
                cost: 1,
                max_wait_us: 1_000,
            },
        );
        let debt = debt_for(&q, 1_000).to_string();
        assert_eq!(
            decisions(&reservation),
            ["2", "1", "1", "1", "0", "1", "1", "1", debt.as_str()]
        );
        let mut two = Batch::new(None);
        two.push(["a".to_owned()], &q.into(), &Spend::check(1));
        two.push(["b".to_owned()], &h.into(), &Spend::check(1));
        assert_eq!(
            decisions(&two),
            ["2", "1", "1", "1", "0", "1", "1", "2", "0"]
        );
        let mut both = Batch::new(None);
        both.push(
            ["a".to_owned(), "b".to_owned()],
            &Policy::new("both", [q, h]).unwrap(),
            &Spend::check(2),
        );
        assert_eq!(decisions(&both), ["1", "2", "2", "1", "0", "2", "0"]);
        // The reply is read the same way in both forms.
        let out = checks
            .outcomes(&[1, 9, 0, 100_000, 0, 0, 200_000, 300_000, 1, 0, 0, 300_000])
            .unwrap();
        assert_eq!(out.len(), 3);
        assert!(out[0].0.allowed() && !out[1].0.allowed() && out[2].0.allowed());
    }
}
