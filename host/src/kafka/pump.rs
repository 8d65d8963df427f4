//! The consume loop of one handler: records in, micro-batches out, and (only
//! after their commit) offsets to Kafka.
//!
//! One task reads the handler's consumer and sorts records into a buffer per
//! partition. A partition has at most one batch in flight, so its records
//! commit in order; different partitions' batches run in parallel, each on a
//! connection of its own. Flow control is per partition: a partition whose
//! buffer is full is paused at the consumer while the others keep flowing
//! (librdkafka hands over long runs of one partition, so stopping all reads
//! for one full buffer would leave the others idle on a backlog). A batch starts when `batch.max_events` records are
//! waiting or the first has waited `batch.linger_ms`; while one is in flight
//! the next fills, so batches grow with the load.
//!
//! Shutdown: batches in flight finish their transaction (one waiting to retry
//! a failed handler is abandoned uncommitted) and buffered records are
//! dropped; all of them are redelivered. Nothing is ever half-applied.

use super::consumer::InboxConsumer;
use super::outage::OutageLog;
use crate::config::BatchConfig;
use crate::db::offsets;
use crate::pipeline::{BatchCursor, BatchEnd, Pipeline, PipelineError};
use crate::record::Record;
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

const SEEK_TIMEOUT: Duration = Duration::from_secs(5);
/// Records buffered per partition, in batches: enough that the next full
/// batch is ready the moment the last one commits, few enough that memory
/// stays bounded when the database is slower than the broker.
const BUFFERED_BATCHES: usize = 3;
/// Records buffered per partition, at least. Pausing drops what librdkafka
/// had fetched for the partition and resuming fetches it again, so a buffer
/// of a few records (three, with `batch.max_events = 1`) paused and resumed
/// the partition every few records: one event per transaction ran at 221/s
/// on both backends (`inboxd-bench --modes b`, issue 15's note). This is the
/// default configuration's buffer (3 batches of 100), the same memory bound.
const MIN_BUFFERED: usize = 300;

/// Records a partition may buffer before it is paused.
fn max_buffered(batching: &BatchConfig) -> usize {
    (batching.max_events * BUFFERED_BATCHES).max(MIN_BUFFERED)
}

type Key = (String, i32);

/// What the pump knows of one assigned partition.
#[derive(Default)]
struct Partition {
    /// The stored next offset as this pump knows it (`None`: no row yet).
    next: Option<i64>,
    buffer: Vec<Record>,
    /// When the oldest buffered record arrived: the linger clock.
    since: Option<Instant>,
    /// The generation of the batch in flight, if one is.
    in_flight: Option<u64>,
    /// Bumped when the partition is re-read from the database, so a batch
    /// launched before that cannot overwrite the fresh position.
    generation: u64,
}

/// A batch task's report. A batch abandoned for shutdown reports `Done`
/// with the cursor of what it committed before.
struct BatchDone {
    key: Key,
    generation: u64,
    end: BatchEnd,
    cursor: BatchCursor,
}

/// Consumes until `shutdown` is cancelled, then commits to Kafka and leaves the group.
pub async fn run_pump(
    consumer: InboxConsumer,
    pipeline: Pipeline,
    batching: BatchConfig,
    shutdown: CancellationToken,
) {
    let max_buffered = max_buffered(&batching);
    let mut pump = Pump {
        handler: pipeline.handler_name().to_owned(),
        pipeline: Arc::new(pipeline),
        consumer,
        batching,
        outage: Arc::new(OutageLog::default()),
        max_buffered,
        partitions: HashMap::new(),
        paused: HashSet::new(),
        batches: JoinSet::new(),
        generations: 0,
    };
    pump.run(&shutdown).await;
}

struct Pump {
    handler: String,
    pipeline: Arc<Pipeline>,
    consumer: InboxConsumer,
    batching: BatchConfig,
    outage: Arc<OutageLog>,
    /// Records a partition may buffer before it is paused.
    max_buffered: usize,
    partitions: HashMap<Key, Partition>,
    /// Partitions paused at the consumer because their buffer is full.
    paused: HashSet<Key>,
    batches: JoinSet<BatchDone>,
    generations: u64,
}

