//! PostgreSQL: a consumer batch's whole commit tail in one call of the
//! `inboxd_gate.seal_rows` gate, instead of three (outbox insert, the check
//! of the host's rows, the offset's compare-and-set).
//!
//! Each gate call is a round trip and a check of the host's key, and a batch
//! of mode (a) made four of them besides the guest's own statements (issue
//! 24). The gate does the same steps in the same order as
//! `pipeline::tail::seal` on SQLite: it writes the messages, counts the
//! claims still `done` and reads the partition's offset, and moves the
//! offset only when both are as the host left them. So what the host
//! decides from its answer is what it decided step by step before.

use super::invariants::{Position, claims_changed, offset_moved};
use super::offsets::Advance;
use super::outbox::{self, NewMessage};
use super::{Backend, DbError, PgArray, SqlValue, Tx, now_ms};

/// The key is `$1`, the scalars `$2` to `$9`, the arrays `$10` to `$17`
/// (a statement's parameters go in that order, see [`Tx::gate_arrays`]).
const SEAL_POSTGRES: &str = "SELECT * FROM inboxd_gate.seal_rows($1, $2, $3, $10::pg_catalog.text[], \
     $11::pg_catalog.text[], $12::pg_catalog.bytea[], $13::pg_catalog.bytea[], $14::pg_catalog.text[], \
     $15::pg_catalog.int8[], $16::pg_catalog.text[], $17::pg_catalog.int8[], $4, $5::pg_catalog.int4, \
     $6, $7, $8, $9)";

/// What the one call found.
#[derive(Debug, PartialEq, Eq)]
pub enum Sealing {
    /// Messages written, rows intact, offset moved: the caller commits.
    Advanced,
    /// The host's rows were not as it left them: the caller rolls back.
    Violation(String),
    /// Another writer moved the offset first: the caller rolls back.
    Raced,
}

