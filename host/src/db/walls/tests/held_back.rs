//! PostgreSQL's optimistic batches (issue 24): plain one-row INSERTs of
//! calls that share a savepoint are held back and sent together, inside
//! the walls and under the call's own timeout.

use super::*;

/// A transaction in an optimistic batch's mode, inside one call of `h`.
async fn shared_call(db: &Database, h: &Walls) -> Tx {
    let mut tx = db.begin_guest(h.handler()).await.unwrap();
    tx.share_guest_savepoint(true);
    tx.enter_guest(CALL, h).await.unwrap();
    tx.set_statement_savepoints(false);
    tx
}

/// PostgreSQL, an optimistic batch (issue 24): plain one-row INSERTs are held
/// back and sent together, inside the walls, before the call's next other
/// statement (which sees them) and before the host's; a failed call drops
/// its held rows with the savepoint; a held row that fails when sent fails
/// the batch as [`DbError::DeferredFailed`], for the pipeline to rerun call
/// by call.
#[tokio::test]
async fn postgres_plain_inserts_of_shared_calls_go_out_together_and_in_order() {
    let Some(db) = crate::db::test_support::postgres_db().await else {
        return;
    };
    let h = handler(&db, "wt_defer").await;
    let sql = "INSERT INTO wt_defer_t (a) VALUES ($1)";
    let insert = std::sync::Arc::new(crate::sandbox::postgres::PlainInsert::of(sql).unwrap());
    async fn call(
        tx: &mut Tx,
        insert: &std::sync::Arc<crate::sandbox::postgres::PlainInsert>,
        a: i64,
    ) -> Result<u64, DbError> {
        tx.guest_execute_approved(
            "INSERT INTO wt_defer_t (a) VALUES ($1)",
            &[a.into()],
            Some(insert),
            true,
        )
        .await
    }
    let mut tx = db.begin_guest(h.handler()).await.unwrap();
    tx.share_guest_savepoint(true);
    for a in 1..=3 {
        tx.enter_guest(CALL, &h).await.unwrap();
        tx.set_statement_savepoints(false);
        assert_eq!(call(&mut tx, &insert, a).await.unwrap(), 1);
        if a == 3 {
            // The call's own read sees its rows and the earlier calls'.
            let seen = tx
                .guest_query("SELECT count(*) FROM wt_defer_t", &[], 10, 1 << 20)
                .await
                .unwrap();
            assert_eq!(seen, vec![vec![SqlValue::Int64(3)]]);
        }
        tx.exit_guest(CALL, true).await.unwrap();
    }
    assert!(claim(&mut tx, "wt_defer", "e1").await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(rows(&db, &h).await, [1, 2, 3]);

    // Held, then dropped with a failed call's savepoint (as every call that
    // shares it is).
    let mut tx = shared_call(&db, &h).await;
    call(&mut tx, &insert, 4).await.unwrap();
    tx.exit_guest(CALL, false).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(rows(&db, &h).await, [1, 2, 3]);

    // A row that cannot be written (not an integer) fails only when sent.
    let mut tx = shared_call(&db, &h).await;
    call(&mut tx, &insert, 5).await.unwrap();
    let text = tx
        .guest_execute_approved(sql, &["five".into()], Some(&insert), true)
        .await;
    assert_eq!(text.unwrap(), 1, "held back, not sent yet");
    tx.exit_guest(CALL, true).await.unwrap();
    let err = claim(&mut tx, "wt_defer", "e2").await.unwrap_err();
    assert!(matches!(err, DbError::DeferredFailed(_)), "{err}");
    drop(tx);
    assert_eq!(rows(&db, &h).await, [1, 2, 3]);
    assert_eq!(claims(&db).await, ["e1"]);

    // Regression (the eleventh adversarial read): a row of fewer or more
    // parameters than the INSERT names is never held back (too few
    // panicked the host when sent, too many shifted into the next row): it
    // runs at once, as it would alone. PostgreSQL refuses too few and
    // ignores parameters the text does not name.
    let mut tx = shared_call(&db, &h).await;
    call(&mut tx, &insert, 6).await.unwrap();
    let err = tx
        .guest_execute_approved(sql, &[], Some(&insert), true)
        .await
        .expect_err("no parameter for $1");
    assert!(err.to_string().contains("parameter"), "{err}");
    assert!(tx.take_statement_failed());
    drop(tx);
    let mut tx = shared_call(&db, &h).await;
    call(&mut tx, &insert, 6).await.unwrap();
    let extra = [SqlValue::Int64(7), SqlValue::Int64(8)];
    assert_eq!(
        tx.guest_execute_approved(sql, &extra, Some(&insert), true)
            .await
            .unwrap(),
        1
    );
    call(&mut tx, &insert, 9).await.unwrap();
    tx.exit_guest(CALL, true).await.unwrap();
    assert!(claim(&mut tx, "wt_defer", "e3").await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(rows(&db, &h).await, [1, 2, 3, 6, 7, 9]);
}

/// Regression (the twenty-fifth adversarial read, issue 23): rows held back
/// by an optimistic batch were sent before the host's next statement with
/// only a host statement's bound on the round trip (15 s), while the call's
/// walls let them run its whole `statement_timeout` (up to 30 s), and no
/// answer in time was taken for the network's failure and retried for good.
/// Now they are sent under the call's timeout, and what fails there is the
/// batch's, to run again call by call.
#[tokio::test]
async fn postgres_held_back_rows_are_sent_under_their_calls_timeout() {
    let Some(db) = crate::db::test_support::postgres_db().await else {
        return;
    };
    let h = handler(&db, "wt_slow").await;
    // Each row's CHECK sleeps 0.3 s (made as the suite's superuser: no
    // handler could).
    let table = table(&db, &h);
    db.query(
        "CREATE FUNCTION public.inboxd_test_slow() RETURNS boolean LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(0.3); RETURN true; END $$",
        &[],
    )
    .await
    .unwrap();
    db.query(
        &format!("ALTER TABLE {table} ADD CONSTRAINT slow CHECK (public.inboxd_test_slow())"),
        &[],
    )
    .await
    .unwrap();
    let sql = "INSERT INTO wt_slow_t (a) VALUES ($1)";
    let insert = std::sync::Arc::new(crate::sandbox::postgres::PlainInsert::of(sql).unwrap());
    let held_back = |walls: Walls, host: Duration, event: &'static str| {
        let (db, insert) = (db.clone(), insert.clone());
        async move {
            let mut tx = shared_call(&db, &walls).await;
            tx.bound_host_round_trips_for_test(host);
            for a in 1..=3 {
                if a > 1 {
                    tx.enter_guest(CALL, &walls).await.unwrap();
                }
                let params = [SqlValue::from(a)];
                let n = tx.guest_execute_approved(sql, &params, Some(&insert), true).await;
                assert_eq!(n.unwrap(), 1, "held back");
                tx.exit_guest(CALL, true).await.unwrap();
            }
            let claimed = claim(&mut tx, "wt_slow", event).await;
            if claimed.is_ok() {
                tx.commit().await.unwrap();
            }
            claimed
        }
    };
    // 0.9 s of rows against a host bound of 0.25 s: sent under the call's 5 s.
    // (The bound is the claim's own round trip too: at 0.1 s a loaded machine
    // once took longer for it.)
    let claimed = held_back(h.clone(), Duration::from_millis(250), "e1").await;
    assert!(claimed.unwrap(), "sent within the call's timeout");
    assert_eq!(rows(&db, &h).await, [1, 2, 3]);
    // Past the call's own timeout: the batch's to run again, not an outage.
    let short = Walls::load(&db, "wt_slow", Duration::from_millis(400))
        .await
        .unwrap();
    let err = held_back(short, Duration::from_millis(250), "e2")
        .await
        .unwrap_err();
    assert!(matches!(err, DbError::DeferredFailed(_)), "{err:?}");
    assert!(!err.is_transient(), "{err:?}");
    assert_eq!(rows(&db, &h).await, [1, 2, 3]);
}
