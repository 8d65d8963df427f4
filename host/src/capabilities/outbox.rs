//! `inboxd:handler/outbox`: messages that go out exactly when the handler's
//! writes commit.
//!
//! `publish` only collects the message (bounded by the handler's limits) and
//! returns its new event id, a UUIDv7. The pipeline writes the collected
//! messages into the `outbox` table in the same transaction as the handler's
//! writes, after the handler returns; if the handler fails they are dropped
//! with the rest of its work. The relay sends them to Kafka after the commit.
//! A W3C `traceparent` on the incoming event is carried to each message as a
//! child span of the same trace (the event's own span while spans are
//! exported over OTLP, see `telemetry`).

use crate::bindings::{Message, outbox_api};
use crate::db::outbox::NewMessage;
use std::collections::BTreeMap;
use std::sync::Arc;
use wasmtime::component::HasData;

mod id_names;
mod lenient;

use id_names::id_headers;
pub use id_names::{forget_id_source, is_id_header, register_id_source, restamped, stamp_json_id};

/// The most headers one message may carry. Kafka has no bound of its own,
/// and a header of an empty name and value weighed nothing against
/// `limits.max_outbox_bytes`: 100 messages of 8 million each would have held
/// about 40 GB in the host (the seventeenth adversarial read, issue 23).
pub const MAX_HEADERS: usize = 64;

use crate::config::MAX_TOPIC_NAME_BYTES;
use crate::db::headers::headers_json;
use crate::db::outbox::{MAX_STORED_BYTES, stored_bytes};
use crate::record::headers_bytes;

pub struct OutboxState {
    messages: Vec<NewMessage>,
    bytes: usize,
    max_messages: usize,
    max_bytes: usize,
    /// Logical topic names the handler uses -> the deployment's real topics.
    topics: Arc<BTreeMap<String, String>>,
    /// The incoming event's `traceparent`, if it had a valid one.
    parent: Option<String>,
    /// The event's own span as a `traceparent`, while spans are exported:
    /// carried as it is, so the message's consumer is that span's child.
    own: Option<String>,
}

impl OutboxState {
    pub fn new(
        max_messages: usize,
        max_bytes: usize,
        topics: Arc<BTreeMap<String, String>>,
        headers: &[(String, Vec<u8>)],
    ) -> Self {
        let parent = crate::telemetry::traceparent_header(headers)
            .filter(|value| child_traceparent(value).is_some())
            .map(str::to_owned);
        // With spans exported, the event's own span is the messages' parent
        // (its consumer's span becomes that span's child), not a made-up one.
        let own = crate::telemetry::current_traceparent();
        Self {
            messages: Vec::new(),
            bytes: 0,
            max_messages,
            max_bytes,
            topics,
            parent,
            own,
        }
    }

    /// The messages published during the call, for the pipeline to write.
    pub fn take(&mut self) -> Vec<NewMessage> {
        std::mem::take(&mut self.messages)
    }
}

