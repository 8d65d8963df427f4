//! The backend's own transaction under a [`Tx`]: running, fetching and
//! bounding statements on SQLite or PostgreSQL, and the walls' view of it
//! ([`Connection`]).

use super::*;

impl Inner {
    pub(super) async fn run(
        &mut self,
        sql: &str,
        params: &[SqlValue],
        persistent: bool,
    ) -> Result<u64, DbError> {
        let done = match self {
            Inner::Sqlite(tx) => {
                let query = bind_sqlite(sqlx::query(sql), params).persistent(persistent);
                query.execute(&mut **tx).await?.rows_affected()
            }
            Inner::Postgres(tx, within) => {
                let query = bind_postgres(sqlx::query(sql), params, &[]).persistent(persistent);
                answered(*within, query.execute(&mut **tx)).await?.rows_affected()
            }
        };
        Ok(done)
    }

    pub(super) async fn fetch(
        &mut self,
        sql: &str,
        params: &[SqlValue],
        bound: Bound,
        persistent: bool,
    ) -> Result<Vec<Vec<SqlValue>>, DbError> {
        self.fetch_with(sql, params, &[], bound, persistent).await
    }

    /// As [`Inner::fetch`], with PostgreSQL arrays after `params` (the
    /// host's gates only; SQLite has no arrays).
    pub(super) async fn fetch_with(
        &mut self,
        sql: &str,
        params: &[SqlValue],
        arrays: &[PgArray<'_>],
        bound: Bound,
        persistent: bool,
    ) -> Result<Vec<Vec<SqlValue>>, DbError> {
        let mut rows = Vec::new();
        let mut bytes = 0;
        // Rows are decoded one at a time as they stream in, and counted
        // before they are kept, so an oversized result stops at its bound
        // instead of being buffered whole.
        // `weight`: what the row holds at least as received, weighed before
        // it is decoded, so a row past the bound is refused before it is
        // copied (a row may be 64 values of `limits.max_row_bytes`: the
        // fifty-second read).
        let mut keep = |weight: usize, decode: &dyn Fn() -> Result<Vec<SqlValue>, DbError>| {
            if rows.len() == bound.rows {
                return Err(DbError::TooManyRows { limit: bound.rows });
            }
            if bytes + weight > bound.bytes {
                return Err(DbError::ResultTooLarge { limit: bound.bytes });
            }
            let row = decode()?;
            // What the host holds for the row, not only its values'
            // bytes: 1,664 empty texts a row counted nothing, and 100,000
            // such rows held 5 GB (the fifteenth read of issue 23's third round).
            bytes += std::mem::size_of::<Vec<SqlValue>>()
                + row
                    .iter()
                    .map(|value| std::mem::size_of::<SqlValue>() + value.size())
                    .sum::<usize>();
            if bytes > bound.bytes {
                return Err(DbError::ResultTooLarge { limit: bound.bytes });
            }
            rows.push(row);
            Ok(())
        };
        match self {
            Inner::Sqlite(tx) => {
                assert!(
                    arrays.is_empty(),
                    "SQLite has no arrays: the host's gates are PostgreSQL's"
                );
                let query = bind_sqlite(sqlx::query(sql), params).persistent(persistent);
                let mut stream = query.fetch(&mut **tx);
                while let Some(row) = stream.try_next().await? {
                    keep(0, &|| Ok(decode_sqlite(&row)?))?;
                }
            }
            Inner::Postgres(tx, within) => {
                let query = bind_postgres(sqlx::query(sql), params, arrays).persistent(persistent);
                let mut stream = query.fetch(&mut **tx);
                let rows = async {
                    while let Some(row) = stream.try_next().await? {
                        keep(postgres_row_bytes(&row), &|| Ok(decode_postgres(&row)?))?;
                    }
                    Ok::<(), DbError>(())
                };
                answered(*within, rows).await?;
            }
        }
        Ok(rows)
    }
}

/// The walls send the host's own statements through the transaction's connection.
impl Connection for Inner {
    fn backend(&self) -> Backend {
        match self {
            Inner::Sqlite(_) => Backend::Sqlite,
            Inner::Postgres(..) => Backend::Postgres,
        }
    }

    async fn statement(&mut self, sql: &str) -> Result<(), DbError> {
        self.run(sql, &[], true).await.map(drop)
    }

    /// The simple query protocol: several statements, one round trip, no
    /// parameters. The text is the host's, never a guest's.
    async fn statements(&mut self, sql: &str) -> Result<(), DbError> {
        match self {
            Inner::Sqlite(tx) => {
                sqlx::Executor::execute(&mut **tx, sql).await?;
            }
            Inner::Postgres(tx, within) => {
                answered(*within, sqlx::Executor::execute(&mut **tx, sql)).await?;
            }
        }
        Ok(())
    }

    fn sqlite(&mut self) -> Option<&mut SqliteConnection> {
        match self {
            Inner::Sqlite(tx) => Some(&mut **tx),
            Inner::Postgres(..) => None,
        }
    }
}

/// How much one guest query may return.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bound {
    pub(super) rows: usize,
    pub(super) bytes: usize,
}
