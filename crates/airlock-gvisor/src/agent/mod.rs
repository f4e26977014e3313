//! The agent: airlock's init inside a gVisor sandbox (`airlock-gvisor-agent`).
//!
//! runsc starts it as the container's process, PID 1 of the sandbox, root of the
//! sandbox's user namespace (whose root gVisor's Sentry serves, not the host kernel). It
//! speaks the micro-VM agent's frames (`airlock_vmwire::frame`) on its stdin and stdout,
//! which are pipes from airlock on the host, and serves the same requests: `Create`
//! mounts the sandbox's disk and forks the ready child; `Exec` hands a command to the
//! ready child and supervises it (deadline, output caps, cancel) until every process of
//! the exec is gone; files are written, read and listed under /workspace. Beside those
//! it serves the requests of [`crate::wire`]: an exec's changeset roots, the writable
//! filesystem out and in as tar, and the process keeper's reconnection after a restore.
//!
//! It runs single-threaded whenever it forks (the stdin feeder thread of an exec is
//! joined before the next ready child is forked), so the child may allocate.

mod exec;
mod files;
mod jobs;
mod procs;
mod pump;
mod ready;
pub(crate) mod relay;
mod snapshot;
mod transparent;

use crate::wire::{GvRequest, ToGvAgent};
use airlock_backend::ErrorKind;
use airlock_spec::Limits;
use airlock_vmwire::frame::{self as proto, CHUNK, GuestInfo, ToGuest, ToHost};
use std::fs::File;
use std::io::{self, BufReader};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd};
use std::path::Path;

use nix::mount::{MsFlags, mount};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::{Gid, Uid, chown};

pub use ready::SANDBOX_ID;

/// Stdin is held in the agent's memory before the run (charged to the sandbox): more
/// is refused, as in the micro-VM.
const MAX_STDIN: usize = 64 << 20;

/// Where the sandbox's one writable tmpfs is mounted before its parts are bound into
/// place (/tmp, /workspace, /dev/shm share its size, as in the other tiers).
const SCRATCH: &str = "/.scratch";

/// The channel to the host: frames in on fd 0, out on fd 1.
pub(crate) struct Port {
    input: File,
    output: File,
}

impl Port {
    pub(crate) fn send(&self, msg: &ToHost, payload: &[u8]) -> io::Result<()> {
        proto::write(&mut &self.output, msg, payload).map_err(io::Error::other)
    }

    /// A host-side failure (a bug, or the sandbox is broken).
    pub(crate) fn error(&self, message: impl Into<String>) -> io::Result<()> {
        self.fail(ErrorKind::Host, None, message)
    }

    /// A failure of `kind`; `field` names the request's field at fault.
    pub(crate) fn fail(
        &self,
        kind: ErrorKind,
        field: Option<&str>,
        message: impl Into<String>,
    ) -> io::Result<()> {
        self.send(&failure(kind, field, message), &[])
    }

    /// The fd that turns readable when the host sends a frame (an exec's `Cancel`).
    pub(crate) fn readable(&self) -> BorrowedFd<'_> {
        self.input.as_fd()
    }
}

/// The frame of a failure.
fn failure(kind: ErrorKind, field: Option<&str>, message: impl Into<String>) -> ToHost {
    ToHost::Error {
        kind,
        field: field.map(str::to_owned),
        message: message.into(),
    }
}

/// The kind of a failed file operation on `path`.
fn file_failure(path: &str, e: &io::Error) -> ToHost {
    match e.kind() {
        io::ErrorKind::NotFound => failure(ErrorKind::NotFound, None, format!("{path}: no such file")),
        io::ErrorKind::InvalidInput | io::ErrorKind::PermissionDenied | io::ErrorKind::AlreadyExists => {
            failure(ErrorKind::Invalid, Some("path"), format!("{path}: {e}"))
        }
        _ => match e.raw_os_error() {
            Some(libc::ENOTDIR | libc::EISDIR | libc::ELOOP | libc::ENAMETOOLONG) => {
                failure(ErrorKind::Invalid, Some("path"), format!("{path}: {e}"))
            }
            _ => failure(ErrorKind::Host, None, format!("{path}: {e}")),
        },
    }
}

