//! Code that a handler's migrations planted before the walls refused it.
//!
//! Today a migration can create no function, trigger, rule, operator or
//! policy (`sandbox::migration`), and a guest's statements no schema object
//! at all. A database migrated by an older host may still hold such code,
//! which would run later with whatever privileges fired it, so the host
//! looks before it starts: if any exists, it refuses to start and names each
//! object, with what to do. The host itself creates none of these.

use super::columns::Columns;
use super::{Backend, Database, DbError};

/// PostgreSQL: functions, procedures and aggregates, operators, triggers,
/// rules (other than a view's own) and row-level policies, in a handler's
/// schema or on the host's tables. (The host schema holds none of its own.)
const POSTGRES_PLANTED: &str = r"
WITH watched AS (
    SELECT oid FROM pg_namespace WHERE nspname = 'inboxd' OR nspname LIKE 'handler\_%'
)
SELECT 'function ' || p.oid::regprocedure::text FROM pg_proc p
    WHERE p.pronamespace IN (SELECT oid FROM watched)
UNION ALL SELECT 'operator ' || o.oid::regoperator::text FROM pg_operator o
    WHERE o.oprnamespace IN (SELECT oid FROM watched)
UNION ALL SELECT 'trigger ' || t.tgname || ' on ' || c.oid::regclass::text
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    WHERE NOT t.tgisinternal AND c.relnamespace IN (SELECT oid FROM watched)
UNION ALL SELECT 'rule ' || r.rulename || ' on ' || c.oid::regclass::text
    FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
    WHERE r.rulename <> '_RETURN' AND c.relnamespace IN (SELECT oid FROM watched)
UNION ALL SELECT 'policy ' || pol.polname || ' on ' || c.oid::regclass::text
    FROM pg_policy pol JOIN pg_class c ON c.oid = pol.polrelid
    WHERE c.relnamespace IN (SELECT oid FROM watched)
ORDER BY 1";

/// SQLite: every trigger (the host has none; handlers may not create them).
const SQLITE_PLANTED: &str =
    "SELECT 'trigger ' || name || ' on ' || tbl_name FROM sqlite_master WHERE type = 'trigger' ORDER BY 1";

/// SQLite: every table and view with its definition.
const SQLITE_SCHEMA: &str = "SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'view') AND sql IS NOT NULL ORDER BY name";

/// Every object that runs code and that neither the host nor the walls
/// allow; on SQLite also every handler table or view whose stored
/// expressions today's rules refuse (`sandbox::sqlite_work::stored_problem`),
/// on PostgreSQL every view of a view and every table whose index
/// expressions are past today's bound.
pub async fn planted_code(db: &Database) -> Result<Vec<String>, DbError> {
    let sql = match db.backend() {
        Backend::Sqlite => SQLITE_PLANTED,
        Backend::Postgres => POSTGRES_PLANTED,
    };
    let mut found = db
        .query(sql, &[])
        .await?
        .into_iter()
        .map(|row| Ok(Columns::new("planted object", row).text("name")?))
        .collect::<Result<Vec<String>, DbError>>()?;
    match db.backend() {
        Backend::Sqlite => found.extend(refused_schema(db).await?),
        Backend::Postgres => {
            found.extend(postgres_views_of_views(db).await?);
            found.extend(postgres_long_stored_expressions(db).await?);
            found.extend(postgres_wide_relations(db).await?);
            found.extend(postgres_many_foreign_keys(db).await?);
            found.extend(postgres_partial_indexes(db).await?);
        }
    }
    Ok(found)
}

/// PostgreSQL: tables whose index expressions today's migrations refuse
/// (the planner copies them into every statement that reads the table).
async fn postgres_long_stored_expressions(db: &Database) -> Result<Vec<String>, DbError> {
    use super::migrate::{MAX_STORED_EXPRESSION_BYTES, POSTGRES_STORED_EXPRESSION_BYTES};
    let params = ["handler\\_%".into(), MAX_STORED_EXPRESSION_BYTES.into()];
    let mut found = Vec::new();
    for row in db.query(POSTGRES_STORED_EXPRESSION_BYTES, &params).await? {
        let mut c = Columns::new("index expression row", row);
        let (schema, table, bytes) = (c.text("schema")?, c.text("table")?, c.int("bytes")?);
        found.push(format!(
            "table {schema}.{table} (its stored expressions take {bytes} bytes; at most \
             {MAX_STORED_EXPRESSION_BYTES})"
        ));
    }
    Ok(found)
}

/// PostgreSQL: relations with more columns than today's migrations allow
/// (a session keeps the plans that join them: `sandbox::postgres::plan_cache`).
async fn postgres_wide_relations(db: &Database) -> Result<Vec<String>, DbError> {
    use super::migrate::{MAX_COLUMNS, POSTGRES_WIDE_RELATIONS};
    let params = ["handler\\_%".into(), MAX_COLUMNS.into()];
    let mut found = Vec::new();
    for row in db.query(POSTGRES_WIDE_RELATIONS, &params).await? {
        let mut c = Columns::new("wide relation row", row);
        let (schema, relation, columns) = (c.text("schema")?, c.text("relation")?, c.int("columns")?);
        found.push(format!(
            "relation {schema}.{relation} (it has {columns} columns; at most {MAX_COLUMNS})"
        ));
    }
    Ok(found)
}

