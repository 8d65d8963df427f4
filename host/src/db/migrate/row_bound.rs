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
//! SQLite bounds every value and row inside the walls as it is written
//! (`SQLITE_LIMIT_LENGTH`, `sandbox::authorizer`), but nothing bounds what
//! was written before: rows under a larger limit, or by a migration (at
//! 1 MiB), outlast a lower one, and the guard's SQLite bounds count every
//! value at the limit (the twenty-third read: rows of 8 MiB read under a
//! limit of 137 KB made one statement's copies 60 times what the guard
//! counted). So SQLite records the longest row a handler's tables may hold
//! (`handler_row_bounds`), and its statements are counted at that when it
//! is longer than the limit ([`sqlite_row_bound`]).

use super::{Backend, Database, DbError, SqlValue, Tx, handler_schema};
use crate::config::defaults::MAX_ROW_BYTES;
use crate::db::columns::texts;
use crate::sandbox::postgres::Hidden;

/// The row bound a handler's tables have now (the largest, if they differ;
/// the default if none has one yet): what a migration's statements are
/// counted at.
pub async fn handler_bound_in(tx: &mut Tx, handler: &str) -> Result<u64, DbError> {
    let rows = tx
        .query(
            "SELECT pg_catalog.max(pg_catalog.substring(pg_catalog.pg_get_constraintdef(k.oid),
                        '<= ([0-9]+)')::pg_catalog.int8)
               FROM pg_catalog.pg_constraint k JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = $1 AND k.conname = $2",
            &[handler_schema(handler).as_str().into(), CONSTRAINT.into()],
        )
        .await?;
    let bound = rows.first().and_then(|r| r.first()).and_then(SqlValue::as_i64);
    Ok(bound.map_or(MAX_ROW_BYTES as u64, |b| b.max(0) as u64))
}

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
    tx.lock_handler_migrations(handler).await?;
    // Each table's new bound is checked against every row, on the load path
    // with the handler's migration lock held: no longer than a migration.
    tx.execute(
        &format!(
            "SET LOCAL statement_timeout = {}",
            super::MIGRATION_TIMEOUT.as_millis()
        ),
        &[],
    )
    .await?;
    // Indexes from before the host kept expressions out of ANALYZE.
    super::statistics::skip_expressions_in(&mut tx, handler).await?;
    // A table needs its bound (re)made if it has none at `limit`. A bound
    // that is only raised needs no scan: every row already fits the lower
    // one, and every row written later is held to the new one, so it is
    // added NOT VALID (a table's rows are always within its bound, checked
    // or not). Lowering it checks every row.
    let rows = tx
        .query(
            "SELECT c.relname::pg_catalog.text,
                    (SELECT pg_catalog.max(pg_catalog.substring(pg_catalog.pg_get_constraintdef(k.oid),
                                '<= ([0-9]+)')::pg_catalog.int8)
                       FROM pg_catalog.pg_constraint k
                      WHERE k.conrelid = c.oid AND k.conname = $2) AS bound
             FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
               AND NOT EXISTS (
                 SELECT 1 FROM pg_catalog.pg_constraint k
                 WHERE k.conrelid = c.oid AND k.conname = $2
                   AND pg_catalog.pg_get_constraintdef(k.oid) = pg_catalog.format(
                     'CHECK ((octet_length((%I.*)::text) <= %s))', c.relname, $3::pg_catalog.int8)
                       || CASE WHEN k.convalidated THEN '' ELSE ' NOT VALID' END)
             ORDER BY 1",
            &[schema.as_str().into(), CONSTRAINT.into(), limit.into()],
        )
        .await?;
    let mut tables = Vec::with_capacity(rows.len());
    for row in rows {
        let mut c = crate::db::columns::Columns::new("catalog row", row);
        let (table, bound) = (c.text("relname")?, c.opt_int("bound")?);
        let raised = bound.is_some_and(|bound| bound <= limit);
        let mut sql = rebound(&schema, &table, limit);
        if raised {
            sql.push_str(" NOT VALID");
        }
        tx.execute(&sql, &[]).await.map_err(|e| {
            DbError::HandlerMigration(format!(
                "table {table} ({max_row_bytes} bytes per row, as text): {e}; raise the limit, or make its \
                 rows smaller (checking them against a lower limit may take {} s)",
                super::MIGRATION_TIMEOUT.as_secs()
            ))
        })?;
        tables.push(table);
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

/// Within a migration, right after a statement that made or changed
/// `table`: puts the bound on it again, checked against every row. Without
/// this, a table the migration made would be unbounded for the rest of it,
/// and PostgreSQL does not check a whole-row constraint again when a column
/// changes type (`ALTER ... TYPE ... USING`) or gains a default. The bound is
/// the one the table has, else the largest the handler's tables have, else
/// the default; `bound_rows` sets the handler's own when it loads.
pub async fn bound_table_in(tx: &mut Tx, handler: &str, table: &str) -> Result<(), DbError> {
    let schema = handler_schema(handler);
    let rows = tx
        .query(
            "SELECT c.relkind::pg_catalog.text,
                    (SELECT pg_catalog.max(pg_catalog.substring(pg_catalog.pg_get_constraintdef(k.oid),
                                '<= ([0-9]+)')::pg_catalog.int8)
                       FROM pg_catalog.pg_constraint k
                      WHERE k.conname = $3 AND k.conrelid = c.oid),
                    (SELECT pg_catalog.max(pg_catalog.substring(pg_catalog.pg_get_constraintdef(k.oid),
                                '<= ([0-9]+)')::pg_catalog.int8)
                       FROM pg_catalog.pg_constraint k JOIN pg_catalog.pg_class o ON o.oid = k.conrelid
                      WHERE k.conname = $3 AND o.relnamespace = c.relnamespace)
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = $2",
            &[schema.as_str().into(), table.into(), CONSTRAINT.into()],
        )
        .await?;
    let Some(row) = rows.into_iter().next() else {
        return Ok(());
    };
    if !matches!(row.first().and_then(SqlValue::as_str), Some("r" | "p")) {
        return Ok(());
    }
    let limit = row
        .get(1)
        .and_then(SqlValue::as_i64)
        .or_else(|| row.get(2).and_then(SqlValue::as_i64))
        .unwrap_or(MAX_ROW_BYTES as i64);
    tx.execute(&rebound(&schema, table, limit), &[])
        .await
        .map_err(|e| {
            DbError::HandlerMigration(format!(
                "table {table} would hold a row larger than its bound ({limit} bytes as text, \
             limits.max_row_bytes): {e}"
            ))
        })?;
    Ok(())
}

/// PostgreSQL: the work, by the statement guard's weights, that the
/// handler's own CHECK, DEFAULT, generated-column and index expressions add
/// to one row written to each of its tables (`sandbox::work`): they run
/// inside every INSERT and UPDATE, where the guard does not see them. The
/// host's own row bound is not counted: one cast of the row to text, a few
/// milliseconds at the bound, which the weights would count at 150.
pub async fn hidden_work(db: &Database, handler: &str, max_row_bytes: usize) -> Result<Hidden, DbError> {
    if db.backend() != Backend::Postgres {
        return Ok(Hidden::new());
    }
    let mut tx = db.begin().await?;
    let work = hidden_work_in(&mut tx, handler, max_row_bytes).await?;
    tx.commit().await?;
    for (table, ns) in &work {
        if *ns > crate::sandbox::work::ROW_WORK_NS {
            tracing::warn!(
                handler,
                table,
                ms = ns / 1_000_000,
                "a table's own expressions may work longer on one row than the guard allows a statement: \
                 every write to it will be refused"
            );
        }
    }
    Ok(work)
}

/// [`hidden_work`] inside `tx`.
pub async fn hidden_work_in(tx: &mut Tx, handler: &str, max_row_bytes: usize) -> Result<Hidden, DbError> {
    let mut work = Hidden::new();
    let rows = tx
        .query(
            "SELECT c.relname::pg_catalog.text, 'SELECT ' || pg_catalog.pg_get_expr(k.conbin, k.conrelid)
               FROM pg_catalog.pg_constraint k JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = $1 AND k.contype = 'c' AND k.conname <> $2
             UNION ALL
             SELECT c.relname::pg_catalog.text, 'SELECT ' || pg_catalog.pg_get_expr(d.adbin, d.adrelid)
               FROM pg_catalog.pg_attrdef d JOIN pg_catalog.pg_class c ON c.oid = d.adrelid
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = $1
             UNION ALL
             SELECT c.relname::pg_catalog.text, pg_catalog.pg_get_indexdef(i.indexrelid)
               FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indrelid
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = $1 AND (i.indexprs IS NOT NULL OR i.indpred IS NOT NULL)",
            &[handler_schema(handler).as_str().into(), CONSTRAINT.into()],
        )
        .await?;
    let row_bytes = max_row_bytes as u64;
    for row in rows {
        let (Some(table), Some(sql)) = (
            row.first().and_then(SqlValue::as_str),
            row.get(1).and_then(SqlValue::as_str),
        ) else {
            continue;
        };
        // What the guard cannot read is counted as a costly call over a
        // whole row, not as nothing.
        let sql = sql.to_owned();
        let ns = crate::sandbox::nesting::off_worker(move || {
            crate::sandbox::nesting::on_guard_stack(|| crate::sandbox::postgres::row_work_ns(&sql, row_bytes))
        })
        .await
        .unwrap_or(64 * row_bytes);
        let total: &mut u64 = work.entry(table.to_owned()).or_default();
        *total = total.saturating_add(ns);
    }
    // A write through a view runs the expressions of the tables under it,
    // and the column defaults of the views between (through views over views
    // too), where the statement names only the view: it costs what theirs
    // do. Only views PostgreSQL can write through count: a join view's
    // tables are never written through it. (Regression, the adversarial read
    // of session 8: a CHECK at the bound ran twice per row through a view.)
    let views = tx
        .query(
            "WITH RECURSIVE reads(view, rel) AS (
                 SELECT v.oid, d.refobjid
                   FROM pg_catalog.pg_class v
                   JOIN pg_catalog.pg_namespace n ON n.oid = v.relnamespace
                   JOIN pg_catalog.pg_rewrite r ON r.ev_class = v.oid
                   JOIN pg_catalog.pg_depend d ON d.objid = r.oid
                    AND d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass
                    AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
                  WHERE n.nspname = $1 AND v.relkind = 'v' AND d.refobjid <> v.oid
                    AND pg_catalog.pg_relation_is_updatable(v.oid, false) <> 0
                 UNION
                 SELECT reads.view, d.refobjid
                   FROM reads
                   JOIN pg_catalog.pg_rewrite r ON r.ev_class = reads.rel
                   JOIN pg_catalog.pg_depend d ON d.objid = r.oid
                    AND d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass
                    AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
                  WHERE d.refobjid <> reads.rel)
             SELECT DISTINCT v.relname::pg_catalog.text, t.relname::pg_catalog.text
               FROM reads
               JOIN pg_catalog.pg_class v ON v.oid = reads.view
               JOIN pg_catalog.pg_class t ON t.oid = reads.rel
              WHERE t.relkind IN ('r', 'p', 'v')",
            &[handler_schema(handler).as_str().into()],
        )
        .await?;
    let own = work.clone();
    for row in views {
        let (Some(view), Some(under)) = (
            row.first().and_then(SqlValue::as_str),
            row.get(1).and_then(SqlValue::as_str),
        ) else {
            continue;
        };
        if let Some(ns) = own.get(under).copied() {
            let total: &mut u64 = work.entry(view.to_owned()).or_default();
            *total = total.saturating_add(ns);
        }
    }
    Ok(work)
}