/// The argument runsc starts the agent with. Any binary that calls [`maybe_serve`]
/// first thing in `main` (the `airlock` binary, say) can be the agent
/// (`GvisorOptions::agent`), so no separate binary has to be installed.
pub const AGENT_ARG: &str = "--airlock-gvisor-agent";

/// When this process was started as the agent (its first argument is [`AGENT_ARG`]),
/// serves and exits; otherwise returns at once.
pub fn maybe_serve() {
    if std::env::args_os().nth(1).is_some_and(|a| a == AGENT_ARG) {
        let code = match serve() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("airlock gVisor agent: {e}");
                2
            }
        };
        std::process::exit(code);
    }
}

/// Serves the host on fds 0 and 1 until it closes fd 0; then the sandbox ends.
pub fn serve() -> Result<(), String> {
    if std::process::id() != 1 {
        return Err(
            "airlock-gvisor-agent is the init of airlock's gVisor sandboxes; airlock starts it with runsc"
                .into(),
        );
    }
    // SAFETY: fds 0 and 1 are the pipes runsc passed as the container's stdio; nothing
    // else in this process owns them, and from here on only `Port` uses them.
    let (input, output) = unsafe { (File::from_raw_fd(0), File::from_raw_fd(1)) };
    let port = Port { input, output };
    // SIGCHLD is taken through a signalfd: an exec's supervision loop polls it beside the
    // output pipes. Blocked before any thread exists, so every thread inherits the mask.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block()
        .map_err(|e| format!("blocking SIGCHLD: {e}"))?;
    let sigchld = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| format!("signalfd: {e}"))?;
    let seccomp = airlock_seccomp::build().map_err(|e| format!("seccomp: {e}"))?;
    let info = GuestInfo {
        kernel: nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        landlock_abi: 0,
        net_devices: net_devices(),
        ..GuestInfo::default()
    };
    port.send(&ToHost::Ready(info), &[])
        .map_err(|e| format!("port: {e}"))?;
    let mut state = State {
        seccomp,
        sigchld,
        limits: Limits::default(),
        created: false,
        ready: None,
        stdin: Vec::new(),
        stdin_overflow: false,
        file: None,
        env: Vec::new(),
        egress: None,
        jobs: None,
        changes_in: None,
        keeper: None,
        kept: snapshot::Kept::default(),
    };
    // SAFETY: a second handle on fd 0 for buffered reads; `port.input` keeps the fd open
    // for as long as `reader` lives (both end with this function), and `reader` is the
    // only one that reads from it.
    let mut reader = BufReader::with_capacity(CHUNK + 4096, unsafe { File::from_raw_fd(0) });
    let result = loop {
        if reader.buffer().is_empty() {
            idle(&port, &state.sigchld);
        }
        let frame = match proto::read::<GvRequest>(&mut reader) {
            Ok(Some(f)) => f,
            Ok(None) => break Ok(()),
            Err(e) => break Err(format!("port: {e}")),
        };
        // Bytes already buffered past this frame, during an exec, can only be the host's
        // `Cancel`: the port will not turn readable for it again.
        let pending = !reader.buffer().is_empty();
        let handled = match frame.msg {
            GvRequest::Common(msg) => state.handle(&port, msg, frame.payload, pending),
            GvRequest::Gv(ToGvAgent::ChangesIn { roots }) => {
                state.changes_in = Some(roots);
                Ok(())
            }
            GvRequest::Gv(ToGvAgent::Reattach { orphan }) => {
                if let Some(keeper) = state.keeper {
                    let signal = if orphan { Signal::SIGUSR2 } else { Signal::SIGUSR1 };
                    let _ = nix::sys::signal::kill(keeper, signal);
                }
                port.send(&ToHost::Ok, &[])
            }
            GvRequest::Gv(ToGvAgent::ExportFiles) if !state.created => port.error("no sandbox"),
            GvRequest::Gv(ToGvAgent::ExportFiles) => snapshot::export(&port),
            // The import reads its further parts from the port itself, as it unpacks.
            GvRequest::Gv(ToGvAgent::ImportFiles { last }) => {
                state.kept.forget();
                if state.created {
                    snapshot::import(&port, &mut reader, frame.payload, last)
                } else {
                    let mut done = last;
                    let mut drained = Ok(());
                    while !done {
                        match proto::read::<GvRequest>(&mut reader) {
                            Ok(Some(f)) if matches!(f.msg, GvRequest::Gv(ToGvAgent::ImportFiles { .. })) => {
                                done = matches!(f.msg, GvRequest::Gv(ToGvAgent::ImportFiles { last: true }));
                            }
                            _ => {
                                drained = Err(io::Error::other("a broken import stream"));
                                break;
                            }
                        }
                    }
                    drained.and_then(|()| port.error("no sandbox"))
                }
            }
        };
        if let Err(e) = handled {
            break Err(format!("port: {e}"));
        }
    };
    // Both `File`s of fd 0 would close it: keep one from doing so twice.
    std::mem::forget(reader.into_inner());
    result
}

