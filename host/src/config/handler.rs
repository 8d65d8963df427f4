//! A `[[handlers]]` entry: what a handler is, where its event id comes from,
//! its limits, batching, instances and retry policy, and their validation.

use super::{ConfigError, defaults, invalid};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerConfig {
    /// Lower-case letters, digits and `_`; the inbox key and the default group id use it.
    pub name: String,
    /// Path to the handler's `.wasm` component.
    pub component: PathBuf,
    /// The topics consumed. An upload's topics must match its token's
    /// `topics` allowlist, if the token has one.
    pub topics: Vec<String>,
    /// A folder of `NNNN_name.sql` files that create the handler's own tables.
    #[serde(default)]
    pub migrations: Option<PathBuf>,
    /// The Kafka consumer group; defaults to `inboxd.<name>`. No two
    /// handlers may share one (each would take the other's partitions). An
    /// upload with a team token may use only `inboxd.<name>` or a group
    /// starting with `inboxd.<name>.` (see `admin.tokens[].group_ids`).
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
    /// Deduplication by a business key besides the event id (off when absent).
    #[serde(default)]
    pub dedup: Option<DedupConfig>,
    /// How one partition's records are ordered: `"partition"` (all of them,
    /// in offset order) or `"key"` (each Kafka key's records in offset
    /// order; keys in parallel, and a failing key waits alone).
    #[serde(default)]
    pub ordering: Ordering,
    /// With `ordering = "key"`: a partition's keys with records in flight
    /// (running, waiting to be retried, or being held), at most.
    #[serde(default = "default_max_keys_in_flight")]
    pub max_keys_in_flight: usize,
    /// With `ordering = "key"`: records held behind dead letters, at most,
    /// over the handler's partitions; at the bound the handler takes no more
    /// records until an operator replays or discards some.
    #[serde(default = "default_max_held_records")]
    pub max_held_records: u64,
}

/// `ordering`: what a partition keeps in order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ordering {
    /// Every record of a partition in offset order: a retry holds the
    /// partition, and a parked record lets the next one go.
    #[default]
    Partition,
    /// Records of one Kafka key in offset order, different keys in
    /// parallel: a retry holds only its key, and the records of a parked
    /// key are held behind its dead letter. Records without a key keep
    /// partition order among themselves.
    Key,
}

fn default_max_keys_in_flight() -> usize {
    defaults::MAX_KEYS_IN_FLIGHT
}

fn default_max_held_records() -> u64 {
    defaults::MAX_HELD_RECORDS
}

/// The most keys in flight a partition may be given.
const MAX_KEYS_IN_FLIGHT: usize = 10_000;
/// The most held records a handler may be given.
const MAX_HELD_RECORDS: u64 = 10_000_000;

/// `[handlers.dedup]`: a second event with the same business key (an order
/// id, say) inside `window` of the first is skipped as a duplicate by key,
/// in the transaction that claims its event id. It catches a producer that
/// sends one order again under a new event id.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupConfig {
    /// A JSON path into the payload, `$.field` or `$.field.inner`.
    #[serde(default)]
    pub key: Option<String>,
    /// Or the value of this header (the last one of that name).
    #[serde(default)]
    pub header: Option<String>,
    /// How long after the first event a second with its key is skipped.
    #[serde(deserialize_with = "super::duration")]
    pub window: std::time::Duration,
}

/// The longest dedup window: a year.
const MAX_DEDUP_WINDOW: std::time::Duration = std::time::Duration::from_secs(366 * 86_400);

