//! What a handler's schema may not come to hold after a migration
//! statement, read back from the catalog (the guard reads only the
//! statement's text): a view that reads another view, on PostgreSQL more
//! than [`MAX_RELATIONS`] relations or [`MAX_MIGRATION_LOCKS`] locks held,
//! and on SQLite a foreign key to a table the handler does not own, or more
//! than [`MAX_INDEXES_PER_TABLE`] indexes on a table.

use super::super::{Backend, Database, DbError, SqlValue, Tx, handler_schema};
use crate::sandbox::sqlite_upsert::TableCalls;

/// SQLite: a foreign key of one of the handler's tables that points at a
/// table it does not own (one it dropped, which another handler may create
/// later: that handler's deletes would then have to read this table, and its
/// walls would refuse them). PostgreSQL refuses such a key by itself.
pub(super) async fn foreign_reference(tx: &mut Tx, own: &[String]) -> Result<Option<String>, DbError> {
    if tx.backend() != Backend::Sqlite {
        return Ok(None);
    }
    let rows = tx
        .query(
            "SELECT m.name, f.\"table\" FROM sqlite_master m, pragma_foreign_key_list(m.name) f WHERE m.type = 'table'",
            &[],
        )
        .await?;
    let owns = |name: &str| own.iter().any(|t| t.eq_ignore_ascii_case(name));
    for row in rows {
        let mut c = super::super::columns::Columns::new("foreign key row", row);
        let (table, target) = (c.text("name")?, c.text("table")?);
        if owns(&table) && !owns(&target) {
            return Ok(Some(format!(
                "table {table} has a foreign key to {target}, which is not one of this handler's tables"
            )));
        }
    }
    Ok(None)
}

/// A view of the handler's that reads another view: a view reads tables
/// only, on both backends, read from the catalog after each statement (which
/// also catches a view that comes to read a view by a table dropped and a
/// view made in its name). On SQLite, also a view of the handler's that reads
/// a table it does not own or one that no longer exists, and (`others`) a
/// view of another handler's that reads one of this handler's names: see
/// [`sqlite_view_names`].
///
/// SQLite expands a view inside a view by recursion while it prepares a
/// statement, with no depth bound and no deadline check: a chain of 3,500
/// overflowed the host's stack, and 2,000 took 3.5 s to prepare (the
/// seventeenth adversarial read, issue 23). On PostgreSQL the guard bounds a
/// view's own text (columns only, at most 4 relations), which views of views
/// multiply without bound, and the guard cannot tell a view from a table
/// (the third review of the eighteenth read, C4).
pub(super) async fn view_of_views(
    tx: &mut Tx,
    handler: &str,
    own: &[String],
) -> Result<Option<String>, DbError> {
    if tx.backend() == Backend::Postgres {
        return postgres_view_of_views(tx, handler).await;
    }
    sqlite_view_names(tx, own, true).await
}

