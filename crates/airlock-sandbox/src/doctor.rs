//! `airlock doctor`: what this host provides and what airlock will use, one check each.
//! Every probe tries the feature rather than trusting a file's presence.

use std::path::Path;

use crate::cgroup::{CgroupError, CgroupHost, CgroupParent};

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// Whether it is present and usable.
    pub ok: bool,
    /// Usable, but through a slower fallback (a micro-VM emulated with TCG): reported as
    /// `slow`, not `ok`.
    pub slow: bool,
    /// Whether airlock refuses to run without it.
    pub required: bool,
    /// What was found.
    pub detail: String,
    /// How to fix it when missing (or slow).
    pub fix: &'static str,
}

impl Check {
    /// The state column of the report: `ok`, `slow`, `warn` (an optional feature is
    /// missing) or `FAIL` (a required one is).
    pub fn mark(&self) -> &'static str {
        match (self.ok, self.slow, self.required) {
            (true, false, _) => "ok",
            (true, true, _) => "slow",
            (false, _, true) => "FAIL",
            (false, _, false) => "warn",
        }
    }
}

fn check(name: &'static str, required: bool, ok: bool, detail: String, fix: &'static str) -> Check {
    Check {
        name,
        ok,
        slow: false,
        required,
        detail,
        fix,
    }
}

/// What to do when a probe failed only because this is not root.
pub const NEEDS_ROOT: &str = "needs root: run `sudo airlock doctor`";

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// An error and its causes, `: `-separated.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Probes the host.
pub fn run() -> Vec<Check> {
    let root = is_root();
    let mut checks = preflight_lines(root);

    // Where sandbox cgroups go: under this process's delegated cgroup (so the limits of
    // its unit or container bound them), or at each hierarchy's root. An ordinary user
    // with no delegated cgroup gets a FAIL here, and the rest of the cgroup lines as the
    // hierarchies' roots show them.
    let (detected, parent) = match CgroupHost::detect() {
        Err(e @ CgroupError::NotDelegated { .. }) => (
            CgroupHost::detect_with(&CgroupParent::Root),
            Some(check(
                "cgroup parent",
                true,
                false,
                e.to_string(),
                "delegate a cgroup to this user (systemd Delegate=yes, or v1 directories chowned by root): see docs/cgroups.md",
            )),
        ),
        Ok(host) => {
            let parent = match host.check_usable() {
                Ok(()) => check("cgroup parent", true, true, host.describe_parent(), ""),
                Err(e) => check(
                    "cgroup parent",
                    true,
                    false,
                    format!("{}: {}", host.describe_parent(), with_causes(&e)),
                    "give airlock a cgroup it may write with memory, pids and cpu: see docs/cgroups.md",
                ),
            };
            (Ok(host), Some(parent))
        }
        Err(e) => (Err(e), None),
    };
    match detected {
        Err(e) if !root => {
            checks.push(check(
                "cgroups",
                true,
                false,
                format!("not checked as this user: {e}"),
                NEEDS_ROOT,
            ));
            checks.extend(parent);
        }
        Ok(host) => {
            checks.push(check("cgroups", true, true, host.describe(), ""));
            checks.extend(parent);
            checks.push(check(
                "cgroup.kill",
                false,
                host.has_kill(),
                if host.has_kill() {
                    "present".into()
                } else {
                    "absent: freezer + SIGKILL fallback".into()
                },
                "Linux >= 5.14 with a cgroup2 mount",
            ));
            let freezer = host.freezer();
            checks.push(check(
                "pause (freezer)",
                false,
                freezer.is_some(),
                match freezer {
                    Some(how) => format!("sessions are paused with the {how}"),
                    None => "no cgroup.freeze and no v1 freezer: pausing a session is refused".into(),
                },
                "Linux >= 5.2 with a cgroup2 mount, or the v1 freezer controller mounted",
            ));
            if !host.is_v2() {
                // Joining a v1 cgroup write-locks a global rwsem, which waits for an RCU
                // grace period unless a cgroup hierarchy is mounted with favordynmods.
                let fast = std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
                    m.lines()
                        .any(|l| l.contains(" - cgroup") && l.contains("favordynmods"))
                });
                checks.push(check(
                    "cgroup v1 attach",
                    false,
                    fast,
                    if fast {
                        "favordynmods: joining v1 cgroups is fast".into()
                    } else {
                        "each sandbox waits an RCU grace period (~5-15 ms) to join its v1 cgroups".into()
                    },
                    "mount -o remount,favordynmods /sys/fs/cgroup/unified (or move the host to cgroup v2)",
                ));
            }
        }
        Err(e) => checks.push(check(
            "cgroups",
            true,
            false,
            e.to_string(),
            "mount cgroup2 at /sys/fs/cgroup, or the v1 memory, pids and cpu controllers",
        )),
    }

    let abi = crate::landlock::kernel_abi();
    let extras = match abi {
        0 => "off",
        1..=3 => "filesystem rules",
        4 | 5 => "filesystem + TCP rules",
        _ => "filesystem + TCP rules + signal/abstract-socket scoping",
    };
    checks.push(check(
        "landlock",
        true,
        abi >= 1,
        format!("ABI {abi}: {extras}"),
        "Linux >= 5.13 with landlock in the lsm= boot parameter",
    ));

    // clone3 with a zero size fails with EINVAL where it exists and ENOSYS where not.
    // SAFETY: a null pointer with size 0 is rejected by the kernel before any access.
    let clone3 = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
    let has_clone3 = clone3 == -1 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS);
    checks.push(check(
        "clone3 + CLONE_INTO_CGROUP",
        false,
        has_clone3,
        if has_clone3 {
            "present".into()
        } else {
            "absent: clone(2) + cgroup.procs fallback".into()
        },
        "Linux >= 5.7",
    ));

    let pidfd = crate::sys::pidfd_open(std::process::id() as libc::pid_t).is_ok();
    checks.push(check(
        "pidfd",
        true,
        pidfd,
        if pidfd { "present".into() } else { "absent".into() },
        "Linux >= 5.3",
    ));

    checks.push(proxy_mode(root));

    let kvm = Path::new("/dev/kvm");
    let opened = std::fs::OpenOptions::new().read(true).write(true).open(kvm);
    checks.push(match opened {
        Ok(_) => check(
            "/dev/kvm",
            false,
            true,
            "openable (used by the micro-VM backend, not by namespaces)".into(),
            "",
        ),
        Err(e) if kvm.exists() && !root => check(
            "/dev/kvm",
            false,
            false,
            format!("present, but this user cannot open it ({e})"),
            NEEDS_ROOT,
        ),
        Err(e) if kvm.exists() => check(
            "/dev/kvm",
            false,
            false,
            format!("present, but not openable ({e})"),
            "check the device's permissions and that no security module denies it",
        ),
        Err(_) => check(
            "/dev/kvm",
            false,
            false,
            "absent: micro-VMs are emulated (TCG), much slower".into(),
            "enable virtualization and load kvm_intel or kvm_amd",
        ),
    });
    let watched = crate::fanotify::probe();
    checks.push(check(
        "files_changed watch",
        false,
        watched.is_ok(),
        match watched {
            Ok(()) => "fanotify marks tmpfs: an exec that changed no file is not walked again".into(),
            Err(e) if !root => format!("not checked as this user ({e})"),
            Err(e) => format!("{e}: every exec's files are walked after the program too"),
        },
        "Linux >= 6.7 (tmpfs with a filesystem id, fanotify with file ids)",
    ));
    checks
}

