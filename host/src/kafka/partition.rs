//! One assigned partition's loop: its own queue read into a bounded buffer,
//! micro-batches out one at a time (so its records commit in order), and only
//! after each commit its offset to Kafka.
//!
//! A batch starts when `batch.max_events` records are waiting or the first
//! has waited `batch.linger_ms`; while one is in flight the next fills, so
//! batches grow with the load. A full buffer stops the reading, nothing else:
//! librdkafka keeps what it prefetched and stops fetching at its
//! per-partition bounds, and the other partitions' tasks go on.

use super::consumer::{InboxConsumer, PartitionKey, PartitionQueue};
use super::outage::{Attempt, OutageLog};
use crate::config::{BatchConfig, Ordering as KeyOrdering};
use crate::db::offsets;
use crate::metrics::HostErrorKind;
use crate::pipeline::{BatchCursor, BatchEnd, Pipeline, PipelineError};
use crate::record::{Cut, Record};
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::message::BorrowedMessage;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const SEEK_TIMEOUT: Duration = Duration::from_secs(5);
/// Records buffered per partition, in batches: enough that the next full
/// batch is ready the moment the last one commits, few enough that memory
/// stays bounded when the database is slower than the broker.
const BUFFERED_BATCHES: usize = 3;
/// Records buffered per partition, at least, so one event per transaction
/// still reads ahead like the defaults (3 batches of 100).
const MIN_BUFFERED: usize = 300;

/// Bytes ([`Record::bytes`]) a partition may buffer before its queue is left
/// unread, whatever the count: records are as large as their producers make
/// them (a megabyte, or a megabyte of empty headers held as 24 MB), and 300
/// of them were up to 7 GB per partition. A batch taken from the buffer
/// holds at most as much again.
pub(super) const MAX_BUFFERED_BYTES: usize = 32 << 20;

/// Records a partition may buffer before its queue is left unread.
pub(super) fn max_buffered(batching: &BatchConfig) -> usize {
    (batching.max_events * BUFFERED_BATCHES).max(MIN_BUFFERED)
}

/// What one handler's partition tasks share.
pub(super) struct Shared {
    pub handler: String,
    pub ordering: KeyOrdering,
    /// With key order: a partition's keys in flight, at most.
    pub max_keys_in_flight: usize,
    /// With key order: records the handler may hold behind dead letters.
    pub max_held_records: u64,
    /// With key order: the handler holds `max_held_records`, so its
    /// partitions take no more records (see `kafka::keyed`).
    pub held_full: std::sync::atomic::AtomicBool,
    pub pipeline: Arc<Pipeline>,
    pub consumer: Arc<InboxConsumer>,
    pub batching: BatchConfig,
    pub outage: Arc<OutageLog>,
    pub max_buffered: usize,
    /// Batches in flight across the handler's partitions (a gauge).
    pub in_flight: AtomicUsize,
}

impl Shared {
    pub fn batches_in_flight(&self, change: isize) {
        let now = if change > 0 {
            self.in_flight.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.in_flight.fetch_sub(1, Ordering::Relaxed) - 1
        };
        self.pipeline.stats().batches_in_flight(now);
    }
}

/// Why a partition task stops.
#[derive(Clone)]
pub(super) struct Stops {
    /// The host or the handler stops: the batch in flight commits, and its
    /// offset is stored for the consumer's last commit.
    pub shutdown: CancellationToken,
    /// The partition was revoked (a child of `shutdown`): the batch in flight
    /// ends as it would, but the offset is the new owner's to tell.
    pub revoked: CancellationToken,
}

/// A finished batch: how it ended and the position after what it committed.
pub(super) struct BatchDone {
    pub generation: u64,
    pub end: BatchEnd,
    pub cursor: BatchCursor,
    /// Its records, given back (with key order, those not run are run later).
    pub records: Vec<Record>,
}

/// Where a partition task stands in its partition: the stored next offset,
/// read (and sought to) when its first record comes, and again after a
/// failed seek or a fence. Shared by both orderings' tasks.
pub(super) struct Position {
    pub key: PartitionKey,
    /// Shared with the task before it, if the partition came back (see
    /// `InboxContext::split`): that one reads no more once revoked.
    pub queue: Arc<PartitionQueue>,
    pub shared: Arc<Shared>,
    /// The stored next offset as this task knows it (`None`: no row yet).
    pub next: Option<i64>,
    /// Where to start if the database has no position (see `Pump::stray`).
    floor: Option<i64>,
    /// The position was just read: the next record is checked against it.
    fresh: bool,
    /// Bumped when the position is re-read, so work launched before that
    /// cannot overwrite the fresh position.
    pub generation: u64,
}

