//! Measures template VMs and their clones on this host, for `bench/microvm.py`: the
//! template's build (a boot and a save), each clone's restore to a ready agent, host
//! memory (PSS) per clone with N clones alive and made ready like pooled VMs, the
//! template's RAM file, and a `/bin/true` in each. Prints one JSON object.
//!
//!     sudo AIRLOCK_GUEST=target/release/airlock-guest \
//!         target/release/examples/clones [N]
//!
//! Needs what the micro-VM backend needs (root, qemu-system-x86_64, mksquashfs).

use airlock_microvm::{HostOptions, MicroVmHost, VmSize};
use airlock_sandbox::Capture;
use airlock_spec::Spec;
use std::os::unix::fs::MetadataExt;
use std::process::ExitCode;
use std::time::Duration;

/// Proportional set size of a process, in kB.
fn pss_kb(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// A process's PSS split in MB: the guest RAM mapping (the template's file), of which
/// copied-on-write (the guest's own writes), and everything else (QEMU's heap, the
/// translated-code cache, libraries).
fn pss_split_mb(pid: u32) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let (mut ram, mut cow, mut other, mut in_ram) = (0u64, 0u64, 0u64, false);
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            in_ram = line.contains("memfd:airlock-vm-ram");
            continue;
        }
        let kb: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        match (first, in_ram) {
            ("Pss:", true) => ram += kb,
            ("Pss:", false) => other += kb,
            ("Anonymous:", true) => cow += kb,
            _ => {}
        }
    }
    let mb = |kb: u64| (kb as f64 / 1024.0 * 10.0).round() / 10.0;
    Some(serde_json::json!({ "ram_mapping": mb(ram), "ram_copied": mb(cow), "other": mb(other) }))
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn main() -> ExitCode {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(4);
    let host = match MicroVmHost::new(&HostOptions::from_env()) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("clones: {e}");
            return ExitCode::FAILURE;
        }
    };
    let spec = Spec::new(vec!["/bin/true".into()]);
    let size = VmSize::for_limits(&spec.limits);
    let run = || -> Result<serde_json::Value, airlock_microvm::VmError> {
        let built = host.prepare_template(size)?;
        let mut vms = Vec::new();
        let mut restore = Vec::new();
        let mut prepare = Vec::new();
        let pooled = std::env::var_os("CLONES_UNPREPARED").is_none();
        for _ in 0..n {
            // As the service's pool does: a clone of the template saved with the guest's
            // sandbox built, warmed up by one /bin/true (unless CLONES_UNPREPARED is set:
            // the figures of a clone of the plain template, just restored).
            let mut vm = if pooled {
                host.clone_prepared(size, &spec.limits)?
            } else {
                host.clone_vm(size)?
            };
            restore.push(ms(vm.boot_time()));
            let t = std::time::Instant::now();
            if pooled {
                vm.warm_up(&spec.limits)?;
            }
            prepare.push(ms(t.elapsed()));
            vms.push(vm);
        }
        // Let the guests settle to idle, as in a pool waiting for requests.
        std::thread::sleep(Duration::from_secs(1));
        if let Some(secs) = std::env::var("CLONES_HOLD").ok().and_then(|v| v.parse().ok()) {
            // Time to look at the VMMs from outside (`CLONES_HOLD=<seconds>`).
            eprintln!(
                "clones: holding {secs} s; VMM pids {:?}",
                vms.iter().filter_map(|vm| vm.pid()).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_secs(secs));
        }
        let pids: Vec<u32> = vms.iter().filter_map(|vm| vm.pid()).collect();
        let pss_mb: Vec<f64> = pids
            .iter()
            .filter_map(|&pid| pss_kb(pid))
            .map(|kb| (kb as f64 / 1024.0 * 10.0).round() / 10.0)
            .collect();
        let pss_split = pids.first().and_then(|&pid| pss_split_mb(pid));
        // The template's RAM file (shared by every clone, not in their PSS but for what
        // they map of it): its resident size.
        let ram_file_mb = pids
            .first()
            .and_then(|pid| std::fs::metadata(format!("/proc/{pid}/fd/5")).ok())
            .map(|m| m.blocks() * 512 / (1 << 20));
        let mut true_ms = Vec::new();
        for vm in &mut vms {
            let r = vm.run(&spec, &mut Capture, &[])?;
            if r.exit_code != Some(0) {
                return Err(airlock_microvm::VmError::Guest(format!("/bin/true: {r:?}")));
            }
            true_ms.push(r.wall_ms);
        }
        Ok(serde_json::json!({
            "accel": host.accel().0.as_str(),
            "ram_mib": size.ram_mib,
            "template_build_ms": ms(built),
            "clone_restore_ms": restore,
            "clone_prepare_ms": prepare,
            "clone_pss_mb": pss_mb,
            "first_clone_pss_split_mb": pss_split,
            "template_ram_file_mb": ram_file_mb,
            "true_wall_ms": true_ms,
        }))
    };
    match run() {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("clones: {e}");
            ExitCode::FAILURE
        }
    }
}
