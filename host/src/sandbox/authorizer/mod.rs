//! SQLite's second wall: an allowlist authorizer, and a deadline for every
//! statement a handler sends.
//!
//! SQLite has one namespace for every table, so the wall is a list of what the
//! handler *may* touch (its own tables, as its migrations created them), never
//! a list of what it may not: a host table added tomorrow is covered without
//! anyone remembering to. SQLite asks the authorizer while it prepares each
//! statement, including the code of any trigger or view the statement would
//! run, so nothing a statement reaches escapes the list.
//!
//! Both hooks are installed once per connection ([`install`]) and consult the
//! connection's [`ConnectionWalls`]: with no [`Policy`] set (the host's own
//! work) everything is allowed and no deadline runs; while a handler's SQL
//! runs, its policy decides and the progress handler interrupts a statement
//! that is still running at the deadline. Switching the walls is a store into
//! that struct, not a call into SQLite, so it costs no trip to sqlx's worker
//! thread; the struct is leaked (a few bytes per connection ever opened) so the
//! pointer SQLite holds can never dangle.

use super::guard::Ctes;
use super::{PURE_FUNCTIONS, TABLE_FUNCTIONS, is_reserved};
use libsqlite3_sys as ffi;
use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// What the handler's SQL is allowed to be while its walls are up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// At run time: reads and writes of the handler's own tables only.
    Guest,
    /// While one of the handler's migration statements runs: also creating
    /// tables, views and indexes, and altering or dropping its own.
    Migration,
    /// The transaction was dropped with a handler's walls up (see
    /// [`ConnectionWalls::drain`]): only its ROLLBACK may run.
    Draining,
}

/// SQLite implements these operators as functions and asks the authorizer
/// about them by these names (`x LIKE y` is `like(y, x)`).
///
/// Not `like` and `glob`: one call's time grows with both lengths inside one
/// VM step, which the deadline's progress handler never interrupts (the
/// guard refuses LIKE and GLOB; this is the second wall). Nor `->` and `->>`,
/// SQLite's JSON reads, refused with every JSON function (see
/// [`is_json_function`]).
const OPERATOR_FUNCTIONS: &[&str] = &["current_timestamp", "current_date", "current_time"];

/// SQLite's JSON functions (and table functions): the guard refuses them on
/// SQLite (`walk::SQLITE_JSON_REFUSED`: a BLOB argument is read as JSONB,
/// whose nesting SQLite walks by unbounded recursion); this is the second wall.
fn is_json_function(name: &str) -> bool {
    name.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("json"))
}

/// The functions SQLite's own ALTER TABLE code calls while it rewrites the
/// schema (its nested statements pass the authorizer too). A migration's own
/// statements cannot name them: the migration guard allows only pure functions.
const ALTER_FUNCTIONS: &[&str] = &[
    "like",
    "printf",
    "sqlite_rename_column",
    "sqlite_rename_table",
    "sqlite_rename_test",
    "sqlite_rename_quotefix",
    "sqlite_drop_column",
];

/// SQLITE_LIMIT_COLUMN inside the walls: the most columns a result row, a
/// table, an index, an ORDER BY or a GROUP BY may have. Each value is held
/// to `limits.max_row_bytes` by SQLITE_LIMIT_LENGTH, but a row is not, and
/// the host copies every value of a returned row (sqlx duplicates it, then
/// the host decodes it) before it can compare the row with
/// `limits.max_result_bytes`: `SELECT $1, $1, ...` 2,000 times over a 1 MiB
/// parameter took SQLite 6 ms and would have been 4 GB of host memory, after
/// the last deadline check (the fourteenth adversarial read, issue 23). As
/// many as PostgreSQL's row cap (`work::VALUE_ROWS` rows at the bound).
pub const MAX_COLUMNS: c_int = crate::sandbox::work::VALUE_ROWS as c_int;

/// One handler's allowlist.
#[derive(Debug, Clone)]
pub struct Policy {
    scope: Scope,
    /// Lower-case names of the handler's own tables and views.
    own: HashSet<String>,
    /// SQLITE_LIMIT_LENGTH inside the walls: `limits.max_row_bytes`.
    max_length: c_int,
}