/// What a task does with a record it read.
pub(super) enum Admit {
    /// The task stops (revoked or shut down before the position was read).
    Stop,
    /// Buffer it; `clear`: first forget what was buffered (the position was re-read).
    Keep { clear: bool },
    /// Drop it (below the position, or fetched before a seek); `clear` as above.
    Skip { clear: bool },
}

impl Position {
    pub fn new(
        key: PartitionKey,
        queue: Arc<PartitionQueue>,
        floor: Option<i64>,
        shared: Arc<Shared>,
    ) -> Self {
        Self {
            key,
            queue,
            shared,
            next: None,
            floor,
            fresh: true,
            generation: 0,
        }
    }

    /// Checks a record against the position, first reading the stored
    /// position (and seeking there) if the partition was just assigned or
    /// a seek failed.
    pub async fn admit(&mut self, record: &Record, stop: &CancellationToken) -> Admit {
        self.shared.pipeline.stats().consumed();
        let mut clear = false;
        if self.fresh {
            // Revoked while it read: a task that lost its partition must not seek it.
            if !self.reload(stop).await || stop.is_cancelled() {
                return Admit::Stop;
            }
            clear = true;
            self.fresh = false;
            if let Some(next) = self.next.or(self.floor)
                && record.offset != next
            {
                // Kafka's committed offset lags the database after a crash
                // between the two commits, or leads it if the database was
                // restored: the database wins either way.
                tracing::info!(
                    handler = self.shared.handler,
                    topic = record.topic,
                    partition = record.partition,
                    broker_offset = record.offset,
                    database_offset = next,
                    "seeking to the offset stored in the database"
                );
                if !self.seek(next) || record.offset > next {
                    return Admit::Skip { clear };
                }
            }
        }
        if self.next.or(self.floor).is_some_and(|next| record.offset < next) {
            return Admit::Skip { clear };
        }
        Admit::Keep { clear }
    }

    /// Re-reads the stored position. `false`: the task stops first.
    pub async fn reload(&mut self, stop: &CancellationToken) -> bool {
        let shared = self.shared.clone();
        let key = &self.key;
        let stored = shared
            .outage
            .retry("reading the stored offset", stop, || async {
                offsets::load(shared.pipeline.db(), &shared.handler, &key.0, key.1)
                    .await
                    .map_err(PipelineError::from)
            })
            .await;
        let Some(stored) = stored else {
            return false;
        };
        self.generation += 1;
        self.next = stored;
        true
    }

    /// Seeks the partition; on failure the position is re-read (and the seek
    /// tried again) at its next record, so nothing is processed past a gap.
    /// A task that lost its partition must not seek it.
    pub fn seek(&mut self, next: i64) -> bool {
        let (topic, partition) = (&self.key.0, self.key.1);
        match self
            .shared
            .consumer
            .seek(topic, partition, Offset::Offset(next), SEEK_TIMEOUT)
        {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(
                    handler = self.shared.handler,
                    topic,
                    partition,
                    "seek failed ({error}); retrying it on the next record"
                );
                self.fresh = true;
                false
            }
        }
    }

    /// Logs an error the partition's queue gave instead of a record.
    pub async fn consumer_error(&self, error: &rdkafka::error::KafkaError) {
        tracing::warn!(
            handler = self.shared.handler,
            topic = self.key.0,
            partition = self.key.1,
            "kafka consumer error: {error}"
        );
        // librdkafka reconnects by itself; this only keeps a persistent
        // error from flooding the log.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    /// Tells Kafka the partition's next offset, after the database has it.
    pub fn store(&self, next: i64) {
        if let Err(error) = store_next_offset(&self.shared.consumer, &self.key, next) {
            tracing::debug!(
                handler = self.shared.handler,
                "storing the Kafka offset failed (partition revoked?): {error}"
            );
        }
    }
}

