//! `POST /v1/sandboxes/{id}/exec`: run in a session; its files persist between execs,
//! each exec's processes end with it. With `background`, the program is started as one
//! of the session's processes and the answer comes at once (see `processes`).

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use std::sync::Arc;

use crate::api::ExecRequest;
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::service::runner;
use crate::service::sessions::session_spec;
use crate::state::{AppState, KeyName};
use crate::stream;

pub async fn handle(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Result<Response, ApiError> {
    let session = state.session(&id, &key)?;
    session.wake().await?;
    let spec = session_spec(&state, &session, &req)?;
    if req.background {
        let process = super::processes::start(&state, &session, &req, spec).await?;
        return Ok((axum::http::StatusCode::CREATED, Json(process)).into_response());
    }
    if super::wants_stream(&headers) {
        return Ok(stream::respond(move |tx| {
            runner::in_session(state, key, session, spec, Some(tx))
        }));
    }
    Ok(Json(runner::in_session(state, key, session, spec, None).await?).into_response())
}