/// SQLite: what is wrong with the views around the handler's names `own`.
///
/// SQLite finds a view's tables by name each time the view is used, and the
/// names of every team's tables are one set. Regression (the twenty-eighth
/// adversarial read, issue 23): `CREATE TABLE x; CREATE VIEW bv AS SELECT a
/// FROM x; DROP TABLE x` left a view pointing at nothing. Every later
/// `ALTER TABLE ... RENAME` or `DROP COLUMN` of any team (and of the host's
/// own migrations) then failed with "error in view bv", and whoever made
/// something named `x` next filled the view in: another team's view named
/// `x` made `bv` a view of views, which the start-up audit refuses for the
/// whole host; another team's table named `x` was read by the host's own
/// row-length measure of the first team, outside every wall. So a view of
/// the handler's must read only tables it owns, that exist (SQLite itself
/// prepares the view: it knows which names are the view's own CTEs), and
/// (`others`, after a migration statement) no other handler's view may read
/// a name this handler now owns.
async fn sqlite_view_names(tx: &mut Tx, own: &[String], others: bool) -> Result<Option<String>, DbError> {
    let rows = tx
        .query(
            "SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'view')",
            &[],
        )
        .await?;
    let mut objects = Vec::with_capacity(rows.len());
    for row in rows {
        let mut c = super::super::columns::Columns::new("sqlite_master row", row);
        let (kind, name) = (c.text("type")?, c.text("name")?);
        objects.push((kind == "view", name, c.opt_text("sql")?.unwrap_or_default()));
    }
    let owns = |name: &str| own.iter().any(|t| t.eq_ignore_ascii_case(name));
    let find = |name: &str| objects.iter().find(|(_, o, _)| o.eq_ignore_ascii_case(name));
    for (is_view, view, sql) in &objects {
        if !is_view {
            continue;
        }
        let Some(reads) = crate::sandbox::sqlite_work::view_reads(sql) else {
            if owns(view) {
                return Ok(Some(format!("view {view}'s definition cannot be read back")));
            }
            continue;
        };
        if !owns(view) {
            if others
                && !crate::sandbox::is_reserved(view)
                && let Some(taken) = reads.iter().find(|r| owns(r))
            {
                return Ok(Some(format!(
                    "{taken} is a name another handler's view reads: choose another name (on SQLite a \
                     view finds its tables by name, so the view would read this handler's {taken})"
                )));
            }
            continue;
        }
        // Every name it reads, not the first found (the twenty-ninth read:
        // a WHERE's subquery read a view after the FROM's own table).
        for read in reads.iter().filter_map(|r| find(r)) {
            match read {
                (true, inner, _) => {
                    return Ok(Some(format!(
                        "view {view} reads view {inner}: on SQLite a view reads tables only (SQLite expands a \
                         view inside a view by recursion while preparing a statement, where no deadline \
                         interrupts it)"
                    )));
                }
                (false, table, _) if !owns(table) => {
                    return Ok(Some(format!(
                        "view {view} reads table {table}, which is not one of this handler's tables"
                    )));
                }
                _ => {}
            }
        }
        // Names that exist are the handler's own tables now; a name that
        // exists nowhere fails SQLite's prepare (a CTE of the view's own
        // is found there, as SQLite scopes it).
        let quoted = view.replace('"', "\"\"");
        if let Err(e) = tx
            .execute_uncached(&format!("SELECT * FROM \"{quoted}\" LIMIT 0"))
            .await
        {
            return Ok(Some(format!(
                "view {view} reads a table that does not exist ({e}): drop or change the view before the \
                 tables it reads (a view left reading nothing breaks every later rename on the database, and \
                 reads whatever is made in that name next)"
            )));
        }
    }
    Ok(None)
}

/// The most bytes of schema text (`sqlite_master.sql`) a handler's tables,
/// views and indexes may hold on SQLite, together.
///
/// SQLite reads every object's text again on every connection after any
/// schema change, and keeps its literals in memory per connection: 240 MB
/// of DEFAULT literals made the first statement of a fresh connection take
/// 0.52 s (the thirtieth adversarial read, issue 23). PostgreSQL bounds a
/// table's stored expressions instead ([`MAX_STORED_EXPRESSION_BYTES`]).
pub(crate) const MAX_SQLITE_SCHEMA_BYTES: i64 = 1 << 20;

/// The longest definition a handler's view may have on SQLite, as PostgreSQL's
/// (SQLite copies it into every reference while preparing: the
/// thirty-first adversarial read, issue 23).
const MAX_SQLITE_VIEW_BYTES: usize = 8 << 10;

