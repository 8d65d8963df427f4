//! The running host: database, loaded handlers, and one pump per handler.
//!
//! [`Host::start`] does everything that can fail at start-up (connect,
//! migrate, compile and link components, create consumers) before any record
//! is consumed, so a broken deployment fails fast with a clear error.

use crate::config::{Config, InboxConfig, KafkaConfig, OutboxConfig};
use crate::db::{Database, DbError, migrate};
use crate::handler::Handler;
use crate::kafka::run_relay;
use crate::metrics::Metrics;
use crate::registry::Registry;
pub use crate::registry::load::load_handler;
use crate::stats::Stats;
use crate::wasm::{LoadError, WasmEngine};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the database {url}: {source}")]
    Database { url: String, source: DbError },
    #[error("cannot migrate the database: {0}")]
    Migrate(DbError),
    #[error("handler {handler}: {source}")]
    Load { handler: String, source: LoadError },
    #[error(
        "the database holds code that handlers may not plant and that would run outside the walls: {0}. \
         An older inboxd let a handler's migration create it; drop it (DROP TRIGGER / FUNCTION / RULE / POLICY) \
         and start again"
    )]
    PlantedCode(String),
    #[error("cannot start the WebAssembly engine: {0}")]
    Engine(String),
    #[error("cannot listen on {addr} (admin.listen): {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("handler {handler}: cannot create its Kafka consumer: {source}")]
    Kafka {
        handler: String,
        source: rdkafka::error::KafkaError,
    },
}

pub struct Host {
    db: Database,
    inbox: InboxConfig,
    outbox: OutboxConfig,
    kafka: KafkaConfig,
    registry: Registry,
    admin: Option<crate::admin::Listener>,
    stats: BTreeMap<String, Arc<Stats>>,
}

/// Hides a password in a database URL before it is shown.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Connects and applies the host's migrations and every handler's.
pub async fn open_database(config: &Config) -> Result<Database, StartError> {
    let url = &config.database.url;
    let db = Database::connect(url, config.database.max_connections)
        .await
        .map_err(|source| StartError::Database {
            url: redact_url(url),
            source,
        })?;
    db.migrate_host().await.map_err(StartError::Migrate)?;
    let planted = crate::db::audit::planted_code(&db)
        .await
        .map_err(StartError::Migrate)?;
    if !planted.is_empty() {
        return Err(StartError::PlantedCode(planted.join(", ")));
    }
    for handler in &config.handlers {
        migrate::prepare_handler(&db, &handler.name)
            .await
            .map_err(StartError::Migrate)?;
        if let Some(dir) = &handler.migrations {
            migrate::apply_handler(&db, &handler.name, dir)
                .await
                .map_err(StartError::Migrate)?;
        }
    }
    Ok(db)
}

impl Host {
    pub async fn start(config: &Config) -> Result<Self, StartError> {
        Self::start_with(config, BTreeMap::new()).await
    }

    /// As [`Host::start`], running the given native handlers in place of the
    /// components configured under their names. For benchmarks only: a
    /// native handler runs without the sandbox (design §5).
    pub async fn start_with(
        config: &Config,
        mut natives: BTreeMap<String, Arc<dyn Handler>>,
    ) -> Result<Self, StartError> {
        let db = open_database(config).await?;
        let engine =
            WasmEngine::new(config.wasm.cache_dir()).map_err(|e| StartError::Engine(format!("{e:#}")))?;
        let registry = Registry::new(db.clone(), engine.clone(), config.clone(), Metrics::default());
        for handler in &config.handlers {
            let code: Arc<dyn Handler> = match natives.remove(&handler.name) {
                Some(native) => native,
                None => Arc::new(load_handler(&db, &engine, handler, None).await?),
            };
            tracing::info!(handler = handler.name, version = code.version(), "handler loaded");
            registry.add_config_handler(handler, code).await?;
        }
        // Uploaded handlers load now too; one that cannot load here is logged
        // and keeps `/readyz` failing, but does not stop the others.
        registry.reconcile().await.map_err(StartError::Migrate)?;
        crate::retention::ensure_partitions(&db, &config.inbox)
            .await
            .map_err(StartError::Migrate)?;
        let admin = match &config.admin {
            Some(admin) => Some(crate::admin::Listener::bind(admin).await?),
            None => None,
        };
        if config.handlers.is_empty() && registry.running().await.is_empty() {
            tracing::warn!(
                "no handlers configured or uploaded yet: nothing to consume until one is uploaded"
            );
        }
        Ok(Self {
            stats: registry.stats().await,
            db,
            inbox: config.inbox.clone(),
            outbox: config.outbox.clone(),
            kafka: config.kafka.clone(),
            registry,
            admin,
        })
    }

    pub fn database(&self) -> &Database {
        &self.db
    }

    /// Counters per handler name, of the handlers loaded at start.
    pub fn stats(&self) -> &BTreeMap<String, Arc<Stats>> {
        &self.stats
    }

    /// The handlers, and what changes them at run time.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Where the admin API listens (resolved if the configured port was 0).
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.as_ref().map(crate::admin::Listener::local_addr)
    }

    /// Runs every handler's pump until `shutdown` is cancelled and all have drained.
    pub async fn run(self, shutdown: CancellationToken) {
        let purger = tokio::spawn(crate::retention::run_scheduled(
            self.db.clone(),
            self.inbox.clone(),
            self.outbox.retention,
            shutdown.clone(),
        ));
        // One relay per host; its leases keep other hosts' relays off the same buckets.
        let owner = format!(
            "inboxd-{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let relay = tokio::spawn(run_relay(
            self.db.clone(),
            self.kafka.clone(),
            owner,
            shutdown.clone(),
        ));
        let admin = self
            .admin
            .map(|listener| tokio::spawn(listener.serve(self.registry.clone(), shutdown.clone())));
        self.registry.run(shutdown.clone()).await;
        shutdown.cancel();
        let _ = purger.await;
        let _ = relay.await;
        if let Some(admin) = admin {
            let _ = admin.await;
        }
        self.db.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(redact_url("sqlite://inboxd.sqlite"), "sqlite://inboxd.sqlite");
    }
}
