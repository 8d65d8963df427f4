//! Counters of what a handler's pipeline did, for the demo summary, logs and
//! (later) metrics. Plain atomics: they are read rarely and written once per event.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Stats {
    applied: AtomicU64,
    duplicates: AtomicU64,
    dead_lettered: AtomicU64,
    guest_failures: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Events whose handler ran and committed.
    pub applied: u64,
    /// Copies skipped because the inbox already had their event id.
    pub duplicates: u64,
    /// Events parked in `dead_letters`.
    pub dead_lettered: u64,
    /// Failed guest calls, including ones that later succeeded on retry.
    pub guest_failures: u64,
}

impl Stats {
    pub(crate) fn applied(&self) {
        self.applied.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn duplicate(&self) {
        self.duplicates.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn dead_lettered(&self) {
        self.dead_lettered.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn guest_failure(&self) {
        self.guest_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            applied: self.applied.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            guest_failures: self.guest_failures.load(Ordering::Relaxed),
        }
    }
}
