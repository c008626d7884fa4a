//! What a schedule showed, one line each, and the totals of a run: both
//! sides, violations (over-admission) and admitted against allowed
//! (under-admission), by what opened each checked stretch.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::check::{Segment, Window};
use super::history::{Op, What};
use super::plan::{Leases, Plan};

/// One schedule's result.
pub struct Report {
    pub plan: Plan,
    pub segments: Vec<Segment>,
    /// Tokens an exact bucket would have admitted of the same checks.
    pub ideal: u64,
    pub checks: usize,
    pub errors: usize,
    /// Refunds and charges, and how many of them failed.
    pub settlements: usize,
    pub failed_settlements: usize,
    pub local_decisions: u64,
    /// Each data loss, when, and the tokens held unspent just before it.
    pub losses: Vec<(&'static str, Duration, u64)>,
    /// Panics in the process while the schedule ran (see `panics`).
    pub panics: u64,
    pub took: Duration,
}

impl Report {
    pub fn new(
        plan: Plan,
        ops: &[Op],
        segments: Vec<Segment>,
        ideal: u64,
        local_decisions: u64,
        took: Duration,
    ) -> Self {
        let of = |pick: fn(&What) -> bool| -> Vec<&Op> {
            ops.iter().filter(|o| pick(&o.what)).collect()
        };
        let checks = of(|w| matches!(w, What::Check { .. }));
        let settlements = of(|w| matches!(w, What::Refund { .. } | What::Charge { .. }));
        Report {
            plan,
            segments,
            ideal,
            checks: checks.len(),
            errors: checks.iter().filter(|o| !o.ok()).count(),
            settlements: settlements.len(),
            failed_settlements: settlements.iter().filter(|o| !o.ok()).count(),
            local_decisions,
            losses: ops
                .iter()
                .filter_map(|o| match o.what {
                    What::Fault {
                        name,
                        loss: true,
                        held,
                        ..
                    } => Some((name, o.invoke, held)),
                    _ => None,
                })
                .collect(),
            panics: 0,
            took,
        }
    }

    /// Stretches with a window over its bound.
    pub fn violating(&self) -> impl Iterator<Item = &Segment> {
        self.segments.iter().filter(|s| s.violations > 0)
    }

    pub fn failed(&self) -> bool {
        self.violating().next().is_some() || self.panics > 0
    }

    /// The window furthest over its bound, where it is.
    pub fn worst(&self) -> Option<(&Segment, &Window)> {
        self.violating()
            .filter_map(|s| s.worst.as_ref().map(|w| (s, w)))
            .max_by(|x, y| x.1.excess().total_cmp(&y.1.excess()))
    }

    pub fn admitted(&self) -> u64 {
        self.segments.iter().map(|s| s.admitted).sum()
    }

    pub fn allowed(&self) -> f64 {
        self.segments.iter().map(|s| s.allowed).sum()
    }

    pub fn offered(&self) -> u64 {
        self.segments.iter().map(|s| s.offered).sum()
    }

