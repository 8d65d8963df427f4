//! The `outbox` table and its relay bookkeeping.
//!
//! A handler's published messages are inserted here in the handler's own
//! transaction, so they exist exactly when its writes commit. Each message
//! belongs to a bucket (a stable hash of handler and key): a bucket's messages
//! are relayed in insert order (`seq`) by whichever host holds the bucket's
//! lease. For the messages of one partition's events (its batches commit one
//! after another) that is commit order.
//!
//! A message the broker will never accept is *parked* (`parked_at`, with the
//! reason in `last_error`): the relay skips it from then on and the messages
//! after it in its bucket go on (the parked one is out of order by
//! definition). `inboxd outbox` and the admin API list parked messages and
//! re-queue or discard them. The relay reads at most a few hundred messages
//! per bucket per cycle, so one bucket's long backlog never starves the others.

mod pending;

pub use pending::{MAX_STORED_BYTES, Read, pending, stored_bytes};

use super::columns::{Columns, ints};
use super::headers::{headers_column, headers_json};
use super::{Backend, Database, DbError, DecodeError, PgArray, SqlValue, Tx, now_ms};
use std::collections::BTreeMap;

/// Buckets of relay ownership and ordering. Fixed: it is baked into the rows.
pub const BUCKETS: u64 = 64;

/// A message a handler published, not yet written.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    /// A UUIDv7, sent as the message's `event_id` header.
    pub id: String,
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
}

/// What the host holds for each message besides its parts (the struct, its
/// vectors' headers, a row's bookkeeping), in [`NewMessage::bytes`].
const MESSAGE_OVERHEAD: usize = 128;

impl NewMessage {
    /// What the host holds for it, in bytes: key, payload, headers with
    /// their overhead, id, topic, and the message's own overhead. What bounds
    /// a batch's held messages and a PostgreSQL statement, and what the relay
    /// counts in flight. (Key, payload and header names and values alone
    /// counted 1,000 messages of 64 empty headers as nothing: 3 MB held.)
    pub fn bytes(&self) -> usize {
        MESSAGE_OVERHEAD
            + self.id.len()
            + self.topic.len()
            + self.payload.len()
            + self.key.as_ref().map_or(0, Vec::len)
            + crate::record::headers_bytes(&self.headers)
    }
}

/// The bucket of a (handler, key): FNV-1a, stable across hosts and versions.
pub fn bucket(handler: &str, key: Option<&[u8]>) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in handler
        .bytes()
        .chain([0])
        .chain(key.unwrap_or_default().iter().copied())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % BUCKETS) as i64
}

/// A batch writes the messages its events published once they reach this
/// many bytes ([`NewMessage::bytes`]), in its transaction, instead of
/// holding them to its end: 100 events of 8 MiB each were 1 GB held until
/// the commit. One PostgreSQL statement's worth.
pub const BATCH_HELD_BYTES: usize = STATEMENT_BYTES_POSTGRES;

/// Messages per INSERT statement on SQLite, at most.
const INSERT_CHUNK: usize = 64;
const COLUMNS: usize = 9;

/// Writes the messages in the caller's transaction. Their `seq` (insert
/// order) is the relay's order within a bucket; no row is locked for it, so
/// the batches of different partitions never wait for each other here
/// (see migrations/*/0002_outbox_insert_order.sql).
///
/// A batch's messages never go one statement each (a round trip each on
/// PostgreSQL): on PostgreSQL they go in one statement per 16 MiB
/// ([`INSERT_POSTGRES`]), on SQLite in a few multi-row INSERTs. Chunks are
/// powers of two (100 messages: 64 + 32 + 4), so a handful of statement
/// texts cover every batch and stay prepared.
pub async fn insert(tx: &mut Tx, handler: &str, messages: &[NewMessage]) -> Result<(), DbError> {
    let created_at = now_ms();
    if messages.is_empty() {
        return Ok(());
    }
    if tx.backend() == Backend::Postgres {
        return insert_postgres(tx, handler, created_at, messages).await;
    }
    let mut rest = messages;
    while !rest.is_empty() {
        let take = INSERT_CHUNK.min(1 << rest.len().ilog2());
        let (chunk, tail) = rest.split_at(take);
        let mut params = Vec::with_capacity(chunk.len() * COLUMNS);
        for message in chunk {
            let headers = headers_json(&message.headers);
            let bytes = pending::stored_bytes(message, &headers) as i64;
            params.extend([
                message.id.as_str().into(),
                handler.into(),
                message.topic.as_str().into(),
                message.key.as_deref().map_or(SqlValue::Null, SqlValue::from),
                message.payload.as_slice().into(),
                headers.into(),
                bucket(handler, message.key.as_deref()).into(),
                created_at.into(),
                bytes.into(),
            ]);
        }
        tx.execute(&insert_sql(chunk.len()), &params).await?;
        rest = tail;
    }
    Ok(())
}

