//! Preflight: check that the host gives
//! what the tier needs, each by trying it, and refuse with one line naming what is missing
//! and how to enable it (`airlock: cannot isolate: <what>: <how>`) instead of failing
//! half-way through a sandbox, or running one weaker than asked.
//!
//! The checks, in order (the first failure is the one reported):
//! 1. as root: the capabilities the supervisor and init use (a container may lack some);
//! 2. in a short-lived child cloned into new user, mount, pid, net, ipc and uts namespaces
//!    (the sandbox's own set), with the id map a sandbox gets written by this process:
//!    user namespaces creatable and mappable, each other namespace, a private mount tree,
//!    a tmpfs, proc mounted in the new pid namespace (a container's masked /proc blocks
//!    it), and a seccomp filter installed;
//! 3. landlock (ABI >= 1);
//! 4. a cgroup of memory, pids and CPU made where [`CgroupHost::create`] makes sandboxes'
//!    (a delegated parent for an ordinary user), a process moved into it, and removed.
//!
//! Proxy mode (`--net proxy`) also needs /dev/net/tun openable ([`require_proxy`]).
//!
//! [`require`] runs the checks once per process (a few milliseconds; `doctor` prints the
//! figure) and remembers the verdict. A service runs them at start; `airlock run` only
//! once its sandbox failed to build (see `Engine::for_one_run`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, poll};

use crate::cgroup::{CgroupError, CgroupHost, CgroupLimits};

/// What the host lacks: the refusal printed as `airlock: cannot isolate: {what}: {how}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// Which check failed, with the failing call and its errno.
    pub what: String,
    /// How to enable it.
    pub how: String,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot isolate: {}: {}", self.what, self.how)
    }
}

impl std::error::Error for Missing {}

/// One check's verdict, for `doctor`.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The check's name (`user namespaces`, `proc`, ...).
    pub name: &'static str,
    /// What was found, or what is missing.
    pub result: Result<String, Missing>,
}

/// Whether this process is an ordinary user's (then sandboxes run rootless: see
/// `docs/rootless.md`).
pub fn rootless() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() != 0 }
}

/// Runs the namespace tier's checks once per process (later calls return the first
/// verdict): `Err` names the first thing missing.
/// `cgroups` is the detected layout, or why none was found.
pub fn require(cgroups: Result<&CgroupHost, &CgroupError>) -> Result<(), Missing> {
    static VERDICT: OnceLock<Result<(), Missing>> = OnceLock::new();
    VERDICT
        .get_or_init(|| {
            for probe in run(cgroups, true).0 {
                probe.result?;
            }
            Ok(())
        })
        .clone()
}

/// Proxy mode's extra need, checked once per process: /dev/net/tun, opened the way a
/// sandbox's first process opens it (with this process's credentials).
pub fn require_proxy() -> Result<(), Missing> {
    static VERDICT: OnceLock<Result<(), Missing>> = OnceLock::new();
    VERDICT.get_or_init(|| tun().map(drop)).clone()
}

/// Every check, none skipped after a failure, and how long they took (for `doctor`).
pub fn report() -> (Vec<Probe>, Duration) {
    let t0 = Instant::now();
    let host = CgroupHost::detect();
    let (mut probes, _) = run(host.as_ref(), false);
    probes.push(Probe {
        name: "/dev/net/tun (--net proxy)",
        result: tun(),
    });
    (probes, t0.elapsed())
}

/// The checks in order; with `stop`, none after the first failure. The flag returned
/// says whether it stopped.
fn run(cgroups: Result<&CgroupHost, &CgroupError>, stop: bool) -> (Vec<Probe>, bool) {
    let (mut probes, stopped) = run_without_cgroups(stop);
    if !stopped {
        probes.push(Probe {
            name: "cgroup limits",
            result: cgroups.map_err(detect_missing).and_then(cgroup),
        });
    }
    (probes, stopped)
}

fn run_without_cgroups(stop: bool) -> (Vec<Probe>, bool) {
    let mut probes = Vec::new();
    macro_rules! push {
        ($name:expr, $result:expr) => {
            let result = $result;
            let failed = result.is_err();
            probes.push(Probe {
                name: $name,
                result,
            });
            if failed && stop {
                return (probes, true);
            }
        };
    }
    if !rootless() {
        push!("capabilities", capabilities());
    }
    for (name, result) in namespaces() {
        push!(name, result);
    }
    push!("landlock", landlock());
    (probes, false)
}

