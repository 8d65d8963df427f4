//! What SQLite may hold in the host's memory for a handler's statement.
//!
//! SQLite runs inside the host process, so its memory is every team's. Its
//! sorter (ORDER BY, GROUP BY, DISTINCT, a window) spills sorted runs to a
//! temporary file each time its list reaches the connection's cache size,
//! and then, in the one VM step of `OP_SorterSort`, opens a reader on every
//! run and reads each one's first record into a buffer of its own, where the
//! progress handler (the statement's deadline) never runs. At SQLite's
//! default 2 MB a run holds two rows of 1 MiB: 2,000 such rows sorted held
//! 1.93 GB of the host's memory and ran 2 s past the deadline in that step
//! (the nineteenth adversarial read, issue 23, measured again on the bundled
//! SQLite 3.46). With [`CACHE_KIB`] the same sort held 101 MB and its
//! longest step was 0.17 s; a sort as large as a 30 s deadline lets a
//! statement build stays near 200 MB.
//!
//! What a statement holds in registers is bounded by the guard
//! (`sqlite_registers`). What no statement bound foresees is held by a
//! process-wide ceiling ([`bound_heap`]): past it SQLite fails the allocation
//! (`SQLITE_NOMEM`) instead of the kernel ending the host; under a handler's
//! statement that is a limit counted against the event's attempts
//! (`DbError::StatementMemory`), never retried as the database's failure.

use libsqlite3_sys as ffi;
use std::sync::Once;

/// Each connection's page cache, and so the size of the sorter's runs, in
/// KiB (`PRAGMA cache_size` takes a negative number as KiB): 16 MiB, 16
/// rows at the default `max_row_bytes`. Pages are allocated as they are
/// used, so an idle connection holds none of it.
///
/// Both ways from here cost: smaller runs are more of them, each holding one
/// row at the merge (above); a larger run is sorted in one step, and a run
/// of small rows is millions of comparisons (the twenty-second adversarial
/// read, issue 23: a 64 MiB run of rows tied on their first keys took 2 s
/// in that step). With at most `sqlite_sorts::MAX_SORT_KEYS` keys, a 32 MiB
/// run's step took 0.4 s with integer ties and 0.75-0.79 s with empty text
/// or blob ties (the review of that read): 16 MiB halves both.
pub const CACHE_KIB: i64 = 16 * 1024;

/// SQLite's heap may hold at most this much, over every connection of the
/// process: 2 GiB, twice the soft limit below, so the host's own work
/// meets it only when something else has taken the rest.
pub const HARD_HEAP_BYTES: i64 = 2 << 30;

/// Above this, SQLite gives back cached pages before it allocates more (the
/// default eight connections' full caches are half of it).
pub const SOFT_HEAP_BYTES: i64 = 1 << 30;

/// The `cache_size` pragma's value for [`CACHE_KIB`].
pub fn cache_size_pragma() -> String {
    format!("-{CACHE_KIB}")
}

/// Sets the process-wide ceilings on SQLite's heap, once.
pub fn bound_heap() {
    static BOUND: Once = Once::new();
    BOUND.call_once(|| {
        // SAFETY: both only set a process-wide limit; any thread may call them.
        unsafe {
            ffi::sqlite3_hard_heap_limit64(HARD_HEAP_BYTES);
            ffi::sqlite3_soft_heap_limit64(SOFT_HEAP_BYTES);
        }
    });
}

/// The hard ceiling in force (for tests and the operator's view).
pub fn hard_heap_limit() -> i64 {
    // SAFETY: a negative argument only reads the limit.
    unsafe { ffi::sqlite3_hard_heap_limit64(-1) }
}
