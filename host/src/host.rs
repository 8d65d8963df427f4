//! The running host: database, loaded handlers, and one pump per handler.
//!
//! [`Host::start`] does everything that can fail at start-up (connect,
//! migrate, compile and link components, create consumers) before any record
//! is consumed, so a broken deployment fails fast with a clear error.

use crate::config::{BatchConfig, Config, HandlerConfig, InboxConfig, KafkaConfig, OutboxConfig};
use crate::db::{Backend, Database, DbError, handler_schema, migrate};
use crate::handler::Handler;
use crate::kafka::{InboxConsumer, create_consumer, run_pump, run_relay};
use crate::pipeline::Pipeline;
use crate::sandbox::Guard;
use crate::stats::Stats;
use crate::wasm::{HandlerComponent, Limits, LoadError, Reuse, WasmEngine};
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
    #[error("cannot start the WebAssembly engine: {0}")]
    Engine(String),
    #[error("handler {handler}: cannot create its Kafka consumer: {source}")]
    Kafka {
        handler: String,
        source: rdkafka::error::KafkaError,
    },
}

struct Running {
    consumer: InboxConsumer,
    pipeline: Pipeline,
    batching: BatchConfig,
}

pub struct Host {
    db: Database,
    inbox: InboxConfig,
    outbox: OutboxConfig,
    kafka: KafkaConfig,
    handlers: Vec<Running>,
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

/// Compiles and links a handler's component, with its statement guard built
/// from the tables its migrations created.
pub async fn load_handler(
    db: &Database,
    engine: &WasmEngine,
    handler: &HandlerConfig,
) -> Result<HandlerComponent, StartError> {
    let own_tables = migrate::own_tables(db, &handler.name)
        .await
        .map_err(StartError::Migrate)?;
    let own_schema = match db.backend() {
        Backend::Sqlite => "main".to_owned(),
        Backend::Postgres => handler_schema(&handler.name),
    };
    let guard = Guard::new(
        db.backend(),
        &own_schema,
        &own_tables,
        handler.limits.max_statement_bytes,
    );
    tracing::debug!(handler = handler.name, tables = ?own_tables, "handler's own tables");
    let component = HandlerComponent::load(
        engine,
        &handler.name,
        &handler.component,
        Limits::from(&handler.limits),
        guard,
    )
    .map_err(|source| StartError::Load {
        handler: handler.name.clone(),
        source,
    })?;
    let reuse = handler.instances.reuse.then_some(Reuse {
        max_memory_bytes: (handler.instances.recycle_memory_mb as usize) << 20,
        max_events: handler.instances.recycle_after_events,
    });
    Ok(component
        .with_outbox_topics(handler.outbox_topics.clone())
        .with_reuse(reuse))
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
        let mut handlers = Vec::new();
        let mut stats = BTreeMap::new();
        for handler in &config.handlers {
            let code: Arc<dyn Handler> = match natives.remove(&handler.name) {
                Some(native) => native,
                None => Arc::new(load_handler(&db, &engine, handler).await?),
            };
            tracing::info!(handler = handler.name, version = code.version(), "handler loaded");
            let running = Self::start_handler(&db, config, handler, code)?;
            stats.insert(handler.name.clone(), running.1);
            handlers.push(running.0);
        }
        crate::retention::ensure_partitions(&db, &config.inbox)
            .await
            .map_err(StartError::Migrate)?;
        Ok(Self {
            db,
            inbox: config.inbox.clone(),
            outbox: config.outbox.clone(),
            kafka: config.kafka.clone(),
            handlers,
            stats,
        })
    }

    fn start_handler(
        db: &Database,
        config: &Config,
        handler: &HandlerConfig,
        code: Arc<dyn Handler>,
    ) -> Result<(Running, Arc<Stats>), StartError> {
        let stats = Arc::new(Stats::default());
        let pipeline = Pipeline::new(
            db.clone(),
            code,
            handler.event_id.clone(),
            handler.retry.clone(),
            stats.clone(),
        );
        let consumer = create_consumer(&config.kafka, &handler.name, &handler.group_id(), &handler.topics)
            .map_err(|source| StartError::Kafka {
                handler: handler.name.clone(),
                source,
            })?;
        Ok((
            Running {
                consumer,
                pipeline,
                batching: handler.batch.clone(),
            },
            stats,
        ))
    }

    pub fn database(&self) -> &Database {
        &self.db
    }

    /// Counters per handler name.
    pub fn stats(&self) -> &BTreeMap<String, Arc<Stats>> {
        &self.stats
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
        let mut pumps = tokio::task::JoinSet::new();
        for running in self.handlers {
            pumps.spawn(run_pump(
                running.consumer,
                running.pipeline,
                running.batching,
                shutdown.clone(),
            ));
        }
        while let Some(result) = pumps.join_next().await {
            if let Err(error) = result {
                tracing::error!("a handler's pump panicked: {error}");
                shutdown.cancel();
            }
        }
        shutdown.cancel();
        let _ = purger.await;
        let _ = relay.await;
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
