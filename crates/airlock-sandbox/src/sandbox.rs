//! A provisioned sandbox, seen from outside: its cgroup, its init process and the control
//! socket to it. [`Sandbox::create`] builds one (namespaces, mounts, cgroup, filters
//! ready) and leaves it waiting; [`Sandbox::exec`] runs programs in it, one at a time;
//! file operations go through init. Dropping a `Sandbox` kills and reaps init and removes
//! the cgroup, on every path, which purges everything the sandbox owned (its tmpfs dies
//! with its mount namespace).

use airlock_fstree::Index;
use airlock_spec::{ExecResult, FileEntry, NetworkPolicy, Spec};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, fcntl};
use nix::poll::{PollFd, PollFlags, poll};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nix::sys::wait::WaitStatus;

use crate::cgroup::{Cgroup, CgroupLimits, Usage};
use crate::egress::{self, EgressProxy, EgressSockets};
use crate::fanotify::{Changes, Marked};
use crate::protocol::{self, CHUNK, Frame, Reply, Request};
use crate::scratch::{Cancellable, SNAPSHOT_ROOTS, Scratch, Watch};
use crate::supervisor::{self, OutputSink};
use crate::{Engine, SandboxError, init::INIT_ARG, sys};

/// Namespaces the sandbox is cloned into. The cgroup namespace is not among them: init
/// unshares it itself once the supervisor has moved it into every v1 cgroup, so that its
/// cgroup root is the sandbox's own cgroup in every hierarchy (one made at clone time
/// would be rooted in the supervisor's v1 cgroups and show the host's cgroup paths).
const NAMESPACES: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS) as u64;

/// Building the sandbox takes milliseconds; this bounds a set-up that hangs.
const SETUP_DEADLINE: Duration = Duration::from_secs(30);
/// File operations are quick; this bounds one that hangs.
const FILE_OP_DEADLINE: Duration = Duration::from_secs(30);
/// Child-side fds are first moved above this, so the dup2 into 0..=3 never clobbers.
const HIGH_FD: RawFd = 100;

/// First host uid of the ranges sandboxes are mapped to: well above any real account.
pub const HOST_UID_BASE: u32 = 0x4000_0000;
/// Number of distinct 65536-id slots handed out round-robin.
pub const HOST_UID_SLOTS: u32 = 8192;

/// The host uid that sandbox uid 0 maps to for the `n`th sandbox of this process.
fn host_uid_base(n: u32) -> u32 {
    let mix = std::process::id().wrapping_mul(7919).wrapping_add(n);
    HOST_UID_BASE + (mix % HOST_UID_SLOTS) * 65536
}

/// The sandbox-wide part of a spec: what is fixed when the sandbox is built.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxConfig {
    /// cgroup limits (memory, CPU, pids + init).
    pub limits: CgroupLimits,
    /// Size of the writable tmpfs.
    pub disk_bytes: u64,
    /// Where system directories come from.
    pub rootfs: Option<std::path::PathBuf>,
    /// An image's prepared tree, the sandbox's whole root (then `rootfs` is `None`).
    pub image: Option<std::path::PathBuf>,
    /// Network policy.
    pub network: NetworkPolicy,
    /// Programs run with a fixed address-space layout (`ADDR_NO_RANDOMIZE`). For a
    /// sandbox inside a VM emulated in software only: the emulator's translation cache
    /// is keyed by virtual address, so a fixed layout lets code translated for one
    /// program (the loader, libc) serve the next. Randomization protects a program from
    /// its own input; it is no wall between a sandbox and its host.
    pub fixed_layout: bool,
    /// Proxy mode: a CA bundle (PEM) installed read-only in the sandbox at
    /// /etc/ssl/certs/ca-certificates.crt (at most 8 MiB); `None` leaves the root's own.
    pub ca_bundle: Option<Vec<u8>>,
}

impl SandboxConfig {
    /// The sandbox-wide settings of `spec`.
    pub fn of(spec: &Spec) -> Self {
        SandboxConfig {
            limits: cgroup_limits(spec),
            disk_bytes: spec.limits.disk_bytes,
            rootfs: spec.rootfs.clone(),
            image: None,
            network: spec.network.clone(),
            fixed_layout: false,
            ca_bundle: None,
        }
    }
}

/// A spec that names an image, run in a sandbox built without one: refused, never run on
/// the host's system directories in its place.
pub(crate) fn unresolved_image() -> airlock_spec::SpecError {
    airlock_spec::SpecError::new(
        "image",
        "was not resolved to an image's prepared root: this sandbox has the host's system directories",
    )
}

/// The cgroup limits a spec asks for; airlock's init is one more process.
pub(crate) fn cgroup_limits(spec: &Spec) -> CgroupLimits {
    cgroup_limits_of(&spec.limits)
}

/// The cgroup limits of `limits`; airlock's init is one more process.
pub(crate) fn cgroup_limits_of(limits: &airlock_spec::Limits) -> CgroupLimits {
    CgroupLimits {
        memory_bytes: limits.memory_bytes,
        cpus: limits.cpus,
        pids: limits.pids + 1,
    }
}

