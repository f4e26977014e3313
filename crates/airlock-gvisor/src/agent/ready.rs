//! The ready child: forked by the agent ahead of the exec it will serve (at `Create`, and
//! after each exec), it drops every privilege at once and waits for its command, so that
//! an exec pays only for handing the command over (a fork in gVisor costs milliseconds).
//! The agent is single-threaded when it forks, so the child may allocate.
//!
//! Order, and why:
//! 1. own session, default signal dispositions, an empty mask (the agent blocks SIGCHLD
//!    and ignores SIGPIPE);
//! 2. rlimits: no core dumps, bounded open files;
//! 3. groups and gid, then drop the bounding set (needs CAP_SETPCAP, so before setuid);
//! 4. setuid to the sandbox user: effective and permitted capabilities are cleared;
//! 5. clear inheritable and ambient capabilities; no_new_privs;
//! 6. airlock's seccomp filter (gVisor implements seccomp; it filters the program's
//!    syscalls inside the Sentry, a wall besides runsc's own filter on the Sentry);
//! 7. wait for the request (only now, unprivileged, is it parsed);
//! 8. RLIMIT_NPROC: the program's pids limit (gVisor's tasks are no host processes, so
//!    the host cgroup's pids.max cannot count them; gVisor enforces RLIMIT_NPROC per
//!    user, and the program is the only process of the sandbox user), RLIMIT_FSIZE;
//! 9. stdio onto 0-2, into the workdir (/workspace unless the request names one), find the program as a shell would, execve.
//!
//! landlock is not applied: this gVisor release does not implement it.
//!
//! The ready child is moved into the execs' cgroup (see `jobs`) as soon as it is
//! forked. A program spawned alongside execs (see `procs`) is forked the same way
//! ([`child`]), by a small parent of its own ([`program_init`]) that kills its cgroup
//! when it ends.

use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, signal, sigprocmask};
use nix::unistd::{ForkResult, Gid, Pid, Uid, fork, setgroups, setresgid, setresuid, setsid};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// uid and gid of the sandbox user.
pub const SANDBOX_ID: u32 = 1000;

/// Open files per process inside the sandbox (as in the other tiers).
const MAX_OPEN_FILES: u64 = 4096;

/// Largest request the child reads: the spec bounds argv+env to 1 MiB.
const MAX_REQUEST: usize = 2 << 20;

/// What the agent hands the ready child.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    /// argv.
    pub command: Vec<String>,
    /// The environment (the whole of it).
    pub env: Vec<(String, String)>,
    /// Where the program starts (absolute).
    pub workdir: String,
    /// RLIMIT_FSIZE.
    pub max_file_bytes: u64,
    /// RLIMIT_NPROC: processes plus threads of the sandbox user.
    pub nproc: u64,
}

/// A forked child waiting for its request; the agent's ends of its pipes.
#[derive(Debug)]
pub struct ReadyChild {
    /// Its pid (in the sandbox).
    pub pid: Pid,
    /// The cgroup it is in (the execs'), if there are cgroups.
    pub cgroup: Option<PathBuf>,
    /// Where its request goes (closed after).
    pub request: File,
    /// Its stdin.
    pub stdin: File,
    /// Its stdout.
    pub stdout: OwnedFd,
    /// Its stderr.
    pub stderr: OwnedFd,
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
}