/// The namespace tier's preflight (see `preflight`), one line per check: the same
/// verdicts, in the same words, as the refusal of `airlock run` and `airlock serve`.
fn preflight_lines(root: bool) -> Vec<Check> {
    let (probes, took) = crate::preflight::report();
    let failed = probes.iter().filter(|p| p.result.is_err()).count();
    let required_failed = probes
        .iter()
        .any(|p| p.result.is_err() && !p.name.starts_with("/dev/net/tun"));
    let mut lines = vec![check(
        "preflight",
        true,
        !required_failed,
        format!(
            "{} checks in {:.1} ms{}; {}",
            probes.len(),
            took.as_secs_f64() * 1e3,
            if failed > 0 {
                format!(", {failed} failed")
            } else {
                String::new()
            },
            if root {
                "as root: each sandbox gets its own host uid range".to_owned()
            } else {
                format!(
                    "rootless, as uid {}: every sandbox runs as this one host uid (docs/rootless.md)",
                    // SAFETY: geteuid has no preconditions.
                    unsafe { libc::geteuid() }
                )
            }
        ),
        "",
    )];
    for p in probes {
        // The landlock line below says more (which ABI's rules apply).
        if p.name == "landlock" {
            continue;
        }
        let required = !p.name.starts_with("/dev/net/tun");
        lines.push(match p.result {
            Ok(found) => check(p.name, required, true, found, ""),
            Err(missing) => check(p.name, required, false, missing.to_string(), ""),
        });
    }
    lines
}

/// Proxy mode's kernel features (see `netns`), tried for real on a thread of its own in a
/// network namespace of its own, which dies with the thread: a TUN device with the
/// default route through it, and the redirect rules.
fn proxy_mode(root: bool) -> Check {
    const NAME: &str = "proxy mode: TUN + nf_tables";
    if !root {
        return check(NAME, false, false, "not probed".into(), NEEDS_ROOT);
    }
    let probe = std::thread::spawn(|| -> Result<(), String> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("a network namespace: {e}"))?;
        let tun = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .map_err(|e| format!("/dev/net/tun: {e}"))?;
        crate::netns::route_to_proxy(tun.into(), &crate::egress::setup(None))
    })
    .join()
    .unwrap_or_else(|_| Err("the probe panicked".into()));
    match probe {
        Ok(()) => check(
            NAME,
            false,
            true,
            "a TUN device and the redirect rules work (used by --net proxy)".into(),
            "",
        ),
        Err(e) => check(
            NAME,
            false,
            false,
            format!("--net proxy cannot run: {e}"),
            "a kernel with TUN and nf_tables (nat, redirect, reject) built in or as modules",
        ),
    }
}

#[cfg(test)]
mod tests {
    /// The probes of snapshots' features answer (as root, a cgroup host has a freezer; the
    /// fanotify watch needs Linux >= 6.7, so its line is only printed).
    #[test]
    fn pause_and_change_watch_are_reported() {
        let checks = super::run();
        for name in ["pause (freezer)", "files_changed watch"] {
            let c = checks.iter().find(|c| c.name == name).expect(name);
            println!("{name}: {} {}", c.mark(), c.detail);
            assert!(!c.detail.is_empty());
            if super::is_root() && name.starts_with("pause") {
                assert!(c.ok, "{name}: {}", c.detail);
            }
        }
    }
}
