//! `/v1/handlers`: upload versions, list, activate, roll back, pause,
//! resume and delete. Every change is written to the database first and
//! then applied on this host at once (other hosts follow within seconds);
//! the response says what now runs here.

use super::auth::Caller;
use super::{ApiError, AppState};
use crate::db::migrate::MAX_MIGRATION_NAME_BYTES;
use crate::registry::store::{self, Deployment, VersionInfo};
use crate::registry::upload::{self, Rules, Upload, UploadError};
use crate::registry::{Running, Source};
use axum::Json;
use axum::extract::{Multipart, Path, State};
use axum::http::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;

#[derive(serde::Serialize)]
pub struct HandlerView {
    name: String,
    source: Source,
    /// Uploaded handlers: the deployment as the database has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    deployment: Option<Deployment>,
    versions: Vec<VersionInfo>,
    /// What this host runs now (`None`: not loaded here).
    running: Option<Running>,
}

async fn view(state: &AppState, name: &str) -> Result<Option<HandlerView>, ApiError> {
    let registry = &state.registry;
    let deployment = store::deployment(registry.db(), name).await?;
    let running = registry.running().await.remove(name);
    let source = match (&running, &deployment) {
        (Some(r), _) => r.source,
        (None, Some(_)) => Source::Api,
        (None, None) => return Ok(None),
    };
    Ok(Some(HandlerView {
        name: name.to_owned(),
        source,
        versions: store::versions(registry.db(), name).await?,
        deployment,
        running,
    }))
}

async fn view_or_404(state: &AppState, name: &str) -> Result<Json<HandlerView>, ApiError> {
    view(state, name)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no handler named {name:?}")))
}

/// Every handler the caller may manage.
pub async fn list(State(state): State<AppState>, caller: Caller) -> Result<Json<Vec<HandlerView>>, ApiError> {
    let mut names: Vec<String> = state.registry.running().await.into_keys().collect();
    for deployment in store::deployments(state.registry.db()).await? {
        if !names.contains(&deployment.name) {
            names.push(deployment.name);
        }
    }
    names.sort();
    let mut views = Vec::new();
    for name in names.iter().filter(|n| caller.may_manage(n)) {
        if let Some(view) = view(&state, name).await? {
            views.push(view);
        }
    }
    Ok(Json(views))
}

pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<HandlerView>, ApiError> {
    caller.check(&name)?;
    view_or_404(&state, &name).await
}

/// How long an upload's body may take to arrive once its turn came: a client
/// that sends a byte a minute would otherwise keep the turn for good.
const UPLOAD_READ: Duration = Duration::from_secs(120);

