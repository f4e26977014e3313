//! The one error of every tier, and its kinds.

use airlock_spec::{Isolation, SpecError, format_size, human_size};
use serde::{Deserialize, Serialize};

/// What kind of failure an [`Error`] is: what a caller can do about it. Also what a tier
/// whose sandbox sits behind a wire sends across it, so the host side never reads a
/// message to classify it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is invalid: fix the named field.
    Invalid,
    /// What was asked for (a file) does not exist.
    NotFound,
    /// A file does not fit the sandbox's disk or memory.
    DiskFull,
    /// The sandbox is gone (its init, guest or Sentry died): nothing more runs in it.
    Gone,
    /// The caller cancelled it.
    Cancelled,
    /// This host cannot run the tier asked for.
    Unavailable,
    /// The tier has no room for another sandbox now; try later.
    OverCapacity,
    /// Something on the host failed (a bug, or the host is broken).
    Host,
}

impl ErrorKind {
    /// Its name on the wire and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Invalid => "invalid",
            ErrorKind::NotFound => "not_found",
            ErrorKind::DiskFull => "disk_full",
            ErrorKind::Gone => "gone",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::OverCapacity => "over_capacity",
            ErrorKind::Host => "host",
        }
    }
}

/// Why a sandbox could not be built, or a program, file or listing has no result. A
/// program that fails is an `ExecResult`, never this.
///
/// The causes are printed in each message, so they are not also `source()`s (a chain
/// printer would show them twice); a host failure keeps its cause as a value to inspect.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is invalid; the error names the field.
    #[error("invalid request: {0}")]
    Invalid(SpecError),
    /// A file that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A file that does not fit the sandbox's disk (nothing of it was left behind; the
    /// sandbox is still usable).
    #[error("{0}")]
    DiskFull(DiskFull),
    /// The sandbox is gone: its init, guest or Sentry died (the OOM killer, a crash, a
    /// VM that stopped answering). Nothing more can run in it.
    #[error("{0}")]
    Gone(String),
    /// The caller cancelled it: the program's processes were killed.
    #[error("cancelled")]
    Cancelled,
    /// This host cannot run the tier.
    #[error("isolation {} is not available on this host: {reason}", .tier.as_str())]
    Unavailable {
        /// The tier asked for.
        tier: Isolation,
        /// Why not, in words a person can act on.
        reason: String,
    },
    /// No room for another sandbox of the tier now (host ids, slots).
    #[error("{0}")]
    OverCapacity(String),
    /// Something on the host failed.
    #[error("{what}: {source}")]
    Host {
        /// What was being done.
        what: String,
        /// What failed.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    /// Its kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Invalid(_) => ErrorKind::Invalid,
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::DiskFull(_) => ErrorKind::DiskFull,
            Error::Gone(_) => ErrorKind::Gone,
            Error::Cancelled => ErrorKind::Cancelled,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::OverCapacity(_) => ErrorKind::OverCapacity,
            Error::Host { .. } => ErrorKind::Host,
        }
    }

    /// An invalid request: `field` is the spec's field name (`limits.memory_bytes`,
    /// `path`).
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Error {
        Error::Invalid(SpecError::new(field, message))
    }

    /// A host failure while doing `what`.
    pub fn host(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Error {
        Error::Host {
            what: what.into(),
            source: source.into(),
        }
    }

    /// The error a peer sent across a wire as `kind`, the field it named (for
    /// [`ErrorKind::Invalid`]) and its message. A disk-full error has frames of its
    /// own (it carries figures); one sent as a bare kind becomes a host failure.
    pub fn from_wire(kind: ErrorKind, field: Option<String>, message: String, tier: Isolation) -> Error {
        match kind {
            ErrorKind::Invalid => Error::Invalid(SpecError::new(field.unwrap_or_default(), message)),
            ErrorKind::NotFound => Error::NotFound(message),
            ErrorKind::Gone => Error::Gone(message),
            ErrorKind::Cancelled => Error::Cancelled,
            ErrorKind::Unavailable => Error::Unavailable {
                tier,
                reason: message,
            },
            ErrorKind::OverCapacity => Error::OverCapacity(message),
            ErrorKind::DiskFull | ErrorKind::Host => Error::host("the sandbox's agent", message),
        }
    }

    /// The parts [`Error::from_wire`] takes: kind, field and message.
    pub fn to_wire(&self) -> (ErrorKind, Option<String>, String) {
        match self {
            Error::Invalid(e) => (ErrorKind::Invalid, Some(e.field.clone()), e.message.clone()),
            Error::Unavailable { reason, .. } => (ErrorKind::Unavailable, None, reason.clone()),
            e => (e.kind(), None, e.to_string()),
        }
    }
}

