//! The relay's read: the oldest sendable messages of the buckets it holds,
//! bounded in count per bucket and in bytes in all.
//!
//! Bytes matter because a message is as large as a handler makes it (up to
//! its `limits.max_outbox_bytes`, 8 MiB at the team ceiling): 64 buckets of
//! 200 one-megabyte messages were 12.8 GB read into the host in one look. So
//! the read sizes every candidate first (`octet_length`, which reads no
//! payload) and fetches only the messages that fit, in one statement.

use super::super::columns::Columns;
use super::super::headers::headers_column;
use super::super::{Backend, Database, DbError, DecodeError};
use super::{NewMessage, Pending, int_array};

/// The most a message may count ([`stored_bytes`]): half of the relay's
/// in-flight budget (64 MiB), so a read with nothing in flight always
/// takes the oldest message of every bucket in turn. A header value of
/// control characters is six times its size as stored JSON: one message
/// within `max_outbox_bytes` counted 100 MB, and its bucket's turn cut
/// every read short of the buckets after it.
pub const MAX_STORED_BYTES: usize = 32 << 20;

/// What one read may take.
///
/// A candidate's size is counted from what is stored, as an upper bound of
/// what the host then holds for it ([`NewMessage::bytes`]): id, topic, key,
/// payload, twice the headers' JSON (which has at least 22 bytes per header
/// where the host holds 48 besides name and value) and 384 bytes of
/// overhead (the message's own 128, and 4 for each of up to 64 headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// Messages per bucket, at most: one bucket's backlog never fills a read.
    pub per_bucket: i64,
    /// Key, payload and header bytes in all, at most (see [`pending`]).
    pub bytes: u64,
    /// Whether the first message may come even if it alone is over `bytes`:
    /// so a message larger than the relay's budget is still sent, alone.
    pub at_least_one: bool,
}

impl Read {
    /// At most `per_bucket` of each bucket, whatever their size.
    pub fn messages(per_bucket: i64) -> Self {
        Self {
            per_bucket,
            bytes: i64::MAX as u64,
            at_least_one: true,
        }
    }
}

/// The oldest sendable (unpublished, not parked) messages of the given
/// buckets within `read`, in relay order (bucket, then seq); of each bucket,
/// a prefix of its line.
///
/// Candidates are the oldest `per_bucket` of each bucket: one
/// `ORDER BY seq LIMIT n` per bucket, each walking the `outbox_pending`
/// index and stopping after `n` rows, so a look costs the same whatever the
/// backlog. (A global `ORDER BY bucket, seq LIMIT` let one bucket's backlog
/// fill every read.) They are then taken in turns, every bucket's first,
/// then every bucket's second, and so on, while the running total of their
/// sizes stays within `read.bytes`: the total only grows along that order,
/// so what is taken is a prefix of each bucket's line, and every bucket
/// gets its share before any bucket gets a second message.
///
/// On PostgreSQL the buckets go as one array through a `LATERAL` join, so
/// the text is the same every look and prepared once per connection,
/// whatever buckets are ready; SQLite, which has neither, glues the
/// per-bucket reads with UNION ALL (its prepares are local, not a round trip).
///
/// Messages of the handlers in `skip` are not read: the relay's handlers
/// backing off after a passing failure, whose messages wait for their turn
/// while the other handlers' messages in the same buckets go on.
pub async fn pending(
    db: &Database,
    buckets: &[i64],
    read: Read,
    skip: &[String],
) -> Result<Vec<Pending>, DbError> {
    if buckets.is_empty() || read.per_bucket <= 0 {
        return Ok(Vec::new());
    }
    let budget = i64::try_from(read.bytes).unwrap_or(i64::MAX);
    let first = i64::from(read.at_least_one);
    let rows = match db.backend() {
        Backend::Postgres => {
            let candidates = "SELECT o.seq, o.bucket, o.bytes
                 FROM unnest($2::int8[]) AS u(bucket)
                 CROSS JOIN LATERAL (SELECT seq, bucket, 384 + octet_length(id)::int8 + octet_length(topic)::int8
                         + octet_length(payload)::int8 + COALESCE(octet_length(key)::int8, 0)
                         + 2 * octet_length(headers)::int8 AS bytes
                     FROM outbox
                     WHERE published_at IS NULL AND parked_at IS NULL AND bucket = u.bucket
                         AND handler <> ALL($5::text[])
                     ORDER BY seq LIMIT $1) AS o";
            db.query(
                &within_budget(candidates, 3, Backend::Postgres),
                &[
                    read.per_bucket.into(),
                    int_array(buckets).into(),
                    budget.into(),
                    first.into(),
                    text_array(skip).into(),
                ],
            )
            .await?
        }
        Backend::Sqlite => {
            // Bucket numbers are integers, safe to write inline. The size
            // is stored with the message, in the pending index (migration
            // 0009: reaching the headers, stored after the payload, walked
            // the payload's overflow pages); a row from before is sized from
            // its columns, text cast to BLOB for its length in bytes.
            let parts: Vec<String> = buckets
                .iter()
                .map(|bucket| {
                    format!(
                        "SELECT * FROM (SELECT seq, bucket, COALESCE(bytes, 384 + length(CAST(id AS BLOB))
                             + length(CAST(topic AS BLOB)) + length(payload) + COALESCE(length(key), 0)
                             + 2 * length(CAST(headers AS BLOB))) AS bytes
                         FROM outbox
                         WHERE published_at IS NULL AND parked_at IS NULL AND bucket = {bucket}
                             AND handler NOT IN (SELECT value FROM json_each($4))
                         ORDER BY seq LIMIT $1) AS b{bucket}"
                    )
                })
                .collect();
            db.query(
                &within_budget(&parts.join("\nUNION ALL\n"), 2, Backend::Sqlite),
                &[
                    read.per_bucket.into(),
                    budget.into(),
                    first.into(),
                    serde_json::to_string(skip).unwrap_or_else(|_| "[]".into()).into(),
                ],
            )
            .await?
        }
    };
    let mut pending = rows
        .into_iter()
        .map(|row| {
            let mut c = Columns::new("outbox row", row);
            Ok(Pending {
                seq: c.int("seq")?,
                bucket: c.int("bucket")?,
                handler: c.text("handler")?,
                message: NewMessage {
                    id: c.text("id")?,
                    topic: c.text("topic")?,
                    key: c.opt_blob("key")?,
                    payload: c.opt_blob("payload")?.unwrap_or_default(),
                    headers: headers_column(&mut c, "headers")?,
                },
            })
        })
        .collect::<Result<Vec<Pending>, DecodeError>>()?;
    pending.sort_by_key(|p| (p.bucket, p.seq));
    Ok(pending)
}