/// A column of the handler's tables that is a numeric without a precision,
/// if any (`CREATE TABLE ... AS SELECT 1.5` makes one, which no column
/// definition the guard reads says): its digits are what the guard's
/// numeric costs rest on.
pub async fn bare_numeric_in(tx: &mut Tx, handler: &str) -> Result<Option<String>, DbError> {
    first_name_in(
        tx,
        handler,
        "SELECT c.relname || '.' || a.attname
               FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v') AND a.attnum > 0 AND NOT a.attisdropped
                AND a.atttypid = 'pg_catalog.numeric'::pg_catalog.regtype
                AND (a.atttypmod < 0
                     -- The scale: 11 bits, two's complement, below the precision.
                     OR ((a.atttypmod - 4) & 2047) >= 1024
                     OR ((a.atttypmod - 4) & 2047) > ((a.atttypmod - 4) >> 16))
              LIMIT 1",
    )
    .await
}

/// A column of the handler's tables whose type the walls refuse (jsonb,
/// time or timetz, or an array or a domain of one), if any, as `table.column`
/// and that type: see `sandbox::postgres::JSONB_REFUSED` and `TIME_REFUSED`.
/// A table an older release let a migration make is caught here, when the
/// handler loads.
pub async fn refused_type_column_in(tx: &mut Tx, handler: &str) -> Result<Option<RefusedColumn>, DbError> {
    let found = first_name_in(
        tx,
        handler,
        "SELECT c.relname || '.' || a.attname || ' ' || b.typname::pg_catalog.text
               FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
               JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
               JOIN pg_catalog.pg_type b ON b.oid IN (t.oid, t.typelem, t.typbasetype)
              WHERE n.nspname = $1 AND a.attnum > 0 AND NOT a.attisdropped
                AND b.oid IN ('pg_catalog.jsonb'::pg_catalog.regtype, 'pg_catalog.time'::pg_catalog.regtype,
                              'pg_catalog.timetz'::pg_catalog.regtype)
              LIMIT 1",
    )
    .await?;
    Ok(found.map(|found| {
        let (column, type_name) = found.rsplit_once(' ').unwrap_or((&found, ""));
        RefusedColumn {
            column: column.to_owned(),
            type_name: type_name.to_owned(),
        }
    }))
}

