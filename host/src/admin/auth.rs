//! Bearer tokens: who is calling, which handlers they may touch, and what
//! their uploads may ask for (the token's [`TokenPolicy`]).
//!
//! Secrets are kept only as SHA-256 digests and compared in constant time
//! against every configured token (no early exit), so neither the response
//! time nor the log reveals how much of a guess was right. Only a token's
//! name is ever logged.

use super::{ApiError, AppState};
use crate::config::{TokenConfig, TokenPolicy};
use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use subtle::ConstantTimeEq;

struct Token {
    name: String,
    digest: [u8; 32],
    scope: TokenScope,
    policy: Arc<TokenPolicy>,
}

#[derive(Debug, Clone)]
pub enum TokenScope {
    Admin,
    Handlers(Vec<String>),
}

pub struct Tokens(Vec<Token>);

impl Tokens {
    pub fn new(configured: &[TokenConfig]) -> Self {
        let reserved: Vec<_> = configured
            .iter()
            .flat_map(|t| t.table_patterns().into_iter().map(|p| (p, t.name.clone())))
            .collect();
        Self(
            configured
                .iter()
                .enumerate()
                .filter_map(|(index, t)| {
                    let elsewhere = reserved
                        .iter()
                        .filter(|(_, name)| *name != t.name)
                        .cloned()
                        .collect();
                    let secret = t.token.as_deref()?;
                    Some(Token {
                        name: t.name.clone(),
                        digest: Sha256::digest(secret.as_bytes()).into(),
                        scope: if t.admin {
                            TokenScope::Admin
                        } else {
                            TokenScope::Handlers(t.handlers.clone())
                        },
                        policy: Arc::new(t.policy(index).with_reservations(elsewhere)),
                    })
                })
                .collect(),
        )
    }

    /// Who a request's `Authorization` header says it comes from, for
    /// [`super::responses`]: a known team token by name, an admin token, or
    /// no known token at all.
    pub fn who(&self, header: Option<&axum::http::HeaderValue>) -> Who {
        let presented = header
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim);
        match presented.and_then(|p| self.find(p)) {
            Some(Token {
                scope: TokenScope::Admin,
                ..
            }) => Who::Admin,
            Some(token) => Who::Team(token.name.clone()),
            None => Who::Unknown,
        }
    }

    fn find(&self, presented: &str) -> Option<&Token> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for token in &self.0 {
            if bool::from(token.digest.ct_eq(&digest)) {
                found = Some(token);
            }
        }
        found
    }
}

/// Who a request comes from, as far as its token says.
pub enum Who {
    Admin,
    Team(String),
    /// No token, or one the host does not know: open routes and refusals.
    Unknown,
}

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub name: String,
    pub scope: TokenScope,
    /// Ceilings and allowlists for what this caller uploads or activates.
    pub policy: Arc<TokenPolicy>,
}

impl Caller {
    pub fn may_manage(&self, handler: &str) -> bool {
        match &self.scope {
            TokenScope::Admin => true,
            TokenScope::Handlers(names) => names.iter().any(|n| n == handler),
        }
    }

    /// The handlers this caller may manage; `None`: every handler (an admin token).
    pub fn handlers(&self) -> Option<&[String]> {
        match &self.scope {
            TokenScope::Admin => None,
            TokenScope::Handlers(names) => Some(names),
        }
    }

    /// 403 unless this caller may manage `handler`.
    pub fn check(&self, handler: &str) -> Result<(), ApiError> {
        if self.may_manage(handler) {
            return Ok(());
        }
        let allowed = match &self.scope {
            TokenScope::Admin => String::new(),
            TokenScope::Handlers(names) => names.join(", "),
        };
        Err(ApiError::forbidden(format!(
            "token {:?} may not manage handler {handler:?}; it may manage only: {allowed}",
            self.name
        )))
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(header) = parts.headers.get(AUTHORIZATION) else {
            return Err(ApiError::unauthorized(
                "missing bearer token: send the header `Authorization: Bearer <token>` (inboxd CLI: --token or INBOXD_TOKEN)",
            ));
        };
        let presented = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| ApiError::unauthorized("the Authorization header must be `Bearer <token>`"))?;
        let Some(token) = state.tokens.find(presented) else {
            // The path as the caller sent it, cut: it is theirs, up to hyper's buffer.
            let path: String = parts.uri.path().chars().take(200).collect();
            tracing::warn!(path, "admin API call with an unknown token");
            return Err(ApiError::unauthorized("unknown token"));
        };
        Ok(Caller {
            name: token.name.clone(),
            scope: token.scope.clone(),
            policy: token.policy.clone(),
        })
    }
}

#[cfg(test)]
impl Caller {
    /// A caller with `scope`, held to a team token's built-in ceilings.
    pub fn for_test(name: &str, scope: TokenScope) -> Self {
        Self {
            name: name.into(),
            scope,
            policy: Arc::new(crate::config::TokenPolicy::team_default(name)),
        }
    }
}
