//! The code interpreter: `POST /v1/sandboxes/{id}/code` runs code in the session's Jupyter
//! kernel (its state persists between calls) and answers an `Execution` (logs, rich
//! results, error), or streams it as Server-Sent Events (`stdout`, `stderr`, `result`,
//! `error`, then `done`); `POST /v1/sandboxes/{id}/code/restart` clears the state.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

use crate::api::integer;
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::service::kernel::{self, CodeEvent};
use crate::state::{AppState, KeyName};

/// `POST /v1/sandboxes/{id}/code`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeRequest {
    code: String,
    #[serde(default)]
    language: Option<String>,
    #[serde(default, deserialize_with = "integer")]
    timeout_ms: Option<u64>,
}

pub async fn run(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<CodeRequest>,
) -> Result<Response, ApiError> {
    let session = state.session(&id, &key)?;
    session.wake().await?;
    if let Some(language) = req.language.as_deref()
        && language != "python"
    {
        return Err(ApiError::invalid(
            "language",
            format!(
                "the code interpreter runs python (a Jupyter kernel), not {language:?}; run other languages with POST /v1/sandboxes/{{id}}/exec"
            ),
        ));
    }
    let max = state.config.max.timeout_ms;
    let timeout_ms = req.timeout_ms.unwrap_or(session.limits.timeout_ms);
    if timeout_ms == 0 || timeout_ms > max {
        return Err(ApiError::invalid(
            "timeout_ms",
            format!("must be between 1 and this server's maximum of {max}, got {timeout_ms}"),
        ));
    }
    let timeout = Duration::from_millis(timeout_ms);
    if !super::wants_stream(&headers) {
        let exec = kernel::run(&state, &session, &req.code, timeout, None).await?;
        return Ok(Json(exec).into_response());
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = done_tx.send(kernel::run(&state, &session, &req.code, timeout, Some(tx)).await);
    });
    let (out, events) = tokio::sync::mpsc::channel::<Event>(16);
    tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            let (name, data) = match ev {
                CodeEvent::Stdout(text) => ("stdout", json!({ "text": text })),
                CodeEvent::Stderr(text) => ("stderr", json!({ "text": text })),
                CodeEvent::Result(r) => ("result", json!(r)),
                CodeEvent::Error(e) => ("error", json!(e)),
            };
            if out
                .send(Event::default().event(name).data(data.to_string()))
                .await
                .is_err()
            {
                return;
            }
        }
        let last = match done_rx.await {
            Ok(Ok(exec)) => Event::default().event("done").data(json!(exec).to_string()),
            Ok(Err(e)) => Event::default()
                .event("failed")
                .data(json!({"error": {"code": e.code, "message": e.message, "field": e.field}}).to_string()),
            Err(_) => Event::default()
                .event("failed")
                .data(r#"{"error":{"code":"internal","message":"the code task was lost"}}"#),
        };
        let _ = out.send(last).await;
    });
    let events = futures_util::stream::unfold(events, |mut rx| async move {
        rx.recv()
            .await
            .map(|e| (Ok::<_, std::convert::Infallible>(e), rx))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}

pub async fn restart(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let session = state.session(&id, &key)?;
    session.wake().await?;
    kernel::restart(&state, &session).await?;
    Ok(Json(json!({ "restarted": true })))
}
