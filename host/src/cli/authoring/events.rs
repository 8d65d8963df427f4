//! The events file of `inboxd test`: one JSON object per line, turned into
//! the Kafka records a broker would deliver.
//!
//! ```json
//! {"payload": {"order_id": "o-1"}, "event_id": "0190...", "key": "o-1", "copies": 2}
//! {"payload_base64": "AAEC", "headers": {"trace": "x"}, "topic": "orders", "partition": 1}
//! ```
//!
//! `payload` is sent as its JSON text (a JSON string as the string's own text,
//! so a malformed payload can be written as one); `payload_base64` as its
//! bytes. `event_id` goes in the handler's id header (`event_id.header`);
//! leave it out to take the id from the payload, as the handler's settings
//! say. `copies` sends the record that many times in a row, as a producer's
//! retry would. Offsets count from 0 per topic and partition in file order.

use crate::cli::CliError;
use crate::config::{EventIdConfig, EventIdSource};
use crate::record::Record;
use base64::Engine;
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// More copies of one line than this is a mistake in the file, not a test.
const MAX_COPIES: u32 = 1_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    payload: Option<Value>,
    payload_base64: Option<String>,
    key: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    event_id: Option<String>,
    topic: Option<String>,
    #[serde(default)]
    partition: i32,
    copies: Option<u32>,
    timestamp_ms: Option<i64>,
}

/// One record to deliver, and the line of the file it came from.
#[derive(Debug, Clone)]
pub struct TestRecord {
    pub line: usize,
    /// 1 for the first copy of its line, 2 for the next, ...
    pub copy: u32,
    pub record: Record,
}

/// Reads `path` into records, in delivery order. `topic` is where a line
/// without one goes; `ids` is where the handler looks for event ids.
pub fn read(path: &Path, topic: &str, ids: &EventIdConfig) -> Result<Vec<TestRecord>, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
    parse(&text, topic, ids).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))
}

fn parse(text: &str, topic: &str, ids: &EventIdConfig) -> Result<Vec<TestRecord>, String> {
    let mut next_offset: HashMap<(String, i32), i64> = HashMap::new();
    let mut records = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let at = |message: String| format!("line {line}: {message}");
        let parsed: Line = serde_json::from_str(raw).map_err(|e| at(e.to_string()))?;
        let payload = match (&parsed.payload, &parsed.payload_base64) {
            (Some(Value::String(text)), None) => text.clone().into_bytes(),
            (Some(json), None) => json.to_string().into_bytes(),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| at(format!("payload_base64 is not base64: {e}")))?,
            (None, None) => return Err(at("needs a `payload` (JSON) or a `payload_base64`".into())),
            (Some(_), Some(_)) => return Err(at("has both `payload` and `payload_base64`: keep one".into())),
        };
        if parsed.partition < 0 {
            return Err(at(format!("partition {} is negative", parsed.partition)));
        }
        let copies = parsed.copies.unwrap_or(1);
        if !(1..=MAX_COPIES).contains(&copies) {
            return Err(at(format!(
                "copies must be between 1 and {MAX_COPIES}, got {copies}"
            )));
        }
        let mut headers: Vec<(String, Vec<u8>)> = parsed
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), value.clone().into_bytes()))
            .collect();
        if let Some(id) = &parsed.event_id {
            if ids.source == EventIdSource::Json {
                return Err(at(format!(
                    "has an `event_id`, but the handler reads ids only from the payload's {:?} \
                     field (event_id.source = \"json\"): put the id there",
                    ids.json_field
                )));
            }
            headers.retain(|(name, _)| *name != ids.header);
            headers.push((ids.header.clone(), id.clone().into_bytes()));
        }
        let topic = parsed.topic.clone().unwrap_or_else(|| topic.to_owned());
        let offset = next_offset.entry((topic.clone(), parsed.partition)).or_insert(0);
        for copy in 1..=copies {
            records.push(TestRecord {
                line,
                copy,
                record: Record {
                    topic: topic.clone(),
                    partition: parsed.partition,
                    offset: *offset,
                    key: parsed.key.clone().map(String::into_bytes),
                    payload: payload.clone(),
                    headers: headers.clone(),
                    timestamp_ms: parsed.timestamp_ms,
                    cut: None,
                },
            });
            *offset += 1;
        }
    }
    if records.is_empty() {
        return Err("no events (one JSON object per line)".into());
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> EventIdConfig {
        serde_json::from_str("{}").unwrap()
    }

    #[test]
    fn lines_become_records_with_offsets_per_partition_and_copies() {
        let text = r#"{"payload": {"a": 1}, "event_id": "e1", "copies": 2}

{"payload": "not json", "partition": 1, "key": "k"}
{"payload_base64": "AAE=", "topic": "other", "headers": {"h": "v"}}
"#;
        let records = parse(text, "orders", &ids()).unwrap();
        let shown: Vec<_> = records
            .iter()
            .map(|r| {
                (
                    r.line,
                    r.copy,
                    r.record.topic.as_str(),
                    r.record.partition,
                    r.record.offset,
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                (1, 1, "orders", 0, 0),
                (1, 2, "orders", 0, 1),
                (3, 1, "orders", 1, 0),
                (4, 1, "other", 0, 0)
            ]
        );
        assert_eq!(records[0].record.payload, br#"{"a":1}"#);
        assert_eq!(
            records[0].record.headers,
            [("event_id".to_owned(), b"e1".to_vec())]
        );
        assert_eq!(records[2].record.payload, b"not json");
        assert_eq!(records[2].record.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(records[3].record.payload, [0, 1]);
    }

    #[test]
    fn a_bad_line_is_named() {
        let bad = |text: &str| parse(text, "t", &ids()).unwrap_err();
        assert!(
            bad("{\"payload\": 1}\n{}\n").starts_with("line 2: needs a `payload`"),
            "{}",
            bad("{}")
        );
        assert!(bad(r#"{"payload": 1, "copies": 0}"#).contains("copies must be between 1"));
        assert!(bad(r#"{"payload": 1, "offset": 3}"#).contains("unknown field `offset`"));
        assert!(bad(r#"{"payload_base64": "%%"}"#).contains("not base64"));
        assert_eq!(bad(""), "no events (one JSON object per line)");
        let json_only: EventIdConfig = serde_json::from_str(r#"{"source": "json"}"#).unwrap();
        let err = parse(r#"{"payload": {}, "event_id": "x"}"#, "t", &json_only).unwrap_err();
        assert!(err.contains("put the id there"), "{err}");
    }
}