/// A new span of the same trace: `00-<trace id>-<new parent id>-<flags>`, or
/// `None` if `parent` is not a valid traceparent (read as `telemetry` reads it).
pub fn child_traceparent(parent: &str) -> Option<String> {
    let parent = crate::telemetry::parse_traceparent(parent)?;
    let span: u64 = rand::random::<u64>() | 1;
    Some(format!(
        "00-{}-{span:016x}-{:02x}",
        parent.trace_id(),
        parent.trace_flags().to_u8()
    ))
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
        // Before anything quotes it: a refusal once formatted a guest's
        // 400 MiB topic several times over.
        if message.topic.len() > MAX_TOPIC_NAME_BYTES {
            return Err(format!(
                "the message's topic name is {} bytes; outbox_topics names are at most {MAX_TOPIC_NAME_BYTES}",
                message.topic.len()
            ));
        }
        let Some(topic) = state.topics.get(&message.topic).cloned() else {
            return Err(refused_topic(&message.topic, &state.topics));
        };
        if state.messages.len() >= state.max_messages {
            return Err(format!(
                "limits.max_outbox_messages: this event already published {} messages",
                state.max_messages
            ));
        }
        if message.headers.len() > MAX_HEADERS {
            return Err(format!(
                "the message has {} headers; at most {MAX_HEADERS} are allowed",
                message.headers.len()
            ));
        }
        let size = message.payload.len()
            + message.key.as_ref().map_or(0, Vec::len)
            + headers_bytes(&message.headers);
        if state.bytes + size > state.max_bytes {
            return Err(format!(
                "limits.max_outbox_bytes: this event's messages would take {} bytes; the limit is {}",
                state.bytes + size,
                state.max_bytes
            ));
        }
        // The host alone sets a message's event id: a guest's own is dropped
        // (the relay stamps the header) and the JSON field is overwritten.
        let mut headers: Vec<(String, Vec<u8>)> = message
            .headers
            .into_iter()
            .filter(|(name, _)| !is_id_header(&topic, name))
            .collect();
        let has_trace = headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("traceparent"));
        if !has_trace {
            let trace = state
                .own
                .clone()
                .or_else(|| state.parent.as_deref().and_then(child_traceparent));
            if let Some(trace) = trace {
                headers.push(("traceparent".into(), trace.into_bytes()));
            }
        }
        let id = uuid::Uuid::now_v7().to_string();
        // Under every other name a consumer may read it from, too (the relay
        // writes `event_id`).
        headers.extend(
            id_headers(&topic)
                .into_iter()
                .map(|name| (name, id.clone().into_bytes())),
        );
        let payload = stamp_json_id(&topic, message.payload, &id)?;
        let message = NewMessage {
            id: id.clone(),
            topic,
            key: message.key,
            payload,
            headers,
        };
        // As stored, escaped in JSON, a header of control characters is six
        // times its size: what the relay counts must fit its budget.
        let stored = stored_bytes(&message, &headers_json(&message.headers));
        if stored > MAX_STORED_BYTES {
            return Err(format!(
                "the message takes {stored} bytes as stored (its headers as JSON); at most \
                 {MAX_STORED_BYTES} are allowed"
            ));
        }
        state.bytes += size;
        state.messages.push(message);
        Ok(id)
    }
}