/// `values` as a PostgreSQL array literal (`{"a","b"}`), each element
/// quoted and its `"` and `\` escaped.
fn text_array(values: &[String]) -> String {
    let quoted: Vec<String> = values
        .iter()
        .map(|v| format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("{{{}}}", quoted.join(","))
}

/// What a read counts for a message whose headers are stored as
/// `headers_json` (see [`Read`]): SQLite stores it with the message, and a
/// message is refused at publish when it is over [`MAX_STORED_BYTES`].
pub fn stored_bytes(message: &NewMessage, headers_json: &str) -> usize {
    384 + message.id.len()
        + message.topic.len()
        + message.payload.len()
        + message.key.as_ref().map_or(0, Vec::len)
        + 2 * headers_json.len()
}

/// The read around `candidates` (rows of seq, bucket, bytes): numbers each
/// bucket's candidates (its turn), runs the total over the turns, and
/// fetches whole rows only for those within the budget (parameter `$next`)
/// or, when parameter `$next + 1` is 1, the very first.
///
/// On PostgreSQL the rows are fetched by key, one index probe each, not by
/// a join: the planner, which guesses a few candidates and a small table,
/// joined them by hashing a sequential scan of the whole outbox, dead rows
/// of sent messages included (`auto_explain` in benchmark mode (a): 14 µs
/// per message sent); with `seq = ANY (ARRAY(...))` it scanned the table and
/// compared every row with every candidate.
fn within_budget(candidates: &str, next: usize, backend: Backend) -> String {
    let (budget, first) = (format!("${next}"), format!("${}", next + 1));
    // PostgreSQL: each row by its key, through a LATERAL that LIMIT keeps
    // from being pulled up into a join the planner may hash.
    let fetch = match backend {
        Backend::Postgres => {
            "FROM running AS r CROSS JOIN LATERAL (SELECT o.seq, o.bucket, o.handler, o.id, o.topic, o.key, \
             o.payload, o.headers FROM outbox AS o WHERE o.seq = r.seq LIMIT 1) AS o"
        }
        Backend::Sqlite => "FROM running AS r JOIN outbox AS o ON o.seq = r.seq",
    };
    format!(
        "WITH candidates AS ({candidates}),
         turns AS (SELECT seq, bucket, bytes,
             ROW_NUMBER() OVER (PARTITION BY bucket ORDER BY seq) AS turn FROM candidates),
         running AS (SELECT seq, bytes,
             SUM(bytes) OVER (ORDER BY turn, bucket ROWS UNBOUNDED PRECEDING) AS total,
             ROW_NUMBER() OVER (ORDER BY turn, bucket) AS place FROM turns)
         SELECT o.seq, o.bucket, o.handler, o.id, o.topic, o.key, o.payload, o.headers
         {fetch}
         WHERE r.total <= {budget} OR (r.place = 1 AND {first} = 1)"
    )
}