/// SQLite, with anonymous parameters (see [`anonymous_rows`](crate::db::anonymous_rows)).
fn insert_sql(rows: usize) -> String {
    format!(
        "INSERT INTO outbox (id, handler, topic, key, payload, headers, bucket, created_at, bytes) VALUES {}",
        crate::db::anonymous_rows(rows, COLUMNS)
    )
}

/// PostgreSQL: a batch's messages in one call of the
/// `inboxd_gate.outbox_insert_rows` gate (see `db::logins`), whose text never
/// changes (so it stays prepared), the messages coming as arrays, a column
/// each, in binary. The gate feeds the rows to its INSERT in the handler's
/// publish order (`WITH ORDINALITY`), the order `seq` numbers them in.
/// (The rows went as one JSON text, keys and payloads in hex, until issue
/// 24: PostgreSQL's JSON parse and hex decode were a third of the insert.)
const INSERT_POSTGRES: &str = "SELECT inboxd_gate.outbox_insert_rows($1, $2, $3, $4::pg_catalog.text[], \
     $5::pg_catalog.text[], $6::pg_catalog.bytea[], $7::pg_catalog.bytea[], $8::pg_catalog.text[], \
     $9::pg_catalog.int8[])";

/// Bytes of messages per PostgreSQL statement, at most (a larger message
/// goes alone). PostgreSQL refuses a protocol message over 1 GB: without a
/// bound, a handler within its ceilings (8 MiB of outbox per event, 1,000
/// events per batch) could make a batch's insert fail at every retry, and
/// the host would hold several copies of it.
const STATEMENT_BYTES_POSTGRES: usize = 16 << 20;

async fn insert_postgres(
    tx: &mut Tx,
    handler: &str,
    created_at: i64,
    messages: &[NewMessage],
) -> Result<(), DbError> {
    let mut rest = messages;
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(statement_share(rest, STATEMENT_BYTES_POSTGRES));
        let headers = postgres_headers(chunk);
        let arrays = postgres_columns(handler, chunk, &headers);
        let params = [handler.into(), created_at.into()];
        tx.gate_arrays(INSERT_POSTGRES, &params, &arrays).await?;
        rest = tail;
    }
    Ok(())
}

/// The headers of each message as PostgreSQL stores them, for [`postgres_columns`].
pub(in crate::db) fn postgres_headers(messages: &[NewMessage]) -> Vec<String> {
    messages.iter().map(|m| headers_json(&m.headers)).collect()
}

/// `messages` as the PostgreSQL gates take them: id, topic, key, payload,
/// headers (`headers`, from [`postgres_headers`]) and bucket, an array each.
pub(in crate::db) fn postgres_columns<'m>(
    handler: &str,
    messages: &'m [NewMessage],
    headers: &'m [String],
) -> [PgArray<'m>; 6] {
    [
        PgArray::Texts(messages.iter().map(|m| m.id.as_str()).collect()),
        PgArray::Texts(messages.iter().map(|m| m.topic.as_str()).collect()),
        PgArray::Blobs(messages.iter().map(|m| m.key.as_deref()).collect()),
        PgArray::Blobs(messages.iter().map(|m| Some(m.payload.as_slice())).collect()),
        PgArray::Texts(headers.iter().map(String::as_str).collect()),
        PgArray::Ints(
            messages
                .iter()
                .map(|m| bucket(handler, m.key.as_deref()))
                .collect(),
        ),
    ]
}

