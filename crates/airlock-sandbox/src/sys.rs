//! Thin wrappers over the raw syscalls that neither `nix` nor `std` expose in the form the
//! engine needs. Each returns `io::Result`, turning errno into an error at once.
//!
//! Functions marked "async-signal-safe" may be called in the child between `clone` and
//! `execve`: they do not allocate and take no locks.

use std::ffi::CStr;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Turns a `-1`-on-error return value into `io::Result`. Async-signal-safe.
fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The kernel's `struct clone_args` (linux/sched.h), version 2 (with `cgroup`).
#[repr(C)]
#[derive(Debug, Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// What `clone_process` returns in the parent.
#[derive(Debug)]
pub struct Cloned {
    /// The child's pid in our pid namespace.
    pub pid: libc::pid_t,
    /// A pidfd for the child.
    pub pidfd: OwnedFd,
    /// Whether the child was born in the cgroup given (CLONE_INTO_CGROUP worked).
    pub in_cgroup: bool,
}

/// Forks like `fork(2)` but with namespace `flags`, a pidfd, and when `cgroup` is given,
/// directly into that cgroup2 directory. Tries clone3 first and falls back to clone(2)
/// on kernels without it (then the caller must move the child into its cgroup).
///
/// Returns `Ok(None)` in the child.
///
/// # Safety
/// As with `fork`: in a multi-threaded caller, the child may only call async-signal-safe
/// functions until it execs or exits.
pub unsafe fn clone_process(flags: u64, cgroup: Option<RawFd>) -> io::Result<Option<Cloned>> {
    let mut pidfd: libc::c_int = -1;
    // With CLONE_PARENT the child's exit signal is the caller's own, and clone3 wants 0.
    let parent = flags & libc::CLONE_PARENT as u64 != 0;
    let mut args = CloneArgs {
        flags: flags | libc::CLONE_PIDFD as u64,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: if parent { 0 } else { libc::SIGCHLD as u64 },
        ..CloneArgs::default()
    };
    if let Some(fd) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = fd as u64;
    }
    // SAFETY: `args` is a valid clone_args of the size passed; with stack 0 the child
    // continues on a copy of this stack like fork(2). The caller upholds fork's rules.
    let mut ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            size_of::<CloneArgs>(),
        )
    };
    let mut in_cgroup = cgroup.is_some();
    if ret == -1 {
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            // No clone3 (before 5.3), or no CLONE_INTO_CGROUP (before 5.7): plain clone.
            Some(libc::ENOSYS) | Some(libc::E2BIG) | Some(libc::EINVAL) => {
                in_cgroup = false;
                let clone_flags =
                    (flags | libc::CLONE_PIDFD as u64) as libc::c_ulong | libc::SIGCHLD as libc::c_ulong;
                // SAFETY: clone(2) with a null stack behaves like fork; on x86_64 the
                // argument order is (flags, stack, parent_tid, child_tid, tls) and
                // CLONE_PIDFD stores the pidfd through parent_tid, which points at a
                // live c_int.
                ret = unsafe {
                    libc::syscall(
                        libc::SYS_clone,
                        clone_flags,
                        0usize,
                        &mut pidfd as *mut libc::c_int,
                        0usize,
                        0usize,
                    )
                };
                check(ret)?;
            }
            _ => return Err(err),
        }
    }
    if ret == 0 {
        return Ok(None);
    }
    // SAFETY: the kernel stored a fresh pidfd that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(Some(Cloned {
        pid: ret as libc::pid_t,
        pidfd,
        in_cgroup,
    }))
}

/// `CLONE_INTO_CGROUP` (linux/sched.h); libc does not export it for every target.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `pidfd_open(pid, 0)`: a handle that keeps naming this process even after it exits and
/// its pid is recycled.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers by value and touches no memory of this
    // process; an invalid or exited pid yields ESRCH.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, libc::c_long::from(pid), 0) })?;
    // SAFETY: on success the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `sig` to the process behind `pidfd`: no pid-reuse race.
pub fn pidfd_send_signal(pidfd: RawFd, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall on an fd; null siginfo means "as kill(2) would send".
    check(unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd, sig, std::ptr::null::<u8>(), 0) })
        .map(drop)
}

