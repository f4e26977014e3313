//! The Linux isolation engine.
#![deny(missing_docs)]
pub mod cgroup;
pub mod seccomp;