/// The tail of a consumer's transaction that applied `applied` and
/// published `messages`, in one call; `None` where it does not go as one
/// (SQLite, or messages past one statement's bytes): the caller takes the
/// steps one by one.
pub async fn tail(
    tx: &mut Tx,
    handler: &str,
    messages: &[NewMessage],
    applied: &[String],
    advance: &Advance<'_>,
) -> Result<Option<Sealing>, DbError> {
    if tx.backend() != Backend::Postgres || !outbox::one_postgres_statement(messages) {
        return Ok(None);
    }
    let headers = outbox::postgres_headers(messages);
    let [ids, topics, keys, payloads, headers, buckets] =
        outbox::postgres_columns(handler, messages, &headers);
    let days = applied
        .iter()
        .map(|id| i64::from(crate::event_id::id_day(id)))
        .collect();
    let arrays = [
        ids,
        topics,
        keys,
        payloads,
        headers,
        buckets,
        PgArray::Texts(applied.iter().map(String::as_str).collect()),
        PgArray::Ints(days),
    ];
    let now = now_ms();
    let params = [
        handler.into(),
        now.into(),
        advance.topic.into(),
        advance.partition.into(),
        advance.next_offset.into(),
        advance.records.into(),
        now.into(),
        advance.expected.map_or(SqlValue::Null, SqlValue::Int64),
    ];
    let row = tx
        .gate_arrays(SEAL_POSTGRES, &params, &arrays)
        .await?
        .into_iter()
        .next()
        .unwrap_or_default();
    let mut row = row.into_iter();
    let intact = row.next().and_then(|v| v.as_i64()).unwrap_or(0);
    let offset = row.next().unwrap_or(SqlValue::Null);
    let advanced = row.next().and_then(|v| v.as_i64()).unwrap_or(0);
    if intact != applied.len() as i64 {
        return Ok(Some(Sealing::Violation(claims_changed(intact, applied.len()))));
    }
    if let Some(moved) = offset_moved(&Position::from(advance), offset) {
        return Ok(Some(Sealing::Violation(moved)));
    }
    Ok(Some(if advanced == 1 {
        Sealing::Advanced
    } else {
        Sealing::Raced
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::inbox::{self, Claim};
    use crate::db::test_support::each_backend;

    fn claim(event_id: &str) -> Claim<'_> {
        Claim {
            handler: "h",
            event_id,
            topic: "t",
            partition: 0,
            offset: 9,
            handler_version: "v",
        }
    }

    fn advance(expected: Option<i64>) -> Advance<'static> {
        Advance {
            handler: "h",
            topic: "t",
            partition: 0,
            expected,
            next_offset: 10,
            records: 1,
        }
    }

    fn message(n: u8) -> NewMessage {
        NewMessage {
            id: uuid::Uuid::now_v7().to_string(),
            topic: "out".into(),
            key: n.is_multiple_of(2).then(|| vec![n]),
            payload: vec![n; 3],
            headers: vec![("h".into(), vec![n])],
        }
    }

    async fn count(db: &crate::db::Database, sql: &str) -> i64 {
        let rows = db.query(sql, &[]).await.unwrap();
        rows[0][0].as_i64().unwrap()
    }

    /// The one call does what the three steps did: messages written in
    /// order, the offset moved only past intact claims and the offset the
    /// host read, and each violation named as the check names it.
    #[tokio::test]
    async fn the_whole_tail_in_one_call_writes_checks_and_advances_as_the_steps_did() {
        for db in each_backend().await {
            let on = db.backend();
            let applied = vec!["e1".to_owned(), "e2".to_owned()];
            let messages = [message(1), message(2), message(3)];

            let mut tx = db.begin().await.unwrap();
            for id in &applied {
                inbox::claim(&mut tx, &claim(id)).await.unwrap();
            }
            let sealed = tail(&mut tx, "h", &messages, &applied, &advance(None))
                .await
                .unwrap();
            if on == Backend::Sqlite {
                assert_eq!(sealed, None, "SQLite takes the steps one by one");
                continue;
            }
            assert_eq!(sealed, Some(Sealing::Advanced));
            tx.commit().await.unwrap();
            assert_eq!(count(&db, "SELECT next_offset FROM inboxd.offsets").await, 10);
            let rows = db
                .query("SELECT id, key, payload FROM inboxd.outbox ORDER BY seq", &[])
                .await
                .unwrap();
            let ids: Vec<_> = rows.iter().map(|r| r[0].clone()).collect();
            let sent: Vec<_> = messages.iter().map(|m| SqlValue::Text(m.id.clone())).collect();
            assert_eq!(ids, sent, "in publish order");
            assert_eq!(rows[0][1], SqlValue::Null, "a message without a key");
            assert_eq!(rows[1][2], SqlValue::Blob(vec![2; 3]));

            // A claim gone: named, nothing moved.
            let mut tx = db.begin().await.unwrap();
            inbox::claim(&mut tx, &claim("e3")).await.unwrap();
            let both = ["e3".to_owned(), "e4".to_owned()];
            let found = tail(&mut tx, "h", &[message(4)], &both, &advance(Some(10)))
                .await
                .unwrap();
            assert_eq!(
                found,
                Some(Sealing::Violation(claims_changed(1, 2))),
                "e4 was never claimed"
            );
            tx.rollback().await.unwrap();

            // The offset moved by someone else: named, not advanced.
            let mut tx = db.begin().await.unwrap();
            inbox::claim(&mut tx, &claim("e5")).await.unwrap();
            let found = tail(&mut tx, "h", &[], &["e5".to_owned()], &advance(Some(7)))
                .await
                .unwrap();
            let Some(Sealing::Violation(violation)) = found else {
                panic!("{found:?}");
            };
            assert!(violation.contains("stored offset was changed"), "{violation}");
            tx.rollback().await.unwrap();
            assert_eq!(count(&db, "SELECT next_offset FROM inboxd.offsets").await, 10);
            assert_eq!(count(&db, "SELECT COUNT(*) FROM inboxd.outbox").await, 3);
        }
    }
}
