//! Handler migrations: applied once and in order, edits and hostile statements refused, what a
//! handler owns after each statement, keys and indexes on its tables.

use super::*;
use crate::db::test_support::sqlite_db;

/// SQLite makes an index by itself for a PRIMARY KEY or UNIQUE column
/// while the table is being created (`sqlite_autoindex_keys_1`), and a
/// CREATE INDEX fills its index as a REINDEX: the walls must let both
/// through, and the key must hold afterwards.
#[tokio::test]
async fn a_handler_table_may_have_a_primary_key_and_unique_indexes() {
    for sql in [
        "CREATE TABLE keys (k TEXT PRIMARY KEY, v TEXT UNIQUE);",
        "CREATE TABLE keys (k TEXT NOT NULL, v TEXT, PRIMARY KEY (k, v));",
        "CREATE TABLE keys (k TEXT NOT NULL, v TEXT);\nCREATE UNIQUE INDEX keys_k ON keys (k);",
        "CREATE TABLE keys (k TEXT PRIMARY KEY, v TEXT);\nCREATE INDEX keys_v ON keys (v);",
    ] {
        for db in crate::db::test_support::each_backend().await {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("0001_init.sql"), sql).unwrap();
            prepare_handler(&db, "keyed").await.unwrap();
            let applied = apply_handler(&db, "keyed", dir.path()).await;
            assert!(applied.is_ok(), "{:?} {sql}: {applied:?}", db.backend());
            assert_eq!(own_tables(&db, "keyed").await.unwrap(), ["keys"]);
            let table = db.handler_table("keyed", "keys");
            let insert = format!("INSERT INTO {table} (k, v) VALUES ('a', 'b')");
            let mut tx = db.begin().await.unwrap();
            tx.execute(&insert, &[]).await.unwrap();
            tx.commit().await.unwrap();
            let mut tx = db.begin().await.unwrap();
            assert!(tx.execute(&insert, &[]).await.is_err(), "the key holds: {sql}");
        }
    }
}

#[tokio::test]
async fn applies_once_in_order_and_refuses_edits() {
    let db = sqlite_db().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("0002_more.sql"),
        "ALTER TABLE t ADD COLUMN b TEXT;",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("0001_init.sql"),
        "CREATE TABLE t (a TEXT); CREATE TABLE u (c TEXT);",
    )
    .unwrap();
    assert_eq!(apply_handler(&db, "h", dir.path()).await.unwrap(), 2);
    assert_eq!(apply_handler(&db, "h", dir.path()).await.unwrap(), 0);
    let mut tables = own_tables(&db, "h").await.unwrap();
    tables.sort();
    assert_eq!(tables, ["t", "u"]);
    db.query("SELECT a, b FROM t", &[]).await.unwrap();
    std::fs::write(dir.path().join("0001_init.sql"), "CREATE TABLE t (a INTEGER);").unwrap();
    let err = apply_handler(&db, "h", dir.path()).await.unwrap_err();
    assert!(err.to_string().contains("changed after it was applied"), "{err}");
}

pub(super) fn migration(file: &str, sql: &str) -> Migration {
    Migration::new(file, sql.to_owned()).unwrap()
}

pub(super) async fn apply(db: &Database, handler: &str, m: &Migration) -> Result<bool, DbError> {
    let mut tx = db.begin_immediate().await?;
    let applied = apply_one(&mut tx, handler, m).await?;
    tx.commit().await?;
    Ok(applied)
}

/// Regression: a migration planted a trigger on a host table (and the
/// migration's other statements ran as one unguarded script).
#[tokio::test]
async fn code_a_migration_would_plant_is_refused_and_nothing_changes() {
    let db = sqlite_db().await;
    for (file, sql, because) in [
        (
            "0001_sneaky.sql",
            "CREATE TABLE t (a TEXT); CREATE TRIGGER x AFTER INSERT ON handlers BEGIN DELETE FROM offsets; END;",
            "",
        ),
        (
            "0001_copy.sql",
            "CREATE TABLE t (a TEXT); CREATE TABLE loot AS SELECT * FROM handler_deployments;",
            "host's tables",
        ),
        (
            "0001_drop.sql",
            "CREATE TABLE t (a TEXT); DROP TABLE handler_deployments;",
            "host's tables",
        ),
        (
            "0001_seq.sql",
            "CREATE TABLE t (a TEXT); INSERT INTO sqlite_sequence VALUES ('x', 1);",
            "host's tables",
        ),
        (
            "0001_attach.sql",
            "CREATE TABLE t (a TEXT); ATTACH DATABASE '/tmp/x.db' AS x;",
            "refused",
        ),
    ] {
        let err = apply(&db, "h", &migration(file, sql))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(file) && err.contains("refused") && err.contains(because),
            "{file}: {err}"
        );
        assert!(
            db.query("SELECT * FROM t", &[]).await.is_err(),
            "{file}: nothing of it stays"
        );
        assert!(own_tables(&db, "h").await.unwrap().is_empty());
    }
    assert_eq!(
        crate::db::audit::planted_code(&db).await.unwrap(),
        Vec::<String>::new()
    );
    db.query("SELECT * FROM handler_deployments", &[]).await.unwrap();
}

