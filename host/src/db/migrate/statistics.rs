//! PostgreSQL: no handler expression runs in ANALYZE.
//!
//! Autovacuum analyzes a table once enough of its rows changed (50 plus 10%),
//! in a worker with no `statement_timeout` and outside every event. ANALYZE
//! evaluates each expression index's expressions, and each partial index's
//! predicate, on every row of its sample: up to 30,000 at the default
//! statistics target. The guard bounds an expression's work per row written
//! (about a second), which that multiplies past any deadline. Regression
//! (the review of issue 23's compile worker): an index on 76 `md5(v)` over
//! 100 rows of 1 MiB, then 80 small rows inserted and deleted (17 ms of
//! statements), held an autovacuum worker 14.6 s (11.7 s of CPU); at 10,000
//! rows, about 20 minutes per 1,050 rows changed, and three such tables
//! would hold every autovacuum worker, the host's inbox's included.
//!
//! So the host sets the statistics target of every expression column of a
//! handler's indexes to 0, after each migration statement and when the
//! handler loads: ANALYZE then leaves those expressions alone (the planner
//! estimates them by default selectivities). A handler cannot set it back:
//! statistics targets are refused (`sandbox::postgres::ddl_bounds`). A
//! partial index's predicate would still run in ANALYZE whatever the
//! targets, so the migration guard refuses partial indexes on PostgreSQL.

use super::super::{Backend, DbError, Tx, handler_schema, quote_ident};

/// Partial indexes of handler schemas (`$1`: a LIKE pattern of schemas):
/// today's migrations refuse them, and an older release's are named at
/// start (`db::audit`).
pub(crate) const POSTGRES_PARTIAL_INDEXES: &str = r"
SELECT n.nspname::pg_catalog.text AS schema, c.relname::pg_catalog.text AS index
FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname LIKE $1 AND i.indpred IS NOT NULL
ORDER BY 1, 2";

/// Expression columns of the handler's indexes that ANALYZE would still
/// compute: `$1` is its schema. An index column is an expression where
/// `indkey` holds 0; PostgreSQL 17 made `attstattarget` nullable (unset).
const POSTGRES_ANALYZED_EXPRESSIONS: &str = r"
SELECT c.relname::pg_catalog.text AS index, a.attnum::pg_catalog.int8 AS col
FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indexrelid AND a.attnum > 0
WHERE n.nspname = $1 AND i.indkey[a.attnum - 1] = 0
  AND a.attstattarget IS DISTINCT FROM 0
ORDER BY 1, 2";

/// Sets the statistics target of every expression column of the handler's
/// indexes to 0 (on the handler's own login, their owner); returns how many
/// it set. Nothing on SQLite, which analyzes only when asked.
pub(crate) async fn skip_expressions_in(tx: &mut Tx, handler: &str) -> Result<usize, DbError> {
    if tx.backend() != Backend::Postgres {
        return Ok(0);
    }
    let schema = handler_schema(handler);
    let rows = tx
        .query(POSTGRES_ANALYZED_EXPRESSIONS, &[schema.as_str().into()])
        .await?;
    let mut set = 0;
    for row in rows {
        let mut c = super::super::columns::Columns::new("index expression row", row);
        let (index, column) = (c.text("index")?, c.int("col")?);
        let (schema, index) = (quote_ident(&schema), quote_ident(&index));
        tx.execute(
            &format!("ALTER INDEX {schema}.{index} ALTER COLUMN {column} SET STATISTICS 0"),
            &[],
        )
        .await?;
        set += 1;
    }
    Ok(set)
}
