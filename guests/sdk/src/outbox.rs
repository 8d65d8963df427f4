//! Messages that leave only if the event's transaction commits. The host
//! relays them to Kafka afterwards, each with a new event id (returned), so
//! the consumer's own inbox deduplicates them.

use crate::Error;
use crate::bindings::inboxd::handler::outbox::{self as wit, Message};

/// Publishes `payload` to `topic` with `key`; returns the message's event id.
pub fn publish(topic: &str, key: &str, payload: Vec<u8>) -> Result<String, Error> {
    wit::publish(&Message {
        topic: topic.to_owned(),
        key: Some(key.as_bytes().to_vec()),
        payload,
        headers: Vec::new(),
    })
    .map_err(|e| Error::Retry(format!("publishing to {topic} failed: {e}")))
}

/// Publishes `value` as JSON.
pub fn publish_json<T: serde::Serialize + ?Sized>(
    topic: &str,
    key: &str,
    value: &T,
) -> Result<String, Error> {
    let payload =
        serde_json::to_vec(value).map_err(|e| Error::Reject(format!("cannot encode the message: {e}")))?;
    publish(topic, key, payload)
}