/// SQLite has one namespace: a handler reaches only what its own
/// migrations created, and a name it dropped is no longer its to reach
/// (nor anyone else's to take).
#[tokio::test]
async fn handlers_own_only_what_they_created_and_keep_nothing_they_dropped() {
    let db = sqlite_db().await;
    apply(
        &db,
        "a",
        &migration(
            "0001_a.sql",
            "CREATE TABLE shared_name (x TEXT); CREATE TABLE kept (x TEXT);",
        ),
    )
    .await
    .unwrap();
    // Another handler's name is not free, not even with IF NOT EXISTS.
    for sql in [
        "CREATE TABLE IF NOT EXISTS kept (x TEXT CHECK (x <> ''));",
        "CREATE TABLE bt (x TEXT); CREATE VIEW IF NOT EXISTS kept AS SELECT x FROM bt;",
    ] {
        let err = apply(&db, "b", &migration("0001_b.sql", sql)).await.unwrap_err();
        assert!(
            err.to_string().contains("another handler's table"),
            "{sql}: {err}"
        );
        assert!(own_tables(&db, "b").await.unwrap().is_empty(), "{sql}");
    }
    let err = apply(
        &db,
        "b",
        &migration("0001_b.sql", "CREATE TABLE mine (x TEXT); DELETE FROM kept;"),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("not one of this handler's tables"),
        "{err}"
    );
    apply(
        &db,
        "a",
        &migration(
            "0002_a.sql",
            "DROP TABLE shared_name; ALTER TABLE kept RENAME TO renamed;",
        ),
    )
    .await
    .unwrap();
    let mut a = own_tables(&db, "a").await.unwrap();
    a.sort();
    assert_eq!(a, ["renamed"]);
    // Nor may another handler take it (see `sqlite_schema_tests`).
    let err = apply(
        &db,
        "b",
        &migration("0001_b.sql", "CREATE TABLE shared_name (x TEXT);"),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("handler a had a table"), "{err}");
    apply(
        &db,
        "b",
        &migration("0001_b.sql", "CREATE TABLE b_name (x TEXT);"),
    )
    .await
    .unwrap();
    assert_eq!(own_tables(&db, "b").await.unwrap(), ["b_name"]);
    // The second wall on its own: handler a's walls refuse b's table.
    let mut tx = db.begin().await.unwrap();
    let walls = Walls::load(&db, "a", Duration::from_secs(5)).await.unwrap();
    tx.enter_walls(&walls).await.unwrap();
    let err = tx.guest_execute("DELETE FROM b_name", &[]).await.unwrap_err();
    assert!(err.to_string().contains("not authorized"), "{err}");
    tx.guest_execute("DELETE FROM renamed", &[]).await.unwrap();
    tx.leave_walls().await.unwrap();
    tx.commit().await.unwrap();
}

/// Regression: SQLite rolls back the whole transaction when a writing
/// statement is interrupted, claims and savepoints included; the host
/// notices, begins a new one, and says so.
#[tokio::test]
async fn an_interrupted_write_loses_the_transaction_visibly() {
    let db = sqlite_db().await;
    apply(&db, "h", &migration("0001.sql", "CREATE TABLE t (a INTEGER);"))
        .await
        .unwrap();
    let mut tx = db.begin().await.unwrap();
    tx.execute(
        "INSERT INTO handler_tables (handler, table_name) VALUES ('other', 'x')",
        &[],
    )
    .await
    .unwrap();
    let walls = Walls::new("h", Scope::Guest, &["t".to_owned()], Duration::from_millis(200));
    tx.savepoint("inboxd_guest").await.unwrap();
    tx.enter_walls(&walls).await.unwrap();
    tx.set_ctes(["n".to_owned()].into());
    let err = tx
        .guest_execute(
            "INSERT INTO t WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT i FROM n",
            &[],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, DbError::StatementTimeout), "{err}");
    assert!(tx.take_lost(), "the host noticed the transaction was gone");
    tx.leave_walls().await.unwrap();
    // The new transaction works and the lost one's work is gone.
    tx.execute(
        "INSERT INTO handler_tables (handler, table_name) VALUES ('other', 'y')",
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        db.query_i64("SELECT COUNT(*) FROM handler_tables WHERE handler = 'other'", &[])
            .await
            .unwrap(),
        1
    );
    assert_eq!(db.query_i64("SELECT COUNT(*) FROM t", &[]).await.unwrap(), 0);
}

