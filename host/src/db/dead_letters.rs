//! The `dead_letters` table: events that were not applied, and why.
//!
//! A dead letter keeps the whole record (key, headers, payload) so it can be
//! inspected and replayed. The caller writes it in the same transaction as the
//! inbox row with status `dead` and the offset, so "parked" is atomic.

mod holds;

pub use holds::{
    KeyAt, KeyDigest, blocked_among, blocked_keys, first_blocking, held_behind, held_count, held_counts,
    held_of, key_digest,
};

use super::columns::Columns;
use super::headers::{headers_column, headers_json};
use super::{Database, DbError, DecodeError, SqlValue, Tx, in_list, now_ms};
use std::collections::BTreeMap;

/// Why an event was parked. The kind is stable text for scripts; the message is for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasonKind {
    /// No usable event id: the record cannot be deduplicated, so it is never run.
    EventId,
    /// The handler returned `handler-error::reject`.
    Rejected,
    /// The handler kept failing with `retry`, a trap or a limit until `max_attempts`.
    RetriesExhausted,
    /// The event broke a limit before the handler ran (its payload size).
    Limit,
    /// The record was too large to keep whole (see [`crate::record::Cut`]):
    /// never run, and its letter keeps only its first part, so it cannot be
    /// replayed. (A kind of its own: a host from before it would replay a
    /// `limit` letter, cut or not.)
    Cut,
    /// The host's own rows were not intact after the handler ran.
    SandboxViolation,
    /// The database kept refusing the host's own statements for the event
    /// (not an outage: see `DbError::is_transient`).
    HostError,
    /// Never run: with `ordering = "key"`, an earlier record of its key is
    /// parked, and this one waits behind it (released when that one is
    /// replayed or discarded).
    Held,
}

impl ReasonKind {
    pub const ALL: [ReasonKind; 8] = [
        ReasonKind::EventId,
        ReasonKind::Rejected,
        ReasonKind::RetriesExhausted,
        ReasonKind::Limit,
        ReasonKind::Cut,
        ReasonKind::SandboxViolation,
        ReasonKind::HostError,
        ReasonKind::Held,
    ];

    /// The kind stored as `text`; `None` for text no version of the host writes.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ReasonKind::EventId => "event-id",
            ReasonKind::Rejected => "rejected",
            ReasonKind::RetriesExhausted => "retries-exhausted",
            ReasonKind::Limit => "limit",
            ReasonKind::Cut => "cut",
            ReasonKind::SandboxViolation => "sandbox-violation",
            ReasonKind::HostError => "host-error",
            ReasonKind::Held => "held",
        }
    }
}

impl std::fmt::Display for ReasonKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Scripts and tests compare the stable text.
impl PartialEq<&str> for ReasonKind {
    fn eq(&self, text: &&str) -> bool {
        self.as_str() == *text
    }
}

impl serde::Serialize for ReasonKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
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
    /// The record's size as consumed, when the letter keeps only its first
    /// part (see [`crate::record::Cut`]); `None`: the letter keeps it whole.
    pub record_bytes: Option<usize>,
}

const INSERT: &str = r#"INSERT INTO dead_letters
(handler, event_id, topic, partition, "offset", key, payload, headers, reason_kind, reason,
 attempts, handler_version, first_failed_at, last_failed_at, record_bytes)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"#;

/// A reason as the database can store it: PostgreSQL text cannot hold NUL,
/// and a reason often quotes what a guest or a record said; at most
/// [`MAX_REASON_BYTES`] of it (a list shows 1,000 letters with their
/// reasons, and a reason that quoted a whole record made a list gigabytes).
fn storable(reason: &str) -> String {
    // Replaced first, then cut: a NUL becomes three bytes.
    let replaced = reason.replace('\0', "\u{fffd}");
    let mut end = replaced.len().min(MAX_REASON_BYTES);
    while !replaced.is_char_boundary(end) {
        end -= 1;
    }
    let mut stored = replaced[..end].to_owned();
    if end < replaced.len() {
        stored.push_str(" [cut]");
    }
    stored
}

