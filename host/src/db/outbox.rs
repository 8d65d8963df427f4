//! The `outbox` table and its relay bookkeeping.
//!
//! A handler's published messages are inserted here in the handler's own
//! transaction, so they exist exactly when its writes commit. Each message
//! belongs to a bucket (a stable hash of handler and key): a bucket's messages
//! are relayed in insert order (`seq`) by whichever host holds the bucket's
//! lease. For the messages of one partition's events (its batches commit one
//! after another) that is commit order.

use super::dead_letters::{headers_json, parse_headers};
use super::{Database, DbError, SqlValue, Tx, now_ms};

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

/// Messages per INSERT statement, at most.
const INSERT_CHUNK: usize = 64;
const COLUMNS: usize = 8;

/// Writes the messages in the caller's transaction. Their `seq` (insert
/// order) is the relay's order within a bucket; no row is locked for it, so
/// the batches of different partitions never wait for each other here
/// (see migrations/*/0002_outbox_insert_order.sql).
///
/// A batch's messages go in a few multi-row INSERTs rather than one
/// statement each (a round trip each on PostgreSQL). Chunks are powers of two
/// (100 messages: 64 + 32 + 4), so a handful of statement texts cover every
/// batch and stay prepared.
pub async fn insert(tx: &mut Tx, handler: &str, messages: &[NewMessage]) -> Result<(), DbError> {
    let created_at = now_ms();
    let mut rest = messages;
    while !rest.is_empty() {
        let take = INSERT_CHUNK.min(1 << rest.len().ilog2());
        let (chunk, tail) = rest.split_at(take);
        let mut params = Vec::with_capacity(chunk.len() * COLUMNS);
        for message in chunk {
            params.extend([
                message.id.as_str().into(),
                handler.into(),
                message.topic.as_str().into(),
                message.key.as_deref().map_or(SqlValue::Null, SqlValue::from),
                message.payload.as_slice().into(),
                headers_json(&message.headers).into(),
                bucket(handler, message.key.as_deref()).into(),
                created_at.into(),
            ]);
        }
        tx.execute(&insert_sql(chunk.len()), &params).await?;
        rest = tail;
    }
    Ok(())
}

fn insert_sql(rows: usize) -> String {
    let values: Vec<String> = (0..rows)
        .map(|row| {
            let first = row * COLUMNS + 1;
            let params: Vec<String> = (first..first + COLUMNS).map(|p| format!("${p}")).collect();
            format!("({})", params.join(", "))
        })
        .collect();
    format!(
        "INSERT INTO outbox (id, handler, topic, key, payload, headers, bucket, created_at) VALUES {}",
        values.join(", ")
    )
}

/// An unpublished message, as the relay reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub seq: i64,
    pub bucket: i64,
    pub message: NewMessage,
}

/// Takes (or renews) the leases of every bucket that is free or already ours;
/// returns the buckets this owner now holds.
pub async fn lease(db: &Database, owner: &str, lease_ms: i64) -> Result<Vec<i64>, DbError> {
    let now = now_ms();
    let mut tx = db.begin().await?;
    let rows = tx
        .query(
            "UPDATE outbox_leases SET owner = $1, lease_until = $2
             WHERE owner = $1 OR lease_until < $3 RETURNING bucket",
            &[owner.into(), (now + lease_ms).into(), now.into()],
        )
        .await?;
    tx.commit().await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| r.first().and_then(SqlValue::as_i64))
        .collect())
}

/// Gives this owner's leases up at once (a clean shutdown), so another host
/// need not wait for them to run out.
pub async fn release(db: &Database, owner: &str) -> Result<(), DbError> {
    let mut tx = db.begin().await?;
    tx.execute(
        "UPDATE outbox_leases SET owner = NULL, lease_until = 0 WHERE owner = $1",
        &[owner.into()],
    )
    .await?;
    tx.commit().await
}

/// The oldest unpublished messages of the given buckets, in relay order.
pub async fn pending(db: &Database, buckets: &[i64], limit: i64) -> Result<Vec<Pending>, DbError> {
    if buckets.is_empty() {
        return Ok(Vec::new());
    }
    // Bucket numbers are integers, safe to list inline on both backends.
    let list: Vec<String> = buckets.iter().map(i64::to_string).collect();
    let sql = format!(
        "SELECT seq, bucket, id, topic, key, payload, headers FROM outbox
         WHERE published_at IS NULL AND bucket IN ({}) ORDER BY bucket, seq LIMIT $1",
        list.join(", ")
    );
    let rows = db.query(&sql, &[limit.into()]).await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| {
            let mut v = row.into_iter();
            let seq = v.next()?.as_i64()?;
            let bucket = v.next()?.as_i64()?;
            let id = v.next()?.as_str()?.to_owned();
            let topic = v.next()?.as_str()?.to_owned();
            let key = match v.next()? {
                SqlValue::Blob(b) => Some(b),
                _ => None,
            };
            let payload = match v.next()? {
                SqlValue::Blob(b) => b,
                _ => Vec::new(),
            };
            let headers = parse_headers(v.next()?.as_str().unwrap_or("[]"));
            Some(Pending {
                seq,
                bucket,
                message: NewMessage {
                    id,
                    topic,
                    key,
                    payload,
                    headers,
                },
            })
        })
        .collect())
}

