//! The `offsets` table: the next offset to process per (handler, topic, partition).
//!
//! Written in the same transaction as the effects, so it is exactly as durable
//! as they are; the consumer seeks here on assignment. Kafka's committed offset
//! only feeds lag tools.
//!
//! Every write is a compare-and-set from the offset the writer last saw. A host
//! that lost its partition in a rebalance (or paused past its session) and
//! still tries to commit stale work finds the row moved on: its transaction is
//! *fenced* and rolls back. So each offset range is committed by exactly one
//! transaction, which `records_committed` lets anyone check afterwards.

use super::columns::Columns;
use super::{Database, DbError, DecodeError, SqlValue, Tx, now_ms};

const INSERT_FIRST: &str =
    "INSERT INTO offsets (handler, topic, partition, next_offset, records_committed, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (handler, topic, partition) DO NOTHING";

const ADVANCE: &str = "UPDATE offsets
SET next_offset = $4, records_committed = records_committed + $5, updated_at = $6
WHERE handler = $1 AND topic = $2 AND partition = $3 AND next_offset = $7";

/// A partition position change, as one transaction commits it.
pub struct Advance<'a> {
    pub handler: &'a str,
    pub topic: &'a str,
    pub partition: i32,
    /// The stored `next_offset` this writer last saw; `None` if it saw no row.
    pub expected: Option<i64>,
    pub next_offset: i64,
    /// Records this transaction processed (applied, skipped or parked).
    pub records: i64,
}

/// Moves the partition's position; `false` means another writer moved it
/// first (the caller must roll back: its work is stale).
pub async fn advance(tx: &mut Tx, advance: &Advance<'_>) -> Result<bool, DbError> {
    let mut params = vec![
        advance.handler.into(),
        advance.topic.into(),
        advance.partition.into(),
        advance.next_offset.into(),
        advance.records.into(),
        now_ms().into(),
    ];
    if tx.backend() == super::Backend::Postgres {
        params.push(advance.expected.map_or(SqlValue::Null, SqlValue::Int64));
        let changed = tx
            .gate_count(
                "SELECT inboxd_gate.advance_offset($1, $2, $3, $4::pg_catalog.int4, $5, $6, $7, $8)",
                &params,
            )
            .await?;
        return Ok(changed == 1);
    }
    let changed = match advance.expected {
        None => tx.execute(INSERT_FIRST, &params).await?,
        Some(expected) => {
            params.push(expected.into());
            tx.execute(ADVANCE, &params).await?
        }
    };
    Ok(changed == 1)
}

const RAISE: &str =
    "INSERT INTO offsets (handler, topic, partition, next_offset, records_committed, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (handler, topic, partition) DO UPDATE
SET next_offset = excluded.next_offset,
    records_committed = offsets.records_committed + excluded.records_committed,
    updated_at = excluded.updated_at
WHERE offsets.next_offset < excluded.next_offset";

/// With key order (`ordering = "key"`): moves the partition's position up
/// to `next_offset`, in a transaction of the host's own, never down. Every
/// record below it is settled (committed or parked) whoever writes it, so
/// the write needs no fence: a stale writer only fails to raise it.
pub async fn raise(
    db: &Database,
    handler: &str,
    topic: &str,
    partition: i32,
    next_offset: i64,
    records: i64,
) -> Result<(), DbError> {
    let mut tx = db.begin_write().await?;
    let params = [
        handler.into(),
        topic.into(),
        partition.into(),
        next_offset.into(),
        records.into(),
        now_ms().into(),
    ];
    tx.execute(RAISE, &params).await?;
    tx.commit().await
}

/// The stored position of one partition, if the handler ever processed it.
pub async fn load(db: &Database, handler: &str, topic: &str, partition: i32) -> Result<Option<i64>, DbError> {
    let rows = db
        .query(
            "SELECT next_offset FROM offsets WHERE handler = $1 AND topic = $2 AND partition = $3",
            &[handler.into(), topic.into(), partition.into()],
        )
        .await?;
    Ok(rows.first().and_then(|r| r.first()).and_then(SqlValue::as_i64))
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub topic: String,
    pub partition: i32,
    pub next_offset: i64,
    pub records_committed: i64,
}

/// Every stored position of a handler, by topic and partition.
pub async fn load_all(db: &Database, handler: &str) -> Result<Vec<Position>, DbError> {
    let rows = db
        .query(
            "SELECT topic, partition, next_offset, records_committed FROM offsets
             WHERE handler = $1 ORDER BY topic, partition",
            &[handler.into()],
        )
        .await?;
    let positions = rows.into_iter().map(|row| {
        let mut c = Columns::new("offsets row", row);
        let topic = c.text("topic")?;
        let partition = c.int("partition")?;
        let partition = i32::try_from(partition)
            .map_err(|_| c.wrong("partition", "a partition number", "a larger integer"))?;
        Ok(Position {
            topic,
            partition,
            next_offset: c.int("next_offset")?,
            records_committed: c.int("records_committed")?,
        })
    });
    Ok(positions.collect::<Result<_, DecodeError>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::sqlite_db;

    fn step(expected: Option<i64>, next_offset: i64) -> Advance<'static> {
        Advance {
            handler: "h",
            topic: "t",
            partition: 0,
            expected,
            next_offset,
            records: 1,
        }
    }

    #[tokio::test]
    async fn advance_then_load() {
        let db = sqlite_db().await;
        assert_eq!(load(&db, "h", "t", 0).await.unwrap(), None);
        let mut tx = db.begin().await.unwrap();
        assert!(advance(&mut tx, &step(None, 5)).await.unwrap());
        assert!(advance(&mut tx, &step(Some(5), 6)).await.unwrap());
        tx.commit().await.unwrap();
        assert_eq!(load(&db, "h", "t", 0).await.unwrap(), Some(6));
        assert_eq!(load(&db, "h", "t", 1).await.unwrap(), None);
        let all = load_all(&db, "h").await.unwrap();
        assert_eq!(
            all,
            vec![Position {
                topic: "t".into(),
                partition: 0,
                next_offset: 6,
                records_committed: 2
            }]
        );
    }

    #[tokio::test]
    async fn a_stale_writer_is_fenced() {
        let db = sqlite_db().await;
        let mut tx = db.begin().await.unwrap();
        advance(&mut tx, &step(None, 10)).await.unwrap();
        tx.commit().await.unwrap();
        let mut tx = db.begin().await.unwrap();
        assert!(
            !advance(&mut tx, &step(None, 3)).await.unwrap(),
            "a second first writer"
        );
        assert!(
            !advance(&mut tx, &step(Some(9), 10)).await.unwrap(),
            "a writer that saw an older offset"
        );
        assert!(advance(&mut tx, &step(Some(10), 11)).await.unwrap());
        tx.commit().await.unwrap();
        assert_eq!(load(&db, "h", "t", 0).await.unwrap(), Some(11));
    }

    #[tokio::test]
    async fn rolled_back_offset_is_not_stored() {
        let db = sqlite_db().await;
        let mut tx = db.begin().await.unwrap();
        advance(&mut tx, &step(None, 10)).await.unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(load(&db, "h", "t", 0).await.unwrap(), None);
    }
}
