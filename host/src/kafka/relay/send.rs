//! Sending one bucket's messages: each through its handler's producer, in
//! order, waiting for each acknowledgement, parking what the broker will
//! never take, and setting aside a handler whose deliveries outlast
//! [`LANE_WAIT`] (see [`super`]'s doc on stragglers).

use super::super::missing_topics::{Quarantined, is_missing_topic, is_quarantined, quarantined_reason};
use crate::db::outbox::Pending;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// How long a bucket's task waits for a handler's deliveries before it sets
/// the rest of them aside to straggle (see the module's doc): far above a
/// broker's usual acknowledgement (milliseconds), far below its timeouts.
pub(crate) const LANE_WAIT: Duration = Duration::from_secs(2);

/// What became of a bucket's messages.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Outcome {
    pub published: Vec<i64>,
    /// The handlers with a message published.
    pub went: HashSet<String>,
    /// Never deliverable: (seq, reason).
    pub parked: Vec<(i64, String)>,
    /// Per handler, its first message that failed for a passing reason; its
    /// later messages in the bucket wait behind it.
    pub failed: Vec<Failed>,
    /// Per handler whose deliveries outlasted [`LANE_WAIT`], the rest of
    /// its messages in the bucket, handed to the producer and not yet
    /// acknowledged, in order.
    pub straggling: Vec<Straggling>,
}

/// A handler's messages still being delivered when its bucket's task gave
/// up waiting for them: they are settled when they are delivered or fail,
/// and the handler's messages are not read meanwhile, so its order holds.
pub(crate) struct Straggling {
    pub handler: String,
    /// What the read counted for them ([`outbox::Pending`]'s bytes).
    pub bytes: u64,
    pub sends: Vec<Queued>,
}

impl std::fmt::Debug for Straggling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Straggling")
            .field("handler", &self.handler)
            .field("seqs", &self.sends.iter().map(|q| q.seq).collect::<Vec<_>>())
            .finish()
    }
}

impl PartialEq for Straggling {
    fn eq(&self, other: &Self) -> bool {
        self.handler == other.handler
            && self
                .sends
                .iter()
                .map(|q| q.seq)
                .eq(other.sends.iter().map(|q| q.seq))
    }
}

/// A message handed to its handler's producer, not yet acknowledged.
pub(crate) struct Queued {
    seq: i64,
    topic: String,
    delivery: DeliveryFuture,
    span: tracing::Span,
}

/// A message that failed for a passing reason.
#[derive(Debug, PartialEq)]
pub(crate) struct Failed {
    pub handler: String,
    pub seq: i64,
    pub error: String,
    /// Its topic, when the broker said the topic does not exist.
    pub missing_topic: Option<String>,
}

/// Whether Kafka will never accept this message, however often it is sent:
/// the message is parked rather than retried. Errors about the broker or the
/// cluster (unavailable, timed out, unknown topic that may yet be created,
/// cluster-wide authorization) pass, or are the operator's to fix for every
/// message at once, so they are retried.
pub(crate) fn permanent(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as Code;
    matches!(
        error.rdkafka_error_code(),
        Some(
            Code::InvalidTopic
                | Code::MessageSizeTooLarge
                | Code::MessageBatchTooLarge
                | Code::InvalidRecord
                | Code::InvalidArgument
                | Code::TopicAuthorizationFailed
                | Code::PolicyViolation
                | Code::UnsupportedForMessageFormat
        )
    )
}
/// Why `topic` can never be a Kafka topic, if it cannot: Kafka's own rule is
/// 1-249 characters of ASCII letters, digits, `.`, `_` and `-`, and not `.`
/// or `..`. Checked before sending: some brokers (and librdkafka's metadata
/// wait) take a whole delivery timeout to say no.
pub(crate) fn invalid_topic(topic: &str) -> Option<String> {
    let legal = !topic.is_empty()
        && topic.len() <= 249
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    (!legal).then(|| {
        format!(
            "{topic:?} is not a valid Kafka topic name (1-249 characters of a-z, A-Z, 0-9, \
             '.', '_' and '-'): fix the handler's outbox_topics mapping, then retry the message"
        )
    })
}

