//! The running host: database, loaded handlers, and one pump per handler.
//!
//! [`Host::start`] does everything that can fail at start-up (connect,
//! migrate, compile and link components, create consumers) before any record
//! is consumed, so a broken deployment fails fast with a clear error.

use crate::admin::{ListenError, Listener};
use crate::config::{Config, InboxConfig, KafkaConfig, OutboxConfig};
use crate::db::{Database, DbError, OpenError};
use crate::handler::Handler;
use crate::kafka::run_relay;
use crate::metrics::Metrics;
use crate::registry::load::load_handler;
use crate::registry::{Registry, RegistryError};
use crate::stats::Stats;
use crate::wasm::WasmEngine;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Why the host could not start; each layer says what failed in its own terms.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Database(#[from] OpenError),
    #[error("cannot migrate the database: {0}")]
    Migrate(#[from] DbError),
    #[error(transparent)]
    Handler(#[from] RegistryError),
    #[error("cannot start the WebAssembly engine: {0}")]
    Engine(String),
    #[error(transparent)]
    Admin(#[from] ListenError),
}

pub struct Host {
    db: Database,
    inbox: InboxConfig,
    outbox: OutboxConfig,
    kafka: KafkaConfig,
    registry: Registry,
    admin: Option<Listener>,
    stats: BTreeMap<String, Arc<Stats>>,
}

/// How long a starting host waits for a database it cannot reach yet (see
/// [`crate::db::open_waiting`]): longer than a restart or a short network
/// cut, short enough that a wrong address still ends the process soon.
const START_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

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
        let db = crate::db::open_waiting(config, START_WAIT).await?;
        let engine = WasmEngine::new(&config.wasm).map_err(|e| StartError::Engine(format!("{e:#}")))?;
        let registry = Registry::new(db.clone(), engine.clone(), config.clone(), Metrics::default());
        for handler in &config.handlers {
            let code: Arc<dyn Handler> = match natives.remove(&handler.name) {
                Some(native) => native,
                None => Arc::new(load_handler(&db, &engine, handler, None).await?),
            };
            tracing::info!(
                handler = handler.name,
                version = code.version_label(),
                "handler loaded"
            );
            registry.add_config_handler(handler, code).await?;
        }
        // Uploaded handlers load now too; one that cannot load here is logged
        // and keeps `/readyz` failing, but does not stop the others.
        registry.reconcile().await?;
        crate::retention::ensure_partitions(&db, &config.inbox).await?;
        let admin = match &config.admin {
            Some(admin) => Some(Listener::bind(admin).await?),
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

    /// Runs every handler's pump until `shutdown` is cancelled and all have drained.
    pub async fn run(self, shutdown: CancellationToken) {
        let purger = tokio::spawn(crate::retention::run_scheduled(
            self.db.clone(),
            self.inbox.clone(),
            self.outbox.retention,
            shutdown.clone(),
        ));
        // One relay per host; its leases keep other hosts' relays off the same buckets.
        let relay = tokio::spawn(run_relay(
            self.db.clone(),
            self.kafka.clone(),
            self.registry.host_id().to_owned(),
            crate::db::outbox::Settle::after(self.outbox.retention),
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