pub(super) struct PartitionTask {
    at: Position,
    buffer: Vec<Record>,
    /// The buffer's [`Record::bytes`].
    buffered_bytes: usize,
    /// When the oldest buffered record arrived: the linger clock.
    since: Option<Instant>,
    batch: Option<JoinHandle<BatchDone>>,
}

impl PartitionTask {
    pub fn new(at: Position) -> Self {
        Self {
            at,
            buffer: Vec::new(),
            buffered_bytes: 0,
            since: None,
            batch: None,
        }
    }

    pub async fn run(mut self, stops: Stops) {
        let linger = Duration::from_millis(self.at.shared.batching.linger_ms);
        loop {
            if stops.revoked.is_cancelled() {
                break;
            }
            self.launch_if_due(linger, &stops.shutdown);
            let wake = match (&self.batch, self.since) {
                (None, Some(since)) => Some(since + linger),
                _ => None,
            };
            let room =
                self.buffer.len() < self.at.shared.max_buffered && self.buffered_bytes < MAX_BUFFERED_BYTES;
            tokio::select! {
                biased;
                _ = stops.revoked.cancelled() => break,
                done = wait(&mut self.batch), if self.batch.is_some() => {
                    self.batch = None;
                    self.at.shared.batches_in_flight(-1);
                    if !self.batch_done(done, &stops.revoked).await {
                        break;
                    }
                }
                _ = sleep_until(wake), if wake.is_some() => {}
                message = self.at.queue.recv(), if room => match message {
                    Ok(message) => {
                        let record = to_record(&message, self.at.shared.pipeline.kept_bytes());
                        drop(message);
                        if !self.accept(record, &stops.revoked).await {
                            break;
                        }
                        // A queue that always has a record never makes this
                        // task wait: yield when its share of the worker is used.
                        tokio::task::consume_budget().await;
                    }
                    Err(error) => self.at.consumer_error(&error).await,
                },
            }
        }
        // The batch in flight ends its transaction first: committed or rolled back.
        if self.batch.is_some() {
            let done = wait(&mut self.batch).await;
            self.batch = None;
            self.at.shared.batches_in_flight(-1);
            if !stops.revoked.is_cancelled() || stops.shutdown.is_cancelled() {
                self.record_progress(&done);
            }
        }
    }

    /// Buffers a record if the position says so. `false`: the task stops
    /// (`stop`: revoked or shutdown) before the position was read.
    async fn accept(&mut self, record: Record, stop: &CancellationToken) -> bool {
        let (keep, clear) = match self.at.admit(&record, stop).await {
            Admit::Stop => return false,
            Admit::Keep { clear } => (true, clear),
            Admit::Skip { clear } => (false, clear),
        };
        if clear {
            self.forget();
        }
        if keep {
            if self.buffer.is_empty() {
                self.since = Some(Instant::now());
            }
            self.buffered_bytes += record.bytes();
            self.buffer.push(record);
        }
        true
    }

    /// Forgets what was buffered: the position was re-read.
    fn forget(&mut self) {
        self.buffer.clear();
        self.buffered_bytes = 0;
        self.since = None;
    }

    /// Starts a batch if none is in flight and the buffered records are due.
    fn launch_if_due(&mut self, linger: Duration, shutdown: &CancellationToken) {
        let max = self.at.shared.batching.max_events;
        let due = self.buffer.len() >= max || self.since.is_some_and(|s| s.elapsed() >= linger);
        if self.batch.is_some() || self.buffer.is_empty() || !due {
            return;
        }
        let take = self.buffer.len().min(max);
        let records: Vec<Record> = self.buffer.drain(..take).collect();
        self.buffered_bytes -= records.iter().map(Record::bytes).sum::<usize>();
        // The rest waited since before this batch started: launch it as soon
        // as this one is done, if it is due by then.
        self.since = if self.buffer.is_empty() { None } else { self.since };
        let task = BatchTask {
            generation: self.at.generation,
            cursor: BatchCursor::new(self.at.next),
            // A batch runs on the version current when it starts, to its end.
            pipeline: Arc::new(self.at.shared.pipeline.pinned()),
            outage: self.at.shared.outage.clone(),
        };
        self.at.shared.batches_in_flight(1);
        self.batch = Some(tokio::spawn(task.run(records, shutdown.clone())));
    }

