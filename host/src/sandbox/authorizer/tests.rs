//! The SQLite authorizer's decisions, action by action, in both scopes, and the connection's walls.

use super::*;

fn policy(scope: Scope) -> Policy {
    Policy::new(scope, &["invoices".to_owned(), "Customers".to_owned()])
}

#[test]
fn only_own_tables_are_read_and_written_in_every_scope() {
    for scope in [Scope::Guest, Scope::Migration] {
        let p = policy(scope);
        for action in [
            ffi::SQLITE_READ,
            ffi::SQLITE_UPDATE,
            ffi::SQLITE_INSERT,
            ffi::SQLITE_DELETE,
        ] {
            // A DELETE is allowed row by row (see `delete_without_where_stops_at_the_deadline`).
            let allowed = if action == ffi::SQLITE_DELETE {
                ffi::SQLITE_IGNORE
            } else {
                ffi::SQLITE_OK
            };
            assert_eq!(p.decide(action, Some("INVOICES"), None, &[]), allowed);
            assert_eq!(p.decide(action, Some("customers"), None, &[]), allowed);
            // Host tables, another handler's, one added tomorrow: none is listed, all are denied.
            for other in [
                "inbox",
                "handler_deployments",
                "sqlite_sequence",
                "emails",
                "new_host_table",
            ] {
                assert_eq!(
                    p.decide(action, Some(other), None, &[]),
                    ffi::SQLITE_DENY,
                    "{other}"
                );
            }
            assert_eq!(p.decide(action, None, None, &[]), ffi::SQLITE_DENY);
        }
        for (action, arg1, arg2) in [
            (ffi::SQLITE_CREATE_TRIGGER, Some("t"), Some("invoices")),
            (ffi::SQLITE_CREATE_TEMP_TABLE, Some("t"), None),
            (ffi::SQLITE_ATTACH, Some("/tmp/x"), None),
            (ffi::SQLITE_PRAGMA, Some("writable_schema"), None),
            (ffi::SQLITE_TRANSACTION, Some("BEGIN"), None),
            (ffi::SQLITE_SAVEPOINT, Some("RELEASE"), Some("s")),
            (ffi::SQLITE_FUNCTION, None, Some("load_extension")),
            (ffi::SQLITE_FUNCTION, None, Some("readfile")),
            // The seventeenth adversarial read: JSONB nesting overflowed the stack.
            (ffi::SQLITE_FUNCTION, None, Some("json_extract")),
            (ffi::SQLITE_FUNCTION, None, Some("JSON_ARRAY")),
            (ffi::SQLITE_FUNCTION, None, Some("->")),
            (ffi::SQLITE_FUNCTION, None, Some("->>")),
            (ffi::SQLITE_READ, Some("json_each"), Some("value")),
            (ffi::SQLITE_CREATE_VTABLE, Some("t"), Some("fts5")),
        ] {
            assert_eq!(
                p.decide(action, arg1, arg2, &[]),
                ffi::SQLITE_DENY,
                "{action} {arg1:?}"
            );
        }
        assert_eq!(
            p.decide(ffi::SQLITE_FUNCTION, None, Some("LOWER"), &[]),
            ffi::SQLITE_OK
        );
        // Regression (issue 23): one LIKE or GLOB call is one VM step whose
        // time grows with both lengths; the deadline never interrupts it.
        // (In migration scope SQLite's own ALTER TABLE code calls `like`;
        // a migration's statements cannot: the migration guard refuses it.)
        for operator in ["like", "glob", "instr", "replace"] {
            if scope == Scope::Migration && operator == "like" {
                continue;
            }
            assert_eq!(
                p.decide(ffi::SQLITE_FUNCTION, None, Some(operator), &[]),
                ffi::SQLITE_DENY,
                "{operator}"
            );
        }
        // A CTE is read under its name, with no column; only the
        // statement's own CTE names pass, and never a column read.
        let ctes = ["n".to_owned()];
        assert_eq!(
            p.decide(ffi::SQLITE_READ, Some("n"), Some(""), &ctes),
            ffi::SQLITE_OK
        );
        assert_eq!(
            p.decide(ffi::SQLITE_READ, Some("n"), Some(""), &[]),
            ffi::SQLITE_DENY
        );
        assert_eq!(
            p.decide(ffi::SQLITE_READ, Some("n"), Some("secret"), &ctes),
            ffi::SQLITE_DENY
        );
        assert_eq!(
            p.decide(ffi::SQLITE_READ, Some("emails"), Some(""), &ctes),
            ffi::SQLITE_DENY
        );
        // Never a host table's name, whatever the statement's CTEs are called.
        let host = ["inbox".to_owned()];
        assert_eq!(
            p.decide(ffi::SQLITE_READ, Some("inbox"), Some(""), &host),
            ffi::SQLITE_DENY
        );
    }
}