/// SQLite: a table or view of the handler's whose stored text today's rules
/// refuse, as the start-up audit reads it (`sandbox::sqlite_work::stored_problem`),
/// or more than [`MAX_SQLITE_SCHEMA_BYTES`] of schema text in all.
///
/// SQLite writes each ALTER TABLE into the table's stored CREATE TABLE, so
/// what each statement's own check let through could add up to a table the
/// audit refuses, and with it the next start of the whole host (the
/// thirtieth adversarial read: a CHECK at the call budget, then a column
/// with a DEFAULT). Read back after each migration statement, what a
/// migration accepts is what the audit accepts.
pub(super) async fn sqlite_stored_schema(tx: &mut Tx, own: &[String]) -> Result<Option<String>, DbError> {
    if tx.backend() != Backend::Sqlite {
        return Ok(None);
    }
    let rows = tx
        .query(
            "SELECT type, name, tbl_name, COALESCE(sql, '') AS sql FROM sqlite_master",
            &[],
        )
        .await?;
    let owns = |name: &str| own.iter().any(|t| t.eq_ignore_ascii_case(name));
    let mut objects = Vec::with_capacity(rows.len());
    for row in rows {
        let mut c = super::super::columns::Columns::new("sqlite_master row", row);
        objects.push((
            c.text("type")?,
            c.text("name")?,
            c.text("tbl_name")?,
            c.text("sql")?,
        ));
    }
    let views: Vec<String> = objects
        .iter()
        .filter(|(kind, ..)| kind == "view")
        .map(|(_, name, ..)| name.to_ascii_lowercase())
        .collect();
    let mut bytes = 0i64;
    for (kind, name, table, sql) in &objects {
        if !owns(name) && !owns(table) {
            continue;
        }
        bytes += sql.len() as i64;
        if crate::sandbox::shadows_sqlite(name) {
            return Ok(Some(format!(
                "{kind} {name} hides SQLite's own table-valued function of that name, which the host reads \
                 every handler's columns with: drop or rename it"
            )));
        }
        if kind == "view" && sql.len() > MAX_SQLITE_VIEW_BYTES {
            return Ok(Some(format!(
                "view {name}'s definition is {} bytes; at most {MAX_SQLITE_VIEW_BYTES} (SQLite copies a \
                 view's whole definition into every reference while it prepares a statement)",
                sql.len()
            )));
        }
        if (kind == "table" || kind == "view")
            && !sql.is_empty()
            && let Some(problem) = crate::sandbox::sqlite_work::stored_problem(sql, &views)
        {
            return Ok(Some(format!(
                "{kind} {name} as SQLite now stores it is refused ({problem}): what a migration leaves \
                 must pass the checks every start makes"
            )));
        }
    }
    // An index on an expression (`cid = -2`): migrations make indexes over
    // plain columns only, but with SQLite's double-quoted-string fallback on
    // (as it was before the thirty-third read) `CREATE INDEX i ON
    // t("no_such_column")` was stored as an index on a constant.
    let indexed = tx
        .query(
            "SELECT DISTINCT m.name, m.tbl_name FROM sqlite_master m, pragma_index_xinfo(m.name) x \
             WHERE m.type = 'index' AND x.cid = -2",
            &[],
        )
        .await?;
    for row in indexed {
        let mut c = super::super::columns::Columns::new("index column", row);
        let (index, table) = (c.text("name")?, c.text("tbl_name")?);
        if owns(&index) || owns(&table) {
            return Ok(Some(format!(
                "index {index} on {table} indexes an expression, not a column (a double-quoted name that \
                 matches no column is a name here, not text): index plain columns"
            )));
        }
    }
    Ok((bytes > MAX_SQLITE_SCHEMA_BYTES).then(|| {
        format!(
            "the handler's tables, views and indexes hold {bytes} bytes of schema text; at most \
             {MAX_SQLITE_SCHEMA_BYTES} (SQLite reads all of it again on every connection after any schema \
             change)"
        )
    }))
}

/// SQLite: the calls and operators in each of the handler's tables' stored
/// definitions (its CHECK, DEFAULT and generated expressions), by lower-case
/// name, for the guard to count an upsert's second run of them
/// (`sandbox::sqlite_upsert`). A definition the guard cannot read counts as
/// the whole budget: it is refused at load anyway (`sqlite_stored_schema`).
pub async fn sqlite_table_calls(db: &Database, own: &[String]) -> Result<TableCalls, DbError> {
    let mut calls = TableCalls::new();
    if db.backend() != Backend::Sqlite {
        return Ok(calls);
    }
    let mut tx = db.begin().await?;
    let rows = tx
        .query(
            "SELECT name, COALESCE(sql, '') AS sql FROM sqlite_master WHERE type = 'table'",
            &[],
        )
        .await?;
    tx.commit().await?;
    for row in rows {
        let mut c = super::super::columns::Columns::new("sqlite_master row", row);
        let (name, sql) = (c.text("name")?, c.text("sql")?);
        if !own.iter().any(|t| t.eq_ignore_ascii_case(&name)) {
            continue;
        }
        let stored = sqlparser::parser::Parser::parse_sql(&sqlparser::dialect::SQLiteDialect {}, &sql)
            .ok()
            .and_then(|statements| statements.first().map(crate::sandbox::sqlite_work::calls))
            .unwrap_or(u64::MAX);
        calls.insert(name.to_ascii_lowercase(), stored);
    }
    Ok(calls)
}

