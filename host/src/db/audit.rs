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

/// Every object that runs code and that neither the host nor the walls allow.
pub async fn planted_code(db: &Database) -> Result<Vec<String>, DbError> {
    let sql = match db.backend() {
        Backend::Sqlite => SQLITE_PLANTED,
        Backend::Postgres => POSTGRES_PLANTED,
    };
    db.query(sql, &[])
        .await?
        .into_iter()
        .map(|row| Ok(Columns::new("planted object", row).text("name")?))
        .collect()
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
}
