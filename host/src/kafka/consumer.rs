//! The rdkafka consumer for one handler, and the rebalance context that gives
//! every newly assigned partition a queue of its own for the pump.
//!
//! Auto offset store is off: the pump stores an offset only after the
//! database transaction that applied the record has committed, and
//! librdkafka's auto commit sends what is stored.
//!
//! Why a queue per partition: a partition whose buffer is full must stop
//! while the others flow. Pausing it at the consumer makes librdkafka drop
//! everything it had prefetched for it and fetch it all again on resume (the
//! broker spent 52-75 µs of CPU per event on those re-sends, against 4 for a
//! consumer that never pauses). A partition with a queue of its own is simply
//! not read while full, and librdkafka's per-partition prefetch bounds
//! (`queued.min.messages`, `queued.max.messages.kbytes`) hold it back.

use crate::config::KafkaConfig;
use crate::metrics::PartitionLabels;
use crate::stats::Stats;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaResult;
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::TopicPartitionList;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use tokio::sync::Notify;

pub type InboxConsumer = StreamConsumer<InboxContext>;

/// A topic and partition.
pub type PartitionKey = (String, i32);

/// The records of one assigned partition, apart from every other's.
pub type PartitionQueue = StreamPartitionQueue<InboxContext>;

pub struct InboxContext {
    handler: String,
    /// The consumer this context belongs to, to split the queues of the
    /// partitions it is assigned (set by [`InboxContext::attach`]).
    consumer: OnceLock<Weak<InboxConsumer>>,
    /// One queue per partition ever split, for the consumer's life: the
    /// wake-up callback belongs to librdkafka's queue, not to a handle, so a
    /// second handle's drop would silence the first (a partition revoked
    /// and assigned again while its old task finished a batch then never
    /// woke up). Cleared by [`InboxContext::release_queues`].
    queues: Mutex<HashMap<PartitionKey, Arc<PartitionQueue>>>,
    /// Partitions assigned since the pump last asked.
    assigned: Mutex<Vec<PartitionKey>>,
    /// Partitions revoked since the pump last asked.
    revoked: Mutex<HashSet<PartitionKey>>,
    /// Woken when `assigned` or `revoked` changed.
    changed: Notify,
    /// The partitions assigned now: librdkafka's statistics go on reporting
    /// a revoked partition's last lag, which would bring its series back.
    current: Mutex<HashSet<PartitionKey>>,
    /// Every partition a lag series was made for, removed when the
    /// consumer goes (`queues` is emptied before that).
    lag_series: Mutex<HashSet<PartitionKey>>,
    /// `inboxd_consumer_lag`, fed by librdkafka's statistics.
    lag: Family<PartitionLabels, Gauge>,
    /// The same lag for the operator console, which shows only this
    /// consumer's current partitions.
    stats: Arc<Stats>,
}

impl InboxContext {
    /// Lets the rebalance callback split partition queues off `consumer`.
    /// Call it before the consumer is first polled (the first rebalance).
    pub fn attach(consumer: &Arc<InboxConsumer>) {
        // A second call keeps the first consumer, which is this one.
        let _ = consumer.context().consumer.set(Arc::downgrade(consumer));
    }

    /// Partitions assigned since the pump last asked, each with its own queue.
    pub fn take_assigned(&self) -> Vec<(PartitionKey, Arc<PartitionQueue>)> {
        let keys = std::mem::take(&mut *lock(&self.assigned));
        let queues = lock(&self.queues);
        keys.into_iter()
            .filter_map(|key| queues.get(&key).cloned().map(|queue| (key, queue)))
            .collect()
    }

    /// Drops the queues, which hold the consumer: when its pump ends.
    pub fn release_queues(&self) {
        lock(&self.assigned).clear();
        lock(&self.queues).clear();
    }

    /// Partitions revoked since the pump last asked: it drops what it buffered for them.
    pub fn take_revoked(&self) -> Vec<PartitionKey> {
        lock(&self.revoked).drain().collect()
    }

