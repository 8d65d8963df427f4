//! SQLite's one namespace and its stored schema: what a handler's views,
//! foreign keys and altered tables may come to read or hold after each
//! migration statement, so that nothing a migration leaves breaks another
//! handler or the next start (issue 23, reads 17 and 28 to 31).

use super::tests::{apply, migration};
use super::*;
use crate::db::test_support::sqlite_db;

/// Regression: a foreign key left pointing at a dropped table would make a
/// later owner of that name unable to delete its own rows.
#[tokio::test]
async fn a_foreign_key_may_point_only_at_own_tables() {
    let db = sqlite_db().await;
    let sql = "CREATE TABLE orders (id INTEGER PRIMARY KEY); \
               CREATE TABLE child (o INTEGER REFERENCES orders (id)); DROP TABLE orders;";
    let err = apply(&db, "x", &migration("0001_fk.sql", sql)).await.unwrap_err();
    assert!(err.to_string().contains("foreign key to orders"), "{err}");
    assert!(own_tables(&db, "x").await.unwrap().is_empty());
}

/// Regression (the seventeenth adversarial read, issue 23): SQLite expands
/// a view inside a view by recursion while preparing, with no bound and no
/// deadline check; 3,500 views each reading the one before overflowed the
/// host's stack. On SQLite a view reads tables only, checked in the catalog
/// after every statement: a view made in place of a dropped table counts.
#[tokio::test]
async fn on_sqlite_a_view_reads_tables_only() {
    let db = sqlite_db().await;
    let base = "CREATE TABLE t (a INTEGER); CREATE VIEW v AS SELECT a FROM t;";
    apply(&db, "vv", &migration("0001.sql", base)).await.unwrap();
    for (file, sql) in [
        ("0002.sql", "CREATE VIEW w AS SELECT a FROM v;"),
        // The twenty-ninth read: a view read past the FROM list, in a subquery.
        (
            "0002.sql",
            "CREATE VIEW w AS SELECT a FROM t WHERE EXISTS (SELECT 1 FROM v);",
        ),
        (
            "0002.sql",
            "CREATE VIEW w AS SELECT a FROM t WHERE a IN (SELECT a FROM v);",
        ),
        (
            "0002.sql",
            "CREATE VIEW w AS SELECT a FROM t WHERE a = (SELECT max(a) FROM v);",
        ),
        (
            "0002.sql",
            "CREATE TABLE u (a INTEGER); CREATE VIEW w AS SELECT a FROM u; DROP TABLE u; CREATE VIEW u AS SELECT a FROM v;",
        ),
    ] {
        let err = apply(&db, "vv", &migration(file, sql))
            .await
            .unwrap_err()
            .to_string();
        // (One is refused at its DROP now: a view may not read nothing;
        // subqueries by the guard: a view reads one table, with no subquery.)
        assert!(
            err.contains("reads view") && err.contains("tables only")
                || err.contains("view w reads a table that does not exist")
                || err.contains("with no WHERE"),
            "{sql}: {err}"
        );
    }
    let mut tables = own_tables(&db, "vv").await.unwrap();
    tables.sort();
    assert_eq!(tables, ["t", "v"], "nothing of the refused migrations stayed");
    assert_eq!(
        crate::db::audit::planted_code(&db).await.unwrap(),
        Vec::<String>::new(),
        "what migrations accept, the start-up audit accepts"
    );
    // The catalog's own check reads every name a view reads, not the first:
    // such a view (made past the guard, as an older release might have)
    // refuses its handler's next statement.
    let mut tx = db.begin().await.unwrap();
    tx.execute(
        "CREATE VIEW w AS SELECT a FROM t WHERE EXISTS (SELECT 1 FROM v)",
        &[],
    )
    .await
    .unwrap();
    tx.execute(
        "INSERT INTO handler_tables (handler, table_name) VALUES ('vv', 'w')",
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let err = apply(&db, "vv", &migration("0003.sql", "CREATE TABLE u (a INTEGER);"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("view w reads view v"), "{err}");
}

/// Regression (the twenty-eighth adversarial read, issue 23): on SQLite a
/// view finds its tables by name each time it is used. A view left reading
/// a dropped table broke every later `ALTER TABLE ... RENAME` of any team
/// ("error in view bv"), and read whatever another team made in that name
/// next. A view reads only its handler's own tables, that exist; a name
/// another handler's view reads (left by an older release) cannot be taken;
/// and such a view refuses its own handler at load, not the host.
#[tokio::test]
async fn on_sqlite_a_view_reads_only_its_handlers_tables_that_exist() {
    let db = sqlite_db().await;
    apply(&db, "f", &migration("0001.sql", "CREATE TABLE t (a TEXT);"))
        .await
        .unwrap();
    let dangling = "CREATE TABLE x (a TEXT); CREATE VIEW bv AS SELECT a FROM x; DROP TABLE x;";
    let err = apply(&db, "b1", &migration("0001.sql", dangling))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("view bv reads a table that does not exist") && err.contains("DROP TABLE x"),
        "{err}"
    );
    assert!(own_tables(&db, "b1").await.unwrap().is_empty());
    // Another team's rename still works: no view reads nothing.
    apply(&db, "f", &migration("0002.sql", "ALTER TABLE t RENAME TO t3;"))
        .await
        .unwrap();

    // Dropping the view first is the way.
    let base = "CREATE TABLE x (a TEXT); CREATE VIEW bv AS SELECT a FROM x; \
                CREATE VIEW cv AS SELECT a AS b FROM x;";
    apply(&db, "b1", &migration("0001.sql", base)).await.unwrap();
    let err = apply(&db, "b1", &migration("0002.sql", "DROP TABLE x;"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("reads a table that does not exist"), "{err}");
    apply(
        &db,
        "b1",
        &migration("0002.sql", "DROP VIEW bv; DROP VIEW cv; DROP TABLE x;"),
    )
    .await
    .unwrap();

    // A view of another team's table is refused, by the authorizer or by the catalog.
    apply(&db, "c", &migration("0001.sql", "CREATE TABLE y (a TEXT);"))
        .await
        .unwrap();
    assert!(
        apply(
            &db,
            "d",
            &migration("0001.sql", "CREATE VIEW dv AS SELECT a FROM y;")
        )
        .await
        .is_err()
    );
    assert!(own_tables(&db, "d").await.unwrap().is_empty());

    // What an older release let through: a view of handler `old` reading `w`,
    // which exists nowhere. Nobody may take the name; `old` no longer loads.
    let mut tx = db.begin().await.unwrap();
    tx.execute("CREATE VIEW ov AS SELECT a FROM w", &[])
        .await
        .unwrap();
    tx.execute(
        "INSERT INTO handler_tables (handler, table_name) VALUES ('old', 'ov')",
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    for sql in [
        "CREATE TABLE w (a TEXT);",
        "CREATE TABLE w0 (a TEXT); CREATE VIEW w AS SELECT a FROM w0;",
    ] {
        let err = apply(&db, "e", &migration("0001.sql", sql))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("w is a name another handler's view reads"),
            "{sql}: {err}"
        );
    }
    assert!(own_tables(&db, "e").await.unwrap().is_empty());
    let refused = sqlite_schema_over(&db, &["ov".to_owned()]).await.unwrap();
    assert!(
        refused
            .as_deref()
            .is_some_and(|r| r.contains("view ov reads a table that does not exist")),
        "{refused:?}"
    );
    assert_eq!(sqlite_schema_over(&db, &["t3".to_owned()]).await.unwrap(), None);
}

/// Regression (the thirtieth adversarial read, issue 23): SQLite writes each
/// ALTER TABLE into the table's stored CREATE TABLE. A column's DEFAULT is
/// an expression that runs in every write, and 63 added ones, each within
/// its own statement's budget, made one insert run 2.49 s against a 100 ms
/// deadline and fill SQLite's heap; the table as stored was then one the
/// start-up audit refuses, for the whole host. A view of 64 `*`s was a row
/// of 64 copies that the register count took as one. And a handler's schema
/// text, which every connection reads again after any schema change, had no
/// bound.
#[tokio::test]
async fn on_sqlite_what_a_migration_leaves_is_what_every_start_accepts() {
    let db = sqlite_db().await;
    apply(
        &db,
        "s",
        &migration("0001.sql", "CREATE TABLE t (id INTEGER PRIMARY KEY);"),
    )
    .await
    .unwrap();
    for sql in [
        "ALTER TABLE t ADD COLUMN c INTEGER DEFAULT (length(upper('x')));",
        "ALTER TABLE t ADD COLUMN c TEXT DEFAULT (hex(randomblob(8)));",
    ] {
        let err = apply(&db, "s", &migration("0002.sql", sql))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("takes a literal DEFAULT"), "{sql}: {err}");
    }
    apply(
        &db,
        "s",
        &migration(
            "0002.sql",
            "ALTER TABLE t ADD COLUMN a TEXT DEFAULT 'x'; ALTER TABLE t ADD COLUMN b INTEGER DEFAULT -1; \
             ALTER TABLE t ADD COLUMN c BLOB DEFAULT NULL; CREATE VIEW v AS SELECT * FROM t; \
             CREATE VIEW w AS SELECT t.* FROM t;",
        ),
    )
    .await
    .unwrap();
    for sql in [
        "CREATE VIEW x AS SELECT *, * FROM t;",
        "CREATE VIEW x AS SELECT id, * FROM t;",
        "CREATE VIEW x AS SELECT t.*, t.* FROM t;",
    ] {
        let err = apply(&db, "s", &migration("0003.sql", sql))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("`*` stands alone"), "{sql}: {err}");
    }
    assert_eq!(
        crate::db::audit::planted_code(&db).await.unwrap(),
        Vec::<String>::new()
    );

    // What is stored is read back after every statement: a table an older
    // release let in (a VIRTUAL column) refuses its handler's next statement.
    let mut tx = db.begin().await.unwrap();
    tx.execute("CREATE TABLE g (a INTEGER, b INTEGER AS (a + 1))", &[])
        .await
        .unwrap();
    tx.execute(
        "INSERT INTO handler_tables (handler, table_name) VALUES ('s', 'g')",
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let err = apply(&db, "s", &migration("0003.sql", "CREATE TABLE u (a INTEGER);"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("table g as SQLite now stores it is refused"),
        "{err}"
    );
    assert!(
        sqlite_schema_over(&db, &["g".to_owned()])
            .await
            .unwrap()
            .is_some_and(|r| r.contains("table g as SQLite now stores it is refused"))
    );

    // SQLite's own table-valued functions cannot be hidden by a table (the
    // thirty-first read: the host reads every handler's columns through them).
    for name in ["pragma_table_xinfo", "PRAGMA_foreign_key_list", "dbstat"] {
        let sql = format!("CREATE TABLE {name} (x INTEGER);");
        let err = apply(&db, "p", &migration("0001.sql", &sql))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("the name is kept"), "{name}: {err}");
    }
    let mut tx = db.begin().await.unwrap();
    tx.execute("CREATE TABLE pragma_table_xinfo (x INTEGER)", &[])
        .await
        .unwrap();
    tx.execute(
        "INSERT INTO handler_tables (handler, table_name) VALUES ('p', 'pragma_table_xinfo')",
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let planted = crate::db::audit::planted_code(&db).await.unwrap();
    assert!(
        planted
            .iter()
            .any(|p| p.contains("pragma_table_xinfo (it hides SQLite's own")),
        "{planted:?}"
    );
    assert!(
        sqlite_schema_over(&db, &["pragma_table_xinfo".to_owned()])
            .await
            .unwrap()
            .is_some_and(|r| r.contains("hides SQLite's own table-valued function"))
    );
    let mut tx = db.begin().await.unwrap();
    tx.execute("DROP TABLE pragma_table_xinfo", &[]).await.unwrap();
    tx.commit().await.unwrap();

    // At most 1 MiB of schema text per handler.
    let literal = "x".repeat(60_000);
    let tables: String = (0..18)
        .map(|i| format!("CREATE TABLE big{i} (a TEXT DEFAULT '{literal}');\n"))
        .collect();
    let err = apply(&db, "big", &migration("0001.sql", &tables))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("bytes of schema text; at most 1048576"), "{err}");
    assert!(own_tables(&db, "big").await.unwrap().is_empty());
}

/// Regression (the thirty-third adversarial read, issue 23): SQLite's
/// double-quoted-string fallback read `"x"` that names no column as the
/// text 'x', where the guard reads a column, so `CREATE INDEX i ON
/// t("no_such_column")` was an index on a constant and a view's `"x"` a
/// literal. Now `"x"` is a name or an error on every connection, and an
/// index on an expression left by an older release refuses its handler's
/// next migration.
#[tokio::test]
async fn on_sqlite_a_double_quoted_name_is_never_text() {
    let db = sqlite_db().await;
    apply(&db, "q", &migration("0001.sql", "CREATE TABLE t (a TEXT);"))
        .await
        .unwrap();
    for sql in [
        "CREATE INDEX i ON t (\"no_such_column\");",
        "CREATE VIEW v AS SELECT \"no_such_column\" FROM t;",
        "CREATE VIEW v AS SELECT \"no_such_column\" AS a FROM t;",
    ] {
        let err = apply(&db, "q", &migration("0002.sql", sql))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("no such column"), "{sql}: {err}");
    }
    assert_eq!(own_tables(&db, "q").await.unwrap(), ["t"]);
    // The same at run time, on the host's own statements too.
    let mut tx = db.begin().await.unwrap();
    let err = tx
        .query("SELECT \"no_such_column\" FROM t", &[])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no such column"), "{err}");
    // An index on an expression (as the fallback stored one before).
    tx.execute("CREATE INDEX e ON t (a || 'x')", &[]).await.unwrap();
    tx.commit().await.unwrap();
    let err = apply(&db, "q", &migration("0002.sql", "CREATE TABLE u (a INTEGER);"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("index e on t indexes an expression"), "{err}");
}

/// The guard learns each table's stored expressions when its handler
/// loads, so an upsert, which SQLite runs them twice for, is counted with
/// them (the thirty-first read; `sandbox::sqlite_upsert`).
#[tokio::test]
async fn on_sqlite_a_tables_stored_expressions_are_counted_for_its_upserts() {
    let db = sqlite_db().await;
    let sql = "CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT CHECK (length(upper(v)) < 10)); \
               CREATE TABLE plain (k INTEGER PRIMARY KEY, v TEXT);";
    apply(&db, "u", &migration("0001.sql", sql)).await.unwrap();
    let own = own_tables(&db, "u").await.unwrap();
    let calls = sqlite_table_calls(&db, &own).await.unwrap();
    // length, upper and `<`.
    assert_eq!(calls.get("t"), Some(&3), "{calls:?}");
    assert_eq!(calls.get("plain"), Some(&0), "{calls:?}");
    let max = crate::sandbox::sqlite_work::max_calls(1 << 20);
    let guard = crate::sandbox::guard::Guard::new(Backend::Sqlite, "main", &own, 1 << 16, 1 << 20)
        .with_table_calls(calls);
    // A call counts once per argument.
    let upsert = |n: u64| {
        format!(
            "INSERT INTO {{}} (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = coalesce({})",
            vec!["excluded.v"; n as usize].join(", ")
        )
    };
    let fits = upsert(max - 3).replace("{}", "t");
    guard.check(&fits).unwrap();
    let over = upsert(max - 2).replace("{}", "t");
    let refusal = guard.check(&over).unwrap_err().to_string();
    assert!(refusal.contains("SQLite runs twice"), "{refusal}");
    guard.check(&upsert(max - 2).replace("{}", "plain")).unwrap();
}

/// Regression (the forty-third adversarial read, issue 23): until every
/// host swaps to a handler's new version, the old one runs with walls
/// made before its migration, which name the tables the migration dropped
/// or renamed. Another handler that took such a name meanwhile would have
/// had its rows open to that old version. A name a handler had stays its
/// own: another's migration may not create it, in any case; it may.
#[tokio::test]
async fn on_sqlite_a_name_a_handler_dropped_is_never_another_handlers() {
    let db = sqlite_db().await;
    let made = "CREATE TABLE ledger (a INTEGER); CREATE TABLE drafts (a INTEGER);";
    apply(&db, "aa", &migration("0001.sql", made)).await.unwrap();
    let gone = "DROP TABLE ledger; ALTER TABLE drafts RENAME TO sent;";
    apply(&db, "aa", &migration("0002.sql", gone)).await.unwrap();
    for (file, sql) in [
        ("0001.sql", "CREATE TABLE ledger (b TEXT);"),
        ("0001.sql", "CREATE TABLE LEDGER (b TEXT);"),
        (
            "0001.sql",
            "CREATE TABLE u (a INTEGER); CREATE VIEW drafts AS SELECT a FROM u;",
        ),
        (
            "0001.sql",
            "CREATE TABLE t (b TEXT); ALTER TABLE t RENAME TO Drafts;",
        ),
        // Indexes share the namespace (the forty-sixth read).
        (
            "0001.sql",
            "CREATE TABLE u2 (a INTEGER); CREATE INDEX ledger ON u2 (a);",
        ),
    ] {
        let err = apply(&db, "bb", &migration(file, sql))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("handler aa had a table or view of that name"),
            "{sql}: {err}"
        );
        assert!(own_tables(&db, "bb").await.unwrap().is_empty(), "{sql}");
    }
    let again = "CREATE TABLE ledger (a INTEGER);";
    apply(&db, "aa", &migration("0003.sql", again)).await.unwrap();
    let mut own = own_tables(&db, "aa").await.unwrap();
    own.sort();
    assert_eq!(own, ["ledger", "sent"]);
}
