//! The pipeline's middle tier of tests: its batch paths on a real database
//! (SQLite always, PostgreSQL when `INBOXD_TEST_POSTGRES` is set), driven
//! through the `Handler` seam by a [`scripted::Scripted`] native handler, so
//! they run in seconds without Kafka, Wasm or a child process.
//!
//! Each test asserts what a user would check: the rows in the handler's own
//! table, inbox statuses, the stored offset, dead letters and their kinds,
//! the outbox, and how often the handler ran. Everything runs synchronously:
//! nothing here polls or sleeps (a retry's backoff is configured to 1 ms).

mod batches;
mod dedup;
mod guards;
mod harness;
mod host_errors;
mod keyed;
mod scripted;

use super::backoff;
use crate::config::RetryConfig;

/// Found building this tier: on SQLite a handler's migration cannot give a
/// table a unique key, neither `k TEXT PRIMARY KEY` (its index is named
/// `sqlite_autoindex_*`, a reserved name) nor `CREATE UNIQUE INDEX`: the
/// migration walls refuse both ("not authorized").
#[test]
fn backoff_grows_and_is_capped() {
    let retry = RetryConfig {
        max_attempts: 10,
        backoff_initial_ms: 100,
        backoff_max_ms: 1_000,
    };
    for _ in 0..50 {
        let first = backoff(&retry, 1).as_millis();
        assert!((50..=100).contains(&first), "{first}");
        let third = backoff(&retry, 3).as_millis();
        assert!((200..=400).contains(&third), "{third}");
        let late = backoff(&retry, 30).as_millis();
        assert!((500..=1_000).contains(&late), "{late}");
    }
}