/// Turns address-space randomization off for this process and the programs it will
/// exec (`personality(ADDR_NO_RANDOMIZE)`, kept across fork and exec).
pub fn fix_layout() -> io::Result<()> {
    // SAFETY: personality takes an integer by value. It returns the previous persona, or
    // -1 with errno on failure.
    let previous = unsafe { libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong) };
    if previous == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The nice value of background work: it yields the CPU to everything at the default 0.
pub const BACKGROUND_NICE: libc::c_int = 19;

/// Sets the nice value of one thread (`tid`; 0 is the calling thread) or, for a process's
/// main thread, of the process as its children will inherit it. Raising priority back
/// needs CAP_SYS_NICE.
pub fn set_nice(tid: libc::pid_t, nice: libc::c_int) -> io::Result<()> {
    // SAFETY: setpriority takes integers by value and touches no memory of this process.
    // The `which` argument's C type differs between libcs, hence the inferred cast.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS as _, tid as libc::id_t, nice) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The nice value of thread `tid` (0: the calling thread).
pub fn nice(tid: libc::pid_t) -> io::Result<libc::c_int> {
    // getpriority may legitimately return -1: errno tells.
    // SAFETY: errno is this thread's; the call takes integers by value.
    unsafe {
        *libc::__errno_location() = 0;
        let r = libc::getpriority(libc::PRIO_PROCESS as _, tid as libc::id_t);
        match *libc::__errno_location() {
            0 => Ok(r),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }
}

/// Marks every fd from `first` up close-on-exec (`CLOSE_RANGE_CLOEXEC`), so nothing the
/// process happened to hold crosses execve. Async-signal-safe.
pub fn cloexec_from(first: libc::c_uint) -> io::Result<()> {
    // SAFETY: plain syscall with integer arguments.
    check(unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    })
    .map(drop)
}

/// Closes every fd from `first` up. Async-signal-safe.
pub fn close_from(first: libc::c_uint) -> io::Result<()> {
    // SAFETY: plain syscall with integer arguments; the caller owns no Rust handles to
    // the fds closed (it runs in a fresh child or deliberately drops inheritance).
    check(unsafe { libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0) }).map(drop)
}

/// Whether this process has one thread (then a child of its clone may run any code, not
/// only async-signal-safe calls). False when it cannot be told.
pub fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|tasks| tasks.take(2).count() == 1)
}

/// Rewrites this process's command line to `title` (NUL-separated arguments) and blanks
/// its environment strings, in the memory the kernel shows as /proc/PID/cmdline and
/// environ: a clone that runs other code than its parent's `main` (see
/// `sandbox::clone_directly`) then shows what it is, and nothing of the parent's arguments
/// or environment stays in it. The arguments' area only shrinks: a longer title is cut.
///
/// # Safety
/// Single-threaded process only, and nothing may use the old argument or environment
/// strings afterwards (they are overwritten in place).
pub unsafe fn retitle(title: &[u8]) -> io::Result<()> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    // Fields 48 to 51 of proc(5) (arg_start, arg_end, env_start, env_end); `rest`
    // starts at field 3.
    let field = |n: usize| -> io::Result<usize> {
        rest.split_whitespace()
            .nth(n - 3)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| io::Error::other("no such field in /proc/self/stat"))
    };
    let (arg_start, arg_end) = (field(48)?, field(49)?);
    let (env_start, env_end) = (field(50)?, field(51)?);
    if arg_end <= arg_start || env_end < env_start {
        return Err(io::Error::other("an empty argument area"));
    }
    let room = arg_end - arg_start - 1;
    let n = title.len().min(room);
    // SAFETY: both areas are this process's own argument and environment strings,
    // mapped and writable (the initial stack); the caller guarantees that no other thread
    // runs and that nothing reads the old strings again.
    unsafe {
        let args = arg_start as *mut u8;
        std::ptr::copy_nonoverlapping(title.as_ptr(), args, n);
        std::ptr::write_bytes(args.add(n), 0, arg_end - arg_start - n);
        std::ptr::write_bytes(env_start as *mut u8, 0, env_end - env_start);
    }
    Ok(())
}

/// `pivot_root(new_root, put_old)`.
pub fn pivot_root(new_root: &CStr, put_old: &CStr) -> io::Result<()> {
    // SAFETY: both pointers are valid NUL-terminated strings for the call's duration.
    check(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) }).map(drop)
}

