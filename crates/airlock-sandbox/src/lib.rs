//! The Linux isolation engine of airlock: one sandbox = fresh user, pid, mount, net, ipc,
//! uts and cgroup namespaces + one cgroup + landlock + seccomp + a tmpfs root, torn down
//! completely when the run ends.
//!
//! ```no_run
//! use airlock_sandbox::{Capture, Engine};
//! use airlock_spec::Spec;
//!
//! // First thing in main: a sandbox's init is this same binary, re-executed.
//! airlock_sandbox::maybe_run_init();
//! let engine = Engine::new()?;
//! let spec = Spec::new(vec!["python3".into(), "-c".into(), "print(6*7)".into()]);
//! let result = engine.run(&spec, &mut Capture, &[])?;
//! assert_eq!(result.stdout, "42\n");
//! # Ok::<(), airlock_sandbox::SandboxError>(())
//! ```
//!
//! The binary that embeds the engine must call [`maybe_run_init`] first thing in `main`.
#![deny(missing_docs)]

mod backend;
pub mod cgroup;
pub mod doctor;
mod egress;
mod etc;
mod fanotify;
mod init;
mod keeper;
pub mod landlock;
mod mounts;
mod netns;
mod nftables;
mod payload;
mod ports;
pub mod preflight;
pub mod privileges;
mod procs;
mod protocol;
mod sandbox;
mod scratch;
mod spawn;
mod supervisor;
pub mod sys;
mod workspace;
mod zygote;

use airlock_spec::{ExecResult, Spec, SpecError};
use std::os::fd::BorrowedFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

pub use egress::{DNS_PORT, PROXY_PORT, TRANSPARENT_PORT, proxy_env};
pub use etc::{BOUND_DIRS as HOST_ETC_DIRS, BOUND_FILES as HOST_ETC_FILES, GENERATED as GENERATED_ETC};
pub use init::{INIT_ARG, maybe_run_init};
pub use mounts::SYSTEM_DIRS;
pub use netns::route_to_proxy_here;
pub use payload::{NotRunnable, resolve};
pub use sandbox::{HOST_UID_BASE, HOST_UID_SLOTS, Sandbox, SandboxConfig};
pub use supervisor::{Capture, OutputSink, base_env};
pub use workspace::{DiskFull, list as list_workspace};
pub use zygote::ZYGOTE_ARG;

/// Why a sandbox could not be run. Every variant means the program did not run (or was
/// stopped before a result existed); a program that fails is an `ExecResult`, not this.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The request is invalid.
    #[error("invalid request: {0}")]
    Spec(SpecError),
    /// The host cannot provide an isolation the run needs.
    #[error("{0}")]
    Host(String),
    /// Creating or configuring the cgroup failed.
    #[error("cgroup: {0}")]
    Cgroup(cgroup::CgroupError),
    /// Building the seccomp filter failed.
    #[error("seccomp: {0}")]
    Seccomp(airlock_seccomp::SeccompError),
    /// Creating the sandbox's processes or pipes failed.
    #[error("spawning the sandbox: {0}")]
    Spawn(std::io::Error),
    /// Building the sandbox or starting the program failed (message from init).
    #[error("{0}")]
    Setup(String),
    /// The caller cancelled the run (the sandbox was killed and purged).
    #[error("cancelled")]
    Cancelled,
    /// The sandbox's init is gone (killed, or dead with its sandbox): nothing more can
    /// run in it.
    #[error("the sandbox is gone")]
    Gone,
    /// A file operation failed (the sandbox is still usable): a path that does not
    /// exist or is refused.
    #[error("{message}")]
    File {
        /// What kind of failure, as init reported it.
        kind: airlock_backend::ErrorKind,
        /// What init said.
        message: String,
    },
    /// A file does not fit the sandbox's disk (the sandbox is still usable; nothing of
    /// the file was left behind).
    #[error("{0}")]
    DiskFull(DiskFull),
    /// Reading or writing the sandbox's files from the host failed (an export, an import,
    /// the scans of `files_changed`).
    #[error("{what}: {source}")]
    Files {
        /// What was being done.
        what: &'static str,
        /// What failed.
        source: std::io::Error,
    },
}

// The causes are printed in each message, so they are not also `#[source]`s (a chain
// printer would show them twice).
impl From<SpecError> for SandboxError {
    fn from(e: SpecError) -> Self {
        SandboxError::Spec(e)
    }
}

impl From<cgroup::CgroupError> for SandboxError {
    fn from(e: cgroup::CgroupError) -> Self {
        SandboxError::Cgroup(e)
    }
}

impl From<airlock_seccomp::SeccompError> for SandboxError {
    fn from(e: airlock_seccomp::SeccompError) -> Self {
        SandboxError::Seccomp(e)
    }
}