/// A statement that never ends is stopped at the walls' deadline, and the
/// connection is fine afterwards.
#[tokio::test]
async fn an_endless_statement_is_interrupted_at_the_deadline() {
    let db = sqlite_db().await;
    apply(&db, "h", &migration("0001.sql", "CREATE TABLE t (a INTEGER);"))
        .await
        .unwrap();
    let mut tx = db.begin().await.unwrap();
    let walls = Walls::new("h", Scope::Guest, &["t".to_owned()], Duration::from_millis(200));
    tx.enter_walls(&walls).await.unwrap();
    tx.set_ctes(["n".to_owned()].into());
    let started = std::time::Instant::now();
    let err = tx
        .guest_query(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n",
            &[],
            10,
            1 << 20,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, DbError::StatementTimeout), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Past the deadline every statement stops at once; with a new one
    // (the next event's walls) the transaction is still usable.
    tx.leave_walls().await.unwrap();
    tx.enter_walls(&walls).await.unwrap();
    tx.guest_execute("INSERT INTO t (a) VALUES (1)", &[])
        .await
        .unwrap();
    tx.leave_walls().await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.query_i64("SELECT COUNT(*) FROM t", &[]).await.unwrap(), 1);
}

#[tokio::test]
async fn failing_migration_names_the_file_and_leaves_nothing() {
    let db = sqlite_db().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("0001_bad.sql"),
        "CREATE TABLE ok (a TEXT); CREAT TABLE;",
    )
    .unwrap();
    let err = apply_handler(&db, "h", dir.path()).await.unwrap_err();
    assert!(err.to_string().contains("0001_bad"), "{err}");
    assert!(
        db.query("SELECT * FROM ok", &[]).await.is_err(),
        "the failed migration rolled back"
    );
}

