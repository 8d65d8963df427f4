//! The migration guard's refusals and what it lets through, on both backends.

use super::*;

fn owned(backend: Backend) -> Owned {
    let schema = if backend == Backend::Sqlite {
        "main"
    } else {
        "handler_billing"
    };
    Owned::new(schema, &["invoices".to_owned()])
}

/// Splits, then checks each statement against the tables owned so far
/// (adding what CREATE TABLE / VIEW make), as the migrator does.
fn run(backend: Backend, sql: &str) -> Result<Vec<String>, String> {
    let pieces = split(backend, sql).map_err(|r| r.to_string())?;
    let mut own = owned(backend);
    for piece in &pieces {
        check(piece, &own).map_err(|r| r.to_string())?;
        match &piece.statement {
            Statement::CreateTable(t) => own.tables.insert(own.own_name(&t.name).unwrap()),
            Statement::CreateView(v) => own.tables.insert(own.own_name(&v.name).unwrap()),
            _ => false,
        };
    }
    Ok(pieces.into_iter().map(|p| p.text).collect())
}

fn refused(sql: &str, because: &str) {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        match run(backend, sql) {
            Ok(_) => panic!("{backend:?} allowed: {sql}"),
            Err(m) => assert!(
                m.contains(because),
                "{backend:?}: {sql}\n  refused with {m:?}, expected {because:?}"
            ),
        }
    }
}

/// Regression (the eighth adversarial read, issue 23): on SQLite a view's
/// or table's own expressions ran inside every read or write of it,
/// uncounted, and views reading views twice each made 2^14 subqueries.
#[test]
fn sqlite_schema_expressions_are_bounded() {
    let sqlite = |sql: &str| run(Backend::Sqlite, sql);
    let base = "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT CHECK (length(body) < 100000));\n";
    assert!(
        sqlite(&format!(
            "{base}CREATE VIEW plain AS SELECT id, body AS text FROM notes;"
        ))
        .is_ok()
    );
    assert!(sqlite(&format!("{base}CREATE INDEX notes_body ON notes (body);")).is_ok());
    for (sql, because) in [
        (
            "CREATE VIEW heavy AS SELECT length(upper(body)) AS c FROM notes;",
            "a view selects",
        ),
        (
            "CREATE VIEW twice AS SELECT x.id FROM notes x, notes y;",
            "a view selects",
        ),
        (
            "CREATE INDEX notes_upper ON notes (upper(body));",
            "plain columns",
        ),
        (
            "CREATE INDEX notes_some ON notes (body) WHERE id > 0;",
            "plain columns",
        ),
        (
            "ALTER TABLE notes ADD COLUMN tag TEXT CHECK (length(tag) < 10);",
            "ALTER TABLE",
        ),
    ] {
        let err = sqlite(&format!("{base}{sql}")).unwrap_err();
        assert!(err.contains(because), "{sql}: {err}");
    }
    let upper = vec!["length(upper(body)) < 9"; 100].join(" AND ");
    let err = sqlite(&format!("CREATE TABLE n (body TEXT CHECK ({upper}));")).unwrap_err();
    assert!(err.contains("calls and operators"), "{err}");
    let err = sqlite(&format!("{base}UPDATE notes SET body = 'x' WHERE {upper};")).unwrap_err();
    assert!(err.contains("calls and operators"), "{err}");
}

#[test]
fn ordinary_migrations_pass_and_are_cut_into_statements() {
    let sql = "-- invoices; and more\nCREATE TABLE emails (id INTEGER PRIMARY KEY, body TEXT DEFAULT 'a;b', \
               invoice TEXT REFERENCES invoices (order_id), created TEXT DEFAULT (lower('X')));\n\
               CREATE INDEX emails_body ON emails (body);\n\
               ALTER TABLE emails ADD COLUMN extra TEXT;\n\
               CREATE VIEW recent AS SELECT * FROM emails;\n\
               INSERT INTO emails (body) VALUES ('seed; not a cut');\n\
               DROP VIEW recent; /* trailing comment */";
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let texts = run(backend, sql).unwrap();
        assert_eq!(texts.len(), 6, "{texts:?}");
        assert!(
            texts[0].starts_with("-- invoices; and more\nCREATE TABLE emails"),
            "{}",
            texts[0]
        );
        assert!(texts[4].ends_with("('seed; not a cut')"), "{}", texts[4]);
    }
}