/// Whether `messages` go to PostgreSQL in one statement.
pub(in crate::db) fn one_postgres_statement(messages: &[NewMessage]) -> bool {
    messages.is_empty() || statement_share(messages, STATEMENT_BYTES_POSTGRES) == messages.len()
}

/// How many of `messages` (at least one) go in one statement of at most
/// `limit` bytes of message ([`NewMessage::bytes`]).
fn statement_share(messages: &[NewMessage], limit: usize) -> usize {
    let mut bytes = 0;
    let over = messages.iter().position(|message| {
        bytes += message.bytes();
        bytes > limit
    });
    over.map_or(messages.len(), |first_over| first_over.max(1))
}

/// An unpublished message, as the relay reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub seq: i64,
    pub bucket: i64,
    /// The handler that published it.
    pub handler: String,
    pub message: NewMessage,
}

/// Takes (or renews) the leases of every bucket that is free or already ours;
/// returns the buckets this owner now holds.
pub async fn lease(db: &Database, owner: &str, lease_ms: i64) -> Result<Vec<i64>, DbError> {
    let now = now_ms();
    let mut tx = db.begin_write().await?;
    let rows = tx
        .query(
            "UPDATE outbox_leases SET owner = $1, lease_until = $2
             WHERE owner = $1 OR lease_until < $3 RETURNING bucket",
            &[owner.into(), (now + lease_ms).into(), now.into()],
        )
        .await?;
    tx.commit().await?;
    Ok(ints(rows, "outbox_leases row", "bucket")?)
}

/// Gives this owner's leases up at once (a clean shutdown), so another host
/// need not wait for them to run out.
pub async fn release(db: &Database, owner: &str) -> Result<(), DbError> {
    let mut tx = db.begin_write().await?;
    tx.execute(
        "UPDATE outbox_leases SET owner = NULL, lease_until = 0 WHERE owner = $1",
        &[owner.into()],
    )
    .await?;
    tx.commit().await
}

/// What becomes of a message once the broker has it (`outbox.retention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Deleted at once: the default, since nothing reads a sent message
    /// again (the consumer's inbox dedups a copy sent twice).
    Delete,
    /// Kept, marked `published_at`, until `outbox.retention` has passed.
    Keep,
}

impl Settle {
    /// `outbox.retention`: zero deletes, anything longer keeps.
    pub fn after(retention: std::time::Duration) -> Self {
        if retention.is_zero() {
            Self::Delete
        } else {
            Self::Keep
        }
    }
}

/// Settles messages sent: deletes or marks them ([`Settle`]). One statement
/// text whatever the list (an array on PostgreSQL, a JSON array on SQLite),
/// so it is prepared once per connection; on SQLite it waits its turn behind
/// the pipeline's writers rather than in SQLite's busy handler.
///
/// Why deleting is the default (issue 24): `published_at` is in the pending
/// index's predicate, so PostgreSQL cannot mark a row in place (no HOT
/// update): the mark writes a new row version and an entry in every index
/// of the table. Measured on PostgreSQL 15, 100,000 rows in statements of
/// 100: marking 1.9-2.0 s, deleting 0.24-0.27 s, and a kept row is deleted
/// by the purge later anyway.
pub async fn settle_sent(db: &Database, seqs: &[i64], settle: Settle) -> Result<(), DbError> {
    if seqs.is_empty() {
        return Ok(());
    }
    let (sql, list) = match (db.backend(), settle) {
        (Backend::Postgres, Settle::Keep) => (
            "UPDATE outbox SET published_at = $1 WHERE seq = ANY($2::int8[])",
            int_array(seqs),
        ),
        (Backend::Postgres, Settle::Delete) => {
            ("DELETE FROM outbox WHERE seq = ANY($1::int8[])", int_array(seqs))
        }
        (Backend::Sqlite, Settle::Keep) => (
            "UPDATE outbox SET published_at = $1 WHERE seq IN (SELECT value FROM json_each($2))",
            format!("[{}]", join(seqs)),
        ),
        (Backend::Sqlite, Settle::Delete) => (
            "DELETE FROM outbox WHERE seq IN (SELECT value FROM json_each($1))",
            format!("[{}]", join(seqs)),
        ),
    };
    let params = match settle {
        Settle::Keep => vec![now_ms().into(), list.into()],
        Settle::Delete => vec![list.into()],
    };
    let mut tx = db.begin_write().await?;
    tx.execute(sql, &params).await?;
    tx.commit().await
}

