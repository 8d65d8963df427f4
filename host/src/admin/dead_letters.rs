//! `/v1/dead-letters`: the `inboxd dlq` commands over HTTP, groups
//! included. A team token sees and acts on its own handlers' dead letters only.

use super::auth::Caller;
use super::{ApiError, AppState};
use crate::db::dead_letter_groups::{self, Group};
use crate::db::dead_letters::{self, Filter, ReasonKind, Row};
use crate::replay::{HeldChoice, release_held, replay as replay_letter};
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// A list answers with at most this many, oldest first: a page, not a dump.
const LIST_LIMIT: u32 = 1000;

#[derive(serde::Deserialize)]
pub struct ListQuery {
    handler: Option<String>,
    /// Only this reason kind (`event-id`, `rejected`, `retries-exhausted`,
    /// `limit`, `sandbox-violation`, `host-error`).
    kind: Option<String>,
    /// Also replayed and discarded ones.
    #[serde(default)]
    all: bool,
}

/// The reason kind a query names, if any (400 for one no host writes).
fn kind_of(query: &ListQuery) -> Result<Option<ReasonKind>, ApiError> {
    match query.kind.as_deref().filter(|k| !k.is_empty()) {
        None => Ok(None),
        Some(text) => Ok(Some(ReasonKind::parse(text).ok_or_else(|| {
            ApiError::bad_request(format!(
                "unknown reason kind {text:?}: it is one of {}",
                ReasonKind::ALL.map(ReasonKind::as_str).join(", ")
            ))
        })?)),
    }
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> Result<Json<Vec<Row>>, ApiError> {
    if let Some(handler) = &query.handler {
        caller.check(handler)?;
    }
    let kind = kind_of(&query)?;
    // The token's scope is part of the query: another team's rows are never read.
    let filter = Filter {
        handler: query.handler.as_deref(),
        handlers: caller.handlers(),
        kind,
        include_resolved: query.all,
        limit: Some(LIST_LIMIT),
        without_record: true,
        ..Filter::default()
    };
    Ok(Json(dead_letters::find(state.registry.db(), &filter).await?))
}

/// The dead letter, if it exists and the caller may see it (404 otherwise).
async fn fetch(state: &AppState, caller: &Caller, id: i64) -> Result<Row, ApiError> {
    let ids = [id];
    // The token's scope is part of the query: another team's letter, its
    // payload and headers, is never read.
    let filter = Filter {
        ids: Some(&ids),
        handlers: caller.handlers(),
        include_resolved: true,
        ..Filter::default()
    };
    let row = dead_letters::find(state.registry.db(), &filter)
        .await?
        .pop()
        .filter(|row| caller.may_manage(&row.handler))
        // Another team's dead letter is "not found" too: ids are sequential,
        // and a 403 would confirm it exists and name its handler.
        .ok_or_else(|| ApiError::not_found(format!("no dead letter with id {id}")))?;
    Ok(row)
}

pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
) -> Result<Response, ApiError> {
    // One letter in full at a time per team token (it may hold a payload of
    // `max_payload_bytes` and as much in headers).
    let _turn = state.listings.wait(&caller, "dead-letter detail").await?;
    let row = fetch(&state, &caller, id).await?;
    // Serialized once, into the response (no tree of it first); the body
    // then holds its place until it is sent (see `responses`).
    Ok(Json(row.detail_json()).into_response())
}

/// `?held=replay|discard`: what becomes of the letters held behind one
/// resolved (`ordering = "key"`); replayed after it by default.
#[derive(serde::Deserialize, Default)]
pub struct HeldQuery {
    #[serde(default)]
    held: HeldChoice,
}

/// Runs the dead letter through the version of its handler running here.
pub async fn replay(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    Query(query): Query<HeldQuery>,
) -> Result<Json<Value>, ApiError> {
    // The turn first: the letter is read whole (payload and headers).
    let _turn = state.bulk.enter(&caller, "replay, discard or re-queue")?;
    let row = fetch(&state, &caller, id).await?;
    Ok(Json(replay_row(&state, &caller, &row, query.held).await?))
}

#[derive(serde::Deserialize)]
pub struct ReplayAll {
    handler: String,
    /// Only letters with a greater id: the `next_after_id` of the page before.
    #[serde(default)]
    after_id: Option<i64>,
    /// At most this many letters (default and ceiling [`REPLAY_ALL_PAGE`]).
    #[serde(default)]
    limit: Option<u32>,
}

/// Parked letters replayed by one `POST /v1/dead-letters/replay` at most: a
/// handler may park millions, and one answer listed one outcome per letter
/// (issue 23, fifth read). A client asks for the next page with the
/// answer's `next_after_id` until it is null.
const REPLAY_ALL_PAGE: u32 = 1_000;

