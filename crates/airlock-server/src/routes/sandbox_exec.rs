//! `POST /v1/sandboxes/{id}/exec`: run in a session; its files persist between execs,
//! each exec's processes end with it.

use airlock_spec::Spec;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use std::sync::Arc;

use crate::api::ExecRequest;
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::state::{AppState, KeyName, Session};
use crate::{runner, stream};

pub async fn handle(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Result<Response, ApiError> {
    let session = state.session(&id, &key)?;
    let spec = session_spec(&state, &session, &req)?;
    if super::wants_stream(&headers) {
        return Ok(stream::respond(move |tx| {
            runner::in_session(state, key, session, spec, Some(tx))
        }));
    }
    Ok(Json(runner::in_session(state, key, session, spec, None).await?).into_response())
}

/// The validated spec of an exec in `session`. The REST route and the MCP tool share it.
pub(crate) fn session_spec(state: &AppState, session: &Session, req: &ExecRequest) -> Result<Spec, ApiError> {
    if req.isolation.is_some_and(|i| i != session.isolation) {
        return Err(ApiError::invalid(
            "isolation",
            format!(
                "this sandbox runs with isolation {} (a session's isolation is set when it is created)",
                session.isolation.as_str()
            ),
        ));
    }
    let mut spec = req.to_spec(&state.config, &session.limits)?;
    spec.isolation = session.isolation;
    // The disk is the session's own, fixed when it was created; its memory was admitted
    // at creation, so an exec may not raise it.
    spec.limits.disk_bytes = session.limits.disk_bytes;
    if spec.limits.memory_bytes > session.limits.memory_bytes {
        return Err(ApiError::invalid(
            "limits.memory_bytes",
            format!(
                "{} is above this sandbox's {} (set when it was created)",
                spec.limits.memory_bytes, session.limits.memory_bytes
            ),
        ));
    }
    Ok(spec)
}
