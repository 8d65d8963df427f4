//! Turning a handler's configuration and component into a runnable version.

use super::{RegistryError, store};
use crate::config::HandlerConfig;
use crate::db::{Database, DbError, Walls, migrate};
use crate::handler::Limits;
use crate::pipeline::Loaded;
use crate::sandbox::Guard;
use crate::sandbox::authorizer::Scope;
use crate::wasm::{HandlerComponent, Reuse, WasmEngine};
use std::sync::Arc;

/// Whether this is the first load of handler `name` in this process: then no
/// other version of it runs here (see `migrate::row_bound::sqlite_row_bound`).
fn first_load(name: &str) -> bool {
    static LOADED: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<String>>> =
        std::sync::LazyLock::new(Default::default);
    LOADED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(name.to_owned())
}

/// An uploaded version's component, and the number that labels it.
pub struct StoredComponent {
    pub bytes: Vec<u8>,
    pub version: i64,
}

/// Compiles and links a handler's component (from its file, or the uploaded
/// bytes), with its statement guard built from the tables its migrations created.
pub async fn load_handler(
    db: &Database,
    engine: &WasmEngine,
    handler: &HandlerConfig,
    uploaded: Option<StoredComponent>,
) -> Result<HandlerComponent, RegistryError> {
    let own_tables =
        migrate::own_tables(db, &handler.name)
            .await
            .map_err(|source| RegistryError::Tables {
                handler: handler.name.clone(),
                source,
            })?;
    let refused = migrate::refused_type_column(db, &handler.name)
        .await
        .map_err(|source| RegistryError::Tables {
            handler: handler.name.clone(),
            source,
        })?;
    if let Some(column) = refused {
        return Err(RegistryError::Refused {
            handler: handler.name.clone(),
            reason: format!("{column} (ALTER its type, as the host's own login)"),
        });
    }
    if db.backend() == crate::config::Backend::Sqlite
        && handler.limits.max_row_bytes > crate::config::defaults::SQLITE_MAX_ROW_BYTES
    {
        return Err(RegistryError::Refused {
            handler: handler.name.clone(),
            reason: crate::config::defaults::sqlite_row_bytes_refused(handler.limits.max_row_bytes),
        });
    }
    // Before any event: the guard's work bound counts every row at this size.
    migrate::bound_rows(db, &handler.name, handler.limits.max_row_bytes)
        .await
        .map_err(|source| RegistryError::RowBound {
            handler: handler.name.clone(),
            source,
        })?;
    if let Some(over) = migrate::sqlite_schema_over(db, &own_tables)
        .await
        .map_err(|source| RegistryError::Tables {
            handler: handler.name.clone(),
            source,
        })?
    {
        return Err(RegistryError::Refused {
            handler: handler.name.clone(),
            reason: over,
        });
    }
    // SQLite: rows written under a larger limit (or by a migration) outlast
    // a lower one; the guard counts rows at the longest the tables may hold.
    let stored_row_bytes = match db.backend() {
        crate::config::Backend::Sqlite => migrate::row_bound::sqlite_row_bound(
            db,
            &handler.name,
            handler.limits.max_row_bytes,
            &own_tables,
            first_load(&handler.name),
        )
        .await
        .map_err(|source| RegistryError::RowBound {
            handler: handler.name.clone(),
            source,
        })?,
        crate::config::Backend::Postgres => 0,
    };
    let own_schema = migrate::own_schema(db.backend(), &handler.name);
    let guard =
        Guard::new(
            db.backend(),
            &own_schema,
            &own_tables,
            handler.limits.max_statement_bytes,
            handler.limits.max_row_bytes,
        )
        .with_hidden_work(
            migrate::hidden_work(db, &handler.name, handler.limits.max_row_bytes)
                .await
                .map_err(|source| RegistryError::RowBound {
                    handler: handler.name.clone(),
                    source,
                })?,
        )
        .with_row_functions(migrate::row_functions(db).await.map_err(|source| {
            RegistryError::GuardCatalog {
                handler: handler.name.clone(),
                source,
            }
        })?)
        .with_stored_row_bytes(stored_row_bytes)
        .with_table_calls(
            migrate::sqlite_table_calls(db, &own_tables)
                .await
                .map_err(|source| RegistryError::GuardCatalog {
                    handler: handler.name.clone(),
                    source,
                })?,
        );
    tracing::debug!(handler = handler.name, tables = ?own_tables, "handler's own tables");
    let limits = Limits::from(&handler.limits);
    // A statement may run as long as the whole event may.
    let walls = Walls::new(&handler.name, Scope::Guest, &own_tables, limits.timeout)
        .with_max_row_bytes(handler.limits.max_row_bytes);
    let load_error = |source| RegistryError::Load {
        handler: handler.name.clone(),
        source,
    };
    let component = match uploaded {
        None => HandlerComponent::load(engine, &handler.name, &handler.component, limits, guard, walls)
            .map_err(load_error)?,
        Some(StoredComponent { bytes, version }) => {
            // Another host may meet this component first: compiling takes seconds for Python or JS.
            let (engine, name) = (engine.clone(), handler.name.clone());
            let shown = format!("{name} version {version}");
            tokio::task::spawn_blocking(move || {
                HandlerComponent::from_bytes(&engine, &name, &shown, &bytes, limits, guard, walls)
            })
            .await
            .map_err(|e| {
                RegistryError::Panicked(format!(
                    "loading handler {name} panicked: {e}",
                    name = handler.name
                ))
            })?
            .map_err(load_error)?
            .with_version_label(version.to_string())
        }
    };
    // The id names of its messages' possible consumers are the host's to
    // write: registered once the version loaded, so one that fails a check
    // takes no place of the versions that run (the registry keeps each
    // handler's last two: the review of the fifty-third read).
    crate::capabilities::outbox::register_id_source(
        &handler.name,
        &handler.topics,
        &handler.event_id.header,
        &handler.event_id.json_field,
    );
    let reuse = handler.instances.reuse.then_some(Reuse {
        max_memory_bytes: (handler.instances.recycle_memory_mb as usize) << 20,
        max_events: handler.instances.recycle_after_events,
    });
    Ok(component
        .with_outbox_topics(handler.outbox_topics.clone())
        .with_reuse(reuse))
}