    /// Takes a finished batch's position; a fenced one re-reads the partition
    /// and seeks back to where the database says it stands. `false`: the
    /// task stops (`stop`: revoked or shutdown).
    async fn batch_done(&mut self, done: BatchDone, stop: &CancellationToken) -> bool {
        self.record_progress(&done);
        if done.end == BatchEnd::Fenced && done.generation == self.at.generation {
            if !self.at.reload(stop).await || stop.is_cancelled() {
                return false;
            }
            self.forget();
            if let Some(next) = self.at.next {
                self.at.seek(next);
            }
        }
        true
    }

    /// Moves the position past a batch's committed records and tells Kafka,
    /// unless the position was re-read since the batch began.
    fn record_progress(&mut self, done: &BatchDone) {
        if done.cursor.done == 0 || done.generation != self.at.generation {
            return;
        }
        self.at.next = done.cursor.next_offset();
        if let Some(next) = done.cursor.next_offset() {
            // Only now, after the database commit, may Kafka hear about it.
            self.at.store(next);
        }
    }
}

/// The batch in flight's result (never, if there is none). A panic in it is
/// the host's bug: it goes on up to the pump, which stops.
async fn wait(batch: &mut Option<JoinHandle<BatchDone>>) -> BatchDone {
    let Some(handle) = batch else {
        return std::future::pending().await;
    };
    match handle.await {
        Ok(done) => done,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        // Only the runtime's own teardown cancels a task.
        Err(error) => panic!("a batch task was cancelled: {error}"),
    }
}

/// One batch's run on its own task, retrying the host's own failures; the
/// cursor makes a retry resume after what already committed.
pub(super) struct BatchTask {
    pub generation: u64,
    pub cursor: BatchCursor,
    pub pipeline: Arc<Pipeline>,
    pub outage: Arc<OutageLog>,
}

impl BatchTask {
    pub async fn run(mut self, records: Vec<Record>, shutdown: CancellationToken) -> BatchDone {
        let mut attempt = Attempt::new(&self.outage);
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
                    // A permanent one was counted where it parks its event
                    // (`Pipeline::process`); it only reaches here when even
                    // that was refused.
                    if error.is_transient() {
                        self.pipeline.stats().host_error(HostErrorKind::Transient);
                    }
                    if !attempt.failed("processing records", &error, &shutdown).await {
                        break None;
                    }
                }
            }
        };
        drop(attempt);
        self.pipeline.stats().batch_took(started.elapsed());
        BatchDone {
            generation: self.generation,
            end: end.unwrap_or(BatchEnd::Done),
            cursor: self.cursor,
            records,
        }
    }
}

pub(super) async fn sleep_until(wake: Option<Instant>) {
    if let Some(wake) = wake {
        tokio::time::sleep_until(wake.into()).await;
    }
}

/// The record of `message` as the pipeline sees it, keeping at most `keep`
/// bytes of payload, of headers and of key: a record past them is cut (see
/// [`Cut`]), never copied whole (librdkafka holds a compressed batch's
/// records decompressed, as large as a producer made them).
pub(super) fn to_record(message: &BorrowedMessage<'_>, keep: usize) -> Record {
    // Not rdkafka's header reader, which panics on a name that is not UTF-8.
    let (headers, headers_bytes) = super::headers::headers_of(message, keep);
    let payload = message.payload().unwrap_or_default();
    let key = message.key();
    let key_bytes = key.map_or(0, <[u8]>::len);
    let cut = (payload.len() > keep || headers_bytes > keep || key_bytes > keep).then_some(Cut {
        payload_bytes: payload.len(),
        headers_bytes,
        key_bytes,
        kept: keep,
    });
    Record {
        topic: message.topic().to_owned(),
        partition: message.partition(),
        offset: message.offset(),
        key: key.filter(|key| key.len() <= keep).map(<[u8]>::to_vec),
        payload: payload[..payload.len().min(keep)].to_vec(),
        headers,
        timestamp_ms: message.timestamp().to_millis(),
        cut,
    }
}

/// Stores the partition's next offset for the next Kafka commit. The list form
/// is used because it takes the next offset as is; the single-partition
/// `store_offset` adds one to what it is given (it wants the last processed offset).
fn store_next_offset(
    consumer: &InboxConsumer,
    key: &PartitionKey,
    next: i64,
) -> rdkafka::error::KafkaResult<()> {
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