/// SQLite, when a handler loads: its views read only its own tables, that
/// exist (see [`sqlite_view_names`]; a database an older release migrated
/// may hold a view that does not).
pub(crate) async fn sqlite_own_views(tx: &mut Tx, own: &[String]) -> Result<Option<String>, DbError> {
    if tx.backend() != Backend::Sqlite {
        return Ok(None);
    }
    sqlite_view_names(tx, own, false).await
}

/// PostgreSQL: every view (plain or materialized) of a handler schema whose
/// rewrite rule depends on another view: its schema, name and the inner
/// view's name. Qualified throughout: on a handler's own session its schema
/// is first on the path.
pub(crate) const POSTGRES_VIEWS_OF_VIEWS: &str = r"
SELECT DISTINCT n.nspname::pg_catalog.text AS schema, v.relname::pg_catalog.text AS view,
    r.relname::pg_catalog.text AS inner
FROM pg_catalog.pg_class v
JOIN pg_catalog.pg_namespace n ON n.oid = v.relnamespace
JOIN pg_catalog.pg_rewrite w ON w.ev_class = v.oid
JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass
    AND d.objid = w.oid AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
JOIN pg_catalog.pg_class r ON r.oid = d.refobjid
WHERE n.nspname LIKE 'handler\_%' AND v.relkind IN ('v', 'm') AND r.relkind IN ('v', 'm')
    AND r.oid <> v.oid
ORDER BY 1, 2, 3";

async fn postgres_view_of_views(tx: &mut Tx, handler: &str) -> Result<Option<String>, DbError> {
    let schema = handler_schema(handler);
    for row in tx.query(POSTGRES_VIEWS_OF_VIEWS, &[]).await? {
        let mut c = super::super::columns::Columns::new("view dependency row", row);
        let (in_schema, view, inner) = (c.text("schema")?, c.text("view")?, c.text("inner")?);
        if in_schema == schema {
            return Ok(Some(format!(
                "view {view} reads view {inner}: a view reads tables only (the guard bounds what one \
                 view's text reads, which views of views would multiply)"
            )));
        }
    }
    Ok(None)
}

/// The most relations (tables, indexes, views, sequences) a handler's
/// schema may hold on PostgreSQL.
///
/// Regression (the nineteenth adversarial read, issue 23): every lock of
/// every session sits in one shared table (about 10,000 entries at the
/// defaults), a statement locks each index of every table it reads, and a
/// migration each index it made until it commits. 10,000 indexes on one
/// table in one migration filled it: every new connection of every team,
/// and the host's, failed with "out of shared memory". A handler's statement
/// can lock only its own relations, so this bounds its share.
pub(super) const MAX_RELATIONS: i64 = 200;

/// PostgreSQL: how many relations the handler's schema holds, if more than
/// [`MAX_RELATIONS`]. (SQLite has no shared lock table.)
async fn relations_over(tx: &mut Tx, handler: &str) -> Result<Option<i64>, DbError> {
    count_over(
        tx,
        "SELECT COUNT(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1",
        &[handler_schema(handler).into()],
        MAX_RELATIONS,
    )
    .await
}

/// The most locks a handler's migration may hold at once on PostgreSQL:
/// its relations' (with their TOAST tables and indexes) and a margin.
/// Regression (the review of the nineteenth read): locks of relations a
/// migration made and dropped again stay until it commits, which the
/// relation count after each statement never sees.
pub(super) const MAX_MIGRATION_LOCKS: i64 = 1_000;

/// PostgreSQL: how many locks this migration's transaction holds, if more
/// than [`MAX_MIGRATION_LOCKS`].
async fn locks_over(tx: &mut Tx) -> Result<Option<i64>, DbError> {
    count_over(
        tx,
        "SELECT COUNT(*) FROM pg_catalog.pg_locks WHERE pid = pg_catalog.pg_backend_pid()",
        &[],
        MAX_MIGRATION_LOCKS,
    )
    .await
}

