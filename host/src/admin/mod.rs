//! The admin HTTP API (axum): handler uploads and their lifecycle, dead
//! letters, parked outbox messages, metrics and health. Off unless `[admin]` is configured; bound to
//! loopback by default.
//!
//! Every `/v1` route needs a bearer token ([`auth`]); a team token reaches
//! only its own handlers (403 otherwise), and what it uploads or activates
//! is held to its ceilings and allowlists (403 naming the key; see
//! `config::ceilings`). `/metrics`, `/healthz` and
//! `/readyz` are open, as scrapers and probes expect. Errors are JSON:
//! `{"error": "..."}` with a status that says whose fault it was.
//!
//! `/` is the operator console ([`console`]): static files compiled into the
//! binary that call the same `/v1` API with the token the operator types in.

mod auth;
mod connections;
mod console;
mod counts;
mod dead_letters;
mod group_pages;
mod handlers;
mod in_flight;
mod ops;
mod outbox;
mod overview;
mod responses;
mod serve;
mod upload_turns;

use crate::config::AdminConfig;
use crate::registry::Registry;
use auth::Tokens;
use axum::Json;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Room for the settings and migrations next to the largest component.
const UPLOAD_OVERHEAD_BYTES: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} (admin.listen): {source}")]
pub struct ListenError {
    addr: String,
    source: std::io::Error,
}

/// The admin API's socket, bound at start-up so a taken port fails the start.
pub struct Listener {
    listener: tokio::net::TcpListener,
    config: AdminConfig,
}

impl Listener {
    pub async fn bind(config: &AdminConfig) -> Result<Self, ListenError> {
        let addr = config.listen_addr();
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ListenError {
                addr: addr.to_string(),
                source,
            })?;
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "the admin API listens beyond loopback over plain HTTP: put TLS in front of it");
        }
        for (index, token) in config.tokens.iter().enumerate() {
            if token.policy(index).team_without_topics() {
                tracing::warn!(
                    token = token.name,
                    "team token without a `topics` allowlist: its handlers may consume and publish \
                     any topic this host can reach (set admin.tokens[{index}].topics)"
                );
            }
        }
        Ok(Self {
            listener,
            config: config.clone(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound socket has an address")
    }

    /// Serves until `shutdown`.
    pub async fn serve(self, registry: Registry, shutdown: CancellationToken) {
        let addr = self.local_addr();
        let state = AppState(Arc::new(Shared {
            tokens: Tokens::new(&self.config.tokens),
            max_component_bytes: self.config.max_component_bytes(),
            probe: ops::ReadyProbe::new(registry.kafka()),
            counts: counts::CountsCache::default(),
            places: responses::Places::default(),
            upload_turns: upload_turns::UploadTurns::default(),
            bulk: in_flight::InFlight::default(),
            listings: in_flight::InFlight::default(),
            group_pages: group_pages::GroupPages::default(),
            registry,
        }));
        let app = router(state, self.config.max_component_bytes());
        tracing::info!(%addr, "admin API listening");
        serve::serve(self.listener, app, shutdown).await;
    }
}

/// The largest body of a request other than an upload.
const JSON_BODY_BYTES: usize = 64 << 10;

fn router(state: AppState, max_component_bytes: usize) -> Router {
    Router::new()
        .route("/", get(console::page))
        .route("/console/{asset}", get(console::asset))
        .route("/v1/overview", get(overview::overview))
        .route("/v1/handlers", get(handlers::list))
        .route(
            "/v1/handlers/{name}",
            get(handlers::show)
                .post(handlers::upload)
                .delete(handlers::delete)
                // Only an upload carries a component.
                .layer(DefaultBodyLimit::max(max_component_bytes + UPLOAD_OVERHEAD_BYTES)),
        )
        .route("/v1/handlers/{name}/activate", post(handlers::activate))
        .route("/v1/handlers/{name}/rollback", post(handlers::rollback))
        .route("/v1/handlers/{name}/pause", post(handlers::pause))
        .route("/v1/handlers/{name}/resume", post(handlers::resume))
        .route("/v1/handlers/{name}/outbox/parked", get(outbox::list))
        .route("/v1/handlers/{name}/outbox/parked/{seq}", get(outbox::show))
        .route("/v1/handlers/{name}/outbox/parked/retry", post(outbox::retry_all))
        .route(
            "/v1/handlers/{name}/outbox/parked/{seq}/retry",
            post(outbox::retry),
        )
        .route(
            "/v1/handlers/{name}/outbox/parked/{seq}/discard",
            post(outbox::discard),
        )
        .route("/v1/dead-letters", get(dead_letters::list))
        .route("/v1/dead-letters/replay", post(dead_letters::replay_all))
        .route("/v1/dead-letters/groups", get(dead_letters::groups))
        .route(
            "/v1/dead-letters/groups/{id}/replay",
            post(dead_letters::replay_group),
        )
        .route(
            "/v1/dead-letters/groups/{id}/discard",
            post(dead_letters::discard_group),
        )
        .route("/v1/dead-letters/{id}", get(dead_letters::show))
        .route("/v1/dead-letters/{id}/replay", post(dead_letters::replay))
        .route("/v1/dead-letters/{id}/discard", post(dead_letters::discard))
        .route("/metrics", get(ops::metrics))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        // Every other body is a small JSON request: read whole before it is
        // looked at, a 104 MiB limit let each call hold that much (the
        // fifteenth read of issue 23's third round).
        .layer(DefaultBodyLimit::max(JSON_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            responses::hold_a_place,
        ))
        .with_state(state)
}

#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    registry: Registry,
    tokens: Tokens,
    max_component_bytes: usize,
    probe: ops::ReadyProbe,
    /// The per-handler counts `/metrics` and the overview show.
    counts: counts::CountsCache,
    /// Requests and responses in progress per token (see [`responses`]).
    places: responses::Places,
    /// Who may upload now (see [`upload_turns::UploadTurns`]).
    upload_turns: upload_turns::UploadTurns,
    /// Team tokens with a bulk request running: a dead-letter replay or
    /// discard (which runs guests) or an outbox re-queue (see [`in_flight`]).
    bulk: in_flight::InFlight,
    /// Team tokens with a dead-letter group listing running (each reads
    /// every parked letter of the token's handlers).
    listings: in_flight::InFlight,
    /// What each token's last call on a dead-letter group kept of its members.
    group_pages: group_pages::GroupPages,
}

impl std::ops::Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// An error response: a status and a message for the caller.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    /// What the caller is told (also a group member's `detail`).
    pub(crate) message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }
    /// The database (or another dependency) failed: the caller may retry.
    pub fn unavailable(error: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, error.to_string())
    }
}

impl From<crate::db::DbError> for ApiError {
    fn from(error: crate::db::DbError) -> Self {
        Self::unavailable(format!("database: {error}"))
    }
}

impl From<crate::pipeline::PipelineError> for ApiError {
    fn from(error: crate::pipeline::PipelineError) -> Self {
        Self::unavailable(error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(serde_json::json!({ "error": self.message }));
        if self.status == StatusCode::UNAUTHORIZED {
            return (self.status, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response();
        }
        (self.status, body).into_response()
    }
}
