//! The privilege drop every program of airlock goes through before its execve, on every
//! tier: one copy, called by
//! - the namespace tier's ready child (`payload`, which a keeper's program also goes
//!   through);
//! - the init of a program spawned in a micro-VM's sandbox (airlock-guest's `spawn`);
//! - the gVisor agent's ready child (airlock-gvisor's `agent::ready`).
//!
//! [`drop_to_sandbox_user`] runs, in this order:
//! 1. default signal dispositions and an empty mask (the parent's Rust runtime ignores
//!    SIGPIPE; the gVisor agent blocks SIGCHLD);
//! 2. rlimits: no core dumps, [`MAX_OPEN_FILES`] open files;
//! 3. groups and gid, then drop the bounding set (needs CAP_SETPCAP, so before setuid);
//! 4. setuid to the sandbox user: the kernel clears effective and permitted caps;
//! 5. clear inheritable and ambient caps; set no_new_privs (landlock and an unprivileged
//!    seccomp filter need it).
//!
//! What comes before and after is each caller's, in this order: its own session
//! (`setsid`: the ready children, first of all; a spawned program's init leaves it to the
//! program) and a controlling terminal (the gVisor ready child, right after `setsid`);
//! then, after this drop, landlock (not under gVisor, which does not implement it), the
//! fixed address-space layout when asked for, the seccomp filter (the namespace tier's
//! init installed it on itself already, and its ready child inherits it), and marking
//! inherited fds close-on-exec.

use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, signal, sigprocmask};
use nix::unistd::{Gid, Uid, setgroups, setresgid, setresuid};

pub use crate::mounts::SANDBOX_ID;
use crate::sys;

/// Open files per process inside the sandbox (`RLIMIT_NOFILE`), on every tier.
pub const MAX_OPEN_FILES: u64 = 4096;

/// The kernel the process runs on, which decides how the bounding set is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Linux, whose highest capability number is `cap_last_cap`
    /// (`/proc/sys/kernel/cap_last_cap`): every capability up to it is dropped from the
    /// bounding set, and clearing the ambient set must succeed.
    Linux {
        /// Highest capability number of this kernel.
        cap_last_cap: u32,
    },
    /// gVisor's Sentry, whose highest capability number is not published: capabilities
    /// are dropped from the bounding set from 0 up to the first one it refuses (at most
    /// 63), and clearing the ambient set is best effort.
    Gvisor,
}

/// A step of the drop failed; the process must not go on to run the program.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {cause}")]
pub struct PrivilegeError {
    /// The step that failed (`setresuid`, `RLIMIT_NOFILE`, ...).
    pub step: &'static str,
    /// Why, as the failed call said.
    pub cause: String,
}

/// The callers report failures as text (to init, to the agent, on the program's stderr).
impl From<PrivilegeError> for String {
    fn from(e: PrivilegeError) -> String {
        e.to_string()
    }
}

fn step<T, E: std::fmt::Display>(step: &'static str, r: Result<T, E>) -> Result<T, PrivilegeError> {
    r.map_err(|e| PrivilegeError {
        step,
        cause: e.to_string(),
    })
}