/// The most bytes of stored expressions (index expressions and predicates,
/// CHECK constraints, defaults and generated columns, as PostgreSQL stores
/// their trees) one table of a handler may have.
///
/// Regression (the twentieth and twenty-first adversarial reads, issue 23):
/// the planner copies every index's expressions and predicate of a table
/// for each place a statement reads it, a multi-row INSERT copies a default
/// for each `DEFAULT`, every backend that opens the table keeps its CHECKs
/// (the host's own connections too), and a `coalesce(a, a, ...)` costs no
/// work the guard counts: 150 indexes of 1,500 arguments each, on a table a
/// view reads four times, made 28 reads of the view plan in 2.3 GB; 100
/// CHECKs of 30,000 arguments held 400 MB in every backend that opened the
/// table. `lower(email)` is about 300 bytes.
pub(crate) const MAX_STORED_EXPRESSION_BYTES: i64 = 32 * 1024;

/// PostgreSQL: each handler table (schema, table) and the bytes of its
/// stored expressions, in schemas matching `$1` (a LIKE pattern), where
/// those are more than `$2`.
pub(crate) const POSTGRES_STORED_EXPRESSION_BYTES: &str = r"
WITH stored (rel, bytes) AS (
    SELECT i.indrelid, COALESCE(pg_catalog.length(i.indexprs::pg_catalog.text), 0)
        + COALESCE(pg_catalog.length(i.indpred::pg_catalog.text), 0)
    FROM pg_catalog.pg_index i
    UNION ALL SELECT k.conrelid, pg_catalog.length(k.conbin::pg_catalog.text)
    FROM pg_catalog.pg_constraint k WHERE k.conbin IS NOT NULL
    UNION ALL SELECT d.adrelid, pg_catalog.length(d.adbin::pg_catalog.text) FROM pg_catalog.pg_attrdef d
)
SELECT n.nspname::pg_catalog.text AS schema, c.relname::pg_catalog.text AS table,
    SUM(s.bytes)::pg_catalog.int8 AS bytes
FROM stored s
JOIN pg_catalog.pg_class c ON c.oid = s.rel
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname LIKE $1
GROUP BY 1, 2
HAVING SUM(s.bytes) > $2
ORDER BY 1, 2";

/// PostgreSQL: the largest stored expressions of one of the handler's
/// tables, if more than [`MAX_STORED_EXPRESSION_BYTES`].
async fn stored_expressions_over(tx: &mut Tx, handler: &str) -> Result<Option<i64>, DbError> {
    if tx.backend() != Backend::Postgres {
        return Ok(None);
    }
    let params = [
        like_exactly(&handler_schema(handler)).into(),
        MAX_STORED_EXPRESSION_BYTES.into(),
    ];
    let rows = tx.query(POSTGRES_STORED_EXPRESSION_BYTES, &params).await?;
    let mut largest = None;
    for row in &rows {
        // A row this check cannot read must not pass as "within the bound".
        let bytes = row.get(2).and_then(SqlValue::as_i64).ok_or_else(|| {
            DbError::HandlerMigration(format!(
                "cannot read the size of a table's stored expressions from the catalog: {row:?}"
            ))
        })?;
        largest = largest.max(Some(bytes));
    }
    Ok(largest)
}

/// PostgreSQL: each relation (schema, name) in schemas matching `$1` (a LIKE
/// pattern) with more than `$2` columns, dropped ones counted (PostgreSQL
/// keeps their numbers, and a plan lists each: 1,536 dropped made a plan of
/// four views three times as large): see `sandbox::postgres::plan_cache`,
/// whose bound on what a session keeps rests on it.
pub(crate) const POSTGRES_WIDE_RELATIONS: &str = r"
SELECT n.nspname::pg_catalog.text AS schema, c.relname::pg_catalog.text AS relation,
    pg_catalog.count(*)::pg_catalog.int8 AS columns
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname LIKE $1 AND a.attnum > 0 AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
GROUP BY 1, 2
HAVING pg_catalog.count(*) > $2
ORDER BY 1, 2";