/// The producer of each handler with messages in a bucket, or why it has none.
pub(crate) type Senders = HashMap<String, Result<FutureProducer, String>>;

/// A message handed to the producer, or settled before it was.
enum Sent {
    Queued(DeliveryFuture),
    Parked(String),
    /// The error, and whether it says the topic does not exist.
    Failed(String, bool),
}

/// Sends a bucket's messages and waits for each acknowledgement in order. A
/// message that can never be delivered is parked and the rest go on; at a
/// handler's first passing failure its later messages wait (they stay
/// pending, and are sent again after it), so its order holds, while the
/// other handlers' messages go on. A message its handler sends to a
/// `quarantined` topic is parked without a try. Each message goes through
/// its handler's producer in `senders`.
pub(crate) async fn send_in_order(
    senders: &Senders,
    bucket: &[Pending],
    quarantined: &Quarantined,
) -> Outcome {
    let mut sends = Vec::new();
    // Handlers whose message failed as it was handed to the producer: their
    // later messages are not handed over at all.
    let mut refused: HashSet<&str> = HashSet::new();
    // Stamping ids again reads and copies a payload (up to 64 MiB of them in
    // one bucket's read): the runtime's other tasks get a turn after each
    // MiB (the forty-ninth read).
    let mut stamped = 0usize;
    for row in bucket {
        if refused.contains(row.handler.as_str()) {
            continue;
        }
        if stamped >= 1 << 20 {
            stamped = 0;
            tokio::task::yield_now().await;
        }
        stamped += row.message.payload.len();
        let message = &row.message;
        let unsendable = invalid_topic(&message.topic).or_else(|| {
            is_quarantined(quarantined, &row.handler, &message.topic)
                .then(|| quarantined_reason(&message.topic))
        });
        if let Some(reason) = unsendable {
            sends.push((row, Sent::Parked(reason), tracing::Span::none()));
            continue;
        }
        let producer = match senders.get(&row.handler) {
            Some(Ok(producer)) => producer,
            Some(Err(reason)) => {
                sends.push((row, Sent::Failed(reason.clone(), false), tracing::Span::none()));
                refused.insert(&row.handler);
                continue;
            }
            None => {
                let reason = format!("the relay has no producer for handler {}", row.handler);
                sends.push((row, Sent::Failed(reason, false), tracing::Span::none()));
                refused.insert(&row.handler);
                continue;
            }
        };
        let span = publish_span(row);
        // The id names registered for the topic now, on this host, stamped
        // again (see `capabilities::outbox::restamped`).
        let again = crate::capabilities::outbox::restamped(
            &message.topic,
            &message.id,
            &message.headers,
            &message.payload,
        );
        let (stored_headers, payload) = match &again {
            Some((headers, payload)) => (headers.as_slice(), payload.as_slice()),
            None => (message.headers.as_slice(), message.payload.as_slice()),
        };
        let mut headers = OwnedHeaders::new();
        for (name, value) in stored_headers {
            headers = headers.insert(Header {
                key: name,
                value: Some(value),
            });
        }
        headers = headers.insert(Header {
            key: "event_id",
            value: Some(message.id.as_bytes()),
        });
        let mut record = FutureRecord::to(&message.topic).payload(payload).headers(headers);
        if let Some(key) = &message.key {
            record = record.key(key);
        }
        match producer.send_result(record) {
            Ok(delivery) => sends.push((row, Sent::Queued(delivery), span)),
            Err((error, _)) if permanent(&error) => sends.push((row, Sent::Parked(error.to_string()), span)),
            Err((error, _)) => {
                sends.push((
                    row,
                    Sent::Failed(error.to_string(), is_missing_topic(&error)),
                    span,
                ));
                refused.insert(&row.handler);
            }
        }
    }
    let mut outcome = Outcome::default();
    // Handlers with a failed message: their later ones are not counted,
    // delivered or not (sent again after it: a copy the consumer drops).
    let mut stopped: HashSet<&str> = HashSet::new();
    // Past it, a handler's message not yet acknowledged is set aside with
    // the handler's later ones (see `Straggling`).
    let deadline = tokio::time::Instant::now() + LANE_WAIT;
    for (row, sent, span) in sends {
        if stopped.contains(row.handler.as_str()) {
            continue;
        }
        let bytes = row.message.bytes() as u64;
        let aside = outcome.straggling.iter().position(|s| s.handler == row.handler);
        match sent {
            Sent::Queued(delivery) => {
                let mut queued = Queued {
                    seq: row.seq,
                    topic: row.message.topic.clone(),
                    delivery,
                    span,
                };
                if let Some(at) = aside {
                    // Behind a message set aside: it waits with it.
                    outcome.straggling[at].bytes += bytes;
                    outcome.straggling[at].sends.push(queued);
                    continue;
                }
                match tokio::time::timeout_at(deadline, &mut queued.delivery).await {
                    Ok(result) => {
                        if !delivered(result, &queued, &row.handler, &mut outcome) {
                            stopped.insert(&row.handler);
                        }
                    }
                    Err(_) => outcome.straggling.push(Straggling {
                        handler: row.handler.clone(),
                        bytes,
                        sends: vec![queued],
                    }),
                }
            }
            Sent::Parked(reason) => {
                span.record("outcome", "parked");
                outcome.parked.push((row.seq, reason));
            }
            Sent::Failed(error, missing) => {
                span.record("outcome", "failed");
                stopped.insert(&row.handler);
                outcome.failed.push(Failed {
                    handler: row.handler.clone(),
                    seq: row.seq,
                    error,
                    missing_topic: missing.then(|| row.message.topic.clone()),
                });
            }
        }
    }
    outcome
}