impl ReadyChild {
    /// Forks it. The caller must be single-threaded.
    pub fn fork(seccomp: &airlock_seccomp::BpfProgram, cgroup: Option<&Path>) -> std::io::Result<ReadyChild> {
        let (req_r, req_w) = pipe()?;
        let (in_r, in_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        // SAFETY: the agent is single-threaded whenever it forks (see the module docs),
        // so the child may allocate and use any libc function.
        match unsafe { fork() }? {
            ForkResult::Child => {
                drop((req_w, in_w, out_r, err_r));
                child(seccomp, req_r, [in_r, out_w, err_w], None)
            }
            ForkResult::Parent { child } => {
                // Into the execs' cgroup before it can start anything.
                if let Some(dir) = cgroup
                    && let Err(e) = super::jobs::join(dir, child)
                {
                    let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                    let _ = nix::sys::wait::waitpid(child, None);
                    return Err(e);
                }
                Ok(ReadyChild {
                    pid: child,
                    cgroup: cgroup.map(Path::to_path_buf),
                    request: File::from(req_w),
                    stdin: File::from(in_w),
                    stdout: out_r,
                    stderr: err_r,
                })
            }
        }
    }
}

fn step<T, E: std::fmt::Display>(what: &str, r: Result<T, E>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// What a spawned program's parent does besides waiting (its terminal is relayed by
/// it).
pub trait Chores {
    /// Extra fds to keep open and poll for reading.
    fn fds(&self) -> Vec<std::os::fd::RawFd>;
    /// Called when any of `fds` may be readable (or hung up).
    fn ready(&mut self);
    /// Called once the program has ended, before its status is passed on.
    fn finish(&mut self);
    /// A signal for the program, when there is a way to ask for one.
    fn signal(&mut self) -> Option<i32> {
        None
    }
}

/// The parent of spawned program `program`, whose processes are in cgroup `cgroup`:
/// does `chores` until `program` ends, then kills every process left in its cgroup,
/// writes its wait status to `status` and exits. A `SIGKILL` for it kills the cgroup.
pub fn program_init(program: Pid, status: OwnedFd, chores: &mut dyn Chores, cgroup: &Path) -> ! {
    let mut keep = chores.fds();
    keep.extend([status.as_raw_fd(), 2]);
    crate::agent::relay::close_all_but(&keep);
    loop {
        let mut raw = 0;
        // SAFETY: waitpid with a valid out pointer to a local int.
        let pid = unsafe { libc::waitpid(program.as_raw(), &mut raw, libc::WNOHANG) };
        if pid == program.as_raw() {
            // Whatever it left running dies with it (its orphans went to the agent,
            // which reaps them).
            super::jobs::kill_all(cgroup, || {});
            chores.finish();
            let _ = File::from(status).write_all(&raw.to_ne_bytes());
            // SAFETY: ends this forked parent at once.
            unsafe { libc::_exit(0) }
        }
        if pid < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
            // SAFETY: as above (no program to wait for: cannot happen).
            unsafe { libc::_exit(1) }
        }
        let fds = chores.fds();
        let mut polls: Vec<libc::pollfd> = fds
            .iter()
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `polls` is a live array of `polls.len()` pollfds. The chores include a
        // signalfd of SIGCHLD, so the program's end wakes it at once.
        let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 1000) };
        if n > 0 {
            chores.ready();
        }
        while let Some(sig) = chores.signal() {
            if sig == libc::SIGKILL {
                super::jobs::kill_round(cgroup);
                let _ = nix::sys::signal::kill(program, Signal::SIGKILL);
            } else if let Ok(sig) = Signal::try_from(sig) {
                let _ = nix::sys::signal::kill(program, sig);
            }
        }
    }
}

/// Runs in a forked child: drops privileges, makes `tty` (when given) its controlling
/// terminal, waits for the request on `request` and runs it with `stdio`.
pub fn child(
    seccomp: &airlock_seccomp::BpfProgram,
    request: OwnedFd,
    stdio: [OwnedFd; 3],
    tty: Option<std::os::fd::RawFd>,
) -> ! {
    let stderr = stdio[2].as_raw_fd();
    let err = match drop_privileges(seccomp, tty).and_then(|()| exec_request(request, stdio)) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    // SAFETY: `stderr` is the program's stderr pipe, still open (a failed step returns
    // before `stdio` is dropped, and exec_request's failures happen with fd 2 on it).
    let mut out =
        std::mem::ManuallyDrop::new(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(stderr) });
    let _ = writeln!(out, "airlock: {err}");
    // SAFETY: _exit ends this forked child without running the agent's atexit handlers.
    unsafe { libc::_exit(127) }
}

fn drop_privileges(
    seccomp: &airlock_seccomp::BpfProgram,
    tty: Option<std::os::fd::RawFd>,
) -> Result<(), String> {
    // 1.
    step("setsid", setsid())?;
    if let Some(tty) = tty {
        // SAFETY: TIOCSCTTY on an open terminal fd with an int argument; this process
        // just became a session leader without a controlling terminal.
        if unsafe { libc::ioctl(tty, libc::TIOCSCTTY, 0) } < 0 {
            return Err(format!("TIOCSCTTY: {}", std::io::Error::last_os_error()));
        }
    }
    for sig in Signal::iterator() {
        if sig != Signal::SIGKILL && sig != Signal::SIGSTOP {
            // SAFETY: installing SIG_DFL runs no handler code; nothing else in this
            // single-threaded child depends on the old dispositions.
            let _ = unsafe { signal(sig, SigHandler::SigDfl) };
        }
    }
    step(
        "sigprocmask",
        sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None),
    )?;
    // 2.
    step("RLIMIT_CORE", setrlimit(Resource::RLIMIT_CORE, 0, 0))?;
    step(
        "RLIMIT_NOFILE",
        setrlimit(Resource::RLIMIT_NOFILE, MAX_OPEN_FILES, MAX_OPEN_FILES),
    )?;
    // 3.
    let gid = Gid::from_raw(SANDBOX_ID);
    step("setgroups", setgroups(&[gid]))?;
    step("setresgid", setresgid(gid, gid, gid))?;
    // Every capability up to the first the kernel (the Sentry) does not know.
    for cap in 0..64 {
        if airlock_sandbox::sys::prctl(libc::PR_CAPBSET_DROP, cap).is_err() {
            break;
        }
    }
    // 4.
    let uid = Uid::from_raw(SANDBOX_ID);
    step("setresuid", setresuid(uid, uid, uid))?;
    // 5.
    step("capset", airlock_sandbox::sys::clear_capabilities())?;
    let _ = airlock_sandbox::sys::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
    );
    step(
        "no_new_privs",
        airlock_sandbox::sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1),
    )?;
    // 6.
    step("seccomp", airlock_seccomp::apply(seccomp))?;
    Ok(())
}