/// A provisioned sandbox. See the module docs.
#[derive(Debug)]
pub struct Sandbox {
    /// Its id (also the cgroup directory's name).
    id: String,
    /// The cgroup; removed on drop, after init is reaped.
    cgroup: Option<Cgroup>,
    /// Limits currently written to the cgroup.
    limits: CgroupLimits,
    /// Size of the tmpfs (the programs' file-size cap).
    disk_bytes: u64,
    /// Init's pid in the host pid namespace; reaped on drop.
    pid: libc::pid_t,
    /// pidfd of init: signals without pid-reuse races; readable once init exits.
    pidfd: OwnedFd,
    /// The supervisor's end of the control socket.
    control: OwnedFd,
    /// Init's wait status once reaped.
    reaped: Option<WaitStatus>,
    /// How long provisioning took.
    setup: Duration,
    /// In proxy mode, the egress proxy serving this sandbox; stopped on drop.
    proxy: Option<EgressProxy>,
    /// Usage read (and memory peak reset) when the sandbox became ready, for its first
    /// exec: init is idle from then on, so this is what the exec would read, and a
    /// pooled sandbox's first exec need not read it on the request's path.
    baseline: Option<Usage>,
    /// Built ahead of need: its CPU share is the background's until its first exec (see
    /// [`Cgroup::set_background`]).
    background: bool,
    /// The host uid the sandbox user is mapped to: owner of the program's stdio pipes.
    /// Run by an ordinary user (rootless), that user's own uid, for every sandbox.
    host_user: u32,
    /// The host gid the sandbox user's group is mapped to (rootless: the user's own).
    host_group: u32,
    /// Built by an ordinary user: only the sandbox user is mapped (see `preflight::id_maps`).
    rootless: bool,
    /// Its root is an image's tree (not the host's system directories).
    image: bool,
    /// A program was spawned in it (see `keeper`): a session exec's deadline spares the
    /// keepers' subtrees.
    spawned: bool,
    /// What connects to its ports (see `ports`), made at the first ask; closed on drop.
    ports: std::sync::OnceLock<Arc<crate::ports::Ports>>,
    /// Its scratch tmpfs's roots, opened from the host when first needed (see `scratch`).
    scratch: Scratch,
    /// The tree as the last session exec left it (`files_changed_in`, the index), for the
    /// next exec's before-scan: only while nothing else can have changed it since (no
    /// spawned program, no file operation; an exec's processes all end with it).
    last_index: Option<(Vec<String>, Index)>,
    /// Frozen by [`Sandbox::pause`]: nothing but exports, imports, resume and drop is
    /// served until [`Sandbox::resume`].
    paused: bool,
    /// The engine's fanotify group, until the tmpfs is marked in it (see `fanotify`).
    changes: Option<Arc<Changes>>,
    /// The scratch tmpfs's mark: whether anything changed on it since an index was taken.
    marked: Option<Marked>,
}

/// Moves `fd` to a number >= HIGH_FD (close-on-exec), for the child's dup2 step.
pub(crate) fn high(fd: &OwnedFd) -> io::Result<OwnedFd> {
    let raw = fcntl(fd, FcntlArg::F_DUPFD_CLOEXEC(HIGH_FD)).map_err(io::Error::from)?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new fd that nothing else owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) })
}