/// `CapEff` of /proc/self/status as a mask.
fn capability_effective() -> io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or_else(|| io::Error::other("no CapEff in /proc/self/status"))
}

/// The capabilities root needs in its effective set, as measured in a container whose
/// capabilities were all dropped but these (the container helper's finding: each one's
/// absence fails every sandbox): CHOWN (the program's pipes), SETUID and SETGID (the
/// uid and gid maps), SYS_ADMIN (the runtime's seccomp profile allows namespaces only
/// with it; cgroup mounts), SYS_PTRACE (the sandbox's files reached through
/// /proc/<init>/root). What init needs inside its own namespace is tried by the
/// namespace probe itself.
const ROOT_CAPS: [(u32, &str); 5] = [
    (0, "CAP_CHOWN"),
    (6, "CAP_SETGID"),
    (7, "CAP_SETUID"),
    (19, "CAP_SYS_PTRACE"),
    (21, "CAP_SYS_ADMIN"),
];

fn capabilities() -> Result<String, Missing> {
    let eff = capability_effective().map_err(|e| Missing {
        what: format!("the capability sets (reading /proc/self/status: {e})"),
        how: "mount a proc filesystem at /proc".into(),
    })?;
    let missing: Vec<&str> = ROOT_CAPS
        .iter()
        .filter(|(cap, _)| eff & (1 << cap) == 0)
        .map(|(_, name)| *name)
        .collect();
    if missing.is_empty() {
        return Ok("root with the capabilities the namespace tier uses".into());
    }
    Err(Missing {
        what: format!(
            "capabilit{} {} (not in this root process's effective set, as a container drops them)",
            if missing.len() == 1 { "y" } else { "ies" },
            missing.join(", ")
        ),
        how: format!(
            "give the container {} (podman/docker {}; see docs/container.md)",
            missing.join(", "),
            missing
                .iter()
                .map(|n| format!("--cap-add {}", n.trim_start_matches("CAP_")))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    })
}

fn landlock() -> Result<String, Missing> {
    match crate::landlock::kernel_abi() {
        0 => Err(Missing {
            what: format!(
                "landlock (landlock_create_ruleset: {})",
                io::Error::last_os_error()
            ),
            how: "Linux >= 5.13 with landlock in the lsm= boot parameter (in a container: a seccomp profile that allows the landlock_* calls)".into(),
        }),
        abi => Ok(format!("ABI {abi}")),
    }
}

/// A steps of the namespace probe, as the child reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Step {
    Ok = 0,
    MakePrivate = 1,
    Tmpfs = 2,
    Proc = 3,
    NoNewPrivs = 4,
    Seccomp = 5,
    Sync = 6,
}

impl Step {
    fn of(b: u8) -> Step {
        match b {
            0 => Step::Ok,
            1 => Step::MakePrivate,
            2 => Step::Tmpfs,
            3 => Step::Proc,
            4 => Step::NoNewPrivs,
            5 => Step::Seccomp,
            _ => Step::Sync,
        }
    }
}

/// The namespaces a sandbox is cloned into (see `sandbox::NAMESPACES`).
const NAMESPACES: [(libc::c_int, &str); 5] = [
    (libc::CLONE_NEWNS, "mount"),
    (libc::CLONE_NEWPID, "pid"),
    (libc::CLONE_NEWNET, "network"),
    (libc::CLONE_NEWIPC, "ipc"),
    (libc::CLONE_NEWUTS, "uts"),
];

/// How long the probe child may take (it takes about a millisecond).
const PROBE_DEADLINE: Duration = Duration::from_secs(10);

fn errno_text(errno: i32) -> String {
    io::Error::from_raw_os_error(errno).to_string()
}

fn sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// AppArmor's restriction of unprivileged user namespaces (Ubuntu 23.10 and later): the
/// namespace is created, but its process holds no capability in it.
fn apparmor_restricts() -> bool {
    rootless() && sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1")
}

