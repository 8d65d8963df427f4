//! The `offsets` table: the next offset to process per (handler, topic, partition).
//!
//! Written in the same transaction as the effects, so it is exactly as durable
//! as they are; the consumer seeks here on assignment. Kafka's committed offset
//! only feeds lag tools. Writes never move an offset backwards: a host that lost
//! its partition in a rebalance but still commits stale work cannot rewind the
//! position its successor has reached.

use super::{Database, DbError, SqlValue, Tx, now_ms};

const ADVANCE: &str = "INSERT INTO offsets (handler, topic, partition, next_offset, updated_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (handler, topic, partition) DO UPDATE SET
    next_offset = CASE WHEN excluded.next_offset > offsets.next_offset
                       THEN excluded.next_offset ELSE offsets.next_offset END,
    updated_at = excluded.updated_at";

/// Records that everything before `next_offset` in the partition is done.
pub async fn advance(
    tx: &mut Tx,
    handler: &str,
    topic: &str,
    partition: i32,
    next_offset: i64,
) -> Result<(), DbError> {
    let params = [
        handler.into(),
        topic.into(),
        partition.into(),
        next_offset.into(),
        now_ms().into(),
    ];
    tx.execute(ADVANCE, &params).await.map(drop)
}

/// The stored position of one partition, if the handler ever processed it.
pub async fn load(
    db: &Database,
    handler: &str,
    topic: &str,
    partition: i32,
) -> Result<Option<i64>, DbError> {
    let rows = db
        .query(
            "SELECT next_offset FROM offsets WHERE handler = $1 AND topic = $2 AND partition = $3",
            &[handler.into(), topic.into(), partition.into()],
        )
        .await?;
    Ok(rows
        .first()
        .and_then(|r| r.first())
        .and_then(SqlValue::as_i64))
}

/// Every stored position of a handler: `(topic, partition, next_offset)`.
pub async fn load_all(db: &Database, handler: &str) -> Result<Vec<(String, i32, i64)>, DbError> {
    let rows = db
        .query(
            "SELECT topic, partition, next_offset FROM offsets WHERE handler = $1 ORDER BY topic, partition",
            &[handler.into()],
        )
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| match r.as_slice() {
            [SqlValue::Text(t), SqlValue::Int64(p), SqlValue::Int64(n)] => {
                Some((t.clone(), *p as i32, *n))
            }
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::memory_db;

    #[tokio::test]
    async fn advance_then_load() {
        let db = memory_db().await;
        assert_eq!(load(&db, "h", "t", 0).await.unwrap(), None);
        let mut tx = db.begin().await.unwrap();
        advance(&mut tx, "h", "t", 0, 5).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(load(&db, "h", "t", 0).await.unwrap(), Some(5));
        assert_eq!(load(&db, "h", "t", 1).await.unwrap(), None);
        assert_eq!(
            load_all(&db, "h").await.unwrap(),
            vec![("t".to_owned(), 0, 5)]
        );
    }

    #[tokio::test]
    async fn offsets_never_move_backwards() {
        let db = memory_db().await;
        let mut tx = db.begin().await.unwrap();
        advance(&mut tx, "h", "t", 0, 10).await.unwrap();
        advance(&mut tx, "h", "t", 0, 3).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(load(&db, "h", "t", 0).await.unwrap(), Some(10));
    }

    #[tokio::test]
    async fn rolled_back_offset_is_not_stored() {
        let db = memory_db().await;
        let mut tx = db.begin().await.unwrap();
        advance(&mut tx, "h", "t", 0, 10).await.unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(load(&db, "h", "t", 0).await.unwrap(), None);
    }
}
