//! An open transaction on either backend.
//!
//! The pipeline owns it for the whole claim -> guest -> offset -> commit
//! sequence; while a guest runs, it is moved into the guest's store so the
//! guest's statements land in it and in nothing else.

use super::value::{bind_postgres, bind_sqlite, decode_postgres, decode_sqlite};
use super::{Backend, DbError, HOST_SCHEMA, SqlValue, handler_role, handler_schema};
use crate::sandbox::authorizer::{self, Scope};
use futures_util::TryStreamExt;
use sqlx::{Postgres, Sqlite, Transaction};
use tokio::sync::OwnedSemaphorePermit;

/// Wraps each guest statement on PostgreSQL, where a failed statement would
/// otherwise abort the whole transaction (SQLite undoes just the statement).
const STATEMENT_SAVEPOINT: &str = "inboxd_statement";

/// See [`Tx::exit_guest`].
struct Lingering {
    savepoint: &'static str,
    handler: String,
}

pub struct Tx {
    inner: Inner,
    /// PostgreSQL: wrap each guest statement in a savepoint (the default). Off
    /// for a handler's first run of an event: see [`Tx::set_statement_savepoints`].
    statement_savepoints: bool,
    /// A guest statement failed while `statement_savepoints` was off.
    statement_failed: bool,
    /// The handler whose call is running (between `enter_guest` and `exit_guest`).
    in_guest: Option<String>,
    /// A successful guest call whose walls and savepoint are still up.
    lingering: Option<Lingering>,
    /// The SQLite writer slot this transaction holds, if any; released when it ends.
    _writer: Option<OwnedSemaphorePermit>,
}

enum Inner {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
}

impl Tx {
    pub(super) fn sqlite(tx: Transaction<'static, Sqlite>) -> Self {
        Self {
            inner: Inner::Sqlite(tx),
            statement_savepoints: true,
            statement_failed: false,
            in_guest: None,
            lingering: None,
            _writer: None,
        }
    }

    pub(super) fn postgres(tx: Transaction<'static, Postgres>) -> Self {
        Self {
            inner: Inner::Postgres(tx),
            statement_savepoints: true,
            statement_failed: false,
            in_guest: None,
            lingering: None,
            _writer: None,
        }
    }

    pub(super) fn holding(mut self, writer: Option<OwnedSemaphorePermit>) -> Self {
        self._writer = writer;
        self
    }

    pub fn backend(&self) -> Backend {
        match self.inner {
            Inner::Sqlite(_) => Backend::Sqlite,
            Inner::Postgres(_) => Backend::Postgres,
        }
    }