#[test]
fn schema_changes_only_in_migrations_and_only_on_own_tables() {
    let guest = policy(Scope::Guest);
    let migration = policy(Scope::Migration);
    assert_eq!(
        guest.decide(ffi::SQLITE_CREATE_TABLE, Some("t"), None, &[]),
        ffi::SQLITE_DENY
    );
    // SQLite's own ALTER TABLE machinery, in migrations only.
    assert_eq!(
        guest.decide(ffi::SQLITE_FUNCTION, None, Some("printf"), &[]),
        ffi::SQLITE_DENY
    );
    assert_eq!(
        migration.decide(ffi::SQLITE_FUNCTION, None, Some("printf"), &[]),
        ffi::SQLITE_OK
    );
    assert_eq!(
        migration.decide(ffi::SQLITE_CREATE_TABLE, Some("t"), None, &[]),
        ffi::SQLITE_OK
    );
    assert_eq!(
        guest.decide(ffi::SQLITE_INSERT, Some("sqlite_master"), None, &[]),
        ffi::SQLITE_DENY
    );
    assert_eq!(
        migration.decide(ffi::SQLITE_INSERT, Some("sqlite_master"), None, &[]),
        ffi::SQLITE_OK
    );
    // Names the host keeps for its own tables, now and later.
    for reserved in ["inbox_2", "handlers", "outbox_parked", "offsets", "sqlite_stat1"] {
        assert_eq!(
            migration.decide(ffi::SQLITE_CREATE_TABLE, Some(reserved), None, &[]),
            ffi::SQLITE_DENY,
            "{reserved}"
        );
    }
    assert_eq!(
        migration.decide(ffi::SQLITE_DROP_TABLE, Some("handler_deployments"), None, &[]),
        ffi::SQLITE_DENY
    );
    assert_eq!(
        migration.decide(ffi::SQLITE_DROP_TABLE, Some("invoices"), None, &[]),
        ffi::SQLITE_OK
    );
    assert_eq!(
        migration.decide(ffi::SQLITE_ALTER_TABLE, Some("main"), Some("inbox"), &[]),
        ffi::SQLITE_DENY
    );
    assert_eq!(
        migration.decide(ffi::SQLITE_ALTER_TABLE, Some("main"), Some("invoices"), &[]),
        ffi::SQLITE_OK
    );
    assert_eq!(
        migration.decide(ffi::SQLITE_CREATE_INDEX, Some("i"), Some("emails"), &[]),
        ffi::SQLITE_DENY
    );
    assert_eq!(
        migration.decide(ffi::SQLITE_CREATE_INDEX, Some("i"), Some("invoices"), &[]),
        ffi::SQLITE_OK
    );
}

#[test]
fn no_policy_is_the_hosts_own_work_and_the_deadline_interrupts() {
    let walls = ConnectionWalls::default();
    assert_eq!(
        walls.decide(ffi::SQLITE_DELETE, Some("inbox"), None),
        ffi::SQLITE_OK
    );
    assert!(!walls.past_deadline(), "no deadline without walls");
    walls.enter(Arc::new(policy(Scope::Guest)), Instant::now());
    assert_eq!(
        walls.decide(ffi::SQLITE_DELETE, Some("inbox"), None),
        ffi::SQLITE_DENY
    );
    assert!(walls.past_deadline());
    assert!(walls.take_interrupted());
    assert!(!walls.take_interrupted(), "reported once");
    walls.leave();
    assert!(!walls.past_deadline());
    assert_eq!(
        walls.decide(ffi::SQLITE_DELETE, Some("inbox"), None),
        ffi::SQLITE_OK
    );
}

