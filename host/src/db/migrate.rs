//! Applying a handler's own SQL migrations.
//!
//! A handler ships a folder of `NNNN_name.sql` files. Each runs once, in
//! version order, in its own transaction together with its record in
//! `handler_migrations`; a file that changed after it was applied is an error,
//! never silently skipped. (The host's tables use sqlx's migrator instead:
//! sqlx keeps one history table per database, which handlers cannot share.)

use super::{Backend, Database, DbError, SqlValue, Tx, handler_role, handler_schema, now_ms};
use crate::sandbox::authorizer::Scope;
use sha2::{Digest, Sha256};
use std::path::Path;

/// One of a handler's migrations: `NNNN_description.sql` and its SQL.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Migration {
    pub version: i64,
    pub name: String,
    pub sql: String,
}

impl Migration {
    /// Reads a migration from its file name (`NNNN_description.sql`) and text.
    pub fn new(file_name: &str, sql: String) -> Result<Self, DbError> {
        let stem = file_name.strip_suffix(".sql").unwrap_or(file_name);
        let digits: String = stem.chars().take_while(char::is_ascii_digit).collect();
        let version = digits.parse::<i64>().map_err(|_| {
            DbError::HandlerMigration(format!(
                "migration {file_name} must be named NNNN_description.sql (a version number first)"
            ))
        })?;
        Ok(Self {
            version,
            name: stem.to_owned(),
            sql,
        })
    }
}

/// Sorts migrations by version, refusing two with the same one.
pub fn in_order(mut migrations: Vec<Migration>) -> Result<Vec<Migration>, DbError> {
    migrations.sort_by_key(|m| m.version);
    if let Some(pair) = migrations.windows(2).find(|w| w[0].version == w[1].version) {
        return Err(DbError::HandlerMigration(format!(
            "migrations {} and {} share version {}",
            pair[0].name, pair[1].name, pair[0].version
        )));
    }
    Ok(migrations)
}

/// The `.sql` files of a migrations folder, in version order.
pub fn read_dir(dir: &Path) -> Result<Vec<Migration>, DbError> {
    let err = |m: String| DbError::HandlerMigration(m);
    let entries = std::fs::read_dir(dir)
        .map_err(|e| err(format!("cannot read migrations folder {}: {e}", dir.display())))?;
    let mut migrations = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| err(e.to_string()))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("sql") {
            continue;
        }
        let file_name = path.file_name().and_then(|s| s.to_str()).unwrap_or_default();
        let sql = std::fs::read_to_string(&path)
            .map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
        migrations.push(Migration::new(file_name, sql)?);
    }
    in_order(migrations)
}

/// Tables and views in an SQLite database (empty on PostgreSQL, where a
/// handler's tables are simply those in its schema).
async fn sqlite_tables(tx: &mut Tx) -> Result<Vec<String>, DbError> {
    if tx.backend() != Backend::Sqlite {
        return Ok(Vec::new());
    }
    let rows = tx
        .query(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')",
            &[],
        )
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| r.first().and_then(SqlValue::as_str).map(str::to_owned))
        .collect())
}

/// Gives a handler its walls before anything of it runs. PostgreSQL: a role
/// (NOLOGIN, no privileges on the host's schema) that owns the handler's
/// schema; the host's user joins it so it can `SET LOCAL ROLE`. Idempotent,
/// and safe when several hosts (or databases on one server) do it at once.
pub async fn prepare_handler(db: &Database, handler: &str) -> Result<(), DbError> {
    if db.backend() != Backend::Postgres {
        return Ok(());
    }
    let (role, schema) = (handler_role(handler), handler_schema(handler));
    let mut tx = db.begin().await?;
    tx.lock_migrations().await?;
    // Roles are shared by every database on the server, so another database's
    // host may create the same one concurrently: that is not an error.
    let create_role = format!(
        "DO $$ BEGIN CREATE ROLE {role} NOLOGIN; \
         EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
    );
    tx.execute(&create_role, &[]).await?;
    let join_role = format!(
        "DO $$ BEGIN IF NOT pg_has_role(current_user, '{role}', 'MEMBER') THEN \
         EXECUTE format('GRANT {role} TO %I', current_user); END IF; END $$"
    );
    tx.execute(&join_role, &[]).await?;
    tx.execute(
        &format!("CREATE SCHEMA IF NOT EXISTS {schema} AUTHORIZATION {role}"),
        &[],
    )
    .await?;
    tx.commit().await
}

/// The tables a handler's SQL may touch: what its migrations created.
pub async fn own_tables(db: &Database, handler: &str) -> Result<Vec<String>, DbError> {
    let rows = match db.backend() {
        Backend::Sqlite => {
            db.query(
                "SELECT table_name FROM handler_tables WHERE handler = $1",
                &[handler.into()],
            )
            .await?
        }
        Backend::Postgres => {
            db.query(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = $1
                 UNION SELECT viewname::text FROM pg_views WHERE schemaname = $1",
                &[handler_schema(handler).into()],
            )
            .await?
        }
    };
    Ok(rows
        .into_iter()
        .filter_map(|r| r.first().and_then(SqlValue::as_str).map(str::to_owned))
        .collect())
}