/// PostgreSQL: handler schemas with more foreign keys than today's
/// migrations allow (each session keeps a prepared check per key).
async fn postgres_many_foreign_keys(db: &Database) -> Result<Vec<String>, DbError> {
    use super::migrate::{MAX_FOREIGN_KEYS, POSTGRES_FOREIGN_KEYS};
    let params = ["handler\\_%".into(), MAX_FOREIGN_KEYS.into()];
    let mut found = Vec::new();
    for row in db.query(POSTGRES_FOREIGN_KEYS, &params).await? {
        let mut c = Columns::new("foreign key count row", row);
        let (schema, keys) = (c.text("schema")?, c.int("keys")?);
        found.push(format!(
            "schema {schema} (its tables hold {keys} foreign keys; at most {MAX_FOREIGN_KEYS})"
        ));
    }
    Ok(found)
}

/// PostgreSQL: partial indexes, which today's migrations refuse (autovacuum's
/// ANALYZE runs their predicate on every sampled row, outside any deadline:
/// `db::migrate::statistics`).
async fn postgres_partial_indexes(db: &Database) -> Result<Vec<String>, DbError> {
    let params = ["handler\\_%".into()];
    let mut found = Vec::new();
    for row in db
        .query(super::migrate::POSTGRES_PARTIAL_INDEXES, &params)
        .await?
    {
        let mut c = Columns::new("partial index row", row);
        let (schema, index) = (c.text("schema")?, c.text("index")?);
        found.push(format!(
            "index {schema}.{index} (a partial index: ANALYZE runs its predicate outside any deadline; \
             drop it, or index every row)"
        ));
    }
    Ok(found)
}

/// PostgreSQL: views of views, which today's migrations refuse (the guard
/// bounds what one view's text reads; views of views multiply it).
async fn postgres_views_of_views(db: &Database) -> Result<Vec<String>, DbError> {
    let rows = db.query(super::migrate::POSTGRES_VIEWS_OF_VIEWS, &[]).await?;
    let mut found = Vec::with_capacity(rows.len());
    for row in rows {
        let mut c = Columns::new("view dependency row", row);
        let (schema, view, inner) = (c.text("schema")?, c.text("view")?, c.text("inner")?);
        found.push(format!(
            "view {schema}.{view} (it reads view {inner}; a view reads tables only)"
        ));
    }
    Ok(found)
}

/// SQLite: the handlers' tables and views that today's rules refuse.
async fn refused_schema(db: &Database) -> Result<Vec<String>, DbError> {
    let mut objects = Vec::new();
    for row in db.query(SQLITE_SCHEMA, &[]).await? {
        let mut c = Columns::new("sqlite_master row", row);
        objects.push((c.text("type")?, c.text("name")?, c.text("sql")?));
    }
    let views: Vec<String> = objects
        .iter()
        .filter(|(kind, ..)| kind == "view")
        .map(|(_, name, _)| name.to_ascii_lowercase())
        .collect();
    let handlers = objects
        .iter()
        .filter(|(_, name, _)| !crate::sandbox::is_reserved(name));
    let mut refused: Vec<String> = objects
        .iter()
        .filter(|(_, name, _)| crate::sandbox::shadows_sqlite(name))
        .map(|(kind, name, _)| {
            format!("{kind} {name} (it hides SQLite's own table-valued function of that name)")
        })
        .collect();
    for (kind, name, sql) in handlers {
        if let Some(problem) = crate::sandbox::sqlite_work::stored_problem(sql, &views) {
            refused.push(format!("{kind} {name} ({problem})"));
        }
    }
    Ok(refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::sqlite_db;

    #[tokio::test]
    async fn a_trigger_left_by_an_older_host_is_found() {
        let db = sqlite_db().await;
        assert_eq!(planted_code(&db).await.unwrap(), Vec::<String>::new());
        let mut tx = db.begin().await.unwrap();
        tx.execute(
            "CREATE TRIGGER sneaky AFTER INSERT ON handlers BEGIN DELETE FROM offsets; END",
            &[],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(planted_code(&db).await.unwrap(), ["trigger sneaky on handlers"]);
    }

    /// Regression (the seventeenth adversarial read, issue 23): what an
    /// older host let a migration make, and today's rules refuse, is found
    /// at start: a stored expression runs where neither wall looks.
    #[tokio::test]
    async fn handler_schema_that_todays_rules_refuse_is_found() {
        let db = sqlite_db().await;
        let mut tx = db.begin().await.unwrap();
        for sql in [
            "CREATE TABLE ok_t (id INTEGER PRIMARY KEY, a TEXT)",
            "CREATE VIEW ok_v AS SELECT a FROM ok_t",
            "CREATE TABLE j (a TEXT CHECK (a -> '$' IS NOT NULL OR 1))",
            "CREATE TABLE g (a TEXT, b TEXT AS (upper(a)))",
            "CREATE TABLE s (id INTEGER PRIMARY KEY AUTOINCREMENT)",
            "CREATE VIEW vv AS SELECT a FROM ok_v",
        ] {
            tx.execute(sql, &[]).await.unwrap();
        }
        tx.commit().await.unwrap();
        let found = planted_code(&db).await.unwrap();
        let names: Vec<&str> = found.iter().map(|f| f.split(" (").next().unwrap()).collect();
        assert_eq!(names, ["table g", "table j", "table s", "view vv"], "{found:?}");
        assert!(found[1].contains("JSON"), "{found:?}");
    }
}