impl Pump {
    async fn run(&mut self, shutdown: &CancellationToken) {
        let linger = Duration::from_millis(self.batching.linger_ms);
        loop {
            for key in self.consumer.context().take_revoked() {
                self.partitions.remove(&key);
                // An application's pause outlives a revoke in librdkafka: a
                // partition assigned again must not come back paused.
                self.flow(&key);
            }
            self.launch_ready(linger, shutdown);
            let wake = self
                .partitions
                .values()
                .filter(|p| p.in_flight.is_none())
                .filter_map(|p| p.since)
                .min()
                .map(|since| since + linger);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(joined) = self.batches.join_next(), if !self.batches.is_empty() => match joined {
                    Ok(done) => {
                        if !self.batch_done(done, shutdown).await {
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::error!(handler = self.handler, "a batch task panicked: {error}");
                        shutdown.cancel();
                        break;
                    }
                },
                _ = sleep_until(wake), if wake.is_some() => {}
                message = self.consumer.recv() => match message {
                    Ok(message) => {
                        let record = to_record(&message);
                        drop(message);
                        if !self.accept(record, shutdown).await {
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(handler = self.handler, "kafka consumer error: {error}");
                        // librdkafka reconnects by itself; this only keeps a
                        // persistent error from flooding the log.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                },
            }
        }
        // Batches in flight end their transaction first: committed or rolled back.
        while let Some(joined) = self.batches.join_next().await {
            if let Ok(done) = joined {
                self.record_progress(&done);
            }
        }
        // Leaving the group commits the offsets stored so far (auto commit,
        // see `create_consumer`), the last batches' included.
        self.consumer.unsubscribe();
        tracing::info!(handler = self.handler, "consumer stopped and left its group");
    }

    /// Buffers a record for its partition, first reading the partition's
    /// stored position (and seeking there) if it was just assigned.
    /// `false`: shutdown came first.
    async fn accept(&mut self, record: Record, shutdown: &CancellationToken) -> bool {
        self.pipeline.stats().consumed();
        let key = (record.topic.clone(), record.partition);
        if self
            .consumer
            .context()
            .take_fresh(&record.topic, record.partition)
        {
            let Some(stored) = self.load_position(&key, shutdown).await else {
                return false;
            };
            if let Some(next) = stored
                && record.offset != next
            {
                // Kafka's committed offset lags the database after a crash
                // between the two commits, or leads it if the database was
                // restored: the database wins either way.
                tracing::info!(
                    handler = self.handler,
                    topic = record.topic,
                    partition = record.partition,
                    broker_offset = record.offset,
                    database_offset = next,
                    "seeking to the offset stored in the database"
                );
                if !self.seek(&key, next) || record.offset > next {
                    return true;
                }
            }
        }
        let partition = self.partitions.entry(key.clone()).or_default();
        if partition.next.is_some_and(|next| record.offset < next) {
            return true;
        }
        if partition.buffer.is_empty() {
            partition.since = Some(Instant::now());
        }
        partition.buffer.push(record);
        self.flow(&key);
        true
    }

    /// Pauses a partition at the consumer while its buffer is full and
    /// resumes it once it is not (or is gone). librdkafka stops fetching a
    /// paused partition and drops what it had fetched for it; on resume it
    /// fetches again from the record after the last one handed over, so
    /// nothing is skipped.
    fn flow(&mut self, key: &Key) {
        let full = self
            .partitions
            .get(key)
            .is_some_and(|p| p.buffer.len() >= self.max_buffered);
        if full == self.paused.contains(key) {
            return;
        }
        let mut list = TopicPartitionList::new();
        list.add_partition(&key.0, key.1);
        let result = if full {
            self.consumer.pause(&list)
        } else {
            self.consumer.resume(&list)
        };
        if let Err(error) = &result {
            tracing::warn!(
                handler = self.handler,
                topic = key.0,
                partition = key.1,
                paused = full,
                "pausing or resuming a partition failed: {error}"
            );
        }
        // A failed pause is tried again at the next record; a failed resume
        // is not retried (a partition not assigned any more cannot be resumed).
        if full && result.is_ok() {
            self.paused.insert(key.clone());
        } else if !full {
            self.paused.remove(key);
        }
    }

    /// Re-reads a partition's stored position and forgets what was buffered.
    async fn load_position(&mut self, key: &Key, shutdown: &CancellationToken) -> Option<Option<i64>> {
        let stored = self
            .outage
            .retry("reading the stored offset", shutdown, || async {
                offsets::load(self.pipeline.db(), &self.handler, &key.0, key.1)
                    .await
                    .map_err(PipelineError::from)
            })
            .await?;
        self.generations += 1;
        let partition = self.partitions.entry(key.clone()).or_default();
        partition.next = stored;
        partition.buffer.clear();
        partition.since = None;
        partition.generation = self.generations;
        self.flow(key);
        Some(stored)
    }

    /// Seeks the consumer; on failure the partition is re-read (and the seek
    /// tried again) at its next record, so nothing is ever processed past a gap.
    fn seek(&mut self, key: &Key, next: i64) -> bool {
        match self
            .consumer
            .seek(&key.0, key.1, Offset::Offset(next), SEEK_TIMEOUT)
        {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(
                    handler = self.handler,
                    "seek failed ({error}); retrying it on the next record"
                );
                self.partitions.remove(key);
                self.flow(key);
                self.consumer.context().mark_fresh(&key.0, key.1);
                false
            }
        }
    }

    /// Starts a batch for every idle partition whose records are due.
    fn launch_ready(&mut self, linger: Duration, shutdown: &CancellationToken) {
        let max = self.batching.max_events;
        let mut drained = Vec::new();
        for (key, partition) in &mut self.partitions {
            let due = partition.buffer.len() >= max || partition.since.is_some_and(|s| s.elapsed() >= linger);
            if partition.in_flight.is_some() || partition.buffer.is_empty() || !due {
                continue;
            }
            let take = partition.buffer.len().min(max);
            let records: Vec<Record> = partition.buffer.drain(..take).collect();
            if partition.buffer.is_empty() {
                partition.since = None;
            }
            partition.in_flight = Some(partition.generation);
            let task = BatchTask {
                key: key.clone(),
                generation: partition.generation,
                cursor: BatchCursor::new(partition.next),
                // A batch runs on the version current when it starts, to its end.
                pipeline: Arc::new(self.pipeline.pinned()),
                outage: self.outage.clone(),
            };
            self.batches.spawn(task.run(records, shutdown.clone()));
            drained.push(key.clone());
        }
        for key in drained {
            self.flow(&key);
        }
        self.pipeline.stats().batches_in_flight(self.batches.len());
    }

    /// Takes a finished batch's position; a fenced one re-reads the partition
    /// and seeks back to where the database says it stands. `false`: shutdown.
    async fn batch_done(&mut self, done: BatchDone, shutdown: &CancellationToken) -> bool {
        self.record_progress(&done);
        let current = self.partitions.get(&done.key).map(|p| p.generation);
        if done.end == BatchEnd::Fenced && current == Some(done.generation) {
            let Some(stored) = self.load_position(&done.key, shutdown).await else {
                return false;
            };
            if let Some(next) = stored {
                self.seek(&done.key, next);
            }
        }
        true
    }

    /// Moves a partition's position past a batch's committed records and
    /// tells Kafka, unless the partition was re-read since the batch began.
    fn record_progress(&mut self, done: &BatchDone) {
        let Some(partition) = self.partitions.get_mut(&done.key) else {
            return;
        };
        if partition.in_flight == Some(done.generation) {
            partition.in_flight = None;
        }
        if done.cursor.done == 0 || partition.generation != done.generation {
            return;
        }
        partition.next = done.cursor.expected;
        if let Some(next) = done.cursor.expected {
            // Only now, after the database commit, may Kafka hear about it.
            if let Err(error) = store_next_offset(&self.consumer, &done.key, next) {
                tracing::debug!(
                    handler = self.handler,
                    "storing the Kafka offset failed (partition revoked?): {error}"
                );
            }
        }
    }
}

/// One batch's run on its own task, retrying the host's own failures; the
/// cursor makes a retry resume after what already committed.
struct BatchTask {
    key: Key,
    generation: u64,
    cursor: BatchCursor,
    pipeline: Arc<Pipeline>,
    outage: Arc<OutageLog>,
}

impl BatchTask {
    async fn run(mut self, records: Vec<Record>, shutdown: CancellationToken) -> BatchDone {
        let mut attempt = super::outage::Attempt::new(&self.outage);
        let started = Instant::now();
        let end = loop {
            match self
                .pipeline
                .process_batch(&records, &mut self.cursor, &shutdown)
                .await
            {
                Ok(end) => {
                    attempt.succeeded("processing records");
                    break Some(end);
                }
                Err(PipelineError::Abandoned) => break None,
                Err(error) => {
                    if !attempt.failed("processing records", &error, &shutdown).await {
                        break None;
                    }
                }
            }
        };
        drop(attempt);
        self.pipeline.stats().batch_took(started.elapsed());
        BatchDone {
            key: self.key,
            generation: self.generation,
            end: end.unwrap_or(BatchEnd::Done),
            cursor: self.cursor,
        }
    }
}

async fn sleep_until(wake: Option<Instant>) {
    if let Some(wake) = wake {
        tokio::time::sleep_until(wake.into()).await;
    }
}

fn to_record(message: &BorrowedMessage<'_>) -> Record {
    let headers = message
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec).unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    Record {
        topic: message.topic().to_owned(),
        partition: message.partition(),
        offset: message.offset(),
        key: message.key().map(<[u8]>::to_vec),
        payload: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
        headers,
        timestamp_ms: message.timestamp().to_millis(),
    }
}

/// Stores the partition's next offset for the next Kafka commit. The list form
/// is used because it takes the next offset as is; the single-partition
/// `store_offset` adds one to what it is given (it wants the last processed offset).
fn store_next_offset(consumer: &InboxConsumer, key: &Key, next: i64) -> rdkafka::error::KafkaResult<()> {
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(&key.0, key.1, Offset::Offset(next))?;
    consumer.store_offsets(&list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partitions_buffer_holds_three_batches_and_never_fewer_than_the_defaults() {
        let batching = |max_events| BatchConfig {
            max_events,
            linger_ms: 0,
        };
        assert_eq!(max_buffered(&BatchConfig::default()), 300);
        assert_eq!(max_buffered(&batching(500)), 1500);
        // One event per transaction still reads ahead like the default.
        assert_eq!(max_buffered(&batching(1)), 300);
    }
}