const APPARMOR_FIX: &str = "allow airlock user namespaces with an AppArmor profile (/etc/apparmor.d/airlock: `abi <abi/4.0>, include <tunables/global> profile airlock /usr/local/bin/airlock flags=(unconfined) { userns, }`, then `apparmor_parser -r /etc/apparmor.d/airlock`), or `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`";

/// The refusal for a failed `clone(CLONE_NEWUSER)`.
fn userns_missing(errno: i32) -> Missing {
    let max = sysctl("/proc/sys/user/max_user_namespaces");
    let clone = sysctl("/proc/sys/kernel/unprivileged_userns_clone");
    let call = format!("clone(CLONE_NEWUSER): {}", errno_text(errno));
    let (what, how) = match errno {
        libc::ENOSPC => (
            format!(
                "user namespaces ({call}; user.max_user_namespaces = {})",
                max.as_deref().unwrap_or("?")
            ),
            "raise the limit: `sysctl -w user.max_user_namespaces=15000` (as root; inside a user namespace, its own limit, which its owner sets)".to_owned(),
        ),
        libc::EPERM if rootless() && clone.as_deref() == Some("0") => (
            format!("unprivileged user namespaces ({call}; kernel.unprivileged_userns_clone = 0)"),
            "`sysctl -w kernel.unprivileged_userns_clone=1` (as root; persist it in /etc/sysctl.d/)".to_owned(),
        ),
        libc::EPERM if apparmor_restricts() => (
            format!("unprivileged user namespaces ({call}; kernel.apparmor_restrict_unprivileged_userns = 1)"),
            APPARMOR_FIX.to_owned(),
        ),
        libc::EPERM => (
            format!("user namespaces ({call})"),
            "a seccomp profile or security module refuses them: in a container, run it with a seccomp profile that allows clone/unshare of user namespaces (podman/docker --security-opt seccomp=unconfined; see docs/container.md)".to_owned(),
        ),
        libc::EUSERS => (
            format!("user namespaces ({call}: nested 32 deep already)"),
            "run airlock in a shallower user namespace".to_owned(),
        ),
        _ => (
            format!("user namespaces ({call})"),
            "a kernel built with CONFIG_USER_NS".to_owned(),
        ),
    };
    Missing { what, how }
}

