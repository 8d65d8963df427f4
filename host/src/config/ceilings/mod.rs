//! Per-token ceilings and allowlists: what an upload made with one
//! `[[admin.tokens]]` entry may ask for.
//!
//! The operator is trusted, a team is not (design §5): a team token's upload
//! is held to ceilings on every limit that costs the shared host (time,
//! memory, batch size, retries, ...), to the topics the operator allows it,
//! and to consumer groups in its handler's own namespace. A team token
//! whose ceilings are not configured gets the built-in ones
//! ([`defaults`]`::TEAM_CEILING_*`); an admin token is held only to the
//! ceilings and allowlists the operator set for it.
//!
//! This module decides from the settings alone. Whether a consumer group is
//! already used by another handler needs the registry, which checks it
//! (`registry::upload`). It never reads the database.

use super::{ConfigError, HandlerConfig, defaults, invalid};
use serde::Deserialize;

/// `[admin.tokens.ceilings]`: the largest value an upload with this token may
/// set for each key (the settings key is named beside each field). A key left
/// out is the built-in ceiling for a team token and no ceiling (the global
/// maximum) for an admin token.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CeilingsConfig {
    /// `limits.timeout_ms`; team default 30000.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// `limits.memory_mb`; team default 512.
    #[serde(default)]
    pub memory_mb: Option<u64>,
    /// `limits.output_bytes`; team default 262144.
    #[serde(default)]
    pub output_bytes: Option<u64>,
    /// `limits.max_statements`; team default 10000.
    #[serde(default)]
    pub max_statements: Option<u64>,
    /// `limits.max_rows`; team default 100000.
    #[serde(default)]
    pub max_rows: Option<u64>,
    /// `limits.max_statement_bytes`; team default 1048576.
    #[serde(default)]
    pub max_statement_bytes: Option<u64>,
    /// `limits.max_result_bytes`; team default 67108864.
    #[serde(default)]
    pub max_result_bytes: Option<u64>,
    /// `limits.max_payload_bytes`; team default 4194304.
    #[serde(default)]
    pub max_payload_bytes: Option<u64>,
    /// `limits.max_row_bytes`; team default 8388608.
    #[serde(default)]
    pub max_row_bytes: Option<u64>,
    /// `limits.max_outbox_messages`; team default 1000.
    #[serde(default)]
    pub max_outbox_messages: Option<u64>,
    /// `limits.max_outbox_bytes`; team default 8388608.
    #[serde(default)]
    pub max_outbox_bytes: Option<u64>,
    /// `batch.max_events`; team default 1000.
    #[serde(default)]
    pub max_events: Option<u64>,
    /// `batch.linger_ms`; team default 1000.
    #[serde(default)]
    pub linger_ms: Option<u64>,
    /// `retry.max_attempts`; team default 20.
    #[serde(default)]
    pub max_attempts: Option<u64>,
    /// `retry.backoff_max_ms` (and so `retry.backoff_initial_ms`); team default 300000.
    #[serde(default)]
    pub backoff_max_ms: Option<u64>,
    /// `instances.recycle_memory_mb`; team default 512.
    #[serde(default)]
    pub recycle_memory_mb: Option<u64>,
    /// `instances.recycle_after_events`; team default 100000.
    #[serde(default)]
    pub recycle_after_events: Option<u64>,
}

/// One bounded settings key.
struct Ceiling {
    /// The key under `ceilings`.
    name: &'static str,
    /// The settings key it bounds, as an upload's error names it.
    setting: &'static str,
    /// The smallest value the setting may take (a lower ceiling refuses everything).
    min: u64,
    /// The global maximum, where `validate_settings` has one.
    global_max: Option<u64>,
    /// Built in for a team token.
    team: u64,
    configured: fn(&CeilingsConfig) -> Option<u64>,
    value: fn(&HandlerConfig) -> u64,
}