/// Steps 7-9.
fn exec_request(request: OwnedFd, stdio: [OwnedFd; 3]) -> Result<std::convert::Infallible, String> {
    // 7.
    let mut bytes = Vec::new();
    step(
        "reading the request",
        File::from(request)
            .take(MAX_REQUEST as u64)
            .read_to_end(&mut bytes),
    )?;
    if bytes.is_empty() {
        // The agent dropped this child (the sandbox ends): nothing to run.
        // SAFETY: _exit ends this forked child at once.
        unsafe { libc::_exit(0) }
    }
    let req: Request = step("parsing the request", serde_json::from_slice(&bytes))?;
    // 8.
    step(
        "RLIMIT_NPROC",
        setrlimit(Resource::RLIMIT_NPROC, req.nproc, req.nproc),
    )?;
    step(
        "RLIMIT_FSIZE",
        setrlimit(Resource::RLIMIT_FSIZE, req.max_file_bytes, req.max_file_bytes),
    )?;
    let first = req.command.first().ok_or("empty command")?;
    let cstring = |s: &str| CString::new(s).map_err(|_| format!("NUL byte in {s:?}"));
    let argv = req
        .command
        .iter()
        .map(|a| cstring(a))
        .collect::<Result<Vec<_>, _>>()?;
    let envp = req
        .env
        .iter()
        .map(|(k, v)| cstring(&format!("{k}={v}")))
        .collect::<Result<Vec<_>, _>>()?;
    // 9.
    for (fd, target) in stdio.iter().zip(0..) {
        // SAFETY: dup2 onto 0..=2 of this process; `fd` is open (owned by `stdio`). The
        // agent's port fds there are replaced, never used by this child again.
        if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
            return Err(format!("dup2: {}", std::io::Error::last_os_error()));
        }
    }
    drop(stdio);
    step(
        &format!("chdir {}", req.workdir),
        std::env::set_current_dir(&req.workdir),
    )?;
    let path = match resolve(first, &req.env, Path::new(&req.workdir)) {
        Ok(path) => cstring(&path.to_string_lossy())?,
        Err((status, message)) => fail_like_a_shell(status, &message),
    };
    let argv: Vec<*const libc::c_char> = argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = envp
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    // SAFETY: path, argv and envp are NUL-terminated strings and null-terminated pointer
    // arrays that live until the call returns (it only returns on failure).
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    let e = std::io::Error::last_os_error();
    let status = if e.raw_os_error() == Some(libc::ENOENT) {
        127
    } else {
        126
    };
    fail_like_a_shell(status, &format!("{}: {e}", path.to_string_lossy()))
}

/// Writes `airlock: <message>` to the program's stderr and exits with `status`, as a
/// shell does for a command it cannot find (127) or run (126).
fn fail_like_a_shell(status: i32, message: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "airlock: {message}");
    // SAFETY: _exit ends this single-threaded child at once.
    unsafe { libc::_exit(status) }
}

/// Finds the program the way a shell would: a name with a slash is a path (relative to
/// `workdir`), otherwise each PATH entry is tried.
fn resolve(program: &str, env: &[(String, String)], workdir: &Path) -> Result<PathBuf, (i32, String)> {
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = workdir.join(program);
        if executable(&path) {
            return Ok(path);
        }
        return Err(if path.exists() {
            (126, format!("{program}: not an executable file"))
        } else {
            (127, format!("{program}: no such file in the sandbox"))
        });
    }
    let search = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/bin:/bin");
    for dir in search.split(':').filter(|d| !d.is_empty()) {
        let path = Path::new(dir).join(program);
        if executable(&path) {
            return Ok(path);
        }
    }
    Err((
        127,
        format!("{program}: command not found in the sandbox (searched PATH={search})"),
    ))
}
