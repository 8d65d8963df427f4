//! Counters of what a handler's pipeline did, and how long its events took
//! from the producer to the committed effect, for the demo summary, the
//! benchmark and `/metrics`. Counters are the handler's Prometheus series
//! (atomics); the latency histogram takes a lock once per committed
//! transaction, not per statement. The operator console's live view
//! ([`Live`]) comes from the same counters, sampled into a [`history`].

pub mod history;

use crate::metrics::{FailureKind, HandlerMetrics, HostErrorKind};
use hdrhistogram::Histogram;
use history::{Counts, History, Latencies, Percentiles, Rates, Series};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Latencies above an hour are clamped: they are replays of old records, not
/// a measure of the pipeline.
const MAX_LATENCY_MS: u64 = 3_600_000;

#[derive(Debug)]
pub struct Stats {
    metrics: HandlerMetrics,
    /// Milliseconds from the record's Kafka timestamp to its commit, per applied event.
    latency_ms: Mutex<Histogram<u64>>,
    in_flight: Mutex<InFlight>,
    history: Mutex<History>,
    batch_took: Mutex<Latencies>,
    guest_took: Mutex<Latencies>,
    /// Records behind the high watermark per (topic, partition), from
    /// librdkafka's statistics; a revoked partition is forgotten.
    lag: Mutex<BTreeMap<(String, i32), i64>>,
}

/// Batches in flight over time, since the last reset: their time-weighted
/// mean says how many partitions were busy on average.
#[derive(Debug)]
struct InFlight {
    now: usize,
    changed: Instant,
    since: Instant,
    /// Batch-seconds so far.
    area: f64,
    peak: usize,
}

impl InFlight {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            now: 0,
            changed: now,
            since: now,
            area: 0.0,
            peak: 0,
        }
    }

    fn set(&mut self, count: usize) {
        let now = Instant::now();
        self.area += self.now as f64 * (now - self.changed).as_secs_f64();
        self.now = count;
        self.changed = now;
        self.peak = self.peak.max(count);
    }

    fn mean(&self) -> f64 {
        let now = Instant::now();
        let area = self.area + self.now as f64 * (now - self.changed).as_secs_f64();
        let secs = (now - self.since).as_secs_f64();
        if secs > 0.0 { area / secs } else { 0.0 }
    }
}

impl Default for Stats {
    fn default() -> Self {
        Self::new(HandlerMetrics::default())
    }
}

impl Stats {
    pub fn new(metrics: HandlerMetrics) -> Self {
        Self {
            metrics,
            // Two significant digits: 1% resolution is plenty for p50/p99.
            latency_ms: Mutex::new(
                Histogram::new_with_bounds(1, MAX_LATENCY_MS, 2).expect("valid histogram bounds"),
            ),
            in_flight: Mutex::new(InFlight::new()),
            history: Mutex::default(),
            batch_took: Mutex::default(),
            guest_took: Mutex::default(),
            lag: Mutex::default(),
        }
    }
}

/// Locks a mutex whose holder may have panicked: these are counters, and a
/// half-updated one is still worth showing.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Snapshot {
    /// Events whose handler ran and committed.
    pub applied: u64,
    /// Copies skipped because the inbox already had their event id.
    pub duplicates: u64,
    /// Events parked in `dead_letters`.
    pub dead_lettered: u64,
    /// Failed guest calls, including ones that later succeeded on retry.
    pub guest_failures: u64,
    /// Failed host database statements, transient and permanent.
    pub host_errors: u64,
    /// Records read from Kafka.
    pub consumed: u64,
    /// Median milliseconds from produce (the record's timestamp) to commit.
    pub latency_p50_ms: u64,
    pub latency_p99_ms: u64,
    pub latency_max_ms: u64,
    /// Batches in flight, on average over time and at most, since the last reset.
    pub batches_in_flight_mean: f64,
    pub batches_in_flight_peak: u64,
}

impl Stats {
    /// Counts events applied in one committed transaction; `timestamps` are
    /// their Kafka timestamps (ms since the epoch), when the record had one.
    pub(crate) fn applied(&self, timestamps: impl IntoIterator<Item = Option<i64>>) {
        let now = crate::db::now_ms();
        let mut count = 0;
        let mut latency = lock(&self.latency_ms);
        for timestamp in timestamps {
            count += 1;
            if let Some(produced) = timestamp {
                let ms = (now - produced).clamp(1, MAX_LATENCY_MS as i64) as u64;
                latency.saturating_record(ms);
            }
        }
        self.metrics.applied.inc_by(count);
    }
    /// Events skipped because another with their business key was applied
    /// (`[handlers.dedup]`): duplicates, and counted apart as well.
    pub(crate) fn duplicates_by_key(&self, count: u64) {
        self.metrics.duplicates_by_key.inc_by(count);
        self.duplicates(count);
    }

    /// Duplicates by business key so far (`inboxd_duplicates_by_key_total`).
    #[cfg(test)]
    pub(crate) fn duplicates_by_key_total(&self) -> u64 {
        self.metrics.duplicates_by_key.get()
    }