/// Between requests: reaps what ends until the host sends the next frame. Processes a
/// spawned program left come to the agent (the sandbox's init) when it ends and its
/// cgroup is killed; reaped here, they do not linger as zombies until the next exec.
fn idle(port: &Port, sigchld: &SignalFd) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        let mut fds = [
            PollFd::new(port.readable(), PollFlags::POLLIN),
            PollFd::new(sigchld.as_fd(), PollFlags::POLLIN),
        ];
        if poll(&mut fds, PollTimeout::NONE).is_err() {
            return;
        }
        let host = fds[0].revents().is_some_and(|r| !r.is_empty());
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            while let Ok(Some(_)) = sigchld.read_signal() {}
            exec::reap_ended();
        }
        if host {
            return;
        }
    }
}

/// Network interfaces in the sandbox (gVisor's netstack; with `--network=none` only lo).
fn net_devices() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A file whose parts are arriving.
struct Incoming {
    path: String,
    mode: u32,
    /// The answer, once a part failed: the rest is dropped as it comes.
    failed: Option<ToHost>,
    /// Bytes written so far.
    written: u64,
}

/// What the agent holds between requests.
struct State {
    /// airlock's seccomp filter, installed on every program.
    seccomp: airlock_seccomp::BpfProgram,
    /// SIGCHLD, as a readable fd.
    sigchld: SignalFd,
    /// The limits the sandbox was created with.
    limits: Limits,
    /// Whether `Create` built the disk.
    created: bool,
    /// The child that will run the next exec, already unprivileged.
    ready: Option<ready::ReadyChild>,
    /// Stdin received for the next exec.
    stdin: Vec<u8>,
    /// More stdin came than [`MAX_STDIN`].
    stdin_overflow: bool,
    /// A file being received.
    file: Option<Incoming>,
    /// Environment every program gets first (the proxy's, in proxy mode).
    env: Vec<(String, String)>,
    /// Proxy mode: the proxy's ports on the sandbox's loopback, served by a relay
    /// process forked for each exec.
    egress: Option<relay::Listeners>,
    /// The sandbox's cgroups (execs', spawned programs'); `None` if they could not be
    /// made (then an exec's end kills every process, and nothing can be spawned).
    jobs: Option<jobs::Jobs>,
    /// Where the next exec's changeset looks (`ChangesIn`, sent before its `Exec`).
    changes_in: Option<Vec<String>>,
    /// The process keeper, when it runs.
    keeper: Option<nix::unistd::Pid>,
    /// The last exec's changeset scan, while it still holds.
    kept: snapshot::Kept,
}

impl State {
    /// The execs' cgroup, if there are cgroups.
    fn exec_cgroup(&self) -> Option<std::path::PathBuf> {
        self.jobs.as_ref().map(jobs::Jobs::exec)
    }

