//! airlock's init: PID 1 of the sandbox's pid namespace. The supervisor re-executes its
//! own binary with [`INIT_ARG`] in the child it cloned into fresh namespaces; a fresh
//! exec means init may allocate and use any library freely, whatever threads the
//! supervisor had.
//!
//! Init builds the filesystem, prepares landlock, seccomp and the program's argv, forks
//! the program, reaps every zombie, and when the program exits reports its status and
//! exits itself, which makes the kernel kill everything else in the namespace.

use nix::sys::signal::{SigSet, SigmaskHow, sigprocmask};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};
use std::convert::Infallible;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::payload::{self, Prepared};
use crate::protocol::{CONFIG_FD, InitConfig, InitReport, REPORT_FD, read_config};
use crate::{mounts, sys};

/// The argument (argv[1]) that turns the airlock binary into the sandbox's init.
pub const INIT_ARG: &str = "__airlock_init__";

/// If this process was started as a sandbox init, runs it and never returns.
/// Binaries that use the engine call this first thing in `main`.
pub fn maybe_run_init() {
    if std::env::args_os().nth(1).is_some_and(|a| a == INIT_ARG) {
        run()
    }
}

fn run() -> ! {
    // SAFETY: fd 4 is the report pipe the supervisor placed there before exec; nothing
    // else in this fresh process owns it.
    let mut report = unsafe { File::from_raw_fd(REPORT_FD) };
    let failure = match init(&mut report) {
        Ok(never) => match never {},
        Err(message) => message,
    };
    let _ = report.write_all(&InitReport::Failed { message: failure }.to_line());
    std::process::exit(1)
}

fn init(report: &mut File) -> Result<Infallible, String> {
    // Nothing but stdio, the config and the report pipe may cross into the sandbox.
    sys::close_from(5).map_err(|e| format!("close_range: {e}"))?;
    // The supervisor blocks the signals it handles; the sandbox starts with none blocked.
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(|e| format!("sigprocmask: {e}"))?;

    // SAFETY: fd 3 is the config pipe the supervisor placed there; owned only here.
    let mut config_pipe = unsafe { File::from_raw_fd(CONFIG_FD) };
    let frame = read_config(&mut config_pipe).map_err(|e| format!("reading the sandbox config: {e}"))?;
    let config = &frame.config;

    let layout = mounts::Layout {
        rootfs: config.rootfs.as_deref(),
        disk_bytes: config.disk_bytes,
    };
    mounts::build(&layout).map_err(|e| format!("building the filesystem: {e}"))?;

    // The supervisor sends one more byte once init is in every cgroup. Only then are the
    // spec's files written (their tmpfs pages are charged to the sandbox) and the cgroup
    // namespace made (rooted at the sandbox's own cgroup in every hierarchy).
    let mut attached = [0u8; 1];
    config_pipe
        .read_exact(&mut attached)
        .map_err(|e| format!("waiting for the cgroup attach: {e}"))?;
    drop(config_pipe);
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP)
        .map_err(|e| format!("unshare cgroup namespace: {e}"))?;
    mounts::write_files(&config.files, &frame.file_data).map_err(|e| e.to_string())?;
    mounts::seal_root().map_err(|e| format!("sealing the root: {e}"))?;
    nix::unistd::sethostname("airlock").map_err(|e| format!("sethostname: {e}"))?;
    sys::loopback_up().map_err(|e| format!("bringing up loopback: {e}"))?;

    let prepared = prepare(config, &frame.seccomp)?;
    let (mut err_read, err_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map(|(r, w)| (File::from(r), File::from(w)))
        .map_err(|e| format!("pipe: {e}"))?;

    // SAFETY: init is single-threaded (a fresh exec that started no threads), so the
    // child may do anything a normal process does.
    let child = match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            drop(err_read);
            payload::exec(prepared, err_write)
        }
        ForkResult::Parent { child } => child,
    };
    drop(err_write);
    drop(prepared);
    let mut failure = String::new();
    let _ = err_read.read_to_string(&mut failure);
    if !failure.is_empty() {
        let _ = waitpid(child, None);
        return Err(failure);
    }
    report
        .write_all(&InitReport::Started.to_line())
        .map_err(|e| format!("report: {e}"))?;

    // Init keeps no copy of the program's stdio: output pipes close when the program and
    // its descendants are gone, not when init is.
    for fd in 0..3 {
        let _ = nix::unistd::close(fd);
    }
    let status = reap_until(child);
    let _ = report.write_all(&status.to_line());
    std::process::exit(0)
}

/// Reaps every child (orphans are re-parented to init) until `program` ends.
fn reap_until(program: Pid) -> InitReport {
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == program => return InitReport::Exited { code },
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == program => {
                return InitReport::Signaled { signal: sig as i32 };
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                return InitReport::Failed {
                    message: format!("waitpid: {e}"),
                };
            }
        }
    }
}

fn prepare(config: &InitConfig, seccomp: &[u8]) -> Result<Prepared, String> {
    let path = resolve(&config.command[0], &config.env)?;
    let cstring = |s: &str| CString::new(s).map_err(|_| format!("NUL byte in {s:?}"));
    let argv = config
        .command
        .iter()
        .map(|a| cstring(a))
        .collect::<Result<Vec<_>, _>>()?;
    let envp = config
        .env
        .iter()
        .map(|(k, v)| cstring(&format!("{k}={v}")))
        .collect::<Result<Vec<_>, _>>()?;
    let cap_last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    Ok(Prepared {
        path: cstring(&path.to_string_lossy())?,
        argv,
        envp,
        max_file_bytes: config.disk_bytes,
        landlock: crate::landlock::prepare().map_err(|e| e.to_string())?,
        seccomp: airlock_seccomp::from_bytes(seccomp).map_err(|e| format!("seccomp program: {e}"))?,
        cap_last_cap,
    })
}

/// Finds the program the way a shell would: a name with a slash is taken as a path
/// (relative to /workspace), otherwise each PATH entry is tried.
fn resolve(program: &str, env: &[(String, String)]) -> Result<PathBuf, String> {
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = Path::new("/workspace").join(program);
        if executable(&path) {
            return Ok(path);
        }
        return Err(format!("{program}: no such executable file in the sandbox"));
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
    Err(format!(
        "{program}: command not found in the sandbox (searched PATH={search})"
    ))
}