/// Applies every migration in `dir` that `handler` has not applied yet, each
/// in its own transaction; returns how many ran.
pub async fn apply_handler(db: &Database, handler: &str, dir: &Path) -> Result<usize, DbError> {
    let mut applied = 0;
    for migration in read_dir(dir)? {
        let mut tx = db.begin_immediate().await?;
        if apply_one(&mut tx, handler, &migration).await? {
            applied += 1;
        }
        tx.commit().await?;
    }
    Ok(applied)
}

/// Applies `migration` inside `tx` unless `handler` already has it; `false`:
/// it was already applied. It runs inside the handler's walls (its role, or
/// the SQLite authorizer in migration mode), so a migration cannot reach the
/// host's tables either.
pub async fn apply_one(tx: &mut Tx, handler: &str, migration: &Migration) -> Result<bool, DbError> {
    let checksum = format!("{:x}", Sha256::digest(migration.sql.as_bytes()));
    tx.lock_migrations().await?;
    let existing = tx
        .query(
            "SELECT checksum FROM handler_migrations WHERE handler = $1 AND version = $2",
            &[handler.into(), migration.version.into()],
        )
        .await?;
    if let Some(row) = existing.first() {
        if row.first().and_then(SqlValue::as_str) != Some(checksum.as_str()) {
            return Err(DbError::HandlerMigration(format!(
                "migration {} of handler {handler} changed after it was applied; add a new migration instead",
                migration.name
            )));
        }
        return Ok(false);
    }
    let before = sqlite_tables(tx).await?;
    tx.enter_handler_scope(handler, Scope::Migration).await?;
    let outcome = tx.execute_script(&migration.sql).await;
    tx.leave_handler_scope().await?;
    outcome.map_err(|e| {
        DbError::HandlerMigration(format!(
            "migration {} of handler {handler} failed: {e}",
            migration.name
        ))
    })?;
    for table in sqlite_tables(tx)
        .await?
        .into_iter()
        .filter(|t| !before.contains(t))
    {
        tx.execute(
            "INSERT INTO handler_tables (handler, table_name) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[handler.into(), table.into()],
        )
        .await?;
    }
    tx.execute(
        "INSERT INTO handler_migrations (handler, version, name, checksum, applied_at) VALUES ($1, $2, $3, $4, $5)",
        &[handler.into(), migration.version.into(), migration.name.as_str().into(), checksum.into(), now_ms().into()],
    )
    .await?;
    tracing::info!(handler, migration = %migration.name, "applied handler migration");
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::memory_db;

    #[tokio::test]
    async fn applies_once_in_order_and_refuses_edits() {
        let db = memory_db().await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("0002_more.sql"),
            "ALTER TABLE t ADD COLUMN b TEXT;",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("0001_init.sql"),
            "CREATE TABLE t (a TEXT); CREATE TABLE u (c TEXT);",
        )
        .unwrap();
        assert_eq!(apply_handler(&db, "h", dir.path()).await.unwrap(), 2);
        assert_eq!(apply_handler(&db, "h", dir.path()).await.unwrap(), 0);
        let mut tables = own_tables(&db, "h").await.unwrap();
        tables.sort();
        assert_eq!(tables, ["t", "u"]);
        db.query("SELECT a, b FROM t", &[]).await.unwrap();
        std::fs::write(dir.path().join("0001_init.sql"), "CREATE TABLE t (a INTEGER);").unwrap();
        let err = apply_handler(&db, "h", dir.path()).await.unwrap_err();
        assert!(err.to_string().contains("changed after it was applied"), "{err}");
    }

    /// Regression: a trigger planted by a migration on the handler's own
    /// table must not let the handler's statements reach the host's tables.
    #[tokio::test]
    async fn a_planted_trigger_cannot_reach_the_host_tables() {
        let db = memory_db().await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("0001_sneaky.sql"),
            "CREATE TABLE t (a TEXT); CREATE TRIGGER x AFTER INSERT ON t BEGIN DELETE FROM offsets; END;",
        )
        .unwrap();
        // SQLite checks a trigger's body when a statement that fires it is prepared.
        if apply_handler(&db, "h", dir.path()).await.is_err() {
            return;
        }
        let mut tx = db.begin().await.unwrap();
        let advance = crate::db::offsets::Advance {
            handler: "h",
            topic: "t",
            partition: 0,
            expected: None,
            next_offset: 5,
            records: 5,
        };
        crate::db::offsets::advance(&mut tx, &advance).await.unwrap();
        tx.enter_handler_scope("h", Scope::Guest).await.unwrap();
        let err = tx
            .guest_execute("INSERT INTO t (a) VALUES ('x')", &[])
            .await
            .unwrap_err();
        tx.leave_handler_scope().await.unwrap();
        assert!(err.to_string().contains("not authorized"), "{err}");
        tx.commit().await.unwrap();
        assert_eq!(crate::db::offsets::load(&db, "h", "t", 0).await.unwrap(), Some(5));
    }

    #[tokio::test]
    async fn failing_migration_names_the_file_and_leaves_nothing() {
        let db = memory_db().await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("0001_bad.sql"),
            "CREATE TABLE ok (a TEXT); CREAT TABLE;",
        )
        .unwrap();
        let err = apply_handler(&db, "h", dir.path()).await.unwrap_err();
        assert!(err.to_string().contains("0001_bad"), "{err}");
        assert!(
            db.query("SELECT * FROM ok", &[]).await.is_err(),
            "the failed migration rolled back"
        );
    }
}
