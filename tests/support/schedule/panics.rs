//! Panics anywhere in the process while schedules run. A task the store
//! spawns (a lease report, a reconnect) that panics leaves no trace in the
//! history, yet it is a defect: every panic is counted, and a schedule
//! that saw one fails. The count is process-wide, so when two tests run at
//! once a panic is counted in the schedules of both.

use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

static PANICS: AtomicU64 = AtomicU64::new(0);
static WATCH: Once = Once::new();

/// Starts counting panics (once per process); the default hook still
/// prints each one.
pub fn watch() {
    WATCH.call_once(|| {
        let print = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            print(info);
        }));
    });
}

/// Panics so far.
pub fn count() -> u64 {
    PANICS.load(Ordering::SeqCst)
}
