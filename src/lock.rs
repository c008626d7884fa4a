//! [`lock`]: a mutex locked whatever another thread did while it held it.

use std::sync::{Mutex, MutexGuard};

/// `mutex`, locked. A poisoned lock only means another thread panicked while
/// it held it; what it guards (counts, levels, holds, queues) is still
/// usable, so a limiter keeps limiting rather than panic on every request
/// after one.
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