/// A fresh sandbox id: 16 hex digits from the kernel's random source.
pub(crate) fn new_id() -> Result<String, SandboxError> {
    let mut bytes = [0u8; 8];
    sys::getrandom(&mut bytes).map_err(SandboxError::Spawn)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Chowns `root` and everything below it to `uid` and `gid`, symlinks themselves,
/// following none.
fn chown_tree(root: &std::path::Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(root, Some(uid), Some(gid))?;
    if std::fs::symlink_metadata(root)?.is_dir() {
        for e in std::fs::read_dir(root)? {
            chown_tree(&e?.path(), uid, gid)?;
        }
    }
    Ok(())
}

impl Sandbox {
    /// Builds a sandbox and waits until it is ready for requests. With `ahead` (a pool
    /// building it before anyone asked), the build runs in the background's CPU share.
    pub(crate) fn create(
        engine: &Engine,
        config: &SandboxConfig,
        ahead: bool,
    ) -> Result<Sandbox, SandboxError> {
        Sandbox::build(engine, config, ahead).map_err(|e| engine.explain(e))
    }

    fn build(engine: &Engine, config: &SandboxConfig, ahead: bool) -> Result<Sandbox, SandboxError> {
        let t0 = Instant::now();
        // Init finds these beneath the host's root, parked at /oldroot, where an absolute
        // symbolic link on the way would lead into the sandbox's own new root: resolved
        // here, on the host, first.
        let rootfs = host_path(config.rootfs.as_deref(), "rootfs")?;
        let image = host_path(config.image.as_deref(), "image tree")?;
        let policy = egress::proxy(&config.network)?;
        if policy.is_some() {
            crate::preflight::require_proxy().map_err(|m| SandboxError::Host(m.to_string()))?;
        }
        // The trust bundle the sandbox gets: the proxy's (the host's roots and its CA,
        // when it intercepts TLS for secrets), or one the caller gives.
        let ca_bundle: Option<Vec<u8>> = config.ca_bundle.clone().or_else(|| {
            policy
                .as_ref()
                .and_then(|p| p.ca_bundle_pem())
                .map(String::into_bytes)
        });
        if let Some(bundle) = &ca_bundle
            && bundle.len() as u64 > protocol::MAX_CA_BUNDLE
        {
            return Err(SandboxError::Spec(airlock_spec::SpecError::new(
                "ca_bundle",
                format!(
                    "is {} bytes; at most {} are allowed",
                    bundle.len(),
                    protocol::MAX_CA_BUNDLE
                ),
            )));
        }
        let id = new_id()?;
        let cgroup = engine.cgroups.create(&id, &config.limits)?;
        if ahead {
            cgroup.set_background(true)?;
        }

        let (control, child_control) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| SandboxError::Spawn(e.into()))?;
        let cgroup_fd = cgroup.clone_into_fd().map(|fd| fd.as_raw_fd());
        // Through the zygote when there is one; directly when not, or no longer.
        let zygote = match engine.zygote() {
            Some(z) => match z.spawn(NAMESPACES, cgroup_fd, &child_control, ahead) {
                Ok(cloned) => Some(cloned.map_err(SandboxError::Spawn)?),
                Err(_) => {
                    engine.zygote_failed();
                    None
                }
            },
            None => None,
        };
        let zygote_cloned = zygote.is_some();
        let cloned = match zygote {
            Some(cloned) => cloned,
            // Init runs in the clone itself (no exec of airlock) where that is safe: see
            // `clone_directly`.
            None => clone_directly(
                cgroup_fd,
                &child_control,
                engine.one_run && policy.is_none() && !crate::preflight::rootless() && sys::single_threaded(),
            )?,
        };
        drop(child_control);
        if ahead && zygote_cloned {
            // Cloned at the background's nice (see `zygote`): the sandbox's own processes
            // start from the supervisor's again (their cgroup keeps them in the
            // background).
            let _ = sys::set_nice(cloned.pid, sys::nice(0).unwrap_or(0));
        }
        let mut sandbox = Sandbox {
            id,
            cgroup: Some(cgroup),
            limits: config.limits,
            disk_bytes: config.disk_bytes,
            pid: cloned.pid,
            pidfd: cloned.pidfd,
            control,
            reaped: None,
            setup: Duration::ZERO,
            proxy: None,
            baseline: None,
            background: ahead,
            host_user: 0,
            host_group: 0,
            rootless: crate::preflight::rootless(),
            image: config.image.is_some(),
            spawned: false,
            ports: std::sync::OnceLock::new(),
            scratch: Scratch::default(),
            last_index: None,
            paused: false,
            changes: engine.changes(),
            marked: None,
        };

        // The child waits on the control socket: map its ids, then go.
        let base = host_uid_base(engine.next_slot());
        if sandbox.rootless {
            // The user's own ids are all an ordinary user may map: every sandbox of this
            // user runs as that one host uid (see docs/rootless.md).
            // SAFETY: geteuid/getegid have no preconditions and cannot fail.
            (sandbox.host_user, sandbox.host_group) = unsafe { (libc::geteuid(), libc::getegid()) };
        } else {
            sandbox.host_user = base + crate::mounts::SANDBOX_ID;
            sandbox.host_group = sandbox.host_user;
        }
        let image_writable = engine.writable_image && config.image.is_some();
        if let (true, Some(tree)) = (image_writable, &config.image) {
            // The build step's own copy: the sandbox user owns all of it.
            chown_tree(tree, sandbox.host_user, sandbox.host_group).map_err(|e| {
                SandboxError::Setup(format!("handing {} to the sandbox user: {e}", tree.display()))
            })?;
        }
        crate::preflight::write_id_maps(cloned.pid, base).map_err(SandboxError::Setup)?;
        // The child waits for one "go" message before it execs init; then init reads its
        // set-up request (the seccomp program as payload).
        // In proxy mode the child opens the TUN device first (see become_namespace_root).
        protocol::send_go(sandbox.control.as_fd(), policy.is_some())
            .map_err(|e| SandboxError::Setup(format!("starting init: {e}")))?;
        let ca_bundle_file = match (&policy, &ca_bundle) {
            (Some(_), Some(bundle)) => Some(ca_bundle_fd(bundle)?),
            _ => None,
        };
        let setup = Request::Setup {
            disk_bytes: config.disk_bytes,
            rootfs,
            image,
            image_writable,
            egress: policy.is_some().then(|| egress::setup(ca_bundle.as_deref())),
            fixed_layout: config.fixed_layout,
        };
        let fds: Vec<RawFd> = ca_bundle_file.iter().map(AsRawFd::as_raw_fd).collect();
        sandbox.send_fds(&setup, &engine.seccomp, &fds)?;
        drop(ca_bundle_file);
        // Joining the v1 cgroups can wait for an RCU grace period (milliseconds); init
        // builds the filesystem meanwhile and waits for the Attached request before it does
        // anything worth charging to the sandbox.
        let attached = match &sandbox.cgroup {
            Some(cg) => cg
                .attach(cloned.pid, cloned.in_cgroup)
                .map_err(SandboxError::from),
            None => Ok(()),
        }
        .and_then(|()| sandbox.send(&Request::Attached, &[]));
        if let Err(e) = attached {
            // Init may have failed building the filesystem meanwhile: it said why before
            // it exited, and that is the error.
            return Err(match sandbox.recv(t0 + SETUP_DEADLINE) {
                Ok(Frame {
                    msg: Reply::Failed { message },
                    ..
                }) => SandboxError::Setup(message),
                _ => e,
            });
        }
        match sandbox.recv(t0 + SETUP_DEADLINE)? {
            Frame {
                msg: Reply::Ready,
                fds,
                ..
            } => {
                if let Some(policy) = policy {
                    let sockets = EgressSockets::from_fds(fds)?;
                    sandbox.proxy = Some(EgressProxy::start(policy, sockets, &sandbox.id)?);
                }
            }
            Frame {
                msg: Reply::Failed { message },
                ..
            } => return Err(SandboxError::Setup(message)),
            Frame { msg, .. } => {
                return Err(SandboxError::Setup(format!(
                    "unexpected reply from init: {msg:?}"
                )));
            }
        }
        if let Some(cg) = &sandbox.cgroup {
            cg.reset_peak();
            sandbox.baseline = Some(cg.usage());
        }
        sandbox.setup = t0.elapsed();
        Ok(sandbox)
    }
}

/// A memfd holding `bundle`, for init to read from its start (see `protocol::EgressSetup`).
/// `path` with every symbolic link resolved (see `Sandbox::build`); `what` names it in
/// the error.
fn host_path(path: Option<&std::path::Path>, what: &str) -> Result<Option<std::path::PathBuf>, SandboxError> {
    path.map(|p| {
        std::fs::canonicalize(p).map_err(|e| SandboxError::Setup(format!("the {what} {}: {e}", p.display())))
    })
    .transpose()
}

fn ca_bundle_fd(bundle: &[u8]) -> Result<OwnedFd, SandboxError> {
    use nix::sys::memfd::{MFdFlags, memfd_create};
    use std::io::Write;
    let fd = memfd_create(c"airlock-ca-bundle", MFdFlags::MFD_CLOEXEC)
        .map_err(|e| SandboxError::Spawn(e.into()))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bundle).map_err(SandboxError::Spawn)?;
    Ok(file.into())
}

