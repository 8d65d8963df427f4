//! The handlers this host runs, and how they change while it runs.
//!
//! Handlers come from two places: the configuration file (fixed for the
//! process's life) and the admin API (the `handlers` and
//! `handler_deployments` tables). The database is the truth for uploaded
//! handlers: every host polls `handler_deployments` and converges on it
//! ([`Registry::reconcile`]), so a change made through any host's API
//! reaches every host of the consumer group, and the host that took the call
//! converges at once.
//!
//! A new version goes live by swapping the handler's [`Slot`]: the batch in
//! flight finishes on the version it started with, the next batch runs the
//! new one. If the new version changes what the consumer is (topics, group,
//! batching, ordering), its pump is stopped (batches in flight commit first) and
//! started again. Pausing stops the pump; its partitions go to other hosts
//! of the group that are not paused, or wait.

pub mod hosts;
pub mod load;
pub mod store;
pub mod upload;

use crate::config::{Config, HandlerConfig};
use crate::db::{Database, DbError};
use crate::handler::Handler;
use crate::kafka::pump::KeyOrder;
use crate::kafka::{InboxConsumer, create_consumer, run_pump};
use crate::metrics::Metrics;
use crate::pipeline::{Pipeline, Slot};
use crate::stats::Stats;
use crate::stats::history::STEP;
use crate::wasm::WasmEngine;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use store::Deployment;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Why a handler could not be loaded or started.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("handler {handler}: cannot read the tables its migrations created: {source}")]
    Tables { handler: String, source: DbError },
    #[error("handler {handler}: cannot bound its tables' rows to limits.max_row_bytes: {source}")]
    RowBound { handler: String, source: DbError },
    #[error(
        "handler {handler}: cannot read from PostgreSQL's catalog what the statement guard needs: {source}"
    )]
    GuardCatalog { handler: String, source: DbError },
    #[error("handler {handler}: {reason}")]
    Refused { handler: String, reason: String },
    #[error("handler {handler}: {source}")]
    Load {
        handler: String,
        source: crate::wasm::LoadError,
    },
    #[error("{0}")]
    Panicked(String),
    #[error("handler {handler}: cannot create its Kafka consumer: {source}")]
    Kafka {
        handler: String,
        source: rdkafka::error::KafkaError,
    },
}

/// How often a host re-reads `handler_deployments`: how long a change made
/// through another host's API takes to arrive here. The table has one small
/// row per uploaded handler.
const POLL_INTERVAL: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    Config,
    Api,
}

/// A running pump (`kafka::run_pump`) and what stops it.
struct PumpTask {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

struct Entry {
    source: Source,
    /// The settings of the running version.
    config: HandlerConfig,
    /// The uploaded version that runs (`None` for a config handler).
    version: Option<i64>,
    /// When that version was uploaded (see `Deployment::active_uploaded_at`).
    uploaded_at: Option<i64>,
    slot: Slot,
    stats: Arc<Stats>,
    /// A consumer made at start-up, so a bad Kafka setting fails the start.
    consumer: Option<InboxConsumer>,
    pump: Option<PumpTask>,
    paused: bool,
}

impl Entry {
    /// Whether this entry runs the deployment's active version (the same
    /// number, uploaded at the same time).
    fn runs(&self, deployment: &Deployment) -> bool {
        self.version == Some(deployment.active_version) && self.uploaded_at == deployment.active_uploaded_at
    }
}

/// What the API shows of a handler on this host.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Running {
    pub name: String,
    pub source: Source,
    /// The version label recorded on inbox rows by this host.
    pub version: String,
    pub consuming: bool,
    pub paused: bool,
    /// What the running version consumes and the limits it runs under.
    pub settings: Settings,
}

/// The settings of a running version that an operator looks at: what it
/// consumes and publishes, its batching, retries and limits.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Settings {
    pub topics: Vec<String>,
    pub group_id: String,
    pub outbox_topics: BTreeMap<String, String>,
    pub batch: crate::config::BatchConfig,
    pub retry: crate::config::RetryConfig,
    pub limits: crate::config::LimitsConfig,
    pub instances: crate::config::InstancesConfig,
}