/// Clones a child with `flags` that exits at once; the errno of a failed clone.
fn try_clone(flags: libc::c_int) -> Result<(), i32> {
    // SAFETY: the child only calls _exit, which is async-signal-safe.
    match unsafe { crate::sys::clone_process(flags as u64, None) } {
        // SAFETY: in the child, which only leaves at once.
        Ok(None) => unsafe { libc::_exit(0) },
        Ok(Some(c)) => {
            reap(c.pid);
            Ok(())
        }
        Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

fn reap(pid: libc::pid_t) -> Option<i32> {
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child; status is a local.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        if r == pid {
            return Some(status);
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

/// Why a clone into all of the sandbox's namespaces failed: the first namespace that
/// cannot be made.
fn namespace_missing(errno: i32) -> (&'static str, Missing) {
    if let Err(e) = try_clone(libc::CLONE_NEWUSER) {
        return ("user namespaces", userns_missing(e));
    }
    for (flag, name) in NAMESPACES {
        if let Err(e) = try_clone(libc::CLONE_NEWUSER | flag) {
            return (
                "namespaces",
                Missing {
                    what: format!("a {name} namespace (clone: {})", errno_text(e)),
                    how: format!(
                        "a kernel with {name} namespaces and no security policy refusing them (in a container: --security-opt seccomp=unconfined)"
                    ),
                },
            );
        }
    }
    (
        "namespaces",
        Missing {
            what: format!("the sandbox's namespaces (clone: {})", errno_text(errno)),
            how: "a kernel with user, mount, pid, net, ipc and uts namespaces".into(),
        },
    )
}

/// The id map a sandbox gets, as (setgroups, uid_map, gid_map) contents.
pub(crate) fn id_maps(host_base: u32) -> (Option<&'static str>, String, String) {
    if rootless() {
        // SAFETY: getegid/geteuid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let id = crate::mounts::SANDBOX_ID;
        (Some("deny"), format!("{id} {uid} 1\n"), format!("{id} {gid} 1\n"))
    } else {
        let map = format!("0 {host_base} {}\n", crate::mounts::SANDBOX_ID + 1);
        (None, map.clone(), map)
    }
}

/// Writes the id maps of the user namespace of `pid` (see [`id_maps`]).
pub(crate) fn write_id_maps(pid: libc::pid_t, host_base: u32) -> Result<(), String> {
    let (setgroups, uid_map, gid_map) = id_maps(host_base);
    let write = |file: &str, text: &str| {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, text).map_err(|e| format!("writing {:?} to {path}: {e}", text.trim()))
    };
    if let Some(s) = setgroups {
        // An unprivileged writer may map gids only once setgroups is denied.
        write("setgroups", s)?;
    }
    write("uid_map", &uid_map)?;
    write("gid_map", &gid_map)
}

/// The masked paths of this process's /proc: mounts at or under /proc/<something>, as a
/// container runtime places over /proc/kcore, /proc/keys... The kernel refuses a new proc
/// mount in a user namespace while one of them hides part of the existing one.
fn masked_proc() -> Vec<String> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        // binfmt_misc sits on a permanently empty directory, which the kernel allows.
        .filter(|p| p.starts_with("/proc/") && *p != "/proc/sys/fs/binfmt_misc")
        .map(str::to_owned)
        .collect()
}

/// The namespace probe (see the module docs): one verdict per check.
fn namespaces() -> Vec<(&'static str, Result<String, Missing>)> {
    let all = libc::CLONE_NEWUSER | NAMESPACES.iter().fold(0, |acc, (f, _)| acc | f);
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC);
    let (Ok((go_r, go_w)), Ok((report_r, report_w))) = (pipe(), pipe()) else {
        return vec![(
            "namespaces",
            Err(Missing {
                what: format!("pipes for the namespace probe ({})", io::Error::last_os_error()),
                how: "raise this process's open-file limit".into(),
            }),
        )];
    };
    let raw: [RawFd; 4] = [
        go_r.as_raw_fd(),
        go_w.as_raw_fd(),
        report_r.as_raw_fd(),
        report_w.as_raw_fd(),
    ];
    // SAFETY: the child runs `probe_child`, which makes only raw syscalls on constants and
    // the fds above, and ends with _exit: fine in the child of a multi-threaded process.
    let cloned = unsafe { crate::sys::clone_process(all as u64, None) };
    let child = match cloned {
        // SAFETY: in the child; `probe_child`'s contract is the clone's (see above).
        Ok(None) => unsafe { probe_child(raw) },
        Ok(Some(c)) => c,
        Err(e) => {
            let (name, missing) = namespace_missing(e.raw_os_error().unwrap_or(libc::EIO));
            return vec![(name, Err(missing))];
        }
    };
    drop(go_r);
    drop(report_w);
    let mut verdicts = vec![];
    let ids = write_id_maps(child.pid, crate::sandbox::HOST_UID_BASE);
    let userns = match ids {
        Ok(()) => Ok(if rootless() {
            "created; this user's uid and gid mapped to the sandbox user".to_owned()
        } else {
            "created and mapped".to_owned()
        }),
        Err(e) if apparmor_restricts() => Err(Missing {
            what: format!(
                "unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1; {e})"
            ),
            how: APPARMOR_FIX.into(),
        }),
        Err(e) => Err(Missing {
            what: format!("a user namespace's id map ({e})"),
            how: if rootless() {
                "a kernel that lets a user map its own uid (Linux >= 3.19) and no security module refusing it"
                    .into()
            } else {
                format!(
                    "host uids {}.. mapped into this process's user namespace (a container with its own user namespace maps too few: run it without one)",
                    crate::sandbox::HOST_UID_BASE
                )
            },
        }),
    };
    let mapped = userns.is_ok();
    verdicts.push(("user namespaces", userns));
    // With no map the child gets EOF and exits; with one it runs the steps.
    if mapped {
        let _ = nix::unistd::write(&go_w, &[1]);
    }
    drop(go_w);
    let mut buf = [0u8; 5];
    let got = read_report(report_r.as_fd(), &mut buf);
    let _ = crate::sys::pidfd_send_signal(child.pidfd.as_raw_fd(), libc::SIGKILL);
    reap(child.pid);
    if !mapped {
        return verdicts;
    }
    verdicts.push((
        "namespaces",
        Ok("user, mount, pid, net, ipc and uts created".into()),
    ));
    let (step, errno) = if got == 5 {
        (
            Step::of(buf[0]),
            i32::from_ne_bytes([buf[1], buf[2], buf[3], buf[4]]),
        )
    } else {
        (Step::Sync, 0)
    };
    let restricted = errno == libc::EPERM && apparmor_restricts();
    let apparmor = |what: &str| Missing {
        what: format!(
            "unprivileged user namespaces ({what}: {}; kernel.apparmor_restrict_unprivileged_userns = 1)",
            errno_text(errno)
        ),
        how: APPARMOR_FIX.into(),
    };
    let fail = |what: &str, how: &str| {
        if restricted {
            apparmor(what)
        } else {
            Missing {
                what: format!("{what}: {}", errno_text(errno)),
                how: how.into(),
            }
        }
    };
    let tmpfs_ok = Ok("mounted in a new mount namespace".to_owned());
    match step {
        Step::Ok => {
            verdicts.push(("tmpfs", tmpfs_ok));
            verdicts.push(("proc", Ok("mounted in a new pid namespace".into())));
            verdicts.push(("seccomp", Ok("a filter installed".into())));
        }
        Step::MakePrivate | Step::Tmpfs => verdicts.push((
            "tmpfs",
            Err(fail(
                "a tmpfs in a new mount namespace (mount)",
                "a kernel with tmpfs and no security module refusing mounts in a user namespace (in a container: an AppArmor/SELinux profile that allows mount, e.g. --security-opt apparmor=unconfined)",
            )),
        )),
        Step::Proc => {
            verdicts.push(("tmpfs", tmpfs_ok));
            let masked = masked_proc();
            let missing = if errno == libc::EPERM && !masked.is_empty() {
                Missing {
                    what: format!(
                        "proc in a new pid namespace (mount: {}; this /proc has paths mounted over it: {})",
                        errno_text(errno),
                        masked.join(", ")
                    ),
                    how: "an unmasked /proc: run the container with podman --security-opt unmask=/proc/* (docker --security-opt systempaths=unconfined), or mount a fresh proc without overmounts (see docs/container.md)".into(),
                }
            } else {
                fail(
                    "proc in a new pid namespace (mount)",
                    "a /proc with nothing mounted over it and no security module refusing the mount",
                )
            };
            verdicts.push(("proc", Err(missing)));
        }
        Step::NoNewPrivs | Step::Seccomp => {
            verdicts.push(("tmpfs", tmpfs_ok));
            verdicts.push(("proc", Ok("mounted in a new pid namespace".into())));
            verdicts.push((
                "seccomp",
                Err(fail(
                    if step == Step::Seccomp {
                        "seccomp (installing a filter)"
                    } else {
                        "seccomp (no_new_privs)"
                    },
                    "a kernel built with CONFIG_SECCOMP_FILTER (in a container: a seccomp profile that allows seccomp(2) and prctl(PR_SET_SECCOMP))",
                )),
            ));
        }
        Step::Sync => verdicts.push((
            "tmpfs",
            Err(Missing {
                what: "the namespace probe (its child ended without a report)".into(),
                how: "run `airlock doctor` for details".into(),
            }),
        )),
    }
    verdicts
}

/// Reads the child's report (up to `buf.len()` bytes) until EOF or the deadline.
fn read_report(fd: std::os::fd::BorrowedFd<'_>, buf: &mut [u8]) -> usize {
    let deadline = Instant::now() + PROBE_DEADLINE;
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        let ms = left.as_millis().clamp(1, u128::from(u16::MAX)) as u16;
        match poll(&mut fds, ms) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
        match nix::unistd::read(fd, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    got
}

/// The probe's child: pid 1 of its new pid namespace, in its new user namespace. Waits for
/// its id map, then tries each step and writes one 5-byte report (step, errno).
///
/// # Safety
/// Runs in the child of a possibly multi-threaded process: raw syscalls only, on
/// constants, locals and the inherited fds `[go_r, go_w, report_r, report_w]`.
unsafe fn probe_child(fds: [RawFd; 4]) -> ! {
    let [go_r, go_w, report_r, report_w] = fds;
    // SAFETY: see the function's contract; every pointer is a constant C string or a
    // local that lives for the call.
    unsafe {
        let report = |step: Step, errno: i32| report_and_exit(report_w, step, errno);
        let errno = || *libc::__errno_location();
        libc::close(go_w);
        libc::close(report_r);
        let mut go = 0u8;
        if libc::read(go_r, (&mut go as *mut u8).cast(), 1) != 1 {
            libc::_exit(1);
        }
        // Become the namespace's root as a sandbox's first process does (root only: an
        // ordinary user's single mapped id is the sandbox user's, already this one's).
        if libc::geteuid() != crate::mounts::SANDBOX_ID
            && (libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, 0, 0, 0) != 0
                || libc::syscall(libc::SYS_setresuid, 0, 0, 0) != 0)
        {
            report(Step::Sync, errno());
        }
        // Mounts below stay in this namespace: nothing propagates back to the host.
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            report(Step::MakePrivate, errno());
        }
        // /dev exists wherever airlock can run (it opens /dev/null); covered here only.
        if libc::mount(
            c"tmpfs".as_ptr(),
            c"/dev".as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            c"size=64k,mode=0755".as_ptr().cast(),
        ) != 0
        {
            report(Step::Tmpfs, errno());
        }
        if libc::mkdir(c"/dev/proc".as_ptr(), 0o755) != 0 {
            report(Step::Tmpfs, errno());
        }
        if libc::mount(
            c"proc".as_ptr(),
            c"/dev/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        ) != 0
        {
            report(Step::Proc, errno());
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            report(Step::NoNewPrivs, errno());
        }
        // The smallest filter: allow everything.
        let allow = [libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        }];
        let prog = libc::sock_fprog {
            len: 1,
            filter: allow.as_ptr().cast_mut(),
        };
        if libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &prog as *const libc::sock_fprog,
            0,
            0,
        ) != 0
        {
            report(Step::Seccomp, errno());
        }
        report(Step::Ok, 0)
    }
}

