//! A session's files: paths checked like a spec's, written and read by the sandbox's
//! init (in a micro-VM, the guest's) beneath /workspace.

use std::os::fd::AsFd;
use std::sync::Arc;

use crate::error::ApiError;
use crate::state::Session;

/// The path relative to /workspace, checked like a spec's file.
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

/// Writes `content` at `path` (checked by [`check_path`]) in the session's /workspace.
pub(crate) async fn write_file(
    session: &Arc<Session>,
    path: String,
    mode: u32,
    content: impl AsRef<[u8]> + Send + 'static,
) -> Result<(), ApiError> {
    let cancel = Arc::clone(&session.cancel);
    session
        .with_sandbox(move |sb| sb.write_file(&path, mode, content.as_ref(), &[cancel.as_fd()]))
        .await?
        .map_err(ApiError::from)
}

/// Reads the file at `path` (checked by [`check_path`]), at most `max` bytes; 404 when it
/// does not exist.
pub(crate) async fn read_file(session: &Arc<Session>, path: String, max: u64) -> Result<Vec<u8>, ApiError> {
    session
        .with_sandbox(move |sb| sb.read_file(&path, max))
        .await?
        .map_err(ApiError::from)
}
