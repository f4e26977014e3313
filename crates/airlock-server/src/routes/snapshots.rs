//! Snapshots and what is built on them: `POST /v1/sandboxes/{id}/snapshots`,
//! `GET /v1/snapshots[/{sid}]`, `DELETE /v1/snapshots/{sid}`, and a session's
//! `…/fork`, `…/restore`, `…/pause`, `…/resume`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;
use std::sync::Arc;

use super::sandboxes::{Created, Info, info};
use crate::api::{ForkRequest, RestoreRequest, SnapshotRequest};
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::service::sessions::epoch;
use crate::service::snapshots::{self, SnapshotList, SnapshotView};
use crate::state::{AppState, KeyName, Paused};

pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<SnapshotRequest>,
) -> Result<Response, ApiError> {
    let session = state.session(&id, &key)?;
    let kind = req.kind.unwrap_or_default();
    let view = snapshots::snapshot(&state, &key, &session, kind).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

pub async fn list(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
) -> Result<Json<SnapshotList>, ApiError> {
    Ok(Json(snapshots::list(&state, &key)?))
}

pub async fn show(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(sid): Path<String>,
) -> Result<Json<SnapshotView>, ApiError> {
    Ok(Json(snapshots::show(&state, &key, &sid)?))
}

pub async fn delete(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(sid): Path<String>,
) -> Result<StatusCode, ApiError> {
    let (state2, key2) = (Arc::clone(&state), key.clone());
    tokio::task::spawn_blocking(move || snapshots::delete(&state2, &key2, &sid))
        .await
        .map_err(|e| ApiError::internal(format!("delete task: {e}")))??;
    Ok(StatusCode::NO_CONTENT)
}

/// What `POST …/fork` answers.
#[derive(Serialize)]
struct Forked {
    sandboxes: Vec<Created>,
}

pub async fn fork(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ForkRequest>,
) -> Result<Response, ApiError> {
    let parent = state.session(&id, &key)?;
    let made = snapshots::fork(&state, &key, &parent, &req).await?;
    let sandboxes = made
        .iter()
        .map(|s| Created {
            id: s.id.clone(),
            expires_at: epoch(s.expires),
        })
        .collect();
    Ok((StatusCode::CREATED, Json(Forked { sandboxes })).into_response())
}

pub async fn restore(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<RestoreRequest>,
) -> Result<Json<Info>, ApiError> {
    let session = state.session(&id, &key)?;
    session.wake().await?;
    snapshots::restore(&state, &key, &session, &req.snapshot_id).await?;
    Ok(Json(info(&session).await))
}

pub async fn pause(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
) -> Result<Json<Info>, ApiError> {
    let session = state.session(&id, &key)?;
    session.set_paused(Paused::Requested).await?;
    tracing::info!(id = %id, "session paused");
    Ok(Json(info(&session).await))
}

pub async fn resume(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
) -> Result<Json<Info>, ApiError> {
    let session = state.session(&id, &key)?;
    session.set_paused(Paused::No).await?;
    if let Ok(mut t) = session.last_used.lock() {
        *t = std::time::Instant::now();
    }
    tracing::info!(id = %id, "session resumed");
    Ok(Json(info(&session).await))
}
