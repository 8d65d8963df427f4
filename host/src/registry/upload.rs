//! Accepting an uploaded handler version: everything is checked before
//! anything changes, and what changes, changes in one transaction.
//!
//! Order: the settings and the name; the size; the component (compiled, so
//! the compile cache is warm for every loader on this machine, and linked
//! against this host's world, so a missing export or a forbidden import is
//! named now and not at the first event); the migrations' names. Then one
//! transaction applies the new migrations inside the handler's walls and
//! stores the version as the active one. A failed upload leaves the tables,
//! the versions and the running handler as they were (its PostgreSQL role
//! and empty schema, created idempotently first, may stay).

use super::store::{self, NewVersion};
use crate::config::HandlerConfig;
use crate::db::migrate::{self, Migration};
use crate::db::{Database, DbError};
use crate::wasm::{HandlerComponent, WasmEngine};
use sha2::{Digest, Sha256};

/// One upload, as the API received it.
pub struct Upload {
    pub name: String,
    pub component: Vec<u8>,
    /// JSON: the keys of a `[[handlers]]` entry but name, component, migrations.
    pub settings: String,
    /// `(file name, SQL)`, the file names being `NNNN_description.sql`.
    pub migrations: Vec<(String, String)>,
    /// The token's name.
    pub uploaded_by: String,
}

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// Bad settings, component or migrations: nothing changed.
    #[error("{0}")]
    Invalid(String),
    #[error("the component is {size} bytes; the limit is {limit} (admin.max_component_mb)")]
    TooLarge { size: usize, limit: usize },
    #[error("handler {0} is defined in the configuration file; remove it there to manage it through the API")]
    ConfigOwned(String),
    #[error("database: {0}")]
    Database(DbError),
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Uploaded {
    pub name: String,
    pub version: i64,
    pub sha256: String,
}

pub async fn upload(
    db: &Database,
    engine: &WasmEngine,
    config_handlers: &[String],
    max_component_bytes: usize,
    upload: Upload,
) -> Result<Uploaded, UploadError> {
    let name = upload.name.as_str();
    if config_handlers.iter().any(|h| h == name) {
        return Err(UploadError::ConfigOwned(name.to_owned()));
    }
    HandlerConfig::from_settings(name, &upload.settings).map_err(|e| UploadError::Invalid(e.to_string()))?;
    if upload.component.len() > max_component_bytes {
        return Err(UploadError::TooLarge {
            size: upload.component.len(),
            limit: max_component_bytes,
        });
    }
    let migrations = upload
        .migrations
        .into_iter()
        .map(|(file, sql)| Migration::new(&file, sql))
        .collect::<Result<Vec<_>, _>>()
        .and_then(migrate::in_order)
        .map_err(|e| UploadError::Invalid(e.to_string()))?;
    // Compiling a Python or JavaScript component takes seconds: off the async workers.
    let component = std::sync::Arc::new(upload.component);
    let checked = {
        let (engine, name, component) = (engine.clone(), name.to_owned(), component.clone());
        tokio::task::spawn_blocking(move || {
            HandlerComponent::check(&engine, &name, "the uploaded component", &component)
        })
        .await
        .map_err(|e| UploadError::Invalid(format!("checking the component failed: {e}")))?
    };
    checked.map_err(|e| UploadError::Invalid(e.to_string()))?;
    let sha256 = format!("{:x}", Sha256::digest(&*component));

    migrate::prepare_handler(db, name)
        .await
        .map_err(UploadError::Database)?;
    let mut tx = db.begin_immediate().await.map_err(UploadError::Database)?;
    for migration in &migrations {
        migrate::apply_one(&mut tx, name, migration)
            .await
            .map_err(|e| match e {
                DbError::HandlerMigration(_) => UploadError::Invalid(e.to_string()),
                other => UploadError::Database(other),
            })?;
    }
    let new = NewVersion {
        name,
        sha256: &sha256,
        component: &component,
        settings: &upload.settings,
        migrations: &migrations,
        uploaded_by: &upload.uploaded_by,
    };
    let version = store::insert_version(&mut tx, &new)
        .await
        .map_err(UploadError::Database)?;
    tx.commit().await.map_err(UploadError::Database)?;
    tracing::info!(
        handler = name,
        version,
        sha256,
        by = upload.uploaded_by,
        "handler version uploaded"
    );
    Ok(Uploaded {
        name: name.to_owned(),
        version,
        sha256,
    })
}