/// A column whose type the walls refuse (see [`refused_type_column_in`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedColumn {
    /// `table.column`.
    pub column: String,
    /// `jsonb`, `time` or `timetz`.
    pub type_name: String,
}

impl std::fmt::Display for RefusedColumn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match self.type_name.as_str() {
            "jsonb" => crate::sandbox::postgres::JSONB_REFUSED,
            _ => crate::sandbox::postgres::TIME_REFUSED,
        };
        write!(f, "column {} is {}: {why}", self.column, self.type_name)
    }
}

/// A view of the handler's with a CHECK OPTION, if any: its condition (and,
/// cascaded, the conditions of the views under it) runs on every row written
/// through it, work no statement shows the guard. Read from the catalog, not
/// the migration's text, so no spelling of the option (`WITH CHECK OPTION`,
/// `WITH (check_option = ...)`, `ALTER VIEW ... SET`) gets past it.
pub async fn check_option_view_in(tx: &mut Tx, handler: &str) -> Result<Option<String>, DbError> {
    first_name_in(
        tx,
        handler,
        "SELECT c.relname::pg_catalog.text
               FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = $1 AND c.relkind = 'v'
                AND EXISTS (SELECT 1 FROM pg_catalog.unnest(c.reloptions) o
                             WHERE o OPERATOR(pg_catalog.~~) 'check_option=%')
              LIMIT 1",
    )
    .await
}

