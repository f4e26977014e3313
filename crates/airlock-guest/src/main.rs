//! `airlock-guest`: the `/init` of airlock's micro-VMs.
//!
//! The kernel starts it from the initramfs as PID 1. It loads the virtio and squashfs
//! modules, mounts the read-only rootfs image (the host's system directories) as the new
//! root with fresh /dev, /proc, /sys and cgroup v2 (and, when the VM carries an OCI
//! image's drive, that image, which then is its sandbox's root), finds its virtio-serial
//! port and
//! serves the host's requests there: build a sandbox, write files, run a program, read
//! files, start programs beside the execs (`spawn`), connect to the sandbox's ports. Programs run in airlock-sandbox's engine, exactly as on a host with the
//! namespace backend (user, pid, mount, net, ipc, uts namespaces; seccomp; landlock;
//! cgroup v2 limits), so the VM is a second wall around the first.
//!
//! The same binary is the sandbox's init (the engine re-executes `/proc/self/exe`), hence
//! [`airlock_sandbox::maybe_run_init`] first.

mod agent;
mod boot;
mod egress;
mod files;
mod spawn;
mod sys;

use std::process::ExitCode;

fn main() -> ExitCode {
    airlock_sandbox::maybe_run_init();
    spawn::maybe_run_helper();
    if std::process::id() != 1 {
        eprintln!("airlock-guest is the /init of airlock's micro-VMs; it does not run on a host");
        return ExitCode::from(2);
    }
    let init_ms = sys::boot_ms();
    let booted = match boot::boot() {
        Ok(booted) => booted,
        Err(e) => {
            eprintln!("airlock-guest: boot failed: {e}");
            sys::power_off();
        }
    };
    if let Err(e) = agent::serve(booted, init_ms) {
        eprintln!("airlock-guest: {e}");
    }
    sys::power_off()
}