    /// Forks the egress relay for the next exec, in the execs' cgroup: the exec's end
    /// kills it with the exec's processes, so no connection of one exec outlives it.
    fn fork_relay(&self, listeners: &relay::Listeners) {
        if let Ok(pid) = relay::fork_relay(listeners)
            && let Some(dir) = self.exec_cgroup()
            && jobs::join(&dir, pid).is_err()
        {
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        }
    }

    fn handle(&mut self, port: &Port, msg: ToGuest, payload: Vec<u8>, pending: bool) -> io::Result<()> {
        match msg {
            ToGuest::Create { limits, .. } => {
                if self.created {
                    return port.error("a sandbox already exists here");
                }
                if let Err(e) = build_disk(limits.disk_bytes) {
                    return port.error(format!("building the disk: {e}"));
                }
                self.created = true;
                self.limits = limits;
                // The keeper of programs spawned alongside execs, when the host serves
                // its socket; without it, spawning and ports answer that they cannot.
                match jobs::Jobs::setup(Path::new(scratch())) {
                    Ok(jobs) => {
                        match procs::fork_keeper(&self.seccomp, self.limits.disk_bytes, &jobs) {
                            Ok(pid) => self.keeper = pid,
                            Err(e) => eprintln!("airlock gVisor agent: the process keeper: {e}"),
                        }
                        self.jobs = Some(jobs);
                    }
                    Err(e) => eprintln!("airlock gVisor agent: cgroups: {e}"),
                }
                match ready::ReadyChild::fork(&self.seccomp, self.exec_cgroup().as_deref()) {
                    Ok(child) => {
                        self.ready = Some(child);
                        port.send(&ToHost::Ok, &[])
                    }
                    Err(e) => port.error(format!("forking the ready child: {e}")),
                }
            }
            ToGuest::WriteFile {
                path,
                mode,
                first,
                last,
            } => {
                self.kept.forget();
                if first || self.file.is_none() {
                    let failed = if !self.created {
                        Some("no sandbox: send create first")
                    } else if !first {
                        Some("file data without a first part")
                    } else {
                        None
                    };
                    self.file = Some(Incoming {
                        path,
                        mode,
                        failed: failed.map(|m| failure(ErrorKind::Host, None, m)),
                        written: 0,
                    });
                }
                if let Some(file) = self.file.as_mut()
                    && file.failed.is_none()
                {
                    let result = files::write_chunk(&file.path, file.mode, file.written == 0, &payload);
                    file.written += payload.len() as u64;
                    match result {
                        Ok(()) => {}
                        Err(e) if files::is_no_room(&e) => {
                            files::remove_partial(&file.path);
                            file.failed = Some(ToHost::NoRoom {
                                free_bytes: files::free_bytes().ok(),
                                memory_bytes: None,
                            });
                        }
                        Err(e) => file.failed = Some(file_failure(&file.path, &e)),
                    }
                }
                if !last {
                    return Ok(());
                }
                match self.file.take().and_then(|f| f.failed) {
                    Some(answer) => port.send(&answer, &[]),
                    None => port.send(&ToHost::Ok, &[]),
                }
            }
            ToGuest::Stdin => {
                if self.stdin_overflow || self.stdin.len() + payload.len() > MAX_STDIN {
                    self.stdin_overflow = true;
                    self.stdin = Vec::new();
                } else {
                    self.stdin.extend_from_slice(&payload);
                }
                Ok(())
            }
            ToGuest::Exec {
                command,
                env,
                limits,
                workdir,
            } => {
                let stdin = std::mem::take(&mut self.stdin);
                let changes_in = self.changes_in.take().unwrap_or_default();
                if std::mem::take(&mut self.stdin_overflow) {
                    return port.fail(
                        ErrorKind::Invalid,
                        Some("stdin"),
                        format!("stdin over {MAX_STDIN} bytes is not supported in a gVisor sandbox"),
                    );
                }
                if !self.created {
                    return port.error("no sandbox: send create first");
                }
                let workdir = workdir.unwrap_or_else(|| "/workspace".into());
                if !Path::new(&workdir).is_dir() {
                    return port.fail(
                        ErrorKind::Invalid,
                        Some("workdir"),
                        format!("{workdir}: no such directory in the sandbox to start the program in"),
                    );
                }
                // The child forked after the last exec (or at create); if that fork failed,
                // one is forked now.
                let child = match self.ready.take() {
                    Some(child) => child,
                    None => match ready::ReadyChild::fork(&self.seccomp, self.exec_cgroup().as_deref()) {
                        Ok(child) => child,
                        Err(e) => return port.error(format!("forking the ready child: {e}")),
                    },
                };
                // PWD is where the program starts (the request's own still wins).
                let mut extra = self.env.clone();
                extra.push(("PWD".into(), workdir.clone()));
                let env = environment(&extra, env);
                let request = ready::Request {
                    command,
                    env,
                    workdir,
                    max_file_bytes: self.limits.disk_bytes,
                    // gVisor does not count the program's first process against the
                    // sandbox user's RLIMIT_NPROC (it was forked as root, then setuid;
                    // Linux counts it at setuid, gVisor only at fork): one less makes
                    // `pids` processes in all, as in the other tiers.
                    nproc: u64::from(limits.pids.saturating_sub(1).max(1)),
                };
                // The changeset's first scan, before the program starts (the last exec's
                // scan after it, unless a spawned program may have changed the files
                // since); the second once every process of the exec is gone.
                let fresh = self
                    .jobs
                    .as_ref()
                    .is_some_and(|j| !j.programs_running() && j.programs_started() == self.kept.programs);
                let before = snapshot::before(&changes_in, &mut self.kept, fresh);
                let outcome = exec::run(child, request, stdin, &limits, &self.sigchld, port, pending);
                let answered = match outcome {
                    exec::Ran::Result(mut r) => {
                        if let Some(before) = before {
                            // What may write files while the scan runs is looked at first:
                            // a program spawned from here on makes the next exec scan.
                            let (started, running) = self
                                .jobs
                                .as_ref()
                                .map_or((0, true), |j| (j.programs_started(), j.programs_running()));
                            self.kept.programs = started;
                            (r.files_changed, r.files_changed_truncated) =
                                snapshot::after(before, &mut self.kept);
                            if running {
                                self.kept.forget();
                            }
                        }
                        port.send(&ToHost::Exited { result: r }, &[])
                    }
                    exec::Ran::Cancelled => port.fail(ErrorKind::Cancelled, None, "cancelled"),
                    exec::Ran::Failed(e) => port.error(e),
                };
                // The next exec's relay (the exec's end killed this one's) and child,
                // forked once the answer is out (off the exec's path) and every thread
                // of this exec has ended. Should the child's fork fail, the next exec
                // forks its own and reports why; without a relay, proxy connections are
                // refused.
                if let Some(listener) = self.egress.as_ref() {
                    self.fork_relay(listener);
                }
                self.ready = ready::ReadyChild::fork(&self.seccomp, self.exec_cgroup().as_deref()).ok();
                answered
            }
            ToGuest::ReadFile { path, max_bytes } => {
                if !self.created {
                    return port.error("no sandbox");
                }
                match files::read(&path, max_bytes) {
                    Ok(data) => {
                        let mut chunks = data.chunks(CHUNK).peekable();
                        loop {
                            let chunk = chunks.next().unwrap_or(&[]);
                            let last = chunks.peek().is_none();
                            port.send(&ToHost::FileChunk { last }, chunk)?;
                            if last {
                                return Ok(());
                            }
                        }
                    }
                    Err(e) => port.send(&file_failure(&path, &e), &[]),
                }
            }
            ToGuest::ListFiles => {
                if !self.created {
                    return port.error("no sandbox");
                }
                match files::list() {
                    Ok(entries) => match proto::write(&mut &port.output, &ToHost::Listing { entries }, &[]) {
                        Ok(()) => Ok(()),
                        Err(proto::FrameError::Malformed(m)) => port.error(format!("listing: {m}")),
                        Err(proto::FrameError::Io(e)) => Err(e),
                    },
                    Err(e) => port.error(format!("listing: {e}")),
                }
            }
            ToGuest::Egress => {
                if self.egress.is_some() {
                    return port.send(&ToHost::Ok, &[]);
                }
                if !self.created {
                    return port.error("no sandbox: send create first");
                }
                // The redirections first: with them, a connection to any address lands on
                // a port nothing but the agent can bind, and fails until the relay serves
                // it. Should they fail, the sandbox fails to build (fail closed).
                let started = transparent::setup().and_then(|()| {
                    let listeners = relay::bind()?;
                    let pid = relay::fork_relay(&listeners)?;
                    if let Some(dir) = self.exec_cgroup() {
                        jobs::join(&dir, pid)?;
                    }
                    Ok(listeners)
                });
                match started {
                    Ok(listener) => {
                        self.egress = Some(listener);
                        // The host's list: the proxy's variables, the secrets' placeholders
                        // and where the trust bundle is.
                        self.env = if payload.is_empty() {
                            airlock_egress::proxy_env(airlock_egress::PROXY_PORT)
                        } else {
                            match serde_json::from_slice(&payload) {
                                Ok(env) => env,
                                Err(e) => return port.error(format!("the egress environment: {e}")),
                            }
                        };
                        port.send(&ToHost::Ok, &[])
                    }
                    Err(e) => port.error(format!("starting the egress relay: {e}")),
                }
            }
            // The exec it was meant for has answered already.
            ToGuest::Cancel => Ok(()),
            ToGuest::Freeze | ToGuest::Resume { .. } => port.error("a gVisor sandbox is never a template"),
        }
    }
}

