//! The consume loop for one handler: records in partition order through the
//! pipeline, then (and only then) their offsets to Kafka.
//!
//! Shutdown is checked between records: the record in flight finishes and
//! commits, or (if it is waiting to retry) is abandoned uncommitted and will be
//! redelivered; either way nothing is half-applied. The host's own database
//! errors are retried here with backoff, with one log line per outage.

use super::consumer::InboxConsumer;
use crate::config::RetryConfig;
use crate::db::offsets;
use crate::pipeline::{Outcome, Pipeline, PipelineError, backoff};
use crate::record::Record;
use rdkafka::Message;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often stored offsets are committed to Kafka (for lag tools only; the
/// database holds the real position, so a lost Kafka commit costs nothing).
const KAFKA_COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// Backoff for the host's own retries (database outages, broker errors).
const HOST_RETRY: RetryConfig = RetryConfig {
    max_attempts: u32::MAX,
    backoff_initial_ms: 100,
    backoff_max_ms: 5_000,
};
const SEEK_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Retries a host-side database step until it succeeds or shutdown begins,
/// logging the start and the end of an outage once each.
async fn with_db_retry<T, F, Fut>(what: &str, shutdown: &CancellationToken, mut step: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, PipelineError>>,
{
    let mut failures = 0u32;
    let mut since = Instant::now();
    loop {
        match step().await {
            Ok(value) => {
                if failures > 0 {
                    tracing::info!(
                        failures,
                        outage_ms = since.elapsed().as_millis() as u64,
                        "database is back; resumed {what}"
                    );
                }
                return Some(value);
            }
            Err(PipelineError::Abandoned) => return None,
            Err(error) => {
                if failures == 0 {
                    since = Instant::now();
                    tracing::warn!("{what} failed, retrying with backoff until it succeeds: {error}");
                }
                failures += 1;
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(backoff(&HOST_RETRY, failures.min(16))) => {}
                }
            }
        }
    }
}

/// Consumes until `shutdown` is cancelled, then commits to Kafka and leaves the group.
pub async fn run_pump(consumer: InboxConsumer, pipeline: Pipeline, shutdown: CancellationToken) {
    let handler = pipeline.handler_name().to_owned();
    // Next offset per partition as known to this pump: records below it were
    // already applied (the database said so) and are skipped without a transaction.
    let mut positions: HashMap<(String, i32), i64> = HashMap::new();
    let mut last_kafka_commit = Instant::now();
    let mut uncommitted = false;
    loop {
        let message = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            message = consumer.recv() => message,
        };
        let record = match message {
            Ok(message) => to_record(&message),
            Err(error) => {
                tracing::warn!(handler, "kafka consumer error: {error}");
                // librdkafka reconnects by itself; this only keeps a persistent
                // error from flooding the log.
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let key = (record.topic.clone(), record.partition);
        if consumer.context().take_fresh(&record.topic, record.partition) {
            positions.remove(&key);
            let stored = with_db_retry("reading the stored offset", &shutdown, || async {
                offsets::load(pipeline.db(), &handler, &record.topic, record.partition)
                    .await
                    .map_err(PipelineError::from)
            })
            .await;
            let Some(stored) = stored else { break };
            if let Some(next) = stored {
                positions.insert(key.clone(), next);
                if record.offset != next {
                    // Kafka's committed offset lags the database after a crash
                    // between the two commits, or leads it if the database was
                    // restored: the database wins either way.
                    tracing::info!(
                        handler,
                        topic = record.topic,
                        partition = record.partition,
                        broker_offset = record.offset,
                        database_offset = next,
                        "seeking to the offset stored in the database"
                    );
                    if let Err(error) = consumer.seek(
                        &record.topic,
                        record.partition,
                        Offset::Offset(next),
                        SEEK_TIMEOUT,
                    ) {
                        // Never process past a gap: try the seek again on the next record.
                        tracing::warn!(handler, "seek failed ({error}); retrying it on the next record");
                        positions.remove(&key);
                        consumer.context().mark_fresh(&record.topic, record.partition);
                        continue;
                    }
                    if record.offset > next {
                        continue;
                    }
                }
            }
        }
        if positions.get(&key).is_some_and(|&next| record.offset < next) {
            continue;
        }
        let expected = positions.get(&key).copied();
        let outcome = with_db_retry("processing a record", &shutdown, || {
            pipeline.process(&record, expected, &shutdown)
        })
        .await;
        match outcome {
            None => break,
            Some(Outcome::Fenced) => {
                // Someone else owns (or owned) this partition's position: drop
                // ours and re-read it from the database on the next record.
                positions.remove(&key);
                consumer.context().mark_fresh(&record.topic, record.partition);
                continue;
            }
            Some(_) => {}
        }
        positions.insert(key, record.offset + 1);
        // Only now, after the database commit, may Kafka hear about it.
        if let Err(error) = store_next_offset(&consumer, &record) {
            tracing::debug!(
                handler,
                "storing the Kafka offset failed (partition revoked?): {error}"
            );
        }
        uncommitted = true;
        if last_kafka_commit.elapsed() >= KAFKA_COMMIT_INTERVAL {
            commit_to_kafka(&consumer, CommitMode::Async, &handler);
            last_kafka_commit = Instant::now();
            uncommitted = false;
        }
    }
    if uncommitted {
        commit_to_kafka(&consumer, CommitMode::Sync, &handler);
    }
    consumer.unsubscribe();
    tracing::info!(handler, "consumer stopped and left its group");
}

/// Stores the partition's next offset for the next Kafka commit. The list form
/// is used because it takes the next offset as is; the single-partition
/// `store_offset` adds one to what it is given (it wants the last processed offset).
fn store_next_offset(consumer: &InboxConsumer, record: &Record) -> rdkafka::error::KafkaResult<()> {
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(&record.topic, record.partition, Offset::Offset(record.offset + 1))?;
    consumer.store_offsets(&list)
}

fn commit_to_kafka(consumer: &InboxConsumer, mode: CommitMode, handler: &str) {
    if let Err(error) = consumer.commit_consumer_state(mode) {
        // Harmless: the database holds the real position.
        tracing::debug!(handler, "committing offsets to Kafka failed: {error}");
    }
}
