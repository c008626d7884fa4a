//! What a check of the lease map leaves to send in the background
//! ([`Errand`]): a lease to ask for ([`LeaseRequest`]) and holds to report
//! ([`HoldReport`]); and what Redis answers a lease ([`Grant`]).

use std::time::Duration;

use crate::policy::Policy;
use crate::store::redis::encode::Spend;

/// A hold to report: the keys and policy of its buckets, its id, what was
/// spent of it and what it held.
pub(crate) struct HoldReport {
    pub(crate) keys: Vec<String>,
    pub(crate) policy: Policy,
    pub(crate) id: u64,
    pub(crate) spent: u64,
    pub(super) left: u64,
    pub(super) expired: bool,
}

/// What the in-process path asks to be sent after a check, in the
/// background.
#[derive(Default)]
pub(crate) struct Errand {
    pub(crate) lease: Option<LeaseRequest>,
    pub(crate) reports: Vec<HoldReport>,
    /// A call that confirms the server's epoch (see `epoch.rs`), taken by
    /// [`ServerEpoch::verify_due`]: holds are spent only while one came
    /// back within a second.
    pub(crate) verify: bool,
    /// The holds of keys gone quiet are due to be given back
    /// ([`Leases::sweep`]).
    pub(crate) sweep: bool,
}

impl Errand {
    /// Whether there is nothing to send.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.lease.is_none() && self.reports.is_empty() && !self.verify && !self.sweep
    }
}

/// A lease to ask for.
pub(crate) struct LeaseRequest {
    /// Whose lease it is.
    pub(crate) asked: Asked,
    /// The most tokens wanted.
    pub(crate) want: u64,
    /// A hold spent whole (its id), to report with it.
    pub(crate) carried: Option<u64>,
    /// How long it lives in Redis.
    pub(crate) life: Duration,
    /// The size asked for instead (0: none), for [`ROOMY`] times the life,
    /// when every bucket is at least 3/4 free besides the cost (the reply
    /// says which it got).
    pub(crate) roomy_want: u64,
}

/// Whose lease was asked for: a key's entry, and the keys and policy of its
/// buckets. Answered with [`Leases::answered`].
pub(crate) struct Asked {
    /// The key's name in the map.
    pub(crate) name: Box<str>,
    /// The serial of the entry's cold part (`Cold::serial`: given when
    /// the entry first asks, or is made with a long name).
    pub(crate) serial: u64,
    pub(crate) keys: Vec<String>,
    pub(crate) policy: Policy,
    /// The lease's id (0 until it is sent).
    pub(crate) id: u64,
    /// The server epoch's generation when it was asked for (see
    /// `epoch.rs`): a hold granted in another is never spent.
    pub(crate) generation: u64,
    /// A live hold's id and what it had spent, reported with the lease
    /// (partly: the rest stays held), so that a bucket's holds count what
    /// is left to spend rather than what was ever granted.
    pub(crate) partial: Option<(u64, u64)>,
}

/// What Redis answered a lease: `granted` tokens (0: none), held for
/// `life` from a request sent at `sent` (the lease map's clock); `roomy`
/// when the script granted the roomy size and life; `found` when the
/// report it carried found its hold.
#[derive(Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) granted: u64,
    pub(crate) sent: u64,
    pub(crate) life: Duration,
    pub(crate) roomy: bool,
    pub(crate) found: bool,
}

impl HoldReport {
    /// The decision that reports this hold, and its keys and policy.
    pub(crate) fn spend(&self) -> (Vec<String>, &Policy, Spend) {
        (
            self.keys.clone(),
            &self.policy,
            Spend::Report {
                spent: self.spent,
                id: self.id,
            },
        )
    }
}