impl From<SandboxError> for airlock_backend::Error {
    fn from(e: SandboxError) -> Self {
        use airlock_backend::Error;
        match e {
            SandboxError::Spec(e) => Error::Invalid(e),
            SandboxError::Host(reason) => Error::Unavailable {
                tier: airlock_spec::Isolation::Namespaces,
                reason,
            },
            SandboxError::Cgroup(e) => Error::host("the sandbox's cgroup", e),
            SandboxError::Seccomp(e) => Error::host("the seccomp filter", e),
            SandboxError::Spawn(e) => Error::host("spawning the sandbox", e),
            SandboxError::Setup(m) => Error::host("building the sandbox", m),
            SandboxError::Cancelled => Error::Cancelled,
            SandboxError::Gone => {
                Error::Gone("the sandbox is gone (its init was killed, e.g. by the OOM killer)".into())
            }
            SandboxError::File { kind, message } => Error::from_wire(
                kind,
                Some("path".into()),
                message,
                airlock_spec::Isolation::Namespaces,
            ),
            SandboxError::DiskFull(e) => Error::DiskFull(e),
            SandboxError::Files { what, source } => Error::host(what, source),
        }
    }
}

/// How many sandboxes' v1 cgroup directories a service keeps for the next ones (each
/// holds a memory cgroup's kernel state, some tens of KiB).
pub const SPARE_CGROUPS: usize = 16;

/// What is needed to run sandboxes on this host, detected and built once.
#[derive(Debug)]
pub struct Engine {
    /// The host's cgroup layout.
    pub(crate) cgroups: cgroup::CgroupHost,
    /// The compiled seccomp filter, as the bytes sent to every init.
    pub(crate) seccomp: Vec<u8>,
    /// Counter that spreads sandboxes over host uid slots.
    slot: AtomicU32,
    /// Sandboxes of dead airlock processes removed at start.
    purged: usize,
    /// The fork server that clones sandboxes, once [`Engine::start_zygote`] started it.
    zygote: OnceLock<zygote::Zygote>,
    /// Set when the zygote stopped answering: sandboxes are cloned directly from then on.
    zygote_gone: AtomicBool,
    /// Image roots are mounted read-write, handed to the sandbox user (`image build` only:
    /// see [`Engine::with_writable_image_root`]).
    pub(crate) writable_image: bool,
    /// The fanotify group that tells whether an exec changed a sandbox's files (see
    /// `fanotify`), made with the first sandbox; `None` where the kernel has none to give.
    changes: OnceLock<Option<std::sync::Arc<fanotify::Changes>>>,
    /// Made by [`Engine::for_one_run`]: the host was not checked (a sandbox that fails to
    /// build is explained by the checks then), and init may run in the clone of this
    /// process (see `sandbox::clone_directly`).
    pub(crate) one_run: bool,
}

impl Engine {
    /// Checks the host ([`preflight::require`]: as root, or as an ordinary user given user
    /// namespaces and a delegated cgroup), builds the seccomp filter, and purges cgroups
    /// that crashed airlock processes left behind.
    pub fn new() -> Result<Engine, SandboxError> {
        Engine::make(true)
    }

    /// Like [`Engine::new`], for a process that builds one sandbox (`airlock run`): the
    /// host is checked only if that sandbox fails to build, and then the refusal is the
    /// same one line [`Engine::new`] gives. The checks cost a few milliseconds (a child in
    /// every namespace, a cgroup made and joined: on cgroup v1 that waits for an RCU grace
    /// period), as much as the run itself; every need they try is also one the sandbox's
    /// own build fails without (it never runs weaker than asked), so nothing is skipped
    /// but the early, clearer message, which a failure still gets.
    pub fn for_one_run() -> Result<Engine, SandboxError> {
        Engine::make(false)
    }

    fn make(check: bool) -> Result<Engine, SandboxError> {
        let cgroups = cgroup::CgroupHost::detect();
        // Root or not (see `preflight` and docs/rootless.md): everything a sandbox needs
        // is tried once, and a host that lacks something is refused in one line.
        if check || cgroups.is_err() {
            preflight::require(cgroups.as_ref()).map_err(|m| SandboxError::Host(m.to_string()))?;
        }
        let cgroups = cgroups?;
        let purged = cgroups.purge_stale();
        let program = airlock_seccomp::build()?;
        Ok(Engine {
            cgroups,
            seccomp: airlock_seccomp::to_bytes(&program),
            slot: AtomicU32::new(0),
            purged,
            zygote: OnceLock::new(),
            zygote_gone: AtomicBool::new(false),
            writable_image: false,
            changes: OnceLock::new(),
            one_run: !check,
        })
    }

    /// `err`, a sandbox's failure to build, or what the host lacks when the checks skipped
    /// by [`Engine::for_one_run`] find something missing (that is then the cause).
    pub(crate) fn explain(&self, err: SandboxError) -> SandboxError {
        if !self.one_run || matches!(err, SandboxError::Spec(_) | SandboxError::Cancelled) {
            return err;
        }
        match preflight::require(Ok(&self.cgroups)) {
            Err(missing) => SandboxError::Host(missing.to_string()),
            Ok(()) => err,
        }
    }

