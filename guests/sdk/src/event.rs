//! The event a handler is called with.

use crate::Error;
use serde::de::DeserializeOwned;

/// One Kafka record whose event id the host has already claimed.
pub struct Event(crate::bindings::Event);

impl Event {
    pub(crate) fn new(raw: crate::bindings::Event) -> Self {
        Self(raw)
    }

    /// The id the host deduplicates on.
    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// The payload as JSON of type `T`; any other payload is rejected (the
    /// event is dead-lettered with the parse error), never retried.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.0.payload).map_err(|e| {
            Error::Reject(format!(
                "the payload is not valid JSON for {}: {e}",
                std::any::type_name::<T>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("this handler")
            ))
        })
    }

    pub fn payload(&self) -> &[u8] {
        &self.0.payload
    }

    pub fn key(&self) -> Option<&[u8]> {
        self.0.key.as_deref()
    }

    /// The first header with this name.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.0
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    pub fn topic(&self) -> &str {
        &self.0.topic
    }

    pub fn partition(&self) -> i32 {
        self.0.partition
    }

    pub fn offset(&self) -> i64 {
        self.0.offset
    }

    pub fn timestamp_ms(&self) -> Option<i64> {
        self.0.timestamp_ms
    }

    /// 1 on the first delivery, then 2, 3, ... on retries.
    pub fn attempt(&self) -> u32 {
        self.0.attempt
    }

    /// The event as the host sent it.
    pub fn raw(&self) -> &crate::bindings::Event {
        &self.0
    }
}