/// Writes the probe's 5-byte report and ends the child.
///
/// # Safety
/// As `probe_child`: a raw write and _exit only.
unsafe fn report_and_exit(fd: RawFd, step: Step, errno: i32) -> ! {
    let e = errno.to_ne_bytes();
    let msg = [step as u8, e[0], e[1], e[2], e[3]];
    // SAFETY: `msg` is a local array of the length passed; _exit never returns.
    unsafe {
        libc::write(fd, msg.as_ptr().cast(), msg.len());
        libc::_exit(0)
    }
}

/// What a sandbox's cgroup needs: made where sandboxes' are, limited, joined, removed.
fn cgroup(host: &CgroupHost) -> Result<String, Missing> {
    let id = crate::sandbox::new_id()
        .map(|id| format!("preflight-{id}"))
        .map_err(|e| cgroup_missing(&chain(&e)))?;
    let limits = CgroupLimits {
        memory_bytes: 64 << 20,
        cpus: 0.5,
        pids: 8,
    };
    let cg = host
        .create(&id, &limits)
        .map_err(|e| cgroup_missing(&chain(&e)))?;
    // A process born in it, as a sandbox's init is (`CLONE_INTO_CGROUP` into its
    // cgroup2 directory, which checks the permissions a move would: v2's rule that the
    // writer may write the common ancestor's cgroup.procs). Moving it into the v1
    // directories as well would cost a RCU grace period (about 12 ms here) and check
    // nothing more: a v1 directory this process could make and limit is one it may put
    // its own processes in.
    let child = match unsafe {
        // SAFETY: the child only calls _exit (async-signal-safe).
        crate::sys::clone_process(0, cg.clone_into_fd().map(|f| f.as_raw_fd()))
    } {
        // SAFETY: in the child, which only leaves at once.
        Ok(None) => unsafe { libc::_exit(0) },
        Ok(Some(c)) => c,
        Err(e) => {
            let _ = cg.destroy();
            return Err(cgroup_missing(&format!("starting a process in it: {e}")));
        }
    };
    reap(child.pid);
    let where_ = cg
        .paths()
        .next()
        .and_then(|p| p.parent())
        .and_then(|p| p.parent())
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let destroyed = cg.destroy();
    destroyed.map_err(|e| cgroup_missing(&format!("removing it: {}", chain(&e))))?;
    Ok(format!(
        "memory, pids and cpu limits set under {where_}, a process started in it"
    ))
}

