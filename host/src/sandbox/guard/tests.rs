//! The statement guard's tests: what it allows and refuses, on both backends.
use super::*;

fn guard(backend: Backend) -> Guard {
    let schema = if backend == Backend::Sqlite {
        "main"
    } else {
        "handler_billing"
    };
    Guard::new(
        backend,
        schema,
        &["invoices".to_owned(), "customers".to_owned()],
        4096,
        1 << 20,
    )
}

fn allowed(sql: &str) {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        assert_eq!(
            guard(backend).check(sql),
            Ok(()),
            "{backend:?} should allow: {sql}"
        );
    }
}

fn refused(sql: &str, because: &str) {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        match guard(backend).check(sql) {
            Err(Refusal::Forbidden(m)) | Err(Refusal::Limit(m)) => {
                assert!(
                    m.contains(because),
                    "{backend:?}: {sql}\n  refused with {m:?}, expected {because:?}"
                )
            }
            Ok(()) => panic!("{backend:?} allowed: {sql}"),
        }
    }
}

#[test]
fn the_handlers_own_dml_and_reads_pass() {
    allowed("INSERT INTO invoices (order_id, amount_cents) VALUES ($1, $2)");
    allowed("insert into INVOICES (order_id) values ($1) on conflict do nothing");
    allowed("UPDATE invoices SET amount_cents = amount_cents + 1 WHERE order_id = $1");
    allowed("DELETE FROM invoices WHERE order_id = $1");
    allowed("SELECT count(*), max(amount_cents) FROM invoices i JOIN customers c ON c.id = i.customer_id");
    allowed("WITH recent AS (SELECT * FROM invoices) SELECT * FROM recent");
    allowed("SELECT ';DELETE FROM inbox' AS harmless_text");
    allowed("SELECT 1 /* ; DELETE FROM inbox */");
    allowed("SELECT * FROM generate_series(1, 3)");
}

#[test]
fn host_tables_are_refused_however_they_are_spelled() {
    for sql in [
        "DELETE FROM inbox",
        "delete from INBOX where 1 = 1",
        "DELETE FROM \"inbox\"",
        "UPDATE offsets SET next_offset = 0",
        "INSERT INTO inbox (handler, event_id) VALUES ('billing', 'x')",
        "DELETE FROM main.inbox",
        "DELETE FROM inboxd.inbox",
        "DELETE/**/FROM/**/inbox",
        "SELECT * FROM invoices WHERE order_id IN (SELECT event_id FROM inbox)",
        "WITH gone AS (DELETE FROM inbox RETURNING *) SELECT count(*) FROM gone",
        "INSERT INTO invoices SELECT * FROM dead_letters",
    ] {
        refused(sql, "host's tables");
    }
}

#[test]
fn a_cte_cannot_stand_in_for_a_host_table_as_a_write_target() {
    refused("WITH inbox AS (SELECT 1) DELETE FROM inbox", "host's tables");
    refused("WITH totals AS (SELECT 1) DELETE FROM offsets", "host's tables");
}