/// Capability sets (`struct __user_cap_data_struct`, version 3 has two of them).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The kernel's `struct mount_attr` (linux/mount.h), version 0.
#[repr(C)]
#[derive(Debug, Default)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Makes the mount at `path` and every mount beneath it read-only, nosuid and nodev:
/// `mount_setattr(2)` with `AT_RECURSIVE` (Linux >= 5.12; `ENOSYS` before).
pub fn make_tree_readonly(path: &CStr) -> io::Result<()> {
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const MOUNT_ATTR_NOSUID: u64 = 0x2;
    const MOUNT_ATTR_NODEV: u64 = 0x4;
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        ..MountAttr::default()
    };
    // SAFETY: `path` is NUL-terminated and `attr` a live `struct mount_attr` whose size
    // is passed with it; the kernel only reads both during the call.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// Clears the effective, permitted and inheritable capability sets of this thread.
pub fn clear_capabilities() -> io::Result<()> {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: libc::c_int,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: header and data are the v3 layout the kernel reads; pid 0 is this thread.
    check(unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) }).map(drop)
}

/// The effective capability mask of this thread (for self-checks and tests).
pub fn effective_capabilities() -> io::Result<u64> {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: libc::c_int,
    }
    let header = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: as above; the kernel writes two CapData into `data`.
    check(unsafe { libc::syscall(libc::SYS_capget, &header as *const CapHeader, data.as_mut_ptr()) })?;
    Ok(u64::from(data[0].effective) | (u64::from(data[1].effective) << 32))
}

/// Runs `f` with this thread's filesystem uid and gid set to `id` (its capabilities kept
/// effective), then puts back uid and gid 0. For writing into a sandbox's tmpfs from the
/// host: that tmpfs belongs to the sandbox's user namespace, where the kernel refuses to
/// create an inode for an fsuid the namespace does not map (`EOVERFLOW`), and host root is
/// not mapped there. fsuid and fsgid are per thread: the process's other threads keep
/// theirs. Only for a caller whose fsuid is 0.
pub fn with_fs_ids<T>(id: u32, f: impl FnOnce() -> T) -> io::Result<T> {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: libc::c_int,
    }
    /// Puts fsuid and fsgid back to 0 on every path out, unwinding too.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: setfsuid/setfsgid take integers and only change this thread's
            // filesystem ids; going back to 0 also gives back the filesystem
            // capabilities the kernel took from the effective set.
            unsafe {
                libc::setfsgid(0);
                libc::setfsuid(0);
            }
        }
    }
    let header = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: the v3 header and two CapData the kernel writes into.
    check(unsafe { libc::syscall(libc::SYS_capget, &header as *const CapHeader, data.as_mut_ptr()) })?;
    let restore = Restore;
    // SAFETY: integer arguments; they change this thread's filesystem ids only.
    unsafe {
        libc::setfsgid(id);
        libc::setfsuid(id);
    }
    // setfsuid reports the old value, never an error: ask again (an invalid id changes
    // nothing and returns the current one).
    // SAFETY: as above; u32::MAX is never a valid id, so nothing changes.
    if unsafe { libc::setfsuid(u32::MAX) } as u32 != id {
        return Err(io::Error::other("setfsuid did not take"));
    }
    // Leaving fsuid 0 dropped the filesystem capabilities (CAP_CHOWN, CAP_DAC_OVERRIDE,
    // CAP_FOWNER...) from the effective set: raise them again from the permitted set.
    for d in &mut data {
        d.effective = d.permitted;
    }
    // SAFETY: the v3 layout; pid 0 is this thread; only raises effective within permitted.
    check(unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) })?;
    let out = f();
    drop(restore);
    Ok(out)
}

/// `prctl` with integer arguments, errno as error.
pub fn prctl(option: libc::c_int, arg2: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: every prctl option used by this crate takes integer arguments only.
    let ret = unsafe {
        libc::prctl(
            option,
            arg2,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    check(ret as libc::c_long).map(|r| r as libc::c_int)
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket(2) with constant arguments; the fd is owned below at once.
    let fd = check(unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) as libc::c_long
    })? as RawFd;
    // SAFETY: fd was just created and is owned by nothing else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: SIOCGIFFLAGS reads the name and writes ifru_flags of a valid ifreq.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) as libc::c_long })?;
    // SAFETY: reading and writing the flags member of the union the kernel just filled.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads a valid ifreq.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) as libc::c_long })?;
    Ok(())
}