/// A PostgreSQL array literal of integers (`{1,2,3}`), bound as text and
/// cast in the statement: a fixed text for any number of values.
fn int_array(values: &[i64]) -> String {
    format!("{{{}}}", join(values))
}

fn join(values: &[i64]) -> String {
    values.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

pub async fn record_failure(db: &Database, seq: i64, error: &str) -> Result<(), DbError> {
    let mut tx = db.begin_write().await?;
    tx.execute(
        "UPDATE outbox SET attempts = attempts + 1, last_error = $2 WHERE seq = $1",
        &[seq.into(), error.into()],
    )
    .await?;
    tx.commit().await
}

/// Parks a message the broker will never accept: the relay skips it from now
/// on, and `reason` says why. Returns false if it was published meanwhile.
pub async fn park(db: &Database, seq: i64, reason: &str) -> Result<bool, DbError> {
    Ok(park_all(db, &[(seq, reason.to_owned())]).await? == 1)
}

/// Parks messages as [`park`] does, all in one write: one statement per
/// distinct reason, each with one fixed text whatever the list (as
/// [`settle_sent`]). Returns how many were parked. A relay round parks up to
/// its whole read (a team chooses how many of its messages go to a topic
/// that is quarantined), and a write each held every bucket meanwhile.
pub async fn park_all(db: &Database, parked: &[(i64, String)]) -> Result<u64, DbError> {
    if parked.is_empty() {
        return Ok(0);
    }
    let mut by_reason: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (seq, reason) in parked {
        by_reason.entry(reason.as_str()).or_default().push(*seq);
    }
    let (sql, list): (&str, fn(&[i64]) -> String) = match db.backend() {
        Backend::Postgres => (
            "UPDATE outbox SET attempts = attempts + 1, last_error = $1, parked_at = $2
             WHERE seq = ANY($3::int8[]) AND published_at IS NULL AND parked_at IS NULL",
            int_array,
        ),
        Backend::Sqlite => (
            "UPDATE outbox SET attempts = attempts + 1, last_error = $1, parked_at = $2
             WHERE seq IN (SELECT value FROM json_each($3)) AND published_at IS NULL AND parked_at IS NULL",
            |seqs| format!("[{}]", join(seqs)),
        ),
    };
    let at = now_ms();
    let mut count = 0;
    let mut tx = db.begin_write().await?;
    for (reason, seqs) in by_reason {
        count += tx
            .execute(sql, &[reason.into(), at.into(), list(&seqs).into()])
            .await?;
    }
    tx.commit().await?;
    Ok(count)
}

/// A parked outbox message, for `inboxd outbox` and the admin API.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Parked {
    pub seq: i64,
    pub handler: String,
    /// The message's event id (its `event_id` header when sent).
    pub id: String,
    pub topic: String,
    #[serde(skip)]
    pub key: Option<Vec<u8>>,
    #[serde(skip)]
    pub payload: Vec<u8>,
    #[serde(skip)]
    pub headers: Vec<(String, Vec<u8>)>,
    /// The payload's size in bytes (also when the payload was left out).
    pub payload_bytes: i64,
    pub attempts: i64,
    /// Why it was parked (or the last failure before that).
    pub reason: Option<String>,
    pub created_at: i64,
    pub parked_at: i64,
    pub discarded_at: Option<i64>,
}