/// Every ceiling; a new limit that costs the host belongs here.
const CEILINGS: &[Ceiling] = &[
    Ceiling {
        name: "timeout_ms",
        setting: "limits.timeout_ms",
        min: 1,
        global_max: Some(defaults::GLOBAL_MAX_TIMEOUT_MS),
        team: defaults::TEAM_CEILING_TIMEOUT_MS,
        configured: |c| c.timeout_ms,
        value: |h| h.limits.timeout_ms,
    },
    Ceiling {
        name: "memory_mb",
        setting: "limits.memory_mb",
        min: 1,
        global_max: Some(defaults::GLOBAL_MAX_MEMORY_MB),
        team: defaults::TEAM_CEILING_MEMORY_MB,
        configured: |c| c.memory_mb,
        value: |h| h.limits.memory_mb,
    },
    Ceiling {
        name: "output_bytes",
        setting: "limits.output_bytes",
        min: 1,
        global_max: None,
        team: defaults::TEAM_CEILING_OUTPUT_BYTES,
        configured: |c| c.output_bytes,
        value: |h| h.limits.output_bytes as u64,
    },
    Ceiling {
        name: "max_statements",
        setting: "limits.max_statements",
        min: 1,
        global_max: None,
        team: defaults::TEAM_CEILING_MAX_STATEMENTS,
        configured: |c| c.max_statements,
        value: |h| u64::from(h.limits.max_statements),
    },
    Ceiling {
        name: "max_rows",
        setting: "limits.max_rows",
        min: 1,
        global_max: None,
        team: defaults::TEAM_CEILING_MAX_ROWS,
        configured: |c| c.max_rows,
        value: |h| h.limits.max_rows as u64,
    },
    Ceiling {
        name: "max_statement_bytes",
        setting: "limits.max_statement_bytes",
        min: 1,
        global_max: None,
        team: defaults::TEAM_CEILING_MAX_STATEMENT_BYTES,
        configured: |c| c.max_statement_bytes,
        value: |h| h.limits.max_statement_bytes as u64,
    },
    Ceiling {
        name: "max_result_bytes",
        setting: "limits.max_result_bytes",
        min: 1,
        global_max: None,
        team: defaults::TEAM_CEILING_MAX_RESULT_BYTES,
        configured: |c| c.max_result_bytes,
        value: |h| h.limits.max_result_bytes as u64,
    },
    Ceiling {
        name: "max_payload_bytes",
        setting: "limits.max_payload_bytes",
        min: 1,
        global_max: None,
        team: defaults::TEAM_CEILING_MAX_PAYLOAD_BYTES,
        configured: |c| c.max_payload_bytes,
        value: |h| h.limits.max_payload_bytes as u64,
    },
    Ceiling {
        name: "max_row_bytes",
        setting: "limits.max_row_bytes",
        min: 1024,
        global_max: Some(defaults::GLOBAL_MAX_ROW_BYTES),
        team: defaults::TEAM_CEILING_MAX_ROW_BYTES,
        configured: |c| c.max_row_bytes,
        value: |h| h.limits.max_row_bytes as u64,
    },
    Ceiling {
        name: "max_outbox_messages",
        setting: "limits.max_outbox_messages",
        min: 1,
        global_max: None,
        team: defaults::TEAM_CEILING_MAX_OUTBOX_MESSAGES,
        configured: |c| c.max_outbox_messages,
        value: |h| h.limits.max_outbox_messages as u64,
    },
    Ceiling {
        name: "max_outbox_bytes",
        setting: "limits.max_outbox_bytes",
        min: 1,
        global_max: None,
        team: defaults::TEAM_CEILING_MAX_OUTBOX_BYTES,
        configured: |c| c.max_outbox_bytes,
        value: |h| h.limits.max_outbox_bytes as u64,
    },
    Ceiling {
        name: "max_events",
        setting: "batch.max_events",
        min: 1,
        global_max: Some(defaults::GLOBAL_MAX_BATCH),
        team: defaults::TEAM_CEILING_MAX_BATCH,
        configured: |c| c.max_events,
        value: |h| h.batch.max_events as u64,
    },
    Ceiling {
        name: "linger_ms",
        setting: "batch.linger_ms",
        min: 0,
        global_max: Some(defaults::GLOBAL_MAX_LINGER_MS),
        team: defaults::TEAM_CEILING_LINGER_MS,
        configured: |c| c.linger_ms,
        value: |h| h.batch.linger_ms,
    },
    Ceiling {
        name: "max_attempts",
        setting: "retry.max_attempts",
        min: 1,
        global_max: None,
        team: defaults::TEAM_CEILING_MAX_ATTEMPTS,
        configured: |c| c.max_attempts,
        value: |h| u64::from(h.retry.max_attempts),
    },
    Ceiling {
        name: "backoff_max_ms",
        setting: "retry.backoff_max_ms",
        min: 1,
        global_max: None,
        team: defaults::TEAM_CEILING_BACKOFF_MAX_MS,
        configured: |c| c.backoff_max_ms,
        value: |h| h.retry.backoff_max_ms,
    },
    Ceiling {
        name: "recycle_memory_mb",
        setting: "instances.recycle_memory_mb",
        min: 1,
        global_max: None,
        team: defaults::TEAM_CEILING_RECYCLE_MEMORY_MB,
        configured: |c| c.recycle_memory_mb,
        value: |h| h.instances.recycle_memory_mb,
    },
    Ceiling {
        name: "recycle_after_events",
        setting: "instances.recycle_after_events",
        min: 1,
        global_max: None,
        team: defaults::TEAM_CEILING_RECYCLE_AFTER_EVENTS,
        configured: |c| c.recycle_after_events,
        value: |h| u64::from(h.instances.recycle_after_events),
    },
];