/// The longest reason a dead letter keeps, in bytes.
pub const MAX_REASON_BYTES: usize = 4096;

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
        storable(letter.reason).into(),
        letter.attempts.into(),
        letter.handler_version.into(),
        letter.first_failed_at.into(),
        now_ms().into(),
        letter.record_bytes.map_or(SqlValue::Null, |bytes| {
            i64::try_from(bytes).unwrap_or(i64::MAX).into()
        }),
    ];
    tx.host_write(INSERT, INSERT_GATE, &params).await
}

/// [`INSERT`] through its PostgreSQL gate (`$1` is the host's key).
const INSERT_GATE: &str = "SELECT inboxd_gate.dead_letter($1, $2, $3, $4, $5::pg_catalog.int4, $6, $7, $8, \
     $9, $10, $11, $12::pg_catalog.int4, $13, $14, $15, $16)";

/// A dead letter as stored, for inspection (`inboxd dlq`) and replay.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    pub id: i64,
    pub handler: String,
    pub event_id: Option<String>,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    #[serde(skip)]
    pub key: Option<Vec<u8>>,
    #[serde(skip)]
    pub payload: Vec<u8>,
    #[serde(skip)]
    pub headers: Vec<(String, Vec<u8>)>,
    pub kind: ReasonKind,
    pub reason: String,
    pub attempts: i64,
    pub handler_version: Option<String>,
    pub first_failed_at: i64,
    pub last_failed_at: i64,
    pub resolution: Option<String>,
    pub resolved_at: Option<i64>,
    /// Set when the letter keeps only the first part of its record: the
    /// record's size as consumed. Such a letter cannot be replayed.
    pub record_bytes: Option<i64>,
}

/// Which dead letters to read.
#[derive(Debug, Default)]
pub struct Filter<'a> {
    pub handler: Option<&'a str>,
    /// Only these handlers' (a team token's scope); `None`: every handler.
    pub handlers: Option<&'a [String]>,
    pub ids: Option<&'a [i64]>,
    pub kind: Option<ReasonKind>,
    /// Also those already replayed or discarded.
    pub include_resolved: bool,
    /// At most this many, oldest first.
    pub limit: Option<u32>,
    /// Leave out key, payload and headers (a list that shows none of them).
    pub without_record: bool,
    /// With `without_record`: keep the key, which finds what key order
    /// holds behind a letter (discarding needs no more).
    pub keep_key: bool,
    /// Only those with a greater id: the next page of a read in pages.
    pub after_id: Option<i64>,
}

const COLUMNS: &str = r#"id, handler, event_id, topic, partition, "offset", key, payload, headers, reason_kind,
    reason, attempts, handler_version, first_failed_at, last_failed_at, resolution, resolved_at, record_bytes"#;

/// [`COLUMNS`] without the record's key, payload and headers: for lists,
/// which show none of them and would otherwise read every payload.
const SUMMARY_COLUMNS: &str = r#"id, handler, event_id, topic, partition, "offset", NULL, NULL, NULL, reason_kind,
    reason, attempts, handler_version, first_failed_at, last_failed_at, resolution, resolved_at, record_bytes"#;

/// [`SUMMARY_COLUMNS`] with the key.
const KEYED_SUMMARY_COLUMNS: &str = r#"id, handler, event_id, topic, partition, "offset", key, NULL, NULL, reason_kind,
    reason, attempts, handler_version, first_failed_at, last_failed_at, resolution, resolved_at, record_bytes"#;

