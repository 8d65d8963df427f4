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

pub struct Tx {
    inner: Inner,
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
            _writer: None,
        }
    }

    pub(super) fn postgres(tx: Transaction<'static, Postgres>) -> Self {
        Self {
            inner: Inner::Postgres(tx),
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
        self.run(sql, params, true).await
    }

    /// Runs one of the host's statements and returns every row it produced.
    pub async fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Vec<SqlValue>>, DbError> {
        self.fetch(sql, params, usize::MAX, true).await
    }

    /// Runs a guest's statement: never from the statement cache (so SQLite's
    /// authorizer sees it prepared), and on PostgreSQL inside a savepoint so a
    /// failure leaves the transaction usable, as it does on SQLite.
    pub async fn guest_execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        self.statement_savepoint().await?;
        let result = self.run(sql, params, false).await;
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
        self.statement_savepoint().await?;
        let result = self.fetch(sql, params, max_rows, false).await;
        self.end_statement_savepoint(result.is_ok()).await?;
        result
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
        match &mut self.inner {
            Inner::Sqlite(tx) => {
                sqlx::raw_sql(sql).execute(&mut **tx).await?;
            }
            Inner::Postgres(tx) => {
                sqlx::raw_sql(sql).execute(&mut **tx).await?;
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

    /// Ends a guest call that started with `SAVEPOINT savepoint` and
    /// [`Tx::enter_handler_scope`]: keeps its work (`succeeded`) or undoes it,
    /// and leaves the walls. Every guest call ends here, whatever happened.
    /// The order matters: SQLite's authorizer would refuse the host's own
    /// savepoint statement, so it comes off first; on PostgreSQL a rollback to
    /// the savepoint also ends the role and search path.
    pub async fn exit_handler_scope(
        &mut self,
        savepoint: &'static str,
        succeeded: bool,
    ) -> Result<(), DbError> {
        match (self.backend(), succeeded) {
            (Backend::Postgres, false) => self.rollback_to(savepoint).await,
            (_, true) => {
                self.leave_handler_scope().await?;
                self.release(savepoint).await
            }
            (Backend::Sqlite, false) => {
                self.leave_handler_scope().await?;
                self.rollback_to(savepoint).await
            }
        }
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
