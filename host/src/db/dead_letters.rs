//! The `dead_letters` table: events that were not applied, and why.
//!
//! A dead letter keeps the whole record (key, headers, payload) so it can be
//! inspected and replayed. The caller writes it in the same transaction as the
//! inbox row with status `dead` and the offset, so "parked" is atomic.

use super::{Database, DbError, SqlValue, Tx, now_ms};

/// Why an event was parked. The kind is stable text for scripts; the message is for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasonKind {
    /// No usable event id: the record cannot be deduplicated, so it is never run.
    EventId,
    /// The handler returned `handler-error::reject`.
    Rejected,
    /// The handler kept failing with `retry`, a trap or a limit until `max_attempts`.
    RetriesExhausted,
    /// The event broke a limit before the handler ran (its payload size).
    Limit,
    /// The host's own rows were not intact after the handler ran.
    SandboxViolation,
}

impl ReasonKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonKind::EventId => "event-id",
            ReasonKind::Rejected => "rejected",
            ReasonKind::RetriesExhausted => "retries-exhausted",
            ReasonKind::Limit => "limit",
            ReasonKind::SandboxViolation => "sandbox-violation",
        }
    }
}

pub struct DeadLetter<'a> {
    pub handler: &'a str,
    pub event_id: Option<&'a str>,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub payload: &'a [u8],
    pub headers: &'a [(String, Vec<u8>)],
    pub kind: ReasonKind,
    pub reason: &'a str,
    pub attempts: u32,
    pub handler_version: Option<&'a str>,
    pub first_failed_at: i64,
}

/// Headers as JSON: `[{"name": .., "value": ..}]`, or `"hex"` instead of
/// `"value"` when a value is not UTF-8, so nothing is lost.
pub fn headers_json(headers: &[(String, Vec<u8>)]) -> String {
    let list: Vec<serde_json::Value> = headers
        .iter()
        .map(|(name, value)| match std::str::from_utf8(value) {
            Ok(text) => serde_json::json!({ "name": name, "value": text }),
            Err(_) => {
                let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
                serde_json::json!({ "name": name, "hex": hex })
            }
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

const INSERT: &str = r#"INSERT INTO dead_letters
(handler, event_id, topic, partition, "offset", key, payload, headers, reason_kind, reason,
 attempts, handler_version, first_failed_at, last_failed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"#;

pub async fn insert(tx: &mut Tx, letter: &DeadLetter<'_>) -> Result<(), DbError> {
    let params = [
        letter.handler.into(),
        letter.event_id.into(),
        letter.topic.into(),
        letter.partition.into(),
        letter.offset.into(),
        letter.key.map_or(SqlValue::Null, SqlValue::from),
        letter.payload.into(),
        headers_json(letter.headers).into(),
        letter.kind.as_str().into(),
        letter.reason.into(),
        letter.attempts.into(),
        letter.handler_version.into(),
        letter.first_failed_at.into(),
        now_ms().into(),
    ];
    tx.execute(INSERT, &params).await.map(drop)
}

/// A dead letter as listed for people and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub id: i64,
    pub event_id: Option<String>,
    pub partition: i32,
    pub offset: i64,
    pub kind: String,
    pub reason: String,
    pub attempts: i64,
}

pub async fn list(db: &Database, handler: &str) -> Result<Vec<Summary>, DbError> {
    let rows = db
        .query(
            r#"SELECT id, event_id, partition, "offset", reason_kind, reason, attempts
               FROM dead_letters WHERE handler = $1 ORDER BY id"#,
            &[handler.into()],
        )
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| match r.as_slice() {
            [
                SqlValue::Int64(id),
                event_id,
                SqlValue::Int64(p),
                SqlValue::Int64(o),
                kind,
                reason,
                SqlValue::Int64(a),
            ] => Some(Summary {
                id: *id,
                event_id: event_id.as_str().map(str::to_owned),
                partition: *p as i32,
                offset: *o,
                kind: kind.as_str().unwrap_or_default().to_owned(),
                reason: reason.as_str().unwrap_or_default().to_owned(),
                attempts: *a,
            }),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::memory_db;

    #[tokio::test]
    async fn insert_and_list_keep_the_reason() {
        let db = memory_db().await;
        let headers = vec![
            ("trace".to_owned(), b"abc".to_vec()),
            ("bin".to_owned(), vec![0xff, 0x00]),
        ];
        let mut tx = db.begin().await.unwrap();
        insert(
            &mut tx,
            &DeadLetter {
                handler: "billing",
                event_id: None,
                topic: "orders",
                partition: 2,
                offset: 41,
                key: Some(b"k"),
                payload: b"not json",
                headers: &headers,
                kind: ReasonKind::EventId,
                reason: "missing event id",
                attempts: 0,
                handler_version: None,
                first_failed_at: now_ms(),
            },
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        let listed = list(&db, "billing").await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].kind, "event-id");
        assert_eq!(listed[0].reason, "missing event id");
        assert_eq!((listed[0].partition, listed[0].offset), (2, 41));
        assert_eq!(
            headers_json(&headers),
            r#"[{"name":"trace","value":"abc"},{"hex":"ff00","name":"bin"}]"#
        );
    }
}