/// `inboxd dlq replay --handler H --all`, a page at a time: the oldest
/// parked letters of one handler after `after_id`. Answers their outcomes
/// and `next_after_id`, null once no parked letter is left after this page.
pub async fn replay_all(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<ReplayAll>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&body.handler)?;
    let _turn = state.bulk.enter(&caller, "replay, discard or re-queue")?;
    let limit = match body.limit {
        None => REPLAY_ALL_PAGE,
        Some(limit @ 1..=REPLAY_ALL_PAGE) => limit,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "limit {other}: a page replays 1 to {REPLAY_ALL_PAGE} dead letters"
            )));
        }
    };
    // Ids first, then records a chunk at a time, as a group's replay does:
    // 500 parked letters of 2 MB read at once held 1.16 GB of the host (the
    // third review of issue 23's walls).
    let ids = dead_letters::parked_ids(state.registry.db(), &body.handler, body.after_id, limit).await?;
    let mut outcomes = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(REPLAY_CHUNK) {
        let filter = Filter {
            ids: Some(chunk),
            ..Filter::default()
        };
        for row in dead_letters::find(state.registry.db(), &filter).await? {
            outcomes.push(replay_row(&state, &caller, &row, HeldChoice::Replay).await?);
        }
    }
    let next_after_id = match ids.last() {
        Some(&last) if ids.len() == limit as usize => Some(last),
        _ => None,
    };
    Ok(Json(
        json!({ "outcomes": outcomes, "next_after_id": next_after_id }),
    ))
}

async fn replay_row(
    state: &AppState,
    caller: &Caller,
    row: &Row,
    held: HeldChoice,
) -> Result<Value, ApiError> {
    let loaded = loaded(state, row).await?;
    let handler = loaded.handler.as_ref();
    let outcome = replay_letter(state.registry.db(), handler, loaded.dedup.as_ref(), row).await?;
    tracing::info!(
        id = row.id,
        handler = row.handler,
        by = caller.name,
        ?outcome,
        "dead letter replayed through the API"
    );
    let mut value = serde_json::to_value(&outcome).unwrap_or_default();
    value["id"] = row.id.into();
    if outcome.resolved_here() {
        value["held"] = release(state, &loaded, row, held).await?;
    }
    Ok(value)
}

async fn loaded(state: &AppState, row: &Row) -> Result<crate::pipeline::Loaded, ApiError> {
    state.registry.current_loaded(&row.handler).await.ok_or_else(|| {
        ApiError::conflict(format!(
            "handler {} is not loaded on this host, so its dead letters cannot be replayed here",
            row.handler
        ))
    })
}

/// The letters held behind `row` (resolved just now), released as chosen,
/// each with its outcome.
async fn release(
    state: &AppState,
    loaded: &crate::pipeline::Loaded,
    row: &Row,
    held: HeldChoice,
) -> Result<Value, ApiError> {
    let db = state.registry.db();
    let released = release_held(db, loaded.handler.as_ref(), loaded.dedup.as_ref(), row, held).await?;
    Ok(released
        .into_iter()
        .map(|(id, outcome)| {
            let mut value = serde_json::to_value(&outcome).unwrap_or_default();
            value["id"] = id.into();
            value
        })
        .collect())
}

pub async fn discard(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    Query(query): Query<HeldQuery>,
) -> Result<Json<Value>, ApiError> {
    // It may replay the letters held behind it (`?held=replay`, the default);
    // the turn first, as for a replay.
    let _turn = state.bulk.enter(&caller, "replay, discard or re-queue")?;
    let row = fetch(&state, &caller, id).await?;
    Ok(Json(discard_row(&state, &row, query.held).await?))
}

/// Discards one letter and, if that resolved it, releases the letters held
/// behind it as chosen.
async fn discard_row(state: &AppState, row: &Row, held: HeldChoice) -> Result<Value, ApiError> {
    let db = state.registry.db();
    let mut tx = db.begin_write().await?;
    let discarded = dead_letters::resolve(&mut tx, row.id, "discarded").await?;
    tx.commit().await?;
    let mut answer = json!({ "id": row.id, "discarded": discarded });
    if discarded && row.key.is_some() && !dead_letters::held_behind(db, row, 1).await?.is_empty() {
        let loaded = loaded(state, row).await?;
        answer["held"] = release(state, &loaded, row, held).await?;
    }
    Ok(answer)
}

