//! `GET/PATCH /v1/sandboxes/{id}/network` (a session's policy, changed live for its next
//! connections), `GET /v1/sandboxes/{id}/approvals` (connections held for approval,
//! `?wait_ms=` to wait for one) and `POST /v1/sandboxes/{id}/approvals/{approval}` (the
//! answer: `allow_once`, `allow_session` or `deny`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

use airlock_spec::{NetworkPatch, NetworkPolicy};

use crate::body::{ApiQuery, JsonBody};
use crate::error::ApiError;
use crate::service::network::{self, Approval};
use crate::state::{AppState, KeyName};

pub async fn show(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
) -> Result<Json<NetworkPolicy>, ApiError> {
    let session = state.session(&id, &key)?;
    Ok(Json(network::show(&session)))
}

pub async fn update(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    JsonBody(patch): JsonBody<NetworkPatch>,
) -> Result<Json<NetworkPolicy>, ApiError> {
    let session = state.session(&id, &key)?;
    Ok(Json(network::update(&session, &patch)?))
}

#[derive(Deserialize)]
pub struct WaitQuery {
    wait_ms: Option<String>,
}

/// What `GET …/approvals` answers.
#[derive(Serialize)]
pub struct Approvals {
    approvals: Vec<Approval>,
}

pub async fn approvals(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> Result<Json<Approvals>, ApiError> {
    let wait = match q.wait_ms.as_deref() {
        None => None,
        Some(ms) => Some(
            ms.parse::<u64>()
                .ok()
                .filter(|ms| *ms <= network::MAX_WAIT.as_millis() as u64)
                .map(Duration::from_millis)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "wait_ms",
                        format!("milliseconds from 0 to {}", network::MAX_WAIT.as_millis()),
                    )
                })?,
        ),
    };
    let session = state.session(&id, &key)?;
    let approvals = network::pending(&session, wait).await?;
    Ok(Json(Approvals { approvals }))
}

/// The body of `POST …/approvals/{approval}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    decision: String,
}

pub async fn decide(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path((id, approval)): Path<(String, String)>,
    JsonBody(answer): JsonBody<Answer>,
) -> Result<StatusCode, ApiError> {
    let session = state.session(&id, &key)?;
    let approval: u64 = approval
        .parse()
        .map_err(|_| ApiError::not_found(format!("no approval {approval:?} in sandbox {id}")))?;
    network::decide(&session, approval, &answer.decision)?;
    Ok(StatusCode::NO_CONTENT)
}
