//! Key order's view of the dead letters (`ordering = "key"`): which keys a
//! parked letter blocks, the first letter blocking a key, the records held
//! behind it, and how many a handler holds.

use super::super::columns::Columns;
use super::super::{Backend, Database, DbError, SqlValue, Tx};
use super::{COLUMNS, Row, decode};
use std::collections::{BTreeMap, HashSet};

/// What makes a key blocked with `ordering = "key"`: a parked letter of the
/// handler in the key's partition with that key and an event id (one
/// without is never run again).
const BLOCKING: &str = "handler = $1 AND topic = $2 AND partition = $3 AND key IS NOT NULL \
     AND event_id IS NOT NULL AND resolution IS NULL";

/// `key = $4`, as the index `dead_letters_open_keys` serves it: on
/// PostgreSQL the index holds the key's SHA-256 (a btree entry holds at most
/// 2,704 bytes, and a letter with a longer random key could not be parked:
/// migrations/postgres/0010), so the digest is compared first.
fn key_is_4(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "pg_catalog.sha256(key) = pg_catalog.sha256($4) AND key = $4",
        Backend::Sqlite => "key = $4",
    }
}

/// A Kafka key in one partition of a handler's: what blocks it, and what it holds.
#[derive(Debug, Clone, Copy)]
pub struct KeyAt<'a> {
    pub handler: &'a str,
    pub topic: &'a str,
    pub partition: i32,
    pub key: &'a [u8],
}

impl KeyAt<'_> {
    fn params(&self) -> Vec<SqlValue> {
        vec![
            self.handler.into(),
            self.topic.into(),
            self.partition.into(),
            self.key.into(),
        ]
    }
}

/// A blocked key as key order holds it in memory: its SHA-256, not the key,
/// which may be as large as a record (a team's records of distinct
/// megabyte keys, each parked, were a megabyte each in the partition task
/// for good, and all read at once at every assignment: the twelfth read of
/// issue 23's third round).
pub type KeyDigest = [u8; 32];

pub fn key_digest(key: &[u8]) -> KeyDigest {
    use sha2::Digest;
    sha2::Sha256::digest(key).into()
}

/// The keys of one partition that parked letters block (`ordering = "key"`),
/// as digests, at most `at_most` of them (then `at_most` or a few more),
/// read a page at a time in the order of the index `dead_letters_open_keys`:
/// on PostgreSQL the digests themselves, 1,024 a page; on SQLite the keys,
/// whose index has no size limit, 16 a page, so a page is at most 16 keys
/// in the host at once, however long they are.
pub async fn blocked_keys(
    db: &Database,
    handler: &str,
    topic: &str,
    partition: i32,
    at_most: usize,
) -> Result<HashSet<KeyDigest>, DbError> {
    let (column, page) = match db.backend() {
        Backend::Postgres => ("pg_catalog.sha256(key)", 1_024),
        Backend::Sqlite => ("key", 16),
    };
    let first =
        format!("SELECT DISTINCT {column} AS k FROM dead_letters WHERE {BLOCKING} ORDER BY 1 LIMIT {page}");
    let next = format!(
        "SELECT DISTINCT {column} AS k FROM dead_letters WHERE {BLOCKING} AND {column} > $4 ORDER BY 1 LIMIT {page}"
    );
    let mut digests = HashSet::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let mut params: Vec<SqlValue> = vec![handler.into(), topic.into(), partition.into()];
        if let Some(last) = &after {
            params.push(last.as_slice().into());
        }
        let rows = db
            .query(if after.is_some() { &next } else { &first }, &params)
            .await?;
        let read = rows.len();
        for row in rows {
            let value = Columns::new("dead_letters key", row).blob("k")?;
            digests.insert(match db.backend() {
                Backend::Postgres => value.as_slice().try_into().unwrap_or_else(|_| key_digest(&value)),
                Backend::Sqlite => key_digest(&value),
            });
            after = Some(value);
        }
        if read < page || digests.len() >= at_most {
            return Ok(digests);
        }
    }
}

