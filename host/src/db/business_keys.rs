//! The `inbox_business_keys` table (`[handlers.dedup]`): which event holds a
//! business key, until when.
//!
//! Keys are claimed in the transaction that claims their events, before any
//! handler runs: a batch's keys in one statement, in key order, so two
//! batches claiming overlapping keys wait for each other in the same order
//! instead of deadlocking (as `inbox::claim_many` does for event ids). The
//! upsert takes a key only if nobody holds it or its holder's window has
//! passed; so of two events with one key, in two partitions or on two hosts,
//! the database lets one through and the other waits on the row, then finds
//! it taken. An event parked or sent back to retry releases its key in the
//! same transaction, so a key is held only by an event that was applied.

use super::{Backend, Database, DbError, SqlValue, Tx, now_ms};
use std::collections::HashSet;
use std::time::Duration;

/// Keys claimed per SQLite statement, at most.
const CLAIM_CHUNK: usize = 64;

/// SQLite: `rows` claims in one upsert; RETURNING names the events that got
/// their key (inserted, or taken over from a holder whose window passed).
fn claim_sql(rows: usize) -> String {
    let values = vec!["(?, ?, ?, ?)"; rows].join(", ");
    format!(
        "INSERT INTO inbox_business_keys (handler, business_key, event_id, expires_at) VALUES {values} \
         ON CONFLICT (handler, business_key) DO UPDATE \
         SET event_id = excluded.event_id, expires_at = excluded.expires_at \
         WHERE inbox_business_keys.expires_at <= ? RETURNING event_id"
    )
}

/// PostgreSQL: the same through its gate, the claims as one JSON array.
const CLAIM_GATE: &str = "SELECT inboxd_gate.claim_business_keys($1, $2, $3::pg_catalog.json, $4)";

const RELEASE: &str =
    "DELETE FROM inbox_business_keys WHERE handler = $1 AND business_key = $2 AND event_id = $3";
const RELEASE_GATE: &str = "SELECT inboxd_gate.release_business_key($1, $2, $3, $4)";

/// Takes each `(key, event id)` of `claims` (keys distinct) for `window`;
/// returns the event ids that got their key. One whose key another event
/// holds inside its window is not among them (a duplicate by key). Even the
/// same event holding its own key counts as held: that happens only when
/// its inbox row was purged while its key was kept, and it is a duplicate.
pub async fn claim_many(
    tx: &mut Tx,
    handler: &str,
    claims: &[(&str, &str)],
    window: Duration,
) -> Result<HashSet<String>, DbError> {
    let mut sorted = claims.to_vec();
    sorted.sort_unstable();
    let now = now_ms();
    let expires_at = now.saturating_add(i64::try_from(window.as_millis()).unwrap_or(i64::MAX));
    let mut got = HashSet::with_capacity(claims.len());
    if tx.backend() == Backend::Postgres {
        let rows: Vec<serde_json::Value> = sorted
            .iter()
            .map(|(key, event_id)| {
                serde_json::json!({ "key": key, "event_id": event_id, "expires_at": expires_at })
            })
            .collect();
        let params = [
            handler.into(),
            serde_json::Value::Array(rows).to_string().into(),
            now.into(),
        ];
        for row in tx.gate(CLAIM_GATE, &params).await? {
            if let Some(SqlValue::Text(id)) = row.into_iter().next() {
                got.insert(id);
            }
        }
        return Ok(got);
    }
    for chunk in sorted.chunks(CLAIM_CHUNK) {
        let mut params: Vec<SqlValue> = chunk
            .iter()
            .flat_map(|(key, event_id)| {
                [
                    handler.into(),
                    (*key).into(),
                    (*event_id).into(),
                    expires_at.into(),
                ]
            })
            .collect();
        params.push(now.into());
        for row in tx.query(&claim_sql(chunk.len()), &params).await? {
            if let Some(SqlValue::Text(id)) = row.into_iter().next() {
                got.insert(id);
            }
        }
    }
    Ok(got)
}

/// Frees `key` if `event_id` holds it (its event was parked, or goes back to
/// be retried).
pub async fn release(tx: &mut Tx, handler: &str, key: &str, event_id: &str) -> Result<(), DbError> {
    let params: [SqlValue; 3] = [handler.into(), key.into(), event_id.into()];
    tx.host_count(RELEASE, RELEASE_GATE, &params).await.map(drop)
}