impl DedupConfig {
    /// The fields of `key`'s JSON path (`$.a.b` -> `["a", "b"]`).
    pub fn json_path(&self) -> Option<Vec<&str>> {
        self.key
            .as_deref()?
            .strip_prefix("$.")
            .map(|path| path.split('.').collect())
    }

    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        match (&self.key, &self.header) {
            (Some(_), None) => {
                let fields = self.json_path().unwrap_or_default();
                if fields.is_empty() || fields.iter().any(|f| f.is_empty()) {
                    return Err(invalid(
                        format!("{key}.dedup.key"),
                        format!(
                            "{:?} is not a JSON path like \"$.order_id\" or \"$.order.id\"",
                            self.key.as_deref().unwrap_or_default()
                        ),
                    ));
                }
            }
            (None, Some(header)) => {
                if header.is_empty()
                    || header.len() > MAX_ID_NAME_BYTES
                    || !header.chars().all(|c| c.is_ascii_graphic())
                {
                    return Err(invalid(
                        format!("{key}.dedup.header"),
                        format!(
                            "must be a header name of 1 to {MAX_ID_NAME_BYTES} printable ASCII characters, \
                             without spaces"
                        ),
                    ));
                }
            }
            _ => {
                return Err(invalid(
                    format!("{key}.dedup"),
                    "names where the business key is: `key = \"$.order_id\"` (a JSON path) or \
                     `header = \"order-id\"`, one of them",
                ));
            }
        }
        if self.window.is_zero() || self.window > MAX_DEDUP_WINDOW {
            return Err(invalid(
                format!("{key}.dedup.window"),
                "must be more than 0 and at most 366d",
            ));
        }
        Ok(())
    }
}

/// Keys of a `[[handlers]]` entry that an upload supplies itself.
const UPLOAD_OWNED_KEYS: &[&str] = &["name", "component", "migrations"];

impl HandlerConfig {
    /// A handler uploaded through the admin API: `settings` is a JSON object
    /// with the keys of a `[[handlers]]` entry except those the upload itself
    /// carries (name, component, migrations). Errors name the key.
    pub fn from_settings(name: &str, settings: &str) -> Result<Self, ConfigError> {
        let value: serde_json::Value =
            serde_json::from_str(settings).map_err(|e| invalid("settings", format!("is not JSON: {e}")))?;
        let serde_json::Value::Object(mut map) = value else {
            return Err(invalid("settings", "must be a JSON object"));
        };
        if let Some(key) = UPLOAD_OWNED_KEYS.iter().find(|k| map.contains_key(**k)) {
            return Err(invalid(
                format!("settings.{key}"),
                "comes from the upload itself and cannot be set here",
            ));
        }
        map.insert("name".into(), name.into());
        map.insert("component".into(), "".into());
        let config: Self =
            serde_json::from_value(map.into()).map_err(|e| invalid("settings", e.to_string()))?;
        if !is_identifier(name) {
            return Err(invalid(
                "name",
                format!("{name:?} must be 1-48 characters of a-z, 0-9 and _, starting with a letter"),
            ));
        }
        config.validate_settings("settings")?;
        Ok(config)
    }

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

/// Where to look for the id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventIdSource {
    /// The header named `event_id.header` only.
    Header,
    /// The top-level JSON field named `event_id.json_field` only.
    Json,
    /// The header if present, else the JSON field.
    #[default]
    HeaderOrJson,
}

