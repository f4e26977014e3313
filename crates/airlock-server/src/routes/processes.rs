//! A session's background processes: `GET /v1/sandboxes/{id}/processes[/{process_id}]`,
//! its output (JSON, or followed as Server-Sent Events), its stdin, signals, and waiting
//! for its end. Started by an exec with `background: true` (`start`).

use airlock_backend::Stdio;
use airlock_spec::Spec;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

use crate::api::{ExecRequest, integer};
use crate::body::{ApiQuery, JsonBody};
use crate::error::ApiError;
use crate::service::processes::{self, Follow, ProcessInfo};
use crate::state::{AppState, KeyName, Session};

/// Longest `wait` a request may ask for.
const MAX_WAIT_MS: u64 = 60_000;

/// Starts `req`'s program (its spec `spec`) as a background process of `session`.
pub(crate) async fn start(
    state: &Arc<AppState>,
    session: &Arc<Session>,
    req: &ExecRequest,
    spec: Spec,
) -> Result<ProcessInfo, ApiError> {
    let keep = spec.limits.output_bytes as usize;
    let timeout = req
        .limits
        .timeout_ms
        .map(|_| Duration::from_millis(spec.limits.timeout_ms));
    let command = spec.command.clone();
    let stdin = spec.stdin.clone();
    let spawned = processes::spawn(state, session, spec, Stdio::Pipes).await?;
    let proc = processes::register(session, command, spawned, keep, timeout)?;
    if !stdin.is_empty() {
        proc.write_stdin(&stdin, false).await?;
    }
    tracing::info!(id = %session.id, process = %proc.id, "background process started");
    Ok(proc.info())
}

pub async fn list(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let session = state.session(&id, &key)?;
    Ok(Json(json!({ "processes": session.processes.list() })).into_response())
}

pub async fn show(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path((id, process)): Path<(String, String)>,
) -> Result<Json<ProcessInfo>, ApiError> {
    let session = state.session(&id, &key)?;
    Ok(Json(session.processes.get(&process)?.info()))
}

/// `?follow=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputQuery {
    #[serde(default)]
    follow: Option<String>,
}

pub async fn output(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path((id, process)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<OutputQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let session = state.session(&id, &key)?;
    let follow = match query.follow.as_deref() {
        None | Some("true") => true,
        Some("false") => false,
        Some(other) => {
            return Err(ApiError::invalid(
                "follow",
                format!("must be true or false, got {other:?}"),
            ));
        }
    };
    let proc = session.processes.get(&process)?;
    if !super::wants_stream(&headers) {
        return Ok(Json(proc.output()).into_response());
    }
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(proc.follow(follow, tx));
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        let event = match item {
            Follow::Stdout(d) => Event::default()
                .event("stdout")
                .data(json!({ "data": String::from_utf8_lossy(&d) }).to_string()),
            Follow::Stderr(d) => Event::default()
                .event("stderr")
                .data(json!({ "data": String::from_utf8_lossy(&d) }).to_string()),
            Follow::End(info) => {
                let name = if info.state == "exited" { "exit" } else { "end" };
                Event::default()
                    .event(name)
                    .data(serde_json::to_string(&info).unwrap_or_default())
            }
        };
        Some((Ok::<_, std::convert::Infallible>(event), rx))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}

/// `POST …/stdin`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdinRequest {
    #[serde(default)]
    data: String,
    #[serde(default)]
    encoding: crate::api::Encoding,
    #[serde(default)]
    eof: bool,
}

pub async fn stdin(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path((id, process)): Path<(String, String)>,
    JsonBody(req): JsonBody<StdinRequest>,
) -> Result<Json<ProcessInfo>, ApiError> {
    let session = state.session(&id, &key)?;
    let proc = session.processes.get(&process)?;
    let data = match req.encoding {
        crate::api::Encoding::Utf8 => req.data.into_bytes(),
        crate::api::Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(req.data.as_bytes())
            .map_err(|e| ApiError::invalid("data", format!("is not valid base64: {e}")))?,
    };
    proc.write_stdin(&data, req.eof).await?;
    Ok(Json(proc.info()))
}

/// `POST …/signal`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    signal: serde_json::Value,
}

pub async fn signal(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path((id, process)): Path<(String, String)>,
    JsonBody(req): JsonBody<SignalRequest>,
) -> Result<Json<ProcessInfo>, ApiError> {
    let session = state.session(&id, &key)?;
    let proc = session.processes.get(&process)?;
    let signal = processes::parse_signal(&req.signal)?;
    if !proc.ended() {
        proc.signal(signal).await?;
    }
    Ok(Json(proc.info()))
}

/// `POST …/wait`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitRequest {
    #[serde(default, deserialize_with = "integer")]
    timeout_ms: Option<u64>,
}

pub async fn wait(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path((id, process)): Path<(String, String)>,
    JsonBody(req): JsonBody<WaitRequest>,
) -> Result<Json<ProcessInfo>, ApiError> {
    let session = state.session(&id, &key)?;
    let proc = session.processes.get(&process)?;
    let ms = req.timeout_ms.unwrap_or(30_000);
    if !(1..=MAX_WAIT_MS).contains(&ms) {
        return Err(ApiError::invalid(
            "timeout_ms",
            format!("must be between 1 and {MAX_WAIT_MS}, got {ms}"),
        ));
    }
    let mut closing = state.closing.subscribe();
    tokio::select! {
        () = proc.wait(Duration::from_millis(ms)) => {}
        // A shutdown does not wait for a long wait (a drain does: the session still works).
        _ = closing.wait_for(|s| *s) => {}
    }
    Ok(Json(proc.info()))
}
