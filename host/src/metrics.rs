//! Prometheus metrics of one host, served at `/metrics` by the admin API.
//!
//! Counters and histograms live here and each handler's [`crate::stats::Stats`]
//! holds handles to its own labelled series, so the hot path only bumps an
//! atomic. What the database knows better (outbox backlog, parked dead
//! letters) is read at scrape time; consumer lag per partition comes from
//! librdkafka's statistics callback.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandlerLabel {
    pub handler: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub handler: String,
    /// `retry`, `reject`, `trap` or `limit`.
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    pub handler: String,
    pub topic: String,
    pub partition: i32,
}

type Histograms = Family<HandlerLabel, Histogram, fn() -> Histogram>;

/// 1 ms to ~16 s: a guest call is ~30 us-1 ms, a batch's commit a few ms,
/// a stuck one is bounded by `limits.timeout_ms`.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 17))
}

/// Every series this host exports.
#[derive(Clone)]
pub struct Metrics {
    consumed: Family<HandlerLabel, Counter>,
    applied: Family<HandlerLabel, Counter>,
    duplicates: Family<HandlerLabel, Counter>,
    duplicates_by_key: Family<HandlerLabel, Counter>,
    failures: Family<FailureLabels, Counter>,
    dead_lettered: Family<HandlerLabel, Counter>,
    host_errors: Family<FailureLabels, Counter>,
    batch_seconds: Histograms,
    guest_seconds: Histograms,
    pub(crate) outbox_backlog: Family<HandlerLabel, Gauge>,
    pub(crate) outbox_parked: Family<HandlerLabel, Gauge>,
    pub(crate) dead_letters_parked: Family<HandlerLabel, Gauge>,
    pub(crate) held_records: Family<HandlerLabel, Gauge>,
    pub(crate) consumer_lag: Family<PartitionLabels, Gauge>,
    batches_in_flight: Family<HandlerLabel, Gauge>,
    registry: std::sync::Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        let consumed = Family::default();
        let applied = Family::default();
        let duplicates = Family::default();
        let duplicates_by_key = Family::default();
        let failures = Family::default();
        let dead_lettered = Family::default();
        let host_errors = Family::default();
        let batch_seconds: Histograms = Family::new_with_constructor(seconds_histogram);
        let guest_seconds: Histograms = Family::new_with_constructor(seconds_histogram);
        let outbox_backlog = Family::default();
        let outbox_parked = Family::default();
        let dead_letters_parked = Family::default();
        let held_records = Family::default();
        let consumer_lag = Family::default();
        let batches_in_flight = Family::default();
        let mut registry = Registry::with_prefix("inboxd");
        registry.register("events_consumed", "Records read from Kafka", consumed.clone());
        registry.register(
            "events_applied",
            "Events whose handler ran and committed",
            applied.clone(),
        );
        registry.register(
            "duplicates_skipped",
            "Events skipped as duplicates: the inbox already had their event id, or (with [handlers.dedup]) another event held their business key",
            duplicates.clone(),
        );
        registry.register(
            "duplicates_by_key",
            "Events skipped because another event with their business key ([handlers.dedup]) was applied inside its window (also counted in duplicates_skipped)",
            duplicates_by_key.clone(),
        );
        registry.register(
            "handler_failures",
            "Failed guest calls by kind, including ones that later succeeded on retry",
            failures.clone(),
        );
        registry.register(
            "dead_lettered",
            "Events parked in dead_letters",
            dead_lettered.clone(),
        );
        registry.register(
            "host_errors",
            "Failures of the host's own database statements by kind: transient ones (an outage) are retried until they pass, permanent ones park their event as host-error after a few runs",
            host_errors.clone(),
        );
        registry.register(
            "batch_duration_seconds",
            "One micro-batch from its start to its commit",
            batch_seconds.clone(),
        );
        registry.register("guest_duration_seconds", "One guest call", guest_seconds.clone());
        registry.register(
            "outbox_backlog",
            "Outbox messages not yet published (read at scrape time)",
            outbox_backlog.clone(),
        );
        registry.register(
            "outbox_parked",
            "Outbox messages the broker will never accept, parked for an operator (read at scrape time)",
            outbox_parked.clone(),
        );
        registry.register(
            "dead_letters_parked",
            "Dead letters neither replayed nor discarded (read at scrape time)",
            dead_letters_parked.clone(),
        );
        registry.register(
            "held_records",
            "Records held behind a parked record of their key (ordering = \"key\"), waiting for an operator: \
             lag the consumer cannot work off (read at scrape time)",
            held_records.clone(),
        );
        registry.register(
            "consumer_lag",
            "Records behind the partition's high watermark, from librdkafka statistics",
            consumer_lag.clone(),
        );
        registry.register(
            "batches_in_flight",
            "Micro-batches running now: at most one per assigned partition, so on a backlog it shows how many partitions are busy",
            batches_in_flight.clone(),
        );
        Self {
            consumed,
            applied,
            duplicates,
            duplicates_by_key,
            failures,
            dead_lettered,
            host_errors,
            batch_seconds,
            guest_seconds,
            outbox_backlog,
            outbox_parked,
            dead_letters_parked,
            held_records,
            consumer_lag,
            batches_in_flight,
            registry: std::sync::Arc::new(registry),
        }
    }
}

