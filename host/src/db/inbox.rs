//! The `inbox` table: one row per (handler, event id), the deduplication key.
//!
//! A claim is a plain INSERT that does nothing on conflict; `rows_affected`
//! tells "first time" from "duplicate". There is no SELECT first, so two
//! concurrent copies of one event cannot both win.

use super::{Backend, Database, DbError, PgArray, SqlValue, Tx, now_ms};
use std::collections::HashSet;

/// Where an event came from and which handler version ran it.
pub struct Claim<'a> {
    pub handler: &'a str,
    pub event_id: &'a str,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub handler_version: &'a str,
}

impl Claim<'_> {
    fn params(&self, status: &str) -> Vec<SqlValue> {
        vec![
            self.handler.into(),
            self.event_id.into(),
            status.into(),
            self.topic.into(),
            self.partition.into(),
            self.offset.into(),
            self.handler_version.into(),
            now_ms().into(),
            crate::event_id::id_day(self.event_id).into(),
        ]
    }
}

// No conflict target: the key is (handler, event_id) on SQLite and
// (handler, event_id, id_day) on partitioned PostgreSQL, the same uniqueness.
const INSERT: &str = r#"INSERT INTO inbox
(handler, event_id, status, topic, partition, "offset", handler_version, processed_at, id_day)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT DO NOTHING"#;

/// Claims the event for the handler. `true`: first time, run the handler.
/// `false`: already applied or dead-lettered, skip it.
pub async fn claim(tx: &mut Tx, claim: &Claim<'_>) -> Result<bool, DbError> {
    if tx.backend() == Backend::Postgres {
        return Ok(!claim_postgres(tx, &[claim], "done").await?.is_empty());
    }
    Ok(tx.execute(INSERT, &claim.params("done")).await? == 1)
}

/// Claims per INSERT statement, at most.
const CLAIM_CHUNK: usize = 64;
const CLAIM_COLUMNS: usize = 9;

