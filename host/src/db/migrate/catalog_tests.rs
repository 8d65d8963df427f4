//! PostgreSQL: what a handler's schema may hold after a migration, read back
//! from the catalog (`catalog_rules`, `statistics`): relations, locks,
//! stored expressions, columns, foreign keys, and index expressions kept out
//! of ANALYZE. Each test returns at once when `INBOXD_TEST_POSTGRES` is not
//! set.

use super::tests::migration;
use super::*;

/// Regression (the nineteenth adversarial read, issue 23): 10,000 indexes
/// made in one migration filled PostgreSQL's shared lock table, and every
/// new connection of every team failed. A handler's schema holds at most
/// `MAX_RELATIONS` relations.
#[tokio::test]
async fn postgres_a_handlers_schema_holds_a_bounded_number_of_relations() {
    let Some(db) = crate::db::test_support::postgres_db().await else {
        return;
    };
    prepare_handler(&db, "many_indexes").await.unwrap();
    let limit = catalog_rules::MAX_RELATIONS as usize;
    let indexes = |n: usize| {
        (0..n)
            .map(|i| format!("CREATE INDEX tj_{i} ON tj (a);\n"))
            .collect::<String>()
    };
    // The table and limit - 1 indexes fit; one more does not.
    let sql = format!("CREATE TABLE tj (a INTEGER);\n{}", indexes(limit - 1));
    let mut tx = db.begin_migration("many_indexes").await.unwrap();
    assert!(
        apply_one(&mut tx, "many_indexes", &migration("0001_init.sql", &sql))
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    let more = migration("0002_more.sql", "CREATE INDEX tj_more ON tj (a);");
    let mut tx = db.begin_migration("many_indexes").await.unwrap();
    let err = apply_one(&mut tx, "many_indexes", &more)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("holds {} relations", limit + 1)) && err.contains("shared lock table"),
        "{err}"
    );
    tx.rollback().await.unwrap();
}

/// Regression (the review of the nineteenth read): locks of the relations a
/// migration made and dropped stay until it commits, and the relation count
/// after each statement never sees them.
#[tokio::test]
async fn postgres_a_migration_holds_a_bounded_number_of_locks() {
    let Some(db) = crate::db::test_support::postgres_db().await else {
        return;
    };
    prepare_handler(&db, "many_locks").await.unwrap();
    // Each statement within its own bound of keys (`sandbox::postgres::ddl_bounds`).
    let columns = (0..30)
        .map(|i| format!("a{i} TEXT UNIQUE"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = (0..40)
        .map(|_| format!("CREATE TABLE x ({columns});\nDROP TABLE x;\n"))
        .collect::<String>();
    let mut tx = db.begin_migration("many_locks").await.unwrap();
    let err = apply_one(&mut tx, "many_locks", &migration("0001_churn.sql", &sql))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("locks") && err.contains("split it"), "{err}");
    tx.rollback().await.unwrap();
}

/// Regression (the twentieth adversarial read, issue 23): the planner copies
/// a table's index expressions into every statement that reads it, once per
/// place it does, so a table's are bounded.
#[tokio::test]
async fn postgres_a_tables_index_expressions_are_bounded() {
    let Some(db) = crate::db::test_support::postgres_db().await else {
        return;
    };
    prepare_handler(&db, "long_indexes").await.unwrap();
    let sql = "CREATE TABLE ti (a TEXT, b TEXT);\nCREATE INDEX ti_a ON ti (lower(a));\n\
               CREATE INDEX ti_b ON ti (lower(b));\n";
    let mut tx = db.begin_migration("long_indexes").await.unwrap();
    assert!(
        apply_one(&mut tx, "long_indexes", &migration("0001_init.sql", sql))
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    let arguments = vec!["a"; 300].join(", ");
    let long = migration(
        "0002_long.sql",
        &format!("CREATE INDEX ti_long ON ti ((coalesce({arguments})));"),
    );
    let mut tx = db.begin_migration("long_indexes").await.unwrap();
    let err = apply_one(&mut tx, "long_indexes", &long)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("stored expressions (index expressions"), "{err}");
    tx.rollback().await.unwrap();
    // CHECKs and defaults count too.
    for (file, sql) in [
        (
            "0002_check.sql",
            format!("ALTER TABLE ti ADD CHECK (coalesce({arguments}) IS NOT NULL);"),
        ),
        (
            "0002_default.sql",
            format!(
                "ALTER TABLE ti ALTER COLUMN b SET DEFAULT coalesce({});",
                ["'x'"; 300].join(", ")
            ),
        ),
    ] {
        let mut tx = db.begin_migration("long_indexes").await.unwrap();
        let err = apply_one(&mut tx, "long_indexes", &migration(file, &sql))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("stored expressions"), "{file}: {err}");
        tx.rollback().await.unwrap();
    }
    // One an older release let in is named at start (`audit::planted_code`
    // reads this; here inside a transaction no other test sees).
    let mut host = db.begin().await.unwrap();
    host.execute(
        &format!("CREATE INDEX ti_old ON handler_long_indexes.ti ((coalesce({arguments})))"),
        &[],
    )
    .await
    .unwrap();
    let params = [
        "handler\\_%".into(),
        catalog_rules::MAX_STORED_EXPRESSION_BYTES.into(),
    ];
    let found = host
        .query(catalog_rules::POSTGRES_STORED_EXPRESSION_BYTES, &params)
        .await
        .unwrap();
    let tables: Vec<(SqlValue, SqlValue)> = found.into_iter().map(|r| (r[0].clone(), r[1].clone())).collect();
    assert_eq!(tables, [("handler_long_indexes".into(), "ti".into())]);
    host.rollback().await.unwrap();
}