/// A table or view of the handler's named like one of PostgreSQL's own
/// types (`text`, `int4`), if any: its row type would shadow that type on the
/// handler's session, whose search path puts the handler's schema first, and
/// every cast to that name there (the host's row bound among them) would mean
/// the row type instead.
/// Also any name a guest's cast may name (`walk::CAST_TYPES`), some of which
/// are no type of PostgreSQL's (`blob`, SQLite's): a table of that name made
/// the cast one to its row type (the seventeenth adversarial read).
pub async fn type_named_relation_in(tx: &mut Tx, handler: &str) -> Result<Option<String>, DbError> {
    // The host's own constants, lower-case words: safe inline.
    let cast_names: Vec<String> = crate::sandbox::walk::CAST_TYPES
        .iter()
        .map(|t| format!("'{t}'"))
        .collect();
    let sql = format!(
        "SELECT c.relname::pg_catalog.text
           FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = $1
            AND (c.relname IN ({})
                 OR EXISTS (SELECT 1 FROM pg_catalog.pg_type t
                             WHERE t.typnamespace = 'pg_catalog'::pg_catalog.regnamespace
                               AND t.typname = c.relname))
          LIMIT 1",
        cast_names.join(", ")
    );
    first_name_in(tx, handler, &sql).await
}

/// [`refused_type_column_in`] in a transaction of its own; `None` on SQLite.
pub async fn refused_type_column(db: &Database, handler: &str) -> Result<Option<RefusedColumn>, DbError> {
    if db.backend() != Backend::Postgres {
        return Ok(None);
    }
    let mut tx = db.begin().await?;
    let column = refused_type_column_in(&mut tx, handler).await?;
    tx.commit().await?;
    Ok(column)
}

/// The statement that (re)places the bound on a table, checked against every row.
fn rebound(schema: &str, table: &str, limit: i64) -> String {
    let name = crate::db::quote_ident(table);
    format!(
        "ALTER TABLE {schema}.{name} DROP CONSTRAINT IF EXISTS {CONSTRAINT}, \
         ADD CONSTRAINT {CONSTRAINT} CHECK (octet_length(({name}.*)::text) <= {limit})"
    )
}

/// The first name `sql` reads from the catalog for the handler's schema (`$1`), if any.
async fn first_name_in(tx: &mut Tx, handler: &str, sql: &str) -> Result<Option<String>, DbError> {
    let rows = tx.query(sql, &[handler_schema(handler).as_str().into()]).await?;
    Ok(texts(rows, "catalog row", "name")?.into_iter().next())
}