/// Regression: a CTE defined in an inner query made an outer reference to
/// a real table of the same name count as the CTE (another handler read
/// billing's invoices on SQLite).
#[test]
fn a_cte_name_covers_only_the_queries_that_can_see_it() {
    let other = |sql: &str| {
        for backend in [Backend::Sqlite, Backend::Postgres] {
            let g = Guard::new(backend, "main", &["emails".to_owned()], 4096, 1 << 20);
            match g.check(sql) {
                Err(Refusal::Forbidden(m)) => assert!(m.contains("invoices"), "{backend:?}: {m}"),
                other => panic!("{backend:?} allowed {sql}: {other:?}"),
            }
        }
    };
    other(
        "SELECT customer_email FROM invoices WHERE EXISTS (WITH invoices AS (SELECT 1) SELECT 1 FROM invoices)",
    );
    other("SELECT * FROM (WITH invoices AS (SELECT 1) SELECT * FROM invoices) x, invoices");
    other("WITH a AS (SELECT * FROM invoices), invoices AS (SELECT 1) SELECT * FROM a");
    other("WITH invoices AS (SELECT * FROM invoices) SELECT * FROM invoices");
    // `TABLE name` is read as what it is (PostgreSQL), or not parsed at all (SQLite).
    for sql in ["SELECT 1 UNION TABLE invoices", "TABLE invoices", "TABLE inbox"] {
        for backend in [Backend::Sqlite, Backend::Postgres] {
            let g = Guard::new(backend, "main", &["emails".to_owned()], 4096, 1 << 20);
            assert!(
                matches!(g.check(sql), Err(Refusal::Forbidden(_))),
                "{backend:?}: {sql}"
            );
        }
    }
    // Still allowed: a CTE seen where it is in scope, a recursive one inside itself.
    let g = Guard::new(Backend::Sqlite, "main", &["emails".to_owned()], 4096, 1 << 20);
    g.check("WITH invoices AS (SELECT 1 AS a) SELECT * FROM emails WHERE EXISTS (SELECT 1 FROM invoices)")
        .unwrap();
    g.check("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3) SELECT * FROM n")
        .unwrap();
}

/// Regressions from a hostile review: texts the databases read otherwise
/// than the parser, and statements that break the host's transaction.
#[test]
fn texts_the_databases_read_differently_are_refused() {
    refused("SELECT 1 --\0", "NUL");
    refused("SELECT $0", "parameter $0");
    refused("SELECT $01", "parameter $01");
    refused("INSERT INTO invoices (order_id) VALUES (:name)", "parameter");
    refused(
        "INSERT OR ROLLBACK INTO invoices (order_id) VALUES ($1)",
        "OR ROLLBACK",
    );
    refused("UPDATE OR ROLLBACK invoices SET order_id = $1", "OR ROLLBACK");
    // SQLite's own syntax; PostgreSQL's parser refuses it (and would at run time).
    guard(Backend::Sqlite)
        .check("INSERT OR IGNORE INTO invoices (order_id) VALUES ($1)")
        .unwrap();
    assert!(
        guard(Backend::Postgres)
            .check("INSERT OR IGNORE INTO invoices (order_id) VALUES ($1)")
            .is_err()
    );
    allowed("SELECT * FROM invoices WHERE order_id = $32766");
    // SQLite reads `$1::t('...')` as one parameter name, hiding the rest.
    let lite = guard(Backend::Sqlite);
    assert!(matches!(
        lite.check("SELECT $1::t('), (SELECT count(*) FROM inbox) --')"),
        Err(Refusal::Forbidden(m)) if m.contains("::")
    ));
    guard(Backend::Postgres)
        .check("SELECT * FROM invoices WHERE order_id = $1::text")
        .unwrap();
    // A CTE named with the Kelvin sign is `k`... only to a Unicode fold.
    let g = Guard::new(Backend::Sqlite, "main", &["emails".to_owned()], 4096, 1 << 20);
    assert!(
        g.check("WITH \u{212a}eys AS (SELECT 1) SELECT count(*) FROM keys")
            .is_err()
    );
}

#[test]
fn other_tables_and_schemas_are_refused() {
    refused(
        "SELECT * FROM handler_notifier.emails",
        "not one of this handler's tables",
    );
    refused("SELECT * FROM emails", "not one of this handler's tables");
    refused("SELECT * FROM sqlite_master", "host's tables");
    refused("SELECT * FROM pg_catalog.pg_authid", "host's tables");
    refused("SELECT * FROM a.b.c", "more than two parts");
}