    /// Resolves once partitions were assigned or revoked since the last call.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The queue of one partition, split off the consumer's the first time:
    /// its records no longer reach the consumer's queue. `None` if the
    /// consumer is gone or not attached.
    pub fn split(&self, topic: &str, partition: i32) -> Option<Arc<PartitionQueue>> {
        let key = (topic.to_owned(), partition);
        let mut queues = lock(&self.queues);
        if let Some(queue) = queues.get(&key) {
            return Some(queue.clone());
        }
        let consumer = self.consumer.get()?.upgrade()?;
        let queue = Arc::new(consumer.split_partition_queue(topic, partition)?);
        queues.insert(key, queue.clone());
        Some(queue)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
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
                let key = (topic.clone(), partition);
                if !lock(&self.current).contains(&key) {
                    continue;
                }
                lock(&self.lag_series).insert(key);
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

impl InboxContext {
    fn lag_labels(&self, topic: &str, partition: i32) -> PartitionLabels {
        PartitionLabels {
            handler: self.handler.clone(),
            topic: topic.to_owned(),
            partition,
        }
    }
}

impl Drop for InboxContext {
    /// The consumer is gone (its handler paused, deleted or restarted): so
    /// are the lag series of every partition it was ever given.
    fn drop(&mut self) {
        for (topic, partition) in lock(&self.lag_series).iter() {
            self.lag.remove(&self.lag_labels(topic, *partition));
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

    // Runs inside the consumer's poll, before librdkafka starts fetching the
    // assigned partitions: a queue split off now gets every record of its
    // partition (the split outlives later revokes and assigns, librdkafka
    // never forwards an application's queue again).
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Assign(tpl) = rebalance else {
            return;
        };
        let mut assigned = lock(&self.assigned);
        for e in tpl.elements() {
            lock(&self.current).insert((e.topic().to_owned(), e.partition()));
            match self.split(e.topic(), e.partition()) {
                Some(_) => assigned.push((e.topic().to_owned(), e.partition())),
                // Its records then reach the consumer's queue, where the pump
                // finds them and tries the split again.
                None => tracing::error!(
                    handler = %self.handler,
                    topic = e.topic(),
                    partition = e.partition(),
                    "cannot give an assigned partition a queue of its own"
                ),
            }
        }
    }

    // Runs inside the consumer's poll. Batches of a revoked partition may still
    // be in flight: they either commit before the new owner's first commit or
    // are fenced by it (offsets are compare-and-set), never both.
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let list = |tpl: &TopicPartitionList| -> Vec<String> {
            tpl.elements()
                .iter()
                .map(|e| format!("{}/{}", e.topic(), e.partition()))
                .collect()
        };
        match rebalance {
            Rebalance::Assign(tpl) => {
                tracing::info!(handler = %self.handler, partitions = ?list(tpl), "partitions assigned");
            }
            Rebalance::Revoke(tpl) => {
                let mut revoked = lock(&self.revoked);
                let mut assigned = lock(&self.assigned);
                for e in tpl.elements() {
                    let key = (e.topic().to_owned(), e.partition());
                    lock(&self.current).remove(&key);
                    assigned.retain(|k| *k != key);
                    revoked.insert(key);
                    self.stats.forget_partition(e.topic(), e.partition());
                    // The series goes with the partition: a team's topics
                    // come and go with its versions, and the series stayed
                    // for the host's life (the fifteenth read of issue 23's
                    // third round).
                    self.lag.remove(&self.lag_labels(e.topic(), e.partition()));
                }
                tracing::info!(handler = %self.handler, partitions = ?list(tpl), "partitions revoked");
            }
            Rebalance::Error(e) => tracing::warn!(handler = %self.handler, "rebalance error: {e}"),
        }
        self.changed.notify_one();
    }
}

/// How often stored offsets are committed to Kafka, unless
/// `kafka.properties` says otherwise. The database holds the real position,
/// so a lost Kafka commit costs nothing but a stale lag reading.
const KAFKA_COMMIT_INTERVAL_MS: &str = "1000";

/// How often librdkafka reports statistics (consumer lag for `/metrics`).
const STATISTICS_INTERVAL_MS: &str = "5000";

/// What librdkafka prefetches per partition, unless `kafka.properties` says
/// otherwise: far more than the pump buffers (three batches), so a partition
/// is never waiting on a fetch while its buffer has room, and a few MiB per
/// partition of small records.
const PREFETCH_DEFAULTS: &[(&str, &str)] = &[
    ("queued.min.messages", "10000"),
    ("queued.max.messages.kbytes", "8192"),
];

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
    // With a queue per partition these bounds apply to each partition, not
    // to the consumer: librdkafka's defaults (100,000 records or 64 MiB)
    // would let six partitions prefetch up to 384 MiB.
    for (key, value) in PREFETCH_DEFAULTS {
        if !kafka.properties.contains_key(*key) {
            config.set(*key, *value);
        }
    }
    let context = InboxContext {
        handler: handler.to_owned(),
        consumer: OnceLock::new(),
        queues: Mutex::default(),
        assigned: Mutex::default(),
        revoked: Mutex::default(),
        current: Mutex::default(),
        lag_series: Mutex::default(),
        changed: Notify::new(),
        lag,
        stats,
    };
    let consumer: InboxConsumer = config.create_with_context(context)?;
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    rdkafka::consumer::Consumer::subscribe(&consumer, &topics)?;
    Ok(consumer)
}
