//! Fault schedules: the limiter checked under faults by machine, as Jepsen
//! checks databases.
//!
//! A schedule is drawn from a seed ([`plan`], [`fault`]): 2 to 6 instances, each its
//! own `RedisStore` with its own connection and no fallback, leasing or not
//! with its own lease period; one or two hot keys of one bucket; a load that
//! turns from calm to bursts and back; refunds, charges and resets; and
//! faults against real servers ([`servers`]): `FLUSHALL`, a restart without
//! persistence, `SIGSTOP`, connections cut or blackholed by the proxy in
//! front, script replies lost, a replica promoted with or without the last
//! writes. [`run`] plays it and records every operation with the local
//! times it was invoked and completed ([`history`]); [`check`] then proves
//! or refutes, window by window, that the admissions stayed within
//! `capacity + rate·(b − a) + refunds` from each fresh bucket on; [`report`]
//! prints both sides: violations, and admitted against what the bound
//! allowed and against what an exact bucket would have admitted of the
//! same checks ([`ideal`]).
//!
//! Nothing here depends on timing margins: a slow machine stretches an
//! operation's `[invoke, complete]`, which only makes the checker count
//! less against the limiter.

pub mod check;
pub mod fault;
pub mod history;
pub mod ideal;
pub mod panics;
pub mod plan;
pub mod report;
pub mod rng;
pub mod run;
pub mod servers;