    /// Runs one of the host's statements and returns the number of rows it changed.
    pub async fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        self.leave_lingering().await?;
        self.run(sql, params, true).await
    }

    /// Runs one of the host's statements and returns every row it produced.
    pub async fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Vec<SqlValue>>, DbError> {
        self.leave_lingering().await?;
        self.fetch(sql, params, usize::MAX, true).await
    }

    /// Runs a guest's statement. On SQLite never from the statement cache,
    /// because the authorizer (the second wall) judges a statement when it is
    /// prepared. On PostgreSQL it is prepared once per connection and cached:
    /// privileges are checked at every execution and a plan is re-made when
    /// the search path (the handler's schema) differs. On PostgreSQL it runs
    /// inside a savepoint, so a failure leaves the transaction usable, as it
    /// does on SQLite.
    pub async fn guest_execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        if self.optimistic()? {
            let result = self.run(sql, params, true).await;
            self.statement_failed = result.is_err();
            return result;
        }
        self.statement_savepoint().await?;
        let result = self.run(sql, params, self.caches_guest_statements()).await;
        self.end_statement_savepoint(result.is_ok()).await?;
        result
    }

    /// As [`Tx::guest_execute`], returning rows; more than `max_rows` is [`DbError::TooManyRows`].
    pub async fn guest_query(
        &mut self,
        sql: &str,
        params: &[SqlValue],
        max_rows: usize,
    ) -> Result<Vec<Vec<SqlValue>>, DbError> {
        if self.optimistic()? {
            let result = self.fetch(sql, params, max_rows, true).await;
            self.statement_failed = result.is_err();
            return result;
        }
        self.statement_savepoint().await?;
        let result = self
            .fetch(sql, params, max_rows, self.caches_guest_statements())
            .await;
        self.end_statement_savepoint(result.is_ok()).await?;
        result
    }

    /// Turns the per-statement savepoints of guest statements off (`false`)
    /// or on. Each costs two round trips on PostgreSQL, and a handler's
    /// statements rarely fail, so the pipeline runs a handler without them
    /// first. If a statement then fails, PostgreSQL has aborted the whole
    /// transaction: every later statement of the call is refused,
    /// [`Tx::take_statement_failed`] says so, and the pipeline rolls the call
    /// back to its savepoint and runs it again with them on, so the handler
    /// sees exactly what it would have seen with them on from the start.
    /// (SQLite undoes a failed statement by itself and needs neither.)
    pub fn set_statement_savepoints(&mut self, on: bool) {
        self.statement_savepoints = on;
        self.statement_failed = false;
    }

    /// True (once) if a guest statement failed with statement savepoints off.
    pub fn take_statement_failed(&mut self) -> bool {
        std::mem::take(&mut self.statement_failed)
    }

    /// With statement savepoints off on PostgreSQL: `Err` if an earlier
    /// statement of the call failed (the transaction is aborted), else `Ok(true)`.
    fn optimistic(&self) -> Result<bool, DbError> {
        if self.statement_savepoints || self.backend() != Backend::Postgres {
            return Ok(false);
        }
        if self.statement_failed {
            return Err(DbError::AfterFailedStatement);
        }
        Ok(true)
    }

    fn caches_guest_statements(&self) -> bool {
        self.backend() == Backend::Postgres
    }

    async fn statement_savepoint(&mut self) -> Result<(), DbError> {
        if self.backend() == Backend::Postgres {
            self.savepoint(STATEMENT_SAVEPOINT).await?;
        }
        Ok(())
    }

    async fn end_statement_savepoint(&mut self, succeeded: bool) -> Result<(), DbError> {
        if self.backend() == Backend::Postgres {
            if succeeded {
                self.release(STATEMENT_SAVEPOINT).await?;
            } else {
                self.rollback_to(STATEMENT_SAVEPOINT).await?;
            }
        }
        Ok(())
    }

    async fn run(&mut self, sql: &str, params: &[SqlValue], persistent: bool) -> Result<u64, DbError> {
        let done = match &mut self.inner {
            Inner::Sqlite(tx) => {
                let query = bind_sqlite(sqlx::query(sql), params).persistent(persistent);
                query.execute(&mut **tx).await?.rows_affected()
            }
            Inner::Postgres(tx) => {
                let query = bind_postgres(sqlx::query(sql), params).persistent(persistent);
                query.execute(&mut **tx).await?.rows_affected()
            }
        };
        Ok(done)
    }

    async fn fetch(
        &mut self,
        sql: &str,
        params: &[SqlValue],
        max_rows: usize,
        persistent: bool,
    ) -> Result<Vec<Vec<SqlValue>>, DbError> {
        let mut rows = Vec::new();
        // Rows are decoded as they stream in, so an oversized result stops at
        // the limit instead of being buffered whole.
        match &mut self.inner {
            Inner::Sqlite(tx) => {
                let query = bind_sqlite(sqlx::query(sql), params).persistent(persistent);
                let mut stream = query.fetch(&mut **tx);
                while let Some(row) = stream.try_next().await? {
                    if rows.len() == max_rows {
                        return Err(DbError::TooManyRows { limit: max_rows });
                    }
                    rows.push(decode_sqlite(&row)?);
                }
            }
            Inner::Postgres(tx) => {
                let query = bind_postgres(sqlx::query(sql), params).persistent(persistent);
                let mut stream = query.fetch(&mut **tx);
                while let Some(row) = stream.try_next().await? {
                    if rows.len() == max_rows {
                        return Err(DbError::TooManyRows { limit: max_rows });
                    }
                    rows.push(decode_postgres(&row)?);
                }
            }
        }
        Ok(rows)
    }

    /// Runs a script of several statements without parameters (migrations only).
    pub async fn execute_script(&mut self, sql: &str) -> Result<(), DbError> {
        self.leave_lingering().await?;
        match &mut self.inner {
            // `Executor::execute` on a bare `&str` runs every statement of the
            // text (simple query protocol); unlike `raw_sql`, its future is
            // `Send` for any lifetime, so it can run inside a spawned task.
            Inner::Sqlite(tx) => {
                sqlx::Executor::execute(&mut **tx, sql).await?;
            }
            Inner::Postgres(tx) => {
                sqlx::Executor::execute(&mut **tx, sql).await?;
            }
        }
        Ok(())
    }

    /// Savepoint names are the host's constants, never guest input.
    pub async fn savepoint(&mut self, name: &'static str) -> Result<(), DbError> {
        self.execute(&format!("SAVEPOINT {name}"), &[]).await.map(drop)
    }

    pub async fn release(&mut self, name: &'static str) -> Result<(), DbError> {
        self.execute(&format!("RELEASE SAVEPOINT {name}"), &[])
            .await
            .map(drop)
    }

    pub async fn rollback_to(&mut self, name: &'static str) -> Result<(), DbError> {
        self.execute(&format!("ROLLBACK TO SAVEPOINT {name}"), &[])
            .await
            .map(drop)
    }

    /// Holds the migration lock until the transaction ends (PostgreSQL; SQLite
    /// serialises writers anyway).
    pub async fn lock_migrations(&mut self) -> Result<(), DbError> {
        if self.backend() == Backend::Postgres {
            self.execute(
                "SELECT pg_advisory_xact_lock($1)",
                &[super::MIGRATION_LOCK_KEY.into()],
            )
            .await?;
        }
        Ok(())
    }

    /// Enters the handler's walls for its SQL. PostgreSQL: its schema as the
    /// search path and its role (which cannot see the host's schema), both
    /// `LOCAL`, so they end with the transaction or at `ROLLBACK TO` a savepoint
    /// taken before. SQLite: the authorizer, until [`Tx::leave_handler_scope`].
    pub async fn enter_handler_scope(&mut self, handler: &str, scope: Scope) -> Result<(), DbError> {
        match &mut self.inner {
            Inner::Postgres(_) => {
                let params = [handler_schema(handler).into(), handler_role(handler).into()];
                self.execute(
                    "SELECT set_config('search_path', $1, true), set_config('role', $2, true)",
                    &params,
                )
                .await?;
            }
            Inner::Sqlite(tx) => {
                let mut handle = tx.lock_handle().await?;
                // SAFETY: the handle is locked for us, so no other thread uses the connection.
                unsafe { authorizer::set(handle.as_raw_handle().as_ptr(), Some(scope)) };
            }
        }
        Ok(())
    }

    /// Starts a guest call: `SAVEPOINT savepoint`, then the handler's walls
    /// (as [`Tx::enter_handler_scope`]). On PostgreSQL both go in one round
    /// trip; the names spliced in are the host's constants and validated
    /// handler names (`config::is_identifier`), never guest input. Right after
    /// a successful call of the same handler (see [`Tx::exit_guest`]) the
    /// walls are still up, and only the savepoint is renewed.
    pub async fn enter_guest(&mut self, savepoint: &'static str, handler: &str) -> Result<(), DbError> {
        if let Some(open) = self.lingering.take() {
            if open.savepoint == savepoint && open.handler == handler {
                self.renew_savepoint(savepoint).await?;
                self.in_guest = Some(open.handler);
                return Ok(());
            }
            self.lingering = Some(open);
            self.leave_lingering().await?;
        }
        match &mut self.inner {
            Inner::Postgres(tx) => {
                let sql = format!(
                    "SAVEPOINT {savepoint}; SELECT set_config('search_path', '{}', true), set_config('role', '{}', true)",
                    handler_schema(handler),
                    handler_role(handler)
                );
                sqlx::Executor::execute(&mut **tx, sql.as_str()).await?;
            }
            Inner::Sqlite(_) => {
                self.savepoint(savepoint).await?;
                self.enter_handler_scope(handler, Scope::Guest).await?;
            }
        }
        self.in_guest = Some(handler.to_owned());
        Ok(())
    }

    /// Ends a guest call begun with [`Tx::enter_guest`]: keeps its work
    /// (`succeeded`) or undoes it, and leaves the walls. Every guest call ends
    /// here, whatever happened.
    ///
    /// A failure is undone at once and the walls come down (on SQLite the
    /// authorizer first: it would refuse the host's own savepoint statement). A success
    /// only *lingers*: the walls stay up and the savepoint open until the
    /// next statement of the host's own (which leaves them first, see
    /// [`Tx::leave_lingering`]) or the next call of the same handler (which
    /// just releases the savepoint and takes a new one). In a batch of
    /// events that saves a round trip per event, and no host statement ever
    /// runs inside the walls.
    pub async fn exit_guest(&mut self, savepoint: &'static str, succeeded: bool) -> Result<(), DbError> {
        let handler = self.in_guest.take().unwrap_or_default();
        if succeeded {
            self.lingering = Some(Lingering { savepoint, handler });
            return Ok(());
        }
        match &mut self.inner {
            // The walls are left explicitly, not by the rollback: after a
            // renewed savepoint they were put up before it, and a rollback to
            // it would leave them standing.
            Inner::Postgres(tx) => {
                let sql = format!(
                    "ROLLBACK TO SAVEPOINT {savepoint}; \
                     SELECT set_config('role', 'none', true), set_config('search_path', '{HOST_SCHEMA}', true)"
                );
                sqlx::Executor::execute(&mut **tx, sql.as_str()).await?;
                Ok(())
            }
            Inner::Sqlite(_) => {
                self.leave_handler_scope().await?;
                self.rollback_to(savepoint).await
            }
        }
    }

    /// Between two successful calls of one handler: keep the first one's work
    /// and open a savepoint for the next, inside the same walls.
    async fn renew_savepoint(&mut self, savepoint: &'static str) -> Result<(), DbError> {
        let sql = format!("RELEASE SAVEPOINT {savepoint}; SAVEPOINT {savepoint}");
        match &mut self.inner {
            Inner::Postgres(tx) => {
                sqlx::Executor::execute(&mut **tx, sql.as_str()).await?;
            }
            Inner::Sqlite(tx) => {
                // The authorizer would refuse the savepoint statements.
                let mut handle = tx.lock_handle().await?;
                let raw = handle.as_raw_handle().as_ptr();
                // SAFETY: the handle is locked for us, so no other thread uses the connection.
                unsafe { authorizer::set(raw, None) };
                drop(handle);
                sqlx::Executor::execute(&mut **tx, sql.as_str()).await?;
                let mut handle = tx.lock_handle().await?;
                // SAFETY: as above.
                unsafe { authorizer::set(handle.as_raw_handle().as_ptr(), Some(Scope::Guest)) };
            }
        }
        Ok(())
    }

    /// Leaves the walls of a successful guest call that is still lingering,
    /// keeping its work. Every host statement calls this first.
    async fn leave_lingering(&mut self) -> Result<(), DbError> {
        let Some(open) = self.lingering.take() else {
            return Ok(());
        };
        let savepoint = open.savepoint;
        match &mut self.inner {
            Inner::Postgres(tx) => {
                let sql = format!(
                    "SELECT set_config('role', 'none', true), set_config('search_path', '{HOST_SCHEMA}', true); \
                     RELEASE SAVEPOINT {savepoint}"
                );
                sqlx::Executor::execute(&mut **tx, sql.as_str()).await?;
            }
            Inner::Sqlite(tx) => {
                {
                    let mut handle = tx.lock_handle().await?;
                    // SAFETY: the handle is locked for us, so no other thread uses the connection.
                    unsafe { authorizer::set(handle.as_raw_handle().as_ptr(), None) };
                }
                let sql = format!("RELEASE SAVEPOINT {savepoint}");
                sqlx::Executor::execute(&mut **tx, sql.as_str()).await?;
            }
        }
        Ok(())
    }

    /// Leaves the handler's walls; always called after its SQL, whatever happened.
    pub async fn leave_handler_scope(&mut self) -> Result<(), DbError> {
        match &mut self.inner {
            Inner::Postgres(_) => {
                self.execute(
                    "SELECT set_config('role', 'none', true), set_config('search_path', $1, true)",
                    &[HOST_SCHEMA.into()],
                )
                .await?;
            }
            Inner::Sqlite(tx) => {
                let mut handle = tx.lock_handle().await?;
                // SAFETY: as in enter_handler_scope.
                unsafe { authorizer::set(handle.as_raw_handle().as_ptr(), None) };
            }
        }
        Ok(())
    }

    pub async fn commit(self) -> Result<(), DbError> {
        match self.inner {
            Inner::Sqlite(tx) => tx.commit().await?,
            Inner::Postgres(tx) => tx.commit().await?,
        }
        Ok(())
    }

    pub async fn rollback(self) -> Result<(), DbError> {
        match self.inner {
            Inner::Sqlite(tx) => tx.rollback().await?,
            Inner::Postgres(tx) => tx.rollback().await?,
        }
        Ok(())
    }
}
