//! `/v1/handlers/{name}/outbox/parked`: outbox messages the broker will never
//! accept, parked by the relay, over HTTP (as `inboxd outbox`). A team token
//! sees and acts on its own handlers' messages only, as with dead letters.
//!
//! As with dead letters, the list leaves every message's key, payload and
//! headers out (it names their size); one message's detail has them.
//!
//! Re-queueing puts a message back in its bucket's line (the relay sends it
//! next); discarding marks it handled without sending it. Neither changes the
//! message: fix what made it undeliverable (the mapping, the topic's ACLs or
//! size limit) first.

use super::auth::Caller;
use super::{ApiError, AppState};
use crate::db::outbox::{self, ParkedFilter};
use axum::Json;
use axum::extract::{Path, Query, State};
use serde_json::{Value, json};

#[derive(serde::Deserialize)]
pub struct ListQuery {
    /// Also discarded ones.
    #[serde(default)]
    all: bool,
    /// At most this many, oldest first (default and maximum 1000).
    #[serde(default)]
    limit: Option<i64>,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Vec<Value>>, ApiError> {
    caller.check(&name)?;
    let filter = ParkedFilter {
        handler: Some(&name),
        include_discarded: query.all,
        limit: query.limit.unwrap_or(1000).clamp(1, 1000),
        without_record: true,
        ..ParkedFilter::default()
    };
    let rows = outbox::parked(state.registry.db(), &filter).await?;
    Ok(Json(rows.iter().map(outbox::Parked::summary_json).collect()))
}

/// One parked (or discarded) message of the handler in full.
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path((name, seq)): Path<(String, i64)>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&name)?;
    // One message in full at a time per team token (up to `max_outbox_bytes`,
    // several times that once escaped: the eighteenth read).
    let _turn = state.listings.wait(&caller, "parked outbox message").await?;
    let filter = ParkedFilter {
        handler: Some(&name),
        seqs: Some(&[seq]),
        include_discarded: true,
        ..ParkedFilter::default()
    };
    let rows = outbox::parked(state.registry.db(), &filter).await?;
    let row = rows.first().ok_or_else(|| not_parked(&name, seq))?;
    Ok(Json(row.detail_json()))
}

/// Re-queues one parked message of the handler.
pub async fn retry(
    State(state): State<AppState>,
    caller: Caller,
    Path((name, seq)): Path<(String, i64)>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&name)?;
    let requeued = outbox::requeue(state.registry.db(), &name, &[seq]).await?;
    if requeued.is_empty() {
        return Err(not_parked(&name, seq));
    }
    tracing::info!(
        seq,
        handler = name,
        by = caller.name,
        "parked outbox message re-queued through the API"
    );
    Ok(Json(json!({ "seq": seq, "requeued": true })))
}

/// Re-queues every parked (not discarded) message of the handler, answering how many.
pub async fn retry_all(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&name)?;
    let _turn = state.bulk.enter(&caller, "replay, discard or re-queue")?;
    let requeued = outbox::requeue_all(state.registry.db(), &name).await?;
    tracing::info!(
        count = requeued,
        handler = name,
        by = caller.name,
        "parked outbox messages re-queued through the API"
    );
    Ok(Json(json!({ "requeued": requeued })))
}

pub async fn discard(
    State(state): State<AppState>,
    caller: Caller,
    Path((name, seq)): Path<(String, i64)>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&name)?;
    if !outbox::discard(state.registry.db(), &name, seq).await? {
        return Err(not_parked(&name, seq));
    }
    tracing::info!(
        seq,
        handler = name,
        by = caller.name,
        "parked outbox message discarded through the API"
    );
    Ok(Json(json!({ "seq": seq, "discarded": true })))
}

fn not_parked(handler: &str, seq: i64) -> ApiError {
    ApiError::not_found(format!(
        "handler {handler} has no parked outbox message {seq} (published, discarded, or never parked): \
         GET /v1/handlers/{handler}/outbox/parked lists them"
    ))
}
