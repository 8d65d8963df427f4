//! The `[admin]` section: where the admin API listens, how large an upload
//! may be, and the bearer tokens that may call it, with what each token's
//! uploads may ask for (ceilings and allowlists, see [`super::ceilings`]).

use super::ceilings::{self, CeilingsConfig, Pattern, TokenPolicy};
use super::{ConfigError, defaults, invalid, is_identifier};
use serde::Deserialize;
use std::net::SocketAddr;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// `IP:PORT`. Loopback by default: the API speaks plain HTTP.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Largest component an upload may carry (Python components are ~40 MiB).
    #[serde(default = "default_max_component_mb")]
    pub max_component_mb: u64,
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
}

/// A bearer token and what it may touch.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Who holds it; shown in logs and in `uploaded_by` (the secret never is).
    pub name: String,
    /// The secret itself, or (better) `token_env`: the variable that holds it.
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub token_env: Option<String>,
    /// May manage every handler, including ones not uploaded yet.
    #[serde(default)]
    pub admin: bool,
    /// The handler names a team token may manage.
    #[serde(default)]
    pub handlers: Vec<String>,
    /// `[admin.tokens.ceilings]`: the largest limits, batch sizes and retries
    /// an upload with this token may set. Unset keys: built-in ceilings for a
    /// team token, none for an admin token.
    #[serde(default)]
    pub ceilings: CeilingsConfig,
    /// Topics this token's handlers may consume and map in `outbox_topics`:
    /// exact names, or prefixes ending in `*` (`"team_a.*"`). Unset: any topic.
    #[serde(default)]
    pub topics: Option<Vec<String>>,
    /// Consumer groups this token's handlers may use besides `inboxd.<name>`
    /// and `inboxd.<name>.*` (same pattern form). Unset: none more for a team
    /// token, any group for an admin token. A group another handler uses is
    /// refused whatever this says.
    #[serde(default)]
    pub group_ids: Option<Vec<String>>,
    /// Table, view and index names (exact, or prefixes ending in `*`) that
    /// only this token's uploads may create. SQLite keeps every handler's
    /// tables in one namespace, so without this a team could take first a
    /// name another team's migrations need; on PostgreSQL each handler has
    /// its own schema and this changes nothing.
    #[serde(default)]
    pub tables: Option<Vec<String>>,
}

/// Tokens are secrets: never print them, not even in a `{:?}` of the config.
impl std::fmt::Debug for TokenConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConfig")
            .field("name", &self.name)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("token_env", &self.token_env)
            .field("admin", &self.admin)
            .field("handlers", &self.handlers)
            .field("ceilings", &self.ceilings)
            .field("topics", &self.topics)
            .field("group_ids", &self.group_ids)
            .field("tables", &self.tables)
            .finish()
    }
}

/// Shorter secrets can be guessed over a loopback connection in reasonable time.
const MIN_TOKEN_CHARS: usize = 16;