/// The most foreign keys a handler's schema may hold on PostgreSQL.
///
/// Regression (the second review of the twenty-second read): PostgreSQL
/// checks a foreign key with a query it prepares once per session and
/// keeps, about 37 KB each (107 KB for a 32-column key), out of the host's
/// reach and past any reset: 6,000 keys kept 221 MB in a session after one
/// event. 64 keep at most about 7 MB.
pub(crate) const MAX_FOREIGN_KEYS: i64 = 64;

/// PostgreSQL: each handler schema matching `$1` (a LIKE pattern) whose
/// tables hold more than `$2` foreign keys, with how many.
pub(crate) const POSTGRES_FOREIGN_KEYS: &str = r"
SELECT n.nspname::pg_catalog.text AS schema, pg_catalog.count(*)::pg_catalog.int8 AS keys
FROM pg_catalog.pg_constraint k
JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname LIKE $1 AND k.contype = 'f'
GROUP BY 1
HAVING pg_catalog.count(*) > $2
ORDER BY 1";

/// PostgreSQL: how many foreign keys the handler's schema holds, if more
/// than [`MAX_FOREIGN_KEYS`].
async fn foreign_keys_over(tx: &mut Tx, handler: &str) -> Result<Option<i64>, DbError> {
    let Some(mut c) = first_past(
        tx,
        POSTGRES_FOREIGN_KEYS,
        handler,
        MAX_FOREIGN_KEYS,
        "foreign key count row",
    )
    .await?
    else {
        return Ok(None);
    };
    let _schema = c.text("schema")?;
    Ok(Some(c.int("keys")?))
}

/// PostgreSQL: the first row of `sql` (whose `$1` is a schema pattern and
/// `$2` a bound) for the handler's own schema; `None` on SQLite.
async fn first_past(
    tx: &mut Tx,
    sql: &str,
    handler: &str,
    bound: i64,
    what: &'static str,
) -> Result<Option<super::super::columns::Columns>, DbError> {
    if tx.backend() != Backend::Postgres {
        return Ok(None);
    }
    let params = [like_exactly(&handler_schema(handler)).into(), bound.into()];
    let row = tx.query(sql, &params).await?.into_iter().next();
    Ok(row.map(|row| super::super::columns::Columns::new(what, row)))
}

/// The most columns of a handler's relation, as `$2` of [`POSTGRES_WIDE_RELATIONS`].
pub(crate) const MAX_COLUMNS: i64 = crate::sandbox::postgres::plan_cache::MAX_COLUMNS as i64;

/// PostgreSQL: the first of the handler's relations with more than
/// [`MAX_COLUMNS`] columns, and how many it has.
async fn wide_relation(tx: &mut Tx, handler: &str) -> Result<Option<(String, i64)>, DbError> {
    let Some(mut c) = first_past(
        tx,
        POSTGRES_WIDE_RELATIONS,
        handler,
        MAX_COLUMNS,
        "wide relation row",
    )
    .await?
    else {
        return Ok(None);
    };
    let (_schema, relation) = (c.text("schema")?, c.text("relation")?);
    Ok(Some((relation, c.int("columns")?)))
}

/// A LIKE pattern that matches `name` alone: a handler's name may hold `_`,
/// which LIKE reads as any character.
fn like_exactly(name: &str) -> String {
    name.replace('\\', "\\\\").replace('_', "\\_").replace('%', "\\%")
}