    pub(crate) fn duplicates(&self, count: u64) {
        self.metrics.duplicates.inc_by(count);
    }
    pub(crate) fn dead_lettered(&self) {
        self.metrics.dead_lettered.inc();
    }
    pub(crate) fn guest_failure(&self, kind: FailureKind) {
        self.metrics.failures[kind as usize].inc();
    }
    pub(crate) fn host_error(&self, kind: HostErrorKind) {
        self.metrics.host_errors[kind as usize].inc();
    }
    pub(crate) fn consumed(&self) {
        self.metrics.consumed.inc();
    }
    pub(crate) fn batch_took(&self, took: Duration) {
        self.metrics.batch_seconds.observe(took.as_secs_f64());
        lock(&self.batch_took).record(took);
    }
    pub(crate) fn guest_took(&self, took: Duration) {
        self.metrics.guest_seconds.observe(took.as_secs_f64());
        lock(&self.guest_took).record(took);
    }
    /// A partition's consumer lag, as librdkafka's statistics last said.
    pub fn partition_lag(&self, topic: &str, partition: i32, lag: i64) {
        lock(&self.lag).insert((topic.to_owned(), partition), lag);
    }
    /// The partition went to another consumer: its lag is no longer ours to show.
    pub fn forget_partition(&self, topic: &str, partition: i32) {
        lock(&self.lag).remove(&(topic.to_owned(), partition));
    }
    pub(crate) fn batches_in_flight(&self, count: usize) {
        self.metrics.batches_in_flight.set(count as i64);
        lock(&self.in_flight).set(count);
    }

    /// Forgets the latencies and batches in flight seen so far (a benchmark
    /// between its phases).
    pub fn reset_latency(&self) {
        lock(&self.latency_ms).reset();
        let mut in_flight = lock(&self.in_flight);
        let now = in_flight.now;
        *in_flight = InFlight::new();
        in_flight.set(now);
    }

    fn counts(&self) -> Counts {
        Counts {
            consumed: self.metrics.consumed.get(),
            applied: self.metrics.applied.get(),
            duplicates: self.metrics.duplicates.get(),
            failures: self.metrics.failures.iter().map(|c| c.get()).sum(),
            dead_lettered: self.metrics.dead_lettered.get(),
            host_errors: self.metrics.host_errors.iter().map(|c| c.get()).sum(),
        }
    }

    /// Closes one [`history::STEP`]: records the counters and starts the next
    /// latency window. The registry's sampler calls it on every handler.
    pub fn sample(&self, now_ms: i64) {
        lock(&self.history).push(now_ms, self.counts());
        lock(&self.batch_took).step();
        lock(&self.guest_took).step();
    }

    /// What the operator console shows of this handler on this host now.
    pub fn live(&self, now_ms: i64) -> Live {
        let totals = self.counts();
        let history = lock(&self.history);
        Live {
            totals,
            per_second: history.rates(now_ms, totals),
            series: history.series(),
            batch: lock(&self.batch_took).percentiles(),
            guest: lock(&self.guest_took).percentiles(),
            lag: lock(&self.lag)
                .iter()
                .map(|((topic, partition), lag)| PartitionLag {
                    topic: topic.clone(),
                    partition: *partition,
                    lag: *lag,
                })
                .collect(),
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        let counts = self.counts();
        let latency = lock(&self.latency_ms);
        let in_flight = lock(&self.in_flight);
        Snapshot {
            applied: counts.applied,
            duplicates: counts.duplicates,
            dead_lettered: counts.dead_lettered,
            guest_failures: counts.failures,
            host_errors: counts.host_errors,
            consumed: counts.consumed,
            latency_p50_ms: latency.value_at_quantile(0.50),
            latency_p99_ms: latency.value_at_quantile(0.99),
            latency_max_ms: latency.max(),
            batches_in_flight_mean: in_flight.mean(),
            batches_in_flight_peak: in_flight.peak as u64,
        }
    }
}

/// One handler on one host, live: counters since the host started, rates
/// and durations over the last minute, the 15-minute chart and consumer lag.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Live {
    pub totals: Counts,
    pub per_second: Rates,
    pub series: Series,
    /// One micro-batch, from its start to its commit.
    pub batch: Percentiles,
    /// One guest call.
    pub guest: Percentiles,
    pub lag: Vec<PartitionLag>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionLag {
    pub topic: String,
    pub partition: i32,
    pub lag: i64,
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

    #[test]
    fn the_live_view_reads_the_counters_the_pipeline_bumps() {
        let stats = Stats::default();
        stats.sample(0);
        stats.applied([None, None, None]);
        stats.duplicates(2);
        stats.guest_failure(FailureKind::Reject);
        stats.guest_took(Duration::from_millis(3));
        stats.partition_lag("orders", 1, 40);
        stats.partition_lag("orders", 0, 7);
        stats.sample(2_000);
        let live = stats.live(2_000);
        assert_eq!(live.totals.applied, 3);
        assert_eq!(live.per_second.applied, 1.5);
        assert_eq!(live.series.applied, [1.5]);
        assert_eq!(live.series.duplicates, [1.0]);
        assert_eq!(live.series.failures, [0.5]);
        assert_eq!(live.guest.count, 1);
        assert_eq!(live.batch.count, 0);
        let lag: Vec<(i32, i64)> = live.lag.iter().map(|l| (l.partition, l.lag)).collect();
        assert_eq!(lag, [(0, 7), (1, 40)]);
        stats.forget_partition("orders", 1);
        assert_eq!(stats.live(2_000).lag.len(), 1);
    }
}
