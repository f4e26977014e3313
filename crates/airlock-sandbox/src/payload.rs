//! The program's process, from init's fork to its execve: the ready child. Init forks it
//! ahead of the exec it will serve (while the sandbox waits in the pool, or between a
//! session's execs), and it drops every privilege at once, so that an exec request pays
//! only for handing the command over. It is a single-threaded fork of init, so it may
//! allocate. The seccomp filter is already in force: init installed it on itself before
//! serving any exec, and it is inherited; every step below uses only syscalls it allows.
//!
//! Order, and why:
//! 1. own session: no controlling terminal, Ctrl-C of a terminal never reaches here;
//! 2. default signal dispositions and an empty mask (init's Rust runtime ignores SIGPIPE);
//! 3. rlimits: no core dumps, bounded open files;
//! 4. groups and gid, then drop the bounding set (needs CAP_SETPCAP, so before setuid);
//! 5. setuid to the sandbox user: the kernel clears effective and permitted caps;
//! 6. clear inheritable and ambient caps; set no_new_privs (landlock needs it);
//! 7. landlock;
//! 8. mark every inherited fd above 2 close-on-exec;
//! 9. wait for the exec request (only now, unprivileged, is it parsed);
//! 10. its stdio onto 0-2, the file size capped at the disk size; enter its workdir (a
//!     workdir that is no directory of the sandbox refuses the request on `workdir`);
//! 11. find the program the way a shell would, as the sandbox user sees it, and execve;
//!     if it cannot be found or run, say so on its stderr and exit 127 or 126 as a shell
//!     does.
//!
//! A keeper (see `keeper`) forks its program the same way, with a terminal's slave side
//! as stdio when it has one: the program then makes it its controlling terminal.

use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, signal, sigprocmask};
use nix::unistd::{Gid, Uid, setgroups, setresgid, setresuid, setsid};
use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::mounts::SANDBOX_ID;
use crate::protocol::{self, Request};
use crate::{sys, workspace};

/// Open files per process inside the sandbox.
const MAX_OPEN_FILES: u64 = 4096;

/// What the ready child takes from init at its fork.
#[derive(Debug)]
pub struct Privileges {
    /// The landlock ruleset (opened in init).
    pub landlock: landlock::RulesetCreated,
    /// Highest capability number of this kernel.
    pub cap_last_cap: u32,
}

/// Runs steps 1-11 and never returns. `requests` is where init sends the exec request
/// (with the program's stdin, stdout and stderr). Any failure is written to `errors` (a
/// close-on-exec pipe init reads) and the child exits 127; a successful execve closes the
/// pipe with nothing written.
pub fn ready_child(privileges: Privileges, requests: OwnedFd, mut errors: std::fs::File) -> ! {
    let err = match drop_privileges(privileges).and_then(|()| exec_request(&requests)) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    let _ = errors.write_all(err.as_bytes());
    // SAFETY: _exit ends this forked child without running the parent's atexit handlers
    // or flushing buffers duplicated from init.
    unsafe { libc::_exit(127) }
}

fn step<T, E: std::fmt::Display>(what: &str, r: Result<T, E>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

fn drop_privileges(p: Privileges) -> Result<(), String> {
    // 1.
    step("setsid", setsid())?;
    // 2.
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
    // 3.
    step("RLIMIT_CORE", setrlimit(Resource::RLIMIT_CORE, 0, 0))?;
    step(
        "RLIMIT_NOFILE",
        setrlimit(Resource::RLIMIT_NOFILE, MAX_OPEN_FILES, MAX_OPEN_FILES),
    )?;
    // 4.
    let gid = Gid::from_raw(SANDBOX_ID);
    step("setgroups", setgroups(&[gid]))?;
    step("setresgid", setresgid(gid, gid, gid))?;
    for cap in 0..=p.cap_last_cap {
        step(
            "drop bounding capability",
            sys::prctl(libc::PR_CAPBSET_DROP, cap.into()),
        )?;
    }
    // 5.
    let uid = Uid::from_raw(SANDBOX_ID);
    step("setresuid", setresuid(uid, uid, uid))?;
    // 6.
    step("capset", sys::clear_capabilities())?;
    step(
        "clear ambient capabilities",
        sys::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        ),
    )?;
    step("no_new_privs", sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1))?;
    // 7.
    step("landlock", crate::landlock::restrict(p.landlock))?;
    // 8.
    step("close_range", sys::cloexec_from(3))?;
    Ok(())
}