impl Parked {
    /// The message without key, payload and headers (`payload_bytes` says
    /// how large it is): what a list shows.
    pub fn summary_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// The message in full, with key, payload and header values as text where
    /// they are UTF-8 (else hex).
    pub fn detail_json(&self) -> serde_json::Value {
        let text = |bytes: &[u8]| match std::str::from_utf8(bytes) {
            Ok(text) => serde_json::json!(text),
            Err(_) => serde_json::json!({
                "hex": bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
            }),
        };
        let mut value = self.summary_json();
        value["key"] = self.key.as_deref().map_or(serde_json::Value::Null, text);
        value["payload"] = text(&self.payload);
        value["headers"] = self
            .headers
            .iter()
            .map(|(name, v)| serde_json::json!({ "name": name, "value": text(v) }))
            .collect();
        value
    }
}

/// Which parked messages to read.
#[derive(Debug, Default)]
pub struct ParkedFilter<'a> {
    pub handler: Option<&'a str>,
    pub seqs: Option<&'a [i64]>,
    /// Also those already discarded.
    pub include_discarded: bool,
    /// At most this many (the oldest first); 0 means 1000.
    pub limit: i64,
    /// Leave out key, payload and headers: a list, which shows none of them.
    /// (A thousand parked messages of a megabyte each would otherwise be
    /// read whole, and as JSON text several times that, to show their ids.)
    pub without_record: bool,
}

const PARKED_COLUMNS: &str = "seq, handler, id, topic, key, payload, headers, \
    CAST(COALESCE(length(payload), 0) AS BIGINT), attempts, last_error, created_at, parked_at, discarded_at";

/// [`PARKED_COLUMNS`] without the message's key, payload and headers.
const PARKED_SUMMARY_COLUMNS: &str = "seq, handler, id, topic, NULL, NULL, NULL, \
    CAST(COALESCE(length(payload), 0) AS BIGINT), attempts, last_error, created_at, parked_at, discarded_at";

pub async fn parked(db: &Database, filter: &ParkedFilter<'_>) -> Result<Vec<Parked>, DbError> {
    let columns = if filter.without_record {
        PARKED_SUMMARY_COLUMNS
    } else {
        PARKED_COLUMNS
    };
    let mut sql = format!("SELECT {columns} FROM outbox WHERE parked_at IS NOT NULL");
    let mut params: Vec<SqlValue> = Vec::new();
    if let Some(handler) = filter.handler {
        params.push(handler.into());
        sql.push_str(&format!(" AND handler = ${}", params.len()));
    }
    if let Some(seqs) = filter.seqs {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        // Integers, safe inline.
        let list: Vec<String> = seqs.iter().map(i64::to_string).collect();
        sql.push_str(&format!(" AND seq IN ({})", list.join(", ")));
    }
    if !filter.include_discarded {
        sql.push_str(" AND discarded_at IS NULL");
    }
    let limit = if filter.limit > 0 { filter.limit } else { 1000 };
    params.push(limit.into());
    sql.push_str(&format!(" ORDER BY seq LIMIT ${}", params.len()));
    let rows = db.query(&sql, &params).await?;
    let parked = rows.into_iter().map(|row| {
        let mut c = Columns::new("outbox row", row);
        Ok(Parked {
            seq: c.int("seq")?,
            handler: c.text("handler")?,
            id: c.text("id")?,
            topic: c.text("topic")?,
            key: c.opt_blob("key")?,
            payload: c.opt_blob("payload")?.unwrap_or_default(),
            headers: headers_column(&mut c, "headers")?,
            payload_bytes: c.int("payload bytes")?,
            attempts: c.int("attempts")?,
            reason: c.opt_text("last_error")?,
            created_at: c.int("created_at")?,
            parked_at: c.int("parked_at")?,
            discarded_at: c.opt_int("discarded_at")?,
        })
    });
    Ok(parked.collect::<Result<_, DecodeError>>()?)
}

/// Parked (not discarded) messages per handler.
pub async fn parked_counts(db: &Database) -> Result<BTreeMap<String, i64>, DbError> {
    db.counts_by_handler(
        "SELECT handler, COUNT(*) FROM outbox
         WHERE parked_at IS NOT NULL AND discarded_at IS NULL GROUP BY handler",
    )
    .await
}