/// A multipart upload: `component` (the .wasm), `settings` (JSON, optional:
/// the keys of a `[[handlers]]` entry but name, component and migrations; at
/// least `topics`), and any number of `migration` parts named `NNNN_x.sql`.
pub async fn upload(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    mut form: Multipart,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.check(&name)?;
    // Before a byte of the body is read: what waits holds no component.
    let turn = state.upload_turns.begin(&caller)?;
    let _slot = turn.slot().await?;
    let mut component = None;
    let mut settings = None;
    let mut migrations = Vec::new();
    let too_large = |e: axum::extract::multipart::MultipartError| {
        ApiError::new(
            e.status(),
            format!(
                "cannot read the upload: {} (components may be at most admin.max_component_mb = {} MiB)",
                e.body_text(),
                state.max_component_bytes >> 20
            ),
        )
    };
    let mut migration_bytes = 0;
    let read = async {
        while let Some(mut field) = form.next_field().await.map_err(too_large)? {
            match field.name().unwrap_or_default() {
                "component" => component = Some(field.bytes().await.map_err(too_large)?.to_vec()),
                "settings" => {
                    settings = Some(text_part(&mut field, MAX_SETTINGS_BYTES, "the `settings` part").await?)
                }
                "migration" => {
                    let file = field.file_name().map(str::to_owned).ok_or_else(|| {
                        ApiError::bad_request("a `migration` part needs a file name (NNNN_x.sql)")
                    })?;
                    if file.len() > MAX_MIGRATION_NAME_BYTES {
                        return Err(ApiError::new(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            format!(
                                "a migration's file name is {} bytes; at most {MAX_MIGRATION_NAME_BYTES}",
                                file.len()
                            ),
                        ));
                    }
                    if migrations.len() == MAX_MIGRATION_FILES {
                        return Err(ApiError::new(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            format!("an upload has at most {MAX_MIGRATION_FILES} migration files"),
                        ));
                    }
                    let what = format!("migration {file:?}");
                    let cap = MAX_MIGRATION_BYTES.min(MAX_MIGRATIONS_BYTES.saturating_sub(migration_bytes));
                    let sql = text_part(&mut field, cap, &what).await?;
                    migration_bytes += file.len() + sql.len();
                    migrations.push((file, sql));
                }
                other => {
                    return Err(ApiError::bad_request(format!(
                        "unknown part {other:?}: an upload has `component`, `settings` and `migration` parts"
                    )));
                }
            }
        }
        Ok(())
    };
    tokio::time::timeout(UPLOAD_READ, read).await.map_err(|_| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the upload did not arrive within {} s", UPLOAD_READ.as_secs()),
        )
    })??;
    let component = component.ok_or_else(|| ApiError::bad_request("the upload has no `component` part"))?;
    let upload = Upload {
        name: name.clone(),
        component,
        settings: settings.unwrap_or_else(|| "{}".into()),
        migrations,
        uploaded_by: caller.name.clone(),
    };
    let registry = &state.registry;
    let rules = Rules {
        config_handlers: registry.config_handlers(),
        max_component_bytes: state.max_component_bytes,
        policy: &caller.policy,
        writer_held_ms: Some(turn.writer_held_ms()),
    };
    let uploaded = upload::upload(registry.db(), registry.engine(), &rules, upload)
        .await
        .map_err(refusal)?;
    registry.reconcile().await?;
    let view = view(&state, &name).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "uploaded": uploaded, "handler": view })),
    ))
}

/// Whose fault an upload or activation failure is: 422 for settings,
/// components and migrations that are wrong for any token; 403 for what is
/// over the calling token's ceilings or outside its allowlists; 409 for a
/// name or consumer group another handler holds.
fn refusal(error: UploadError) -> ApiError {
    match error {
        UploadError::Invalid(_) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, error.to_string()),
        UploadError::TooLarge { .. } => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, error.to_string()),
        UploadError::Forbidden(_) => ApiError::forbidden(error.to_string()),
        UploadError::ConfigOwned(_) | UploadError::GroupTaken(_) => ApiError::conflict(error.to_string()),
        UploadError::Database(db) => db.into(),
    }
}