    /// An engine whose sandboxes' image roots are writable, for building images (one
    /// `RUN` step of an Airlockfile changes the tree it runs in): the tree is a throwaway
    /// copy made for that one sandbox, and it is handed to the sandbox user before the
    /// sandbox starts (every file and directory, symlinks themselves, chowned to the
    /// host uid the sandbox user maps to), mounted read-write (still nosuid, nodev), and
    /// writable under landlock. The mount points, /proc, /dev, /tmp and /workspace are
    /// mounted over it as usual. Never for a prepared root of the store: those are shared.
    pub fn with_writable_image_root(mut self) -> Engine {
        self.writable_image = true;
        self
    }

    /// Runs `spec` in a fresh sandbox, purges it, and returns the result. Output within
    /// the limit is also passed to `sink` as it arrives. When any `cancel` fd becomes
    /// readable, the sandbox is killed and purged and [`SandboxError::Cancelled`] is
    /// returned (the fds are only polled, never read, so one fd can cancel many runs).
    pub fn run(
        &self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, SandboxError> {
        spec.validate()?;
        let mut sandbox = self.create(&SandboxConfig::of(spec))?;
        let mut result = sandbox.exec_once(spec, sink, cancel)?;
        result.setup_ms += sandbox.setup_time().as_secs_f64() * 1e3;
        result.setup_ms = (result.setup_ms * 1e3).round() / 1e3;
        Ok(result)
    }

    /// Builds a sandbox and leaves it waiting for [`Sandbox::exec`] and file operations.
    pub fn create(&self, config: &SandboxConfig) -> Result<Sandbox, SandboxError> {
        Sandbox::create(self, config, false)
    }

    /// Like [`Engine::create`], for a sandbox built before anyone asked for it (a warm
    /// pool): until its first exec, its processes run only on CPU time nothing else wants
    /// ([`cgroup::Cgroup::set_background`]), so building it never delays a running
    /// program. Its first exec restores an ordinary share.
    pub fn create_ahead(&self, config: &SandboxConfig) -> Result<Sandbox, SandboxError> {
        Sandbox::create(self, config, true)
    }

    /// How many sandboxes of dead airlock processes were purged when this engine started.
    pub fn purged_at_start(&self) -> usize {
        self.purged
    }

    /// Starts a fork server that clones every later sandbox's init (see the `zygote`
    /// module): for a long-running supervisor that creates many sandboxes, it saves each
    /// one the copy of the supervisor's address space and the exec of airlock. The
    /// process must call [`maybe_run_init`] first thing in `main`, as for init. Does
    /// nothing if it runs already. Should the zygote die, sandboxes are cloned directly
    /// again.
    pub fn start_zygote(&self) -> Result<(), SandboxError> {
        if self.zygote.get().is_some() {
            return Ok(());
        }
        let zygote = zygote::Zygote::start().map_err(SandboxError::Spawn)?;
        // A concurrent start lost the race: its zygote exits when its socket closes.
        let _ = self.zygote.set(zygote);
        Ok(())
    }

    /// Keeps the v1 cgroup directories of sandboxes that ended cleanly for the next ones
    /// (see `cgroup::Spares`), at most as many as [`SPARE_CGROUPS`]: for a service, which
    /// must call [`airlock_backend::Backend::stop_service`] at its end to remove them.
    pub fn keep_spare_cgroups(&self) {
        self.cgroups.keep_spares(SPARE_CGROUPS);
    }

    /// Stops keeping spare cgroup directories and removes those kept.
    pub fn release_spare_cgroups(&self) {
        self.cgroups.release_spares();
    }

    /// The zygote, while it answers.
    pub(crate) fn zygote(&self) -> Option<&zygote::Zygote> {
        if self.zygote_gone.load(Ordering::Relaxed) {
            return None;
        }
        self.zygote.get()
    }

    /// Notes that the zygote stopped answering.
    pub(crate) fn zygote_failed(&self) {
        self.zygote_gone.store(true, Ordering::Relaxed);
    }

    /// The fanotify group of this engine's sandboxes, made at the first ask.
    pub(crate) fn changes(&self) -> Option<std::sync::Arc<fanotify::Changes>> {
        self.changes
            .get_or_init(|| fanotify::Changes::new().ok().map(std::sync::Arc::new))
            .clone()
    }

    /// Whether this engine tells an exec that changed no file without walking the tree
    /// (a fanotify group reporting file ids: Linux >= 5.1, and a tmpfs with an id of its
    /// own, Linux >= 6.7, for the mark to take).
    pub fn watches_changes(&self) -> bool {
        self.changes().is_some()
    }

    pub(crate) fn next_slot(&self) -> u32 {
        self.slot.fetch_add(1, Ordering::Relaxed)
    }
}
