//! Regression (the nineteenth adversarial read, issue 23): a handler's sort
//! on SQLite spilled runs of two 1 MiB rows, and merging them read one row
//! of every run into the host's memory in one uninterruptible step (2,000
//! rows: 1.93 GB). See `sandbox::sqlite_memory`.

use super::*;
use crate::sandbox::sqlite_memory::{CACHE_KIB, HARD_HEAP_BYTES, hard_heap_limit};

#[tokio::test]
async fn sqlite_sorts_spill_large_runs_and_the_heap_has_a_ceiling() {
    let db = sqlite_db().await;
    assert_eq!(hard_heap_limit(), HARD_HEAP_BYTES);
    let h = handler(&db, "wt_sorts").await;
    let mut tx = db.begin_write().await.unwrap();
    let cache = tx.query("PRAGMA cache_size", &[]).await.unwrap();
    assert_eq!(
        cache[0][0],
        SqlValue::Int64(-CACHE_KIB),
        "every connection's cache"
    );
    tx.enter_guest(CALL, &h).await.unwrap();
    tx.set_ctes(["r".to_owned()].into());
    // 400 sort keys of 1 MB: in runs of two rows each, 200 runs merged, 219
    // MB of SQLite's heap at once; in runs of 64, seven runs and 74 MB; in
    // runs of 32, thirteen.
    let key = SqlValue::from("x".repeat(1_000_000));
    reset_highwater();
    let sorted = tx
        .guest_query(
            "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 400) \
             SELECT r.x FROM r ORDER BY $1 || r.x DESC",
            std::slice::from_ref(&key),
            1_000,
            1 << 20,
        )
        .await
        .unwrap();
    let held = reset_highwater();
    assert_eq!(sorted.len(), 400);
    assert_eq!(sorted[0][0], SqlValue::Int64(99), "'x...99' sorts last of all");
    assert!(
        held < 150 << 20,
        "the sort held {} MB of SQLite's heap",
        held >> 20
    );
    tx.exit_guest(CALL, true).await.unwrap();
    tx.commit().await.unwrap();
}

/// SQLite's own high-water mark of its heap since the last reset (of the
/// whole process: other tests only raise it).
fn reset_highwater() -> i64 {
    // SAFETY: reads and resets a process-wide counter.
    unsafe { libsqlite3_sys::sqlite3_memory_highwater(1) }
}
