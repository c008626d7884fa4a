//! What the exact models of `tests/model.rs` and `tests/reservation_model.rs`
//! share: the state of one quota a model expects, and the comparison of a
//! store's `Decision` with it, quota by quota and through the top-level
//! accessors.

use std::time::Duration;

use tollgate::Decision;

/// One quota's state after a check, as a model computes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub allowed: bool,
    pub remaining: u64,
    pub retry_after_us: u64,
    pub reset_after_us: u64,
}

/// The quota the decision's top-level accessors must describe, as documented on
/// `Decision`: for a denial the longest wait, for an admission the fewest tokens
/// left (then the longest time to full); ties go to the first quota listed.
pub fn binding(states: &[Expected]) -> usize {
    let allowed = states.first().is_some_and(|s| s.allowed);
    let mut best = 0;
    for (i, s) in states.iter().enumerate().skip(1) {
        let b = &states[best];
        let better = if allowed {
            s.remaining < b.remaining
                || (s.remaining == b.remaining && s.reset_after_us > b.reset_after_us)
        } else {
            s.retry_after_us > b.retry_after_us
        };
        if better {
            best = i;
        }
    }
    best
}

/// `Ok` when `got` holds the states `want` lists, quota by quota, and its
/// top-level accessors describe `want`'s binding quota; otherwise what differs,
/// naming `who` decided at which `step`.
pub fn compare(who: &str, step: usize, got: &Decision, want: &[Expected]) -> Result<(), String> {
    let states: Vec<Expected> = got
        .states()
        .iter()
        .map(|s| Expected {
            allowed: got.allowed(),
            remaining: s.remaining(),
            retry_after_us: s.retry_after().as_micros() as u64,
            reset_after_us: s.reset_after().as_micros() as u64,
        })
        .collect();
    if states != want {
        return Err(format!(
            "{who}, step {step}: got {states:?}, model says {want:?}"
        ));
    }
    let b = &want[binding(want)];
    let top = (
        got.allowed(),
        got.remaining(),
        got.retry_after(),
        got.reset_after(),
    );
    let expected_top = (
        b.allowed,
        b.remaining,
        if b.allowed {
            Duration::ZERO
        } else {
            Duration::from_micros(b.retry_after_us)
        },
        Duration::from_micros(b.reset_after_us),
    );
    if top != expected_top {
        return Err(format!(
            "{who}, step {step}: decision reports {top:?}, model's most restrictive quota is {expected_top:?}"
        ));
    }
    Ok(())
}