impl Settings {
    pub fn of(config: &HandlerConfig) -> Self {
        Self {
            topics: config.topics.clone(),
            group_id: config.group_id(),
            outbox_topics: config.outbox_topics.clone(),
            batch: config.batch.clone(),
            retry: config.retry.clone(),
            limits: config.limits.clone(),
            instances: config.instances.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Registry(Arc<Inner>);

struct Inner {
    /// This process among the hosts sharing the database: `handler_hosts`
    /// and the relay's bucket leases name it.
    host_id: String,
    db: Database,
    engine: WasmEngine,
    config: Config,
    metrics: Metrics,
    entries: tokio::sync::Mutex<BTreeMap<String, Entry>>,
    /// Parent of every pump's stop token.
    stopping: CancellationToken,
    /// Uploaded versions that failed to load here, logged once each.
    failed: std::sync::Mutex<HashSet<(String, i64)>>,
    /// The first reconcile succeeded and every deployment loaded.
    ready: std::sync::atomic::AtomicBool,
    /// [`Registry::run`] has begun: pumps may start.
    running: std::sync::atomic::AtomicBool,
    reconciling: tokio::sync::Mutex<()>,
    /// Pumps told to stop that have not ended yet (see [`Ending`]).
    ending: std::sync::Mutex<Ending>,
}

impl Registry {
    pub fn new(db: Database, engine: WasmEngine, config: Config, metrics: Metrics) -> Self {
        Self(Arc::new(Inner {
            host_id: host_id(),
            db,
            engine,
            config,
            metrics,
            entries: tokio::sync::Mutex::default(),
            stopping: CancellationToken::new(),
            failed: std::sync::Mutex::default(),
            ready: std::sync::atomic::AtomicBool::new(false),
            running: std::sync::atomic::AtomicBool::new(false),
            reconciling: tokio::sync::Mutex::default(),
            ending: std::sync::Mutex::default(),
        }))
    }

    pub fn db(&self) -> &Database {
        &self.0.db
    }

    pub fn host_id(&self) -> &str {
        &self.0.host_id
    }

    pub fn engine(&self) -> &WasmEngine {
        &self.0.engine
    }

    pub fn kafka(&self) -> &crate::config::KafkaConfig {
        &self.0.config.kafka
    }

    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    /// Names defined in the configuration file: the API may not manage them.
    pub fn config_names(&self) -> Vec<String> {
        self.0.config.handlers.iter().map(|h| h.name.clone()).collect()
    }

    /// The configuration file's handlers (their consumer groups are taken).
    pub fn config_handlers(&self) -> &[HandlerConfig] {
        &self.0.config.handlers
    }

    /// True once every handler this host should run has loaded.
    pub fn is_ready(&self) -> bool {
        self.0.ready.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Adds a handler from the configuration file, with its consumer made now.
    pub async fn add_config_handler(
        &self,
        handler: &HandlerConfig,
        code: Arc<dyn Handler>,
    ) -> Result<(), RegistryError> {
        let stats = Arc::new(Stats::new(self.0.metrics.handler(&handler.name)));
        let consumer = self
            .consumer(handler, stats.clone())
            .map_err(|source| RegistryError::Kafka {
                handler: handler.name.clone(),
                source,
            })?;
        let entry = Entry {
            source: Source::Config,
            version: None,
            uploaded_at: None,
            slot: Slot::new(load::loaded(handler, code)),
            stats,
            config: handler.clone(),
            consumer: Some(consumer),
            pump: None,
            paused: false,
        };
        self.0.entries.lock().await.insert(handler.name.clone(), entry);
        Ok(())
    }

    /// Counters per handler name.
    pub async fn stats(&self) -> BTreeMap<String, Arc<Stats>> {
        let entries = self.0.entries.lock().await;
        entries
            .iter()
            .map(|(n, e)| (n.clone(), e.stats.clone()))
            .collect()
    }

    /// What runs here, by name.
    pub async fn running(&self) -> BTreeMap<String, Running> {
        let entries = self.0.entries.lock().await;
        entries
            .iter()
            .map(|(name, e)| {
                let running = Running {
                    name: name.clone(),
                    source: e.source,
                    version: e.slot.current().handler.version_label().to_owned(),
                    consuming: e.pump.is_some(),
                    paused: e.paused,
                    settings: Settings::of(&e.config),
                };
                (name.clone(), running)
            })
            .collect()
    }

    /// The handler version a dead-letter replay runs: the one running here.
    pub async fn current(&self, name: &str) -> Option<Arc<dyn Handler>> {
        Some(self.current_loaded(name).await?.handler)
    }

    /// The version running now with its settings (a replay dedups by key as it does).
    pub async fn current_loaded(&self, name: &str) -> Option<crate::pipeline::Loaded> {
        let entries = self.0.entries.lock().await;
        entries.get(name).map(|e| e.slot.current())
    }

    /// Starts every pump, then follows the deployments table until
    /// `shutdown`; then stops every pump (their batches in flight commit).
    /// A pump that ends by itself (a panic) stops the host, as before.
    pub async fn run(&self, shutdown: CancellationToken) {
        self.0.running.store(true, std::sync::atomic::Ordering::Relaxed);
        let beats = tokio::spawn(hosts::run(self.clone(), shutdown.clone()));
        let sampler = tokio::spawn(self.clone().sample(shutdown.clone()));
        if let Err(error) = self.reconcile().await {
            tracing::warn!("reading handler deployments failed (retrying every {POLL_INTERVAL:?}): {error}");
        }
        self.start_idle().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(POLL_INTERVAL) => {}
            }
            if let Err(error) = self.reconcile().await {
                tracing::warn!("reading handler deployments failed: {error}");
            }
            if let Some(name) = self.ended_pump().await {
                tracing::error!(
                    handler = name,
                    "a handler's pump stopped by itself; stopping the host"
                );
                shutdown.cancel();
                break;
            }
        }
        self.0.stopping.cancel();
        let mut entries = self.0.entries.lock().await;
        for entry in entries.values_mut() {
            stop(entry).await;
        }
        drop(entries);
        // And those a reconcile told to stop, which may still be ending.
        let ending = std::mem::take(&mut self.ending().tasks);
        for task in ending {
            let _ = task.await;
        }
        let _ = sampler.await;
        let _ = beats.await;
    }

    /// Samples every handler's counters each [`STEP`] for the console's
    /// rates and chart. A tick that came late (a busy runtime) is taken when
    /// it can be: the history records real times, so rates stay right.
    async fn sample(self, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(STEP);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = ticks.tick() => {}
            }
            let now = crate::db::now_ms();
            for stats in self.stats().await.values() {
                stats.sample(now);
            }
        }
    }

