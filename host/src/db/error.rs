//! The database's failures, and which of them end.
//!
//! The host retries what the database may get over by itself (a broken
//! connection, a serialization failure, a lock, a full disk: an outage that
//! every event waits out) and ends what it will refuse every time (a
//! constraint, a row it cannot read, a defect of the host's own SQL). The
//! pipeline parks an event whose own transaction keeps failing the second
//! way as `host-error`, so one row the host cannot write never wedges its
//! partition ([`DbError::is_transient`]).

use super::value::DecodeError;
use sqlx::error::DatabaseError;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
    #[error("{0}")]
    Decode(#[from] DecodeError),
    #[error("migrating the host tables failed: {0}")]
    HostMigration(#[from] sqlx::migrate::MigrateError),
    #[error("{0}")]
    HandlerMigration(String),
    #[error("limits.max_rows: the query returned more than {limit} rows")]
    TooManyRows { limit: usize },
    #[error("limits.max_result_bytes: the query returned more than {limit} bytes")]
    ResultTooLarge { limit: usize },
    /// SQLite rolled the transaction back under a guest's statement and a new
    /// one could not begin: the connection is of no further use to the event.
    #[error("the transaction was lost and a new one could not begin")]
    TransactionLost,
    /// The database stopped a handler's statement at its walls' deadline.
    #[error("the statement was still running at its deadline and was cancelled")]
    StatementTimeout,
    /// SQLite's heap, shared by every handler in the process, reached its
    /// ceiling under a handler's statement (see `sandbox::sqlite_memory`).
    #[error(
        "the statement ran out of SQLite's memory, which every handler of this host shares \
         ({limit_mib} MiB in all)"
    )]
    StatementMemory { limit_mib: i64 },
    /// SQLite ran out of disk for a handler's statement's temporary files
    /// (a sort or an index spilled past the free space of its directory)
    /// while the database's own disk has room.
    #[error(
        "the statement filled the disk with SQLite's temporary files (a sort or an index larger than \
         the space left for them): sort or read less at once"
    )]
    StatementSpill,
    /// Only ever seen by a handler run that the pipeline then discards
    /// (see `Tx::set_statement_savepoints`), or after the database rolled
    /// the transaction back under an earlier statement (`Tx::is_lost`).
    #[error("an earlier statement of this call failed, so this one was not run")]
    AfterFailedStatement,
    /// A defect of the host: a handler's SQL about to run on a PostgreSQL
    /// session that is not logged in as the handler (see `Database::begin_guest`).
    #[error(
        "handler {handler}'s SQL may only run on a session of its own login; refused to run it on the host's"
    )]
    NotHandlerSession { handler: String },
    /// Plain INSERTs a batch's shared call held back failed when sent
    /// (`Tx`'s deferred rows): the pipeline runs the batch again call by
    /// call, where the failure reaches its own event.
    #[error("a handler's held-back INSERTs failed when sent: {0}")]
    DeferredFailed(String),
    /// Every slot of the host's Wasm instance pool stayed in use while the
    /// event's call waited for one (see `wasm::warm`): the host's resource,
    /// not the event's fault, so the work is retried as an outage is.
    #[error(
        "every Wasm instance of the host was in use (waited {waited:?}): the event is retried, not \
         counted against its attempts"
    )]
    NoWasmInstance { waited: std::time::Duration },
    /// PostgreSQL did not answer one round trip in time: the server or the
    /// network is gone (see `Tx`'s round-trip bound). The connection is
    /// dropped with the transaction, and the work retried as an outage.
    #[error("PostgreSQL did not answer within {waited:?}: the connection is given up and the work retried")]
    NoAnswer { waited: std::time::Duration },
}

impl DbError {
    /// True when retrying later may succeed, and the failure is not the
    /// event's: the connection, the server or its resources failed, another
    /// transaction was in the way, or the host's statements and the schema
    /// disagree (an operator's change that every event meets alike, which
    /// parking them all would not mend). False for an error the same
    /// statement on the same row will meet again (a constraint, a bad value,
    /// a row that cannot be read): the pipeline parks that event instead of
    /// waiting on it forever.
    pub fn is_transient(&self) -> bool {
        match self {
            DbError::Sqlx(sqlx::Error::Database(db)) => transient_database_error(db.as_ref()),
            // A reply out of step with the protocol: the connection is not to be trusted.
            DbError::Sqlx(sqlx::Error::Protocol(_)) => true,
            DbError::NoWasmInstance { .. } => true,
            _ => self.is_connection_failure(),
        }
    }