pub async fn mark_published(db: &Database, seqs: &[i64]) -> Result<(), DbError> {
    if seqs.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = seqs.iter().map(i64::to_string).collect();
    let mut tx = db.begin().await?;
    tx.execute(
        &format!(
            "UPDATE outbox SET published_at = $1 WHERE seq IN ({})",
            list.join(", ")
        ),
        &[now_ms().into()],
    )
    .await?;
    tx.commit().await
}

pub async fn record_failure(db: &Database, seq: i64, error: &str) -> Result<(), DbError> {
    let mut tx = db.begin().await?;
    tx.execute(
        "UPDATE outbox SET attempts = attempts + 1, last_error = $2 WHERE seq = $1",
        &[seq.into(), error.into()],
    )
    .await?;
    tx.commit().await
}

/// Unpublished messages of a handler, and the creation time of the oldest.
pub async fn backlog(db: &Database, handler: &str) -> Result<(i64, Option<i64>), DbError> {
    let rows = db
        .query(
            "SELECT COUNT(*), MIN(created_at) FROM outbox WHERE handler = $1 AND published_at IS NULL",
            &[handler.into()],
        )
        .await?;
    let row = rows.into_iter().next().unwrap_or_default();
    Ok((
        row.first().and_then(SqlValue::as_i64).unwrap_or(0),
        row.get(1).and_then(SqlValue::as_i64),
    ))
}

/// Deletes at most `limit` messages published before `cutoff_ms`.
pub async fn purge_published(db: &Database, cutoff_ms: i64, limit: i64) -> Result<u64, DbError> {
    let mut tx = db.begin().await?;
    let deleted = tx
        .execute(
            "DELETE FROM outbox WHERE seq IN
             (SELECT seq FROM outbox WHERE published_at IS NOT NULL AND published_at < $1 LIMIT $2)",
            &[cutoff_ms.into(), limit.into()],
        )
        .await?;
    tx.commit().await?;
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::memory_db;

    fn message(key: &str) -> NewMessage {
        NewMessage {
            id: uuid::Uuid::now_v7().to_string(),
            topic: "invoices".into(),
            key: Some(key.as_bytes().to_vec()),
            payload: b"{}".to_vec(),
            headers: vec![("traceparent".into(), b"00-x".to_vec())],
        }
    }

    #[test]
    fn buckets_are_stable_and_spread() {
        assert_eq!(
            bucket("billing", Some(b"order-1")),
            bucket("billing", Some(b"order-1"))
        );
        let spread: std::collections::HashSet<i64> = (0..1000)
            .map(|i| bucket("billing", Some(format!("k{i}").as_bytes())))
            .collect();
        assert!(spread.len() > 50, "{}", spread.len());
    }

    #[tokio::test]
    async fn messages_commit_with_the_transaction_and_relay_in_order() {
        let db = memory_db().await;
        let mut tx = db.begin().await.unwrap();
        insert(&mut tx, "billing", &[message("a"), message("b")])
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(
            backlog(&db, "billing").await.unwrap().0,
            0,
            "rolled back with the handler's writes"
        );

        let first = message("a");
        let second = message("a");
        let mut tx = db.begin().await.unwrap();
        insert(&mut tx, "billing", &[first.clone(), second.clone()])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(backlog(&db, "billing").await.unwrap().0, 2);

        let held = lease(&db, "host-1", 10_000).await.unwrap();
        assert_eq!(held.len() as u64, BUCKETS);
        assert!(
            lease(&db, "host-2", 10_000).await.unwrap().is_empty(),
            "one relay per bucket at a time"
        );
        let rows = pending(&db, &held, 10).await.unwrap();
        assert_eq!(
            rows.iter().map(|p| p.message.id.clone()).collect::<Vec<_>>(),
            [first.id, second.id]
        );
        assert_eq!(rows[0].message.headers, first.headers);
        mark_published(&db, &[rows[0].seq]).await.unwrap();
        assert_eq!(pending(&db, &held, 10).await.unwrap().len(), 1);
        release(&db, "host-1").await.unwrap();
        assert_eq!(
            lease(&db, "host-2", 10_000).await.unwrap().len() as u64,
            BUCKETS,
            "released leases move on"
        );
        assert_eq!(purge_published(&db, now_ms() + 1, 100).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn a_batch_of_messages_keeps_its_order_across_insert_chunks() {
        let db = memory_db().await;
        // 100 = 64 + 32 + 4: three statements.
        let messages: Vec<NewMessage> = (0..100).map(|_| message("same-key")).collect();
        let mut tx = db.begin().await.unwrap();
        insert(&mut tx, "billing", &messages).await.unwrap();
        tx.commit().await.unwrap();
        let held = lease(&db, "host-1", 10_000).await.unwrap();
        let rows = pending(&db, &held, 1_000).await.unwrap();
        let ids: Vec<&str> = rows.iter().map(|p| p.message.id.as_str()).collect();
        let sent: Vec<&str> = messages.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, sent);
    }
}