impl Policy {
    pub fn new(scope: Scope, own_tables: &[String]) -> Self {
        Self {
            scope,
            own: own_tables.iter().map(|t| t.to_ascii_lowercase()).collect(),
            max_length: crate::config::defaults::MAX_ROW_BYTES as c_int,
        }
    }

    /// The largest string, blob or row the handler's statements may make.
    pub fn with_max_length(mut self, bytes: usize) -> Self {
        self.max_length = c_int::try_from(bytes).unwrap_or(c_int::MAX);
        self
    }

    fn owns(&self, table: Option<&str>) -> bool {
        table.is_some_and(|t| self.own.contains(&t.to_ascii_lowercase()))
    }

    /// The decision, apart from the FFI so it can be tested directly.
    /// `ctes`: the CTE names of the statement being prepared, which SQLite
    /// reports as reads of that name with an empty column (a real table's
    /// reads name their columns, except a bare `count(*)`, which is why the
    /// names come from the statement guard rather than being let through).
    pub fn decide(&self, action: c_int, arg1: Option<&str>, arg2: Option<&str>, ctes: &[String]) -> c_int {
        let allow = |ok: bool| if ok { ffi::SQLITE_OK } else { ffi::SQLITE_DENY };
        if self.scope == Scope::Draining {
            // sqlx ends a dropped transaction with `ROLLBACK` (or `ROLLBACK
            // TO SAVEPOINT` if nested).
            return allow(
                matches!(action, ffi::SQLITE_TRANSACTION | ffi::SQLITE_SAVEPOINT) && arg1 == Some("ROLLBACK"),
            );
        }
        let migrating = self.scope == Scope::Migration;
        match action {
            // ALTER TABLE ... RENAME renames the table's AUTOINCREMENT counter
            // (only the name column; a migration's own statements cannot name
            // sqlite_sequence, the migration guard keeps `sqlite_` names).
            ffi::SQLITE_READ | ffi::SQLITE_UPDATE
                if migrating
                    && arg2 == Some("name")
                    && arg1.is_some_and(|t| t.eq_ignore_ascii_case("sqlite_sequence")) =>
            {
                ffi::SQLITE_OK
            }
            ffi::SQLITE_SELECT | ffi::SQLITE_RECURSIVE => ffi::SQLITE_OK,
            // arg1: the table, arg2: the column.
            // Table-valued functions (json_each, generate_series) are read like tables.
            // DDL reads the schema table (its own statements are judged by their action).
            ffi::SQLITE_READ => allow(
                self.owns(arg1)
                    || is_table_function(arg1)
                    || (migrating && is_schema_table(arg1))
                    // A CTE's rows are read under its name with no column;
                    // never a host table's name (the guard refuses such CTE
                    // names too: the twenty-second read found the two
                    // scopings of CTE names could differ).
                    || (arg2 == Some("")
                        && arg1.is_some_and(|t| !is_reserved(t) && ctes.iter().any(|c| c.eq_ignore_ascii_case(t)))),
            ),
            // A DELETE of an own table goes ahead row by row: SQLITE_IGNORE
            // on SQLITE_DELETE turns off only SQLite's truncate optimisation,
            // which empties a table without WHERE in one VM step that the
            // deadline never interrupts (0.94 s for 300 MB and growing with
            // the table: the sixth read of this round, issue 23).
            ffi::SQLITE_DELETE if self.owns(arg1) => ffi::SQLITE_IGNORE,
            // DDL writes the schema table; the DDL action itself is judged on its own.
            ffi::SQLITE_INSERT | ffi::SQLITE_UPDATE | ffi::SQLITE_DELETE => {
                allow(self.owns(arg1) || (migrating && is_schema_table(arg1)))
            }
            ffi::SQLITE_FUNCTION => allow(arg2.is_some_and(|f| {
                let f = f.to_ascii_lowercase();
                !is_json_function(&f) && PURE_FUNCTIONS.contains(&f.as_str())
                    || OPERATOR_FUNCTIONS.contains(&f.as_str())
                    || (migrating && ALTER_FUNCTIONS.contains(&f.as_str()))
            })),
            // arg1: the new table or view.
            ffi::SQLITE_CREATE_TABLE | ffi::SQLITE_CREATE_VIEW => {
                allow(migrating && arg1.is_some_and(|t| !is_reserved(t) && !is_table_function(Some(t))))
            }
            ffi::SQLITE_DROP_TABLE | ffi::SQLITE_DROP_VIEW => allow(migrating && self.owns(arg1)),
            // arg1: the index, arg2: its table.
            ffi::SQLITE_CREATE_INDEX | ffi::SQLITE_DROP_INDEX => {
                allow(migrating && self.owns(arg2) && arg1.is_some_and(|i| !is_reserved(i)))
            }
            // arg1: the database, arg2: the table.
            ffi::SQLITE_ALTER_TABLE => allow(migrating && self.owns(arg2)),
            // Triggers, temporary objects, virtual tables, transactions and
            // savepoints, ATTACH/DETACH, PRAGMA, ANALYZE, REINDEX, and
            // anything a later SQLite adds: never.
            _ => ffi::SQLITE_DENY,
        }
    }
}