    async fn start_idle(&self) {
        let mut entries = self.0.entries.lock().await;
        for (name, entry) in entries.iter_mut() {
            self.start_if_due(name, entry);
        }
    }

    async fn ended_pump(&self) -> Option<String> {
        let entries = self.0.entries.lock().await;
        entries
            .iter()
            .find(|(_, e)| e.pump.as_ref().is_some_and(|p| p.task.is_finished()))
            .map(|(name, _)| name.clone())
    }

    /// Brings the uploaded handlers on this host in line with `handler_deployments`.
    pub async fn reconcile(&self) -> Result<(), DbError> {
        // One reconcile at a time (the poll and API calls), so a version is loaded once.
        let _one = self.0.reconciling.lock().await;
        let deployments = store::deployments(&self.0.db).await?;
        // New versions are compiled without holding `entries`: a Python or
        // JavaScript component takes seconds to compile on a host that has not
        // seen it, and /metrics, the API and the pumps' supervision need `entries`.
        let (wanted, mut handlers): (Vec<(String, i64, bool)>, usize) = {
            let entries = self.0.entries.lock().await;
            let wanted = deployments
                .iter()
                .filter(|d| match entries.get(&d.name) {
                    Some(entry) => entry.source == Source::Api && !entry.runs(d),
                    None => true,
                })
                .map(|d| (d.name.clone(), d.active_version, !entries.contains_key(&d.name)))
                .collect();
            (wanted, entries.len())
        };
        let mut loaded = BTreeMap::new();
        for (name, version, new) in wanted {
            // A handler this host does not run yet needs its share of the
            // instance pool (see `config::instances_short`); a new version
            // of one it runs shares its old one's.
            if new
                && let Some(short) = crate::config::instances_short(
                    handlers + 1,
                    self.0.db.calls_per_handler(),
                    self.0.engine.instances(),
                )
            {
                self.failed_to_load(&name, version, &short);
                continue;
            }
            if let Some(code) = self.load(&name, version).await {
                handlers += usize::from(new);
                loaded.insert(name, code);
            }
        }
        let mut entries = self.0.entries.lock().await;
        let mut all_loaded = true;
        // Pumps told to stop, awaited below once `entries` is released.
        let mut stopped = Vec::new();
        // Deleted: stop, forget.
        let gone: Vec<String> = entries
            .iter()
            .filter(|(name, e)| e.source == Source::Api && !deployments.iter().any(|d| &d.name == *name))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some(mut entry) = entries.remove(&name) {
                stopped.extend(self.end_pump(&name, &mut entry));
                self.0.metrics.remove_handler(&name);
                crate::capabilities::outbox::forget_id_source(&name);
                tracing::info!(handler = name, "handler deleted");
            }
        }
        for deployment in &deployments {
            if entries
                .get(&deployment.name)
                .is_some_and(|e| e.source == Source::Config)
            {
                continue;
            }
            let code = loaded.remove(&deployment.name);
            if !self.apply(&mut entries, deployment, code, &mut stopped) {
                all_loaded = false;
            }
        }
        self.0
            .ready
            .store(all_loaded, std::sync::atomic::Ordering::Relaxed);
        // A pump ends after the transaction it is in (up to a second plus an
        // event's deadline): awaited while holding `entries`, a team that
        // paused its handler mid-batch held /metrics, the API's views,
        // replays and every pump's supervision that long (the eleventh read
        // found hours, before batches stopped between transactions). The
        // caller (an API call answers once its change is made here) waits
        // for them; if it goes away, they end and restart all the same.
        drop(entries);
        for ended in stopped {
            let _ = ended.await;
        }
        Ok(())
    }

    /// Applies one deployment, with its active version if it had to be
    /// loaded; `false`: that version could not be loaded here.
    fn apply(
        &self,
        entries: &mut BTreeMap<String, Entry>,
        deployment: &Deployment,
        code: Option<(HandlerConfig, Arc<dyn Handler>)>,
        stopped: &mut Vec<oneshot::Receiver<()>>,
    ) -> bool {
        let name = &deployment.name;
        let wanted = deployment.active_version;
        if entries.get(name).is_none_or(|e| !e.runs(deployment)) {
            let Some((config, code)) = code else {
                return false;
            };
            match entries.get_mut(name) {
                None => {
                    let entry = Entry {
                        source: Source::Api,
                        version: Some(wanted),
                        uploaded_at: deployment.active_uploaded_at,
                        slot: Slot::new(load::loaded(&config, code)),
                        stats: Arc::new(Stats::new(self.0.metrics.handler(name))),
                        config,
                        consumer: None,
                        pump: None,
                        paused: true,
                    };
                    entries.insert(name.clone(), entry);
                    tracing::info!(handler = name, version = wanted, "handler loaded");
                }
                Some(entry) => {
                    let restart = consumer_changed(&entry.config, &config) && entry.pump.is_some();
                    if restart {
                        stopped.extend(self.end_pump(name, entry));
                    }
                    entry.slot.swap(load::loaded(&config, code));
                    entry.config = config;
                    let from = entry.version.replace(wanted);
                    entry.uploaded_at = deployment.active_uploaded_at;
                    tracing::info!(
                        handler = name,
                        from,
                        to = wanted,
                        restart,
                        "handler version activated"
                    );
                }
            }
        }
        let entry = entries.get_mut(name).expect("inserted above");
        entry.paused = deployment.paused;
        if deployment.paused && entry.pump.is_some() {
            stopped.extend(self.end_pump(name, entry));
            tracing::info!(handler = name, "handler paused");
        } else {
            // A restarted pump starts once its old one has ended (`end_pump`).
            self.start_if_due(name, entry);
        }
        true
    }

    async fn load(&self, name: &str, version: i64) -> Option<(HandlerConfig, Arc<dyn Handler>)> {
        match load::load_uploaded(&self.0.db, &self.0.engine, name, version).await {
            Ok((config, component)) => {
                self.0
                    .failed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&(name.to_owned(), version));
                Some((config, Arc::new(component)))
            }
            Err(error) => {
                self.failed_to_load(name, version, &error);
                None
            }
        }
    }

    /// Logs, once per version, why `name`'s `version` cannot run here.
    fn failed_to_load(&self, name: &str, version: i64, error: &dyn std::fmt::Display) {
        let first = self
            .0
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((name.to_owned(), version));
        if first {
            tracing::error!(
                handler = name,
                version,
                "cannot load the handler version: {error}"
            );
        }
    }

    fn consumer(
        &self,
        handler: &HandlerConfig,
        stats: Arc<Stats>,
    ) -> rdkafka::error::KafkaResult<InboxConsumer> {
        create_consumer(
            &self.0.config.kafka,
            &handler.name,
            &handler.group_id(),
            &handler.topics,
            self.0.metrics.consumer_lag.clone(),
            stats,
        )
    }

    /// Starts the entry's pump if it should run and none does (nor is
    /// still ending: two pumps of one handler on one host would share
    /// nothing that keeps a key's records in order between them).
    fn start_if_due(&self, name: &str, entry: &mut Entry) {
        if !entry.paused
            && entry.pump.is_none()
            && !self.ending().names.contains_key(name)
            && self.0.running.load(std::sync::atomic::Ordering::Relaxed)
            && !self.0.stopping.is_cancelled()
        {
            self.start_pump(entry);
        }
    }

    fn ending(&self) -> std::sync::MutexGuard<'_, Ending> {
        self.0.ending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tells the entry's pump, if any, to stop (its batches in flight end
    /// after their current transaction) and answers a task that waits for
    /// it to end, then starts the handler's pump again if it should run.
    /// The task is the registry's, not its caller's: an API call whose
    /// client went away drops its reconcile, and the old pump must still be
    /// known until it ends (else the next reconcile started a second one).
    fn end_pump(&self, name: &str, entry: &mut Entry) -> Option<oneshot::Receiver<()>> {
        let pump = entry.pump.take()?;
        pump.stop.cancel();
        *self.ending().names.entry(name.to_owned()).or_default() += 1;
        let (registry, name) = (self.clone(), name.to_owned());
        // Fired (or dropped) once the pump has ended and its successor, if
        // any, started.
        let (ended, waiter) = oneshot::channel();
        let task = tokio::spawn(async move {
            if let Err(error) = pump.task.await {
                tracing::error!(handler = name, "a handler's pump panicked: {error}");
            }
            let mut entries = registry.0.entries.lock().await;
            {
                let mut ending = registry.ending();
                if let Some(count) = ending.names.get_mut(&name) {
                    *count -= 1;
                    if *count == 0 {
                        ending.names.remove(&name);
                    }
                }
            }
            if let Some(entry) = entries.get_mut(&name) {
                registry.start_if_due(&name, entry);
            }
            let _ = ended.send(());
        });
        let mut ending = self.ending();
        ending.tasks.retain(|task| !task.is_finished());
        ending.tasks.push(task);
        drop(ending);
        Some(waiter)
    }

    fn start_pump(&self, entry: &mut Entry) {
        let consumer = match entry.consumer.take() {
            Some(consumer) => consumer,
            None => match self.consumer(&entry.config, entry.stats.clone()) {
                Ok(consumer) => consumer,
                Err(error) => {
                    tracing::error!(
                        handler = entry.config.name,
                        "cannot create the Kafka consumer: {error}"
                    );
                    return;
                }
            },
        };
        let pipeline = Pipeline::new(self.0.db.clone(), entry.slot.clone(), entry.stats.clone());
        let stop = self.0.stopping.child_token();
        let task = tokio::spawn(run_pump(
            consumer,
            pipeline,
            entry.config.batch.clone(),
            KeyOrder::of(&entry.config),
            stop.clone(),
        ));
        entry.pump = Some(PumpTask { stop, task });
    }
}

/// Pumps told to stop and not ended yet: per handler name how many, and
/// the tasks that wait for them ([`Registry::end_pump`]).
#[derive(Default)]
struct Ending {
    names: HashMap<String, usize>,
    tasks: Vec<JoinHandle<()>>,
}

/// Stops a pump and waits for it: its batches in flight commit first.
async fn stop(entry: &mut Entry) {
    if let Some(pump) = entry.pump.take() {
        pump.stop.cancel();
        if let Err(error) = pump.task.await {
            tracing::error!(handler = entry.config.name, "a handler's pump panicked: {error}");
        }
    }
}

/// `<hostname>-<pid>-<random>`: readable in the console, unique across restarts.
fn host_id() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "inboxd".to_owned());
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{name}-{}-{}", std::process::id(), &random[..8])
}

/// A new version with other topics, group or batching needs a new consumer.
fn consumer_changed(old: &HandlerConfig, new: &HandlerConfig) -> bool {
    old.topics != new.topics
        || old.group_id() != new.group_id()
        || old.batch.max_events != new.batch.max_events
        || old.batch.linger_ms != new.batch.linger_ms
        || old.ordering != new.ordering
        || old.max_keys_in_flight != new.max_keys_in_flight
        || old.max_held_records != new.max_held_records
}
