//! `airlock doctor`'s micro-VM section. Like the rest of doctor, every line comes from
//! trying: the image is built, KVM was probed by booting a guest under it (the verdict is
//! cached; `--probe-kvm` probes again), and a VM is booted and runs `/bin/true` (unless
//! `--no-boot`). None is required: without micro-VMs, the namespace backend still works.
//! Emulation (TCG) works but is slow: its lines say `slow`, not `ok`.

use airlock_sandbox::doctor::Check;
use airlock_spec::Spec;
use std::time::Instant;

use crate::vm::{HostOptions, MicroVmHost, VmSize};

fn check(name: &'static str, ok: bool, detail: String, fix: &'static str) -> Check {
    Check {
        name,
        ok,
        slow: false,
        required: false,
        detail,
        fix,
    }
}

/// What the micro-VM section tries.
#[derive(Debug, Clone, Copy, Default)]
pub struct DoctorOptions {
    /// Probe KVM again, booting a guest under it, instead of the cached verdict (which is
    /// kept per host kernel, VMM and guest kernel, and probed only when there is none).
    pub probe_kvm: bool,
    /// Skip booting a VM to run `/bin/true` (seconds under emulation).
    pub no_boot: bool,
}

/// How a program ended, in words (`exited 0`, `killed by signal 9`).
fn ending(r: &airlock_spec::ExecResult) -> String {
    match (r.exit_code, r.signal) {
        (Some(code), _) => format!("exited {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => match r.outcome {
            airlock_spec::Outcome::Timeout => "timed out".into(),
            airlock_spec::Outcome::Oom => "was killed at its memory limit".into(),
            _ => "ended without a status".into(),
        },
    }
}

/// Where the guest agent was found (`AIRLOCK_GUEST`, beside `airlock`, under the install
/// prefix's `libexec/airlock`, or `/usr/libexec/airlock`), or every place looked at. Needs
/// no root, so it is shown to every user.
pub fn agent() -> Check {
    match crate::vm::locate_agent() {
        Ok(path) => check("microvm: guest agent", true, path.display().to_string(), ""),
        Err(looked) => check(
            "microvm: guest agent",
            false,
            format!(
                "not found (looked at {})",
                looked
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "make install, the Debian package, or `cargo build -p airlock-guest`; or set AIRLOCK_GUEST",
        ),
    }
}

/// Probes micro-VM readiness.
pub fn run(opts: DoctorOptions) -> Vec<Check> {
    let mut checks = Vec::new();
    if !airlock_sandbox::doctor::is_root() {
        // The image cache, the VMM's cgroup and the KVM probe all need root: trying as
        // another user would only report permission errors with the wrong fixes.
        checks.push(check(
            "microvm",
            false,
            "not checked as this user".into(),
            airlock_sandbox::doctor::NEEDS_ROOT,
        ));
        return checks;
    }
    let options = HostOptions::from_env();
    let t = Instant::now();
    let host = match MicroVmHost::new(&options) {
        Ok(h) => h,
        Err(e) => {
            checks.push(check(
                "microvm",
                false,
                format!("{e:#}"),
                "apt-get install qemu-system-x86 squashfs-tools; build airlock-guest",
            ));
            return checks;
        }
    };
    let (name, version) = host.vmm();
    checks.push(check("microvm: VMM", true, format!("{name}: {version}"), ""));
    let image = host.image();
    let rootfs_mb = std::fs::metadata(&image.rootfs).map_or(0, |m| m.len() >> 20);
    let times = host.prepare_times();
    checks.push(check(
        "microvm: guest image",
        true,
        format!(
            "kernel {}, rootfs {} MB ({}), ready in {} ms (rootfs build {} ms, freshness check {} ms)",
            image.kernel_release,
            rootfs_mb,
            image.rootfs.display(),
            t.elapsed().as_millis(),
            times.rootfs_build_ms,
            times.rootfs_check_ms
        ),
        "",
    ));
    let (drives, bytes) = crate::image::cached_image_drives(&options.cache);
    checks.push(check(
        "microvm: image drives",
        true,
        format!(
            "{drives} cached in {} ({} MB): an OCI image's squashfs, built on its digest's first micro-VM",
            options.cache.join(crate::image::IMAGES_DIR).display(),
            bytes >> 20
        ),
        "",
    ));
    // The verdict the host chose from its cache (probed when there was none), or a
    // fresh probe when asked: under a /dev/kvm that cannot boot a guest the probe waits
    // for its timeout, seconds every time.
    let (accel, reason) = if opts.probe_kvm {
        crate::accel::choose(&host.probe_kvm(&options.cache))
    } else {
        let (accel, reason) = host.accel();
        (
            accel,
            format!("{reason} (cached; `airlock doctor --probe-kvm` probes again)"),
        )
    };
    let emulated = accel == crate::vmm::Accel::Tcg;
    let mut line = check(
        "microvm: accelerator",
        true,
        format!("{}: {reason}", accel.as_str().to_uppercase()),
        if emulated {
            "software emulation: micro-VMs work, seconds per boot instead of a fraction; a /dev/kvm that boots guests makes them fast"
        } else {
            ""
        },
    );
    line.slow = emulated;
    checks.push(line);
    if opts.no_boot {
        return checks;
    }
    let t = Instant::now();
    let spec = Spec::new(vec!["/bin/true".into()]);
    let booted = host.boot(VmSize::for_limits(&spec.limits));
    match booted {
        Ok(mut vm) => {
            let boot_ms = vm.boot_time().as_millis();
            let info = vm.guest_info().clone();
            let run = vm.run(&spec, &mut airlock_sandbox::Capture, &[]);
            drop(vm);
            let ok = run.as_ref().is_ok_and(|r| r.exit_code == Some(0));
            let landlock = if info.landlock_abi >= 4 {
                format!("landlock ABI {}", info.landlock_abi)
            } else {
                let devices = if info.net_devices.is_empty() {
                    "none".to_owned()
                } else {
                    info.net_devices.join(", ")
                };
                format!(
                    "landlock ABI {} (no TCP rules; moot: the VM has no network device; interfaces: {devices})",
                    info.landlock_abi
                )
            };
            let mut line = check(
                "microvm: boot + run",
                ok,
                match run {
                    Ok(r) => format!(
                        "cold boot {boot_ms} ms (guest kernel start to /init {} ms, modules loaded {} ms, agent ready {} ms), /bin/true {}, {} ms in all; guest kernel {}, {landlock}",
                        info.init_ms,
                        info.modules_ms,
                        info.boot_ms,
                        ending(&r),
                        t.elapsed().as_millis(),
                        info.kernel
                    ),
                    Err(e) => format!("booted in {boot_ms} ms, but the run failed: {e}"),
                },
                "see the guest console in the error",
            );
            line.slow = ok && emulated;
            if ok {
                // The accelerator line says why it is slow.
                line.fix = "";
            }
            checks.push(line);
        }
        Err(e) => checks.push(check(
            "microvm: boot + run",
            false,
            format!("{e}"),
            "see the guest console in the error",
        )),
    }
    checks
}