/// Regression (the sixth read of this round, issue 23): `DELETE FROM t`
/// without WHERE took SQLite's truncate optimisation, one VM step that no
/// progress handler interrupts, so a large table outlived the deadline.
#[test]
fn delete_without_where_stops_at_the_deadline() {
    use std::ffi::CString;
    let exec = |db: *mut ffi::sqlite3, sql: &str| {
        let sql = CString::new(sql).unwrap();
        // SAFETY: `db` is open and used by this thread only.
        unsafe { ffi::sqlite3_exec(db, sql.as_ptr(), None, std::ptr::null_mut(), std::ptr::null_mut()) }
    };
    let mut db = std::ptr::null_mut();
    let name = CString::new(":memory:").unwrap();
    // SAFETY: a fresh in-memory database, closed at the end of the test.
    assert_eq!(
        unsafe { ffi::sqlite3_open(name.as_ptr(), &mut db) },
        ffi::SQLITE_OK
    );
    // SAFETY: `db` is open and used by this thread only.
    unsafe { install(db) };
    let walls = walls_of(db).unwrap();
    let filled = "CREATE TABLE invoices (n INTEGER); \
        INSERT INTO invoices WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10000) SELECT i FROM n";
    assert_eq!(exec(db, filled), ffi::SQLITE_OK);
    let count = || {
        let mut left = 0;
        let sql = CString::new("SELECT count(*) FROM invoices").unwrap();
        let mut stmt = std::ptr::null_mut();
        // SAFETY: as above; the statement is finalized before it returns.
        unsafe {
            ffi::sqlite3_prepare_v2(db, sql.as_ptr(), -1, &mut stmt, std::ptr::null_mut());
            if ffi::sqlite3_step(stmt) == ffi::SQLITE_ROW {
                left = ffi::sqlite3_column_int(stmt, 0);
            }
            ffi::sqlite3_finalize(stmt);
        }
        left
    };
    // Past its deadline already: the DELETE must stop at the first check.
    walls.enter(Arc::new(policy(Scope::Guest)), Instant::now());
    assert_eq!(exec(db, "DELETE FROM invoices"), ffi::SQLITE_INTERRUPT);
    assert!(walls.take_interrupted());
    walls.leave();
    assert_eq!(count(), 10000, "nothing deleted");
    // In time, it deletes every row.
    walls.enter(
        Arc::new(policy(Scope::Guest)),
        Instant::now() + std::time::Duration::from_secs(60),
    );
    assert_eq!(exec(db, "DELETE FROM invoices"), ffi::SQLITE_OK);
    walls.leave();
    assert_eq!(count(), 0);
    // SAFETY: nothing uses `db` after this.
    unsafe { ffi::sqlite3_close(db) };
}

/// A transaction dropped with its walls up drains (the eighth read of this
/// round, issue 23): its ROLLBACK runs, and a guest statement that had not
/// started yet is refused when SQLite prepares it, instead of running with
/// no walls at all.
#[test]
fn a_draining_connection_runs_only_its_rollback() {
    let walls = ConnectionWalls::default();
    walls.enter(
        Arc::new(policy(Scope::Guest)),
        Instant::now() + std::time::Duration::from_secs(60),
    );
    walls.drain();
    assert!(
        walls.is_up() && walls.past_deadline(),
        "up, and past its deadline"
    );
    assert_eq!(
        walls.decide(ffi::SQLITE_TRANSACTION, Some("ROLLBACK"), None),
        ffi::SQLITE_OK
    );
    assert_eq!(
        walls.decide(ffi::SQLITE_SAVEPOINT, Some("ROLLBACK"), Some("_sqlx_savepoint_1")),
        ffi::SQLITE_OK
    );
    for (action, arg1) in [
        (ffi::SQLITE_SELECT, None),
        (ffi::SQLITE_READ, Some("invoices")),
        (ffi::SQLITE_INSERT, Some("invoices")),
        (ffi::SQLITE_TRANSACTION, Some("COMMIT")),
        (ffi::SQLITE_SAVEPOINT, Some("RELEASE")),
    ] {
        assert_eq!(
            walls.decide(action, arg1, None),
            ffi::SQLITE_DENY,
            "{action} {arg1:?}"
        );
    }
    walls.leave();
    assert!(!walls.is_up());
    assert_eq!(
        walls.decide(ffi::SQLITE_READ, Some("inbox"), None),
        ffi::SQLITE_OK
    );
}
