//! The rdkafka consumer for one handler, and the rebalance context that marks
//! newly assigned partitions so the pump seeks them to the database's offsets.
//!
//! Auto offset store is off: the pump stores an offset only after the
//! database transaction that applied the record has committed, and
//! librdkafka's auto commit sends what is stored.

use crate::config::KafkaConfig;
use crate::metrics::PartitionLabels;
use crate::stats::Stats;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaResult;
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::TopicPartitionList;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

pub type InboxConsumer = StreamConsumer<InboxContext>;

/// Partitions assigned since the pump last looked at them.
pub type FreshPartitions = Arc<Mutex<HashSet<(String, i32)>>>;

pub struct InboxContext {
    handler: String,
    fresh: FreshPartitions,
    revoked: FreshPartitions,
    /// `inboxd_consumer_lag`, fed by librdkafka's statistics.
    lag: Family<PartitionLabels, Gauge>,
    /// The same lag for the operator console, which shows only this
    /// consumer's current partitions.
    stats: Arc<Stats>,
}

impl InboxContext {
    /// True once per assignment of a partition: the pump must check its stored offset.
    pub fn take_fresh(&self, topic: &str, partition: i32) -> bool {
        let mut fresh = self.fresh.lock().unwrap_or_else(|p| p.into_inner());
        fresh.remove(&(topic.to_owned(), partition))
    }
}

impl InboxContext {
    /// Partitions revoked since the pump last asked: it drops what it buffered for them.
    pub fn take_revoked(&self) -> Vec<(String, i32)> {
        let mut revoked = self.revoked.lock().unwrap_or_else(|p| p.into_inner());
        revoked.drain().collect()
    }

    /// Makes the pump re-read the partition's stored offset before its next record.
    pub fn mark_fresh(&self, topic: &str, partition: i32) {
        let mut fresh = self.fresh.lock().unwrap_or_else(|p| p.into_inner());
        fresh.insert((topic.to_owned(), partition));
    }
}

impl ClientContext for InboxContext {
    fn stats(&self, statistics: Statistics) {
        for (topic, stats) in statistics.topics {
            // Partition -1 is librdkafka's internal "unassigned" one; a lag of
            // -1 means "not known yet" (no fetch or no position).
            for (partition, p) in stats.partitions {
                if partition < 0 || p.consumer_lag < 0 {
                    continue;
                }
                let labels = PartitionLabels {
                    handler: self.handler.clone(),
                    topic: topic.clone(),
                    partition,
                };
                self.lag.get_or_create(&labels).set(p.consumer_lag);
                self.stats.partition_lag(&topic, partition, p.consumer_lag);
            }
        }
    }
}

impl ConsumerContext for InboxContext {
    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        if let Err(error) = result {
            // Harmless: the database holds the real position; the next commit catches up.
            tracing::debug!(handler = %self.handler, "committing offsets to Kafka failed: {error}");
        }
    }

    // Runs inside the consumer's poll. Batches of a revoked partition may still
    // be in flight: they either commit before the new owner's first commit or
    // are fenced by it (offsets are compare-and-set), never both.
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let mut fresh = self.fresh.lock().unwrap_or_else(|p| p.into_inner());
        match rebalance {
            Rebalance::Assign(tpl) => {
                let list: Vec<String> = tpl
                    .elements()
                    .iter()
                    .map(|e| format!("{}/{}", e.topic(), e.partition()))
                    .collect();
                for e in tpl.elements() {
                    fresh.insert((e.topic().to_owned(), e.partition()));
                }
                tracing::info!(handler = %self.handler, partitions = ?list, "partitions assigned");
            }
            Rebalance::Revoke(tpl) => {
                let list: Vec<String> = tpl
                    .elements()
                    .iter()
                    .map(|e| format!("{}/{}", e.topic(), e.partition()))
                    .collect();
                let mut revoked = self.revoked.lock().unwrap_or_else(|p| p.into_inner());
                for e in tpl.elements() {
                    fresh.remove(&(e.topic().to_owned(), e.partition()));
                    revoked.insert((e.topic().to_owned(), e.partition()));
                    self.stats.forget_partition(e.topic(), e.partition());
                }
                tracing::info!(handler = %self.handler, partitions = ?list, "partitions revoked");
            }
            Rebalance::Error(e) => tracing::warn!(handler = %self.handler, "rebalance error: {e}"),
        }
    }
}

/// How often stored offsets are committed to Kafka, unless
/// `kafka.properties` says otherwise. The database holds the real position,
/// so a lost Kafka commit costs nothing but a stale lag reading.
const KAFKA_COMMIT_INTERVAL_MS: &str = "1000";

/// How often librdkafka reports statistics (consumer lag for `/metrics`).
const STATISTICS_INTERVAL_MS: &str = "5000";

pub fn create_consumer(
    kafka: &KafkaConfig,
    handler: &str,
    group_id: &str,
    topics: &[String],
    lag: Family<PartitionLabels, Gauge>,
    stats: Arc<Stats>,
) -> KafkaResult<InboxConsumer> {
    let mut config = ClientConfig::new();
    for (key, value) in &kafka.properties {
        config.set(key, value);
    }
    config
        .set("bootstrap.servers", &kafka.brokers)
        .set("group.id", group_id)
        .set("client.id", format!("inboxd-{handler}"))
        // The database is the source of truth for positions (a partition with
        // a row in `offsets` is sought there); Kafka's committed offset feeds
        // lag tools, and a partition the database has never seen starts
        // there. It moves only after the database commit:
        // the pump stores an offset once its batch committed, and librdkafka
        // commits what is stored every second, on a rebalance and on leaving
        // the group (rdkafka's "at least once" pattern).
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("session.timeout.ms", kafka.session_timeout_ms.to_string());
    if !kafka.properties.contains_key("auto.offset.reset") {
        // A partition this handler never saw starts at its beginning: nothing is skipped.
        config.set("auto.offset.reset", "earliest");
    }
    if !kafka.properties.contains_key("auto.commit.interval.ms") {
        config.set("auto.commit.interval.ms", KAFKA_COMMIT_INTERVAL_MS);
    }
    if !kafka.properties.contains_key("statistics.interval.ms") {
        config.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
    }
    let context = InboxContext {
        handler: handler.to_owned(),
        fresh: FreshPartitions::default(),
        revoked: FreshPartitions::default(),
        lag,
        stats,
    };
    let consumer: InboxConsumer = config.create_with_context(context)?;
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    rdkafka::consumer::Consumer::subscribe(&consumer, &topics)?;
    Ok(consumer)
}