/// Steps 9-11.
fn exec_request(requests: &OwnedFd) -> Result<std::convert::Infallible, String> {
    // 9.
    let frame = match protocol::recv::<Request>(requests.as_fd()) {
        Ok(Some(frame)) => frame,
        Ok(None) => return Err("init closed the request channel".into()),
        Err(e) => return Err(format!("reading the exec request: {e}")),
    };
    let Request::Exec {
        command,
        env,
        max_file_bytes,
        workdir,
        terminal,
        ..
    } = frame.msg
    else {
        return Err("the ready child got a request that is not an exec".into());
    };
    let Ok(stdio) = <[OwnedFd; 3]>::try_from(frame.fds) else {
        return Err("exec needs three stdio fds".into());
    };
    let first = command.first().ok_or("empty command")?;
    let cstring = |s: &str| CString::new(s).map_err(|_| format!("NUL byte in {s:?}"));
    let argv = command
        .iter()
        .map(|a| cstring(a))
        .collect::<Result<Vec<_>, _>>()?;
    let envp = env
        .iter()
        .map(|(k, v)| cstring(&format!("{k}={v}")))
        .collect::<Result<Vec<_>, _>>()?;
    // 10.
    for (fd, target) in stdio.iter().zip(0..) {
        // SAFETY: dup2 onto 0..=2 of this process; `fd` is open (owned by `stdio`).
        if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
            return Err(format!("dup2: {}", std::io::Error::last_os_error()));
        }
    }
    drop(stdio);
    if terminal {
        // A keeper's terminal: this process leads its own session (step 1), so the slave
        // side on its stdin becomes its controlling terminal.
        // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal it from another
        // session); fd 0 is open.
        if unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } < 0 {
            return Err(format!("TIOCSCTTY: {}", std::io::Error::last_os_error()));
        }
    }
    step(
        "RLIMIT_FSIZE",
        setrlimit(Resource::RLIMIT_FSIZE, max_file_bytes, max_file_bytes),
    )?;
    // Init left every process in /workspace.
    let workdir = workdir.unwrap_or_else(|| workspace::ROOT.to_owned());
    if workdir != workspace::ROOT
        && let Err(e) = nix::unistd::chdir(workdir.as_str())
    {
        return Err(refuse(
            "workdir",
            &format!("{workdir}: cannot start the program there: {e}"),
        ));
    }
    // 11. A program that cannot be found or run ends as a shell's would: a line on its
    // stderr and exit status 127 (not found) or 126 (found, cannot be executed), so the
    // caller gets an ordinary result rather than a failed request.
    let path = match resolve(first, &env, Path::new(&workdir)) {
        Ok(path) => cstring(&path.to_string_lossy())?,
        Err(NotRunnable { status, message }) => fail_like_a_shell(status, &message),
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
    // ENOENT here is a missing interpreter (`#!/no/such/shell`) or loader.
    let (status, why) = if e.raw_os_error() == Some(libc::ENOENT) {
        (127, "its interpreter or loader is not in the sandbox: ")
    } else {
        (126, "")
    };
    fail_like_a_shell(status, &format!("{}: {why}{e}", path.to_string_lossy()))
}

/// The message for init that refuses the request on `field` (init turns it into
/// `Reply::Refused`).
fn refuse(field: &str, message: &str) -> String {
    format!("{field}\0{message}")
}

/// Why the command cannot be run: the shell's exit status for it and what to print.
struct NotRunnable {
    status: i32,
    message: String,
}

/// Writes `airlock: <message>` to the program's stderr (already in place) and exits with
/// `status`, as the program would have.
fn fail_like_a_shell(status: i32, message: &str) -> ! {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "airlock: {message}");
    // SAFETY: _exit ends this single-threaded child at once, running no atexit handlers
    // or destructors that could touch state shared with init.
    unsafe { libc::_exit(status) }
}

/// Finds the program the way a shell would: a name with a slash is taken as a path
/// (relative to `workdir`), otherwise each PATH entry is tried. Not found is status 127;
/// found but not an executable file is 126.
fn resolve(program: &str, env: &[(String, String)], workdir: &Path) -> Result<PathBuf, NotRunnable> {
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = workdir.join(program);
        if executable(&path) {
            return Ok(path);
        }
        let (status, why) = if path.exists() {
            (126, "not an executable file")
        } else {
            (127, "no such file in the sandbox")
        };
        return Err(NotRunnable {
            status,
            message: format!("{program}: {why}"),
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
    Err(NotRunnable {
        status: 127,
        message: format!("{program}: command not found in the sandbox (searched PATH={search})"),
    })
}
