//! The `inboxd.toml` configuration: its shape, its defaults and its validation.
//!
//! Everything here is checked before the host connects to anything, so a typo
//! fails fast with the name of the key. Unknown keys are errors. Defaults are
//! named once, in [`defaults`]. Environment variables override a few keys that
//! differ per deployment (see [`Config::apply_env`]).

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod admin;
mod ceilings;
pub mod defaults;
mod handler;

pub use admin::{AdminConfig, TokenConfig};
pub use ceilings::{CeilingsConfig, Pattern, Refused, TokenPolicy};

pub use handler::{
    BatchConfig, DedupConfig, EventIdConfig, EventIdFormat, EventIdSource, HandlerConfig, InstancesConfig,
    LimitsConfig, MAX_TOPIC_NAME_BYTES, Ordering, RetryConfig, is_identifier,
};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config: `{key}` {problem}")]
    Invalid { key: String, problem: String },
}

pub(crate) fn invalid(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        problem: problem.into(),
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub database: DatabaseConfig,
    pub kafka: KafkaConfig,
    #[serde(default)]
    pub inbox: InboxConfig,
    #[serde(default)]
    pub outbox: OutboxConfig,
    #[serde(default)]
    pub wasm: WasmConfig,
    /// The admin API; off unless the section is present.
    #[serde(default)]
    pub admin: Option<AdminConfig>,
    /// Handlers defined here. More can be uploaded through the admin API.
    #[serde(default)]
    pub handlers: Vec<HandlerConfig>,
    /// Traces over OTLP; off unless `otlp_endpoint` is set.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// An OTLP/HTTP collector's traces URL (JSON encoding), e.g.
    /// `http://127.0.0.1:4318/v1/traces`: `inboxd run` exports a span per
    /// batch and per event there. Unset: no spans are made.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// The `service.name` the spans carry.
    #[serde(default = "default_service_name")]
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: default_service_name(),
        }
    }
}

fn default_service_name() -> String {
    "inboxd".to_owned()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboxConfig {
    /// Inbox rows older than this are purged (a duplicate arriving later is applied again).
    #[serde(default = "default_retention", deserialize_with = "duration")]
    pub retention: Duration,
    #[serde(default = "default_purge_interval", deserialize_with = "duration")]
    pub purge_interval: Duration,
    #[serde(default = "default_purge_batch_size")]
    pub purge_batch_size: u32,
    #[serde(default)]
    pub partitioning: InboxPartitioning,
}

impl Default for InboxConfig {
    fn default() -> Self {
        Self {
            retention: default_retention(),
            purge_interval: default_purge_interval(),
            purge_batch_size: defaults::PURGE_BATCH_SIZE,
            partitioning: InboxPartitioning::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// Published messages are kept this long; zero (the default) deletes
    /// each one as soon as the broker has it. Discarded parked messages are
    /// purged after this long too.
    #[serde(default = "default_outbox_retention", deserialize_with = "duration")]
    pub retention: Duration,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            retention: default_outbox_retention(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WasmConfig {
    /// Where compiled components are cached across restarts; `""` turns the
    /// cache off. Only inboxd may write there: entries are native code.
    #[serde(default = "default_cache_dir")]
    pub cache_dir: Option<PathBuf>,
    /// CPU seconds one component's compile may take, in a worker process
    /// of its own (a JavaScript or Python guest takes 11-14 s here).
    #[serde(default = "default_compile_cpu_seconds")]
    pub compile_cpu_seconds: u64,
    /// Address space of that worker, in MiB (those guests peak at ~0.5 GiB
    /// resident).
    #[serde(default = "default_compile_memory_mb")]
    pub compile_memory_mb: u64,
    /// Wasm instances alive at once, every handler's together, running or
    /// idle: the size of the engine's instance pool (see `wasm::warm`).
    /// It must hold every handler's calls at once ([`instances_short`]).
    #[serde(default = "default_instances")]
    pub instances: u32,
}

/// Why a pool of `instances` cannot give each of `handlers` handlers the
/// `calls_each` instances it may run at once, if it cannot.
///
/// A handler's calls run inside its batches' transactions, one per
/// database connection (on PostgreSQL each handler has
/// `database.max_connections` of its own; SQLite's one writer runs one call
/// at a time), so when every handler's share fits, no call ever waits for
/// an instance another handler holds. Regression (the forty-fourth
/// adversarial read, issue 23): the pool was first come first served, so
/// about 32 hostile handlers whose calls ran to their 30 s timeouts held
/// all 256 instances, and every other handler's calls waited their own
/// (shorter) timeouts, were retried, and never ran. Idle instances kept for
/// reuse need no share: a call that finds the pool full sends them back.
pub fn instances_short(handlers: usize, calls_each: usize, instances: usize) -> Option<String> {
    let need = handlers.saturating_mul(calls_each);
    (need > instances).then(|| {
        format!(
            "{handlers} handlers, each running up to {calls_each} events at once (one per database \
             connection, database.max_connections), need {need} Wasm instances; wasm.instances is \
             {instances}: raise it (at most 1024) or lower database.max_connections"
        )
    })
}

impl Default for WasmConfig {
    fn default() -> Self {
        Self {
            cache_dir: default_cache_dir(),
            compile_cpu_seconds: default_compile_cpu_seconds(),
            compile_memory_mb: default_compile_memory_mb(),
            instances: default_instances(),
        }
    }
}

fn default_compile_cpu_seconds() -> u64 {
    60
}

fn default_instances() -> u32 {
    256
}

fn default_compile_memory_mb() -> u64 {
    2048
}

impl WasmConfig {
    pub fn cache_dir(&self) -> Option<PathBuf> {
        self.cache_dir.clone().filter(|d| !d.as_os_str().is_empty())
    }
}

/// `$XDG_CACHE_HOME/inboxd`, else `$HOME/.cache/inboxd`, else no cache.
fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("inboxd"))
}

/// How PostgreSQL stores the inbox (SQLite always uses one table).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InboxPartitioning {
    /// One table; purged in small batches of rows.
    #[default]
    None,
    /// One partition per UTC day of the UUIDv7 event id's timestamp, dropped
    /// whole past retention; other ids share a default partition purged by rows.
    Daily,
}

/// Parses "14d", "90m", "1h 30m" (humantime's format).
fn duration<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_duration(&text).map_err(serde::de::Error::custom)
}

/// Parses a duration such as "14d" or "90m", with an error that shows the format.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration like \"14d\", \"36h\" or \"90m\" ({e})"))
}