#[test]
fn transaction_control_session_and_ddl_are_refused() {
    for sql in [
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
        "SAVEPOINT s",
        "RELEASE SAVEPOINT s",
    ] {
        refused(sql, "transaction control is the host's");
    }
    for sql in [
        "DROP TABLE invoices",
        "ALTER TABLE invoices ADD COLUMN x TEXT",
        "CREATE TABLE t (a INT)",
    ] {
        refused(sql, "belong in the handler's migrations");
    }
    refused("CREATE VIEW v AS SELECT * FROM inbox", "not allowed");
    refused(
        "CREATE TRIGGER t AFTER INSERT ON invoices BEGIN DELETE FROM inbox; END",
        "not allowed",
    );
}

#[test]
fn postgres_session_and_server_functions_are_refused() {
    let pg = guard(Backend::Postgres);
    for sql in [
        "SET ROLE postgres",
        "SET SESSION AUTHORIZATION postgres",
        "SET search_path = inboxd",
    ] {
        assert!(
            matches!(pg.check(sql), Err(Refusal::Forbidden(m)) if m.contains("role changes")),
            "{sql}"
        );
    }
    for sql in [
        "SELECT set_config('role', 'postgres', true)",
        "SELECT pg_read_file('/etc/passwd')",
        "SELECT lo_import('/etc/passwd')",
        "SELECT * FROM dblink('host=x', 'DELETE FROM inbox') AS t(a int)",
        "SELECT pg_catalog.set_config('role', 'postgres', true)",
    ] {
        assert!(matches!(pg.check(sql), Err(Refusal::Forbidden(_))), "{sql}");
    }
    assert!(pg.check("RESET ROLE").is_err());
    assert!(pg.check("COPY invoices TO '/tmp/x'").is_err());
    assert!(pg.check("LISTEN x").is_err());
    assert!(pg.check("DO $$ BEGIN DELETE FROM inboxd.inbox; END $$").is_err());
    assert!(pg.check("CALL p()").is_err());
}

#[test]
fn sqlite_database_commands_are_refused() {
    let lite = guard(Backend::Sqlite);
    for sql in [
        "ATTACH DATABASE '/tmp/x.db' AS x",
        "PRAGMA writable_schema = ON",
        "VACUUM INTO '/tmp/copy.db'",
        "SELECT load_extension('/tmp/evil.so')",
    ] {
        assert!(matches!(lite.check(sql), Err(Refusal::Forbidden(_))), "{sql}");
    }
}

