//! Accepting an uploaded handler version: everything is checked before
//! anything changes, and what changes, changes in one transaction.
//!
//! Order: the settings and the name; the token's ceilings and allowlists;
//! the size; the component (compiled, so the compile cache is warm for every
//! loader on this machine, and linked against this host's world, so a
//! missing export or a forbidden import is named now and not at the first
//! event); the migrations' names. Then one transaction checks that no other
//! handler uses the consumer group, applies the new migrations inside the
//! handler's walls and stores the version as the active one. A failed upload
//! leaves the tables, the versions and the running handler as they were (its
//! PostgreSQL role and empty schema, created idempotently first, may stay).
//!
//! Activating a stored version (activate, rollback) passes [`admit`] too:
//! the caller's ceilings may have been lowered since the upload, and the
//! version's group may have been taken by another handler meanwhile.

use super::store::{self, NewVersion};
use crate::config::{HandlerConfig, Refused, TokenPolicy};
use crate::db::migrate::{self, Migration};
use crate::db::{Backend, Database, DbError, Tx};
use crate::wasm::{HandlerComponent, WasmEngine};
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicU64, Ordering};

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

/// What an upload is checked against besides itself.
pub struct Rules<'a> {
    /// The configuration file's handlers: their names are not the API's, their groups are taken.
    pub config_handlers: &'a [HandlerConfig],
    pub max_component_bytes: usize,
    /// The calling token's ceilings and allowlists.
    pub policy: &'a TokenPolicy,
    /// Set, however the upload ends, to the milliseconds its admission and
    /// migrations held what other work waits for (SQLite's only writer,
    /// PostgreSQL's deployments lock): what the admin API charges the token
    /// for (see `admin::upload_turns`).
    pub writer_held_ms: Option<&'a AtomicU64>,
}

/// Stores the time since its making into `out` when dropped: on every way
/// out of an upload, refusals included.
struct HeldFor<'a> {
    since: std::time::Instant,
    out: &'a AtomicU64,
}

