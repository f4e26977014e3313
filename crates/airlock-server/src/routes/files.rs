//! `PUT /v1/sandboxes/{id}/files?path=P` (write raw bytes), `GET …/files?path=P` (read),
//! `GET …/files` (list /workspace). Init does the file work inside the sandbox (in a
//! micro-VM session, the guest's), resolving beneath /workspace without following
//! symlinks: the daemon never touches a path the program could have planted.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use std::sync::Arc;

use crate::body::{ApiQuery, RawBody};
use crate::error::ApiError;
use crate::service::files::{check_path, read_file, write_file};
use crate::state::{AppState, KeyName};

#[derive(Deserialize)]
pub struct FileQuery {
    path: Option<String>,
    mode: Option<String>,
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
    session.wake().await?;
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
    session.wake().await?;
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