/// What a valid id looks like.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventIdFormat {
    /// Any UUID; stored in canonical lower-case hyphenated form.
    #[default]
    Uuid,
    /// Any non-empty UTF-8 string of at most [`crate::event_id::MAX_ANY_ID_BYTES`] bytes, used as is.
    Any,
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

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
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
    /// Bytes of values one query may return (text and blobs by length, numbers 8).
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: usize,
    #[serde(default = "default_max_payload_bytes")]
    pub max_payload_bytes: usize,
    /// Largest row of the handler's tables and largest value its SQL binds or
    /// builds, in bytes of text (see `defaults::MAX_ROW_BYTES`).
    #[serde(default = "default_max_row_bytes")]
    pub max_row_bytes: usize,
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
            max_result_bytes: defaults::MAX_RESULT_BYTES,
            max_payload_bytes: defaults::MAX_PAYLOAD_BYTES,
            max_row_bytes: defaults::MAX_ROW_BYTES,
            max_outbox_messages: defaults::MAX_OUTBOX_MESSAGES,
            max_outbox_bytes: defaults::MAX_OUTBOX_BYTES,
        }
    }
}

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
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

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
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

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
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
fn default_max_result_bytes() -> usize {
    defaults::MAX_RESULT_BYTES
}
fn default_max_statement_bytes() -> usize {
    defaults::MAX_STATEMENT_BYTES
}
fn default_max_payload_bytes() -> usize {
    defaults::MAX_PAYLOAD_BYTES
}
fn default_max_row_bytes() -> usize {
    defaults::MAX_ROW_BYTES
}
fn default_max_outbox_messages() -> usize {
    defaults::MAX_OUTBOX_MESSAGES
}
fn default_max_outbox_bytes() -> usize {
    defaults::MAX_OUTBOX_BYTES
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
        if let Some(dir) = &self.migrations
            && !dir.is_dir()
        {
            return Err(invalid(
                format!("{key}.migrations"),
                format!("{} is not a folder", dir.display()),
            ));
        }
        self.validate_settings(key)
    }

    /// Checks everything but the name and the files: what an upload's settings carry.
    pub fn validate_settings(&self, key: &str) -> Result<(), ConfigError> {
        if self.topics.is_empty() || self.topics.iter().any(|t| t.trim().is_empty()) {
            return Err(invalid(
                format!("{key}.topics"),
                "must list at least one non-empty topic",
            ));
        }
        // Topic names are copied onto every message and into every list and
        // registry that names them: without a bound, a 1 MiB name was 1 GiB
        // for an event of 1,000 messages. Kafka's own limit is 249.
        let names = self
            .topics
            .iter()
            .chain(self.outbox_topics.iter().flat_map(|(n, r)| [n, r]));
        if let Some(long) = names.into_iter().find(|name| name.len() > MAX_TOPIC_NAME_BYTES) {
            return Err(invalid(
                format!("{key}.topics"),
                format!(
                    "a topic name (in topics or outbox_topics) is {} bytes, starting {:?}; \
                     Kafka's limit is {MAX_TOPIC_NAME_BYTES}",
                    long.len(),
                    long.chars().take(40).collect::<String>()
                ),
            ));
        }
        for (field, count) in [
            ("topics", self.topics.len()),
            ("outbox_topics", self.outbox_topics.len()),
        ] {
            if count > MAX_TOPIC_ENTRIES {
                return Err(invalid(
                    format!("{key}.{field}"),
                    format!("has {count} entries; at most {MAX_TOPIC_ENTRIES} are allowed"),
                ));
            }
        }
        // The only topics the handler may publish to (capabilities::outbox).
        // A real name Kafka refuses is not caught here: the relay parks such
        // messages with the reason, where `inboxd outbox` shows them.
        if let Some((name, real)) = self
            .outbox_topics
            .iter()
            .find(|(name, real)| name.trim().is_empty() || real.trim().is_empty())
        {
            return Err(invalid(
                format!("{key}.outbox_topics"),
                format!(
                    "{name:?} = {real:?}: neither the name a handler uses nor the real topic may be empty"
                ),
            ));
        }
        if self
            .group_id
            .as_ref()
            .is_some_and(|g| g.trim().is_empty() || g.chars().any(char::is_control))
        {
            return Err(invalid(
                format!("{key}.group_id"),
                "must be a non-empty consumer group name (leave it out for inboxd.<name>)",
            ));
        }
        // The host writes these names on every message to the handler's
        // topics (see `capabilities::outbox`): short, printable, no spaces.
        for (field, name) in [
            ("header", &self.event_id.header),
            ("json_field", &self.event_id.json_field),
        ] {
            let printable = name.chars().all(|c| c.is_ascii_graphic());
            if name.is_empty() || name.len() > MAX_ID_NAME_BYTES || !printable {
                return Err(invalid(
                    format!("{key}.event_id.{field}"),
                    format!("must be 1 to {MAX_ID_NAME_BYTES} printable ASCII characters, without spaces"),
                ));
            }
        }
        // librdkafka reads a topic starting with `^` as a pattern, and the
        // names registered for stamping are looked up by the topic a message
        // goes to (`capabilities::outbox::id_names`): a pattern would match
        // no message's topic, and a team publishing to a matching topic could
        // set the header or field such a handler deduplicates on (the
        // twenty-third read). Matching patterns on the host would be a second
        // regex dialect beside librdkafka's; so a pattern subscription reads
        // its ids from `event_id`, which every message carries as the host's.
        let custom_id = self.event_id.header != default_event_id_header()
            || self.event_id.json_field != default_event_id_json_field();
        if custom_id && let Some(pattern) = self.topics.iter().find(|t| t.starts_with('^')) {
            return Err(invalid(
                format!("{key}.event_id"),
                format!(
                    "topic {pattern:?} is a pattern: a handler subscribed by pattern takes its event id from \
                     the `event_id` header or field, which the host stamps on every message it relays (leave \
                     event_id.header and event_id.json_field out, or list the topics by name)"
                ),
            ));
        }
        if let Some(dedup) = &self.dedup {
            dedup.validate(key)?;
        }
        if !(1..=MAX_HELD_RECORDS).contains(&self.max_held_records) {
            return Err(invalid(
                format!("{key}.max_held_records"),
                format!("must be 1 to {MAX_HELD_RECORDS}"),
            ));
        }
        if !(1..=MAX_KEYS_IN_FLIGHT).contains(&self.max_keys_in_flight) {
            return Err(invalid(
                format!("{key}.max_keys_in_flight"),
                format!("must be 1 to {MAX_KEYS_IN_FLIGHT}"),
            ));
        }
        let limits = &self.limits;
        if !(1..=defaults::GLOBAL_MAX_TIMEOUT_MS).contains(&limits.timeout_ms) {
            return Err(invalid(
                format!("{key}.limits.timeout_ms"),
                format!("must be between 1 and {}", defaults::GLOBAL_MAX_TIMEOUT_MS),
            ));
        }
        if !(1..=defaults::GLOBAL_MAX_MEMORY_MB).contains(&limits.memory_mb) {
            return Err(invalid(
                format!("{key}.limits.memory_mb"),
                format!("must be between 1 and {}", defaults::GLOBAL_MAX_MEMORY_MB),
            ));
        }
        if !(1024..=defaults::GLOBAL_MAX_ROW_BYTES).contains(&(limits.max_row_bytes as u64)) {
            return Err(invalid(
                format!("{key}.limits.max_row_bytes"),
                format!("must be between 1024 and {}", defaults::GLOBAL_MAX_ROW_BYTES),
            ));
        }
        for (value, name) in [
            (limits.max_statements as usize, "max_statements"),
            (limits.max_rows, "max_rows"),
            (limits.max_statement_bytes, "max_statement_bytes"),
            (limits.max_result_bytes, "max_result_bytes"),
            (limits.max_payload_bytes, "max_payload_bytes"),
            (limits.max_outbox_messages, "max_outbox_messages"),
            (limits.max_outbox_bytes, "max_outbox_bytes"),
            (limits.output_bytes, "output_bytes"),
        ] {
            if value == 0 {
                return Err(invalid(format!("{key}.limits.{name}"), "must be at least 1"));
            }
        }
        if !(1..=defaults::GLOBAL_MAX_BATCH).contains(&(self.batch.max_events as u64)) {
            return Err(invalid(
                format!("{key}.batch.max_events"),
                format!("must be between 1 and {}", defaults::GLOBAL_MAX_BATCH),
            ));
        }
        if self.batch.linger_ms > defaults::GLOBAL_MAX_LINGER_MS {
            return Err(invalid(
                format!("{key}.batch.linger_ms"),
                format!("must be at most {}", defaults::GLOBAL_MAX_LINGER_MS),
            ));
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
/// The longest `event_id.header` or `event_id.json_field`.
pub const MAX_ID_NAME_BYTES: usize = 64;

/// The longest topic name, in `topics` and in `outbox_topics` (either
/// side): Kafka's own limit.
pub const MAX_TOPIC_NAME_BYTES: usize = 249;

/// The most entries `topics`, and `outbox_topics`, may have.
pub const MAX_TOPIC_ENTRIES: usize = 256;

pub fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z'))
        && name.len() <= 48
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}