/// The pipeline's view of a loaded handler and its settings.
pub fn loaded(handler: &HandlerConfig, code: Arc<dyn crate::handler::Handler>) -> Loaded {
    Loaded {
        handler: code,
        event_id: handler.event_id.clone(),
        retry: handler.retry.clone(),
        dedup: handler.dedup.clone(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadUploadedError {
    #[error("handler {name} has no stored version {version}")]
    Missing { name: String, version: i64 },
    #[error("handler {name} version {version}: its stored settings are invalid: {message}")]
    Settings {
        name: String,
        version: i64,
        message: String,
    },
    #[error(transparent)]
    Database(#[from] DbError),
    #[error(transparent)]
    Load(#[from] RegistryError),
}

/// Loads a stored version of an uploaded handler.
pub async fn load_uploaded(
    db: &Database,
    engine: &WasmEngine,
    name: &str,
    version: i64,
) -> Result<(HandlerConfig, HandlerComponent), LoadUploadedError> {
    let stored = store::load_version(db, name, version)
        .await?
        .ok_or_else(|| LoadUploadedError::Missing {
            name: name.to_owned(),
            version,
        })?;
    let config =
        HandlerConfig::from_settings(name, &stored.settings).map_err(|e| LoadUploadedError::Settings {
            name: name.to_owned(),
            version,
            message: e.to_string(),
        })?;
    let uploaded = StoredComponent {
        bytes: stored.component,
        version: stored.version,
    };
    let component = load_handler(db, engine, &config, Some(uploaded)).await?;
    Ok((config, component))
}