/// An error and its sources, `: `-joined (the errno of a cgroup write is its source).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// The refusal for a host whose cgroups could not be used at all.
fn detect_missing(e: &CgroupError) -> Missing {
    match e {
        // Its own advice is the cgroup module's; the refusal's is this file's (one fix).
        CgroupError::NotDelegated {
            dir, hierarchy, uid, ..
        } => cgroup_missing(&format!(
            "no cgroup is delegated to uid {uid}: {} ({hierarchy}) is not owned by and writable for it",
            dir.display()
        )),
        e => cgroup_missing(&chain(e)),
    }
}

fn cgroup_missing(cause: &str) -> Missing {
    Missing {
        what: format!("a cgroup for the memory, pids and CPU limits ({cause})"),
        how: if rootless() {
            "delegate a cgroup to this user: `systemd-run --user --scope -p Delegate=yes airlock …` (cgroup v2), or on cgroup v1 a directory per controller (memory, pids, cpu; cpuacct, freezer and the unified cgroup2 where mounted) chowned to this user with this shell in it; see docs/rootless.md".into()
        } else {
            "mount the memory, pids and cpu controllers writable (in a container: a cgroup namespace over a delegated cgroup, e.g. podman --cgroupns=private; see docs/container.md)".into()
        },
    }
}

