//! PostgreSQL's handler sessions (issue 23): a handler's walls go up only on
//! its own login, nothing a guest does to its session reaches the next
//! transaction, a call stuck past every deadline is abandoned, a broken login
//! is renewed, and the gates hold a session to its own handler's rows. Each
//! test returns at once when `INBOXD_TEST_POSTGRES` is not set.

use super::*;

/// PostgreSQL: a handler's walls go up only on a session of its own login;
/// on the host's session or another handler's, the host refuses (its SQL
/// would run with that session's privileges).
#[tokio::test]
async fn postgres_walls_go_up_only_on_the_handlers_own_session() {
    let Some(db) = crate::db::test_support::postgres_db().await else {
        return;
    };
    let a = handler(&db, "wt_own_a").await;
    let b = handler(&db, "wt_own_b").await;
    for mut tx in [
        db.begin().await.unwrap(),
        db.begin_guest(a.handler()).await.unwrap(),
    ] {
        let err = tx.enter_guest(CALL, &b).await.unwrap_err();
        assert!(matches!(err, DbError::NotHandlerSession { .. }), "{err}");
        let migration = Walls::new(b.handler(), Scope::Migration, &[], Duration::from_secs(5));
        assert!(matches!(
            tx.enter_walls(&migration).await,
            Err(DbError::NotHandlerSession { .. })
        ));
        tx.rollback().await.unwrap();
    }
    // On its own session, b's call cannot reach a's table either: the
    // database refuses it, not only the guard.
    let mut tx = db.begin_guest(b.handler()).await.unwrap();
    tx.enter_guest(CALL, &b).await.unwrap();
    let theirs = format!("SELECT a FROM {}", table(&db, &a));
    let err = tx.guest_query(&theirs, &[], 10, 1 << 20).await.unwrap_err();
    assert!(err.to_string().contains("permission denied"), "{err}");
}

