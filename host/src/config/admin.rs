//! The `[admin]` section: where the admin API listens, how large an upload
//! may be, and the bearer tokens that may call it.

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

fn default_listen() -> String {
    defaults::ADMIN_LISTEN.to_owned()
}
fn default_max_component_mb() -> u64 {
    defaults::MAX_COMPONENT_MB
}
