//! An open transaction on either backend.
//!
//! The pipeline owns it for the whole claim -> guest -> offset -> commit
//! sequence; while a guest runs, it is moved into the guest's store so the
//! guest's statements land in it and in nothing else.

use super::value::{bind_postgres, bind_sqlite, decode_postgres, decode_sqlite};
use super::{Backend, DbError, SqlValue};
use sqlx::{Postgres, Sqlite, Transaction};

pub struct Tx {
    inner: Inner,
}

enum Inner {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
}

impl Tx {
    pub(super) fn sqlite(tx: Transaction<'static, Sqlite>) -> Self {
        Self {
            inner: Inner::Sqlite(tx),
        }
    }

    pub(super) fn postgres(tx: Transaction<'static, Postgres>) -> Self {
        Self {
            inner: Inner::Postgres(tx),
        }
    }

    pub fn backend(&self) -> Backend {
        match self.inner {
            Inner::Sqlite(_) => Backend::Sqlite,
            Inner::Postgres(_) => Backend::Postgres,
        }
    }

    /// Runs one statement and returns the number of rows it changed.
    pub async fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        let done = match &mut self.inner {
            Inner::Sqlite(tx) => bind_sqlite(sqlx::query(sql), params)
                .execute(&mut **tx)
                .await?
                .rows_affected(),
            Inner::Postgres(tx) => bind_postgres(sqlx::query(sql), params)
                .execute(&mut **tx)
                .await?
                .rows_affected(),
        };
        Ok(done)
    }

    /// Runs one statement and returns every row it produced.
    pub async fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Vec<SqlValue>>, DbError> {
        match &mut self.inner {
            Inner::Sqlite(tx) => {
                let rows = bind_sqlite(sqlx::query(sql), params).fetch_all(&mut **tx).await?;
                rows.iter()
                    .map(|r| decode_sqlite(r).map_err(DbError::from))
                    .collect()
            }
            Inner::Postgres(tx) => {
                let rows = bind_postgres(sqlx::query(sql), params)
                    .fetch_all(&mut **tx)
                    .await?;
                rows.iter()
                    .map(|r| decode_postgres(r).map_err(DbError::from))
                    .collect()
            }
        }
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

    /// Points unqualified table names at the handler's own tables for its
    /// statements: on PostgreSQL its schema (the host's tables live in
    /// `inboxd`); on SQLite everything shares one schema and this does nothing.
    /// `SET LOCAL` ends with the transaction, or at `ROLLBACK TO` a savepoint
    /// taken before it.
    pub async fn enter_handler_scope(&mut self, handler: &str) -> Result<(), DbError> {
        if self.backend() == Backend::Postgres {
            let schema = super::handler_schema(handler);
            self.execute(&format!("SET LOCAL search_path = {schema}"), &[])
                .await?;
        }
        Ok(())
    }

    /// Back to the host's own schema, after a handler's statements.
    pub async fn leave_handler_scope(&mut self) -> Result<(), DbError> {
        if self.backend() == Backend::Postgres {
            self.execute(&format!("SET LOCAL search_path = {}", super::HOST_SCHEMA), &[])
                .await?;
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