/// One dead letter; `None` for a reason kind this version does not know
/// (only a newer host writes one: during a rolling upgrade it is skipped
/// with a warning rather than failing every list). Anything else that
/// cannot be read is an error.
fn decode(row: Vec<SqlValue>) -> Result<Option<Row>, DecodeError> {
    let mut c = Columns::new("dead_letters row", row);
    let id = c.int("id")?;
    let handler = c.text("handler")?;
    let event_id = c.opt_text("event_id")?;
    let topic = c.text("topic")?;
    let partition = c.int("partition")?;
    let partition = i32::try_from(partition)
        .map_err(|_| c.wrong("partition", "a partition number", "a larger integer"))?;
    let offset = c.int("offset")?;
    let key = c.opt_blob("key")?;
    let payload = c.opt_blob("payload")?.unwrap_or_default();
    let headers = headers_column(&mut c, "headers")?;
    let kind = c.text("kind")?;
    let Some(kind) = ReasonKind::parse(&kind) else {
        tracing::warn!(
            id,
            kind,
            "a dead letter whose reason kind this version does not know is not shown"
        );
        return Ok(None);
    };
    Ok(Some(Row {
        id,
        handler,
        event_id,
        topic,
        partition,
        offset,
        key,
        payload,
        headers,
        kind,
        reason: c.text("reason")?,
        attempts: c.int("attempts")?,
        handler_version: c.opt_text("handler_version")?,
        first_failed_at: c.int("first_failed_at")?,
        last_failed_at: c.int("last_failed_at")?,
        resolution: c.opt_text("resolution")?,
        resolved_at: c.opt_int("resolved_at")?,
        record_bytes: c.opt_int("record_bytes")?,
    }))
}

pub async fn find(db: &Database, filter: &Filter<'_>) -> Result<Vec<Row>, DbError> {
    let columns = match (filter.without_record, filter.keep_key) {
        (false, _) => COLUMNS,
        (true, false) => SUMMARY_COLUMNS,
        (true, true) => KEYED_SUMMARY_COLUMNS,
    };
    let mut sql = format!("SELECT {columns} FROM dead_letters WHERE 1 = 1");
    let mut params: Vec<SqlValue> = Vec::new();
    if let Some(handler) = filter.handler {
        params.push(handler.into());
        sql.push_str(&format!(" AND handler = ${}", params.len()));
    }
    if let Some(handlers) = filter.handlers {
        let scope = in_list("handler", &mut params, handlers.iter().map(String::as_str));
        sql.push_str(&format!(" AND {scope}"));
    }
    if let Some(kind) = filter.kind {
        params.push(kind.as_str().into());
        sql.push_str(&format!(" AND reason_kind = ${}", params.len()));
    }
    if let Some(ids) = filter.ids {
        // Ids are integers, so listing them inline is safe and works on both backends.
        let list: Vec<String> = ids.iter().map(i64::to_string).collect();
        sql.push_str(&format!(
            " AND id IN ({})",
            if list.is_empty() {
                "NULL".into()
            } else {
                list.join(", ")
            }
        ));
    }
    if let Some(after) = filter.after_id {
        params.push(after.into());
        sql.push_str(&format!(" AND id > ${}", params.len()));
    }
    if !filter.include_resolved {
        sql.push_str(" AND resolution IS NULL");
    }
    sql.push_str(" ORDER BY id");
    if let Some(limit) = filter.limit {
        sql.push_str(&format!(" LIMIT {limit}"));
    }
    let mut letters = Vec::new();
    for row in db.query(&sql, &params).await? {
        letters.extend(decode(row)?);
    }
    Ok(letters)
}

/// The ids of a handler's parked dead letters, oldest first, after
/// `after_id` and at most `limit`, and nothing else: what replaying all of
/// them reads a page at a time (a summary is up to 2.3 KB, and a handler
/// may park millions).
pub async fn parked_ids(
    db: &Database,
    handler: &str,
    after_id: Option<i64>,
    limit: u32,
) -> Result<Vec<i64>, DbError> {
    let rows = db
        .query(
            &format!(
                "SELECT id FROM dead_letters WHERE handler = $1 AND resolution IS NULL AND id > $2 \
                 ORDER BY id LIMIT {limit}"
            ),
            &[handler.into(), after_id.unwrap_or(0).into()],
        )
        .await?;
    Ok(super::columns::ints(rows, "dead_letters row", "id")?)
}