#[test]
fn code_that_would_run_later_is_refused() {
    refused(
        "CREATE TABLE t (a TEXT); CREATE TRIGGER x AFTER INSERT ON t BEGIN DELETE FROM offsets; END;",
        "",
    );
    for (sql, because) in [
        ("CREATE FUNCTION f() RETURNS int AS 'select 1' LANGUAGE sql", ""),
        (
            "CREATE TABLE t (a TEXT DEFAULT (set_config('role', 'postgres', true)))",
            "set_config",
        ),
        (
            "CREATE TABLE t (a TEXT CHECK (pg_read_file('/etc/passwd') IS NOT NULL))",
            "pg_read_file",
        ),
        (
            "CREATE INDEX i ON invoices (set_config('role', 'x', false))",
            "set_config",
        ),
        (
            "CREATE TABLE t (a TEXT DEFAULT (printf('%.1000000000c', 'x')))",
            "printf",
        ),
        ("CREATE TABLE t (a TEXT UNIQUE ON CONFLICT ROLLBACK)", ""),
        (
            "ALTER TABLE invoices ADD COLUMN b TEXT NOT NULL ON CONFLICT ROLLBACK DEFAULT 'x'",
            "",
        ),
        ("CREATE TABLE t (a TEXT);\0", "NUL"),
        (
            "CREATE TABLE t (a TEXT REFERENCES invoices (order_id) DEFERRABLE INITIALLY DEFERRED)",
            "DEFERRABLE",
        ),
        (
            "ALTER TABLE invoices ADD CONSTRAINT u UNIQUE (order_id) DEFERRABLE",
            "DEFERRABLE",
        ),
    ] {
        refused(sql, because);
    }
}

#[test]
fn session_transaction_and_privilege_statements_are_refused() {
    for sql in [
        "RESET ROLE",
        "SET ROLE NONE",
        "SET search_path = inboxd",
        "COMMIT; DELETE FROM inbox",
        "BEGIN",
        "SELECT set_config('role', 'postgres', false)",
        "GRANT ALL ON invoices TO PUBLIC",
        "CREATE EXTENSION dblink",
        "COPY invoices TO '/tmp/x'",
        "CREATE TEMPORARY TABLE t (a TEXT)",
        "CREATE SEQUENCE s",
        "CREATE SCHEMA evil",
        "DO $$ BEGIN DELETE FROM inboxd.inbox; END $$",
        "ATTACH DATABASE '/tmp/x' AS x",
        "PRAGMA writable_schema = ON",
    ] {
        refused(sql, "");
    }
}

#[test]
fn host_and_other_handlers_tables_are_out_of_reach() {
    for (sql, because) in [
        ("DROP TABLE handler_deployments", "host's tables"),
        ("ALTER TABLE handlers ADD COLUMN x TEXT", "host's tables"),
        (
            "CREATE TABLE copy AS SELECT * FROM handler_deployments",
            "host's tables",
        ),
        (
            "INSERT INTO sqlite_sequence VALUES ('dead_letters', 0)",
            "host's tables",
        ),
        ("CREATE TABLE outbox_parked (a TEXT)", "kept for the host"),
        ("CREATE TABLE handler_x (a TEXT)", "kept for the host"),
        ("CREATE TABLE inboxd.sneaky (a TEXT)", "own schema"),
        (
            "CREATE VIEW v AS SELECT * FROM emails",
            "not one of this handler's tables",
        ),
        (
            "CREATE TABLE t (a TEXT REFERENCES emails (id))",
            "not one of this handler's tables",
        ),
        (
            "CREATE INDEX i ON emails (id)",
            "not one of this handler's tables",
        ),
        ("DELETE FROM emails", "not one of this handler's tables"),
        ("ALTER TABLE invoices RENAME TO inbox_x", "kept for the host"),
        ("CREATE TABLE t (a TEXT) INHERITS (inboxd.inbox)", ""),
    ] {
        refused(sql, because);
    }
}