/// `GET /v1/dead-letters/groups[?handler=H&kind=K]`: the parked dead letters
/// the caller may see, grouped (the largest first), each with its members' ids.
pub async fn groups(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> Result<Json<Vec<Group>>, ApiError> {
    if let Some(handler) = &query.handler {
        caller.check(handler)?;
    }
    // Each listing reads every parked letter of the token's handlers (the
    // tenth read: a hundred at once were a hundred full scans).
    let _turn = state.listings.wait(&caller, "dead-letter group listing").await?;
    let filter = Filter {
        handler: query.handler.as_deref(),
        handlers: caller.handlers(),
        kind: kind_of(&query)?,
        ..Filter::default()
    };
    Ok(Json(
        dead_letter_groups::groups(state.registry.db(), &filter).await?,
    ))
}

/// The next page of the group with `id` among the caller's: from what its
/// last call kept, or read (404 if there is none, as for one dead letter).
async fn group_page(state: &AppState, caller: &Caller, id: &str) -> Result<Vec<i64>, ApiError> {
    if let Some(page) = state.group_pages.next(&caller.name, id) {
        return Ok(page);
    }
    let filter = Filter {
        handlers: caller.handlers(),
        ..Filter::default()
    };
    let group = dead_letter_groups::group(state.registry.db(), &filter, id)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "no group of parked dead letters with id {id}: its members may all be resolved"
            ))
        })?;
    Ok(state.group_pages.page(&caller.name, id, group.members))
}

/// Dead letters are read with their records one at a time when many are
/// replayed: a record's headers have no bound on their count, and a letter
/// of a megabyte of empty headers is some 24 MB once read, so a chunk of 100
/// could be 2.4 GB (each is replayed in a transaction of its own anyway).
const REPLAY_CHUNK: usize = 1;

/// `POST /v1/dead-letters/groups/{id}/replay`: its next [`GROUP_PAGE`](super::group_pages::GROUP_PAGE)
/// members, each with its own outcome (a member resolved meanwhile says so).
pub async fn replay_group(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Vec<Value>>, ApiError> {
    // Before the group is read: that reads every parked letter.
    let _turn = state.bulk.enter(&caller, "replay, discard or re-queue")?;
    let members = group_page(&state, &caller, &id).await?;
    let mut outcomes = Vec::with_capacity(members.len());
    for ids in members.chunks(REPLAY_CHUNK) {
        let filter = Filter {
            ids: Some(ids),
            include_resolved: true,
            ..Filter::default()
        };
        for row in dead_letters::find(state.registry.db(), &filter).await? {
            // One member's failure is its own outcome: the others still run,
            // and every member is reported.
            let outcome = match replay_row(&state, &caller, &row, HeldChoice::Replay).await {
                Ok(outcome) => outcome,
                Err(error) => json!({ "id": row.id, "outcome": "error", "detail": error.message }),
            };
            outcomes.push(outcome);
        }
    }
    tracing::info!(
        group = id,
        members = outcomes.len(),
        by = caller.name,
        "dead-letter group replayed"
    );
    Ok(Json(outcomes))
}

/// `POST /v1/dead-letters/groups/{id}/discard`: its next [`GROUP_PAGE`](super::group_pages::GROUP_PAGE)
/// members, each reported.
pub async fn discard_group(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<HeldQuery>,
) -> Result<Json<Vec<Value>>, ApiError> {
    // Before the group is read: that reads every parked letter.
    let _turn = state.bulk.enter(&caller, "replay, discard or re-queue")?;
    let members = group_page(&state, &caller, &id).await?;
    let db = state.registry.db();
    let mut outcomes = Vec::with_capacity(members.len());
    // Every member first, then what each held (ordering = "key"): a letter
    // held behind a member that is itself a member is discarded, never replayed.
    let mut resolved = Vec::new();
    for member in members {
        let discarded = async {
            let row = fetch(&state, &caller, member).await?;
            let mut tx = db.begin_write().await?;
            let discarded = dead_letters::resolve(&mut tx, member, "discarded").await?;
            tx.commit().await?;
            // Only the id of one that holds letters is kept for the second
            // pass (every member's record, then its key, were all held).
            let holds =
                discarded && row.key.is_some() && !dead_letters::held_behind(db, &row, 1).await?.is_empty();
            Ok::<_, ApiError>((discarded, holds))
        };
        match discarded.await {
            Ok((discarded, holds)) => {
                outcomes.push(json!({ "id": member, "discarded": discarded }));
                if holds {
                    resolved.push((outcomes.len() - 1, member));
                }
            }
            Err(error) => outcomes.push(json!({ "id": member, "discarded": false, "error": error.message })),
        }
    }
    for (at, member) in resolved {
        let ids = [member];
        let keyed = Filter {
            ids: Some(&ids),
            include_resolved: true,
            without_record: true,
            keep_key: true,
            ..Filter::default()
        };
        let Some(row) = dead_letters::find(db, &keyed).await?.pop() else {
            continue;
        };
        let released = match loaded(&state, &row).await {
            Ok(loaded) => release(&state, &loaded, &row, query.held).await,
            Err(error) => Err(error),
        };
        outcomes[at]["held"] = match released {
            Ok(held) => held,
            Err(error) => json!({ "outcome": "error", "detail": error.message }),
        };
    }
    tracing::info!(
        group = id,
        members = outcomes.len(),
        by = caller.name,
        "dead-letter group discarded"
    );
    Ok(Json(outcomes))
}
