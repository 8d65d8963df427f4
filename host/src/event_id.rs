//! Reading an event's stable id out of a Kafka record.
//!
//! The id is the deduplication key, so this module is strict: a record without
//! a usable id is never guessed at; the caller dead-letters it with the error's
//! text as the reason. UUIDs are normalised (lower-case, hyphenated) so two
//! spellings of one id dedup as one.

use crate::config::{EventIdConfig, EventIdFormat, EventIdSource};
use crate::json_field::{self, Found, Read};

/// Ids longer than this are refused: the id is part of the inbox primary key.
pub const MAX_ANY_ID_BYTES: usize = 200;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventIdError {
    #[error("missing event id: {0}")]
    Missing(String),
    #[error("invalid event id {value:?} from {origin}: {problem}")]
    Invalid {
        value: String,
        origin: String,
        problem: String,
    },
}

/// The event id of `record` (see [`extract`]). A record the host kept only
/// in part (see [`crate::record::Cut`]) has its JSON id read from the part
/// kept, the first `limits.max_payload_bytes` of it, and no further.
pub fn of(config: &EventIdConfig, record: &crate::record::Record) -> Result<String, EventIdError> {
    read(config, &record.headers, &record.payload, record.cut.is_some())
}

/// Extracts and validates the event id from a record's headers and payload.
pub fn extract(
    config: &EventIdConfig,
    headers: &[(String, Vec<u8>)],
    payload: &[u8],
) -> Result<String, EventIdError> {
    read(config, headers, payload, false)
}

fn read(
    config: &EventIdConfig,
    headers: &[(String, Vec<u8>)],
    payload: &[u8],
    cut: bool,
) -> Result<String, EventIdError> {
    let (raw, origin) = match config.source {
        EventIdSource::Header => from_header(config, headers)
            .ok_or_else(|| EventIdError::Missing(format!("no header {:?}", config.header)))?,
        EventIdSource::Json => from_json(config, payload, cut)?,
        EventIdSource::HeaderOrJson => match from_header(config, headers) {
            Some(found) => found,
            None => from_json(config, payload, cut).map_err(|e| match e {
                EventIdError::Missing(why) => {
                    EventIdError::Missing(format!("no header {:?} and {why}", config.header))
                }
                other => other,
            })?,
        },
    };
    validate(config.format, raw, origin)
}

fn from_header(config: &EventIdConfig, headers: &[(String, Vec<u8>)]) -> Option<(Vec<u8>, String)> {
    // The last header with the name wins, as in Kafka's own header lookup.
    headers
        .iter()
        .rev()
        .find(|(name, _)| *name == config.header)
        .map(|(_, value)| (value.clone(), format!("header {:?}", config.header)))
}

/// The id from the payload's JSON, read without building the document
/// ([`json_field`]: a tree of a payload of zeros is 16 times its size).
fn from_json(config: &EventIdConfig, payload: &[u8], cut: bool) -> Result<(Vec<u8>, String), EventIdError> {
    let field = &config.json_field;
    let found = match json_field::read(payload, &[field.as_str()], cut) {
        Ok(Read::Whole(found)) => found,
        Ok(Read::Cut(Some(found))) => Some(found),
        Ok(Read::Cut(None)) => {
            return Err(EventIdError::Missing(format!(
                "the payload was cut at limits.max_payload_bytes before a JSON field {field:?}"
            )));
        }
        Err(e) => {
            return Err(EventIdError::Missing(format!(
                "the payload is not JSON ({e}), so it has no field {field:?}"
            )));
        }
    };
    let origin = format!("JSON field {field:?}");
    let shown = |text: &str| text.chars().filter(|c| !c.is_control()).take(80).collect();
    let other = match found {
        Some(Found::String(s)) => return Ok((s.into_bytes(), origin)),
        Some(Found::Null) | None => {
            return Err(EventIdError::Missing(format!(
                "the payload has no JSON field {field:?}"
            )));
        }
        // As `validate` shows a value: its first 80 characters (the whole
        // value, escaped twice, made a reason 1.8 times a megabyte payload,
        // stored and logged per record: the fifteenth read of issue 23's
        // third round). An object or array is named, never copied.
        Some(Found::Number(n)) => shown(&n),
        Some(Found::Bool(b)) => b.to_string(),
        Some(Found::Container(what)) => what.to_owned(),
    };
    Err(EventIdError::Invalid {
        value: other,
        origin,
        problem: "must be a JSON string".into(),
    })
}

fn validate(format: EventIdFormat, raw: Vec<u8>, origin: String) -> Result<String, EventIdError> {
    let value = String::from_utf8(raw).map_err(|e| EventIdError::Invalid {
        value: String::from_utf8_lossy(e.as_bytes())
            .chars()
            .filter(|c| !c.is_control())
            .take(80)
            .collect(),
        origin: origin.clone(),
        problem: "is not UTF-8".into(),
    })?;
    let invalid = |problem: &str| EventIdError::Invalid {
        value: value.chars().filter(|c| !c.is_control()).take(80).collect(),
        origin: origin.clone(),
        problem: problem.into(),
    };
    match format {
        EventIdFormat::Uuid => uuid::Uuid::try_parse(value.trim())
            .map(|id| id.hyphenated().to_string())
            .map_err(|_| invalid("is not a UUID (set event_id.format = \"any\" to accept other ids)")),
        EventIdFormat::Any if value.is_empty() => Err(invalid("is empty")),
        EventIdFormat::Any if value.len() > MAX_ANY_ID_BYTES => Err(invalid("is longer than 200 bytes")),
        // PostgreSQL text cannot hold NUL; no id needs control characters.
        EventIdFormat::Any if value.chars().any(char::is_control) => {
            Err(invalid("contains control characters"))
        }
        EventIdFormat::Any => Ok(value),
    }
}

