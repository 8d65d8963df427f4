//! The outbox relay: committed outbox rows to Kafka, at least once, in order
//! per (handler, key).
//!
//! Each host runs one relay. A relay leases buckets of the outbox (a lease it
//! renews every cycle and that runs out if the host dies, so another host picks
//! the bucket up) and sends a bucket's messages in insert order with an
//! idempotent producer, each with its id in the `event_id` header. Rows are
//! marked published only after Kafka acknowledged them: a crash in between
//! sends them again, and the consuming handler's inbox drops the copy.

use crate::config::{KafkaConfig, RetryConfig};
use crate::db::outbox::{self, Pending};
use crate::db::{Database, DbError};
use crate::failpoints;
use crate::pipeline::backoff;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A bucket lease lasts this long unless renewed: how long a dead host's
/// messages wait before another host relays them.
const LEASE_MS: i64 = 10_000;
/// Idle wait between looks at the outbox: the relay's added latency.
const POLL: Duration = Duration::from_millis(100);
/// Messages read and sent per cycle.
const BATCH: i64 = 500;
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
const RETRY: RetryConfig = RetryConfig {
    max_attempts: u32::MAX,
    backoff_initial_ms: 100,
    backoff_max_ms: 5_000,
};

fn producer(kafka: &KafkaConfig) -> rdkafka::error::KafkaResult<FutureProducer> {
    ClientConfig::new()
        .set("bootstrap.servers", &kafka.brokers)
        .set("client.id", "inboxd-relay")
        // No duplicates or reordering from the producer's own retries.
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", DELIVERY_TIMEOUT.as_millis().to_string())
        .create()
}

/// Relays until `shutdown`, then gives its leases up.
pub async fn run_relay(db: Database, kafka: KafkaConfig, owner: String, shutdown: CancellationToken) {
    let producer = match producer(&kafka) {
        Ok(producer) => producer,
        Err(error) => {
            tracing::error!("the outbox relay cannot create its Kafka producer: {error}");
            return;
        }
    };
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        // A cycle may wait on Kafka for a while (an unknown topic, a broker
        // away); shutdown does not wait for it. Anything sent but not yet
        // marked is sent again later, which the consumer's inbox absorbs.
        let cycle = tokio::select! {
            _ = shutdown.cancelled() => break,
            cycle = relay_once(&db, &producer, &owner) => cycle,
        };
        let wait = match cycle {
            Ok(0) => {
                failures = 0;
                POLL
            }
            Ok(_) => {
                failures = 0;
                Duration::ZERO
            }
            Err(error) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!("the outbox relay failed, retrying with backoff: {error}");
                }
                backoff(&RETRY, failures.min(16))
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    if let Err(error) = outbox::release(&db, &owner).await {
        tracing::debug!("releasing the outbox leases failed (they run out by themselves): {error}");
    }
}

/// One cycle: renew leases, send what is pending, mark what Kafka acknowledged.
/// Returns how many messages were published.
async fn relay_once(db: &Database, producer: &FutureProducer, owner: &str) -> Result<usize, DbError> {
    let buckets = outbox::lease(db, owner, LEASE_MS).await?;
    let pending = outbox::pending(db, &buckets, BATCH).await?;
    if pending.is_empty() {
        return Ok(0);
    }
    failpoints::hit("relay-before-publish");
    let mut published = Vec::new();
    for bucket in pending.chunk_by(|a, b| a.bucket == b.bucket) {
        match send_in_order(producer, bucket).await {
            Ok(seqs) => published.extend(seqs),
            Err((seqs, seq, error)) => {
                published.extend(seqs);
                tracing::warn!(
                    seq,
                    "relaying an outbox message failed; its bucket waits for a retry: {error}"
                );
                outbox::record_failure(db, seq, &error).await?;
            }
        }
    }
    failpoints::hit("relay-after-publish");
    outbox::mark_published(db, &published).await?;
    Ok(published.len())
}

/// A message handed to the producer, or refused by it at once (queue full).
enum Sent {
    Queued(DeliveryFuture),
    Refused(String),
}

/// Sends a bucket's messages and waits for each acknowledgement in order; at
/// the first failure the rest wait, so the bucket's order holds. Err carries
/// the seqs acknowledged before the failure, the failed seq and the error.
async fn send_in_order(
    producer: &FutureProducer,
    bucket: &[Pending],
) -> Result<Vec<i64>, (Vec<i64>, i64, String)> {
    let mut sends = Vec::new();
    for row in bucket {
        let message = &row.message;
        let mut headers = OwnedHeaders::new();
        for (name, value) in &message.headers {
            headers = headers.insert(Header {
                key: name,
                value: Some(value),
            });
        }
        headers = headers.insert(Header {
            key: "event_id",
            value: Some(message.id.as_bytes()),
        });
        let mut record = FutureRecord::to(&message.topic)
            .payload(&message.payload)
            .headers(headers);
        if let Some(key) = &message.key {
            record = record.key(key);
        }
        match producer.send_result(record) {
            Ok(delivery) => sends.push((row.seq, Sent::Queued(delivery))),
            Err((error, _)) => {
                sends.push((row.seq, Sent::Refused(error.to_string())));
                break;
            }
        }
    }
    let mut done = Vec::new();
    for (seq, sent) in sends {
        let outcome = match sent {
            Sent::Queued(delivery) => match delivery.await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err((error, _))) => Err(error.to_string()),
                Err(_) => Err("the producer dropped the message".to_owned()),
            },
            Sent::Refused(error) => Err(error),
        };
        match outcome {
            Ok(()) => done.push(seq),
            Err(error) => return Err((done, seq, error)),
        }
    }
    Ok(done)
}