/// Regression (the adversarial read of session 8): one upload's migrations
/// could hold the migration and deployments locks for hours, a statement of
/// just under 60 s at a time. Now they end together at their deadline,
/// cancelled in the statement running then or refused before the next.
#[tokio::test]
async fn a_runs_migrations_end_at_one_deadline_for_all_their_statements() {
    let Some(db) = crate::db::test_support::postgres_db().await else {
        return;
    };
    prepare_handler(&db, "slow").await.unwrap();
    let endless = migration(
        "0001_init.sql",
        "CREATE TABLE t (a INTEGER);\nSELECT count(*) FROM generate_series(1, 2000000000) AS g(n);",
    );
    let mut tx = db.begin_migration("slow").await.unwrap();
    let started = Instant::now();
    // Short: the statement keeps a core of the suite's server busy until then.
    let deadline = started + Duration::from_millis(300);
    let err = apply_within(&mut tx, "slow", &endless, deadline)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("60 s in all"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    tx.rollback().await.unwrap();

    let later = migration("0002_more.sql", "CREATE TABLE u (a INTEGER);");
    let mut tx = db.begin_migration("slow").await.unwrap();
    let err = apply_within(&mut tx, "slow", &later, Instant::now())
        .await
        .unwrap_err()
        .to_string();
    // Past the deadline, a migration is not started at all (even an empty
    // one costs statements with the writer held: the sixteenth read).
    assert!(
        err.contains("0002_more of handler slow was not started") && err.contains("60 s in all"),
        "{err}"
    );
}

/// Regression (the same read): every handler's migrations took one lock, so
/// a team's upload still migrating stalled every other team's uploads and
/// every host loading a handler. Now each handler's are its own.
#[tokio::test]
async fn a_handlers_migrations_never_wait_for_another_handlers() {
    let Some(db) = crate::db::test_support::postgres_db().await else {
        return;
    };
    for handler in ["slow", "other"] {
        prepare_handler(&db, handler).await.unwrap();
    }
    let mut slow = db.begin_migration("slow").await.unwrap();
    let first = migration("0001_init.sql", "CREATE TABLE s (a INTEGER);");
    assert!(apply_one(&mut slow, "slow", &first).await.unwrap());
    // `slow` is still migrating, its transaction open.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("0001_init.sql"), "CREATE TABLE t (a INTEGER);").unwrap();
    let other = tokio::time::timeout(Duration::from_secs(5), apply_handler(&db, "other", dir.path()));
    assert_eq!(
        other.await.expect("waited for another handler's lock").unwrap(),
        1
    );
    let row_bound = tokio::time::timeout(Duration::from_secs(5), bound_rows(&db, "other", 1 << 20));
    row_bound
        .await
        .expect("waited for another handler's lock")
        .unwrap();
    slow.commit().await.unwrap();
}

/// Regression (the twenty-third adversarial read, issue 23): on SQLite,
/// rows written under a larger `max_row_bytes` (or by a migration) outlast a
/// lower one, and the guard counted every value at the lower one. The
/// longest row a handler's tables may hold is recorded, measured only when no
/// other version of the handler runs, and the guard counts at it.
#[tokio::test]
async fn sqlite_counts_statements_at_the_longest_row_its_tables_may_hold() {
    use crate::sandbox::{Guard, guard::Refusal};
    let db = sqlite_db().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("0001_init.sql"),
        "CREATE TABLE t (v BLOB, copy BLOB AS (v) STORED);",
    )
    .unwrap();
    prepare_handler(&db, "bounded").await.unwrap();
    apply_handler(&db, "bounded", dir.path()).await.unwrap();
    let tables = own_tables(&db, "bounded").await.unwrap();
    let recorded = |db: &Database| {
        let db = db.clone();
        async move {
            let mut tx = db.begin().await.unwrap();
            row_bound::sqlite_recorded_in(&mut tx, "bounded").await.unwrap()
        }
    };
    assert_eq!(
        recorded(&db).await,
        Some(1 << 20),
        "a migration writes rows of up to 1 MiB"
    );
    // A version ran under 8 MiB and wrote a 2 MB row (1 MB and its stored copy).
    let mut tx = db.begin_write().await.unwrap();
    row_bound::sqlite_raise_in(&mut tx, "bounded", 8 << 20)
        .await
        .unwrap();
    tx.execute("INSERT INTO t (v) VALUES (zeroblob(1000000))", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // Lowered to 137 KB while that version may still run: counted at 8 MiB.
    let bound = |settled| row_bound::sqlite_row_bound(&db, "bounded", 137_000, &tables, settled);
    assert_eq!(bound(false).await.unwrap(), 8 << 20);
    // With no other version running, the rows are measured: 2 MB, the
    // stored generated column too.
    assert_eq!(bound(true).await.unwrap(), 2_000_000);
    assert_eq!(recorded(&db).await, Some(2_000_000));
    let mut tx = db.begin_write().await.unwrap();
    tx.execute("DELETE FROM t", &[]).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(bound(true).await.unwrap(), 137_000);
    assert_eq!(bound(false).await.unwrap(), 137_000);

    // The read's statement: 20 chains of 13 levels of `*` over a stored
    // row, 16 values each at the limit, 60 times that at 8 MiB rows.
    let mut chain = "SELECT * FROM t".to_owned();
    for _ in 0..13 {
        chain = format!("SELECT * FROM ({chain}) LIMIT 1");
    }
    let one = format!("(SELECT length(v) FROM ({chain}))");
    let sql = format!("SELECT {}", vec![one.as_str(); 20].join(", "));
    let guard =
        |stored| Guard::new(Backend::Sqlite, "main", &tables, 1 << 20, 137_000).with_stored_row_bytes(stored);
    assert_eq!(guard(137_000).check(&sql), Ok(()));
    match guard(8 << 20).check(&sql) {
        Err(Refusal::Limit(m)) => assert!(m.contains("values at once"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// Regression (the twenty-fourth adversarial read, issue 23): SQLite loads a
/// table's schema in time quadratic in its indexes, on every connection after
/// every schema change; a table has at most 32 on SQLite, its keys' and
/// UNIQUE constraints' own included, and a migration that drops some to come
/// back within the bound still runs.
#[tokio::test]
async fn sqlite_a_table_has_a_bounded_number_of_indexes() {
    let db = sqlite_db().await;
    let uniques = |n: usize| {
        let columns: Vec<String> = (0..n).map(|i| format!("c{i} INTEGER UNIQUE")).collect();
        format!("CREATE TABLE t ({});", columns.join(", "))
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("0001_init.sql"), uniques(33)).unwrap();
    prepare_handler(&db, "indexed").await.unwrap();
    let err = apply_handler(&db, "indexed", dir.path())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("has 33 indexes") && err.contains("at most 32"),
        "{err}"
    );
    std::fs::write(dir.path().join("0001_init.sql"), uniques(32)).unwrap();
    apply_handler(&db, "indexed", dir.path()).await.unwrap();
    std::fs::write(
        dir.path().join("0002_one_more.sql"),
        "CREATE INDEX t_more ON t (c0);",
    )
    .unwrap();
    let err = apply_handler(&db, "indexed", dir.path())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("has 33 indexes"), "{err}");
}