/// PostgreSQL: what the handler's schema or this migration holds past one
/// of the bounds above, in words for the refusal.
pub(super) async fn bound_broken(tx: &mut Tx, handler: &str) -> Result<Option<String>, DbError> {
    if let Some(count) = relations_over(tx, handler).await? {
        return Ok(Some(format!(
            "its schema holds {count} relations (tables, indexes, views, sequences); at most \
             {MAX_RELATIONS}: each is a lock in PostgreSQL's shared lock table whenever a statement reads it"
        )));
    }
    if let Some(count) = locks_over(tx).await? {
        return Ok(Some(format!(
            "it holds {count} locks (each relation it made, dropped or changed, until it commits); at most \
             {MAX_MIGRATION_LOCKS}: split it into several migrations"
        )));
    }
    if let Some((relation, columns)) = wide_relation(tx, handler).await? {
        return Ok(Some(format!(
            "{relation} has {columns} columns (dropped ones count: PostgreSQL keeps their numbers); a \
             handler's table or view has at most {MAX_COLUMNS} (on both backends): every plan that joins \
             it lists each of its columns once per join, and the session keeps its plans; a table that \
             dropped many is made anew (CREATE TABLE ... AS, then DROP and RENAME)"
        )));
    }
    if let Some(keys) = foreign_keys_over(tx, handler).await? {
        return Ok(Some(format!(
            "its tables hold {keys} foreign keys; at most {MAX_FOREIGN_KEYS}: PostgreSQL prepares a query \
             for each key in every session that writes the table, and keeps it"
        )));
    }
    if let Some(bytes) = stored_expressions_over(tx, handler).await? {
        return Ok(Some(format!(
            "a table's stored expressions (index expressions and predicates, CHECKs, defaults, generated \
             columns) take {bytes} bytes as PostgreSQL stores them; at most {MAX_STORED_EXPRESSION_BYTES}: \
             PostgreSQL copies them into the statements that read or write the table, and every session \
             that opens it keeps them; write shorter expressions"
        )));
    }
    Ok(None)
}

/// PostgreSQL: the count `sql` reads, if more than `bound`.
async fn count_over(tx: &mut Tx, sql: &str, params: &[SqlValue], bound: i64) -> Result<Option<i64>, DbError> {
    if tx.backend() != Backend::Postgres {
        return Ok(None);
    }
    let rows = tx.query(sql, params).await?;
    let count = rows
        .first()
        .and_then(|r| r.first())
        .and_then(SqlValue::as_i64)
        .unwrap_or(0);
    Ok((count > bound).then_some(count))
}

/// The most indexes one of a handler's tables may have on SQLite, its
/// PRIMARY KEY's and UNIQUE constraints' own (`sqlite_autoindex_*`)
/// included; and a handler holds at most [`MAX_RELATIONS`] tables, views and
/// indexes there too.
///
/// Regression (the twenty-fourth adversarial read, issue 23): SQLite walks
/// a table's whole list of indexes for each index it loads with the schema,
/// so loading it is quadratic in one table's indexes, and every connection
/// loads it again after any DDL commits, any team's: 20,000 indexes on one
/// table took 2-2.5 s per connection, 10,000 UNIQUE constraints in one
/// 188 KB CREATE TABLE 1.5 s, the writer's own reload inside the next
/// batch's first statement.
pub(crate) const MAX_INDEXES_PER_TABLE: i64 = 32;

/// SQLite: what breaks [`MAX_INDEXES_PER_TABLE`] or [`MAX_RELATIONS`] among
/// the handler's tables and views `own`, if anything.
pub(crate) async fn sqlite_schema_over(tx: &mut Tx, own: &[String]) -> Result<Option<String>, DbError> {
    if tx.backend() != Backend::Sqlite {
        return Ok(None);
    }
    let owns = |name: &str| own.iter().any(|t| t.eq_ignore_ascii_case(name));
    let rows = tx
        .query(
            "SELECT tbl_name, COUNT(*) FROM sqlite_schema WHERE type = 'index' GROUP BY tbl_name",
            &[],
        )
        .await?;
    let mut indexes = 0i64;
    for row in rows {
        let mut c = super::super::columns::Columns::new("index count row", row);
        let (table, count) = (c.text("tbl_name")?, c.int("count")?);
        if !owns(&table) {
            continue;
        }
        if count > MAX_INDEXES_PER_TABLE {
            return Ok(Some(format!(
                "table {table} has {count} indexes (its PRIMARY KEY and each UNIQUE constraint count); at \
                 most {MAX_INDEXES_PER_TABLE}: SQLite's work loading a table's schema grows with the \
                 square of its indexes, and every connection loads it again after each schema change"
            )));
        }
        indexes += count;
    }
    let relations = indexes + own.len() as i64;
    Ok((relations > MAX_RELATIONS).then(|| {
        format!(
            "the handler holds {relations} tables, views and indexes; at most {MAX_RELATIONS} (SQLite \
             loads every one with the schema on every connection, after each schema change)"
        )
    }))
}
