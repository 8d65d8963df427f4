//! The `inboxd.toml` configuration: its shape, its defaults and its validation.
//!
//! Everything here is checked before the host connects to anything, so a typo
//! fails fast with the name of the key. Unknown keys are errors. Defaults are
//! named once, in [`defaults`]. Environment variables override a few keys that
//! differ per deployment (see [`Config::apply_env`]).

use crate::event_id::{EventIdFormat, EventIdSource};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Every default value, in one place.
pub mod defaults {
    pub const DATABASE_URL: &str = "sqlite://inboxd.sqlite";
    /// One connection per handler's partition pump plus headroom for the admin work.
    pub const MAX_CONNECTIONS: u32 = 8;
    pub const EVENT_ID_HEADER: &str = "event_id";
    pub const EVENT_ID_JSON_FIELD: &str = "event_id";
    /// Long enough for a real handler's SQL, short enough that a runaway guest
    /// holds its partition (and its transaction) for seconds, not minutes.
    pub const TIMEOUT_MS: u64 = 5_000;
    /// Per instance. Rust guests need a few MiB; Python and JS guests need tens.
    pub const MEMORY_MB: u64 = 128;
    /// Guest stdout and stderr kept per event and copied into the host log.
    pub const OUTPUT_BYTES: usize = 16 * 1024;
    /// SQL statements one event may run: far above any real handler, low
    /// enough to stop a guest that loops over the database.
    pub const MAX_STATEMENTS: u32 = 1_000;
    /// Rows one query may return.
    pub const MAX_ROWS: usize = 10_000;
    pub const MAX_STATEMENT_BYTES: usize = 64 * 1024;
    /// Larger events are dead-lettered without running the handler.
    pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
    pub const MAX_OUTBOX_MESSAGES: usize = 100;
    pub const MAX_OUTBOX_BYTES: usize = 1024 * 1024;
    /// Published outbox rows are kept this long for inspection, then purged.
    pub const OUTBOX_RETENTION: &str = "1d";
    /// Records of one partition per transaction. A commit costs an fsync, so
    /// sharing it is the lever (design §7: ~290 vs ~20,000 events/s on
    /// PostgreSQL at 1 vs 100 per transaction); more than this adds latency
    /// and lock time for little gain.
    pub const MAX_BATCH: usize = 100;
    /// How long a partition's first waiting record may wait for company. While
    /// a batch is in flight, the next one fills anyway, so under load batches
    /// grow without waiting and at low load this bounds the added latency.
    pub const LINGER_MS: u64 = 5;
    /// A reused instance is replaced once its linear memory passes this
    /// (a reused JavaScript instance grows without end, design §7).
    pub const RECYCLE_MEMORY_MB: u64 = 64;
    /// ... or once it has handled this many events.
    pub const RECYCLE_AFTER_EVENTS: u32 = 1_000;
    pub const MAX_ATTEMPTS: u32 = 5;
    pub const BACKOFF_INITIAL_MS: u64 = 100;
    pub const BACKOFF_MAX_MS: u64 = 30_000;
    pub const SESSION_TIMEOUT_MS: u32 = 10_000;
    /// Kafka's usual replay window: an inbox row must outlive every copy of
    /// its event that the broker can still deliver.
    pub const RETENTION: &str = "14d";
    pub const PURGE_INTERVAL: &str = "1h";
    /// Rows deleted per purge transaction: small enough that no lock is held
    /// for more than milliseconds, large enough that 1M rows take seconds.
    pub const PURGE_BATCH_SIZE: u32 = 5_000;
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config: `{key}` {problem}")]
    Invalid { key: String, problem: String },
}

fn invalid(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
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
    #[serde(default)]
    pub handlers: Vec<HandlerConfig>,
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
    /// Published messages are purged after this long.
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
}