/// Runs steps 1-5 above: afterwards this process is the sandbox user ([`SANDBOX_ID`],
/// its only group too) with no capability in any set, no_new_privs set, default signal
/// handling and no core dumps. Call it in a single-threaded process (a fresh fork that
/// is to execve a program), still privileged in its user namespace.
pub fn drop_to_sandbox_user(kernel: Kernel) -> Result<(), PrivilegeError> {
    // 1.
    for sig in Signal::iterator() {
        if sig != Signal::SIGKILL && sig != Signal::SIGSTOP {
            // SAFETY: installing SIG_DFL runs no handler code; nothing else in this
            // single-threaded process depends on the old dispositions.
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
    match setgroups(&[gid]) {
        // Rootless (see docs/rootless.md): the user namespace maps only the user's own
        // uid and gid, so this process is the sandbox user already, and the kernel denies
        // setgroups there (an ordinary user must deny it to map a gid at all): the
        // supplementary groups stay the ones the host gave the user (shown as the
        // overflow gid, 65534, unless it is the user's own group).
        Err(nix::errno::Errno::EPERM) if rootless_namespace() => {}
        r => step("setgroups", r)?,
    }
    step("setresgid", setresgid(gid, gid, gid))?;
    match kernel {
        Kernel::Linux { cap_last_cap } => {
            for cap in 0..=cap_last_cap {
                step(
                    "drop bounding capability",
                    sys::prctl(libc::PR_CAPBSET_DROP, cap.into()),
                )?;
            }
        }
        Kernel::Gvisor => {
            // Every capability up to the first the Sentry does not know.
            for cap in 0..64 {
                if sys::prctl(libc::PR_CAPBSET_DROP, cap).is_err() {
                    break;
                }
            }
        }
    }
    // 4.
    let uid = Uid::from_raw(SANDBOX_ID);
    step("setresuid", setresuid(uid, uid, uid))?;
    // 5. (Rootless, the uid did not change, so nothing was cleared at step 4: capset
    // clears the permitted set here too.)
    step("capset", sys::clear_capabilities())?;
    let ambient = sys::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
    );
    if let Kernel::Linux { .. } = kernel {
        step("clear ambient capabilities", ambient)?;
    }
    step("no_new_privs", sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1))?;
    Ok(())
}