/// Marks a parked dead letter resolved; `false` if it already was (another
/// operator got there first).
pub async fn resolve(tx: &mut Tx, id: i64, resolution: &str) -> Result<bool, DbError> {
    let params = [id.into(), resolution.into(), now_ms().into()];
    let changed = tx
        .host_count(
            "UPDATE dead_letters SET resolution = $2, resolved_at = $3 WHERE id = $1 AND resolution IS NULL",
            "SELECT inboxd_gate.resolve_dead_letter($1, $2, $3, $4)",
            &params,
        )
        .await?;
    Ok(changed == 1)
}

/// Records another failed attempt (a replay that failed again).
pub async fn record_failure(db: &Database, id: i64, reason: &str) -> Result<(), DbError> {
    let mut tx = db.begin().await?;
    tx.execute(
        "UPDATE dead_letters SET attempts = attempts + 1, last_failed_at = $2, reason = $3 WHERE id = $1",
        &[id.into(), now_ms().into(), storable(reason).into()],
    )
    .await?;
    tx.commit().await
}

/// Parked (unresolved) dead letters per handler.
pub async fn parked_counts(db: &Database) -> Result<BTreeMap<String, i64>, DbError> {
    db.counts_by_handler(
        "SELECT handler, COUNT(*) FROM dead_letters WHERE resolution IS NULL GROUP BY handler",
    )
    .await
}

/// Bytes as text where they are UTF-8 without control characters (tab and
/// line breaks aside), else their length and hex: a control character is
/// six bytes once in JSON (`\u0001`), so a payload of them made a detail
/// six times its size where hex is two (the twentieth read).
pub fn bytes_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text)
            if !text
                .chars()
                .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r')) =>
        {
            text.to_owned()
        }
        Ok(_) => format!("<{} bytes, not text> {}", bytes.len(), hex::encode(bytes)),
        Err(_) => format!("<{} bytes, not UTF-8> {}", bytes.len(), hex::encode(bytes)),
    }
}

impl Row {
    /// The dead letter in full, with key, payload and headers as text where
    /// they are UTF-8 ([`bytes_text`]) and the payload in hex as well: what
    /// `dlq show --json`, the API and the console show. Serialized as it
    /// is written out (a `serde_json::Value` of it held a map per header:
    /// hundreds of megabytes for a record of many small headers, the
    /// seventeenth read).
    pub fn detail_json(&self) -> Detail<'_> {
        Detail {
            row: self,
            key: self.key.as_deref().map(bytes_text),
            payload: bytes_text(&self.payload),
            payload_hex: hex::encode(&self.payload),
            headers: self
                .headers
                .iter()
                .map(|(name, value)| HeaderText {
                    name,
                    value: bytes_text(value),
                })
                .collect(),
        }
    }
}

/// A dead letter in full: see [`Row::detail_json`].
#[derive(serde::Serialize)]
pub struct Detail<'a> {
    #[serde(flatten)]
    row: &'a Row,
    key: Option<String>,
    payload: String,
    payload_hex: String,
    headers: Vec<HeaderText<'a>>,
}

#[derive(serde::Serialize)]
struct HeaderText<'a> {
    name: &'a str,
    value: String,
}

/// A dead letter as listed for tests: the parked ones of a handler.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub id: i64,
    pub event_id: Option<String>,
    pub partition: i32,
    pub offset: i64,
    pub kind: ReasonKind,
    pub reason: String,
    pub attempts: i64,
}

pub async fn list(db: &Database, handler: &str) -> Result<Vec<Summary>, DbError> {
    let rows = find(
        db,
        &Filter {
            handler: Some(handler),
            ..Filter::default()
        },
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Summary {
            id: r.id,
            event_id: r.event_id,
            partition: r.partition,
            offset: r.offset,
            kind: r.kind,
            reason: r.reason,
            attempts: r.attempts,
        })
        .collect())
}

#[cfg(test)]
mod tests;