const MS_PER_DAY: u64 = 86_400_000;

/// The UTC day (since the Unix epoch) of a UUIDv7 id's timestamp, or 0 for any
/// other id. A pure function of the id, so every copy of an event lands in the
/// same inbox partition.
pub fn id_day(event_id: &str) -> i32 {
    match uuid::Uuid::try_parse(event_id) {
        Ok(id) if id.get_version_num() == 7 => id
            .get_timestamp()
            .map(|ts| {
                let (secs, nanos) = ts.to_unix();
                ((secs * 1000 + u64::from(nanos) / 1_000_000) / MS_PER_DAY) as i32
            })
            .unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0191e1b2-7c3a-7d41-9a7e-3f2b1c0d9e8f";

    fn cfg(source: EventIdSource, format: EventIdFormat) -> EventIdConfig {
        EventIdConfig {
            source,
            format,
            ..EventIdConfig::default()
        }
    }

    fn header(value: &str) -> Vec<(String, Vec<u8>)> {
        vec![("event_id".into(), value.as_bytes().to_vec())]
    }

    #[test]
    fn id_day_is_the_uuidv7_day_and_zero_otherwise() {
        // 2024-09-12T10:10:42Z is day 19978 since the epoch.
        let v7 = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, 1_726_135_842, 0));
        assert_eq!(id_day(&v7.to_string()), 19_978);
        assert_eq!(
            id_day(ID),
            19_977,
            "the fixture id is a v7 id from the day before"
        );
        assert_eq!(id_day(&uuid::Uuid::new_v4().to_string()), 0);
        assert_eq!(id_day("order-17"), 0);
    }

    #[test]
    fn header_wins_over_json_by_default() {
        let payload = br#"{"event_id":"00000000-0000-0000-0000-000000000001"}"#;
        let id = extract(&EventIdConfig::default(), &header(ID), payload).unwrap();
        assert_eq!(id, ID);
    }

    #[test]
    fn falls_back_to_json_field() {
        let payload = format!(r#"{{"event_id":"{ID}","x":1}}"#);
        assert_eq!(
            extract(&EventIdConfig::default(), &[], payload.as_bytes()).unwrap(),
            ID
        );
    }

    #[test]
    fn uuids_are_normalised_so_spellings_dedup_together() {
        let upper = ID.to_uppercase();
        assert_eq!(
            extract(&EventIdConfig::default(), &header(&upper), b"").unwrap(),
            ID
        );
    }

    #[test]
    fn missing_everywhere_says_where_it_looked() {
        let err = extract(&EventIdConfig::default(), &[], br#"{"order":1}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "missing event id: no header \"event_id\" and the payload has no JSON field \"event_id\""
        );
    }

    #[test]
    fn non_json_payload_without_header_is_missing() {
        let err = extract(&EventIdConfig::default(), &[], b"not json").unwrap_err();
        assert!(
            matches!(err, EventIdError::Missing(ref m) if m.contains("not JSON")),
            "{err}"
        );
    }

    #[test]
    fn non_uuid_is_invalid_and_names_the_origin() {
        let err = extract(&EventIdConfig::default(), &header("order-17"), b"").unwrap_err();
        assert!(
            err.to_string()
                .contains("\"order-17\" from header \"event_id\": is not a UUID"),
            "{err}"
        );
    }

    #[test]
    fn header_only_source_ignores_json() {
        let payload = format!(r#"{{"event_id":"{ID}"}}"#);
        let c = cfg(EventIdSource::Header, EventIdFormat::Uuid);
        assert!(matches!(
            extract(&c, &[], payload.as_bytes()),
            Err(EventIdError::Missing(_))
        ));
    }

    #[test]
    fn any_format_accepts_free_text_but_not_empty_or_huge() {
        let c = cfg(EventIdSource::Json, EventIdFormat::Any);
        assert_eq!(
            extract(&c, &[], br#"{"event_id":"order-17"}"#).unwrap(),
            "order-17"
        );
        assert!(extract(&c, &[], br#"{"event_id":""}"#).is_err());
        let huge = format!(r#"{{"event_id":"{}"}}"#, "x".repeat(201));
        assert!(extract(&c, &[], huge.as_bytes()).is_err());
        // Regression: a NUL in an id failed PostgreSQL's insert of the claim,
        // which the host took for its own failure and retried forever.
        let err = extract(&c, &[], br#"{"event_id":"a\u0000b"}"#).unwrap_err();
        assert!(err.to_string().contains("control characters"), "{err}");
        assert!(!err.to_string().contains('\0'), "{err}");
    }

    #[test]
    fn numeric_json_id_is_invalid_not_stringified() {
        let c = cfg(EventIdSource::Json, EventIdFormat::Any);
        let err = extract(&c, &[], br#"{"event_id":42}"#).unwrap_err();
        assert!(err.to_string().contains("must be a JSON string"), "{err}");
        // A large one is shown by its first 80 characters (the fifteenth read).
        let big = format!(r#"{{"event_id":[{}"x"]}}"#, r#"""","#.repeat(100_000));
        let err = extract(&c, &[], big.as_bytes()).unwrap_err();
        assert!(err.to_string().len() < 300, "{}", err.to_string().len());
    }
}