/// The refusal of a topic the handler's `outbox_topics` does not map.
fn refused_topic(topic: &str, allowed: &BTreeMap<String, String>) -> String {
    let names = if allowed.is_empty() {
        "none: its outbox_topics is empty".to_owned()
    } else {
        allowed
            .keys()
            .map(|k| format!("{k:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "outbox topic {topic:?} is not allowed for this handler: it may publish only to the \
         topics its `outbox_topics` mapping names ({names}); the operator adds a name there \
         (\"{topic}\" = \"<real topic>\") to allow it"
    )
}

#[cfg(test)]
mod tests {
    use super::id_names::stamp_object;
    use super::*;
    use crate::bindings::outbox_api::Host as _;

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

    fn topics(pairs: &[(&str, &str)]) -> Arc<BTreeMap<String, String>> {
        Arc::new(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    /// Regression (issue 23, fifth read): 64 header values of control
    /// characters within `max_outbox_bytes` (8 MiB) were 100 MB as the relay
    /// counts them (JSON escapes each as six bytes), over its whole budget,
    /// and the message's bucket cut every read short of the buckets after it.
    #[test]
    fn a_message_over_its_stored_size_is_refused() {
        let mut state = OutboxState::new(10, 8 << 20, topics(&[("x", "x")]), &[]);
        let mut view = OutboxView { state: &mut state };
        let mut escaped = message("x", b"{}");
        escaped.headers = (0..64).map(|i| (format!("h{i}"), vec![1u8; 131_000])).collect();
        let error = view.publish(escaped).unwrap_err();
        assert!(
            error.contains("as stored") && error.contains(&MAX_STORED_BYTES.to_string()),
            "{error}"
        );
        let mut plain = message("x", b"{}");
        plain.headers = (0..64).map(|i| (format!("h{i}"), vec![b'a'; 131_000])).collect();
        view.publish(plain).unwrap();
        assert_eq!(state.take().len(), 1, "only the one within bounds is kept");
    }

    #[test]
    fn publish_maps_topics_carries_the_trace_and_bounds_the_volume() {
        let topics = topics(&[("invoices.created", "prod.invoices"), ("x", "x")]);
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
        // Headers weigh something, and there is a bound on how many.
        let mut state_b =
            OutboxState::new(2, 1000, Arc::new(BTreeMap::from([("x".into(), "x".into())])), &[]);
        let mut view_b = OutboxView { state: &mut state_b };
        let mut many = message("x", b"");
        many.headers = vec![(String::new(), Vec::new()); MAX_HEADERS + 1];
        let err = view_b.publish(many).unwrap_err();
        assert!(err.contains("at most 64"), "{err}");
        let mut heavy = message("x", b"");
        heavy.headers = vec![(String::new(), Vec::new()); 21];
        let err = view_b.publish(heavy).unwrap_err();
        assert!(err.contains("limits.max_outbox_bytes"), "{err}");
        let sent = state.take();
        assert_eq!(sent[0].topic, "prod.invoices");
        assert_eq!(sent[0].id, id);
        let trace = String::from_utf8(sent[0].headers[0].1.clone()).unwrap();
        assert!(trace.contains("4bf92f3577b34da6a3ce929d0e0e4736"));
    }

    /// Regression: a handler could publish to any topic its mapping did not
    /// name (another team's), under that very name.
    #[test]
    fn publish_refuses_every_topic_the_mapping_does_not_name() {
        let mut state = OutboxState::new(10, 1000, topics(&[("invoices.created", "prod.invoices")]), &[]);
        let mut view = OutboxView { state: &mut state };
        for topic in [
            "payments.refunds",
            "prod.invoices",
            "Invoices.created",
            "invoices.created ",
        ] {
            let error = view.publish(message(topic, b"{}")).unwrap_err();
            assert!(error.contains(&format!("{topic:?}")), "{error}");
            assert!(error.contains("outbox_topics"), "{error}");
            assert!(
                error.contains("\"invoices.created\""),
                "names the allowed: {error}"
            );
        }
        let mut empty = OutboxState::new(10, 1000, topics(&[]), &[]);
        let error = OutboxView { state: &mut empty }
            .publish(message("anything", b""))
            .unwrap_err();
        assert!(error.contains("outbox_topics is empty"), "{error}");
        // Regression (issue 23): a long topic was quoted, escaped, twice.
        let error = OutboxView { state: &mut empty }
            .publish(message(&"\u{1}".repeat(1 << 20), b""))
            .unwrap_err();
        assert!(error.contains("1048576 bytes") && error.len() < 200, "{error}");
        assert!(
            state.take().is_empty() && empty.take().is_empty(),
            "nothing refused is kept"
        );
    }

    /// Regression: only the exact header `event_id` was dropped, so a guest
    /// could forge the id under `Event-ID` or in the JSON payload.
    #[test]
    fn the_id_in_headers_and_json_is_the_hosts() {
        let mut state = OutboxState::new(10, 10_000, topics(&[("t", "t")]), &[]);
        let mut view = OutboxView { state: &mut state };
        let forged = "00000000-0000-4000-8000-000000000000";
        let mut sent = message(
            "t",
            format!(r#" {{"a": 1, "event_id": "{forged}", "b": {{"event_id": "inner"}}, "event_id": "x"}}"#)
                .as_bytes(),
        );
        sent.headers = [
            "event_id",
            "EVENT_ID",
            "Event-Id",
            "event.id",
            "eventId",
            "X-Event-ID",
            " event_id ",
            "kept",
        ]
        .iter()
        .map(|name| ((*name).to_owned(), forged.as_bytes().to_vec()))
        .collect();
        let id = view.publish(sent).unwrap();
        let out = state.take().remove(0);
        // (Besides the names other tests registered, each carrying the host's id.)
        let guests: Vec<_> = out.headers.iter().filter(|(_, v)| v != id.as_bytes()).collect();
        assert_eq!(guests, [&("kept".to_owned(), forged.as_bytes().to_vec())]);
        let payload: serde_json::Value = serde_json::from_slice(&out.payload).unwrap();
        assert_eq!(payload["event_id"], serde_json::json!(id));
        assert_eq!(payload["a"], 1);
        assert_eq!(payload["b"]["event_id"], "inner", "only the top level is the id");
        let text = String::from_utf8(out.payload).unwrap();
        assert_eq!(
            text.matches("\"event_id\"").count(),
            2,
            "one top-level copy: {text}"
        );
    }

    /// Regression (the twenty-fifth adversarial read, issue 23): a message
    /// published before its topic's consumer registered a name (or on a host
    /// where that consumer never loaded) kept the publisher's value under
    /// it; the relay stamps the names registered now, and leaves the rest.
    #[test]
    fn the_relay_stamps_the_names_registered_when_it_sends() {
        let topic = "t-registered-later";
        let stored = vec![
            ("X-Later-Ref".to_owned(), b"forged".to_vec()),
            ("other".to_owned(), b"kept".to_vec()),
        ];
        let payload = br#"{"later_ref": "forged", "n": 1}"#;
        assert_eq!(
            restamped(topic, "id-1", &stored, payload),
            None,
            "nothing registered yet"
        );
        register_id_source("later", &[topic.to_owned()], "x-later-ref", "later_ref");
        let (headers, payload) = restamped(topic, "id-1", &stored, payload).expect("registered now");
        assert_eq!(
            headers,
            [
                ("other".to_owned(), b"kept".to_vec()),
                ("x-later-ref".to_owned(), b"id-1".to_vec())
            ]
        );
        let payload: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(payload["later_ref"], "id-1");
        assert_eq!(payload["n"], 1);
    }

    /// Regression (issue 23): only `event_id` was the host's, so a guest
    /// could set the header or JSON field another consumer takes its id from.
    #[test]
    fn every_name_a_consumer_takes_its_id_from_is_the_hosts() {
        register_id_source(
            "order-refs",
            &["t".to_owned()],
            "X-Test-Order-Ref",
            "test_order_ref",
        );
        let mut state = OutboxState::new(10, 10_000, topics(&[("t", "t"), ("u", "u")]), &[]);
        let mut view = OutboxView { state: &mut state };
        let forged = "forged";
        let mut sent = message(
            "t",
            format!(r#"{{"test_order_ref": "{forged}", "n": 1, "test_order_ref": "again"}}"#).as_bytes(),
        );
        sent.headers = vec![("x-test-order-ref".to_owned(), forged.as_bytes().to_vec())];
        let id = view.publish(sent).unwrap();
        let out = state.take().remove(0);
        let header: Vec<_> = out
            .headers
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case("x-test-order-ref"))
            .collect();
        assert_eq!(
            header,
            [&("X-Test-Order-Ref".to_owned(), id.clone().into_bytes())]
        );
        let text = String::from_utf8(out.payload).unwrap();
        let payload: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(payload["test_order_ref"], serde_json::json!(id));
        assert_eq!(payload["event_id"], serde_json::json!(id));
        assert_eq!(payload["n"], 1);
        assert_eq!(text.matches("test_order_ref").count(), 1, "{text}");
        // A field the payload does not have is not added.
        let other = stamp_object(b"{\"n\": 1}".to_vec(), &id, &["absent".to_owned()]);
        assert!(!String::from_utf8(other).unwrap().contains("absent"));
        // A registered field in another case is the field (the seventh read).
        let folded = stamp_object(
            br#"{"TEST_ORDER_REF": "forged", "n": 1}"#.to_vec(),
            &id,
            &["test_order_ref".to_owned()],
        );
        assert_eq!(
            String::from_utf8(folded).unwrap(),
            format!(r#"{{"event_id":"{id}","test_order_ref":"{id}","n": 1}}"#)
        );
        // On a topic whose consumers read other names, the guest's own stay:
        // the names of t's consumer are not every team's.
        let mut view = OutboxView { state: &mut state };
        let mut sent = message("u", br#"{"test_order_ref": "mine", "n": 2}"#);
        sent.headers = vec![("X-Test-Order-Ref".to_owned(), b"mine".to_vec())];
        view.publish(sent).unwrap();
        let out = state.take().remove(0);
        assert!(
            out.headers
                .contains(&("X-Test-Order-Ref".to_owned(), b"mine".to_vec())),
            "{:?}",
            out.headers
        );
        let payload: serde_json::Value = serde_json::from_slice(&out.payload).unwrap();
        assert_eq!(payload["test_order_ref"], "mine");
    }

    #[test]
    fn json_stamping_adds_the_field_and_leaves_other_payloads_alone() {
        let id = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
        let stamped =
            |p: &str| String::from_utf8(stamp_json_id("t", p.as_bytes().to_vec(), id).unwrap()).unwrap();
        assert_eq!(stamped("{}"), format!(r#"{{"event_id":"{id}"}}"#));
        assert_eq!(
            stamped(r#"{"n": 18446744073709551617, "s": "a\"}b", "l": [1, {"x": null}], "t": true}"#),
            format!(
                r#"{{"event_id":"{id}","n": 18446744073709551617,"s": "a\"}}b","l": [1, {{"x": null}}],"t": true}}"#
            ),
            "other members keep their text, big numbers included"
        );
        assert_eq!(
            stamped(r#"{"event\u005fid": "forged"}"#),
            format!(r#"{{"event_id":"{id}"}}"#),
            "an escaped key is the same key"
        );
        // So is the same name in any case, to readers that ignore case (Go's
        // encoding/json takes the last): dotless ı, long ſ and Kelvin K too.
        assert_eq!(
            stamped(
                r#"{"n": 1, "EVENT_ID": "a", "Event_Id": "b", "event_ıd": "c", "\u0045vent_id": "d", "event_İd": "e", "eventId": "f", "event-id": "g", "X-Event-Id": "h"}"#
            ),
            format!(r#"{{"event_id":"{id}","n": 1}}"#),
        );

        for untouched in ["not json", "[1, 2]", "\"event_id\"", "", " x{"] {
            assert_eq!(stamped(untouched), untouched);
        }
        // Binary formats pass untouched, Confluent's Avro framing (magic 0,
        // schema id 123 = `{`) among them.
        for binary in [vec![0xff, b'x', b'{', 0], vec![0, 0, 0, 0, b'{', 1], vec![0xfe]] {
            assert_eq!(stamp_json_id("t", binary.clone(), id).unwrap(), binary);
        }
    }

    #[test]
    fn a_payload_a_lenient_reader_takes_for_an_object_is_refused_not_sent_unstamped() {
        let id = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
        let refused = |p: Vec<u8>| stamp_json_id("t", p, id).unwrap_err();
        let forged = r#"{"event_id": "forged", "v": 1}"#;
        // Not strict JSON: each once went out with the guest's event_id.
        for text in [
            r#"{"event_id": "forged", "v": NaN}"#,
            r#"{"event_id": "forged"} trailing"#,
            r#"{"event_id": "forged", /* c */ "v": 1}"#,
            "{broken",
        ] {
            let err = refused(text.as_bytes().to_vec());
            assert!(err.contains("not strict JSON (RFC 8259)"), "{text}: {err}");
        }
        // What lenient readers skip before the object (the seventh read).
        for prefix in [
            "/**/",
            "// c\n",
            "# c\n",
            ")]}'\n",
            " /* a */ // b\n",
            "// c\r",
            "# c\u{2028}",
        ] {
            let err = refused(format!("{prefix}{forged}").into_bytes());
            assert!(err.contains("lenient reader"), "{prefix:?}: {err}");
        }
        for text in ["/ not a comment {", "#tag", ")]}", "/* never closed {"] {
            assert_eq!(
                stamp_json_id("t", text.as_bytes().to_vec(), id).unwrap(),
                text.as_bytes(),
                "{text:?}"
            );
        }
        // A key a lossy decoder reads as event_id (the ninth read).
        let err = refused(b"{\"event_id\": \"x\", \"event_\xffid\": \"forged\"}".to_vec());
        assert!(err.contains("not valid UTF-8"), "{err}");
        let err = refused(b"\xff{\"event_id\": \"forged\"}".to_vec());
        assert!(err.contains("not valid UTF-8"), "{err}");
        // Deep nesting is strict JSON, and stamped (the check keeps no stack).
        let deep = format!(
            r#"{{"event_id": "forged", "v": {}1{}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let stamped = String::from_utf8(stamp_json_id("t", deep.into_bytes(), id).unwrap()).unwrap();
        assert!(
            stamped.starts_with(&format!(r#"{{"event_id":"{id}","v": [["#)) && !stamped.contains("forged")
        );
        // Other encodings a lenient reader detects.
        let utf16 = |big: bool, bom: bool| {
            let mut out: Vec<u8> = if bom { vec![0xfe, 0xff] } else { vec![] };
            for unit in format!(" {forged}").encode_utf16() {
                out.extend(if big {
                    unit.to_be_bytes()
                } else {
                    unit.to_le_bytes()
                });
            }
            if bom && !big {
                out.splice(0..2, [0xff, 0xfe]);
            }
            out
        };
        for (payload, named) in [
            (
                [&[0xef, 0xbb, 0xbf][..], forged.as_bytes()].concat(),
                "UTF-8 with a byte-order mark",
            ),
            (utf16(true, false), "in UTF-16;"),
            (utf16(false, false), "in UTF-16;"),
            (utf16(true, true), "UTF-16 with a byte-order mark"),
            (utf16(false, true), "UTF-16 with a byte-order mark"),
            (
                forged.chars().flat_map(|c| (c as u32).to_le_bytes()).collect(),
                "in UTF-32;",
            ),
            (
                forged.chars().flat_map(|c| (c as u32).to_be_bytes()).collect(),
                "in UTF-32;",
            ),
            // Decoded first, then read past a comment (the eighth read).
            (
                format!("/**/{forged}")
                    .encode_utf16()
                    .flat_map(u16::to_le_bytes)
                    .collect(),
                "in UTF-16;",
            ),
            (
                [&[0xef, 0xbb, 0xbf][..], b"// x\r", forged.as_bytes()].concat(),
                "UTF-8 with a byte-order mark",
            ),
        ] {
            let err = refused(payload);
            assert!(err.contains(named) && err.contains("event_id"), "{named}: {err}");
        }
    }
}