/// /dev/net/tun, opened read-write.
fn tun() -> Result<String, Missing> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
    {
        Ok(_) => Ok("openable".into()),
        Err(e) => Err(Missing {
            what: format!("/dev/net/tun for --net proxy (open: {e})"),
            how: match e.raw_os_error() {
                Some(libc::ENOENT) => "a kernel with TUN (as root, load the tun module), and in a container the device passed in (--device /dev/net/tun)".into(),
                Some(libc::EACCES) if rootless() => "let users open it (`chmod 0666 /dev/net/tun`, as most distributions ship it), or use --net none".into(),
                _ => "make /dev/net/tun openable read-write (in a container: --device /dev/net/tun and a device cgroup rule allowing c 10:200)".into(),
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On this host (root, a full /proc, user namespaces on) every check passes, and the
    /// whole preflight takes milliseconds.
    #[test]
    fn every_check_passes_here_and_quickly() {
        let (probes, took) = report();
        for p in &probes {
            println!("{:<28} {:?}", p.name, p.result);
        }
        println!("preflight took {took:?}");
        if !rootless() {
            for p in &probes {
                assert!(p.result.is_ok(), "{}: {:?}", p.name, p.result);
            }
        }
        let names: Vec<&str> = probes.iter().map(|p| p.name).collect();
        for name in [
            "user namespaces",
            "namespaces",
            "tmpfs",
            "proc",
            "seccomp",
            "landlock",
            "cgroup limits",
        ] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
    }

    /// Where the time goes (printed; `cargo test -p airlock-sandbox --lib preflight --
    /// --nocapture`).
    #[test]
    fn cost_of_each_part() {
        let t = Instant::now();
        let ns = namespaces();
        let t_ns = t.elapsed();
        let t = Instant::now();
        let host = CgroupHost::detect();
        let t_detect = t.elapsed();
        let t = Instant::now();
        let cg = host.as_ref().map_err(detect_missing).map(cgroup);
        let t_cg = t.elapsed();
        println!("cgroup detect {t_detect:?}");
        let t = Instant::now();
        let _ = landlock();
        if !rootless() {
            let _ = capabilities();
        }
        let t_rest = t.elapsed();
        println!(
            "namespaces {t_ns:?} ({} verdicts), cgroup {t_cg:?} ({:?}), the rest {t_rest:?}",
            ns.len(),
            cg.is_ok()
        );
    }

    #[test]
    fn the_refusal_is_one_line_in_the_contract_shape() {
        let m = userns_missing(libc::ENOSPC);
        let line = format!("airlock: {m}");
        assert!(
            line.starts_with("airlock: cannot isolate: user namespaces ("),
            "{line}"
        );
        assert!(line.contains("max_user_namespaces"), "{line}");
        assert!(!line.contains('\n'));
    }
}