/// Deletes up to `limit` keys whose window ended before `now`; the count
/// deleted. Run by the retention purge, in batches like the inbox's. The
/// outer condition is checked again on the row as it is when deleted: a key
/// that an event took over meanwhile (a new window) stays.
pub async fn purge_expired(db: &Database, now: i64, limit: i64) -> Result<u64, DbError> {
    let sql = "DELETE FROM inbox_business_keys WHERE expires_at <= $1 AND (handler, business_key) IN \
               (SELECT handler, business_key FROM inbox_business_keys WHERE expires_at <= $1 LIMIT $2)";
    let mut tx = db.begin().await?;
    let deleted = tx.execute(sql, &[now.into(), limit.into()]).await?;
    tx.commit().await?;
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::each_backend;

    async fn claim(tx: &mut Tx, handler: &str, key: &str, event_id: &str, window: Duration) -> bool {
        let got = claim_many(tx, handler, &[(key, event_id)], window).await.unwrap();
        got.contains(event_id)
    }

    #[tokio::test]
    async fn a_key_is_held_by_one_event_inside_its_window_and_released_by_it_alone() {
        for db in each_backend().await {
            let on = db.backend();
            let hour = Duration::from_secs(3600);
            let mut tx = db.begin().await.unwrap();
            assert!(claim(&mut tx, "billing", "o-1", "e1", hour).await);
            assert!(
                !claim(&mut tx, "billing", "o-1", "e2", hour).await,
                "{on:?}: held by e1"
            );
            assert!(
                !claim(&mut tx, "billing", "o-1", "e1", hour).await,
                "{on:?}: even by itself"
            );
            assert!(
                claim(&mut tx, "emails", "o-1", "e2", hour).await,
                "{on:?}: per handler"
            );
            release(&mut tx, "billing", "o-1", "e2").await.unwrap();
            assert!(
                !claim(&mut tx, "billing", "o-1", "e3", hour).await,
                "{on:?}: not e2's to free"
            );
            release(&mut tx, "billing", "o-1", "e1").await.unwrap();
            assert!(
                claim(&mut tx, "billing", "o-1", "e3", hour).await,
                "{on:?}: free again"
            );
            // A window that has passed frees the key.
            assert!(claim(&mut tx, "billing", "o-2", "e4", Duration::ZERO).await);
            assert!(claim(&mut tx, "billing", "o-2", "e5", hour).await, "{on:?}");
            assert!(claim(&mut tx, "billing", "o-3", "e6", Duration::ZERO).await);
            // Many at once, some taken: the ids that got theirs.
            let many = [("o-9", "e9"), ("o-1", "e10"), ("o-8", "e8")];
            let got = claim_many(&mut tx, "billing", &many, hour).await.unwrap();
            let expected: HashSet<String> = ["e8", "e9"].map(String::from).into();
            assert_eq!(got, expected, "{on:?}");
            tx.commit().await.unwrap();
            // Only o-3's window has ended.
            assert_eq!(purge_expired(&db, now_ms(), 100).await.unwrap(), 1);
            assert_eq!(purge_expired(&db, now_ms(), 100).await.unwrap(), 0);
            let left = db
                .query_i64("SELECT COUNT(*) FROM inbox_business_keys", &[])
                .await
                .unwrap();
            assert_eq!(left, 5, "{on:?}");
        }
    }

    /// A purge that meets a key an event is taking over keeps it: without
    /// the outer condition, PostgreSQL's re-check after waiting on the row
    /// looked at the subquery's stale row and deleted the fresh claim.
    #[tokio::test]
    async fn a_purge_keeps_a_key_taken_over_while_it_waited() {
        for db in each_backend().await {
            let on = db.backend();
            let mut tx = db.begin().await.unwrap();
            assert!(claim(&mut tx, "billing", "o-1", "e1", Duration::ZERO).await);
            tx.commit().await.unwrap();
            let cutoff = now_ms() + 1;
            let mut taking = db.begin().await.unwrap();
            assert!(claim(&mut taking, "billing", "o-1", "e2", Duration::from_secs(3600)).await);
            let purge = tokio::spawn({
                let db = db.clone();
                async move { purge_expired(&db, cutoff, 100).await.unwrap() }
            });
            if on == Backend::Postgres {
                // The purge is waiting on the row the claim holds.
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                let waiting = "SELECT COUNT(*) FROM pg_stat_activity \
                               WHERE wait_event_type = 'Lock' AND query LIKE 'DELETE FROM inbox_business_keys%'";
                while db.query_i64(waiting, &[]).await.unwrap() == 0 {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the purge never waited on the row"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            taking.commit().await.unwrap();
            assert_eq!(purge.await.unwrap(), 0, "{on:?}: the taken-over key was deleted");
            let held = db
                .query_i64(
                    "SELECT COUNT(*) FROM inbox_business_keys WHERE event_id = 'e2'",
                    &[],
                )
                .await
                .unwrap();
            assert_eq!(held, 1, "{on:?}");
        }
    }
}
