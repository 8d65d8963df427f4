//! What a handler owns: its schema on PostgreSQL; on SQLite the tables and
//! views its migrations created (`handler_tables`), and the names it gave
//! up (`handler_retired_tables`), which no other handler may take.

use super::*;

/// Tables and views in an SQLite database (empty on PostgreSQL, where a
/// handler's tables are simply those in its schema).
pub(super) async fn sqlite_tables(tx: &mut Tx) -> Result<Vec<String>, DbError> {
    if tx.backend() != Backend::Sqlite {
        return Ok(Vec::new());
    }
    let rows = tx
        .query(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')",
            &[],
        )
        .await?;
    Ok(texts(rows, "sqlite_master row", "name")?)
}

/// The tables a handler's SQL may touch: what its migrations created.
pub async fn own_tables(db: &Database, handler: &str) -> Result<Vec<String>, DbError> {
    let mut tx = db.begin().await?;
    let tables = own_tables_in(&mut tx, handler).await?;
    tx.commit().await?;
    Ok(tables)
}

pub(super) async fn own_tables_in(tx: &mut Tx, handler: &str) -> Result<Vec<String>, DbError> {
    let rows = match tx.backend() {
        Backend::Sqlite => {
            tx.query(
                "SELECT table_name FROM handler_tables WHERE handler = $1",
                &[handler.into()],
            )
            .await?
        }
        Backend::Postgres => {
            tx.query(
                // Qualified: on the handler's own session its schema is first on the path.
                "SELECT tablename::pg_catalog.text FROM pg_catalog.pg_tables WHERE schemaname = $1
                 UNION SELECT viewname::pg_catalog.text FROM pg_catalog.pg_views WHERE schemaname = $1",
                &[handler_schema(handler).into()],
            )
            .await?
        }
    };
    Ok(texts(rows, "table list row", "name")?)
}

/// After one statement: what the handler owns now. On SQLite the tables and
/// views that appeared are the handler's and those that vanished (dropped,
/// renamed) no longer are, in `handler_tables` too. PostgreSQL: its schema.
pub(super) async fn record_tables(
    tx: &mut Tx,
    handler: &str,
    own: &[String],
    before: &[String],
) -> Result<Vec<String>, DbError> {
    if tx.backend() == Backend::Postgres {
        return own_tables_in(tx, handler).await;
    }
    let after = sqlite_tables(tx).await?;
    for gone in own.iter().filter(|t| !after.contains(t)) {
        tx.execute(
            "DELETE FROM handler_tables WHERE handler = $1 AND table_name = $2",
            &[handler.into(), gone.as_str().into()],
        )
        .await?;
        // Regression (the forty-third read, issue 23): until every host
        // swaps to the version this migration belongs to, the old one runs
        // with walls that still name the table; had another handler taken
        // the name meanwhile, they would have let it into that one's rows.
        tx.execute(
            "INSERT INTO handler_retired_tables (handler, table_name) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[handler.into(), gone.as_str().into()],
        )
        .await?;
    }
    for table in after.iter().filter(|t| !before.contains(t)) {
        // The guard refuses such names; this holds even if it had not.
        if crate::sandbox::is_reserved(table) {
            return Err(DbError::HandlerMigration(format!(
                "handler {handler} may not create {table}: the name is kept for the host's tables"
            )));
        }
        if let Some(other) = retired_by_other(tx, handler, table).await? {
            return Err(DbError::HandlerMigration(format!(
                "handler {handler} may not create {table}: handler {other} had a table or view of that name \
                 (a version of it may still run with walls that name it); choose another name"
            )));
        }
        tx.execute(
            "INSERT INTO handler_tables (handler, table_name) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[handler.into(), table.as_str().into()],
        )
        .await?;
    }
    // SQLite's indexes share that namespace: one named like another
    // handler's retired table would keep that handler from its own name.
    let squatted = tx
        .query(
            "SELECT m.name, r.handler FROM sqlite_master m
               JOIN handler_tables t ON t.handler = $1 AND lower(t.table_name) = lower(m.tbl_name)
               JOIN handler_retired_tables r ON lower(r.table_name) = lower(m.name) AND r.handler <> $1
              WHERE m.type = 'index' LIMIT 1",
            &[handler.into()],
        )
        .await?;
    if let Some([SqlValue::Text(index), SqlValue::Text(other)]) = squatted.first().map(Vec::as_slice) {
        return Err(DbError::HandlerMigration(format!(
            "handler {handler} may not name an index {index}: handler {other} had a table or view of that name \
             (a version of it may still run with walls that name it); choose another name"
        )));
    }
    own_tables_in(tx, handler).await
}

/// The other handler that once had a table or view named `table`, if any
/// (SQLite; names are compared as SQLite does, without case).
async fn retired_by_other(tx: &mut Tx, handler: &str, table: &str) -> Result<Option<String>, DbError> {
    let rows = tx
        .query(
            "SELECT handler FROM handler_retired_tables WHERE lower(table_name) = lower($1) AND handler <> $2 LIMIT 1",
            &[table.into(), handler.into()],
        )
        .await?;
    Ok(texts(rows, "retired table row", "handler")?.into_iter().next())
}