/// Of `keys` (of one partition), those parked letters block now, read in
/// `tx` (a batch's, after its claims: a letter another consumer parked
/// meanwhile, in a rebalance, is seen).
pub async fn blocked_among(
    tx: &mut Tx,
    handler: &str,
    topic: &str,
    partition: i32,
    keys: &[&[u8]],
) -> Result<HashSet<Vec<u8>>, DbError> {
    if keys.is_empty() {
        return Ok(HashSet::new());
    }
    let mut params: Vec<SqlValue> = vec![handler.into(), topic.into(), partition.into()];
    let rows = match tx.backend() {
        Backend::Postgres => {
            let hex: Vec<String> = keys.iter().map(hex::encode).collect();
            params.push(serde_json::to_string(&hex).unwrap_or_default().into());
            tx.gate(
                "SELECT inboxd_gate.blocked_keys($1, $2, $3, $4::pg_catalog.int4, $5::pg_catalog.json)",
                &params,
            )
            .await?
            .into_iter()
            .filter_map(|row| {
                row.first()
                    .and_then(SqlValue::as_str)
                    .and_then(|h| hex::decode(h).ok())
            })
            .collect()
        }
        Backend::Sqlite => {
            let list: Vec<String> = keys
                .iter()
                .map(|key| {
                    params.push((*key).into());
                    format!("${}", params.len())
                })
                .collect();
            let sql = format!(
                "SELECT DISTINCT key FROM dead_letters WHERE {BLOCKING} AND key IN ({})",
                list.join(", ")
            );
            let mut keys = Vec::new();
            for row in tx.query(&sql, &params).await? {
                keys.push(Columns::new("dead_letters key", row).blob("key")?);
            }
            keys
        }
    };
    Ok(rows.into_iter().collect())
}

/// The first parked letter (by offset) that blocks `at`, as (id, offset):
/// what its later records are held behind. `lock`: on PostgreSQL the row is
/// locked for the rest of `tx`, so resolving it waits for `tx` (see
/// `Pipeline::hold`); a letter resolved while this waited is skipped, and
/// the answer is then none even if another blocks the key (look again).
pub async fn first_blocking(tx: &mut Tx, at: &KeyAt<'_>, lock: bool) -> Result<Option<(i64, i64)>, DbError> {
    let lock = match (lock, tx.backend()) {
        (true, Backend::Postgres) => " FOR UPDATE",
        _ => "",
    };
    let key_is = key_is_4(tx.backend());
    let sql = format!(
        "SELECT id, \"offset\" FROM dead_letters WHERE {BLOCKING} AND {key_is} ORDER BY \"offset\", id LIMIT 1{lock}"
    );
    let rows = tx.query(&sql, &at.params()).await?;
    Ok(rows
        .first()
        .and_then(|r| Some((r.first()?.as_i64()?, r.get(1)?.as_i64()?))))
}

/// The first `limit` letters held behind `letter` (kind `held`, same
/// handler, partition and key, later offsets, up to the key's next parked
/// letter that is not held), in offset order, records included. Callers
/// read a few at a time: a key may hold up to `max_held_records` (100,000
/// by default), each with its payload.
pub async fn held_behind(db: &Database, letter: &Row, limit: i64) -> Result<Vec<Row>, DbError> {
    let Some(key) = &letter.key else {
        return Ok(Vec::new());
    };
    let key_is = key_is_4(db.backend());
    let sql = format!(
        "SELECT {COLUMNS} FROM dead_letters WHERE {BLOCKING} AND {key_is} AND reason_kind = 'held' \
         AND \"offset\" > $5 AND \"offset\" < COALESCE((SELECT MIN(\"offset\") FROM dead_letters \
         WHERE {BLOCKING} AND {key_is} AND reason_kind <> 'held' AND \"offset\" > $5), $6) \
         ORDER BY \"offset\", id LIMIT $7"
    );
    let at = KeyAt {
        handler: &letter.handler,
        topic: &letter.topic,
        partition: letter.partition,
        key,
    };
    let mut params = at.params();
    params.push(letter.offset.into());
    params.push(i64::MAX.into());
    params.push(limit.max(0).into());
    let mut letters = Vec::new();
    for row in db.query(&sql, &params).await? {
        letters.extend(decode(row)?);
    }
    Ok(letters)
}

/// The records a handler holds behind parked records of their keys.
const HELD_OF: &str =
    "SELECT COUNT(*) FROM dead_letters WHERE handler = $1 AND resolution IS NULL AND reason_kind = 'held'";

/// Records `handler` holds behind parked records of their keys.
pub async fn held_count(tx: &mut Tx, handler: &str) -> Result<i64, DbError> {
    let rows = tx.query(HELD_OF, &[handler.into()]).await?;
    Ok(rows
        .first()
        .and_then(|r| r.first())
        .and_then(SqlValue::as_i64)
        .unwrap_or(0))
}

/// As [`held_count`], outside a transaction.
pub async fn held_of(db: &Database, handler: &str) -> Result<i64, DbError> {
    db.query_i64(HELD_OF, &[handler.into()]).await
}

/// Records held behind a parked record of their key, per handler.
pub async fn held_counts(db: &Database) -> Result<BTreeMap<String, i64>, DbError> {
    db.counts_by_handler(
        "SELECT handler, COUNT(*) FROM dead_letters WHERE resolution IS NULL AND reason_kind = 'held' \
         GROUP BY handler",
    )
    .await
}
