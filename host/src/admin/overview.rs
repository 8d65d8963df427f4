//! `/v1/overview`: everything the operator console's overview shows, in one
//! call, for the handlers the caller may manage.
//!
//! Counts the database knows (dead letters, outbox backlog, which hosts run
//! what) cover every host. Rates, durations, the chart and consumer lag are
//! this host's own ([`crate::stats::Live`]): each host serves its share of a
//! consumer group, so the page says which host answered.

use super::auth::Caller;
use super::{ApiError, AppState};
use crate::db::now_ms;
use crate::registry::hosts::{self, HostRow};
use crate::registry::{Settings, Source, store};
use crate::stats::Live;
use axum::Json;
use axum::extract::State;
use std::collections::BTreeMap;

#[derive(serde::Serialize)]
pub struct Overview {
    /// The host that answered: the live numbers are its own.
    host: String,
    at_ms: i64,
    handlers: Vec<HandlerOverview>,
}

#[derive(serde::Serialize)]
pub struct HandlerOverview {
    name: String,
    source: Source,
    /// The uploaded version that is active (`None` for a config handler).
    active_version: Option<i64>,
    /// The version label this host records (`None`: not loaded here).
    running_version: Option<String>,
    paused: bool,
    /// This host's consumer runs.
    consuming: bool,
    /// Every live host that runs it, from `handler_hosts`.
    hosts: Vec<HostRow>,
    /// This host's live numbers (`None`: not loaded here).
    live: Option<Live>,
    settings: Option<Settings>,
    dead_letters_parked: i64,
    /// Of those, records held behind a parked record of their key.
    held_records: i64,
    outbox_backlog: i64,
    outbox_parked: i64,
    /// Age of the oldest message waiting for the relay (`None`: none waits).
    relay_lag_ms: Option<i64>,
}

pub async fn overview(State(state): State<AppState>, caller: Caller) -> Result<Json<Overview>, ApiError> {
    let registry = &state.registry;
    let db = registry.db();
    let mut running = registry.running().await;
    let mut stats = registry.stats().await;
    let deployments: BTreeMap<String, store::Deployment> = store::deployments(db)
        .await?
        .into_iter()
        .map(|d| (d.name.clone(), d))
        .collect();
    let mut names: Vec<String> = running.keys().chain(deployments.keys()).cloned().collect();
    names.sort();
    names.dedup();
    names.retain(|n| caller.may_manage(n));

    let counts = state.counts.get(db).await.map_err(ApiError::unavailable)?;
    let (parked, held) = (&counts.dead_letters_parked, &counts.held_records);
    let (backlog, outbox_parked) = (&counts.outbox_backlog, &counts.outbox_parked);
    let oldest = &counts.oldest_pending;
    let mut hosts = hosts::by_handler(db).await?;
    let now = now_ms();
    let count = |map: &BTreeMap<String, i64>, name: &str| map.get(name).copied().unwrap_or(0);

    let handlers = names
        .into_iter()
        .map(|name| {
            let here = running.remove(&name);
            let deployment = deployments.get(&name);
            HandlerOverview {
                source: here.as_ref().map_or(Source::Api, |r| r.source),
                active_version: deployment.map(|d| d.active_version),
                running_version: here.as_ref().map(|r| r.version.clone()),
                paused: deployment.is_some_and(|d| d.paused) || here.as_ref().is_some_and(|r| r.paused),
                consuming: here.as_ref().is_some_and(|r| r.consuming),
                hosts: hosts.remove(&name).unwrap_or_default(),
                live: stats.remove(&name).map(|s| s.live(now)),
                settings: here.map(|r| r.settings),
                dead_letters_parked: count(parked, &name),
                held_records: count(held, &name),
                outbox_backlog: count(backlog, &name),
                outbox_parked: count(outbox_parked, &name),
                relay_lag_ms: oldest.get(&name).map(|created| (now - created).max(0)),
                name,
            }
        })
        .collect();
    Ok(Json(Overview {
        host: registry.host_id().to_owned(),
        at_ms: now,
        handlers,
    }))
}