/// Claims many events in a few statements (a batch's worth); returns the ids
/// claimed now, i.e. not duplicates. The ids must be distinct. They are
/// inserted in id order, so two transactions claiming overlapping ids (one
/// event sent to two partitions) wait for each other in the same order
/// instead of deadlocking. Chunks are powers of two, as in `outbox::insert`.
pub async fn claim_many(tx: &mut Tx, claims: &[Claim<'_>]) -> Result<HashSet<String>, DbError> {
    let mut sorted: Vec<&Claim<'_>> = claims.iter().collect();
    sorted.sort_by_key(|c| c.event_id);
    if tx.backend() == Backend::Postgres {
        return claim_postgres(tx, &sorted, "done").await;
    }
    let mut fresh = HashSet::with_capacity(claims.len());
    let mut rest = sorted.as_slice();
    while !rest.is_empty() {
        let take = CLAIM_CHUNK.min(1 << rest.len().ilog2());
        let (chunk, tail) = rest.split_at(take);
        let params: Vec<SqlValue> = chunk.iter().flat_map(|c| c.params("done")).collect();
        for row in tx.query(&claim_many_sql(chunk.len()), &params).await? {
            if let Some(SqlValue::Text(id)) = row.into_iter().next() {
                fresh.insert(id);
            }
        }
        rest = tail;
    }
    Ok(fresh)
}

/// PostgreSQL: every claim of a batch in one call of the
/// `inboxd_gate.claim_rows` gate (the host writes the inbox through it, from
/// a session that may be a handler's: see `db::logins`), whose text never
/// changes (so it stays prepared), the claims coming as arrays, a column
/// each. The gate inserts in the id order of [`claim_many`]: byte order
/// (`COLLATE "C"`), as Rust sorts them and SQLite compares them, so two hosts
/// claiming overlapping ids lock them in the same order.
const CLAIM_POSTGRES: &str = "SELECT inboxd_gate.claim_rows($1, $2, $3::pg_catalog.int8, \
     $4::pg_catalog.text[], $5::pg_catalog.text[], $6::pg_catalog.text[], $7::pg_catalog.int8[], \
     $8::pg_catalog.int8[], $9::pg_catalog.text[], $10::pg_catalog.int8[])";

async fn claim_postgres<'a>(
    tx: &mut Tx,
    sorted: &[&Claim<'a>],
    status: &str,
) -> Result<HashSet<String>, DbError> {
    let texts = |f: fn(&Claim<'a>) -> &'a str| PgArray::Texts(sorted.iter().map(|c| f(c)).collect());
    let ints = |f: fn(&Claim<'a>) -> i64| PgArray::Ints(sorted.iter().map(|c| f(c)).collect());
    let arrays = [
        texts(|c| c.handler),
        texts(|c| c.event_id),
        texts(|c| c.topic),
        ints(|c| i64::from(c.partition)),
        ints(|c| c.offset),
        texts(|c| c.handler_version),
        ints(|c| i64::from(crate::event_id::id_day(c.event_id))),
    ];
    let params = [status.into(), now_ms().into()];
    let mut fresh = HashSet::with_capacity(sorted.len());
    for row in tx.gate_arrays(CLAIM_POSTGRES, &params, &arrays).await? {
        if let Some(SqlValue::Text(id)) = row.into_iter().next() {
            fresh.insert(id);
        }
    }
    Ok(fresh)
}

/// SQLite: one multi-row INSERT per chunk, with anonymous parameters
/// (see [`anonymous_rows`](super::anonymous_rows)).
fn claim_many_sql(rows: usize) -> String {
    format!(
        r#"INSERT INTO inbox
(handler, event_id, status, topic, partition, "offset", handler_version, processed_at, id_day)
VALUES {}
ON CONFLICT DO NOTHING
RETURNING event_id"#,
        super::anonymous_rows(rows, CLAIM_COLUMNS)
    )
}

/// Takes back a claim made earlier in this transaction, when the event is to
/// run again later (a batch stops at an event whose handler asked to retry).
pub async fn unclaim(tx: &mut Tx, handler: &str, event_id: &str) -> Result<(), DbError> {
    delete_claim(tx, handler, event_id, "done").await.map(drop)
}

/// Deletes a dead event's claim, so a replay can claim it anew; `false` if
/// there was none (another replay took it first). The deletion is the
/// replay's lock: only one replay can make it.
pub async fn release_dead(tx: &mut Tx, handler: &str, event_id: &str) -> Result<bool, DbError> {
    Ok(delete_claim(tx, handler, event_id, "dead").await? == 1)
}

async fn delete_claim(tx: &mut Tx, handler: &str, event_id: &str, status: &str) -> Result<u64, DbError> {
    let params = [handler.into(), event_id.into(), status.into()];
    tx.host_count(
        "DELETE FROM inbox WHERE handler = $1 AND event_id = $2 AND status = $3",
        "SELECT inboxd_gate.unclaim($1, $2, $3, $4)",
        &params,
    )
    .await
}

/// Records the event as dead-lettered, claiming it if it was not yet claimed,
/// so a replayed copy is not run again by accident.
pub async fn mark_dead(tx: &mut Tx, claim: &Claim<'_>) -> Result<(), DbError> {
    if tx.backend() == Backend::Postgres {
        if claim_postgres(tx, &[claim], "dead").await?.is_empty() {
            tx.gate_void(
                "SELECT inboxd_gate.mark_dead($1, $2, $3)",
                &[claim.handler.into(), claim.event_id.into()],
            )
            .await?;
        }
        return Ok(());
    }
    if tx.execute(INSERT, &claim.params("dead")).await? == 0 {
        tx.execute(
            "UPDATE inbox SET status = 'dead' WHERE handler = $1 AND event_id = $2",
            &[claim.handler.into(), claim.event_id.into()],
        )
        .await?;
    }
    Ok(())
}

/// The status of an event for a handler, if it has one (tests and tooling).
pub async fn status(tx: &mut Tx, handler: &str, event_id: &str) -> Result<Option<String>, DbError> {
    let params = [handler.into(), event_id.into()];
    let rows = tx
        .host_rows(
            "SELECT status FROM inbox WHERE handler = $1 AND event_id = $2",
            "SELECT inboxd_gate.claim_status($1, $2, $3)",
            &params,
        )
        .await?;
    Ok(rows.into_iter().next().and_then(|mut r| match r.pop() {
        Some(SqlValue::Text(s)) => Some(s),
        _ => None,
    }))
}

/// Deletes at most `limit` rows processed before `cutoff_ms`, in one short
/// transaction; returns how many. Callers loop until fewer than `limit` go.
pub async fn purge_batch(db: &Database, cutoff_ms: i64, limit: i64) -> Result<u64, DbError> {
    let mut tx = db.begin().await?;
    let deleted = tx
        .execute(
            "DELETE FROM inbox WHERE (handler, event_id) IN
             (SELECT handler, event_id FROM inbox WHERE processed_at < $1 LIMIT $2)",
            &[cutoff_ms.into(), limit.into()],
        )
        .await?;
    tx.commit().await?;
    Ok(deleted)
}

/// How many rows a purge with this cutoff would delete (dry runs).
pub async fn count_older(db: &Database, cutoff_ms: i64) -> Result<i64, DbError> {
    db.query_i64(
        "SELECT COUNT(*) FROM inbox WHERE processed_at < $1",
        &[cutoff_ms.into()],
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::{each_backend, sqlite_db};

    fn claim_of(id: &str) -> Claim<'_> {
        Claim {
            handler: "billing",
            event_id: id,
            topic: "t",
            partition: 0,
            offset: 7,
            handler_version: "v1",
        }
    }

    #[tokio::test]
    async fn first_claim_wins_and_second_is_a_duplicate() {
        let db = sqlite_db().await;
        let mut tx = db.begin().await.unwrap();
        assert!(claim(&mut tx, &claim_of("e1")).await.unwrap());
        assert!(!claim(&mut tx, &claim_of("e1")).await.unwrap());
        tx.commit().await.unwrap();
        let mut tx = db.begin().await.unwrap();
        assert!(
            !claim(&mut tx, &claim_of("e1")).await.unwrap(),
            "duplicate after commit"
        );
        assert_eq!(
            status(&mut tx, "billing", "e1").await.unwrap().as_deref(),
            Some("done")
        );
    }

    #[tokio::test]
    async fn same_event_id_is_independent_per_handler() {
        let db = sqlite_db().await;
        let mut tx = db.begin().await.unwrap();
        assert!(claim(&mut tx, &claim_of("e1")).await.unwrap());
        let other = Claim {
            handler: "analytics",
            ..claim_of("e1")
        };
        assert!(claim(&mut tx, &other).await.unwrap());
    }

    #[tokio::test]
    async fn rolled_back_claim_can_be_claimed_again() {
        let db = sqlite_db().await;
        let mut tx = db.begin().await.unwrap();
        assert!(claim(&mut tx, &claim_of("e1")).await.unwrap());
        tx.rollback().await.unwrap();
        let mut tx = db.begin().await.unwrap();
        assert!(claim(&mut tx, &claim_of("e1")).await.unwrap());
    }

    #[tokio::test]
    async fn purge_deletes_only_old_rows_in_batches() {
        let db = sqlite_db().await;
        let mut tx = db.begin().await.unwrap();
        for i in 0..25 {
            claim(&mut tx, &claim_of(&format!("e{i}"))).await.unwrap();
        }
        tx.commit().await.unwrap();
        let cutoff = now_ms() + 1;
        let mut tx = db.begin().await.unwrap();
        assert!(claim(&mut tx, &claim_of("fresh")).await.unwrap());
        tx.execute(
            "UPDATE inbox SET processed_at = $1 WHERE event_id = 'fresh'",
            &[(cutoff + 10).into()],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(count_older(&db, cutoff).await.unwrap(), 25);
        assert_eq!(purge_batch(&db, cutoff, 10).await.unwrap(), 10);
        assert_eq!(purge_batch(&db, cutoff, 10).await.unwrap(), 10);
        assert_eq!(purge_batch(&db, cutoff, 10).await.unwrap(), 5);
        assert_eq!(purge_batch(&db, cutoff, 10).await.unwrap(), 0);
        let mut tx = db.begin().await.unwrap();
        assert_eq!(
            status(&mut tx, "billing", "fresh").await.unwrap().as_deref(),
            Some("done")
        );
        assert!(
            claim(&mut tx, &claim_of("e3")).await.unwrap(),
            "a purged id can be claimed again"
        );
    }

    #[tokio::test]
    async fn mark_dead_claims_or_updates() {
        let db = sqlite_db().await;
        let mut tx = db.begin().await.unwrap();
        mark_dead(&mut tx, &claim_of("fresh")).await.unwrap();
        assert!(claim(&mut tx, &claim_of("claimed")).await.unwrap());
        mark_dead(&mut tx, &claim_of("claimed")).await.unwrap();
        assert_eq!(
            status(&mut tx, "billing", "fresh").await.unwrap().as_deref(),
            Some("dead")
        );
        assert_eq!(
            status(&mut tx, "billing", "claimed").await.unwrap().as_deref(),
            Some("dead")
        );
        assert!(
            !claim(&mut tx, &claim_of("fresh")).await.unwrap(),
            "a dead event is not run again"
        );
    }

    #[tokio::test]
    async fn claiming_many_returns_only_the_new_ones() {
        for db in each_backend().await {
            let on = db.backend();
            let mut tx = db.begin().await.unwrap();
            assert!(claim(&mut tx, &claim_of("old")).await.unwrap());
            // Past one SQLite chunk, and a UUIDv7 so its id_day is not 0.
            let v7 = "01890a5d-ac96-774b-bcce-b302099a8057".to_owned();
            let ids: Vec<String> = (0..70)
                .map(|i| format!("e{i:02}"))
                .chain(["old".into(), v7.clone()])
                .collect();
            let claims: Vec<Claim<'_>> = ids.iter().map(|id| claim_of(id)).collect();
            let fresh = claim_many(&mut tx, &claims).await.unwrap();
            assert_eq!(fresh.len(), 71, "{on:?}");
            assert!(!fresh.contains("old"), "{on:?}: a duplicate is not returned");
            assert!(
                claim_many(&mut tx, &claims).await.unwrap().is_empty(),
                "{on:?}: all taken now"
            );
            // Every column as a lone claim writes it.
            let rows = tx
                .query(
                    "SELECT status, topic, partition, \"offset\", handler_version, id_day FROM inbox WHERE event_id = $1",
                    &[v7.as_str().into()],
                )
                .await
                .unwrap();
            let c = claim_of(&v7);
            let expected = vec![
                SqlValue::from("done"),
                c.topic.into(),
                c.partition.into(),
                c.offset.into(),
                c.handler_version.into(),
                crate::event_id::id_day(&v7).into(),
            ];
            assert_ne!(crate::event_id::id_day(&v7), 0);
            assert_eq!(rows, vec![expected], "{on:?}");
        }
    }
}