impl AdminConfig {
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen.parse().expect("validated by AdminConfig::validate")
    }

    pub fn max_component_bytes(&self) -> usize {
        (self.max_component_mb as usize) << 20
    }

    /// Fills each `token_env` token from the environment.
    pub(super) fn apply_env(&mut self, var: &impl Fn(&str) -> Option<String>) {
        for token in &mut self.tokens {
            if let Some(name) = &token.token_env
                && let Some(value) = var(name)
            {
                token.token = Some(value);
            }
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.parse::<SocketAddr>().is_err() {
            return Err(invalid(
                "admin.listen",
                format!("{:?} is not an IP:PORT such as \"127.0.0.1:8480\"", self.listen),
            ));
        }
        if !(1..=1024).contains(&self.max_component_mb) {
            return Err(invalid("admin.max_component_mb", "must be between 1 and 1024"));
        }
        if self.tokens.is_empty() {
            return Err(invalid(
                "admin.tokens",
                "must list at least one [[admin.tokens]] entry: without one the API refuses every call",
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, token) in self.tokens.iter().enumerate() {
            let key = format!("admin.tokens[{i}]");
            if token.name.trim().is_empty() || !names.insert(&token.name) {
                return Err(invalid(format!("{key}.name"), "must be non-empty and unique"));
            }
            let secret = match (&token.token, &token.token_env) {
                (Some(secret), _) => secret,
                (None, Some(var)) => {
                    return Err(invalid(
                        format!("{key}.token_env"),
                        format!("names {var}, which is not set"),
                    ));
                }
                (None, None) => {
                    return Err(invalid(key, "needs `token` or `token_env`"));
                }
            };
            if secret.chars().count() < MIN_TOKEN_CHARS {
                return Err(invalid(
                    format!("{key}.token"),
                    format!("must be at least {MIN_TOKEN_CHARS} characters"),
                ));
            }
            let scoped = !token.handlers.is_empty();
            if token.admin == scoped {
                return Err(invalid(
                    key,
                    "needs exactly one of `admin = true` or `handlers = [...]`",
                ));
            }
            if let Some(bad) = token.handlers.iter().find(|h| !is_identifier(h)) {
                return Err(invalid(
                    format!("{key}.handlers"),
                    format!("{bad:?} is not a handler name"),
                ));
            }
            token.ceilings.validate(&format!("{key}.ceilings"))?;
            patterns(&token.topics, ceilings::topic_char).map_err(|p| invalid(format!("{key}.topics"), p))?;
            patterns(&token.group_ids, ceilings::group_char)
                .map_err(|p| invalid(format!("{key}.group_ids"), p))?;
            patterns(&token.tables, ceilings::table_char).map_err(|p| invalid(format!("{key}.tables"), p))?;
        }
        // A name two tokens reserve would be neither's.
        for (i, a) in self.tokens.iter().enumerate() {
            for b in &self.tokens[i + 1..] {
                let overlap = a.table_patterns().into_iter().find_map(|p| {
                    b.table_patterns()
                        .into_iter()
                        .find(|q| p.overlaps(q))
                        .map(|q| (p, q))
                });
                if let Some((p, q)) = overlap {
                    return Err(invalid(
                        format!("admin.tokens[{i}].tables"),
                        format!("{p} of token {:?} overlaps {q} of token {:?}", a.name, b.name),
                    ));
                }
            }
        }
        if self
            .tokens
            .iter()
            .filter_map(|t| t.token.as_ref())
            .collect::<std::collections::HashSet<_>>()
            .len()
            != self.tokens.len()
        {
            return Err(invalid("admin.tokens", "two entries share one secret"));
        }
        Ok(())
    }
}

impl TokenConfig {
    /// Its `tables` patterns, lower-case (SQLite's names are not case-sensitive).
    /// Call after validation.
    pub fn table_patterns(&self) -> Vec<ceilings::Pattern> {
        let lower = self
            .tables
            .as_ref()
            .map(|list| list.iter().map(|t| t.to_ascii_lowercase()).collect());
        patterns(&lower, ceilings::table_char)
            .expect("patterns validated by AdminConfig::validate")
            .unwrap_or_default()
    }

    /// What uploads with this token may ask for; `index` is its place in
    /// `[[admin.tokens]]`, which refusals name. Call after validation.
    pub fn policy(&self, index: usize) -> TokenPolicy {
        let parse = |list: &Option<Vec<String>>, allowed: fn(char) -> bool| {
            patterns(list, allowed).expect("patterns validated by AdminConfig::validate")
        };
        TokenPolicy::new(
            &self.name,
            format!("admin.tokens[{index}]"),
            !self.admin,
            self.ceilings.clone(),
            parse(&self.topics, ceilings::topic_char),
            parse(&self.group_ids, ceilings::group_char),
        )
    }
}

/// An allowlist, if set; an empty list is an error (it would refuse every
/// upload: leave the key out, or remove the token).
fn patterns(list: &Option<Vec<String>>, allowed: fn(char) -> bool) -> Result<Option<Vec<Pattern>>, String> {
    let Some(list) = list else {
        return Ok(None);
    };
    if list.is_empty() {
        return Err("must list at least one name or prefix (leave it out to allow any)".into());
    }
    list.iter()
        .map(|p| Pattern::parse(p, allowed))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn default_listen() -> String {
    defaults::ADMIN_LISTEN.to_owned()
}
fn default_max_component_mb() -> u64 {
    defaults::MAX_COMPONENT_MB
}