/// 404 for unknown names, 409 for handlers the config file owns.
async fn uploaded_deployment(state: &AppState, caller: &Caller, name: &str) -> Result<Deployment, ApiError> {
    caller.check(name)?;
    if state.registry.config_names().iter().any(|n| n == name) {
        return Err(ApiError::conflict(format!(
            "handler {name} is defined in the configuration file; change it there"
        )));
    }
    store::deployment(state.registry.db(), name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no uploaded handler named {name:?}")))
}

#[derive(serde::Deserialize)]
pub struct Activate {
    version: i64,
}

pub async fn activate(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Json(body): Json<Activate>,
) -> Result<Json<HandlerView>, ApiError> {
    uploaded_deployment(&state, &caller, &name).await?;
    switch(&state, &caller, &name, body.version).await
}

/// Activates the version that was active before the current one.
pub async fn rollback(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<HandlerView>, ApiError> {
    let deployment = uploaded_deployment(&state, &caller, &name).await?;
    let Some(previous) = deployment.previous_version else {
        return Err(ApiError::conflict(format!(
            "handler {name} has no earlier active version to roll back to"
        )));
    };
    switch(&state, &caller, &name, previous).await
}

/// Activates a stored version if the caller may run it now: the version
/// passes the caller's current ceilings and allowlists (403), and its
/// consumer group is not another handler's (409), as an upload would.
async fn switch(
    state: &AppState,
    caller: &Caller,
    name: &str,
    version: i64,
) -> Result<Json<HandlerView>, ApiError> {
    let db = state.registry.db();
    let mut tx = db.begin_immediate().await?;
    // Before the version is read: an upload (which prunes old versions) or
    // a delete holding the lock could otherwise remove it between the read
    // and the activation, leaving every host with an active version that does
    // not exist (the tenth read of this round, issue 23).
    store::lock_deployments(&mut tx).await?;
    let Some(settings) = store::version_settings(&mut tx, name, version).await? else {
        return Err(ApiError::not_found(format!(
            "handler {name} has no version {version}"
        )));
    };
    upload::admit(
        &mut tx,
        state.registry.config_handlers(),
        &caller.policy,
        name,
        &settings,
    )
    .await
    .map_err(|e| match e {
        UploadError::Invalid(_) => ApiError::conflict(format!(
            "version {version} of handler {name} cannot run on this host: {e}"
        )),
        other => refusal(other),
    })?;
    store::set_active(&mut tx, name, version).await?;
    tx.commit().await?;
    tracing::info!(handler = name, version, "version activated through the API");
    state.registry.reconcile().await?;
    view_or_404(state, name).await
}

pub async fn pause(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<HandlerView>, ApiError> {
    set_paused(&state, &caller, &name, true).await
}

pub async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<HandlerView>, ApiError> {
    set_paused(&state, &caller, &name, false).await
}

async fn set_paused(
    state: &AppState,
    caller: &Caller,
    name: &str,
    paused: bool,
) -> Result<Json<HandlerView>, ApiError> {
    uploaded_deployment(state, caller, name).await?;
    store::set_paused(state.registry.db(), name, paused).await?;
    state.registry.reconcile().await?;
    view_or_404(state, name).await
}

/// Stops the handler everywhere and removes its versions. Its inbox rows,
/// dead letters and tables stay, so uploading it again continues where it
/// left off (and still skips what it already applied).
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    uploaded_deployment(&state, &caller, &name).await?;
    store::delete(state.registry.db(), &name).await?;
    state.registry.reconcile().await?;
    tracing::info!(
        handler = name,
        by = caller.name,
        "handler deleted through the API"
    );
    Ok(Json(json!({ "deleted": name })))
}

/// The most bytes one migration file of an upload may have: the guard
/// tokenizes a file whole before it splits it (about 90 bytes of tokens per
/// byte of `;`, and a 100 MiB file, within the body's limit, was gigabytes:
/// the fifteenth read of issue 23's third round).
pub const MAX_MIGRATION_BYTES: usize = 1 << 20;
/// The most bytes an upload's migration files may have together, names
/// included.
pub const MAX_MIGRATIONS_BYTES: usize = 4 << 20;
/// The most migration files an upload may have (each costs a few statements
/// with SQLite's writer held, even an empty one).
pub const MAX_MIGRATION_FILES: usize = 1_000;
/// The most bytes of an upload's settings (JSON, read twice).
pub const MAX_SETTINGS_BYTES: usize = 1 << 20;

/// A text part of an upload, read a chunk at a time and refused (413)
/// once it passes `cap` bytes, before the rest arrives.
async fn text_part(
    field: &mut axum::extract::multipart::Field<'_>,
    cap: usize,
    what: &str,
) -> Result<String, ApiError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = field
        .chunk()
        .await
        .map_err(|e| ApiError::new(e.status(), e.body_text()))?
    {
        if bytes.len() + chunk.len() > cap {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "{what} is longer than {cap} bytes (a migration file may have {MAX_MIGRATION_BYTES} bytes, \
                     an upload's migrations {MAX_MIGRATIONS_BYTES} together, its settings {MAX_SETTINGS_BYTES})"
                ),
            ));
        }
        bytes.extend_from_slice(&chunk);
    }
    String::from_utf8(bytes).map_err(|e| ApiError::bad_request(format!("{what} is not UTF-8: {e}")))
}
