//! The host's own statements on its tables, through each backend's way:
//! plain SQL on SQLite, the `inboxd_gate` functions (and the host's key) on
//! PostgreSQL, where the transaction's session may be a handler's login.

use super::Tx;
use crate::db::{Backend, DbError, PgArray, SqlValue};

impl Tx {
    /// Calls one of the host's gate functions (PostgreSQL: see
    /// migrations/postgres/0006_host_gates.sql) and returns its rows. `sql`
    /// names the key `$1`; `params` are `$2` onwards. Outside the walls, as
    /// every host statement.
    pub(in crate::db) async fn gate(
        &mut self,
        sql: &str,
        params: &[SqlValue],
    ) -> Result<Vec<Vec<SqlValue>>, DbError> {
        let params = self.keyed(params).await?;
        self.query(sql, &params).await
    }

    /// As [`Tx::gate`], with `arrays` (a batch's rows, a column each) after
    /// `params`.
    pub(in crate::db) async fn gate_arrays(
        &mut self,
        sql: &str,
        params: &[SqlValue],
        arrays: &[PgArray<'_>],
    ) -> Result<Vec<Vec<SqlValue>>, DbError> {
        let params = self.keyed(params).await?;
        self.query_with(sql, &params, arrays).await
    }

    /// As [`Tx::gate`], for a gate that returns nothing (`void`, which has no decoder).
    pub(in crate::db) async fn gate_void(&mut self, sql: &str, params: &[SqlValue]) -> Result<(), DbError> {
        let params = self.keyed(params).await?;
        self.execute(sql, &params).await.map(drop)
    }

    /// One of the host's statements on a table of its own, as each backend
    /// runs it: `sqlite` on SQLite, its `gate` on PostgreSQL (which names the
    /// key `$1` and `params` from `$2`). Rows, as [`Tx::query`].
    pub(in crate::db) async fn host_rows(
        &mut self,
        sqlite: &str,
        gate: &str,
        params: &[SqlValue],
    ) -> Result<Vec<Vec<SqlValue>>, DbError> {
        match self.backend() {
            Backend::Postgres => self.gate(gate, params).await,
            Backend::Sqlite => self.query(sqlite, params).await,
        }
    }

    /// As [`Tx::host_rows`], for a write: rows changed (the gate returns them).
    pub(in crate::db) async fn host_count(
        &mut self,
        sqlite: &str,
        gate: &str,
        params: &[SqlValue],
    ) -> Result<u64, DbError> {
        match self.backend() {
            Backend::Postgres => self.gate_count(gate, params).await,
            Backend::Sqlite => self.execute(sqlite, params).await,
        }
    }

    /// As [`Tx::host_rows`], for a write whose count nobody needs (a `void` gate).
    pub(in crate::db) async fn host_write(
        &mut self,
        sqlite: &str,
        gate: &str,
        params: &[SqlValue],
    ) -> Result<(), DbError> {
        match self.backend() {
            Backend::Postgres => self.gate_void(gate, params).await,
            Backend::Sqlite => self.execute(sqlite, params).await.map(drop),
        }
    }

    /// The host's key, then `params`.
    async fn keyed(&self, params: &[SqlValue]) -> Result<Vec<SqlValue>, DbError> {
        let Some(gate) = &self.gate else {
            unreachable!("only PostgreSQL transactions call the gates");
        };
        let mut all = Vec::with_capacity(params.len() + 1);
        all.push(SqlValue::Text(gate.key.secret(&gate.host).await?.to_owned()));
        all.extend_from_slice(params);
        Ok(all)
    }

    /// As [`Tx::gate`], for a gate that returns one integer (rows changed).
    pub(in crate::db) async fn gate_count(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        let rows = self.gate(sql, params).await?;
        let count = rows.first().and_then(|r| r.first()).and_then(SqlValue::as_i64);
        Ok(count.unwrap_or(0).max(0) as u64)
    }
}
