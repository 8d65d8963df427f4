//! The relay's Kafka producers: one idempotent producer per handler.
//!
//! Why not one for the whole relay: an idempotent producer's state is shared
//! by everything it sends. When the broker refuses a message for good (over
//! the topic's `max.message.bytes`, no key on a compacted topic, a policy or
//! an authorization failure), librdkafka drains every partition in flight and
//! bumps the producer's epoch before it sends anything more; the messages
//! that shared the refused one's batch fail with `_INVALID_DIFFERENT_RECORD`;
//! and a fatal error (`rd_kafka_fatal_error`) stops the producer for good. On
//! one shared producer, each of those is one team's message pausing, failing
//! or ending every team's relay (the forty-seventh read of issue 23). With a
//! producer per handler, a handler's messages only ever share a producer,
//! and a batch, with its own: what it sends wrong costs only itself.
//!
//! A producer is made when its handler first has a message to send, made
//! anew when it reports a fatal error, and closed when its handler sent
//! nothing for [`IDLE`]. Each costs librdkafka's threads (one, plus one per
//! broker it talks to) while it lives. Its `client.id` names the handler, so
//! broker-side quotas and logs can tell the teams apart.

use crate::config::KafkaConfig;
use rdkafka::ClientConfig;
use rdkafka::error::KafkaResult;
use rdkafka::producer::{FutureProducer, Producer};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a handler's producer lives without sending before it is closed:
/// long enough that a handler publishing every few minutes keeps its
/// producer (and its connections), short enough that handlers that are gone
/// or quiet hold no threads.
pub(crate) const IDLE: Duration = Duration::from_secs(300);

/// Makes a handler's producer.
pub(crate) type MakeProducer = Box<dyn Fn(&str) -> KafkaResult<FutureProducer> + Send + Sync>;

/// An idempotent producer for `handler` on `kafka`'s brokers.
pub(crate) fn for_handler(
    kafka: &KafkaConfig,
    handler: &str,
    timeout: Duration,
) -> KafkaResult<FutureProducer> {
    ClientConfig::new()
        .set("bootstrap.servers", &kafka.brokers)
        .set("client.id", format!("inboxd-relay-{handler}"))
        // No duplicates or reordering from the producer's own retries.
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", timeout.as_millis().to_string())
        // What one handler's producer may hold unacknowledged: a read gives
        // a handler at most the relay's 64 MiB, and straggling messages stay
        // in its queue (librdkafka's default is 1 GiB per producer).
        .set("queue.buffering.max.kbytes", "65536")
        .create()
}

/// The live producers, by handler.
pub(crate) struct Producers {
    make: MakeProducer,
    live: HashMap<String, (FutureProducer, Instant)>,
}

impl Producers {
    pub(crate) fn new(make: MakeProducer) -> Self {
        Self {
            make,
            live: HashMap::new(),
        }
    }

    /// `handler`'s producer, made if it has none or its last one failed
    /// fatally; or why none could be made (a passing failure of the
    /// messages: the bucket backs off and asks again).
    pub(crate) fn get(&mut self, handler: &str) -> Result<FutureProducer, String> {
        let now = Instant::now();
        if let Some((producer, used)) = self.live.get_mut(handler) {
            match producer.client().fatal_error() {
                None => {
                    *used = now;
                    return Ok(producer.clone());
                }
                Some((code, reason)) => {
                    tracing::warn!(
                        handler,
                        "the relay's producer for this handler failed for good ({code:?}: {reason}); \
                         its messages go on through a new one"
                    );
                    if let Some((dead, _)) = self.live.remove(handler) {
                        close(dead);
                    }
                }
            }
        }
        let producer = (self.make)(handler).map_err(|error| {
            format!("the relay cannot create a Kafka producer for handler {handler}: {error}")
        })?;
        self.live.insert(handler.to_owned(), (producer.clone(), now));
        Ok(producer)
    }

    /// Closes the producers of handlers that sent nothing for [`IDLE`].
    pub(crate) fn close_idle(&mut self) {
        let idle: Vec<String> = self
            .live
            .iter()
            .filter(|(_, (_, used))| used.elapsed() >= IDLE)
            .map(|(handler, _)| handler.clone())
            .collect();
        for handler in idle {
            if let Some((producer, _)) = self.live.remove(&handler) {
                tracing::debug!(handler, "closing the relay's idle producer for this handler");
                close(producer);
            }
        }
    }

    /// How many producers are live.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.live.len()
    }

    #[cfg(test)]
    pub(crate) fn live(&self, handler: &str) -> Option<&FutureProducer> {
        self.live.get(handler).map(|(producer, _)| producer)
    }

    #[cfg(test)]
    pub(crate) fn age(&mut self, handler: &str, by: Duration) {
        if let Some((_, used)) = self.live.get_mut(handler) {
            *used -= by;
        }
    }
}

/// The relay stops: every producer is closed off the async threads.
impl Drop for Producers {
    fn drop(&mut self) {
        for (_, (producer, _)) in self.live.drain() {
            close(producer);
        }
    }
}

/// Drops a producer off the async threads: librdkafka's destroy joins its
/// threads and flushes for up to half a second. (A send still in flight
/// holds a clone of it, and the last clone is what closes it.) Outside a
/// runtime (a test's end) it is dropped where it is.
fn close(producer: FutureProducer) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(move || drop(producer))),
        Err(_) => drop(producer),
    }
}
