//! airlock's gVisor tier: the program's syscalls are served by gVisor's Sentry, a kernel
//! in user space, so a bug of the host kernel is no longer reachable from the sandbox
//! the way it is from a namespace sandbox, at a fraction of a micro-VM's cost.
//!
//! - [`GvisorBackend`] implements `airlock_backend::Backend`: [`Backend::prepare`] finds
//!   `runsc`, picks the fastest gVisor platform that works here by trying each with a
//!   bounded timeout (the verdict is cached per runsc version and kernel), and purges
//!   what dead airlock processes left; [`Backend::create`] builds a sandbox.
//! - A sandbox is an OCI bundle airlock writes itself ([`bundle`]: the host's system
//!   directories read-only, a synthesized /etc, the agent), run by `runsc run` with
//!   `--network=none` and `--ignore-cgroups`, the runsc process (and so the Sentry and
//!   the Gofer it starts) placed in a host cgroup of airlock-sandbox's: memory, CPU and
//!   the usage figures come from there.
//! - Inside, [`agent`] (the `airlock-gvisor-agent` binary, or any binary that calls
//!   [`agent::maybe_serve`] first thing in `main`, e.g. `airlock` itself) is init: it speaks the
//!   micro-VM agent's frames (`airlock_vmwire::frame`) over the container's stdin and
//!   stdout, holds a ready child that has already dropped to the sandbox user, and runs
//!   each exec with a deadline, output caps and a kill of every process of the exec at
//!   its end (each exec's and each spawned program's processes are kept in a cgroup of
//!   their own in the Sentry's cgroupfs).
//! - Programs alongside execs (`Sandbox::spawn`: pipes or a terminal) and connections to
//!   the sandbox's loopback ports (`Sandbox::ports`) go through the agent's process
//!   keeper, which connects to a Unix socket the host serves ([`procs`] is the wire),
//!   apart from the exec's channel, so they work while an exec runs.
//! - Snapshots (issue 17): every exec's result lists the files it created, modified and
//!   deleted (the agent scans `Spec::files_changed_in` before and after, with
//!   airlock-fstree); the writable filesystem goes out and in as a tar stream in frames
//!   on the agent's port ([`wire`]); `pause` freezes the sandbox's v2 cgroup (or runs
//!   `runsc pause`); a full snapshot is `runsc checkpoint` (the sandbox is restored in
//!   place after it) and `Backend::restore` is `runsc restore`, as many times as wanted.
//!   runsc cannot save a connection to a host Unix socket, so the process keeper drops
//!   all of them before a checkpoint and connects again after (see [`procs`]).
//! - [`doctor`] says whether gVisor runs here, on which platform, and why not.
//!
//! ```no_run
//! use airlock_backend::{Backend, Capture};
//! use airlock_gvisor::{GvisorBackend, GvisorOptions};
//! use airlock_spec::Spec;
//!
//! let backend = GvisorBackend::new(GvisorOptions::from_env());
//! backend.prepare()?;
//! let spec = Spec::new(vec!["python3".into(), "-c".into(), "print(6*7)".into()]);
//! let result = backend.run(&spec, &mut Capture, &[])?;
//! assert_eq!(result.stdout, "42\n");
//! # Ok::<(), airlock_backend::Error>(())
//! ```
//!
//! [`Backend::prepare`]: airlock_backend::Backend::prepare
//! [`Backend::create`]: airlock_backend::Backend::create
#![deny(missing_docs)]

pub mod agent;
mod backend;
pub mod bundle;
mod channel;
pub mod doctor;
mod egress;
pub mod platform;
mod process;
pub mod procs;
mod sandbox;
pub mod wire;

pub use backend::{GvisorBackend, GvisorOptions};
pub use platform::Platform;
pub use sandbox::{GvisorSandbox, MIN_MEMORY_BYTES};