/// Messages waiting for the relay, per handler.
pub async fn backlog_counts(db: &Database) -> Result<BTreeMap<String, i64>, DbError> {
    db.counts_by_handler(
        "SELECT handler, COUNT(*) FROM outbox
         WHERE published_at IS NULL AND parked_at IS NULL GROUP BY handler",
    )
    .await
}

/// When the oldest message waiting for the relay was written, per handler:
/// how far behind the relay is.
pub async fn oldest_pending(db: &Database) -> Result<BTreeMap<String, i64>, DbError> {
    db.counts_by_handler(
        "SELECT handler, MIN(created_at) FROM outbox
         WHERE published_at IS NULL AND parked_at IS NULL GROUP BY handler",
    )
    .await
}

/// Re-queues the named parked messages of a handler: the relay sends them
/// next in their buckets, in their old places. Answers those re-queued
/// (not one discarded or no longer parked).
pub async fn requeue(db: &Database, handler: &str, seqs: &[i64]) -> Result<Vec<i64>, DbError> {
    if seqs.is_empty() {
        return Ok(Vec::new());
    }
    let list: Vec<String> = seqs.iter().map(i64::to_string).collect();
    let sql = format!("{REQUEUE} AND seq IN ({}) RETURNING seq", list.join(", "));
    // A write like the pipeline's: on SQLite it queues behind them rather
    // than failing on a locked database (and holding a connection meanwhile).
    let mut tx = db.begin_write().await?;
    let rows = tx.query(&sql, &[handler.into()]).await?;
    tx.commit().await?;
    Ok(ints(rows, "outbox row", "seq")?)
}

/// Re-queues every parked message of a handler, answering how many: a
/// handler may have millions parked, and listing them answered one seq per
/// message (issue 23, fifth read). A page at a time, each in its own write
/// (on SQLite through the writer queue): one UPDATE of a million rows held
/// SQLite's only writer 1.5 s and more (the tenth read). A page is at most
/// [`REQUEUE_PAGE`] messages and [`REQUEUE_PAGE_BYTES`] of them (SQLite
/// writes an updated row whole: a thousand 8 MiB messages were 8 GB in one
/// write, the seventeenth read). Pages go up in `seq`, so a message the
/// relay parks again meanwhile is not re-queued twice and the walk ends.
pub async fn requeue_all(db: &Database, handler: &str) -> Result<u64, DbError> {
    Ok(requeue_in_pages(db, handler, REQUEUE_PAGE_BYTES).await?.0)
}

/// [`requeue_all`] in pages of at most `page_bytes` (and always at least one
/// message): how many were re-queued, in how many pages.
async fn requeue_in_pages(db: &Database, handler: &str, page_bytes: i64) -> Result<(u64, u64), DbError> {
    // A message's size as the relay counts it (`pending`), without reading
    // its payload: PostgreSQL knows a value's length without detoasting it,
    // SQLite stores the size (0009) or reads a blob's length from the row's
    // header. `before` is what precedes a message in its page.
    let size = match db.backend() {
        Backend::Postgres => {
            "octet_length(payload)::int8 + COALESCE(octet_length(key)::int8, 0) + 2 * octet_length(headers)::int8"
        }
        Backend::Sqlite => {
            "COALESCE(bytes, length(payload) + COALESCE(length(key), 0) + 2 * length(CAST(headers AS BLOB)))"
        }
    };
    // The window sums only the page's candidates (a window over the whole
    // parked set would be computed before the LIMIT, at every page).
    let sql = format!(
        "{REQUEUE} AND seq IN (SELECT seq FROM (SELECT seq, SUM(size) OVER (ORDER BY seq) - size AS before
             FROM (SELECT seq, {size} AS size FROM outbox WHERE handler = $1 AND parked_at IS NOT NULL
                   AND discarded_at IS NULL AND published_at IS NULL AND seq > $2 AND seq <= $4
                   ORDER BY seq LIMIT {REQUEUE_PAGE}) AS candidates) AS page
           WHERE before < $3)
         RETURNING seq"
    );
    // What is parked now, and no more: messages the relay parks while the
    // walk goes on would keep it going for as long as a team publishes to a
    // topic that is missing (the eighteenth read).
    let last = db
        .query(
            "SELECT MAX(seq) FROM outbox WHERE handler = $1 AND parked_at IS NOT NULL AND discarded_at IS NULL",
            &[handler.into()],
        )
        .await?
        .into_iter()
        .next()
        .and_then(|row| row.first().and_then(SqlValue::as_i64));
    let Some(last) = last else {
        return Ok((0, 0));
    };
    let (mut after, mut count, mut pages) = (0i64, 0u64, 0u64);
    while after < last {
        let mut tx = db.begin_write().await?;
        let rows = tx
            .query(
                &sql,
                &[handler.into(), after.into(), page_bytes.into(), last.into()],
            )
            .await?;
        tx.commit().await?;
        let seqs = ints(rows, "outbox row", "seq")?;
        match seqs.iter().max() {
            Some(&high) => (after, count, pages) = (high, count + seqs.len() as u64, pages + 1),
            None => break,
        }
    }
    Ok((count, pages))
}

