//! The token bucket arithmetic, in Rust. `lua/token_bucket.lua` is the same
//! algorithm for Redis; keep the two in step (the property tests compare both with
//! an independent model).
//!
//! A bucket is `(level, stamp)`: `level` in units of `1 / quota.den()` token,
//! `stamp` the microsecond it was last brought up to date. Refilling adds
//! `elapsed x quota.num()` units, an exact integer, and caps at `quota.full()`.
//!
//! Files, one job each:
//! - `level.rs`: a bucket's state ([`Level`]), refilled up to a moment and
//!   carried into changed figures.
//! - `spend.rs`: a check or a reservation decided against every quota at
//!   once, lock-outs included.
//! - `adjust.rs`: an adjustment after the fact (a charge or a refund).

mod adjust;
mod level;
mod spend;

pub(crate) use adjust::adjust;
pub(crate) use level::{Level, signed};
pub(crate) use spend::{Spent, debt_for, spend, spend_one_figures};
