//! Thin wrappers over the raw calls the VM launcher makes, errno turned into
//! `io::Error` at once. The `child_*` functions run between fork and exec: they do not
//! allocate or take locks (every buffer they use was prepared before the fork).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Duplicates `fd` to the lowest free number >= `min`, close-on-exec.
pub fn dup_above(fd: BorrowedFd<'_>, min: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a valid borrowed fd only creates a new descriptor.
    let new = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) }.into())?;
    // SAFETY: the new descriptor was just created and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(new as RawFd) })
}

/// Writes `0` to each `cgroup.procs` file: the calling process joins those cgroups.
pub fn child_join_cgroups(procs: &[CString]) -> io::Result<()> {
    for path in procs {
        // SAFETY: `path` is a NUL-terminated string that outlives the call.
        let fd = check(unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) }.into())?;
        // SAFETY: writes two bytes from a static buffer to the fd opened above.
        let n = unsafe { libc::write(fd as RawFd, b"0\n".as_ptr().cast(), 2) };
        // SAFETY: closes the fd opened above, which nothing else uses.
        unsafe { libc::close(fd as RawFd) };
        check(n as libc::c_long)?;
    }
    Ok(())
}

/// No transparent huge pages for the calling process and what it executes (the flag
/// survives `execve`). QEMU asks for huge pages on its translated-code cache
/// (`MADV_HUGEPAGE`), which then holds 2 MiB of host memory for each 2 MiB region its
/// translations reach into: without them, the VMM holds the pages it wrote, 4 KiB each.
pub fn child_no_huge_pages() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    check(unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) }.into()).map(drop)
}

/// Moves `from` to exactly `to` (clearing close-on-exec on `to`).
pub fn child_dup2(from: RawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: dup2 on descriptor numbers; `from` is open (kept alive by the parent's
    // copy of the Command), `to` is replaced atomically.
    check(unsafe { libc::dup2(from, to) }.into()).map(drop)
}

/// Drops to `uid`/`gid` with exactly `groups` as supplementary groups, for good (real,
/// effective and saved ids), then asks for SIGKILL when the parent thread dies (set
/// after the id change, which would clear it) and forbids privilege gain by exec.
pub fn child_drop_privileges(uid: u32, gid: u32, groups: &[u32], parent: libc::pid_t) -> io::Result<()> {
    // Raw syscalls, not glibc's wrappers, which synchronize the change across every thread
    // glibc knows of: none but this one exists after the fork.
    // SAFETY: `groups` is a valid slice of gid_t for the length given.
    check(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) })?;
    // SAFETY: plain id change, no memory involved.
    check(unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) })?;
    // SAFETY: plain id change, no memory involved.
    check(unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) })?;
    // SAFETY: prctl with integer arguments only.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) }.into())?;
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != parent {
        // The parent died before PDEATHSIG was armed: nobody will ever kill this VM.
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: prctl with integer arguments only.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }.into()).map(drop)
}

/// This process's pid.
pub fn getpid() -> libc::pid_t {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() }
}

/// The host's TSC frequency in kHz, measured against CLOCK_MONOTONIC_RAW over `window`.
/// The guest kernel's early TSC calibration is unreliable under emulation (about one
/// boot in eight hangs without `tsc_early_khz=`), so the host tells it.
#[cfg(target_arch = "x86_64")]
pub fn tsc_khz(window: std::time::Duration) -> u64 {
    let now = || {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec into the valid local `ts`.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_RAW, &mut ts) };
        ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
    };
    // SAFETY: rdtsc only reads the time-stamp counter; every x86_64 CPU has it.
    let tsc = || unsafe { core::arch::x86_64::_rdtsc() };
    let (t0, c0) = (now(), tsc());
    std::thread::sleep(window);
    let (t1, c1) = (now(), tsc());
    let ns = (t1 - t0).max(1);
    (u128::from(c1.wrapping_sub(c0)) * 1_000_000 / ns) as u64
}

/// A new anonymous memory file (memfd), close-on-exec, that can be sealed.
pub fn memfd(name: &std::ffi::CStr) -> io::Result<std::fs::File> {
    // SAFETY: `name` is a NUL-terminated string that outlives the call; the flags are
    // constants.
    let fd = check(
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) }.into(),
    )?;
    // SAFETY: the descriptor was just created and nothing else owns it.
    Ok(unsafe { std::fs::File::from_raw_fd(fd as RawFd) })
}

/// Seals a memfd for good: its content and size can no longer change through any
/// descriptor (write, fallocate, truncate and writable shared mappings fail with EPERM,
/// even through a descriptor opened for writing), and no seal can be removed. Private
/// (copy-on-write) mappings stay possible: that is how clones map a template's RAM.
/// Fails with EBUSY while a writable shared mapping of it exists.
pub fn seal(file: &std::fs::File) -> io::Result<()> {
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: F_ADD_SEALS on a valid descriptor takes an integer argument.
    check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) }.into()).map(drop)
}

/// Opens `file` again, read-only, as a new open file description (its own offset at 0).
pub fn reopen_read_only(file: &std::fs::File) -> io::Result<std::fs::File> {
    std::fs::File::open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}