/// Whether this is a rootless namespace sandbox's process: already the sandbox user in a
/// user namespace whose setgroups is denied.
fn rootless_namespace() -> bool {
    nix::unistd::geteuid() == Uid::from_raw(SANDBOX_ID)
        && std::fs::read_to_string("/proc/self/setgroups").is_ok_and(|s| s.trim() == "deny")
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::resource::getrlimit;
    use nix::sys::wait::{WaitStatus, waitpid};
    use nix::unistd::{ForkResult, fork, getgroups, getresgid, getresuid};

    /// What the child found wrong, as its exit status (0: nothing).
    fn check_dropped(cap_last_cap: u32) -> i32 {
        let uid = Uid::from_raw(SANDBOX_ID);
        let gid = Gid::from_raw(SANDBOX_ID);
        match getresuid() {
            Ok(r) if r.real == uid && r.effective == uid && r.saved == uid => {}
            _ => return 10,
        }
        match getresgid() {
            Ok(r) if r.real == gid && r.effective == gid && r.saved == gid => {}
            _ => return 11,
        }
        if !getgroups().is_ok_and(|g| g == [gid]) {
            return 12;
        }
        if !sys::effective_capabilities().is_ok_and(|c| c == 0) {
            return 13;
        }
        // Permitted, inheritable and ambient sets empty too (rootless, init's capabilities
        // are inheritable and ambient; a non-changing setresuid clears nothing).
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        for set in ["CapPrm:", "CapInh:", "CapAmb:"] {
            let empty = status
                .lines()
                .find_map(|l| l.strip_prefix(set))
                .is_some_and(|v| u64::from_str_radix(v.trim(), 16) == Ok(0));
            if !empty {
                return 20;
            }
        }
        for cap in 0..=cap_last_cap {
            if !sys::prctl(libc::PR_CAPBSET_READ, cap.into()).is_ok_and(|r| r == 0) {
                return 14;
            }
        }
        if !sys::prctl(libc::PR_GET_NO_NEW_PRIVS, 0).is_ok_and(|r| r == 1) {
            return 15;
        }
        if getrlimit(Resource::RLIMIT_CORE).ok() != Some((0, 0)) {
            return 16;
        }
        if getrlimit(Resource::RLIMIT_NOFILE).ok() != Some((MAX_OPEN_FILES, MAX_OPEN_FILES)) {
            return 17;
        }
        let mut mask = SigSet::empty();
        if sigprocmask(SigmaskHow::SIG_BLOCK, None, Some(&mut mask)).is_err()
            || mask.contains(Signal::SIGUSR1)
        {
            return 18;
        }
        // SAFETY: reads the disposition back by installing SIG_DFL again; nothing else
        // in this single-threaded child handles SIGPIPE.
        match unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) } {
            Ok(SigHandler::SigDfl) => 0,
            _ => 19,
        }
    }

    /// Forks a child that ignores SIGPIPE and blocks SIGUSR1 as a parent might, drops
    /// its privileges for `kernel`, and checks every step took; returns its exit status.
    fn drop_in_child(kernel: Kernel, cap_last_cap: u32) -> i32 {
        drop_in_child_after(kernel, cap_last_cap, || Ok(()))
    }

    /// As `drop_in_child`, after `before` set the child up (a non-zero status when it
    /// failed).
    fn drop_in_child_after(
        kernel: Kernel,
        cap_last_cap: u32,
        before: impl FnOnce() -> Result<(), i32>,
    ) -> i32 {
        // SAFETY: the child only makes syscalls (no allocation unless a step fails, and
        // then only to build its error) and ends with _exit.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                // SAFETY: SIG_IGN runs no handler code.
                let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) };
                let mut usr1 = SigSet::empty();
                usr1.add(Signal::SIGUSR1);
                let _ = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&usr1), None);
                let status = match before().map(|()| drop_to_sandbox_user(kernel)) {
                    Err(status) => status,
                    Ok(Ok(())) => check_dropped(cap_last_cap),
                    Ok(Err(_)) => 1,
                };
                // SAFETY: _exit ends the forked child without running the test harness's
                // atexit handlers or destructors.
                unsafe { libc::_exit(status) }
            }
            ForkResult::Parent { child } => match waitpid(child, None).expect("waitpid") {
                WaitStatus::Exited(_, status) => status,
                other => panic!("the child ended as {other:?}"),
            },
        }
    }

    /// The highest capability this kernel knows.
    fn cap_last_cap() -> u32 {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .expect("cap_last_cap")
            .trim()
            .parse()
            .expect("cap_last_cap")
    }

    #[test]
    fn drops_everything_on_linux_and_as_under_gvisor() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("NOTE: not root: skipped");
            return;
        }
        let cap_last_cap = cap_last_cap();
        assert_eq!(drop_in_child(Kernel::Linux { cap_last_cap }, cap_last_cap), 0);
        // On Linux, the first capability past cap_last_cap is refused: the same set.
        assert_eq!(drop_in_child(Kernel::Gvisor, cap_last_cap), 0);
    }

    /// What a rootless sandbox's process is before the drop: an ordinary host uid that
    /// made a user namespace mapping only itself (and its group) to the sandbox user,
    /// with every capability there also inheritable and ambient (as init keeps them
    /// across its exec). Returns a non-zero status when a step failed.
    fn become_rootless_like() -> Result<(), i32> {
        // An unprivileged host id, well away from real accounts.
        const HOST_ID: u32 = 0x3fff_0000;
        let id = Uid::from_raw(HOST_ID);
        let gid = Gid::from_raw(HOST_ID);
        setgroups(&[gid]).map_err(|_| 30)?;
        setresgid(gid, gid, gid).map_err(|_| 31)?;
        setresuid(id, id, id).map_err(|_| 32)?;
        // The uid change made the process non-dumpable, its /proc files root's: an
        // ordinary user's process is dumpable.
        sys::prctl(libc::PR_SET_DUMPABLE, 1).map_err(|_| 40)?;
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(|_| 33)?;
        std::fs::write("/proc/self/setgroups", "deny").map_err(|_| 34)?;
        std::fs::write("/proc/self/uid_map", format!("{SANDBOX_ID} {HOST_ID} 1")).map_err(|_| 35)?;
        std::fs::write("/proc/self/gid_map", format!("{SANDBOX_ID} {HOST_ID} 1")).map_err(|_| 36)?;
        if nix::unistd::getuid() != Uid::from_raw(SANDBOX_ID) {
            return Err(37);
        }
        // SAFETY: capget/capset/prctl on locals (see `keep_capabilities_across_exec`).
        if !unsafe { crate::sandbox::keep_capabilities_across_exec() } {
            return Err(38);
        }
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        if !status
            .lines()
            .any(|l| l.starts_with("CapAmb:") && !l.ends_with("0000000000000000"))
        {
            return Err(39);
        }
        Ok(())
    }

    #[test]
    fn drops_everything_rootless_ambient_capabilities_included() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("NOTE: not root: skipped");
            return;
        }
        let cap_last_cap = cap_last_cap();
        assert_eq!(
            drop_in_child_after(Kernel::Linux { cap_last_cap }, cap_last_cap, become_rootless_like),
            0
        );
    }
}
