//! Guest statements whose caller went away or stopped reading: they end at
//! once instead of running on, past their deadline, under the host's next
//! work on the connection (SQLite: the write lock held for good).

use super::*;

/// Regression (the seventh read of this round, issue 23): a transaction
/// dropped while its guest statement ran (a replay whose client went away)
/// took the walls, and with them the deadline, down under the running
/// statement, which then held SQLite's write lock for good. Now the
/// statement is interrupted and the next writer commits at once.
#[tokio::test]
async fn a_transaction_dropped_mid_statement_stops_its_statement() {
    let db = sqlite_db().await;
    let h = handler(&db, "wt_dropped").await;
    let mut fill = db.begin_write().await.unwrap();
    let rows = "INSERT INTO wt_dropped_t WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000) SELECT i FROM n";
    fill.execute(rows, &[]).await.unwrap();
    fill.commit().await.unwrap();
    let mut tx = db.begin_guest(h.handler()).await.unwrap();
    // It holds the write lock, as a batch or a replay does.
    assert!(claim(&mut tx, "wt_dropped", "before").await.unwrap());
    tx.enter_guest(CALL, &h).await.unwrap();
    // 10^12 rows to count: it runs until something stops it.
    let endless = "SELECT count(*) FROM wt_dropped_t a, wt_dropped_t b, wt_dropped_t c, wt_dropped_t d";
    let ran = tokio::time::timeout(
        Duration::from_millis(300),
        tx.guest_query(endless, &[], 1, 1 << 20),
    )
    .await;
    assert!(
        ran.is_err(),
        "the statement is still running when its caller gives up: {ran:?}"
    );
    drop(tx);
    let started = std::time::Instant::now();
    let mut host = tokio::time::timeout(Duration::from_secs(10), db.begin_write())
        .await
        .expect("the writer is free again")
        .unwrap();
    assert!(claim(&mut host, "wt_dropped", "after").await.unwrap());
    host.commit().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        claims(&db).await,
        ["after"],
        "the dropped transaction was rolled back"
    );
}

/// Regression (the eighth read of this round, issue 23): a guest query the
/// host stopped reading at its row bound ran on in sqlx's worker, and once
/// the walls came down (the host's next statement) nothing stopped it: the
/// transaction's RELEASE queued behind it for good, with SQLite's write lock
/// held. Now it is interrupted while the walls are still up.
#[tokio::test]
async fn a_query_stopped_at_its_row_bound_stops_running() {
    let db = sqlite_db().await;
    let h = handler(&db, "wt_bound").await;
    let mut fill = db.begin_write().await.unwrap();
    let rows = "INSERT INTO wt_bound_t WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000) SELECT i FROM n";
    fill.execute(rows, &[]).await.unwrap();
    fill.commit().await.unwrap();
    let work = async {
        let mut tx = db.begin_guest(h.handler()).await.unwrap();
        assert!(claim(&mut tx, "wt_bound", "e1").await.unwrap());
        tx.enter_guest(CALL, &h).await.unwrap();
        // Two rows at once, then 10^12 combinations that match nothing.
        let sql = "SELECT a.a FROM wt_bound_t a, wt_bound_t b, wt_bound_t c, wt_bound_t d \
                   WHERE a.a = 1 AND b.a = 1 AND c.a = 1 AND d.a <= 2 OR d.a = 0";
        let err = tx.guest_query(sql, &[], 1, 1 << 20).await.unwrap_err();
        assert!(matches!(err, DbError::TooManyRows { limit: 1 }), "{err}");
        // The handler took the error and returned: its call is kept.
        tx.exit_guest(CALL, true).await.unwrap();
        assert!(claim(&mut tx, "wt_bound", "e2").await.unwrap());
        tx.commit().await.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .expect("the transaction ended: nothing ran on behind it");
    assert_eq!(claims(&db).await, ["e1", "e2"]);
}

/// Regression (the fifteenth read of this round, issue 23): a result was
/// weighed by its values' bytes, so empty texts weighed nothing while the
/// host held 32 bytes for each (1,664 a row on PostgreSQL, 100,000 rows:
/// 5 GB). Each value now weighs what the host holds for it, each row too.
#[tokio::test]
async fn empty_values_count_toward_the_result_bound() {
    let db = sqlite_db().await;
    let h = handler(&db, "wt_empty").await;
    let mut fill = db.begin_write().await.unwrap();
    let rows = "INSERT INTO wt_empty_t WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000) SELECT i FROM n";
    fill.execute(rows, &[]).await.unwrap();
    fill.commit().await.unwrap();
    let mut tx = db.begin_guest(h.handler()).await.unwrap();
    assert!(claim(&mut tx, "wt_empty", "e1").await.unwrap());
    tx.enter_guest(CALL, &h).await.unwrap();
    let sql = "SELECT '', '', '', '' FROM wt_empty_t";
    let err = tx.guest_query(sql, &[], 10_000, 32 << 10).await.unwrap_err();
    assert!(matches!(err, DbError::ResultTooLarge { .. }), "{err}");
    tx.exit_guest(CALL, true).await.unwrap();
    tx.commit().await.unwrap();
}
