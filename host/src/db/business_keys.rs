//! The `inbox_business_keys` table (`[handlers.dedup]`): which event holds a
//! business key, until when.
//!
//! A key is claimed in the transaction that runs its event, right before the
//! handler, with one upsert that takes the key only if nobody holds it, its
//! holder's window has passed, or the holder is this same event; so of two
//! events with one key, in two partitions or on two hosts, the database
//! lets one through and the other waits on the row, then finds it taken.
//! An event parked or sent back to retry releases its key in the same
//! transaction, so a key is held only by an event that was applied.

use super::{Database, DbError, SqlValue, Tx, now_ms};
use std::time::Duration;

const CLAIM: &str = "INSERT INTO inbox_business_keys (handler, business_key, event_id, expires_at) \
     VALUES ($1, $2, $3, $4) \
     ON CONFLICT (handler, business_key) DO UPDATE \
     SET event_id = excluded.event_id, expires_at = excluded.expires_at \
     WHERE inbox_business_keys.expires_at <= $5 OR inbox_business_keys.event_id = excluded.event_id";
const CLAIM_GATE: &str = "SELECT inboxd_gate.claim_business_key($1, $2, $3, $4, $5, $6)";

const RELEASE: &str =
    "DELETE FROM inbox_business_keys WHERE handler = $1 AND business_key = $2 AND event_id = $3";
const RELEASE_GATE: &str = "SELECT inboxd_gate.release_business_key($1, $2, $3, $4)";

/// Takes `key` for `event_id` for `window`; `false`: another event holds it
/// inside its window (this one is a duplicate by key).
pub async fn claim(
    tx: &mut Tx,
    handler: &str,
    key: &str,
    event_id: &str,
    window: Duration,
) -> Result<bool, DbError> {
    let now = now_ms();
    let expires_at = now.saturating_add(i64::try_from(window.as_millis()).unwrap_or(i64::MAX));
    let params: [SqlValue; 5] = [
        handler.into(),
        key.into(),
        event_id.into(),
        expires_at.into(),
        now.into(),
    ];
    Ok(tx.host_count(CLAIM, CLAIM_GATE, &params).await? == 1)
}

/// Frees `key` if `event_id` holds it (its event was parked, or goes back to
/// be retried).
pub async fn release(tx: &mut Tx, handler: &str, key: &str, event_id: &str) -> Result<(), DbError> {
    let params: [SqlValue; 3] = [handler.into(), key.into(), event_id.into()];
    tx.host_count(RELEASE, RELEASE_GATE, &params).await.map(drop)
}

/// Deletes up to `limit` keys whose window ended before `now`; the count
/// deleted. Run by the retention purge, in batches like the inbox's.
pub async fn purge_expired(db: &Database, now: i64, limit: i64) -> Result<u64, DbError> {
    let sql = "DELETE FROM inbox_business_keys WHERE (handler, business_key) IN \
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

    #[tokio::test]
    async fn a_key_is_held_by_one_event_inside_its_window_and_released_by_it_alone() {
        for db in each_backend().await {
            let hour = Duration::from_secs(3600);
            let mut tx = db.begin().await.unwrap();
            assert!(claim(&mut tx, "billing", "o-1", "e1", hour).await.unwrap());
            assert!(
                !claim(&mut tx, "billing", "o-1", "e2", hour).await.unwrap(),
                "held by e1"
            );
            assert!(
                claim(&mut tx, "billing", "o-1", "e1", hour).await.unwrap(),
                "its own"
            );
            assert!(
                claim(&mut tx, "emails", "o-1", "e2", hour).await.unwrap(),
                "per handler"
            );
            release(&mut tx, "billing", "o-1", "e2").await.unwrap();
            assert!(
                !claim(&mut tx, "billing", "o-1", "e3", hour).await.unwrap(),
                "not e2's to free"
            );
            release(&mut tx, "billing", "o-1", "e1").await.unwrap();
            assert!(
                claim(&mut tx, "billing", "o-1", "e3", hour).await.unwrap(),
                "free again"
            );
            // A window that has passed frees the key.
            assert!(
                claim(&mut tx, "billing", "o-2", "e4", Duration::ZERO)
                    .await
                    .unwrap()
            );
            assert!(
                claim(&mut tx, "billing", "o-2", "e5", hour).await.unwrap(),
                "{:?}",
                db.backend()
            );
            assert!(
                claim(&mut tx, "billing", "o-3", "e6", Duration::ZERO)
                    .await
                    .unwrap()
            );
            tx.commit().await.unwrap();
            // Only o-3's window has ended.
            assert_eq!(purge_expired(&db, now_ms(), 100).await.unwrap(), 1);
            assert_eq!(purge_expired(&db, now_ms(), 100).await.unwrap(), 0);
            let left = db
                .query_i64("SELECT COUNT(*) FROM inbox_business_keys", &[])
                .await
                .unwrap();
            assert_eq!(left, 3, "{:?}", db.backend());
        }
    }
}