impl Metrics {
    /// The series of one handler. Calling it twice for a name gives the same series.
    pub fn handler(&self, name: &str) -> HandlerMetrics {
        let label = HandlerLabel {
            handler: name.to_owned(),
        };
        let labelled = |family: &Family<FailureLabels, Counter>, kind: &str| {
            family
                .get_or_create(&FailureLabels {
                    handler: name.to_owned(),
                    kind: kind.to_owned(),
                })
                .clone()
        };
        let failure = |kind: &str| labelled(&self.failures, kind);
        HandlerMetrics {
            consumed: self.consumed.get_or_create(&label).clone(),
            applied: self.applied.get_or_create(&label).clone(),
            duplicates: self.duplicates.get_or_create(&label).clone(),
            duplicates_by_key: self.duplicates_by_key.get_or_create(&label).clone(),
            dead_lettered: self.dead_lettered.get_or_create(&label).clone(),
            failures: [
                failure("retry"),
                failure("reject"),
                failure("trap"),
                failure("limit"),
            ],
            host_errors: HOST_ERROR_KINDS.map(|kind| labelled(&self.host_errors, kind)),
            batch_seconds: self.batch_seconds.get_or_create(&label).clone(),
            guest_seconds: self.guest_seconds.get_or_create(&label).clone(),
            batches_in_flight: self.batches_in_flight.get_or_create(&label).clone(),
        }
    }

    /// Forgets a deleted handler's series.
    pub fn remove_handler(&self, name: &str) {
        let label = HandlerLabel {
            handler: name.to_owned(),
        };
        for family in [
            &self.consumed,
            &self.applied,
            &self.duplicates,
            &self.duplicates_by_key,
            &self.dead_lettered,
        ] {
            family.remove(&label);
        }
        let labels = |kind: &str| FailureLabels {
            handler: name.to_owned(),
            kind: kind.to_owned(),
        };
        for kind in ["retry", "reject", "trap", "limit"] {
            self.failures.remove(&labels(kind));
        }
        for kind in HOST_ERROR_KINDS {
            self.host_errors.remove(&labels(kind));
        }
        self.batch_seconds.remove(&label);
        self.guest_seconds.remove(&label);
        self.batches_in_flight.remove(&label);
        self.outbox_backlog.remove(&label);
        self.outbox_parked.remove(&label);
        self.dead_letters_parked.remove(&label);
        self.held_records.remove(&label);
    }

    /// The Prometheus text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// One handler's series.
#[derive(Clone, Debug)]
pub struct HandlerMetrics {
    pub(crate) consumed: Counter,
    pub(crate) applied: Counter,
    pub(crate) duplicates: Counter,
    pub(crate) duplicates_by_key: Counter,
    pub(crate) dead_lettered: Counter,
    /// By [`FailureKind`] order.
    pub(crate) failures: [Counter; 4],
    /// By [`HostErrorKind`] order.
    pub(crate) host_errors: [Counter; 2],
    pub(crate) batch_seconds: Histogram,
    pub(crate) guest_seconds: Histogram,
    pub(crate) batches_in_flight: Gauge,
}

impl Default for HandlerMetrics {
    /// Series that belong to no registry (benchmarks, unit tests).
    fn default() -> Self {
        Metrics::default().handler("unregistered")
    }
}

/// The kinds of a failed guest call, as the `kind` label says them.
#[derive(Debug, Clone, Copy)]
pub enum FailureKind {
    Retry = 0,
    Reject = 1,
    Trap = 2,
    Limit = 3,
}

/// The kinds of a failed host statement, as the `kind` label says them.
#[derive(Debug, Clone, Copy)]
pub enum HostErrorKind {
    Transient = 0,
    Permanent = 1,
}

const HOST_ERROR_KINDS: [&str; 2] = ["transient", "permanent"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_errors_are_exported_by_kind() {
        let metrics = Metrics::default();
        let handler = metrics.handler("billing");
        handler.host_errors[HostErrorKind::Permanent as usize].inc();
        handler.host_errors[HostErrorKind::Transient as usize].inc_by(2);
        let text = metrics.encode();
        for line in [
            r#"inboxd_host_errors_total{handler="billing",kind="permanent"} 1"#,
            r#"inboxd_host_errors_total{handler="billing",kind="transient"} 2"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