impl Drop for HeldFor<'_> {
    fn drop(&mut self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.out.store(ms, Ordering::Relaxed);
    }
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
    /// Over a ceiling or outside an allowlist of the token: nothing changed.
    #[error("{0}")]
    Forbidden(Refused),
    /// The consumer group is another handler's: nothing changed.
    #[error("{0}")]
    GroupTaken(String),
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
    rules: &Rules<'_>,
    upload: Upload,
) -> Result<Uploaded, UploadError> {
    let name = upload.name.as_str();
    let max_component_bytes = rules.max_component_bytes;
    if rules.config_handlers.iter().any(|h| h.name == name) {
        return Err(UploadError::ConfigOwned(name.to_owned()));
    }
    // Before the seconds a compile may take, and before the handler's
    // PostgreSQL role and schema are made; `admit` checks again, inside the
    // transaction that stores the version.
    let config = check_settings(rules.policy, name, &upload.settings, db.backend())?;
    {
        let mut read = db.begin().await.map_err(UploadError::Database)?;
        check_group(&mut read, rules.config_handlers, &config).await?;
        check_room(&mut read, db, engine, rules.config_handlers, name).await?;
    }
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
    let _held = rules.writer_held_ms.map(|out| HeldFor {
        since: std::time::Instant::now(),
        out,
    });
    admit(
        &mut tx,
        rules.config_handlers,
        rules.policy,
        name,
        &upload.settings,
    )
    .await?;
    // Again under the deployments lock `admit` took: two uploads of new
    // handlers at once both found room before it (the forty-sixth read).
    check_room(&mut tx, db, engine, rules.config_handlers, name).await?;
    let migration_error = |e: DbError| match e {
        DbError::HandlerMigration(_) => UploadError::Invalid(e.to_string()),
        other => UploadError::Database(other),
    };
    // All of them together, however many: see `migrate::MIGRATION_TIMEOUT`.
    let deadline = std::time::Instant::now() + migrate::MIGRATION_TIMEOUT;
    if db.backend() == Backend::Postgres {
        // A team's migrations run on the handler's own login (see
        // `db::begin_migration`), so in a transaction of their own, committed
        // while this one still holds the deployments lock. If storing the
        // version then fails, they stay applied: uploading the same
        // migrations again finds them recorded and skips them.
        let mut migrating = db.begin_migration(name).await.map_err(UploadError::Database)?;
        for migration in &migrations {
            migrate::apply_within(&mut migrating, name, migration, deadline)
                .await
                .map_err(migration_error)?;
        }
        migrating.commit().await.map_err(UploadError::Database)?;
    } else {
        // One namespace for every handler's tables: names another token reserved are not this one's.
        let reserved = |table: &str| rules.policy.reserved_by_other(table).map(str::to_owned);
        for migration in &migrations {
            migrate::apply_one_reserving(&mut tx, name, migration, &reserved, deadline)
                .await
                .map_err(migration_error)?;
        }
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

/// Parses a version's settings and checks them against the token's
/// ceilings and allowlists and against what `backend` can run (no database).
/// Before anything is stored or migrated: a version its own load would refuse
/// (the forty-fourth read, issue 23) never becomes one.
fn check_settings(
    policy: &TokenPolicy,
    name: &str,
    settings: &str,
    backend: Backend,
) -> Result<HandlerConfig, UploadError> {
    let config =
        HandlerConfig::from_settings(name, settings).map_err(|e| UploadError::Invalid(e.to_string()))?;
    if backend == Backend::Sqlite
        && config.limits.max_row_bytes > crate::config::defaults::SQLITE_MAX_ROW_BYTES
    {
        return Err(UploadError::Invalid(
            crate::config::defaults::sqlite_row_bytes_refused(config.limits.max_row_bytes),
        ));
    }
    let json: serde_json::Value = serde_json::from_str(settings).expect("parsed by from_settings");
    policy.check(&config, &json).map_err(UploadError::Forbidden)?;
    Ok(config)
}

/// Whether `settings` may become handler `name`'s active version for the
/// holder of `policy`: within its ceilings and allowlists, and in a consumer
/// group no other handler uses. Takes the deployments lock in `tx`, so the
/// answer holds until `tx` ends.
pub async fn admit(
    tx: &mut Tx,
    config_handlers: &[HandlerConfig],
    policy: &TokenPolicy,
    name: &str,
    settings: &str,
) -> Result<(), UploadError> {
    let config = check_settings(policy, name, settings, tx.backend())?;
    store::lock_deployments(tx).await.map_err(UploadError::Database)?;
    check_group(tx, config_handlers, &config).await
}

/// Refuses a new handler that would leave this host's instance pool short
/// of every handler's share (see `config::instances_short`); a new version
/// of a handler it runs takes its old one's share.
async fn check_room(
    tx: &mut Tx,
    db: &Database,
    engine: &WasmEngine,
    config_handlers: &[HandlerConfig],
    name: &str,
) -> Result<(), UploadError> {
    let mut names: std::collections::BTreeSet<String> = store::active_settings(tx)
        .await
        .map_err(UploadError::Database)?
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    names.extend(config_handlers.iter().map(|h| h.name.clone()));
    names.insert(name.to_owned());
    match crate::config::instances_short(names.len(), db.calls_per_handler(), engine.instances()) {
        Some(short) => Err(UploadError::Invalid(format!(
            "handler {name} cannot be added on this host: {short}"
        ))),
        None => Ok(()),
    }
}

/// Refuses a consumer group that a config handler or another uploaded
/// handler's active version (paused ones included: they resume in it) uses.
async fn check_group(
    tx: &mut Tx,
    config_handlers: &[HandlerConfig],
    config: &HandlerConfig,
) -> Result<(), UploadError> {
    let (name, group) = (config.name.as_str(), config.group_id());
    let configured = config_handlers
        .iter()
        .filter(|h| h.name != name && h.group_id() == group)
        .map(|h| format!("handler {:?} (configuration file)", h.name));
    let uploaded = store::active_settings(tx)
        .await
        .map_err(UploadError::Database)?
        .into_iter()
        .filter(|(other, settings)| other != name && stored_group(other, settings) == group)
        .map(|(other, _)| format!("uploaded handler {other:?}"));
    let Some(holder) = configured.chain(uploaded).next() else {
        return Ok(());
    };
    let shown = match config.group_id {
        Some(_) => format!("settings.group_id = {group:?}"),
        None => format!("settings.group_id (default {group:?})"),
    };
    Err(UploadError::GroupTaken(format!(
        "{shown} is the consumer group of {holder}: two handlers in one group take each \
         other's partitions; use another, such as \"inboxd.{name}.<suffix>\""
    )))
}

/// The group of a stored version, read without the full settings parse (so a
/// version whose settings an older host accepted still holds its group).
fn stored_group(name: &str, settings: &str) -> String {
    serde_json::from_str::<serde_json::Value>(settings)
        .ok()
        .and_then(|v| v.get("group_id")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("inboxd.{name}"))
}

#[cfg(test)]
mod tests {
    use super::stored_group;

    #[test]
    fn a_stored_version_holds_its_group_or_the_default() {
        assert_eq!(stored_group("billing", r#"{"group_id": "g1"}"#), "g1");
        assert_eq!(stored_group("billing", r#"{"topics": ["o"]}"#), "inboxd.billing");
        // Settings this host would no longer accept still hold their group.
        assert_eq!(
            stored_group("billing", r#"{"group_id": "g2", "retired_key": 1}"#),
            "g2"
        );
    }
}