/// Regression (issue 23): settings made with `set_config(..., false)` and
/// session-level advisory locks stayed on the pooled connection, and the
/// host's next transaction on it failed with `relation "inbox" does not
/// exist`. Sent past the guard (as a statement it missed would be), none of
/// it reaches the next transaction on the same connection.
#[tokio::test]
async fn postgres_nothing_a_guest_does_to_its_session_outlives_the_transaction() {
    let Some(url) = crate::db::test_support::postgres_url().await else {
        return;
    };
    let db = OneConnection::new(&url, None).await;
    let h = handler(&db, "wt_session").await;
    let before = connection_id(&db, h.handler()).await;
    let mut tx = db.begin_guest(h.handler()).await.unwrap();
    tx.enter_guest(CALL, &h).await.unwrap();
    for sql in [
        "SELECT set_config('search_path', 'public', false)",
        "SELECT set_config('statement_timeout', '3600000', false)",
        "SELECT set_config('synchronous_commit', 'off', false)",
        "SELECT set_config('default_transaction_read_only', 'on', false)",
        "SELECT pg_advisory_lock(4242)",
        "SELECT pg_advisory_lock_shared(4243)",
        "LISTEN wt_channel",
        "DECLARE wt_cursor CURSOR WITH HOLD FOR SELECT 1",
        "CREATE TEMP TABLE wt_left_behind (a INTEGER)",
    ] {
        tx.guest_execute(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    tx.exit_guest(CALL, true).await.unwrap();
    assert!(claim(&mut tx, "wt_session", "e1").await.unwrap());
    tx.commit().await.unwrap();
    // The same connection (the pool has one), with none of it.
    assert_eq!(
        connection_id(&db, h.handler()).await,
        before,
        "the connection was replaced"
    );
    let mut next = db.begin_guest(h.handler()).await.unwrap();
    let row = next
        .query(
            "SELECT current_setting('search_path'), current_setting('statement_timeout'), \
             current_setting('synchronous_commit'), current_setting('default_transaction_read_only'), \
             (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()), \
             (SELECT count(*) FROM pg_listening_channels()), (SELECT count(*) FROM pg_cursors WHERE name <> ''), \
             to_regclass('pg_temp.wt_left_behind') IS NULL",
            &[],
        )
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        row,
        [
            SqlValue::Text("handler_wt_session,pg_catalog,pg_temp".into()),
            SqlValue::Text("0".into()),
            SqlValue::Text("on".into()),
            SqlValue::Text("off".into()),
            SqlValue::Int64(0),
            SqlValue::Int64(0),
            SqlValue::Int64(0),
            SqlValue::Boolean(true),
        ]
    );
    assert!(claim(&mut next, "wt_session", "e2").await.unwrap());
    next.commit().await.unwrap();
    assert_eq!(claims(&db).await, ["e1", "e2"]);
    // A statement the guest prepared could collide with the driver's own
    // names: its connection is closed, not reused.
    let mut tx = db.begin_guest(h.handler()).await.unwrap();
    tx.enter_guest(CALL, &h).await.unwrap();
    tx.guest_execute("PREPARE wt_guest_made AS SELECT 1", &[])
        .await
        .unwrap();
    tx.exit_guest(CALL, true).await.unwrap();
    tx.commit().await.unwrap();
    assert_ne!(
        connection_id(&db, h.handler()).await,
        before,
        "a connection with a guest's PREPARE was reused"
    );
}

/// Regression (issue 23): a statement PostgreSQL did not interrupt at its
/// `statement_timeout` ran for minutes, and the event's next attempt waited
/// on the claim it held. A call stuck past its deadline is abandoned: its
/// backend is terminated and the transaction replaced by a new one, reported
/// as lost, in which the event can be claimed (or parked) at once.
#[tokio::test]
async fn postgres_a_call_stuck_past_every_deadline_is_abandoned_and_its_claim_released() {
    let Some(db) = crate::db::test_support::postgres_db().await else {
        return;
    };
    let h = handler(&db, "wt_stuck").await;
    let mut tx = db.begin_guest(h.handler()).await.unwrap();
    assert!(claim(&mut tx, "wt_stuck", "e1").await.unwrap());
    tx.enter_guest(CALL, &h).await.unwrap();
    // As a statement the database does not interrupt would behave: no
    // timeout stops it (sent past the guard, which refuses both).
    tx.guest_execute("SELECT set_config('statement_timeout', '0', true)", &[])
        .await
        .unwrap();
    let marker = format!("wt_stuck_{}", uuid::Uuid::new_v4().simple());
    let sleep = format!("SELECT pg_sleep(60) /* {marker} */");
    let stuck = tokio::time::timeout(Duration::from_secs(1), tx.guest_execute(&sleep, &[])).await;
    assert!(stuck.is_err(), "the statement should still be running");
    let started = std::time::Instant::now();
    tx.abandon_stuck_call().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    tx.exit_guest(CALL, false).await.unwrap();
    assert!(tx.take_lost(), "the caller is told the transaction was replaced");
    // The old transaction's claim went with it: claimed again at once.
    assert!(claim(&mut tx, "wt_stuck", "e1").await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(claims(&db).await, ["e1"]);
    let running = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%{marker}%' AND pid <> pg_backend_pid()"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let left = db.query_i64(&running, &[]).await.unwrap();
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the stuck statement is still running"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A handler's role is shared by every database on the server, so another
/// database's host may have set a new password (here: taken its login away):
/// the first failed login sets this database's anew, and the next one works.
#[tokio::test]
async fn postgres_a_login_that_no_longer_works_is_renewed_once() {
    let Some(url) = crate::db::test_support::postgres_url().await else {
        return;
    };
    let first = OneConnection::new(&url, None).await;
    let h = handler(&first, "wt_renew_login").await;
    // A host that has no connection of the handler's open yet.
    let db = Database::connect(&url, 2).await.unwrap();
    let password = "SELECT password FROM handler_logins WHERE handler = 'wt_renew_login'";
    let before = db.query(password, &[]).await.unwrap();
    // Under password authentication (the suite's server asks every login but
    // the host's for one), a password set elsewhere fails as surely.
    let mut host = db.begin().await.unwrap();
    host.execute(
        "ALTER ROLE inboxd_handler_wt_renew_login NOLOGIN PASSWORD 'elsewhere'",
        &[],
    )
    .await
    .unwrap();
    host.commit().await.unwrap();
    let mut tx = db.begin_guest(h.handler()).await.unwrap();
    tx.enter_guest(CALL, &h).await.unwrap();
    guest_insert(&mut tx, &h, 1).await.unwrap();
    tx.exit_guest(CALL, true).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(rows(&db, &h).await, [1]);
    assert_ne!(
        db.query(password, &[]).await.unwrap(),
        before,
        "a new password was set"
    );
    // The server holds its SCRAM verifier, never the password itself.
    let stored = db
        .query(
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'inboxd_handler_wt_renew_login'",
            &[],
        )
        .await;
    if let Ok(rows) = stored {
        let text = format!("{rows:?}");
        assert!(text.contains("SCRAM-SHA-256$4096:"), "{text}");
        let kept = format!("{:?}", db.query(password, &[]).await.unwrap());
        let plain = kept.split('"').nth(1).unwrap_or_default();
        assert!(!plain.is_empty() && !text.contains(plain), "{text}");
    }
}

/// Defence in depth: even with the host's key (here, the host's own gate
/// calls), a handler's session writes only that handler's rows.
#[tokio::test]
async fn postgres_a_handlers_session_cannot_write_another_handlers_rows_through_the_gates() {
    let Some(db) = crate::db::test_support::postgres_db().await else {
        return;
    };
    let a = handler(&db, "wt_gate_a").await;
    handler(&db, "wt_gate_b").await;
    let mut tx = db.begin_guest(a.handler()).await.unwrap();
    let err = claim(&mut tx, "wt_gate_b", "e1").await.unwrap_err();
    assert!(
        err.to_string()
            .contains("may not write the rows of handler wt_gate_b"),
        "{err}"
    );
    tx.rollback().await.unwrap();
    let mut tx = db.begin_guest(a.handler()).await.unwrap();
    assert!(claim(&mut tx, "wt_gate_a", "e1").await.unwrap());
    tx.commit().await.unwrap();
    // The host's own session may write any handler's.
    let mut host = db.begin().await.unwrap();
    assert!(claim(&mut host, "wt_gate_b", "e2").await.unwrap());
    host.commit().await.unwrap();
    assert_eq!(claims(&db).await, ["e1", "e2"]);
}

/// Regression (the ninth adversarial read, issue 23): PostgreSQL infers a
/// NULL parameter's type (here numeric), sqlx finds a prepared statement by
/// its text alone, so a blob sent later to the same text went raw into
/// numeric's binary decoder: crafted digits ran 9.8 s in one row against a
/// 5 s limit. A statement is prepared per kinds of its parameters, so the
/// blob meets a statement of its own, prepared for a blob.
#[tokio::test]
async fn postgres_a_parameter_is_typed_by_its_own_kind_on_every_call() {
    let Some(url) = crate::db::test_support::postgres_url().await else {
        return;
    };
    let db = OneConnection::new(&url, None).await;
    let h = handler(&db, "wt_kinds").await;
    let sql = "SELECT ($1 + 0.0)::text";
    let mut tx = db.begin_guest(h.handler()).await.unwrap();
    tx.enter_guest(CALL, &h).await.unwrap();
    let primed = tx.guest_query(sql, &[SqlValue::Null], 10, 1 << 20).await.unwrap();
    assert_eq!(primed, vec![vec![SqlValue::Null]]);
    tx.exit_guest(CALL, true).await.unwrap();
    tx.commit().await.unwrap();
    // 12345 in numeric's binary form: 2 digit groups, weight 1, sign +, scale 0.
    let numeric = vec![0, 2, 0, 1, 0, 0, 0, 0, 0, 1, 0x09, 0x29];
    let mut tx = db.begin_guest(h.handler()).await.unwrap();
    tx.enter_guest(CALL, &h).await.unwrap();
    let result = tx.guest_query(sql, &[SqlValue::Blob(numeric)], 10, 1 << 20).await;
    let err = result.expect_err("the blob was read as a numeric").to_string();
    assert!(err.contains("operator does not exist: bytea + numeric"), "{err}");
}

/// Regression (the eighteenth adversarial read, issue 23): JIT compilation
/// ignores cancel and terminate (a 3,000-arm CASE ran 14.7 s past a 1 s
/// statement_timeout), a hash join over one key grows without bound (2 GB
/// from 2,000 rows), and parallel workers multiply a statement's memory and
/// cores. A handler's session starts with all three off, and a guest that
/// turns them on (past the guard) leaves them off for the next transaction.
#[tokio::test]
async fn postgres_handler_sessions_run_without_jit_hash_joins_or_parallel_workers() {
    let Some(url) = crate::db::test_support::postgres_url().await else {
        return;
    };
    let db = OneConnection::new(&url, None).await;
    let h = handler(&db, "wt_planner").await;
    let settings = "SELECT current_setting('jit') || current_setting('enable_hashjoin') \
                    || current_setting('enable_hashagg') \
                    || current_setting('max_parallel_workers_per_gather') \
                    || current_setting('max_parallel_maintenance_workers') \
                    || current_setting('client_connection_check_interval') \
                    || current_setting('temp_file_limit') \
                    || current_setting('standard_conforming_strings') || current_setting('backslash_quote') \
                    || current_setting('work_mem') || current_setting('geqo') \
                    || current_setting('geqo_threshold') || current_setting('join_collapse_limit') \
                    || current_setting('from_collapse_limit')";
    // Regression (the nineteenth adversarial read): a role's (or the
    // server's) standard_conforming_strings = off would read '\' as an
    // escaped quote, which neither of the guard's parsers does.
    let mut host = db.begin().await.unwrap();
    host.execute(
        "ALTER ROLE inboxd_handler_wt_planner SET standard_conforming_strings = off",
        &[],
    )
    .await
    .unwrap();
    host.commit().await.unwrap();
    for turn_on in [true, false] {
        let mut tx = db.begin_guest(h.handler()).await.unwrap();
        tx.enter_guest(CALL, &h).await.unwrap();
        let rows = tx.guest_query(settings, &[], 10, 1 << 20).await.unwrap();
        // The suite's server sets no temp_file_limit and its host login may
        // set one for the handler's role (see `migrate::bound_temp_files`).
        assert_eq!(
            rows,
            [vec![SqlValue::Text("offoffoff001s1GBonoff1MBon888".into())]]
        );
        if turn_on {
            for sql in [
                "SELECT set_config('jit', 'on', false)",
                "SELECT set_config('enable_hashjoin', 'on', false)",
                "SELECT set_config('max_parallel_workers_per_gather', '4', false)",
                "SELECT set_config('geqo_threshold', '20', false)",
            ] {
                tx.guest_execute(sql, &[])
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
        }
        tx.exit_guest(CALL, true).await.unwrap();
        tx.commit().await.unwrap();
    }
}

/// Regression (the twenty-second adversarial read, issue 23): a session
/// kept every guest statement prepared, up to 100, each with its plan, and
/// a plan that joins many relations is large (134 MB for a 20-way join of a
/// wide table): a distinct literal per event kept gigabytes in one backend.
/// A statement the guard does not let the session keep runs unnamed, and
/// the session keeps at most `KEPT_STATEMENTS`.
#[tokio::test]
async fn postgres_a_session_keeps_few_plans_and_none_of_a_wide_join() {
    use crate::sandbox::postgres::plan_cache::KEPT_STATEMENTS;
    let Some(url) = crate::db::test_support::postgres_url().await else {
        return;
    };
    let db = OneConnection::new(&url, None).await;
    let h = handler(&db, "wt_plans").await;
    let mut tx = db.begin_guest(h.handler()).await.unwrap();
    tx.enter_guest(CALL, &h).await.unwrap();
    let join = (0..6)
        .map(|i| format!("wt_plans_t j{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    for i in 0..20 {
        let sql = format!("SELECT {i} FROM {join}");
        tx.guest_query_approved(&sql, &[], 10, 1 << 20, false)
            .await
            .unwrap();
    }
    for i in 0..2 * KEPT_STATEMENTS {
        let sql = format!("SELECT a + {i} FROM wt_plans_t");
        tx.guest_query_approved(&sql, &[], 10, 1 << 20, true)
            .await
            .unwrap();
    }
    tx.exit_guest(CALL, true).await.unwrap();
    let kept: Vec<String> = tx
        .query("SELECT statement FROM pg_prepared_statements", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|row| format!("{:?}", row[0]))
        .collect();
    tx.commit().await.unwrap();
    assert!(
        kept.len() <= KEPT_STATEMENTS,
        "the session keeps {} statements",
        kept.len()
    );
    assert!(
        kept.iter().any(|s| s.contains("FROM wt_plans_t")),
        "small ones are kept: {kept:?}"
    );
    assert!(!kept.iter().any(|s| s.contains("j5")), "{kept:?}");
}