/// Awaits a straggling handler's messages in order, as [`send_in_order`]
/// does, without a deadline (each has the producer's delivery timeout).
pub(super) async fn await_in_order(sends: Vec<Queued>, handler: &str, outcome: &mut Outcome) {
    for mut queued in sends {
        let result = (&mut queued.delivery).await;
        if !delivered(result, &queued, handler, outcome) {
            return;
        }
    }
}

/// Records what became of one message handed to the producer; `false`
/// when it failed for a passing reason, so its handler's later messages
/// are not counted.
fn delivered(
    result: <DeliveryFuture as std::future::Future>::Output,
    queued: &Queued,
    handler: &str,
    outcome: &mut Outcome,
) -> bool {
    let (error, missing) = match result {
        Ok(Ok(_)) => {
            queued.span.record("outcome", "published");
            outcome.published.push(queued.seq);
            if !outcome.went.contains(handler) {
                outcome.went.insert(handler.to_owned());
            }
            return true;
        }
        Ok(Err((error, _))) if permanent(&error) => {
            queued.span.record("outcome", "parked");
            outcome.parked.push((queued.seq, error.to_string()));
            return true;
        }
        Ok(Err((error, _))) => (error.to_string(), is_missing_topic(&error)),
        Err(_) => ("the producer dropped the message".to_owned(), false),
    };
    queued.span.record("outcome", "failed");
    outcome.failed.push(Failed {
        handler: handler.to_owned(),
        seq: queued.seq,
        error,
        missing_topic: missing.then(|| queued.topic.clone()),
    });
    false
}

/// The span of one outbox message's send, linked to the span of the event
/// that published it (its `traceparent`), while spans are exported.
fn publish_span(row: &Pending) -> tracing::Span {
    if !crate::telemetry::tracing_on() {
        return tracing::Span::none();
    }
    let message = &row.message;
    let span = tracing::info_span!(
        target: crate::telemetry::TRACE_TARGET,
        "inboxd.publish",
        topic = message.topic,
        event_id = message.id,
        seq = row.seq,
        outcome = tracing::field::Empty,
    );
    crate::telemetry::link_to(&span, &message.headers);
    span
}