/// Which database `database.url` names; decides the SQL dialect everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// `sqlite:...` or `postgres://` / `postgresql://`; `None` for anything else.
    pub fn of_url(url: &str) -> Option<Self> {
        if url.starts_with("sqlite:") {
            Some(Self::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Self::Postgres)
        } else {
            None
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `sqlite://PATH` or `postgres://USER@HOST:PORT/DB`.
    #[serde(default = "default_database_url")]
    pub url: String,
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: default_database_url(),
            max_connections: defaults::MAX_CONNECTIONS,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// `host:port[,host:port...]`.
    pub brokers: String,
    #[serde(default = "default_session_timeout_ms")]
    pub session_timeout_ms: u32,
    /// Extra librdkafka properties, passed through as they are. The host sets
    /// the commit-related ones itself and refuses overrides of them.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

fn default_retention() -> Duration {
    parse_duration(defaults::RETENTION).expect("default retention parses")
}
fn default_purge_interval() -> Duration {
    parse_duration(defaults::PURGE_INTERVAL).expect("default purge interval parses")
}
fn default_purge_batch_size() -> u32 {
    defaults::PURGE_BATCH_SIZE
}
fn default_database_url() -> String {
    defaults::DATABASE_URL.to_owned()
}
fn default_max_connections() -> u32 {
    defaults::MAX_CONNECTIONS
}
fn default_session_timeout_ms() -> u32 {
    defaults::SESSION_TIMEOUT_MS
}
fn default_outbox_retention() -> Duration {
    parse_duration(defaults::OUTBOX_RETENTION).expect("default outbox retention parses")
}

/// librdkafka properties the host owns: letting a config override them would
/// break "offsets advance only after the database commit".
const RESERVED_KAFKA_PROPERTIES: &[&str] = &[
    "enable.auto.commit",
    "enable.auto.offset.store",
    "group.id",
    "bootstrap.servers",
];

impl Config {
    /// Reads, parses, applies environment overrides and validates.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut config = Self::parse(&text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })?;
        config.apply_env(|key| std::env::var(key).ok());
        // Relative paths in the file are relative to the file, not to the working directory.
        if let Some(dir) = path.parent() {
            config.resolve_paths(dir);
        }
        config.validate()?;
        Ok(config)
    }

    /// Parses TOML text; the error names the offending key and line.
    pub fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// `INBOXD_DATABASE_URL` and `INBOXD_KAFKA_BROKERS` override the file.
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) {
        if let Some(url) = var("INBOXD_DATABASE_URL") {
            self.database.url = url;
        }
        if let Some(brokers) = var("INBOXD_KAFKA_BROKERS") {
            self.kafka.brokers = brokers;
        }
        if let Some(admin) = &mut self.admin {
            admin.apply_env(&var);
        }
    }

    fn resolve_paths(&mut self, base: &Path) {
        if let Some(dir) = self
            .wasm
            .cache_dir
            .as_mut()
            .filter(|d| d.is_relative() && !d.as_os_str().is_empty())
        {
            *dir = base.join(&*dir);
        }
        for handler in &mut self.handlers {
            if handler.component.is_relative() {
                handler.component = base.join(&handler.component);
            }
            if let Some(dir) = handler.migrations.as_mut().filter(|d| d.is_relative()) {
                *dir = base.join(&*dir);
            }
        }
    }

    /// Checks every value that parsing alone cannot; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = &self.database.url;
        let Some(backend) = Backend::of_url(url) else {
            return Err(invalid(
                "database.url",
                format!("must start with sqlite: or postgres://, got {url:?}"),
            ));
        };
        if let Some(endpoint) = &self.telemetry.otlp_endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(invalid(
                "telemetry.otlp_endpoint",
                format!("must be an http:// or https:// URL (OTLP over HTTP), got {endpoint:?}"),
            ));
        }
        if self.database.max_connections == 0 {
            return Err(invalid("database.max_connections", "must be at least 1"));
        }
        if self.kafka.brokers.trim().is_empty() {
            return Err(invalid("kafka.brokers", "must name at least one host:port"));
        }
        if self.kafka.session_timeout_ms < 1_000 {
            return Err(invalid("kafka.session_timeout_ms", "must be at least 1000"));
        }
        for key in self.kafka.properties.keys() {
            if RESERVED_KAFKA_PROPERTIES.contains(&key.as_str()) {
                return Err(invalid(
                    format!("kafka.properties.\"{key}\""),
                    "is set by inboxd itself and cannot be overridden",
                ));
            }
        }
        if let Some(reset) = self.kafka.properties.get("auto.offset.reset")
            && !matches!(reset.as_str(), "earliest" | "smallest" | "beginning")
        {
            // Where a partition the database has never seen starts: anywhere but
            // its beginning skips records that were never applied.
            return Err(invalid(
                "kafka.properties.\"auto.offset.reset\"",
                format!(
                    "{reset:?} would skip the records already in a partition this host has never \
                     consumed, which an inbox must not do; only \"earliest\" (the default) is allowed"
                ),
            ));
        }
        if self.inbox.retention < Duration::from_secs(60) {
            return Err(invalid("inbox.retention", "must be at least 1m"));
        }
        if self.inbox.purge_interval < Duration::from_secs(1) {
            return Err(invalid("inbox.purge_interval", "must be at least 1s"));
        }
        if !(1..=100_000).contains(&self.inbox.purge_batch_size) {
            return Err(invalid("inbox.purge_batch_size", "must be between 1 and 100000"));
        }
        if self.inbox.partitioning == InboxPartitioning::Daily && backend == Backend::Sqlite {
            return Err(invalid(
                "inbox.partitioning",
                "\"daily\" needs PostgreSQL; SQLite keeps one table",
            ));
        }
        if !(1..=3600).contains(&self.wasm.compile_cpu_seconds) {
            return Err(invalid("wasm.compile_cpu_seconds", "must be between 1 and 3600"));
        }
        if !(256..=65_536).contains(&self.wasm.compile_memory_mb) {
            return Err(invalid("wasm.compile_memory_mb", "must be between 256 and 65536"));
        }
        // Each instance reserves its slots' address space up front (several
        // GiB per memory slot, two memory slots per instance).
        if !(1..=1024).contains(&self.wasm.instances) {
            return Err(invalid("wasm.instances", "must be between 1 and 1024"));
        }
        if let Some(admin) = &self.admin {
            admin.validate()?;
        }
        let calls_each = match backend {
            Backend::Postgres => self.database.max_connections as usize,
            Backend::Sqlite => 1,
        };
        if let Some(short) = instances_short(self.handlers.len(), calls_each, self.wasm.instances as usize) {
            return Err(invalid("wasm.instances", short));
        }
        let mut names = std::collections::HashSet::new();
        let mut groups = std::collections::HashMap::new();
        for (i, handler) in self.handlers.iter().enumerate() {
            handler.validate(&format!("handlers[{i}]"))?;
            if backend == Backend::Sqlite && handler.limits.max_row_bytes > defaults::SQLITE_MAX_ROW_BYTES {
                return Err(invalid(
                    format!("handlers[{i}].limits.max_row_bytes"),
                    defaults::sqlite_row_bytes_refused(handler.limits.max_row_bytes),
                ));
            }
            if !names.insert(&handler.name) {
                return Err(invalid(
                    format!("handlers[{i}].name"),
                    format!("{:?} is declared twice", handler.name),
                ));
            }
            // Two handlers in one consumer group would each get some of the
            // other's partitions and never see the rest of their own.
            if let Some(other) = groups.insert(handler.group_id(), &handler.name) {
                return Err(invalid(
                    format!("handlers[{i}].group_id"),
                    format!(
                        "{:?} is also the consumer group of handler {other:?}: each handler needs its own",
                        handler.group_id()
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