    /// The summary line of schedule `index` of a `run`, and one line per
    /// stretch over its bound.
    pub fn lines(&self, run: &str, index: usize) -> String {
        let mut out = format!(
            "{run} #{index} seed={:#x} ({:.1}s): {}\n    {} checks ({} failed, {} decided in process), \
             {} settlements ({} failed), {} tokens offered; admitted {}: {:.2} of the {:.0} \
             allowed, {:.2} of the {} an exact bucket admits",
            self.plan.seed,
            self.took.as_secs_f64(),
            self.plan,
            self.checks,
            self.errors,
            self.local_decisions,
            self.settlements,
            self.failed_settlements,
            self.offered(),
            self.admitted(),
            ratio(self.admitted() as f64, self.allowed()),
            self.allowed(),
            ratio(self.admitted() as f64, self.ideal as f64),
            self.ideal,
        );
        let held: Vec<String> = self
            .losses
            .iter()
            .map(|(name, at, held)| format!("{name}@{:.2}s {held}", at.as_secs_f64()))
            .collect();
        if !held.is_empty() {
            let _ = write!(out, "; held unspent at data losses: {}", held.join(", "));
        }
        let after: Vec<String> = self
            .segments
            .iter()
            .filter(|s| s.opened_by != "start")
            .map(|s| {
                format!(
                    "k{} {}@{:.2}s {:.2}",
                    s.key,
                    s.opened_by,
                    s.from.as_secs_f64(),
                    ratio(s.admitted as f64, s.allowed)
                )
            })
            .collect();
        if !after.is_empty() {
            let _ = write!(
                out,
                "; admitted/allowed after fresh buckets: {}",
                after.join(", ")
            );
        }
        if self.panics > 0 {
            let _ = write!(
                out,
                "\n    PANIC: {} panics while it ran (printed above)",
                self.panics
            );
        }
        for s in self.violating() {
            let window = s
                .worst
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            let _ = write!(
                out,
                "\n    VIOLATION k{} after {}@{:.3}s: {} windows over the bound; worst {window}",
                s.key,
                s.opened_by,
                s.from.as_secs_f64(),
                s.violations,
            );
        }
        out
    }
}

fn ratio(x: f64, y: f64) -> f64 {
    if y > 0.0 { x / y } else { 0.0 }
}

/// Stretches of one kind (what opened them) under one lease setting.
#[derive(Default)]
struct Count {
    stretches: u64,
    violating: u64,
    admitted: u64,
    allowed: f64,
}

/// Schedules of one lease setting.
#[derive(Default)]
struct Totals {
    schedules: u64,
    violating: u64,
    admitted: u64,
    allowed: f64,
    ideal: u64,
}

/// The totals of a run.
#[derive(Default)]
pub struct Tally {
    failing: Vec<u64>,
    offered: u64,
    by_leases: BTreeMap<Leases, Totals>,
    by_kind: BTreeMap<(&'static str, Leases), Count>,
}

impl Tally {
    pub fn add(&mut self, report: &Report) {
        if report.failed() {
            self.failing.push(report.plan.seed);
        }
        self.offered += report.offered();
        let totals = self.by_leases.entry(report.plan.leases).or_default();
        totals.schedules += 1;
        totals.violating += u64::from(report.failed());
        totals.admitted += report.admitted();
        totals.allowed += report.allowed();
        totals.ideal += report.ideal;
        for s in &report.segments {
            let count = self
                .by_kind
                .entry((s.opened_by, report.plan.leases))
                .or_default();
            count.stretches += 1;
            count.violating += u64::from(s.violations > 0);
            count.admitted += s.admitted;
            count.allowed += s.allowed;
        }
    }

    /// Seeds of the schedules with a violation.
    pub fn failing(&self) -> &[u64] {
        &self.failing
    }

    /// The totals of the `run` (its name) and the table by kind, as the
    /// long run prints them.
    pub fn lines(&self, run: &str) -> String {
        let all = self
            .by_leases
            .values()
            .fold(Totals::default(), |sum, t| Totals {
                schedules: sum.schedules + t.schedules,
                violating: sum.violating + t.violating,
                admitted: sum.admitted + t.admitted,
                allowed: sum.allowed + t.allowed,
                ideal: sum.ideal + t.ideal,
            });
        let mut out = format!(
            "TOTAL {run}: schedules={} violating={} admitted={} allowed={:.0} ideal={} \
             admitted/allowed={:.3} admitted/ideal={:.3} offered={}",
            all.schedules,
            all.violating,
            all.admitted,
            all.allowed,
            all.ideal,
            ratio(all.admitted as f64, all.allowed),
            ratio(all.admitted as f64, all.ideal as f64),
            self.offered,
        );
        for (leases, t) in &self.by_leases {
            let _ = write!(
                out,
                "\n  leases {:<5}: {} schedules, {} violating, admitted/allowed {:.3}, admitted/ideal {:.3}",
                leases.name(),
                t.schedules,
                t.violating,
                ratio(t.admitted as f64, t.allowed),
                ratio(t.admitted as f64, t.ideal as f64),
            );
        }
        out.push_str("\n  stretch opened by / leases: stretches, violating, admitted/allowed");
        for ((kind, leases), c) in &self.by_kind {
            let _ = write!(
                out,
                "\n  {kind:<15} {:<5} {:>5} {:>5}  {:.3}",
                leases.name(),
                c.stretches,
                c.violating,
                ratio(c.admitted as f64, c.allowed),
            );
        }
        out
    }
}
