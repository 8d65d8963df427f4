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
use std::path::{Path, PathBuf};

struct MigrationFile {
    version: i64,
    name: String,
    path: PathBuf,
}

fn list(dir: &Path) -> Result<Vec<MigrationFile>, DbError> {
    let err = |m: String| DbError::HandlerMigration(m);
    let entries = std::fs::read_dir(dir)
        .map_err(|e| err(format!("cannot read migrations folder {}: {e}", dir.display())))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| err(e.to_string()))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("sql") {
            continue;
        }
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        let digits: String = stem.chars().take_while(char::is_ascii_digit).collect();
        let version = digits.parse::<i64>().map_err(|_| {
            err(format!(
                "migration {} must be named NNNN_description.sql (a version number first)",
                path.display()
            ))
        })?;
        files.push(MigrationFile {
            version,
            name: stem,
            path,
        });
    }
    files.sort_by_key(|f| f.version);
    if let Some(pair) = files.windows(2).find(|w| w[0].version == w[1].version) {
        return Err(err(format!(
            "migrations {} and {} share version {}",
            pair[0].name, pair[1].name, pair[0].version
        )));
    }
    Ok(files)
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

/// Applies every migration in `dir` that `handler` has not applied yet; returns how many ran.
/// Each runs inside the handler's walls (its role, or the SQLite authorizer in
/// migration mode), so a migration cannot reach the host's tables either.
pub async fn apply_handler(db: &Database, handler: &str, dir: &Path) -> Result<usize, DbError> {
    let mut applied = 0;
    for file in list(dir)? {
        let sql = std::fs::read_to_string(&file.path)
            .map_err(|e| DbError::HandlerMigration(format!("cannot read {}: {e}", file.path.display())))?;
        let checksum = format!("{:x}", Sha256::digest(sql.as_bytes()));
        let mut tx = db.begin().await?;
        tx.lock_migrations().await?;
        let existing = tx
            .query(
                "SELECT checksum FROM handler_migrations WHERE handler = $1 AND version = $2",
                &[handler.into(), file.version.into()],
            )
            .await?;
        if let Some(row) = existing.first() {
            if row.first().and_then(SqlValue::as_str) != Some(checksum.as_str()) {
                return Err(DbError::HandlerMigration(format!(
                    "migration {} of handler {handler} changed after it was applied; add a new migration instead",
                    file.name
                )));
            }
            continue;
        }
        let before = sqlite_tables(&mut tx).await?;
        tx.enter_handler_scope(handler, Scope::Migration).await?;
        let outcome = tx.execute_script(&sql).await;
        tx.leave_handler_scope().await?;
        outcome.map_err(|e| {
            DbError::HandlerMigration(format!(
                "migration {} of handler {handler} failed: {e}",
                file.name
            ))
        })?;
        for table in sqlite_tables(&mut tx)
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
            &[handler.into(), file.version.into(), file.name.as_str().into(), checksum.into(), now_ms().into()],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(handler, migration = %file.name, "applied handler migration");
        applied += 1;
    }
    Ok(applied)
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