fn is_table_function(name: Option<&str>) -> bool {
    name.is_some_and(|n| !is_json_function(n) && TABLE_FUNCTIONS.iter().any(|f| f.eq_ignore_ascii_case(n)))
}

fn is_schema_table(table: Option<&str>) -> bool {
    // ALTER TABLE ... RENAME also rewrites the temp schema's references.
    const SCHEMA_TABLES: &[&str] = &[
        "sqlite_master",
        "sqlite_schema",
        "sqlite_temp_master",
        "sqlite_temp_schema",
    ];
    table.is_some_and(|t| SCHEMA_TABLES.iter().any(|s| s.eq_ignore_ascii_case(t)))
}

/// The walls of one connection: whose policy applies now, and until when a
/// statement may run.
/// See [`ConnectionWalls::decide`].
#[derive(Debug, Default)]
struct Creating {
    table: Option<String>,
    index: Option<String>,
    /// The table or view a DROP was allowed for: SQLite then asks for a
    /// DELETE of it, which must be OK (SQLITE_IGNORE there cancels the DROP
    /// without a word).
    dropping: Option<String>,
}

#[derive(Debug, Default)]
pub struct ConnectionWalls {
    /// The connection's handle, for the length limit and the transaction check.
    db: usize,
    /// SQLITE_LIMIT_LENGTH outside the walls (the host stores components of
    /// up to `admin.max_component_mb`), restored when they come down.
    host_max_length: c_int,
    /// SQLITE_LIMIT_COLUMN outside the walls, restored when they come down.
    host_max_columns: c_int,
    policy: Mutex<Option<Arc<Policy>>>,
    /// The CTE names of the statement about to run (see [`Policy::decide`]).
    ctes: Mutex<Ctes>,
    /// What a migration's statement is making right now, once its creation
    /// was allowed (see [`ConnectionWalls::decide`]); cleared when the walls
    /// go up or down, so it lives for that one statement.
    creating: Mutex<Creating>,
    /// Nanoseconds since [`clock`]'s origin; 0: no deadline.
    deadline: AtomicU64,
    /// Set when the progress handler stopped a statement at the deadline.
    interrupted: AtomicBool,
}

impl ConnectionWalls {
    /// Puts a handler's walls up until [`ConnectionWalls::leave`].
    pub fn enter(&self, policy: Arc<Policy>, deadline: Instant) {
        self.set_limits(policy.max_length, MAX_COLUMNS);
        *self.policy.lock().unwrap_or_else(|p| p.into_inner()) = Some(policy);
        *self.creating.lock().unwrap_or_else(|p| p.into_inner()) = Creating::default();
        self.interrupted.store(false, Ordering::Relaxed);
        self.deadline.store(nanos(deadline).max(1), Ordering::Relaxed);
    }