/// Clones the sandbox's init from this process; the child execs airlock as init, with
/// `child_control` as its fd 3. With `in_place`, the child becomes init without an exec,
/// as a zygote's clone does (saving the load and start of the airlock binary, about as
/// much CPU as the rest of a one-shot run): only for `airlock run` ([`Engine::for_one_run`],
/// whose memory holds the user's own request), single-threaded (its child
/// is a complete copy that may run any code) that holds no secret (no egress proxy, whose
/// policy carries them; init's memory is out of the programs' reach, but the zygote's
/// rule stands: nothing of the supervisor's that a sandbox does not need), and not
/// rootless (there init's exec is what takes its memory out of the programs' reach).
fn clone_directly(
    cgroup_fd: Option<RawFd>,
    child_control: &OwnedFd,
    in_place: bool,
) -> Result<sys::Cloned, SandboxError> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(SandboxError::Spawn)?;
    let null = OwnedFd::from(null);
    // Init's stdio is /dev/null (never the caller's terminal); fd 3 is its control end.
    let child_fds = [&null, &null, &null, child_control]
        .map(high)
        .into_iter()
        .collect::<io::Result<Vec<_>>>()
        .map_err(SandboxError::Spawn)?;
    drop(null);

    // Everything the child touches before execve is prepared here: the child of a
    // multi-threaded supervisor must not allocate or take locks.
    let exe = c"/proc/self/exe";
    let init_arg = CString::new(INIT_ARG).expect("constant has no NUL");
    let argv: [*const libc::c_char; 3] = [c"airlock-init".as_ptr(), init_arg.as_ptr(), std::ptr::null()];
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let raw_fds: [RawFd; 4] = std::array::from_fn(|i| child_fds[i].as_raw_fd());

    // SAFETY: the child branch below only calls async-signal-safe functions (dup2,
    // close_range, recv, raw setres*id, prctl, setsid, execve, _exit) on data prepared
    // above.
    let cloned = unsafe { sys::clone_process(NAMESPACES, cgroup_fd) }.map_err(SandboxError::Spawn)?;
    if cloned.is_none() && in_place {
        // SAFETY: this process was single-threaded when it cloned, so the child is a
        // complete copy that may run any code; the fds are the ones prepared above.
        unsafe { child_in_place(&raw_fds) }
    }
    let Some(cloned) = cloned else {
        // SAFETY: see above: async-signal-safe libc calls only; every pointer refers to
        // memory prepared before the clone and still mapped in this copy of the
        // address space.
        unsafe { child_to_init(&raw_fds, exe.as_ptr(), argv.as_ptr(), envp.as_ptr()) }
    };
    Ok(cloned)
}

/// The child's side of an in-place clone (see `clone_directly`): init's fds, then init.
///
/// # Safety
/// Only in the child of a single-threaded process.
unsafe fn child_in_place(fds: &[RawFd; 4]) -> ! {
    // SAFETY: fds prepared before the clone; the caller guarantees a single-threaded
    // parent, so init's code may run here as in a zygote's clone.
    unsafe {
        take_init_fds(fds);
        // Init's name, as an exec'd init has it; none of airlock's own arguments or
        // environment left in its memory.
        let title = format!("airlock-init\0{}", crate::INIT_ARG);
        if sys::retitle(title.as_bytes()).is_err() {
            libc::_exit(126);
        }
        become_namespace_root(3);
    }
    crate::init::run()
}

/// Makes `fds` init's stdin, stdout, stderr and control socket (0 to 3) and closes every
/// other fd, including the supervisor's end of the control socket (so a dead supervisor
/// reads as EOF in init). Exits (120, 121) when a step fails.
///
/// # Safety
/// In a freshly cloned child only: async-signal-safe dup2 and close_range.
unsafe fn take_init_fds(fds: &[RawFd; 4]) {
    // SAFETY: plain fd syscalls on integers.
    unsafe {
        for (target, fd) in fds.iter().enumerate() {
            if libc::dup2(*fd, target as RawFd) < 0 {
                libc::_exit(120);
            }
        }
        if sys::close_from(4).is_err() {
            libc::_exit(121);
        }
    }
}