    /// True when the database itself failed (the connection broke, the
    /// server shuts down, the pool is gone): nothing a statement's text or
    /// parameters can cause. Only these are the host's to retry when they
    /// happen under a guest's statement; every other error there is the
    /// guest's, counted against its attempts.
    pub fn is_connection_failure(&self) -> bool {
        match self {
            DbError::TransactionLost | DbError::NoAnswer { .. } => true,
            // A host migration's statement that failed on the connection.
            DbError::HostMigration(sqlx::migrate::MigrateError::Execute(e)) | DbError::Sqlx(e) => {
                connection_failure(e)
            }
            _ => false,
        }
    }
}

/// See [`DbError::is_connection_failure`].
fn connection_failure(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            // PostgreSQL class 08 (connection) and 57P (shutdown, crash).
            code.starts_with("08") || code.starts_with("57P")
        }
        _ => false,
    }
}

/// Whether an error the server reported is one it may get over by itself.
fn transient_database_error(db: &dyn DatabaseError) -> bool {
    let code = db.code().unwrap_or_default();
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // SQLite's extended result code; its low byte is the primary code.
        let primary = code.parse::<i32>().unwrap_or_default() & 0xff;
        // ERROR (the SQL and the schema disagree: a table or function gone),
        // BUSY, LOCKED, NOMEM, READONLY (the file or its mount), IOERR,
        // FULL (the disk), CANTOPEN, PROTOCOL (a lock race), AUTH.
        return matches!(primary, 1 | 5 | 6 | 7 | 8 | 10 | 13 | 14 | 15 | 23);
    }
    // PostgreSQL's SQLSTATE: 08 connection, 28 the login refused, 3D the
    // database gone, 40 serialization and deadlocks, 42 the host's SQL and
    // the schema disagree (a grant revoked, a table dropped), 53 resources
    // (disk full, out of memory, too many connections), 57 operator
    // intervention (a cancel, a shutdown), 58 the server's own I/O; 55P03 a
    // lock not available in time; 25006 a read-only transaction (connected
    // to a standby after a failover). What is left is about the row: 22 a
    // value, 23 a constraint, P0 a trigger's exception, XX corruption.
    ["08", "28", "3D", "40", "42", "53", "57", "58"]
        .iter()
        .any(|class| code.starts_with(class))
        || matches!(code.as_ref(), "55P03" | "25006")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlx(error: sqlx::Error) -> DbError {
        DbError::Sqlx(error)
    }

    #[test]
    fn the_host_waits_out_what_the_database_gets_over_and_ends_the_rest() {
        let io = || sqlx(sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()));
        assert!(io().is_transient());
        assert!(sqlx(sqlx::Error::PoolTimedOut).is_transient());
        assert!(DbError::TransactionLost.is_transient());
        assert!(!sqlx(sqlx::Error::RowNotFound).is_transient());
        assert!(!DbError::HandlerMigration("bad".into()).is_transient());
        let unreadable = DecodeError::Column {
            what: "dead_letters row",
            column: "attempts",
            expected: "an integer",
            found: "text".into(),
        };
        assert!(!DbError::Decode(unreadable).is_transient());
    }

    /// What the servers themselves say: a constraint is the row's, a table
    /// that is gone is every event's.
    #[tokio::test]
    async fn a_constraint_is_permanent_and_a_missing_table_transient_on_both_backends() {
        for db in crate::db::test_support::each_backend().await {
            let on = db.backend();
            let mut tx = db.begin().await.unwrap();
            let gone = tx.query("SELECT * FROM no_such_table", &[]).await.unwrap_err();
            assert!(gone.is_transient(), "{on:?}: {gone}");
            drop(tx);
            let mut tx = db.begin().await.unwrap();
            let refused = tx
                .execute("INSERT INTO offsets (handler) VALUES ('h')", &[])
                .await
                .unwrap_err();
            assert!(!refused.is_transient(), "{on:?}: {refused}");
        }
    }
}