impl From<SpecError> for Error {
    fn from(e: SpecError) -> Self {
        Error::Invalid(e)
    }
}

impl From<DiskFull> for Error {
    fn from(e: DiskFull) -> Self {
        Error::DiskFull(e)
    }
}

/// A file that does not fit the sandbox's disk: refused before any of it was sent, or
/// when the disk filled up part-way (what was written of it is removed again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskFull {
    /// The file's path relative to /workspace.
    pub path: String,
    /// The file's size.
    pub bytes: u64,
    /// The size of the sandbox's disk (the tmpfs /workspace, /tmp and /dev/shm share).
    pub disk_bytes: u64,
    /// What was free on the disk when the write failed (and its part was removed);
    /// `None` when the file is larger than the whole disk and was refused unsent.
    pub free_bytes: Option<u64>,
    /// Set when the sandbox's memory cap is what the file does not fit: the disk is a
    /// tmpfs whose pages count against it, so a file as large as the cap is refused
    /// unsent (writing it would get the sandbox OOM-killed part-way).
    #[serde(default)]
    pub memory_bytes: Option<u64>,
}

impl std::fmt::Display for DiskFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(memory) = self.memory_bytes {
            return write!(
                f,
                "the sandbox's memory ({}), which the files on its disk count against, has no room for file '{}' ({}): use a sandbox with more memory (limits.memory_bytes)",
                format_size(memory),
                self.path,
                human_size(self.bytes)
            );
        }
        write!(
            f,
            "the sandbox's disk ({}) has no room for file '{}' ({})",
            format_size(self.disk_bytes),
            self.path,
            human_size(self.bytes)
        )?;
        match self.free_bytes {
            Some(free) => write!(
                f,
                ": {} of it is free; remove files from /workspace or /tmp, or use a sandbox with a larger disk (limits.disk_bytes)",
                human_size(free)
            ),
            None => write!(f, ": use a sandbox with a larger disk (limits.disk_bytes)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_crosses_a_wire_with_its_kind_and_field() {
        let sent = Error::invalid("path", "must be relative");
        let (kind, field, message) = sent.to_wire();
        let wire = serde_json::to_string(&kind).unwrap();
        assert_eq!(wire, "\"invalid\"");
        let kind: ErrorKind = serde_json::from_str(&wire).unwrap();
        match Error::from_wire(kind, field, message, Isolation::Microvm) {
            Error::Invalid(e) => assert_eq!(
                (e.field.as_str(), e.message.as_str()),
                ("path", "must be relative")
            ),
            other => panic!("{other:?}"),
        }
        let gone = Error::from_wire(
            ErrorKind::NotFound,
            None,
            "a.txt: no such file".into(),
            Isolation::Microvm,
        );
        assert_eq!(gone.kind(), ErrorKind::NotFound);
    }

    #[test]
    fn a_host_failure_says_what_failed_and_why() {
        let e = Error::host(
            "creating the cgroup",
            std::io::Error::from_raw_os_error(libc_enospc()),
        );
        assert_eq!(e.kind(), ErrorKind::Host);
        assert!(e.to_string().starts_with("creating the cgroup: "), "{e}");
    }

    fn libc_enospc() -> i32 {
        28
    }

    #[test]
    fn a_disk_full_error_names_the_disk_the_file_and_the_room_left() {
        let e = DiskFull {
            path: "data/big.bin".into(),
            bytes: 100 << 20,
            disk_bytes: 64 << 20,
            free_bytes: None,
            memory_bytes: None,
        };
        let m = e.to_string();
        assert!(
            m.starts_with("the sandbox's disk (64 MiB) has no room for file 'data/big.bin' (100 MiB)"),
            "{m}"
        );
        assert!(
            m.ends_with("use a sandbox with a larger disk (limits.disk_bytes)"),
            "{m}"
        );
    }
}
