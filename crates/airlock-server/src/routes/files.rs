//! `PUT /v1/sandboxes/{id}/files?path=P` (write raw bytes), `GET …/files?path=P` (read),
//! `GET …/files` (list /workspace). Init does the file work inside the sandbox (in a
//! micro-VM session, the guest's), resolving beneath /workspace without following
//! symlinks: the daemon never touches a path the program could have planted.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use std::os::fd::AsFd;
use std::sync::Arc;

use crate::body::{ApiQuery, RawBody};
use crate::error::ApiError;
use crate::state::{AppState, KeyName, Session};

#[derive(Deserialize)]
pub struct FileQuery {
    path: Option<String>,
    mode: Option<String>,
}

/// The path relative to /workspace, checked like a spec's file (REST and MCP share it).
pub(crate) fn check_path(path: &str) -> Result<String, ApiError> {
    let rel = path.strip_prefix("/workspace/").unwrap_or(path);
    if rel.ends_with('/') {
        return Err(ApiError::invalid(
            "path",
            format!("{path:?} names a directory, not a file"),
        ));
    }
    crate::api::check_relative_path(rel).map_err(|m| ApiError::invalid("path", m))?;
    let spec_file = airlock_spec::FileSpec {
        path: rel.to_owned(),
        content: Vec::new(),
        mode: 0o644,
    };
    let mut spec = airlock_spec::Spec::new(vec!["true".into()]);
    spec.files.push(spec_file);
    spec.validate()
        .map_err(|e| ApiError::invalid("path", e.message))?;
    Ok(rel.to_owned())
}

pub async fn put(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<StatusCode, ApiError> {
    // A PUT without any body (no Content-Length, no chunked encoding) is a client that
    // forgot the content; an empty file is written with an explicit `Content-Length: 0`.
    if !headers.contains_key(header::CONTENT_LENGTH) && !headers.contains_key(header::TRANSFER_ENCODING) {
        return Err(ApiError::invalid(
            "body",
            "the request has no body: send the file's bytes (for an empty file, an empty body with Content-Length: 0)",
        ));
    }
    let session = state.session(&id, &key)?;
    let path = check_path(
        q.path
            .as_deref()
            .ok_or_else(|| ApiError::invalid("path", "the path query parameter is required"))?,
    )?;
    let mode = match q.mode.as_deref() {
        None => 0o644,
        Some(m) => u32::from_str_radix(m, 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| ApiError::invalid("mode", "octal permission bits, e.g. 644 or 755"))?,
    };
    write_file(&session, path, mode, body).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn get(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> Result<Response, ApiError> {
    let session = state.session(&id, &key)?;
    match q.path.as_deref().map(check_path).transpose()? {
        Some(path) => {
            let data = read_file(&session, path, state.config.max_body as u64).await?;
            Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
        }
        None => {
            let entries = session.with_sandbox(|sb| sb.list_files()).await??;
            Ok(Json(entries).into_response())
        }
    }
}

/// Writes `content` at `path` (checked by [`check_path`]) in the session's /workspace.
pub(crate) async fn write_file(
    session: &Arc<Session>,
    path: String,
    mode: u32,
    content: impl AsRef<[u8]> + Send + 'static,
) -> Result<(), ApiError> {
    let cancel = Arc::clone(&session.cancel);
    session
        .with_sandbox(move |sb| sb.write_file(&path, mode, content.as_ref(), cancel.as_fd()))
        .await?
}

/// Reads the file at `path` (checked by [`check_path`]), at most `max` bytes; 404 when it
/// does not exist.
pub(crate) async fn read_file(session: &Arc<Session>, path: String, max: u64) -> Result<Vec<u8>, ApiError> {
    session.with_sandbox(move |sb| sb.read_file(&path, max)).await?
}
