//! SQLite's second wall: an authorizer callback on the connection while a
//! handler's SQL runs (its statements, and its migrations).
//!
//! SQLite calls it while preparing each statement, including the code of any
//! trigger the statement would fire, so a trigger a migration planted on the
//! handler's own table cannot reach the host's tables either. Guest statements
//! are prepared fresh (never from the statement cache) so it sees every one.

use super::HOST_TABLES;
use libsqlite3_sys as ffi;
use std::ffi::{CStr, c_char, c_int, c_void};

/// What the handler's SQL is allowed to be while the authorizer is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// At run time: reads and writes of non-host tables only.
    Guest,
    /// While the handler's migrations run: DDL too, still never on host tables.
    Migration,
}

// Distinct addresses to pass as the callback's user data.
static GUEST: u8 = 0;
static MIGRATION: u8 = 1;

/// Functions that reach outside the database.
const DENIED_FUNCTIONS: &[&str] = &[
    "load_extension",
    "readfile",
    "writefile",
    "edit",
    "fts3_tokenizer",
];

fn text<'a>(ptr: *const c_char) -> Option<&'a str> {
    // SAFETY: SQLite passes NUL-terminated strings (or NULL) valid for the callback.
    (!ptr.is_null()).then(|| unsafe { CStr::from_ptr(ptr) }.to_str().unwrap_or(""))
}

fn is_host_table(name: Option<&str>) -> bool {
    name.is_some_and(|n| HOST_TABLES.iter().any(|h| h.eq_ignore_ascii_case(n)))
}

fn is_catalog(name: Option<&str>) -> bool {
    name.is_some_and(|n| n.to_ascii_lowercase().starts_with("sqlite_"))
}

/// The decision, separated from the FFI so it can be tested directly.
fn decide(scope: Scope, action: c_int, arg1: Option<&str>, arg2: Option<&str>) -> c_int {
    let allow = |ok: bool| if ok { ffi::SQLITE_OK } else { ffi::SQLITE_DENY };
    match action {
        ffi::SQLITE_READ | ffi::SQLITE_UPDATE => allow(!is_host_table(arg1)),
        ffi::SQLITE_INSERT | ffi::SQLITE_DELETE => {
            allow(!is_host_table(arg1) && (scope == Scope::Migration || !is_catalog(arg1)))
        }
        ffi::SQLITE_SELECT | ffi::SQLITE_RECURSIVE => ffi::SQLITE_OK,
        ffi::SQLITE_FUNCTION => {
            allow(!arg2.is_some_and(|f| DENIED_FUNCTIONS.iter().any(|d| d.eq_ignore_ascii_case(f))))
        }
        ffi::SQLITE_CREATE_TABLE
        | ffi::SQLITE_CREATE_VIEW
        | ffi::SQLITE_DROP_TABLE
        | ffi::SQLITE_DROP_VIEW
        | ffi::SQLITE_ALTER_TABLE => {
            allow(scope == Scope::Migration && !is_host_table(arg1) && !is_host_table(arg2))
        }
        // Index and trigger actions name the table in the second argument.
        ffi::SQLITE_CREATE_INDEX
        | ffi::SQLITE_DROP_INDEX
        | ffi::SQLITE_CREATE_TRIGGER
        | ffi::SQLITE_DROP_TRIGGER => allow(scope == Scope::Migration && !is_host_table(arg2)),
        // Transactions, savepoints, ATTACH/DETACH, PRAGMA, temp objects,
        // virtual tables, ANALYZE, REINDEX, and anything newer: never.
        _ => ffi::SQLITE_DENY,
    }
}

unsafe extern "C" fn authorize(
    user: *mut c_void,
    action: c_int,
    arg1: *const c_char,
    arg2: *const c_char,
    _database: *const c_char,
    _trigger: *const c_char,
) -> c_int {
    let scope = if std::ptr::eq(user as *const u8, &MIGRATION) {
        Scope::Migration
    } else {
        Scope::Guest
    };
    decide(scope, action, text(arg1), text(arg2))
}

/// Installs (`Some`) or removes (`None`) the authorizer on a connection.
///
/// # Safety
/// `db` must be a valid, open SQLite connection handle, used by no other thread meanwhile.
pub unsafe fn set(db: *mut ffi::sqlite3, scope: Option<Scope>) {
    let user = match scope {
        Some(Scope::Guest) => &GUEST as *const u8 as *mut c_void,
        Some(Scope::Migration) => &MIGRATION as *const u8 as *mut c_void,
        None => std::ptr::null_mut(),
    };
    // SAFETY: the caller guarantees `db`; the callback and user data are 'static.
    unsafe { ffi::sqlite3_set_authorizer(db, scope.map(|_| authorize as _), user) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_tables_are_denied_in_every_scope() {
        for scope in [Scope::Guest, Scope::Migration] {
            for action in [
                ffi::SQLITE_READ,
                ffi::SQLITE_UPDATE,
                ffi::SQLITE_INSERT,
                ffi::SQLITE_DELETE,
            ] {
                assert_eq!(decide(scope, action, Some("INBOX"), None), ffi::SQLITE_DENY);
                assert_eq!(decide(scope, action, Some("offsets"), None), ffi::SQLITE_DENY);
                assert_eq!(decide(scope, action, Some("invoices"), None), ffi::SQLITE_OK);
            }
            assert_eq!(
                decide(scope, ffi::SQLITE_CREATE_TRIGGER, Some("t"), Some("inbox")),
                ffi::SQLITE_DENY
            );
            assert_eq!(
                decide(scope, ffi::SQLITE_ATTACH, Some("/tmp/x"), None),
                ffi::SQLITE_DENY
            );
            assert_eq!(
                decide(scope, ffi::SQLITE_PRAGMA, Some("writable_schema"), None),
                ffi::SQLITE_DENY
            );
            assert_eq!(
                decide(scope, ffi::SQLITE_TRANSACTION, Some("BEGIN"), None),
                ffi::SQLITE_DENY
            );
            assert_eq!(
                decide(scope, ffi::SQLITE_FUNCTION, None, Some("load_extension")),
                ffi::SQLITE_DENY
            );
        }
    }

    #[test]
    fn ddl_only_in_migrations() {
        assert_eq!(
            decide(Scope::Guest, ffi::SQLITE_CREATE_TABLE, Some("t"), None),
            ffi::SQLITE_DENY
        );
        assert_eq!(
            decide(Scope::Migration, ffi::SQLITE_CREATE_TABLE, Some("t"), None),
            ffi::SQLITE_OK
        );
        assert_eq!(
            decide(Scope::Guest, ffi::SQLITE_INSERT, Some("sqlite_master"), None),
            ffi::SQLITE_DENY
        );
        assert_eq!(
            decide(Scope::Migration, ffi::SQLITE_INSERT, Some("sqlite_master"), None),
            ffi::SQLITE_OK
        );
    }
}
