//! `POST /v1/sandboxes` (create a session), `GET /v1/sandboxes` (list),
//! `GET /v1/sandboxes/{id}` (show), `DELETE /v1/sandboxes/{id}` (purge now).

use airlock_spec::Isolation;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;
use std::sync::Arc;

use crate::api::CreateSandboxRequest;
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::service::sessions::{create_session, delete_session, epoch};
use crate::state::{AppState, KeyName, Session};

/// What `POST /v1/sandboxes` answers.
#[derive(Serialize)]
pub(crate) struct Created {
    pub id: String,
    pub expires_at: f64,
}

/// One entry of `GET /v1/sandboxes`.
#[derive(Serialize)]
pub struct Info {
    id: String,
    isolation: Isolation,
    /// The image it runs (`null`: the host's system directories).
    image: Option<ImageInfo>,
    created_at: f64,
    expires_at: f64,
    /// `running` or `paused`.
    status: &'static str,
    /// What it does when idle: `none` or `pause`.
    on_idle: &'static str,
    /// The snapshot it started from.
    from_snapshot: Option<String>,
    usage: Usage,
}

/// The image a session runs: its recorded name and manifest digest.
#[derive(Serialize)]
struct ImageInfo {
    name: String,
    digest: String,
}

#[derive(Serialize)]
struct Usage {
    execs: u64,
    cpu_ms: f64,
    memory_peak_bytes: u64,
}

pub(crate) async fn info(s: &Session) -> Info {
    let inner = s.inner.lock().await;
    Info {
        id: s.id.clone(),
        isolation: s.isolation,
        image: s.image.as_ref().map(|i| ImageInfo {
            name: i.name.clone(),
            digest: i.root.digest.clone(),
        }),
        created_at: epoch(s.created),
        expires_at: epoch(s.expires),
        status: match s.pause_state() {
            crate::state::Paused::No => "running",
            _ => "paused",
        },
        on_idle: s.on_idle.as_str(),
        from_snapshot: s.from_snapshot.clone(),
        usage: Usage {
            execs: inner.execs,
            cpu_ms: inner.cpu_ms,
            memory_peak_bytes: inner.memory_peak_bytes,
        },
    }
}

pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    JsonBody(req): JsonBody<CreateSandboxRequest>,
) -> Result<Response, ApiError> {
    let session = create_session(&state, &key, &req).await?;
    let body = Created {
        id: session.id.clone(),
        expires_at: epoch(session.expires),
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

pub async fn list(State(state): State<Arc<AppState>>, Extension(key): Extension<KeyName>) -> Json<Vec<Info>> {
    let sessions: Vec<Arc<Session>> = state
        .sessions
        .lock()
        .map(|m| m.values().filter(|s| s.key == key.0).cloned().collect())
        .unwrap_or_default();
    let mut out = Vec::with_capacity(sessions.len());
    for s in sessions {
        out.push(info(&s).await);
    }
    out.sort_by(|a, b| a.created_at.total_cmp(&b.created_at));
    Json(out)
}

pub async fn show(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
) -> Result<Json<Info>, ApiError> {
    let session = state.session(&id, &key)?;
    Ok(Json(info(&session).await))
}

pub async fn delete(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    delete_session(&state, &key, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
