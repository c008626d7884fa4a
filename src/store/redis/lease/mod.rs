//! Leases ([`Leases`]): tokens of a shared bucket held for this instance, so
//! that checks with room to spare are decided in process, exactly.
//!
//! A lease is a hold on the bucket in Redis, not a debit: the script sets
//! `h` tokens of the bucket's level aside for this instance until an expiry
//! (Redis time), and other instances may spend only what is not held. This
//! instance spends its held tokens here, one admission at a time, and
//! reports what it spent (batched with the checks in flight); the report
//! debits the spent tokens and releases the rest. A hold that expires
//! unreported is debited whole. Every admission made here is backed by a
//! token that is in the bucket at that moment and that nobody else can
//! take, so the bucket's bound holds in every window, as without leases.
//! What leases cost is under-admission, bounded by the holds outstanding.
//!
//! - **Demand first:** a key is leased only once it shows demand (about
//!   three checks a period, see [`DEMAND_TO_LEASE`]); before, and for keys
//!   seen a few times, checks go to Redis as without leases.
//! - **Size:** a decayed count of the key's local demand (tokens asked for
//!   over about one lease period), minus what is still held. Every lease
//!   also names a roomy size and life ([`ROOMY`] periods, counted as at
//!   most an eighth of the smallest capacity), which the script grants
//!   instead when every bucket is at least 3/4 free besides the cost, so a
//!   key with room to spare gets a lease for half a minute or so from its
//!   first one. The script grants at most half of what the bucket has
//!   free, so a key near its limit gets no lease and is decided in Redis,
//!   exactly, check by check; and at most half of the room left under its
//!   cap on all holds (half the capacity), so the instances sharing a key
//!   end up with like shares.
//! - **Renewal:** the next lease is asked for (in the background) when
//!   what is held falls under an eighth of a period's demand (under a
//!   roomy lease: two periods'), the newest hold is in the last quarter of
//!   its life, or the server's epoch is due for a confirmation (the
//!   request confirms it). It carries the report of a hold spent whole and
//!   a partial one of the live hold that spent most.
//! - **Expiry:** a hold is used here until its life, counted from when its
//!   request was asked for (no later than it was *sent*), less a margin;
//!   Redis counts it from when it ran the call, later. Times are read on a
//!   clock of the memory store's kind (`store::clock::Clock`: the CPU's
//!   time-stamp counter), one with the server epoch's, which ends every
//!   hold should that clock fall behind the OS's (not on a cluster, which
//!   has no epoch); with the `test-util`
//!   feature, tokio's `Instant`, so tests can pause time.
//! - **Retries:** every lease has an id unique to this instance; a lease
//!   sent again is answered as the first time, a report sent again does
//!   nothing.
//! - **Bounded:** the map holds at most a fixed number of keys; an evicted
//!   key's holds are reported, and so are all holds when the store is
//!   dropped.
//! - **Outages:** held tokens are spent until their expiry whatever the
//!   breaker says; then checks go to Redis, and to the fallback.

//!
//! Files, one job each: `entry.rs` (one key's holds and demand), `map.rs`
//! (the map and a check decided from a hold), `sizing.rs` (what lease to ask
//! for next), `answer.rs` (what Redis answered: grants, reports, refunds),
//! `release.rs` (holds leaving the map: evicted, swept, reset, dropped) and
//! `errand.rs` (what a check leaves to send in the background). The store's
//! side, the calls that send them, is `store_leases.rs`, beside this folder.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

mod answer;
mod entry;
mod errand;
mod map;
#[cfg(test)]
mod name_tests;
mod release;
mod sizing;
#[cfg(test)]
mod tests;

pub(crate) use errand::{Asked, Errand, Grant, LeaseRequest};
pub(crate) use map::Leases;

/// The default lease period: a lease holds about this long's worth of a
/// key's local demand.
pub const DEFAULT_LEASE_PERIOD: Duration = Duration::from_secs(1);

/// The keys whose leases a store keeps by default.
pub const DEFAULT_LEASE_KEYS: usize = 100_000;

/// The fewest tokens worth a lease: below it, checks go to Redis.
pub(super) const MIN_LEASE: u64 = 2;

/// The demand a key shows before it is leased, in checks of the cost of
/// the one that would ask: its decayed count of tokens asked for before
/// that check must be at least this many times its cost. That is three
/// checks like it within about a third of a lease period, or a steady rate
/// of about three a period (a rate `r` a period counts about `r + 1/2`).
/// Keys seen a few times (an API keyed by client address sees many) are
/// decided in Redis check by check, exactly as without leases, and leave
/// nothing held there.
pub(super) const DEMAND_TO_LEASE: f64 = 2.5;

/// The share of the smallest capacity a lease covering [`ROOMY`] periods
/// holds at most: 1 / this. What such a lease covers is at most that (or
/// one period's demand, if more); it asks for one and a half times that,
/// less what is held, so a key that goes idle leaves at most 3/16 of the
/// capacity held.
pub(super) const ROOMY_SHARE: u64 = 8;

/// Holds a key has at once, at most: the one in use and the next.
pub(super) const MAX_HOLDS: usize = 2;

/// A key not checked for this many lease periods has gone quiet: its holds
/// are given back by the next sweep ([`Leases::sweep`]).
pub(super) const QUIET_PERIODS: u64 = 2;

/// What a report of a hold spent whole says it spent: more than any hold
/// (the script debits at most the hold), and below 2^53.
pub(crate) const WHOLE: u64 = 1 << 52;

/// What a store's leases have done so far (all counts since the store was
/// built): see [`RedisStore::lease_stats`](crate::RedisStore::lease_stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Checks decided in process from held tokens.
    pub local_decisions: u64,
    /// Leases asked for (each one decision of a script call).
    pub requests: u64,
    /// Tokens granted in holds.
    pub granted: u64,
    /// Held tokens spent in process.
    pub spent: u64,
    /// Held tokens given back unspent by a report that found its hold.
    pub returned: u64,
    /// Held tokens not spent whose report found no hold (Redis had debited
    /// it whole at its expiry) or got no answer.
    pub expired: u64,
    /// Held tokens not yet spent, now.
    pub outstanding: u64,
    /// Tokens in holds not yet reported (spent or not), now: what this
    /// instance keeps from the others at most.
    pub held: u64,
}

/// The counts that change only with a lease request or a report; those
/// that change with every check decided here are kept per shard
/// ([`Shard`]), under the lock the check takes anyway.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(super) granted: AtomicU64,
    pub(super) returned: AtomicU64,
    pub(super) expired: AtomicU64,
    pub(super) held: AtomicU64,
}

/// How a store's leases are sized.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseConfig {
    /// A lease holds about this long's worth of local demand.
    pub(crate) period: Duration,
    /// The most keys with leases (or demand counts) kept.
    pub(crate) max_keys: usize,
}
