//! `inboxd:handler/outbox`: messages that go out exactly when the handler's
//! writes commit.
//!
//! `publish` only collects the message (bounded by the handler's limits) and
//! returns its new event id, a UUIDv7. The pipeline writes the collected
//! messages into the `outbox` table in the same transaction as the handler's
//! writes, after the handler returns; if the handler fails they are dropped
//! with the rest of its work. The relay sends them to Kafka after the commit.
//! A W3C `traceparent` on the incoming event is carried to each message as a
//! child span of the same trace.

use crate::db::outbox::NewMessage;
use crate::wasm::bindings::{Message, outbox_api};
use std::collections::BTreeMap;
use std::sync::Arc;
use wasmtime::component::HasData;

pub struct OutboxState {
    messages: Vec<NewMessage>,
    bytes: usize,
    max_messages: usize,
    max_bytes: usize,
    /// Logical topic names the handler uses -> the deployment's real topics.
    topics: Arc<BTreeMap<String, String>>,
    /// The incoming event's `traceparent`, if it had a valid one.
    parent: Option<String>,
}

impl OutboxState {
    pub fn new(
        max_messages: usize,
        max_bytes: usize,
        topics: Arc<BTreeMap<String, String>>,
        headers: &[(String, Vec<u8>)],
    ) -> Self {
        let parent = headers
            .iter()
            .rev()
            .find(|(name, _)| name.eq_ignore_ascii_case("traceparent"))
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
            .filter(|value| child_traceparent(value).is_some())
            .map(str::to_owned);
        Self {
            messages: Vec::new(),
            bytes: 0,
            max_messages,
            max_bytes,
            topics,
            parent,
        }
    }

    /// The messages published during the call, for the pipeline to write.
    pub fn take(&mut self) -> Vec<NewMessage> {
        std::mem::take(&mut self.messages)
    }
}

/// A new span of the same trace: `00-<trace id>-<new parent id>-<flags>`, or
/// `None` if `parent` is not a valid version-00 traceparent.
pub fn child_traceparent(parent: &str) -> Option<String> {
    let parts: Vec<&str> = parent.trim().split('-').collect();
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    match parts.as_slice() {
        [version, trace, span, flags]
            if hex(version, 2)
                && hex(trace, 32)
                && hex(span, 16)
                && hex(flags, 2)
                && trace.bytes().any(|b| b != b'0') =>
        {
            let span: u64 = rand::random::<u64>() | 1;
            Some(format!("00-{}-{span:016x}-{flags}", trace.to_ascii_lowercase()))
        }
        _ => None,
    }
}

pub struct OutboxCap;

impl HasData for OutboxCap {
    type Data<'a> = OutboxView<'a>;
}

pub struct OutboxView<'a> {
    pub state: &'a mut OutboxState,
}

impl outbox_api::Host for OutboxView<'_> {
    fn publish(&mut self, message: Message) -> Result<String, String> {
        let state = &mut *self.state;
        if message.topic.trim().is_empty() {
            return Err("the message has no topic".into());
        }
        if state.messages.len() >= state.max_messages {
            return Err(format!(
                "limits.max_outbox_messages: this event already published {} messages",
                state.max_messages
            ));
        }
        let size = message.payload.len()
            + message.key.as_ref().map_or(0, Vec::len)
            + message
                .headers
                .iter()
                .map(|(n, v)| n.len() + v.len())
                .sum::<usize>();
        if state.bytes + size > state.max_bytes {
            return Err(format!(
                "limits.max_outbox_bytes: this event's messages would take {} bytes; the limit is {}",
                state.bytes + size,
                state.max_bytes
            ));
        }
        // The host alone sets a message's event id; a guest's own is dropped.
        let mut headers: Vec<(String, Vec<u8>)> = message
            .headers
            .into_iter()
            .filter(|(name, _)| name != "event_id")
            .collect();
        let has_trace = headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("traceparent"));
        if let (false, Some(parent)) = (has_trace, &state.parent)
            && let Some(child) = child_traceparent(parent)
        {
            headers.push(("traceparent".into(), child.into_bytes()));
        }
        let topic = state.topics.get(&message.topic).cloned().unwrap_or(message.topic);
        let id = uuid::Uuid::now_v7().to_string();
        state.bytes += size;
        state.messages.push(NewMessage {
            id: id.clone(),
            topic,
            key: message.key,
            payload: message.payload,
            headers,
        });
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wasm::bindings::outbox_api::Host as _;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn message(topic: &str, payload: &[u8]) -> Message {
        Message {
            topic: topic.into(),
            key: None,
            payload: payload.to_vec(),
            headers: vec![],
        }
    }

    #[test]
    fn traceparent_keeps_the_trace_and_makes_a_new_span() {
        let child = child_traceparent(PARENT).unwrap();
        assert!(
            child.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{child}"
        );
        assert!(child.ends_with("-01"));
        assert_ne!(&child[36..52], "00f067aa0ba902b7");
        assert_eq!(
            child_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            None
        );
        assert_eq!(child_traceparent("garbage"), None);
    }

    #[test]
    fn publish_maps_topics_carries_the_trace_and_bounds_the_volume() {
        let topics = Arc::new(BTreeMap::from([(
            "invoices.created".to_owned(),
            "prod.invoices".to_owned(),
        )]));
        let headers = vec![("traceparent".to_owned(), PARENT.as_bytes().to_vec())];
        let mut state = OutboxState::new(2, 10, topics, &headers);
        let mut view = OutboxView { state: &mut state };
        let id = view.publish(message("invoices.created", b"12345")).unwrap();
        assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 7);
        assert!(
            view.publish(message("x", b"123456"))
                .unwrap_err()
                .contains("limits.max_outbox_bytes")
        );
        view.publish(message("x", b"1")).unwrap();
        assert!(
            view.publish(message("x", b""))
                .unwrap_err()
                .contains("limits.max_outbox_messages")
        );
        let sent = state.take();
        assert_eq!(sent[0].topic, "prod.invoices");
        assert_eq!(sent[0].id, id);
        let trace = String::from_utf8(sent[0].headers[0].1.clone()).unwrap();
        assert!(trace.contains("4bf92f3577b34da6a3ce929d0e0e4736"));
    }
}