/// Parked messages re-queued per write by [`requeue_all`], at most.
pub const REQUEUE_PAGE: i64 = 1_000;

/// The bytes of parked messages re-queued per write by [`requeue_all`], at
/// most (unless one message alone is more).
pub const REQUEUE_PAGE_BYTES: i64 = 16 << 20;

const REQUEUE: &str = "UPDATE outbox SET parked_at = NULL
                       WHERE handler = $1 AND parked_at IS NOT NULL AND discarded_at IS NULL
                       AND published_at IS NULL";

/// Marks a parked message as handled without sending it; it stays for the
/// record until `outbox.retention` has passed. False if it is not parked (or
/// already discarded).
pub async fn discard(db: &Database, handler: &str, seq: i64) -> Result<bool, DbError> {
    let mut tx = db.begin_write().await?;
    let discarded = tx
        .execute(
            "UPDATE outbox SET discarded_at = $3
             WHERE seq = $1 AND handler = $2 AND parked_at IS NOT NULL AND discarded_at IS NULL",
            &[seq.into(), handler.into(), now_ms().into()],
        )
        .await?;
    tx.commit().await?;
    Ok(discarded == 1)
}

/// Sendable (unpublished, not parked) messages of a handler, and the
/// creation time of the oldest: the relay's backlog and lag.
pub async fn backlog(db: &Database, handler: &str) -> Result<(i64, Option<i64>), DbError> {
    let rows = db
        .query(
            "SELECT COUNT(*), MIN(created_at) FROM outbox
             WHERE handler = $1 AND published_at IS NULL AND parked_at IS NULL",
            &[handler.into()],
        )
        .await?;
    let row = rows.into_iter().next().unwrap_or_default();
    Ok((
        row.first().and_then(SqlValue::as_i64).unwrap_or(0),
        row.get(1).and_then(SqlValue::as_i64),
    ))
}

/// Deletes at most `limit` messages published, or discarded, before `cutoff_ms`.
pub async fn purge_published(db: &Database, cutoff_ms: i64, limit: i64) -> Result<u64, DbError> {
    // Through the writer queue on SQLite, as every other write.
    let mut tx = db.begin_write().await?;
    let mut deleted = tx
        .execute(
            "DELETE FROM outbox WHERE seq IN
             (SELECT seq FROM outbox WHERE published_at IS NOT NULL AND published_at < $1 LIMIT $2)",
            &[cutoff_ms.into(), limit.into()],
        )
        .await?;
    if deleted < limit as u64 {
        // Discarded messages are parked ones (the `outbox_parked` index).
        deleted += tx
            .execute(
                "DELETE FROM outbox WHERE seq IN
                 (SELECT seq FROM outbox WHERE parked_at IS NOT NULL AND discarded_at < $1 LIMIT $2)",
                &[cutoff_ms.into(), (limit - deleted as i64).into()],
            )
            .await?;
    }
    tx.commit().await?;
    Ok(deleted)
}

#[cfg(test)]
mod tests;
