//! The steps between init's fork and the program's execve, in a fixed order. They run in
//! the forked child of init (a single-threaded process), so they may allocate; everything
//! that can be prepared (paths, argv, the landlock ruleset) was prepared by init before
//! the fork. The seccomp filter is already in force: init installed it on itself before
//! serving any exec, and it is inherited; every step below uses only syscalls it allows.
//!
//! Order, and why:
//! 1. own session: no controlling terminal, Ctrl-C of a terminal never reaches here;
//! 2. default signal dispositions and an empty mask (init's Rust runtime ignores SIGPIPE);
//! 3. rlimits: no core dumps, bounded open files, file size capped at the disk size;
//! 4. groups and gid, then drop the bounding set (needs CAP_SETPCAP, so before setuid);
//! 5. setuid to the sandbox user: the kernel clears effective and permitted caps;
//! 6. clear inheritable and ambient caps; set no_new_privs (landlock needs it);
//! 7. landlock;
//! 8. mark every inherited fd above 2 close-on-exec;
//! 9. execve.

use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, signal, sigprocmask};
use nix::unistd::{Gid, Uid, setgroups, setresgid, setresuid, setsid};
use std::ffi::CString;
use std::io::Write;

use crate::mounts::SANDBOX_ID;
use crate::sys;

/// Open files per process inside the sandbox.
const MAX_OPEN_FILES: u64 = 4096;

/// Everything the child needs, prepared before the fork.
#[derive(Debug)]
pub struct Prepared {
    /// Absolute path of the program inside the sandbox.
    pub path: CString,
    /// argv.
    pub argv: Vec<CString>,
    /// The environment, as `K=V`.
    pub envp: Vec<CString>,
    /// Largest file the program may write (the disk size).
    pub max_file_bytes: u64,
    /// The landlock ruleset (opened in init).
    pub landlock: landlock::RulesetCreated,
    /// Highest capability number of this kernel.
    pub cap_last_cap: u32,
}

/// Runs steps 1-9 and never returns. Any failure is written to `errors` (a
/// close-on-exec pipe init reads) and the child exits 127; a successful execve closes
/// the pipe with nothing written.
pub fn exec(prepared: Prepared, mut errors: std::fs::File) -> ! {
    let err = match apply(prepared) {
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

fn apply(p: Prepared) -> Result<std::convert::Infallible, String> {
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
    step(
        "RLIMIT_FSIZE",
        setrlimit(Resource::RLIMIT_FSIZE, p.max_file_bytes, p.max_file_bytes),
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
    // 9.
    let argv: Vec<*const libc::c_char> = p
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = p
        .envp
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    // SAFETY: path, argv and envp are NUL-terminated strings and null-terminated pointer
    // arrays that live until the call returns (it only returns on failure).
    unsafe { libc::execve(p.path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    let e = std::io::Error::last_os_error();
    Err(format!("execve {}: {e}", p.path.to_string_lossy()))
}
