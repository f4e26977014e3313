//! The store's errors.

use std::io;
use std::path::PathBuf;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The snapshot would take the store over its byte budget; nothing of it was kept.
    #[error(
        "snapshot store budget exceeded: the snapshot needs {needed} bytes, {used} of {budget} are in use"
    )]
    Budget {
        /// Bytes this snapshot would add on disk (its pack, its record, its full state).
        needed: u64,
        /// Bytes the store holds now.
        used: u64,
        /// The store's budget.
        budget: u64,
    },
    /// No snapshot has this id.
    #[error("no snapshot {0}")]
    NotFound(String),
    /// The input stream is not a tar stream the store accepts (a hard link, a device, an
    /// absolute or `..` path, a path outside workspace/, tmp/ and dev/shm/, a malformed or
    /// truncated archive); nothing was kept.
    #[error("refused tar stream: entry {entry} ({path}): {reason}")]
    InvalidTar {
        /// Index of the offending entry (0 for the first).
        entry: u64,
        /// Its path as far as it was read (lossy UTF-8; empty when not read yet).
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading the input stream failed (the producer's side); nothing was kept.
    #[error("reading the snapshot's tar stream: {0}")]
    Input(#[source] io::Error),
    /// `NewSnapshot::full` is not a staging directory of this store.
    #[error("the full state's staging directory {0} does not belong to this store")]
    ForeignStaging(PathBuf),
    /// The store's own files could not be read or written.
    #[error("snapshot store: {op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// `map_err` helper for the store's own I/O.
pub(crate) fn io_err(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.into();
    move |source| StoreError::Io { op, path, source }
}
