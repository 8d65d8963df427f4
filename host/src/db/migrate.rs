//! Applying a handler's own SQL migrations.
//!
//! A handler ships a folder of `NNNN_name.sql` files. Each runs once, in
//! version order, in its own transaction together with its record in
//! `handler_migrations`; a file that changed after it was applied is an error,
//! never silently skipped. (The host's tables use sqlx's migrator instead:
//! sqlx keeps one history table per database, which handlers cannot share.)

use super::{Backend, Database, DbError, SqlValue, handler_schema, now_ms};
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

/// Applies every migration in `dir` that `handler` has not applied yet; returns how many ran.
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
        if db.backend() == Backend::Postgres {
            let schema = handler_schema(handler);
            tx.execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"), &[])
                .await?;
        }
        tx.enter_handler_scope(handler).await?;
        tx.execute_script(&sql).await.map_err(|e| {
            DbError::HandlerMigration(format!(
                "migration {} of handler {handler} failed: {e}",
                file.name
            ))
        })?;
        tx.leave_handler_scope().await?;
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
        db.query("SELECT a, b FROM t", &[]).await.unwrap();
        std::fs::write(dir.path().join("0001_init.sql"), "CREATE TABLE t (a INTEGER);").unwrap();
        let err = apply_handler(&db, "h", dir.path()).await.unwrap_err();
        assert!(err.to_string().contains("changed after it was applied"), "{err}");
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
