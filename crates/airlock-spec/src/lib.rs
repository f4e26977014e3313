//! The data airlock passes around: a validated run request ([`Spec`]) and what a run
//! produced ([`ExecResult`], [`FileEntry`]). No syscalls live here, so every front end (CLI, HTTP, MCP)
//! and every backend shares one definition and one set of error messages.
//!
//! ```
//! use airlock_spec::{Limits, Spec};
//! let spec = Spec::new(vec!["python3".into(), "-c".into(), "print(6*7)".into()])
//!     .with_limits(Limits { memory_bytes: 128 << 20, ..Limits::default() });
//! spec.validate().unwrap();
//! ```
#![deny(missing_docs)]

mod image;
mod network;
mod result;
mod spec;
mod units;

pub use image::ImageConfig;
pub use network::{NetworkPatch, NetworkPolicy, OnDenied, ProxyPolicy, Secret};
pub use result::{
    Change, EgressEntry, EgressKind, ExecResult, FileChange, FileEntry, FileKind, MAX_FILES_CHANGED, Outcome,
};
pub use spec::{FileSpec, Isolation, Limits, Spec, SpecError, TRACKABLE_DIRS};
pub use units::{UnitError, format_duration, format_ms, format_size, human_size, parse_duration, parse_size};