/// Regression (the seventeenth adversarial read, issue 23): SQLite reads
/// a BLOB argument of a JSON function as binary JSON and recurses over
/// its nesting without a bound; one nested 150 KB parameter overflowed
/// the host's stack. Every spelling is refused on SQLite.
#[test]
fn sqlite_json_functions_and_operators_are_refused() {
    let lite = guard(Backend::Sqlite);
    for sql in [
        "SELECT json_extract($1, '$')",
        "SELECT $1 -> '$'",
        "SELECT $1 ->> '$'",
        "SELECT json_array($1)",
        "SELECT json_object('a', $1)",
        "SELECT JSON_EXTRACT(a, '$.k') FROM invoices",
        "SELECT value FROM json_each($1)",
        "SELECT count(*) FROM json_tree($1)",
        "INSERT INTO invoices (a) SELECT json($1)",
    ] {
        match lite.check(sql) {
            Err(Refusal::Forbidden(m)) => assert!(m.contains("JSON"), "{sql}: {m}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
}

/// Regression (the seventeenth adversarial read, issue 23): SQLite
/// copies a CTE's query into every place that reads it, while preparing;
/// 18 CTEs each reading the one before twice took 3.5 s against 0.2 s,
/// and 24 would take tens of GB. On SQLite a CTE is read at most once
/// (a recursive CTE's read of itself aside).
#[test]
fn on_sqlite_a_cte_is_read_once() {
    let lite = guard(Backend::Sqlite);
    let pg = guard(Backend::Postgres);
    let mut ctes = vec!["c0(x) AS (SELECT 1)".to_owned()];
    for i in 1..20 {
        ctes.push(format!(
            "c{i}(x) AS (SELECT x FROM c{p} UNION ALL SELECT x FROM c{p})",
            p = i - 1
        ));
    }
    let fan_out = format!("WITH {} SELECT count(*) FROM c19", ctes.join(", "));
    for sql in [
        fan_out.as_str(),
        "WITH a AS (SELECT 1 AS x) SELECT a1.x FROM a AS a1, a AS a2",
        "WITH a AS (SELECT 1 AS x) SELECT x, (SELECT count(*) FROM a) FROM a",
    ] {
        match lite.check(sql) {
            Err(Refusal::Forbidden(m)) => assert!(m.contains("read more than once"), "{sql}: {m}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
    assert_eq!(
        pg.check("WITH a AS (SELECT 1 AS x) SELECT a1.x FROM a AS a1, a AS a2"),
        Ok(())
    );
    allowed(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10), \
         m AS (SELECT i FROM n) SELECT count(*) FROM m",
    );
}

/// Regression (the twenty-second adversarial read, issue 23): SQLite lets
/// a CTE read the CTEs defined after it, where the guard took such a name
/// for an own table of that name; each CTE reading the next twice made
/// 2^21 copies while SQLite prepared the statement (about 11 s and 2 GiB,
/// past every deadline). On SQLite a CTE may not share an own table's
/// name; on PostgreSQL, which scopes as the guard does, it may.
#[test]
fn on_sqlite_a_cte_may_not_share_an_own_tables_name() {
    let tables: Vec<String> = (1..=21).map(|i| format!("c{i}")).collect();
    let lite = Guard::new(Backend::Sqlite, "main", &tables, 4096, 1 << 20);
    let mut ctes: Vec<String> = (0..=20)
        .map(|i| format!("c{i} AS (SELECT 1 AS x FROM c{n} a, c{n} b)", n = i + 1))
        .collect();
    ctes.push("c21 AS (SELECT 1 AS x)".to_owned());
    let forward = format!("WITH {} SELECT count(*) FROM c0", ctes.join(", "));
    for sql in [
        forward.as_str(),
        "WITH c1 AS (SELECT 1 AS x) SELECT * FROM c1",
        "WITH a AS (SELECT * FROM c1), c1 AS (SELECT 7 AS x) SELECT * FROM a",
    ] {
        match lite.check(sql) {
            Err(Refusal::Forbidden(m)) => {
                assert!(m.contains("may not be named like your table c1"), "{sql}: {m}")
            }
            other => panic!("{sql}: {other:?}"),
        }
    }
    let pg = Guard::new(Backend::Postgres, "handler_x", &tables, 4096, 1 << 20);
    assert_eq!(pg.check("WITH c1 AS (SELECT 1 AS x) SELECT * FROM c1"), Ok(()));
    // A name that is no own table is a table read, refused, on both.
    refused(
        "WITH a AS (SELECT * FROM later), later AS (SELECT 1 AS x) SELECT * FROM a",
        "later",
    );
    refused(
        "WITH handler_totals AS (SELECT 1 AS x) SELECT * FROM handler_totals",
        "host's tables",
    );
}

/// Regression (the seventeenth adversarial read, issue 23): a chain of
/// 5,000 CTEs overflowed the stack of SQLite's planner, and the guard's
/// scoping of n CTEs held n^2/2 names at once; a statement defines at
/// most `MAX_CTES`, counting nested WITHs.
#[test]
fn a_statement_defines_a_bounded_number_of_ctes() {
    let chain = |n: usize| {
        let ctes: Vec<String> = (0..n)
            .map(|i| match i {
                0 => "c0 AS (SELECT 1 AS x)".to_owned(),
                _ => format!("c{i} AS (SELECT x FROM c{})", i - 1),
            })
            .collect();
        format!("WITH {} SELECT x FROM c{}", ctes.join(", "), n - 1)
    };
    allowed(&chain(super::super::walk::MAX_CTES));
    refused(
        &chain(super::super::walk::MAX_CTES + 1),
        "common table expressions",
    );
    // The read's own: 5,000 in a statement of a team's ceiling size.
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let big = Guard::new(backend, "main", &[], 1 << 20, 1 << 20);
        let err = big.check(&chain(5_000)).unwrap_err().to_string();
        assert!(err.contains("common table expressions"), "{backend:?}: {err}");
    }
    let nested = format!(
        "WITH a0 AS (SELECT 1 AS x) SELECT x FROM ({})",
        chain(super::super::walk::MAX_CTES)
    );
    refused(&nested, "common table expressions");
}

/// Regression (issue 23): PostgreSQL turns attribute notation, casts,
/// COLLATE and other syntax into function calls that the guard's
/// function allowlist never saw; `(text).ts_stat` ran a query.
#[test]
fn syntax_that_postgres_turns_into_calls_is_refused() {
    let pg = guard(Backend::Postgres);
    for sql in [
        "SELECT ('SELECT 1'::text).ts_stat",
        "SELECT (order_id).ts_stat FROM invoices",
        "SELECT invoices.order_id.ts_stat FROM invoices",
        "SELECT (i).order_id FROM invoices i",
        "SELECT order_id COLLATE \"C\" FROM invoices",
        "SELECT 'pg_catalog.set_config'::regproc",
        "SELECT CAST('invoices' AS regclass)",
        "SELECT 'a & b'::tsquery",
        "SELECT now() AT TIME ZONE 'UTC'",
        "SELECT ARRAY[1, 2][1]",
        "SELECT $1::int[] && $2::int[]",
        "SELECT $1::jsonb @> $2::jsonb",
        "SELECT order_id ~ 'x' FROM invoices",
    ] {
        match pg.check(sql) {
            Err(Refusal::Forbidden(m)) => assert!(m.contains("not allowed"), "{sql}: {m}"),
            other => panic!("allowed: {sql}: {other:?}"),
        }
    }
    pg.check(
        "SELECT $1::text, CAST($2 AS bigint), $3::numeric(10, 2), DATE '2020-01-01', \
         $4::timestamp(3) with time zone, i.order_id FROM invoices i WHERE i.order_id = ANY($5::text[])",
    )
    .unwrap();
}

/// Regression (issue 23): one call whose time grows with the product of
/// two lengths is one step that neither database interrupts at the
/// event's deadline (SQLite's instr held the writer 17 s against 5 s).
#[test]
fn calls_whose_time_grows_with_two_lengths_are_refused() {
    for sql in [
        "SELECT instr(order_id, 'a') FROM invoices",
        "SELECT order_id FROM invoices WHERE order_id LIKE '%a%'",
        "SELECT string_agg(order_id, ',') FROM invoices",
        "SELECT replace(order_id, 'a', 'b') FROM invoices",
        "SELECT position('a', order_id) FROM invoices",
        "SELECT trim(order_id, 'xyz') FROM invoices",
        "SELECT ltrim(order_id, 'xyz') FROM invoices",
        "SELECT TRIM(BOTH 'xyz' FROM order_id) FROM invoices",
        // The fifth adversarial read: many paths are one SQLite step.
        "SELECT json_extract(order_id, '$.a', '$.b') FROM invoices",
        // The eighth read: a long strftime format is one slow step.
        "SELECT strftime(order_id, 'now') FROM invoices",
    ] {
        refused(sql, "not allowed");
    }
    allowed("SELECT strftime('%Y-%m-%d %H:%M:%S', 'now') FROM invoices");
    // The seventh read: SQLite looks at the deadline only between rows.
    let uppers = vec!["length(upper(order_id))"; 60].join(", ");
    let err = guard(Backend::Sqlite)
        .check(&format!("SELECT {uppers} FROM invoices"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("calls and operators"), "{err}");
    guard(Backend::Postgres)
        .check("SELECT POSITION('a' IN order_id) FROM invoices")
        .unwrap_err();
    allowed("SELECT trim(order_id), ltrim(order_id), lower(order_id) FROM invoices");
}

/// Regression (the fifth adversarial read, issue 23): a type name with a
/// `)` before its `(` made the guard slice backwards and panic (caught,
/// but reported as a defect of the host).
#[test]
fn a_quoted_type_name_with_parentheses_is_refused_as_such() {
    let err = guard(Backend::Postgres)
        .check(r#"SELECT 1::"a)b(c""#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not allowed") && !err.contains("defect"), "{err}");
}

/// Regression (issue 23): a 64 KiB `SELECT 1+1+...+1` passed the guard,
/// and dropping its syntax tree overflowed the fiber's stack (exit 134).
#[test]
fn a_statement_nested_past_the_bound_is_refused_and_nothing_overflows() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let g = Guard::new(backend, "main", &["invoices".to_owned()], 64 << 10, 1 << 20);
        let chain = format!("SELECT 1{}", "+1".repeat((64 << 10) / 2 - 5));
        assert!(chain.len() <= 64 << 10);
        match g.check(&chain) {
            Err(Refusal::Limit(m)) => assert!(m.contains("at most 1000"), "{m}"),
            other => panic!("{backend:?}: {other:?}"),
        }
        let nested = format!("SELECT {}1{}", "(".repeat(20_000), ")".repeat(20_000));
        assert!(g.check(&nested).is_err());
    }
}

/// Regression (issue 23): the verdict memory had no byte bound.
#[test]
fn the_verdict_memory_is_bounded_in_bytes() {
    let g = Guard::new(
        Backend::Sqlite,
        "main",
        &["invoices".to_owned()],
        1 << 20,
        1 << 20,
    );
    for i in 0..64 {
        let sql = format!("SELECT '{i}{}'", "x".repeat(512 << 10));
        assert!(g.check(&sql).is_ok());
        assert!(g.remembered_bytes() <= MAX_VERDICT_BYTES, "after {i}");
    }
}

/// Regression (the eleventh adversarial read, issue 23): `approve` held the
/// verdict lock through a judge, and `remembered` takes that lock on the
/// runtime's workers, so a team sending new long texts from a few calls at
/// once blocked every worker (2 here) for as long as it kept sending.
#[test]
fn looking_up_a_verdict_never_waits_for_a_judge() {
    let g = std::sync::Arc::new(Guard::new(
        Backend::Postgres,
        "handler_billing",
        &["invoices".to_owned()],
        1 << 20,
        1 << 20,
    ));
    let slow = |i: usize| {
        let list: Vec<String> = (0..50_000).map(|n| (n + i).to_string()).collect();
        format!("SELECT id FROM invoices WHERE id IN ({})", list.join(","))
    };
    assert!(g.check("SELECT 1").is_ok());
    let started = std::time::Instant::now();
    let _ = g.check(&slow(0));
    let judge = started.elapsed();
    assert!(judge > std::time::Duration::from_millis(50), "{judge:?}");
    let judging = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let worker = {
        let (g, judging) = (g.clone(), judging.clone());
        std::thread::spawn(move || {
            for i in 1..=2 {
                let _ = g.check(&slow(i));
            }
            judging.store(false, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let mut longest = std::time::Duration::ZERO;
    while judging.load(std::sync::atomic::Ordering::SeqCst) {
        let asked = std::time::Instant::now();
        assert!(matches!(g.remembered("SELECT 1"), Some(Ok(_))));
        longest = longest.max(asked.elapsed());
    }
    worker.join().unwrap();
    assert!(
        longest < judge / 4,
        "a lookup waited {longest:?} while a judge of {judge:?} ran"
    );
}

#[test]
fn two_statements_and_oversized_ones_are_refused() {
    refused(
        "INSERT INTO invoices VALUES (1); DELETE FROM inbox",
        "one statement per call",
    );
    refused("SELECT 1; SELECT 2", "one statement per call");
    let huge = format!("SELECT '{}'", "x".repeat(5000));
    refused(&huge, "limits.max_statement_bytes");
}
