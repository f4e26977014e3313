//! `airlock doctor`'s micro-VM section. Like the rest of doctor, every line comes from
//! trying: the image is built, KVM is probed by booting a guest under it, and a VM is
//! booted and runs `/bin/true`. None is required: without micro-VMs, the namespace
//! backend still works.

use airlock_sandbox::doctor::Check;
use airlock_spec::Spec;
use std::time::Instant;

use crate::vm::{HostOptions, MicroVmHost, VmSize};

fn check(name: &'static str, ok: bool, detail: String, fix: &'static str) -> Check {
    Check {
        name,
        ok,
        required: false,
        detail,
        fix,
    }
}

/// Probes micro-VM readiness.
pub fn run() -> Vec<Check> {
    let options = HostOptions::from_env();
    let mut checks = Vec::new();
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
            "kernel {}, rootfs {} MB ({}), prepared in {} ms (rootfs build {} ms, freshness check {} ms)",
            image.kernel_release,
            rootfs_mb,
            image.rootfs.display(),
            t.elapsed().as_millis(),
            times.rootfs_build_ms,
            times.rootfs_check_ms
        ),
        "",
    ));
    let verdict = host.probe_kvm(&options.cache);
    let (accel, reason) = crate::accel::choose(&verdict);
    checks.push(check(
        "microvm: accelerator",
        true,
        format!("{}: {reason}", accel.as_str().to_uppercase()),
        "",
    ));
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
                format!(
                    "landlock ABI {} (no TCP rules; moot: the VM has no network device, interfaces {:?})",
                    info.landlock_abi, info.net_devices
                )
            };
            checks.push(check(
                "microvm: boot + run",
                ok,
                match run {
                    Ok(r) => format!(
                        "cold boot {boot_ms} ms (guest kernel start to /init {} ms, modules loaded {} ms, agent ready {} ms), /bin/true exited {:?}, {} ms in all; guest kernel {}, {landlock}",
                        info.init_ms,
                        info.modules_ms,
                        info.boot_ms,
                        r.exit_code,
                        t.elapsed().as_millis(),
                        info.kernel
                    ),
                    Err(e) => format!("booted in {boot_ms} ms, but the run failed: {e}"),
                },
                "see the guest console in the error",
            ));
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