impl Default for WasmConfig {
    fn default() -> Self {
        Self {
            cache_dir: default_cache_dir(),
        }
    }
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerConfig {
    /// Lower-case letters, digits and `_`; the inbox key and the default group id use it.
    pub name: String,
    /// Path to the handler's `.wasm` component.
    pub component: PathBuf,
    pub topics: Vec<String>,
    /// A folder of `NNNN_name.sql` files that create the handler's own tables.
    #[serde(default)]
    pub migrations: Option<PathBuf>,
    /// Defaults to `inboxd.<name>`.
    #[serde(default)]
    pub group_id: Option<String>,
    #[serde(default)]
    pub event_id: EventIdConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub retry: RetryConfig,
    #[serde(default)]
    pub batch: BatchConfig,
    #[serde(default)]
    pub instances: InstancesConfig,
    /// Topics the handler publishes to, by the name it uses -> the real topic.
    #[serde(default)]
    pub outbox_topics: BTreeMap<String, String>,
}

impl HandlerConfig {
    pub fn group_id(&self) -> String {
        self.group_id
            .clone()
            .unwrap_or_else(|| format!("inboxd.{}", self.name))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventIdConfig {
    #[serde(default)]
    pub source: EventIdSource,
    #[serde(default = "default_event_id_header")]
    pub header: String,
    #[serde(default = "default_event_id_json_field")]
    pub json_field: String,
    #[serde(default)]
    pub format: EventIdFormat,
}

impl Default for EventIdConfig {
    fn default() -> Self {
        Self {
            source: EventIdSource::default(),
            header: default_event_id_header(),
            json_field: default_event_id_json_field(),
            format: EventIdFormat::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u64,
    #[serde(default = "default_output_bytes")]
    pub output_bytes: usize,
    #[serde(default = "default_max_statements")]
    pub max_statements: u32,
    #[serde(default = "default_max_rows")]
    pub max_rows: usize,
    #[serde(default = "default_max_statement_bytes")]
    pub max_statement_bytes: usize,
    #[serde(default = "default_max_payload_bytes")]
    pub max_payload_bytes: usize,
    #[serde(default = "default_max_outbox_messages")]
    pub max_outbox_messages: usize,
    #[serde(default = "default_max_outbox_bytes")]
    pub max_outbox_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            timeout_ms: defaults::TIMEOUT_MS,
            memory_mb: defaults::MEMORY_MB,
            output_bytes: defaults::OUTPUT_BYTES,
            max_statements: defaults::MAX_STATEMENTS,
            max_rows: defaults::MAX_ROWS,
            max_statement_bytes: defaults::MAX_STATEMENT_BYTES,
            max_payload_bytes: defaults::MAX_PAYLOAD_BYTES,
            max_outbox_messages: defaults::MAX_OUTBOX_MESSAGES,
            max_outbox_bytes: defaults::MAX_OUTBOX_BYTES,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Records of one partition that share a transaction, at most. 1 is the
    /// classic one-transaction-per-event inbox.
    #[serde(default = "default_max_batch")]
    pub max_events: usize,
    /// How long a partition's records may wait for a batch to fill.
    #[serde(default = "default_linger_ms")]
    pub linger_ms: u64,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_events: defaults::MAX_BATCH,
            linger_ms: defaults::LINGER_MS,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstancesConfig {
    /// Run consecutive events on one instance instead of a fresh one each.
    /// For languages whose instantiation is costly (Python, JavaScript: about
    /// 1 ms against 30 us for Rust). Off by default: then nothing a handler
    /// keeps in memory survives into its next event.
    #[serde(default)]
    pub reuse: bool,
    #[serde(default = "default_recycle_memory_mb")]
    pub recycle_memory_mb: u64,
    #[serde(default = "default_recycle_after_events")]
    pub recycle_after_events: u32,
}

impl Default for InstancesConfig {
    fn default() -> Self {
        Self {
            reuse: false,
            recycle_memory_mb: defaults::RECYCLE_MEMORY_MB,
            recycle_after_events: defaults::RECYCLE_AFTER_EVENTS,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Deliveries of one event before a retryable failure is dead-lettered.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    #[serde(default = "default_backoff_initial_ms")]
    pub backoff_initial_ms: u64,
    #[serde(default = "default_backoff_max_ms")]
    pub backoff_max_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: defaults::MAX_ATTEMPTS,
            backoff_initial_ms: defaults::BACKOFF_INITIAL_MS,
            backoff_max_ms: defaults::BACKOFF_MAX_MS,
        }
    }
}

fn default_recycle_memory_mb() -> u64 {
    defaults::RECYCLE_MEMORY_MB
}
fn default_recycle_after_events() -> u32 {
    defaults::RECYCLE_AFTER_EVENTS
}
fn default_max_batch() -> usize {
    defaults::MAX_BATCH
}
fn default_linger_ms() -> u64 {
    defaults::LINGER_MS
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
fn default_event_id_header() -> String {
    defaults::EVENT_ID_HEADER.to_owned()
}
fn default_event_id_json_field() -> String {
    defaults::EVENT_ID_JSON_FIELD.to_owned()
}
fn default_timeout_ms() -> u64 {
    defaults::TIMEOUT_MS
}
fn default_memory_mb() -> u64 {
    defaults::MEMORY_MB
}
fn default_output_bytes() -> usize {
    defaults::OUTPUT_BYTES
}
fn default_max_statements() -> u32 {
    defaults::MAX_STATEMENTS
}
fn default_max_rows() -> usize {
    defaults::MAX_ROWS
}
fn default_max_statement_bytes() -> usize {
    defaults::MAX_STATEMENT_BYTES
}
fn default_max_payload_bytes() -> usize {
    defaults::MAX_PAYLOAD_BYTES
}
fn default_max_outbox_messages() -> usize {
    defaults::MAX_OUTBOX_MESSAGES
}
fn default_max_outbox_bytes() -> usize {
    defaults::MAX_OUTBOX_BYTES
}
fn default_outbox_retention() -> Duration {
    parse_duration(defaults::OUTBOX_RETENTION).expect("default outbox retention parses")
}
fn default_max_attempts() -> u32 {
    defaults::MAX_ATTEMPTS
}
fn default_backoff_initial_ms() -> u64 {
    defaults::BACKOFF_INITIAL_MS
}
fn default_backoff_max_ms() -> u64 {
    defaults::BACKOFF_MAX_MS
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
        if !(url.starts_with("sqlite:") || url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            return Err(invalid(
                "database.url",
                format!("must start with sqlite: or postgres://, got {url:?}"),
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
        if self.inbox.retention < Duration::from_secs(60) {
            return Err(invalid("inbox.retention", "must be at least 1m"));
        }
        if self.inbox.purge_interval < Duration::from_secs(1) {
            return Err(invalid("inbox.purge_interval", "must be at least 1s"));
        }
        if !(1..=100_000).contains(&self.inbox.purge_batch_size) {
            return Err(invalid("inbox.purge_batch_size", "must be between 1 and 100000"));
        }
        if self.inbox.partitioning == InboxPartitioning::Daily && url.starts_with("sqlite:") {
            return Err(invalid(
                "inbox.partitioning",
                "\"daily\" needs PostgreSQL; SQLite keeps one table",
            ));
        }
        if self.handlers.is_empty() {
            return Err(invalid(
                "handlers",
                "must declare at least one [[handlers]] entry",
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, handler) in self.handlers.iter().enumerate() {
            handler.validate(&format!("handlers[{i}]"))?;
            if !names.insert(&handler.name) {
                return Err(invalid(
                    format!("handlers[{i}].name"),
                    format!("{:?} is declared twice", handler.name),
                ));
            }
        }
        Ok(())
    }
}

impl HandlerConfig {
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if !is_identifier(&self.name) {
            return Err(invalid(
                format!("{key}.name"),
                format!(
                    "{:?} must be 1-48 characters of a-z, 0-9 and _, starting with a letter",
                    self.name
                ),
            ));
        }
        if !self.component.is_file() {
            return Err(invalid(
                format!("{key}.component"),
                format!(
                    "{} is not a file (build the component first)",
                    self.component.display()
                ),
            ));
        }
        if self.topics.is_empty() || self.topics.iter().any(|t| t.trim().is_empty()) {
            return Err(invalid(
                format!("{key}.topics"),
                "must list at least one non-empty topic",
            ));
        }
        if let Some(dir) = &self.migrations
            && !dir.is_dir()
        {
            return Err(invalid(
                format!("{key}.migrations"),
                format!("{} is not a folder", dir.display()),
            ));
        }
        if self.event_id.header.is_empty() {
            return Err(invalid(format!("{key}.event_id.header"), "must not be empty"));
        }
        if self.event_id.json_field.is_empty() {
            return Err(invalid(format!("{key}.event_id.json_field"), "must not be empty"));
        }
        let limits = &self.limits;
        if !(1..=600_000).contains(&limits.timeout_ms) {
            return Err(invalid(
                format!("{key}.limits.timeout_ms"),
                "must be between 1 and 600000",
            ));
        }
        if !(1..=4096).contains(&limits.memory_mb) {
            return Err(invalid(
                format!("{key}.limits.memory_mb"),
                "must be between 1 and 4096",
            ));
        }
        for (value, name) in [
            (limits.max_statements as usize, "max_statements"),
            (limits.max_rows, "max_rows"),
            (limits.max_statement_bytes, "max_statement_bytes"),
            (limits.max_payload_bytes, "max_payload_bytes"),
            (limits.max_outbox_messages, "max_outbox_messages"),
            (limits.max_outbox_bytes, "max_outbox_bytes"),
            (limits.output_bytes, "output_bytes"),
        ] {
            if value == 0 {
                return Err(invalid(format!("{key}.limits.{name}"), "must be at least 1"));
            }
        }
        if !(1..=10_000).contains(&self.batch.max_events) {
            return Err(invalid(
                format!("{key}.batch.max_events"),
                "must be between 1 and 10000",
            ));
        }
        if self.batch.linger_ms > 10_000 {
            return Err(invalid(format!("{key}.batch.linger_ms"), "must be at most 10000"));
        }
        // Above limits.memory_mb it never triggers (the limit stops the guest
        // first), which is not an error: the two are set for different reasons.
        if self.instances.recycle_memory_mb == 0 {
            return Err(invalid(
                format!("{key}.instances.recycle_memory_mb"),
                "must be at least 1",
            ));
        }
        if self.instances.recycle_after_events == 0 {
            return Err(invalid(
                format!("{key}.instances.recycle_after_events"),
                "must be at least 1",
            ));
        }
        if self.retry.max_attempts == 0 {
            return Err(invalid(format!("{key}.retry.max_attempts"), "must be at least 1"));
        }
        if self.retry.backoff_initial_ms == 0 || self.retry.backoff_initial_ms > self.retry.backoff_max_ms {
            return Err(invalid(
                format!("{key}.retry.backoff_initial_ms"),
                "must be at least 1 and at most retry.backoff_max_ms",
            ));
        }
        Ok(())
    }
}

/// Names that are safe to splice into SQL identifiers and group ids.
pub fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z'))
        && name.len() <= 48
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}

#[cfg(test)]
mod tests;