/// The environment every program starts with (as in the other tiers), then `extra`
/// (the proxy's), then the request's own (a later variable wins).
fn environment(extra: &[(String, String)], request: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut env = airlock_sandbox::base_env();
    for (k, v) in extra.iter().cloned().chain(request) {
        env.retain(|(key, _)| *key != k);
        env.push((k, v));
    }
    // The compatibility library first, before any the request preloads itself.
    if std::path::Path::new(crate::bundle::COMPAT_PATH).is_file() {
        match env.iter_mut().find(|(k, _)| k == "LD_PRELOAD") {
            Some((_, v)) => *v = format!("{}:{v}", crate::bundle::COMPAT_PATH),
            None => env.push(("LD_PRELOAD".into(), crate::bundle::COMPAT_PATH.into())),
        }
    }
    env
}

/// Where the sandbox's disk is mounted before its parts are bound into place.
fn scratch() -> &'static str {
    // An image's root has no /.scratch: its bundle provides this one.
    if Path::new(crate::bundle::IMAGE_SCRATCH_PATH).is_dir() {
        crate::bundle::IMAGE_SCRATCH_PATH
    } else {
        SCRATCH
    }
}

/// The sandbox's disk: one tmpfs of `disk_bytes` whose parts are bound at /tmp,
/// /workspace and /dev/shm, so one budget covers all writable space, as in the other
/// tiers. gVisor's tmpfs honours `size` (its pages are the Sentry's memory, charged to
/// the host cgroup around the sandbox) but has no `nr_inodes`: inodes are bounded by
/// that memory cap instead.
fn build_disk(disk_bytes: u64) -> io::Result<()> {
    let opts = format!("mode=0755,size={disk_bytes}");
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let scratch = scratch();
    mount(Some("tmpfs"), scratch, Some("tmpfs"), flags, Some(opts.as_str()))?;
    for (part, mode, owner, dst) in [
        ("tmp", 0o1777, 0, "/tmp"),
        ("workspace", 0o755, SANDBOX_ID, "/workspace"),
        ("shm", 0o1777, 0, "/dev/shm"),
    ] {
        let dir = Path::new(scratch).join(part);
        std::fs::create_dir(&dir)?;
        chown(&dir, Some(Uid::from_raw(owner)), Some(Gid::from_raw(owner)))?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        if !Path::new(dst).is_dir() {
            std::fs::create_dir_all(dst)?;
        }
        mount(Some(&dir), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
    }
    std::env::set_current_dir("/workspace")
}
