//! Counters of what a handler's pipeline did, and how long its events took
//! from the producer to the committed effect, for the demo summary, the
//! benchmark and (later) metrics. Counters are plain atomics; the latency
//! histogram takes a lock once per committed transaction, not per statement.

use hdrhistogram::Histogram;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Latencies above an hour are clamped: they are replays of old records, not
/// a measure of the pipeline.
const MAX_LATENCY_MS: u64 = 3_600_000;

#[derive(Debug)]
pub struct Stats {
    applied: AtomicU64,
    duplicates: AtomicU64,
    dead_lettered: AtomicU64,
    guest_failures: AtomicU64,
    /// Milliseconds from the record's Kafka timestamp to its commit, per applied event.
    latency_ms: Mutex<Histogram<u64>>,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            applied: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            guest_failures: AtomicU64::new(0),
            // Two significant digits: 1% resolution is plenty for p50/p99.
            latency_ms: Mutex::new(
                Histogram::new_with_bounds(1, MAX_LATENCY_MS, 2).expect("valid histogram bounds"),
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Snapshot {
    /// Events whose handler ran and committed.
    pub applied: u64,
    /// Copies skipped because the inbox already had their event id.
    pub duplicates: u64,
    /// Events parked in `dead_letters`.
    pub dead_lettered: u64,
    /// Failed guest calls, including ones that later succeeded on retry.
    pub guest_failures: u64,
    /// Median milliseconds from produce (the record's timestamp) to commit.
    pub latency_p50_ms: u64,
    pub latency_p99_ms: u64,
    pub latency_max_ms: u64,
}

impl Stats {
    /// Counts events applied in one committed transaction; `timestamps` are
    /// their Kafka timestamps (ms since the epoch), when the record had one.
    pub(crate) fn applied(&self, timestamps: impl IntoIterator<Item = Option<i64>>) {
        let now = crate::db::now_ms();
        let mut count = 0;
        let mut latency = self.latency_ms.lock().unwrap_or_else(|p| p.into_inner());
        for timestamp in timestamps {
            count += 1;
            if let Some(produced) = timestamp {
                let ms = (now - produced).clamp(1, MAX_LATENCY_MS as i64) as u64;
                latency.saturating_record(ms);
            }
        }
        self.applied.fetch_add(count, Ordering::Relaxed);
    }
    pub(crate) fn duplicates(&self, count: u64) {
        self.duplicates.fetch_add(count, Ordering::Relaxed);
    }
    pub(crate) fn dead_lettered(&self) {
        self.dead_lettered.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn guest_failure(&self) {
        self.guest_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Forgets the latencies seen so far (a benchmark between its phases).
    pub fn reset_latency(&self) {
        self.latency_ms.lock().unwrap_or_else(|p| p.into_inner()).reset();
    }

    pub fn snapshot(&self) -> Snapshot {
        let latency = self.latency_ms.lock().unwrap_or_else(|p| p.into_inner());
        Snapshot {
            applied: self.applied.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            guest_failures: self.guest_failures.load(Ordering::Relaxed),
            latency_p50_ms: latency.value_at_quantile(0.50),
            latency_p99_ms: latency.value_at_quantile(0.99),
            latency_max_ms: latency.max(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_percentiles_come_from_record_timestamps() {
        let stats = Stats::default();
        let now = crate::db::now_ms();
        // 99 events 10 ms old, one 900 ms old, one without a timestamp.
        let mut stamps: Vec<Option<i64>> = vec![Some(now - 10); 99];
        stamps.push(Some(now - 900));
        stamps.push(None);
        stats.applied(stamps);
        let snap = stats.snapshot();
        assert_eq!(snap.applied, 101);
        assert!((10..=12).contains(&snap.latency_p50_ms), "{snap:?}");
        assert!(snap.latency_max_ms >= 900, "{snap:?}");
    }
}