/// The child's side of the clone, up to the exec of init.
///
/// # Safety
/// Runs in the child of a possibly multi-threaded process: only async-signal-safe calls,
/// on memory prepared before the clone.
unsafe fn child_to_init(
    fds: &[RawFd; 4],
    exe: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> ! {
    // SAFETY: the caller guarantees the context; each call below is async-signal-safe and
    // every pointer is valid for the duration of the call.
    unsafe {
        take_init_fds(fds);
        become_namespace_root(3);
        libc::execve(exe, argv, envp);
        libc::_exit(123)
    }
}

impl Sandbox {
    /// Its id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// How long provisioning took.
    pub fn setup_time(&self) -> Duration {
        self.setup
    }

    /// Whether init is still running (a sandbox whose init died cannot run anything). A
    /// pidfd turns readable once its process has exited, reaped or not (a signal to a
    /// zombie would still be accepted).
    pub fn is_alive(&self) -> bool {
        let mut fds = [nix::poll::PollFd::new(
            self.pidfd.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        self.reaped.is_none() && matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(0))
    }

    /// Runs the program of `spec` in this sandbox and returns its result. The spec's
    /// memory, CPU and pids limits are applied to the sandbox first; its disk size and
    /// rootfs are the sandbox's own and are ignored. Files of the spec are written first.
    /// When the program ends, every process it started ends too; the sandbox and its
    /// files remain for the next exec. When any `cancel` fd becomes readable (it is
    /// polled, never read), the exec's processes are killed and
    /// [`SandboxError::Cancelled`] is returned; the sandbox stays usable.
    pub fn exec(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, SandboxError> {
        self.exec_inner(spec, sink, cancel, false)
    }

    /// Like [`Sandbox::exec`], for a sandbox that serves this one program: at the deadline
    /// the whole sandbox is killed from outside. Drop the sandbox afterwards.
    pub fn exec_once(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, SandboxError> {
        self.exec_inner(spec, sink, cancel, true)
    }

    fn exec_inner(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
        one_shot: bool,
    ) -> Result<ExecResult, SandboxError> {
        spec.validate()?;
        if spec.image.is_some() && !self.image {
            return Err(SandboxError::Spec(unresolved_image()));
        }
        if !self.is_alive() {
            return Err(SandboxError::Gone);
        }
        self.refuse_paused()?;
        let t0 = Instant::now();
        let limits = cgroup_limits(spec);
        if limits != self.limits {
            if let Some(cg) = &self.cgroup {
                let lowering = limits.memory_bytes < self.limits.memory_bytes;
                match cg.set_limits(&limits) {
                    Ok(()) => {}
                    // The kernel refuses a memory cap below what the cgroup holds now (its
                    // files, what runs in the background): the request's to change.
                    Err(_) if lowering => {
                        return Err(SandboxError::Spec(airlock_spec::SpecError::new(
                            "limits.memory_bytes",
                            "is below what this sandbox already holds in memory (its files and background processes): ask for more, or free some first",
                        )));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            self.limits = limits;
        }
        if !spec.files.is_empty() {
            // Writing them is init's work, not the program's: usage is read afresh after.
            self.baseline = None;
            // Work done for this request, not ahead of it.
            self.leave_background()?;
        }
        // A one-shot's files are written under its cancel fds: the sandbox is thrown
        // away anyway. A session's are not (a write cut short kills the sandbox, and a
        // client that goes away must cost only its exec): they take what a file write
        // takes, bounded by FILE_OP_DEADLINE per chunk.
        let file_cancel = if one_shot { cancel } else { &[] };
        for file in &spec.files {
            self.write_file_cancellable(&file.path, file.mode, &file.content, file_cancel)?;
        }
        // The tree before the program (the spec's files are in it already), through fds
        // that outlive a one-shot's init.
        let watch = self.watch(spec)?;
        let mut result = supervisor::exec(self, spec, sink, cancel, one_shot, t0)?;
        if let Some(Watch { names, roots, before }) = watch {
            // Nothing reported on the tmpfs since the before-scan, and no program of the
            // sandbox still running (a spawned one could be writing through a shared
            // mapping, which reports nothing): the tree is the one before.
            let unchanged = !self.spawned && self.marked.as_ref().is_some_and(|m| !m.dirty());
            let after = if unchanged {
                Ok(None)
            } else {
                Index::scan(&roots).map(Some)
            };
            match after {
                Ok(after) => {
                    if let Some(after) = &after {
                        (result.files_changed, result.files_changed_truncated) =
                            airlock_fstree::diff(&before, after);
                    }
                    if let Some(m) = &self.marked {
                        m.reset();
                    }
                    if !one_shot && !self.spawned {
                        self.last_index = Some((names, after.unwrap_or(before)));
                    }
                }
                // The result stands; what changed is unknown.
                Err(_) => result.files_changed_truncated = true,
            }
        }
        Ok(result)
    }

    /// The before-scan of `spec.files_changed_in`: the last session exec's after-scan when
    /// nothing can have changed the tree since (no spawned program, no file operation, and
    /// no event on the tmpfs since, where the engine watches for them), else a scan now.
    fn watch(&mut self, spec: &Spec) -> Result<Option<Watch>, SandboxError> {
        let last = self.last_index.take();
        if spec.files_changed_in.is_empty() {
            return Ok(None);
        }
        let names: Vec<&str> = spec.files_changed_in.iter().map(String::as_str).collect();
        let roots = self.scratch.roots(self.pid, &names)?;
        if self.marked.is_none()
            && let Some(changes) = self.changes.take()
        {
            // Once per sandbox; without a mark (an older kernel) every exec walks twice.
            self.marked = changes.mark(roots[0].dir.as_fd()).ok();
        }
        let last = last.filter(|(n, _)| {
            *n == spec.files_changed_in && !self.spawned && !self.marked.as_ref().is_some_and(|m| m.dirty())
        });
        let before = match last {
            Some((_, index)) => index,
            None => Index::scan(&roots).map_err(|source| SandboxError::Files {
                what: "scanning the sandbox's files before the program",
                source,
            })?,
        };
        if let Some(m) = &self.marked {
            m.reset();
        }
        Ok(Some(Watch {
            names: spec.files_changed_in.clone(),
            roots,
            before,
        }))
    }

    /// Refuses a request init would have to serve while the sandbox is frozen.
    pub(crate) fn refuse_paused(&self) -> Result<(), SandboxError> {
        if self.paused {
            return Err(SandboxError::Spec(airlock_spec::SpecError::new(
                "sandbox",
                "is paused",
            )));
        }
        Ok(())
    }

    /// Notes that something other than an exec may have changed the tree: the next exec
    /// scans afresh.
    pub(crate) fn forget_index(&mut self) {
        self.last_index = None;
    }

    /// Writes /workspace, /tmp and /dev/shm to `out` as a tar stream (airlock-fstree's
    /// format), read from the host through the scratch tmpfs: served while paused too (a
    /// frozen tree exports consistently). Gives up with [`SandboxError::Cancelled`] once a
    /// `cancel` fd is readable.
    pub fn export_files(
        &mut self,
        out: &mut dyn std::io::Write,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<(), SandboxError> {
        if self.reaped.is_some() || !self.is_alive() {
            return Err(SandboxError::Gone);
        }
        let roots = self.scratch.roots(self.pid, &SNAPSHOT_ROOTS)?;
        let mut out = Cancellable::new(out, cancel);
        match airlock_fstree::export(&roots, &mut out) {
            Ok(_) => Ok(()),
            Err(_) if out.cancelled => Err(SandboxError::Cancelled),
            Err(source) => Err(SandboxError::Files {
                what: "exporting the sandbox's files",
                source,
            }),
        }
    }

    /// Replaces what /workspace, /tmp and /dev/shm hold with a tar stream's content (what
    /// [`Sandbox::export_files`] wrote), owned by the sandbox user. Running out of room is
    /// [`SandboxError::DiskFull`]; the tree is then partly imported (import again, or
    /// into a larger sandbox).
    pub fn import_files(
        &mut self,
        input: &mut dyn std::io::Read,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<(), SandboxError> {
        if self.reaped.is_some() || !self.is_alive() {
            return Err(SandboxError::Gone);
        }
        self.forget_index();
        let roots = self.scratch.roots(self.pid, &SNAPSHOT_ROOTS)?;
        let owner = (self.host_user, self.host_group);
        let mut input = Cancellable::new(input, cancel);
        // With the sandbox user's filesystem ids: see `sys::with_fs_ids`.
        let imported = if self.rootless {
            // This process's own ids are the sandbox user's already.
            airlock_fstree::import(&roots, &mut input, owner)
        } else {
            sys::with_fs_ids(self.host_user, || {
                airlock_fstree::import(&roots, &mut input, owner)
            })
            .map_err(SandboxError::Spawn)?
        };
        match imported {
            Ok(_) => Ok(()),
            Err(_) if input.cancelled => Err(SandboxError::Cancelled),
            Err(e) if crate::scratch::no_room(&e) => Err(SandboxError::DiskFull(crate::DiskFull {
                path: "(the snapshot's files)".into(),
                bytes: 0,
                disk_bytes: self.disk_bytes,
                free_bytes: crate::scratch::free_bytes(&roots[0]),
                memory_bytes: None,
            })),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Err(SandboxError::Spec(
                airlock_spec::SpecError::new("snapshot", e.to_string()),
            )),
            Err(source) => Err(SandboxError::Files {
                what: "importing files into the sandbox",
                source,
            }),
        }
    }

    /// Freezes every process of the sandbox (init, execs, spawned programs) through its
    /// cgroup; idempotent. Execs, spawns and file operations are refused until
    /// [`Sandbox::resume`] (`invalid`: `sandbox` is paused); exports and imports are served.
    pub fn pause(&mut self) -> Result<(), SandboxError> {
        if !self.is_alive() {
            return Err(SandboxError::Gone);
        }
        if self.paused {
            return Ok(());
        }
        let Some(cg) = &self.cgroup else {
            return Err(SandboxError::Host("this sandbox has no cgroup to freeze".into()));
        };
        // Marked first: a freeze that half happened is thawed by resume or drop.
        self.paused = true;
        cg.freeze(true)?;
        Ok(())
    }

    /// Thaws what [`Sandbox::pause`] froze; idempotent.
    pub fn resume(&mut self) -> Result<(), SandboxError> {
        if !self.paused {
            return Ok(());
        }
        if let Some(cg) = &self.cgroup {
            cg.freeze(false)?;
        }
        self.paused = false;
        Ok(())
    }

    /// Whether it is paused.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Whether its tmpfs is watched for changes (see `fanotify`): an exec that changed no
    /// file then costs no walk after the program. Set at its first exec asking for
    /// `files_changed`.
    pub fn watches_changes(&self) -> bool {
        self.marked.is_some()
    }

    /// Writes (creates or replaces) a file under /workspace, owned by the sandbox user.
    /// A file that does not fit the disk is [`SandboxError::DiskFull`]: refused unsent
    /// when it is larger than the whole disk, else when the disk fills up (what was
    /// written of it is removed); either way the sandbox stays usable. A sandbox whose
    /// init stops taking the file or answering is killed ([`SandboxError::Gone`] from
    /// then on): nothing is left waiting on it.
    pub fn write_file(&mut self, path: &str, mode: u32, content: &[u8]) -> Result<(), SandboxError> {
        self.write_file_cancellable(path, mode, content, &[])
    }

    /// [`Sandbox::write_file`] that gives up when any `cancel` fd becomes readable: the
    /// sandbox is killed then (a write cut short leaves init mid-file) and the error is
    /// [`SandboxError::Cancelled`].
    pub fn write_file_cancellable(
        &mut self,
        path: &str,
        mode: u32,
        content: &[u8],
        cancel: &[BorrowedFd<'_>],
    ) -> Result<(), SandboxError> {
        self.refuse_paused()?;
        self.forget_index();
        let disk_bytes = self.disk_bytes;
        let no_room = |free_bytes, memory_bytes| {
            SandboxError::DiskFull(crate::DiskFull {
                path: path.to_owned(),
                bytes: content.len() as u64,
                disk_bytes,
                free_bytes,
                memory_bytes,
            })
        };
        if content.len() as u64 > self.disk_bytes {
            return Err(no_room(None, None));
        }
        // The tmpfs's pages are charged to the sandbox's cgroup: a file as large as the
        // memory cap would get init OOM-killed part-way.
        if content.len() as u64 >= self.limits.memory_bytes {
            return Err(no_room(None, Some(self.limits.memory_bytes)));
        }
        let mut chunks = content.chunks(CHUNK).peekable();
        let mut first = true;
        loop {
            let chunk = chunks.next().unwrap_or(&[]);
            let last = chunks.peek().is_none();
            let request = Request::WriteFile {
                path: path.to_owned(),
                mode,
                first,
                last,
            };
            if let Err(e) = self.send_by(&request, chunk, Instant::now() + FILE_OP_DEADLINE, cancel) {
                // Init holds part of the file: no later request could be told apart
                // from its rest.
                self.kill();
                return Err(e);
            }
            first = false;
            if last {
                break;
            }
        }
        match self.file_reply()? {
            Reply::Ok => Ok(()),
            Reply::NoRoom { free_bytes } => Err(no_room(Some(free_bytes), None)),
            Reply::Error {
                failure: kind,
                message,
            } => Err(SandboxError::File { kind, message }),
            other => Err(self.desync(&other)),
        }
    }

    /// Sends one frame of a file operation, waiting until `deadline` for room on the
    /// socket (init reads every frame of a write: only a stuck init is waited out);
    /// a readable `cancel` fd ends the wait.
    fn send_by(
        &self,
        req: &Request,
        payload: &[u8],
        deadline: Instant,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<(), SandboxError> {
        loop {
            match protocol::send_nowait(self.control.as_fd(), req, payload) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return Err(SandboxError::Gone),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(SandboxError::Setup(
                    "init stopped taking the file (the sandbox was killed)".into(),
                ));
            }
            let ms = left.as_millis().clamp(1, u128::from(u16::MAX)) as u16;
            let mut fds = vec![PollFd::new(self.control.as_fd(), PollFlags::POLLOUT)];
            fds.extend(cancel.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)));
            match poll(&mut fds, ms) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(SandboxError::Spawn(e.into())),
            }
            if fds[1..].iter().any(|f| f.any().unwrap_or(false)) {
                return Err(SandboxError::Cancelled);
            }
        }
    }

    /// Init's answer to a file operation. One that does not come in time (or a closed
    /// socket) kills the sandbox: an answer that came late would be taken for the
    /// answer to the next request.
    pub(crate) fn file_reply(&mut self) -> Result<Reply, SandboxError> {
        self.file_frame(Instant::now() + FILE_OP_DEADLINE).map(|f| f.msg)
    }

    fn file_frame(&mut self, deadline: Instant) -> Result<Frame<Reply>, SandboxError> {
        self.recv(deadline).inspect_err(|_| self.kill())
    }

    /// The error for an answer that does not fit the request: the two sides disagree
    /// about where they are, so the sandbox is killed.
    pub(crate) fn desync(&mut self, reply: &Reply) -> SandboxError {
        self.kill();
        SandboxError::Setup(format!(
            "unexpected reply from init: {reply:?} (the sandbox was killed)"
        ))
    }

    /// Reads a file under /workspace (at most `max_bytes`).
    pub fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>, SandboxError> {
        self.refuse_paused()?;
        self.send(
            &Request::ReadFile {
                path: path.to_owned(),
                max_bytes,
            },
            &[],
        )?;
        let deadline = Instant::now() + FILE_OP_DEADLINE;
        let mut data = Vec::new();
        loop {
            let frame = self.file_frame(deadline)?;
            match frame.msg {
                Reply::FileChunk { last } => {
                    data.extend_from_slice(&frame.payload);
                    if last {
                        return Ok(data);
                    }
                }
                Reply::Error {
                    failure: kind,
                    message,
                } => return Err(SandboxError::File { kind, message }),
                other => return Err(self.desync(&other)),
            }
        }
    }

    /// Lists /workspace recursively.
    pub fn list_files(&mut self) -> Result<Vec<FileEntry>, SandboxError> {
        self.refuse_paused()?;
        self.send(&Request::ListFiles, &[])?;
        match self.file_reply()? {
            Reply::Listing { entries } => Ok(entries),
            Reply::Error {
                failure: kind,
                message,
            } => Err(SandboxError::File { kind, message }),
            other => Err(self.desync(&other)),
        }
    }

    pub(crate) fn send(&self, req: &Request, payload: &[u8]) -> Result<(), SandboxError> {
        self.send_fds(req, payload, &[])
    }

    pub(crate) fn send_fds(&self, req: &Request, payload: &[u8], fds: &[RawFd]) -> Result<(), SandboxError> {
        protocol::send(self.control.as_fd(), req, payload, fds).map_err(|_| SandboxError::Gone)
    }

    /// Waits for init's next reply until `deadline`.
    pub(crate) fn recv(&mut self, deadline: Instant) -> Result<Frame<Reply>, SandboxError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(SandboxError::Setup("init did not answer in time".into()));
            }
            let ms = left.as_millis().clamp(1, u128::from(u16::MAX)) as u16;
            let mut fds = [PollFd::new(self.control.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, ms) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => return Err(SandboxError::Spawn(e.into())),
            }
            return match protocol::recv::<Reply>(self.control.as_fd()) {
                Ok(Some(frame)) => Ok(frame),
                Ok(None) | Err(_) => Err(SandboxError::Gone),
            };
        }
    }

    pub(crate) fn control(&self) -> BorrowedFd<'_> {
        self.control.as_fd()
    }

    pub(crate) fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    pub(crate) fn init_pid(&self) -> libc::pid_t {
        self.pid
    }

    pub(crate) fn cgroup(&self) -> Option<&Cgroup> {
        self.cgroup.as_ref()
    }

    /// The host uid of the sandbox user.
    pub(crate) fn host_user(&self) -> u32 {
        self.host_user
    }

    /// The host gid of the sandbox user's group.
    pub(crate) fn host_group(&self) -> u32 {
        self.host_group
    }

    /// The host uid of the sandbox's root (its keepers' uid), once a program was
    /// spawned in it: what a session exec's deadline spares (see `Cgroup::kill_except`).
    /// Rootless, keepers and programs share one host uid, so none is spared: a session
    /// exec's deadline ends its spawned programs too (docs/rootless.md).
    pub(crate) fn keeper_uid(&self) -> Option<u32> {
        (self.spawned && !self.rootless).then(|| self.host_user - crate::mounts::SANDBOX_ID)
    }

    /// Notes that a program was spawned in it.
    pub(crate) fn mark_spawned(&mut self) {
        self.spawned = true;
    }

    /// Whether its root is an image's tree.
    pub(crate) fn has_image(&self) -> bool {
        self.image
    }

    /// What connects to its ports, made once (see `ports`).
    pub(crate) fn ports_connector(&self) -> Result<Arc<crate::ports::Ports>, SandboxError> {
        if let Some(p) = self.ports.get() {
            return Ok(Arc::clone(p));
        }
        let made = Arc::new(crate::ports::Ports::open(self.pid).map_err(SandboxError::Spawn)?);
        Ok(Arc::clone(self.ports.get_or_init(|| made)))
    }

    /// The CPU limit in force (cores).
    pub(crate) fn cpus(&self) -> f64 {
        self.limits.cpus
    }

    /// The proxy's port inside the sandbox, in proxy mode.
    /// Proxy mode's egress proxy (its policy, approvals and log).
    pub fn egress(&self) -> Option<Arc<airlock_egress::Proxy>> {
        self.proxy.as_ref().map(|p| Arc::clone(p.proxy()))
    }

    /// The egress log entries since the last exec.
    pub(crate) fn take_egress(&mut self) -> Vec<airlock_spec::EgressEntry> {
        self.proxy.as_mut().map(EgressProxy::take_new).unwrap_or_default()
    }

    /// Gives a sandbox built ahead of need ([`crate::Engine::create_ahead`]) an ordinary
    /// share of the CPU; nothing for any other. Its first exec does this once the request
    /// is on its way to init (so the write overlaps init's work instead of preceding it);
    /// a caller that asks init for something else first (file operations) calls it
    /// before.
    pub fn leave_background(&mut self) -> Result<(), SandboxError> {
        if self.background {
            if let Some(cg) = &self.cgroup {
                cg.set_background(false)?;
            }
            self.background = false;
        }
        Ok(())
    }

    /// Puts the sandbox in the background's CPU share: for one about to be destroyed when
    /// nobody waits for that (dying frees memory and namespaces: milliseconds of CPU that
    /// should not delay another sandbox's program). Best effort: only the order in which
    /// the CPU serves work depends on it.
    pub fn enter_background(&mut self) {
        if let Some(cg) = &self.cgroup
            && cg.set_background(true).is_ok()
        {
            self.background = true;
        }
    }

    /// The usage baseline taken when the sandbox became ready, once: later execs read
    /// their own (and reset the memory peak) before they start.
    pub(crate) fn take_baseline(&mut self) -> Option<Usage> {
        self.baseline.take()
    }

    pub(crate) fn disk_bytes(&self) -> u64 {
        self.disk_bytes
    }

    /// Kills everything in the sandbox, init included.
    pub(crate) fn kill(&self) {
        let _ = sys::pidfd_send_signal(self.pidfd.as_raw_fd(), libc::SIGKILL);
        if let Some(cg) = &self.cgroup {
            let _ = cg.kill();
            // A paused sandbox's tasks act on SIGKILL once thawed (v1's freezer holds
            // them; cgroup2's lets fatal signals through, and thawing does no harm).
            if self.paused {
                let _ = cg.freeze(false);
            }
        }
    }

    /// Reaps init (after it exited or was killed).
    pub(crate) fn reap(&mut self) -> WaitStatus {
        if let Some(status) = self.reaped {
            return status;
        }
        let status = loop {
            match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None) {
                Err(nix::errno::Errno::EINTR) => continue,
                Ok(status) => break status,
                Err(_) => break WaitStatus::StillAlive,
            }
        };
        self.reaped = Some(status);
        status
    }
}

impl Drop for Sandbox {
    /// Kills and purges it. One put in the background ([`Sandbox::enter_background`]) is
    /// purged at the calling thread's lowest priority too (restored after): the host's
    /// side of its teardown should not delay another sandbox's program either.
    fn drop(&mut self) {
        let normal = self
            .background
            .then(|| {
                sys::nice(0)
                    .ok()
                    .filter(|_| sys::set_nice(0, sys::BACKGROUND_NICE).is_ok())
            })
            .flatten();
        if let Some(ports) = self.ports.get() {
            ports.close();
        }
        if self.reaped.is_none() {
            self.kill();
            self.reap();
        }
        if let Some(cg) = self.cgroup.take() {
            let _ = cg.destroy();
        }
        if let Some(normal) = normal {
            let _ = sys::set_nice(0, normal);
        }
    }
}

/// The steps of a new sandbox's first process before it becomes init, whichever process
/// cloned it: its own session, then waiting on `control` for the supervisor's "go" (sent
/// once the uid maps are written), then becoming the namespace's root, then dying with
/// its parent. Exits (122, 124) when a step fails.
///
/// # Safety
///
/// For the child of a clone: only async-signal-safe calls are made, with no allocation,
/// so it is fine in the child of a multi-threaded process.
pub(crate) unsafe fn become_namespace_root(control: RawFd) {
    // SAFETY: raw syscalls on integers and a local byte.
    unsafe {
        // Own session: a terminal's Ctrl-C reaches the supervisor only.
        libc::setsid();
        // Wait for the uid maps: an exec before them would drop every capability.
        let mut go = 0u8;
        if libc::recv(control, (&mut go as *mut u8).cast(), 1, 0) != 1 {
            libc::_exit(122);
        }
        // Proxy mode: open the TUN device now, while this process still has the
        // supervisor's credentials (the device node is often root's only, mode 0600) and
        // already lives in the sandbox's network namespace (a TUN device is made in the
        // namespace its /dev/net/tun was opened in). Fds 0..=3 are taken and the rest
        // closed, so it lands on TUN_FD, not close-on-exec: init takes it from there. A
        // failure leaves TUN_FD closed, and init reports why when it opens it itself.
        if go == crate::protocol::GO_WITH_TUN {
            let fd = libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR);
            if fd >= 0 && fd != crate::protocol::TUN_FD {
                libc::close(fd);
            }
        }
        // Seen from the new namespace: host root is unmapped there (the overflow uid),
        // while an ordinary user's uid is mapped to the sandbox user's.
        if libc::geteuid() == crate::mounts::SANDBOX_ID {
            // Rootless: this process is already the sandbox user (the only id mapped) and
            // holds every capability in its new namespace, but a non-root execve would
            // drop them: keep them across init's exec as ambient capabilities (raising
            // one needs it inheritable first). The payload's privilege drop clears the
            // ambient and inheritable sets with the rest (see `privileges`).
            if !keep_capabilities_across_exec() {
                libc::_exit(125);
            }
        } else if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
            || libc::syscall(libc::SYS_setresgid, 0, 0, 0) != 0
            || libc::syscall(libc::SYS_setresuid, 0, 0, 0) != 0
        {
            // Become the namespace's root: until now the credentials are the host's
            // (unmapped here). Drop the host's supplementary groups too. Raw syscalls, not
            // glibc's wrappers: those signal every thread glibc believes exists, and the
            // supervisor's other threads do not exist in this child.
            libc::_exit(124);
        }
        // Die with the parent. Set only now: a change of effective uid clears it. A
        // parent that died before this line leaves init a closed control socket, and init
        // exits at once.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
    }
}

/// Makes every permitted capability inheritable and ambient, so that it survives an
/// execve by a non-root uid. False when a step failed.
///
/// # Safety
/// Async-signal-safe: raw capget/capset/prctl on locals only.
pub(crate) unsafe fn keep_capabilities_across_exec() -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: the v3 header and the two data structs the kernel reads or writes.
    unsafe {
        if libc::syscall(libc::SYS_capget, &header as *const Header, data.as_mut_ptr()) != 0 {
            return false;
        }
        for d in &mut data {
            d.inheritable = d.permitted;
        }
        if libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) != 0 {
            return false;
        }
        // Up to the highest number the kernel knows (it refuses the first past it).
        for cap in 0..64 {
            if data[(cap / 32) as usize].permitted & (1 << (cap % 32)) != 0
                && libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_RAISE, cap, 0, 0) != 0
            {
                return false;
            }
        }
    }
    true
}