impl CeilingsConfig {
    /// `key` is `admin.tokens[i].ceilings`.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        for ceiling in CEILINGS {
            let Some(value) = (ceiling.configured)(self) else {
                continue;
            };
            let max = ceiling.global_max.unwrap_or(u64::MAX);
            if !(ceiling.min..=max).contains(&value) {
                let range = match ceiling.global_max {
                    Some(max) => format!("between {} and {max} (the global maximum)", ceiling.min),
                    None => format!("at least {}", ceiling.min),
                };
                return Err(invalid(
                    format!("{key}.{}", ceiling.name),
                    format!("must be {range}"),
                ));
            }
        }
        Ok(())
    }
}

/// A topic or consumer group name, or a prefix: `orders`, `team_a.*`, `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    /// True if some name matches both.
    pub fn overlaps(&self, other: &Pattern) -> bool {
        match (self.0.strip_suffix('*'), other.0.strip_suffix('*')) {
            (Some(a), Some(b)) => a.starts_with(b) || b.starts_with(a),
            (Some(_), None) => self.matches(&other.0),
            (None, Some(_)) => other.matches(&self.0),
            (None, None) => self.0 == other.0,
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == self.0,
        }
    }

    /// `allowed` says which characters a name may have (a `*` may only end it).
    pub(super) fn parse(text: &str, allowed: fn(char) -> bool) -> Result<Self, String> {
        let name = text.strip_suffix('*').unwrap_or(text);
        if text.is_empty() {
            return Err("an empty pattern matches nothing".into());
        }
        if name.contains('*') {
            return Err(format!(
                "{text:?}: `*` may only end a pattern (a prefix such as \"team_a.*\")"
            ));
        }
        if let Some(bad) = name.chars().find(|c| !allowed(*c)) {
            return Err(format!("{text:?} has the character {bad:?}"));
        }
        Ok(Self(text.to_owned()))
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Characters Kafka allows in a topic name.
pub(super) fn topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// Characters of a table name a token may reserve.
pub(super) fn table_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Consumer group ids may hold any printable character.
pub(super) fn group_char(c: char) -> bool {
    !c.is_control()
}

/// An upload (or activation) refused by a token's ceilings or allowlists:
/// nothing changed. The message names the settings key, the value, the
/// bound and the config key that sets the bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// What one token's uploads may ask for, resolved from its `[[admin.tokens]]` entry.
#[derive(Debug, Clone)]
pub struct TokenPolicy {
    /// The token's name, as messages show it.
    name: String,
    /// `admin.tokens[i]`, as messages show it.
    key: String,
    /// A team token: built-in ceilings and the `inboxd.<name>` group rule.
    team: bool,
    ceilings: CeilingsConfig,
    topics: Option<Vec<Pattern>>,
    group_ids: Option<Vec<Pattern>>,
    /// Other tokens' `tables`: (pattern, that token's name).
    reserved_elsewhere: Vec<(Pattern, String)>,
}

impl TokenPolicy {
    /// Other tokens' table reservations (see `TokenConfig::tables`).
    pub fn with_reservations(mut self, elsewhere: Vec<(Pattern, String)>) -> Self {
        self.reserved_elsewhere = elsewhere;
        self
    }

    /// The token that reserved `table`, if another one did.
    pub fn reserved_by_other(&self, table: &str) -> Option<&str> {
        let table = table.to_ascii_lowercase();
        self.reserved_elsewhere
            .iter()
            .find(|(pattern, _)| pattern.matches(&table))
            .map(|(_, token)| token.as_str())
    }

    /// `key` is `admin.tokens[i]`; patterns have been validated.
    pub(super) fn new(
        name: &str,
        key: String,
        team: bool,
        ceilings: CeilingsConfig,
        topics: Option<Vec<Pattern>>,
        group_ids: Option<Vec<Pattern>>,
    ) -> Self {
        Self {
            name: name.to_owned(),
            key,
            team,
            ceilings,
            topics,
            group_ids,
            reserved_elsewhere: Vec::new(),
        }
    }

    /// No ceilings, any topic, any group: what an admin token without any of them gets.
    pub fn unrestricted(name: &str) -> Self {
        Self::new(name, "admin".into(), false, CeilingsConfig::default(), None, None)
    }

    /// A team token with the built-in ceilings and no allowlists: what
    /// `inboxd check` and `inboxd test` hold an upload to, the strictest a
    /// host applies without being told more.
    pub fn team_default(name: &str) -> Self {
        Self::new(
            name,
            "a team token with the built-in ceilings".into(),
            true,
            CeilingsConfig::default(),
            None,
            None,
        )
    }

    /// True if a team token has no `topics` allowlist: it may consume and
    /// publish any topic the host's Kafka credentials reach.
    pub fn team_without_topics(&self) -> bool {
        self.team && self.topics.is_none()
    }

    /// Checks a handler's parsed settings; `settings` is the JSON they came
    /// from, to say when a value is the default rather than the upload's.
    pub fn check(&self, handler: &HandlerConfig, settings: &serde_json::Value) -> Result<(), Refused> {
        self.check_ceilings(handler, settings)?;
        self.check_topics(handler)?;
        self.check_id_names(handler)?;
        self.check_group(handler, settings)
    }

    /// Regression (the review of the eighteenth adversarial read, issue 23):
    /// the host writes a consumer's id header and JSON field on every message
    /// any team publishes to that consumer's topics (`capabilities::outbox`),
    /// so a team that named them `content-type` and `amount` stripped every
    /// publisher's `content-type` and overwrote its `amount`, for every other
    /// consumer of the topic too. Names other than `event_id` are the
    /// operator's to choose: the configuration file or an admin token.
    fn check_id_names(&self, handler: &HandlerConfig) -> Result<(), Refused> {
        if !self.team {
            return Ok(());
        }
        let ids = &handler.event_id;
        for (key, name) in [("header", &ids.header), ("json_field", &ids.json_field)] {
            if name != defaults::EVENT_ID_HEADER {
                return Err(Refused(format!(
                    "settings.event_id.{key} = {name:?} is not allowed for token {:?}: the host writes a \
                     consumer's id names on every message published to its topics, so only an operator \
                     (the configuration file, or an admin token) may choose names other than \"{}\"",
                    self.name,
                    defaults::EVENT_ID_HEADER
                )));
            }
        }
        Ok(())
    }

    fn check_ceilings(&self, handler: &HandlerConfig, settings: &serde_json::Value) -> Result<(), Refused> {
        for ceiling in CEILINGS {
            let (bound, origin) = match ((ceiling.configured)(&self.ceilings), self.team) {
                (Some(bound), _) => (bound, ""),
                (None, true) => (ceiling.team, ", built in for team tokens"),
                (None, false) => continue,
            };
            let value = (ceiling.value)(handler);
            if value > bound {
                let default = if given(settings, ceiling.setting) {
                    ""
                } else {
                    " (the default: set a lower one in the settings)"
                };
                return Err(Refused(format!(
                    "settings.{} = {value}{default} is above the ceiling {bound} of token {:?} ({}.ceilings.{}{origin})",
                    ceiling.setting, self.name, self.key, ceiling.name
                )));
            }
        }
        Ok(())
    }

    fn check_topics(&self, handler: &HandlerConfig) -> Result<(), Refused> {
        let Some(allowed) = &self.topics else {
            return Ok(());
        };
        let outbox = handler
            .outbox_topics
            .iter()
            .map(|(alias, real)| (format!("settings.outbox_topics.{alias}"), real));
        let consumed = handler.topics.iter().map(|t| ("settings.topics".to_owned(), t));
        for (setting, topic) in consumed.chain(outbox) {
            if !allowed.iter().any(|p| p.matches(topic)) {
                return Err(Refused(format!(
                    "{setting}: topic {topic:?} is not allowed for token {:?} ({}.topics = [{}])",
                    self.name,
                    self.key,
                    list(allowed)
                )));
            }
        }
        Ok(())
    }

    fn check_group(&self, handler: &HandlerConfig, settings: &serde_json::Value) -> Result<(), Refused> {
        let group = handler.group_id();
        let own = format!("inboxd.{}", handler.name);
        // Handler names have no `.`, so `inboxd.<name>` and `inboxd.<name>.*`
        // of two handlers never overlap: names alone keep team groups apart.
        let in_own_namespace = group == own || group.starts_with(&format!("{own}."));
        let granted = self
            .group_ids
            .as_ref()
            .is_some_and(|patterns| patterns.iter().any(|p| p.matches(&group)));
        let restricted = self.team || self.group_ids.is_some();
        if !restricted || in_own_namespace || granted {
            return Ok(());
        }
        let shown = if given(settings, "group_id") {
            format!("settings.group_id = {group:?}")
        } else {
            format!("settings.group_id (default {group:?})")
        };
        let grants = match &self.group_ids {
            Some(patterns) => format!("{}.group_ids = [{}]", self.key, list(patterns)),
            None => format!("{}.group_ids grants others", self.key),
        };
        Err(Refused(format!(
            "{shown} is not allowed for token {:?}: its handlers use {own:?} or a group starting with \"{own}.\" ({grants})",
            self.name
        )))
    }
}

/// Whether the dotted `path` (`limits.timeout_ms`) is present in `settings`.
fn given(settings: &serde_json::Value, path: &str) -> bool {
    path.split('.')
        .try_fold(settings, |value, key| value.get(key))
        .is_some()
}

fn list(patterns: &[Pattern]) -> String {
    patterns
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