/// SQLite: the longest row `handler`'s tables may hold, as recorded.
pub async fn sqlite_recorded_in(tx: &mut Tx, handler: &str) -> Result<Option<u64>, DbError> {
    let rows = tx
        .query(
            "SELECT max_row_bytes FROM handler_row_bounds WHERE handler = $1",
            &[handler.into()],
        )
        .await?;
    Ok(rows
        .first()
        .and_then(|r| r.first())
        .and_then(SqlValue::as_i64)
        .map(|b| b.max(0) as u64))
}

/// SQLite: records that `handler`'s tables may hold rows of `bytes` (a
/// longer record is kept).
pub async fn sqlite_raise_in(tx: &mut Tx, handler: &str, bytes: u64) -> Result<(), DbError> {
    let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
    tx.execute(
        "INSERT INTO handler_row_bounds (handler, max_row_bytes) VALUES ($1, $2)
         ON CONFLICT (handler) DO UPDATE SET max_row_bytes = max(max_row_bytes, excluded.max_row_bytes)",
        &[handler.into(), bytes.into()],
    )
    .await
    .map(drop)
}

/// SQLite: the longest row `handler`'s tables may hold, which the statement
/// guard counts its statements at when it is longer than `limit`
/// (`Guard::with_stored_row_bytes`). A recorded bound at or below the limit
/// becomes the limit (every row written from now on is held to it). One
/// above it, or none, is measured by reading every row of its tables, but
/// only when `settled` (no other version of the handler runs in this
/// process: its first load here, as at start-up), since a version running
/// meanwhile under a larger limit could write longer rows after the read;
/// otherwise it stays. Reading takes no write lock.
pub async fn sqlite_row_bound(
    db: &Database,
    handler: &str,
    limit: usize,
    tables: &[String],
    settled: bool,
) -> Result<usize, DbError> {
    let limit = limit as u64;
    let mut tx = db.begin().await?;
    let recorded = sqlite_recorded_in(&mut tx, handler).await?;
    let (bound, measured) = match recorded {
        Some(recorded) if recorded <= limit => (limit, false),
        Some(recorded) if !settled => (recorded, false),
        _ => (longest_row_in(&mut tx, tables).await?.max(limit), true),
    };
    tx.commit().await?;
    let mut tx = db.begin_write().await?;
    if measured && settled {
        tx.execute(
            "INSERT INTO handler_row_bounds (handler, max_row_bytes) VALUES ($1, $2)
             ON CONFLICT (handler) DO UPDATE SET max_row_bytes = excluded.max_row_bytes",
            &[handler.into(), i64::try_from(bound).unwrap_or(i64::MAX).into()],
        )
        .await?;
    } else {
        sqlite_raise_in(&mut tx, handler, bound).await?;
    }
    tx.commit().await?;
    Ok(usize::try_from(bound).unwrap_or(usize::MAX))
}

/// SQLite: the most bytes the values of one row hold, over `tables` (views
/// aside: they read tables).
async fn longest_row_in(tx: &mut Tx, tables: &[String]) -> Result<u64, DbError> {
    let quote = |name: &str| format!("\"{}\"", name.replace('"', "\"\""));
    let mut longest = 0u64;
    for table in tables {
        let kind = tx
            .query(
                "SELECT type FROM sqlite_schema WHERE name = $1",
                &[table.as_str().into()],
            )
            .await?;
        if kind.first().and_then(|r| r.first()).and_then(SqlValue::as_str) != Some("table") {
            continue;
        }
        // `xinfo`: generated columns too (`table_info` leaves them out, and
        // a STORED one is stored: 63 copies of one column made 8 MiB rows
        // that a measure of the first column alone took for 127 KiB, the
        // twenty-fourth read).
        let columns = tx
            .query(
                "SELECT name FROM pragma_table_xinfo($1)",
                &[table.as_str().into()],
            )
            .await?;
        let lengths: Vec<String> = columns
            .iter()
            .filter_map(|r| r.first().and_then(SqlValue::as_str))
            .map(|c| format!("coalesce(octet_length({}), 0)", quote(c)))
            .collect();
        if lengths.is_empty() {
            continue;
        }
        let sql = format!("SELECT max({}) FROM {}", lengths.join(" + "), quote(table));
        let rows = tx.query(&sql, &[]).await?;
        let row = rows.first().and_then(|r| r.first()).and_then(SqlValue::as_i64);
        longest = longest.max(row.unwrap_or(0).max(0) as u64);
    }
    Ok(longest)
}
