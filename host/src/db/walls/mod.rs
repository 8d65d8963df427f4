//! A handler's walls on an open transaction: what its SQL may touch, as whom,
//! and for how long each statement may run.
//!
//! PostgreSQL: the transaction's session is logged in as the handler's own
//! role (see `db::logins`: it owns only the handler's schema, has no
//! privilege on the host's tables and is a member of nothing), so the role is
//! not a wall that goes up and down here; what does is its schema first on
//! the search path with `pg_catalog` and then `pg_temp` after it (a temporary
//! table can never shadow a name), and `statement_timeout`, all `LOCAL` to
//! the transaction. SQLite: the allowlist authorizer and the progress-handler
//! deadline of `sandbox::authorizer`. The statement guard refuses every
//! statement that would change these (SET, RESET, DO, set_config,
//! transaction control), and even one it missed changes nothing the host
//! relies on: the host writes its tables through the gates, with its key.
//! Leaving the walls is the host's own statement, sent only after the
//! guest's call has returned.
//!
//! [`Walls`] says what one handler's walls are; beside it are the two
//! switches, [`PG_LEAVE`] and SQLite's [`switch`]. [`state`] puts the walls up
//! and takes them down on a transaction, the only code that does.

mod state;
#[cfg(test)]
mod tests;

pub(super) use state::{Connection, WallState};

use super::{Database, DbError, HANDLER_SEARCH_PATH_TAIL, handler_schema, migrate};
use crate::sandbox::authorizer::{self, ConnectionWalls, Policy, Scope};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The search path of the host's own statements: the host schema, then the
/// catalog, then (explicitly last, so it never shadows a host table)
/// `pg_temp`. Unqualified host SQL is then the same text on both backends.
pub const HOST_SEARCH_PATH: &str = "inboxd,pg_catalog,pg_temp";

/// Leaves a handler's walls on PostgreSQL, back to the host's settings.
/// Sent only by [`state`], alone or composed with the savepoint statement it
/// must come before or after.
///
/// The session belongs to the handler (see `db::logins`), so no role is
/// switched: there is none to switch to. `RESET ALL` sets back, for the rest
/// of the transaction, every setting a guest's SQL could have changed that
/// would change how the host's statements run (the search path, timeouts,
/// `synchronous_commit`, `client_encoding`, the planner's, the logging of
/// parameters) to the session's own values, then the host's search path goes
/// first. Qualified: it runs while the handler's schema may still be first
/// on the path.
const PG_LEAVE: &str =
    "RESET ALL; SELECT pg_catalog.set_config('search_path', 'inboxd,pg_catalog,pg_temp', true)";

/// One handler's walls, built once per loaded version (or per migration statement).
#[derive(Debug, Clone)]
pub struct Walls {
    handler: String,
    policy: Arc<Policy>,
    statement_timeout: Duration,
}

impl Walls {
    /// `own_tables`: the tables the handler's migrations created (SQLite's
    /// allowlist; on PostgreSQL its schema says it). `statement_timeout`:
    /// how long one statement may run before the database cancels it.
    pub fn new(handler: &str, scope: Scope, own_tables: &[String], statement_timeout: Duration) -> Self {
        Self {
            handler: handler.to_owned(),
            policy: Arc::new(Policy::new(scope, own_tables)),
            statement_timeout,
        }
    }

    /// SQLite: the largest string, blob or row the handler's statements may
    /// make (`limits.max_row_bytes`; PostgreSQL holds its tables to it by a
    /// `CHECK`, see `migrate::bound_rows`).
    pub fn with_max_row_bytes(mut self, bytes: usize) -> Self {
        self.policy = Arc::new(Policy::clone(&self.policy).with_max_length(bytes));
        self
    }

    /// A handler's run-time walls, with the tables it owns now.
    pub async fn load(db: &Database, handler: &str, statement_timeout: Duration) -> Result<Self, DbError> {
        let own = migrate::own_tables(db, handler).await?;
        Ok(Self::new(handler, Scope::Guest, &own, statement_timeout))
    }

    pub fn handler(&self) -> &str {
        &self.handler
    }

    pub fn statement_timeout(&self) -> Duration {
        self.statement_timeout
    }

    fn policy(&self) -> Arc<Policy> {
        self.policy.clone()
    }

    /// PostgreSQL: puts the walls up. The names are validated handler names
    /// (`config::is_identifier`), never guest input.
    fn pg_enter(&self) -> String {
        // statement_timeout 0 would mean "no limit": at least 1 ms.
        let ms = self.statement_timeout.as_millis().max(1);
        format!(
            "SELECT pg_catalog.set_config('search_path', '{},{HANDLER_SEARCH_PATH_TAIL}', true), \
             pg_catalog.set_config('statement_timeout', '{ms}', true)",
            handler_schema(&self.handler),
        )
    }
}

/// The one place SQLite's authorizer walls are switched: `Some` puts a
/// handler's policy up with a deadline for its statements, `None` takes them
/// down (the host's own work, unrestricted). A store into the connection's
/// struct, no trip to sqlx's worker; only between statements.
fn switch(connection: &ConnectionWalls, to: Option<(Arc<Policy>, Instant)>) {
    match to {
        Some((policy, deadline)) => connection.enter(policy, deadline),
        None => connection.leave(),
    }
}

/// The SQLite connection's walls, found once per transaction (see
/// `sandbox::authorizer`). Taken down when the transaction drops: it is
/// declared before the sqlx transaction, so a transaction dropped with a
/// handler's walls still up (an error path) takes them down before sqlx rolls
/// it back on the same connection (the authorizer would refuse the ROLLBACK).
#[derive(Default)]
struct SqliteSwitch(Option<&'static ConnectionWalls>);

impl SqliteSwitch {
    /// The connection's walls (one trip to sqlx's worker, once per transaction).
    async fn find<C: state::Connection>(
        &mut self,
        conn: &mut C,
    ) -> Result<&'static ConnectionWalls, DbError> {
        if let Some(walls) = self.0 {
            return Ok(walls);
        }
        let Some(connection) = conn.sqlite() else {
            unreachable!("only SQLite connections have authorizer walls");
        };
        let mut handle = connection.lock_handle().await?;
        let walls = authorizer::walls_of(handle.as_raw_handle().as_ptr()).ok_or_else(|| {
            DbError::Sqlx(sqlx::Error::Protocol(
                "this SQLite connection has no walls installed (it was not opened by Database::connect)"
                    .into(),
            ))
        })?;
        self.0 = Some(walls);
        Ok(walls)
    }

    fn down(&self) {
        if let Some(connection) = self.0 {
            switch(connection, None);
        }
    }
}

impl Drop for SqliteSwitch {
    /// A transaction dropped with a handler's walls up may have its
    /// statement still running on sqlx's worker thread, or queued there (its
    /// future was dropped: a client that went away from a replay or an
    /// upload, a task cancelled): the walls are not taken down but drained
    /// (see [`ConnectionWalls::drain`]) until the connection is back in the
    /// pool. The connection is still this transaction's here (the switch
    /// drops first), so nothing else runs on it.
    fn drop(&mut self) {
        match self.0 {
            Some(connection) if connection.is_up() => connection.drain(),
            _ => self.down(),
        }
    }
}
