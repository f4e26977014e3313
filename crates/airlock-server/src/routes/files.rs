//! `PUT /v1/sandboxes/{id}/files?path=P` (write raw bytes), `GET …/files?path=P` (read),
//! `GET …/files` (list /workspace). Init does the file work inside the sandbox, resolving
//! beneath /workspace without following symlinks: the daemon never touches a path the
//! program could have planted.

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use std::sync::Arc;

use crate::body::RawBody;
use crate::error::ApiError;
use crate::runner::api_error;
use crate::state::{AppState, KeyName};

#[derive(Deserialize)]
pub struct FileQuery {
    path: Option<String>,
    mode: Option<String>,
}

fn check_path(path: &str) -> Result<String, ApiError> {
    let rel = path.strip_prefix("/workspace/").unwrap_or(path);
    if rel.ends_with('/') {
        return Err(ApiError::invalid(
            "path",
            format!("{path:?} names a directory, not a file"),
        ));
    }
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
    Query(q): Query<FileQuery>,
    RawBody(body): RawBody,
) -> Result<StatusCode, ApiError> {
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
    session
        .with_sandbox(move |sb| sb.write_file(&path, mode, &body))
        .await?
        .map_err(api_error)?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn get(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    Query(q): Query<FileQuery>,
) -> Result<Response, ApiError> {
    let session = state.session(&id, &key)?;
    let path = q.path.as_deref().map(check_path).transpose()?;
    let max = state.config.max_body as u64;
    let r = session
        .with_sandbox(move |sb| match &path {
            Some(p) => sb.read_file(p, max).map(Listing::Bytes),
            None => sb.list_files().map(Listing::Entries),
        })
        .await?;
    match r.map_err(|e| match e {
        airlock_sandbox::SandboxError::File(m) if m.contains("No such file") => ApiError::not_found(m),
        e => api_error(e),
    })? {
        Listing::Bytes(data) => {
            Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
        }
        Listing::Entries(entries) => Ok(Json(entries).into_response()),
    }
}

enum Listing {
    Bytes(Vec<u8>),
    Entries(Vec<airlock_sandbox::FileEntry>),
}