    /// The CTE names the statement guard found in the next statement.
    pub fn set_ctes(&self, ctes: Ctes) {
        *self.ctes.lock().unwrap_or_else(|p| p.into_inner()) = ctes;
    }

    /// Stops the connection's running statement at SQLite's next check
    /// (`sqlite3_interrupt`, safe from any thread; a no-op when none runs).
    pub fn interrupt(&self) {
        if self.db != 0 {
            // SAFETY: `db` is the open connection `install` was given, and
            // a connection's walls live as long as the process.
            unsafe { ffi::sqlite3_interrupt(self.db as *mut ffi::sqlite3) };
        }
    }

    /// The transaction was dropped with a handler's walls up, maybe with its
    /// statement still running on sqlx's worker thread or queued there (a
    /// replay or upload whose client went away): the statement is
    /// interrupted, and until the connection comes back to the pool (see
    /// `db::sqlite_settled`, which takes the walls down after a trip through
    /// the worker) only a ROLLBACK may run and every statement is past its
    /// deadline. Taking the walls down here let a running statement go on
    /// with no deadline, holding the write lock until a restart (the seventh
    /// read of this round, issue 23), and a statement not yet started run
    /// with no authorizer at all (SQLite forgets an interrupt that comes
    /// before a statement starts: the eighth read).
    pub fn drain(&self) {
        *self.policy.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Arc::new(Policy::new(Scope::Draining, &[])));
        self.deadline.store(1, Ordering::Relaxed);
        self.interrupt();
    }

    /// Whether a handler's walls are up.
    pub fn is_up(&self) -> bool {
        self.policy.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Takes the walls down: the host's own statements run unrestricted.
    pub fn leave(&self) {
        self.set_ctes(Ctes::from([]));
        self.set_limits(self.host_max_length, self.host_max_columns);
        self.deadline.store(0, Ordering::Relaxed);
        *self.policy.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.creating.lock().unwrap_or_else(|p| p.into_inner()) = Creating::default();
    }

    /// Only between statements, by the transaction that owns the connection:
    /// sqlx's worker thread is idle then, and its next command is ordered after this.
    fn set_limits(&self, length: c_int, columns: c_int) {
        if self.db != 0 {
            let db = self.db as *mut ffi::sqlite3;
            // SAFETY: `db` is the open connection `install` was given (a
            // connection's walls live as long as the process); the limits are
            // plain settings read when the next statement is prepared or runs.
            unsafe {
                ffi::sqlite3_limit(db, ffi::SQLITE_LIMIT_LENGTH, length);
                ffi::sqlite3_limit(db, ffi::SQLITE_LIMIT_COLUMN, columns);
            }
        }
    }

    /// False once SQLite has rolled the whole transaction back by itself:
    /// it does so when a *writing* statement is interrupted (here, at the
    /// deadline), whatever savepoints were open.
    pub fn in_transaction(&self) -> bool {
        // SAFETY: as in `set_limits`; reading the autocommit flag.
        self.db == 0 || unsafe { ffi::sqlite3_get_autocommit(self.db as *mut ffi::sqlite3) } == 0
    }

    /// Whether the filesystem of the connection's main database has at least
    /// `bytes` free (true for one in memory, or one it cannot look at). A
    /// statement that failed with `SQLITE_FULL` while the database's own disk
    /// has room filled the disk with its own temporary files (a sort's or an
    /// index's spill), which SQLite deletes when it fails.
    pub fn database_has_room(&self, bytes: u64) -> bool {
        if self.db == 0 {
            return true;
        }
        let main = c"main";
        // SAFETY: as in `set_limits`; SQLite returns its own NUL-terminated
        // name (or NULL), valid while the connection is open.
        let name = unsafe { ffi::sqlite3_db_filename(self.db as *mut ffi::sqlite3, main.as_ptr()) };
        let Some(path) = text(name).filter(|p| !p.is_empty()) else {
            return true;
        };
        let dir = std::path::Path::new(path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        let Ok(dir) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
            return true;
        };
        // SAFETY: `statvfs` is plain data, for which all zeroes is a value.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `dir` is NUL-terminated and `stat` is ours to fill.
        if unsafe { libc::statvfs(dir.as_ptr(), &mut stat) } != 0 {
            return true;
        }
        (stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64) >= bytes
    }

    /// True (once) if a statement was interrupted at the deadline since the walls went up.
    pub fn take_interrupted(&self) -> bool {
        self.interrupted.swap(false, Ordering::Relaxed)
    }

    fn decide(&self, action: c_int, arg1: Option<&str>, arg2: Option<&str>) -> c_int {
        let Some(policy) = &*self.policy.lock().unwrap_or_else(|p| p.into_inner()) else {
            return ffi::SQLITE_OK;
        };
        let mut creating = self.creating.lock().unwrap_or_else(|p| p.into_inner());
        if policy.scope == Scope::Migration {
            // While its CREATE TABLE runs, SQLite builds the new table's key
            // indexes (`sqlite_autoindex_<table>_<n>`, a name only SQLite may
            // use) and reads its (empty) columns to do so: the table is the
            // handler's from the moment its creation was allowed. A CREATE
            // INDEX fills the new index, which SQLite asks for as a REINDEX of
            // it (a REINDEX statement itself is refused by the migration guard).
            let is = |made: &Option<String>, name: Option<&str>| {
                made.as_deref()
                    .is_some_and(|m| name.is_some_and(|n| n.eq_ignore_ascii_case(m)))
            };
            match action {
                ffi::SQLITE_READ if is(&creating.table, arg1) => return ffi::SQLITE_OK,
                ffi::SQLITE_CREATE_INDEX
                    if is(&creating.table, arg2)
                        && arg1.is_some_and(|i| !is_reserved(i) || i.starts_with("sqlite_autoindex_")) =>
                {
                    return ffi::SQLITE_OK;
                }
                ffi::SQLITE_REINDEX if is(&creating.index, arg1) => return ffi::SQLITE_OK,
                ffi::SQLITE_DELETE if is(&creating.dropping, arg1) => {
                    creating.dropping = None;
                    return ffi::SQLITE_OK;
                }
                _ => {}
            }
        }
        let ctes = self.ctes.lock().unwrap_or_else(|p| p.into_inner());
        let verdict = policy.decide(action, arg1, arg2, &ctes);
        if verdict == ffi::SQLITE_OK {
            match action {
                ffi::SQLITE_CREATE_TABLE => creating.table = arg1.map(str::to_owned),
                ffi::SQLITE_CREATE_INDEX => creating.index = arg1.map(str::to_owned),
                ffi::SQLITE_DROP_TABLE | ffi::SQLITE_DROP_VIEW => creating.dropping = arg1.map(str::to_owned),
                _ => {}
            }
        }
        verdict
    }

    fn past_deadline(&self) -> bool {
        let deadline = self.deadline.load(Ordering::Relaxed);
        if deadline != 0 && nanos(Instant::now()) >= deadline {
            self.interrupted.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }
}

fn clock() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn nanos(at: Instant) -> u64 {
    at.saturating_duration_since(clock()).as_nanos() as u64
}

/// Virtual-machine steps between two looks at the clock. Most steps take
/// nanoseconds, but one function call over a value at the policy's
/// `max_length` (`limits.max_row_bytes`; SQLite's own default is 1 GB, and
/// doubling a string in a recursive CTE reached gigabytes of host memory in a
/// few hundred steps) is one step of tens of milliseconds, and a row can hold thousands of
/// them (an adversarial read, issue 23: at 10,000 steps a statement could
/// overrun its deadline by minutes; at 100, 50 calls of `json_extract` with
/// 126 paths over a 1.5 MB document, a second). A look is an atomic load and
/// a vDSO clock read, a few nanoseconds against the tens a step takes.
const PROGRESS_STEPS: c_int = 10;

/// `SQLITE_QueryFlattener | SQLITE_FlttnUnionAll` (sqlite3.c's optimization
/// bits, stable since 3.x), the optimizations [`install`] turns off.
const UNFLATTENED: c_int = 0x0000_0001 | 0x0080_0000;

fn text<'a>(ptr: *const c_char) -> Option<&'a str> {
    // SAFETY: SQLite passes NUL-terminated strings (or NULL) valid for the callback.
    (!ptr.is_null()).then(|| unsafe { CStr::from_ptr(ptr) }.to_str().unwrap_or(""))
}

unsafe extern "C" fn authorize(
    user: *mut c_void,
    action: c_int,
    arg1: *const c_char,
    arg2: *const c_char,
    _database: *const c_char,
    _trigger: *const c_char,
) -> c_int {
    // SAFETY: `user` is the leaked `ConnectionWalls` given in `install`.
    let walls = unsafe { &*(user as *const ConnectionWalls) };
    walls.decide(action, text(arg1), text(arg2))
}

unsafe extern "C" fn progress(user: *mut c_void) -> c_int {
    // SAFETY: as in `authorize`.
    let walls = unsafe { &*(user as *const ConnectionWalls) };
    c_int::from(walls.past_deadline())
}

/// Connections with their walls, by the address of their SQLite handle.
fn registry() -> &'static Mutex<HashMap<usize, &'static ConnectionWalls>> {
    static REGISTRY: OnceLock<Mutex<HashMap<usize, &'static ConnectionWalls>>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

/// Installs the authorizer and the progress handler on a new connection.
///
/// # Safety
/// `db` must be a valid, open SQLite connection handle, used by no other thread meanwhile.
pub unsafe fn install(db: *mut ffi::sqlite3) {
    // SAFETY: the caller guarantees `db`; a negative value only reads the limit.
    let (host_max_length, host_max_columns) = unsafe {
        (
            ffi::sqlite3_limit(db, ffi::SQLITE_LIMIT_LENGTH, -1),
            ffi::sqlite3_limit(db, ffi::SQLITE_LIMIT_COLUMN, -1),
        )
    };
    let walls: &'static ConnectionWalls = Box::leak(Box::new(ConnectionWalls {
        db: db as usize,
        host_max_length,
        host_max_columns,
        ..ConnectionWalls::default()
    }));
    let user = walls as *const ConnectionWalls as *mut c_void;
    // SAFETY: the caller guarantees `db`; the callbacks and user data are 'static.
    unsafe {
        ffi::sqlite3_set_authorizer(db, Some(authorize), user);
        ffi::sqlite3_progress_handler(db, PROGRESS_STEPS, Some(progress), user);
        // The query flattener copies a derived column's expression into
        // every reference to it; nested, a few hundred bytes became millions
        // of calls and gigabytes while preparing, where no progress handler
        // runs (the seventh adversarial read, issue 23). Without it a derived
        // table is computed once per row, as a co-routine.
        ffi::sqlite3_test_control(ffi::SQLITE_TESTCTRL_OPTIMIZATIONS, db, UNFLATTENED);
        // SQLite's double-quoted-string fallback reads `"x"` that names no
        // column as the text 'x', where the guard reads a column: `CREATE
        // INDEX i ON t("no_such_column")` was an index on a constant, and a
        // view's `"x"` a literal (the thirty-third read). Off, `"x"` is a
        // name or an error, as both of the guard's parsers read it. Schemas
        // an older release stored still load (SQLite keeps the fallback
        // while it reads its own schema).
        ffi::sqlite3_db_config(db, ffi::SQLITE_DBCONFIG_DQS_DDL, 0, std::ptr::null_mut::<c_int>());
        ffi::sqlite3_db_config(db, ffi::SQLITE_DBCONFIG_DQS_DML, 0, std::ptr::null_mut::<c_int>());
    }
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(db as usize, walls);
}

/// The walls [`install`] put on this connection.
pub fn walls_of(db: *mut ffi::sqlite3) -> Option<&'static ConnectionWalls> {
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(db as usize))
        .copied()
}

#[cfg(test)]
mod tests;