/// An `ifreq` naming `name` (at most 15 bytes; longer names are cut).
fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().take(libc::IFNAMSIZ - 1).zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    req
}

/// An `AF_INET` datagram socket: the handle the classic interface ioctls take.
fn inet_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the fd is owned below at once.
    let fd = check(unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) as libc::c_long
    })? as RawFd;
    // SAFETY: fd was just created and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes `tun` (an open `/dev/net/tun`) a TUN device named `name` (`IFF_TUN`, no packet
/// information header) and marks it persistent, so that it outlives the fd: it lives as
/// long as the network namespace the fd was opened in. Needs CAP_NET_ADMIN over that
/// namespace.
pub fn tun_create_persistent(tun: std::os::fd::BorrowedFd<'_>, name: &str) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut req = ifreq(name);
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads the name and flags of a valid ifreq and writes the name back.
    check(unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut req) as libc::c_long })?;
    // SAFETY: TUNSETPERSIST takes an integer argument.
    check(unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETPERSIST, 1 as libc::c_ulong) as libc::c_long })
        .map(drop)
}

/// A `sockaddr` holding the IPv4 address `addr` (port 0).
fn sockaddr_v4(addr: std::net::Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(addr.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes) and sockaddr is
    // plain old data: every bit pattern is valid.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// Gives interface `name` the single IPv4 address `addr` (a /32) and brings it up.
pub fn interface_up_with_address(name: &str, addr: std::net::Ipv4Addr) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let sock = inet_socket()?;
    let mut req = ifreq(name);
    req.ifr_ifru.ifru_addr = sockaddr_v4(addr);
    // SAFETY: SIOCSIFADDR reads the name and address of a valid ifreq.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFADDR, &req) as libc::c_long })?;
    // The kernel gave the address its old class's netmask: make it a /32.
    req.ifr_ifru.ifru_netmask = sockaddr_v4(std::net::Ipv4Addr::BROADCAST);
    // SAFETY: SIOCSIFNETMASK reads the name and netmask of a valid ifreq.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFNETMASK, &req) as libc::c_long })?;
    req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads the name and flags of a valid ifreq.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) as libc::c_long }).map(drop)
}

/// The kernel's `struct rtentry` (linux/route.h); the libc crate has it for musl only.
#[repr(C)]
struct RtEntry {
    rt_pad1: libc::c_ulong,
    rt_dst: libc::sockaddr,
    rt_gateway: libc::sockaddr,
    rt_genmask: libc::sockaddr,
    rt_flags: libc::c_ushort,
    rt_pad2: libc::c_short,
    rt_pad3: libc::c_ulong,
    rt_pad4: *mut libc::c_void,
    rt_metric: libc::c_short,
    rt_dev: *mut libc::c_char,
    rt_mtu: libc::c_ulong,
    rt_window: libc::c_ulong,
    rt_irtt: libc::c_ushort,
}

/// Adds the IPv4 default route through interface `name` (no gateway: the interface is
/// point-to-point).
pub fn add_default_route(name: &std::ffi::CStr) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let sock = inet_socket()?;
    let any = sockaddr_v4(std::net::Ipv4Addr::UNSPECIFIED);
    let route = RtEntry {
        rt_pad1: 0,
        rt_dst: any,
        rt_gateway: any,
        rt_genmask: any,
        rt_flags: libc::RTF_UP,
        rt_pad2: 0,
        rt_pad3: 0,
        rt_pad4: std::ptr::null_mut(),
        rt_metric: 0,
        rt_dev: name.as_ptr().cast_mut(),
        rt_mtu: 0,
        rt_window: 0,
        rt_irtt: 0,
    };
    // SAFETY: SIOCADDRT reads a valid rtentry; rt_dev points at a NUL-terminated name
    // that lives for the call (the kernel copies it and never writes through it).
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCADDRT, &route) as libc::c_long }).map(drop)
}

/// Fills `buf` from the kernel's random source.
pub fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most `len - done` bytes into the live buffer.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        done += n as usize;
    }
    Ok(())
}