/// Regression (the twenty-second adversarial read, issue 23): a plan lists
/// every column of each relation it joins once per join, and a session
/// keeps its plans: a 20-way self-join of a 1,600-column table held 134 MB
/// in one. A handler's table or view has at most `MAX_COLUMNS` columns,
/// however it comes to have them; dropped ones count (a plan lists them).
#[tokio::test]
async fn postgres_a_handlers_relations_have_a_bounded_number_of_columns() {
    let Some(db) = crate::db::test_support::postgres_db().await else {
        return;
    };
    prepare_handler(&db, "wide_tables").await.unwrap();
    let limit = catalog_rules::MAX_COLUMNS as usize;
    let columns = |n: usize, prefix: &str| {
        (0..n)
            .map(|i| format!("{prefix}{i} INTEGER"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let sql = format!(
        "CREATE TABLE tw ({});\nALTER TABLE tw DROP COLUMN a0;\nALTER TABLE tw ADD COLUMN b0 INTEGER;\n",
        columns(limit - 1, "a")
    );
    let mut tx = db.begin_migration("wide_tables").await.unwrap();
    assert!(
        apply_one(&mut tx, "wide_tables", &migration("0001_init.sql", &sql))
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    let one_too_many = [
        ("0002_add.sql", "ALTER TABLE tw ADD COLUMN b1 INTEGER;".to_owned()),
        (
            "0002_table.sql",
            format!("CREATE TABLE tx ({});", columns(limit + 1, "a")),
        ),
        // The dropped a0 still counts.
        (
            "0002_drop_add.sql",
            "ALTER TABLE tw DROP COLUMN a1;\nALTER TABLE tw ADD COLUMN b1 INTEGER;".to_owned(),
        ),
        (
            "0002_view.sql",
            format!(
                "CREATE VIEW vw AS SELECT {}, b0, b0 AS b0_again, b0 AS b0_more FROM tw;",
                (1..limit - 1)
                    .map(|i| format!("a{i}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
    ];
    for (file, sql) in one_too_many {
        let mut tx = db.begin_migration("wide_tables").await.unwrap();
        let err = apply_one(&mut tx, "wide_tables", &migration(file, &sql))
            .await
            .unwrap_err()
            .to_string();
        // A view's row is bounded by the guard already (64 values).
        let row = err.contains("more than 64 rows at limits.max_row_bytes");
        assert!(
            row || err.contains(&format!("has {} columns", limit + 1))
                && err.contains(&format!("at most {limit}")),
            "{file}: {err}"
        );
        tx.rollback().await.unwrap();
    }
    // One an older release let in is named at start (`audit::planted_code`
    // reads this; here inside a transaction no other test sees).
    let mut host = db.begin().await.unwrap();
    host.execute("ALTER TABLE handler_wide_tables.tw ADD COLUMN old INTEGER", &[])
        .await
        .unwrap();
    let params = ["handler\\_%".into(), catalog_rules::MAX_COLUMNS.into()];
    let found = host
        .query(catalog_rules::POSTGRES_WIDE_RELATIONS, &params)
        .await
        .unwrap();
    let relations: Vec<(SqlValue, SqlValue)> =
        found.into_iter().map(|r| (r[0].clone(), r[1].clone())).collect();
    assert_eq!(relations, [("handler_wide_tables".into(), "tw".into())]);
    host.rollback().await.unwrap();
}

/// Regression (the second review of the twenty-second read): PostgreSQL
/// keeps a prepared check query per foreign key in every session that
/// writes the table (6,000 keys: 221 MB in one session after one event). A
/// handler's schema holds at most `MAX_FOREIGN_KEYS`.
#[tokio::test]
async fn postgres_a_handlers_schema_holds_a_bounded_number_of_foreign_keys() {
    let Some(db) = crate::db::test_support::postgres_db().await else {
        return;
    };
    prepare_handler(&db, "many_keys").await.unwrap();
    let limit = catalog_rules::MAX_FOREIGN_KEYS as usize;
    // In statements of 32 keys at most (`sandbox::postgres::ddl_bounds`).
    let table = |name: &str| {
        let columns = (0..limit / 2)
            .map(|i| format!("a{i} INTEGER REFERENCES p (id)"))
            .collect::<Vec<_>>()
            .join(", ");
        format!("CREATE TABLE {name} ({columns});\n")
    };
    let sql = format!(
        "CREATE TABLE p (id INTEGER PRIMARY KEY);\n{}{}",
        table("c1"),
        table("c2")
    );
    let mut tx = db.begin_migration("many_keys").await.unwrap();
    assert!(
        apply_one(&mut tx, "many_keys", &migration("0001_init.sql", &sql))
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    let more = migration(
        "0002_more.sql",
        "ALTER TABLE c1 ADD COLUMN b INTEGER REFERENCES p (id);",
    );
    let mut tx = db.begin_migration("many_keys").await.unwrap();
    let err = apply_one(&mut tx, "many_keys", &more)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("hold {} foreign keys", limit + 1))
            && err.contains(&format!("at most {limit}")),
        "{err}"
    );
    tx.rollback().await.unwrap();
}

/// Regression (the review of the compile worker, issue 23): autovacuum's
/// ANALYZE ran a handler's index expressions on every sampled row, with no
/// deadline (14.6 s from 17 ms of statements). The host sets their
/// statistics target to 0 after each migration statement and at load, and
/// ANALYZE then computes nothing for them; partial indexes are refused.
#[tokio::test]
async fn postgres_analyze_runs_no_handler_index_expression() {
    let Some(db) = crate::db::test_support::postgres_db().await else {
        return;
    };
    let handler = "analyzed";
    prepare_handler(&db, handler).await.unwrap();
    let sql = "CREATE TABLE t (a TEXT, b TEXT);\nCREATE INDEX t_lower ON t (lower(a));\n\
               CREATE INDEX t_mixed ON t (b, (upper(b)), a);\n\
               INSERT INTO t (a, b) VALUES ('x', 'y'), ('z', 'w');\n";
    let mut tx = db.begin_migration(handler).await.unwrap();
    assert!(
        apply_one(&mut tx, handler, &migration("0001_init.sql", sql))
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    // What ANALYZE computed for the indexes' expressions: nothing.
    // A change to an index's statistics target is set in a transaction of
    // its own: in the one that made it, this server's ANALYZE still used
    // the old target (autovacuum runs later, in a backend of its own).
    let expression_stats = async |before: &str| {
        let mut tx = db.begin_migration(handler).await.unwrap();
        tx.execute(before, &[]).await.unwrap();
        tx.commit().await.unwrap();
        let mut tx = db.begin_migration(handler).await.unwrap();
        tx.execute("ANALYZE handler_analyzed.t", &[]).await.unwrap();
        let rows = tx
            .query(
                "SELECT pg_catalog.count(*)::pg_catalog.int8 FROM pg_catalog.pg_stats \
                 WHERE schemaname = 'handler_analyzed' AND tablename IN ('t_lower', 't_mixed')",
                &[],
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
        rows[0][0].as_i64().unwrap()
    };
    assert_eq!(expression_stats("SELECT 1").await, 0);
    // The premise, on this server: with a target, ANALYZE computes them.
    // An index from before this rule is brought to 0 when the handler loads.
    assert_eq!(
        expression_stats("ALTER INDEX handler_analyzed.t_lower ALTER COLUMN 1 SET STATISTICS -1").await,
        1
    );
    bound_rows(&db, handler, 1 << 20).await.unwrap();
    let mut tx = db.begin_migration(handler).await.unwrap();
    let targets = tx
        .query(
            "SELECT pg_catalog.count(*)::pg_catalog.int8 FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
             WHERE c.relname IN ('t_lower', 't_mixed') AND a.attnum > 0 AND a.attstattarget = 0",
            &[],
        )
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        targets[0][0].as_i64(),
        Some(2),
        "lower(a) and upper(b), not the plain columns"
    );

    let partial = migration("0002_partial.sql", "CREATE INDEX t_some ON t (a) WHERE b <> '';");
    let mut tx = db.begin_migration(handler).await.unwrap();
    let err = apply_one(&mut tx, handler, &partial)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("partial index"), "{err}");
    tx.rollback().await.unwrap();
    // One an older release let in is named at start (`audit::planted_code`
    // reads this; here inside a transaction no other test sees).
    let mut host = db.begin().await.unwrap();
    host.execute("CREATE INDEX t_old ON handler_analyzed.t (a) WHERE b <> ''", &[])
        .await
        .unwrap();
    let found = host
        .query(POSTGRES_PARTIAL_INDEXES, &["handler\\_analyzed".into()])
        .await
        .unwrap();
    let indexes: Vec<(SqlValue, SqlValue)> =
        found.into_iter().map(|r| (r[0].clone(), r[1].clone())).collect();
    assert_eq!(indexes, [("handler_analyzed".into(), "t_old".into())]);
    host.rollback().await.unwrap();
}
