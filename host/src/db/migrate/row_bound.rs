//! PostgreSQL: every table of a handler holds rows of at most
//! `limits.max_row_bytes` as text, by a `CHECK` the host adds and keeps.
//!
//! The statement guard counts every column at that size when it bounds the
//! work of one row (`sandbox::work`), and PostgreSQL has no setting that
//! bounds a value below its 1 GB maximum. So the bound is a constraint on the
//! whole row, `octet_length((t.*)::text) <= N`: it covers columns a later
//! migration adds and survives renames. A handler's migrations cannot drop
//! or rename it (the name is reserved, see `sandbox::is_reserved`), and the
//! host checks it again, by its exact definition, every time it loads the
//! handler, re-adding whatever is missing or different, before any event runs.
//! SQLite needs none of this: `SQLITE_LIMIT_LENGTH` bounds every value and
//! row inside the walls (`sandbox::authorizer`).

use super::{Backend, Database, DbError, handler_schema};

/// The constraint's name: under the host's reserved `inbox` prefix.
pub const CONSTRAINT: &str = "inboxd_row_bound";

/// Makes every table of `handler` hold rows of at most `max_row_bytes`;
/// returns the tables it had to (re)bound.
pub async fn bound_rows(db: &Database, handler: &str, max_row_bytes: usize) -> Result<Vec<String>, DbError> {
    if db.backend() != Backend::Postgres {
        return Ok(Vec::new());
    }
    let limit = i64::try_from(max_row_bytes).unwrap_or(i64::MAX);
    let schema = handler_schema(handler);
    // On the handler's own login, the tables' owner; under the migration
    // lock, so two hosts loading the handler do not race.
    let mut tx = db.begin_migration(handler).await?;
    tx.lock_migrations().await?;
    let rows = tx
        .query(
            "SELECT c.relname::pg_catalog.text FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
               AND NOT EXISTS (
                 SELECT 1 FROM pg_catalog.pg_constraint k
                 WHERE k.conrelid = c.oid AND k.conname = $2 AND k.convalidated
                   AND pg_catalog.pg_get_constraintdef(k.oid) = pg_catalog.format(
                     'CHECK ((octet_length((%I.*)::text) <= %s))', c.relname, $3::pg_catalog.int8))
             ORDER BY 1",
            &[schema.as_str().into(), CONSTRAINT.into(), limit.into()],
        )
        .await?;
    let tables = super::strings(rows);
    for table in &tables {
        let name = quote(table);
        let sql = format!(
            "ALTER TABLE {schema}.{name} DROP CONSTRAINT IF EXISTS {CONSTRAINT}, \
             ADD CONSTRAINT {CONSTRAINT} CHECK (octet_length(({name}.*)::text) <= {limit})"
        );
        tx.execute(&sql, &[]).await.map_err(|e| {
            DbError::HandlerMigration(format!(
                "table {table} ({max_row_bytes} bytes per row, as text): {e}; raise the limit, or make its \
                 rows smaller"
            ))
        })?;
    }
    tx.commit().await?;
    if !tables.is_empty() {
        tracing::info!(
            handler,
            ?tables,
            max_row_bytes,
            "tables held to limits.max_row_bytes"
        );
    }
    Ok(tables)
}

/// An identifier, quoted as PostgreSQL reads it.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
