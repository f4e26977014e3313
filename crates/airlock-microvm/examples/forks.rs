//! Measures full snapshots of a micro-VM on this host: a session VM with a background
//! program holding memory is checkpointed, then restored N times (a fork): the
//! checkpoint's time and RAM file, each restore's time to a ready agent, one exec in
//! each, and host memory (PSS, from /proc/<vmm>/smaps_rollup) of one restored VM alone
//! and of all N together. Prints one JSON object.
//!
//!     sudo AIRLOCK_GUEST=target/release/airlock-guest \
//!         target/release/examples/forks [N] [MiB held by the program]
//!
//! Needs what the micro-VM backend needs (root, qemu-system-x86_64, mksquashfs), and
//! python3 in the guest's root.

use airlock_backend::Stdio;
use airlock_microvm::{HostOptions, MicroVmHost, VmSize};
use airlock_sandbox::Capture;
use airlock_spec::{Limits, Spec};
use std::os::unix::fs::MetadataExt;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Proportional set size of a process, in kB.
fn pss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// A restored VMM's PSS split in kB: the snapshot's RAM mapping (the shared memfd), of
/// it what the guest copied on write since, and everything else (QEMU's heap, the
/// translated-code cache, libraries).
fn pss_split_kb(pid: u32) -> [u64; 3] {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
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
    [ram, cow, other]
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

fn mb(kb: u64) -> f64 {
    (kb as f64 / 1024.0 * 10.0).round() / 10.0
}

fn run() -> Result<serde_json::Value, String> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(8);
    let hold_mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let host = MicroVmHost::new(&HostOptions::from_env()).map_err(|e| e.to_string())?;
    let limits = Limits::default();
    let mut parent = host
        .boot(VmSize::for_limits(&limits))
        .map_err(|e| e.to_string())?;
    parent.ensure_sandbox(&limits).map_err(|e| e.to_string())?;
    parent.start_mux().map_err(|e| e.to_string())?;
    // The prepared state a fork starts from: a program holding memory of its own.
    let script = format!(
        "import os, time\nheld = bytearray(os.urandom({}))\nopen('/workspace/ready', 'w').write('1')\nwhile True: time.sleep(1)",
        hold_mib << 20
    );
    let spawned = parent
        .spawn(
            &Spec::new(vec!["python3".into(), "-c".into(), script]),
            Stdio::Pipes,
        )
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while parent.read_file("ready", 10).is_err() {
        if Instant::now() > deadline {
            return Err("the program did not start".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let t = Instant::now();
    let saved = parent.checkpoint(dir.path()).map_err(|e| e.to_string())?;
    let checkpoint = t.elapsed();
    if !saved {
        return Err("the VM cannot be snapshotted".into());
    }
    let ram = std::fs::metadata(dir.path().join("ram")).map_err(|e| e.to_string())?;
    let true_spec = Spec::new(vec!["/bin/true".into()]);

    let mut forks = Vec::new();
    let mut restore_ms = Vec::new();
    let mut exec_ms = Vec::new();
    let mut one_alone_kb = 0;
    for i in 0..n {
        let t = Instant::now();
        let mut vm = host
            .restore(dir.path(), None, limits.disk_bytes)
            .map_err(|e| format!("restore {i}: {e}"))?;
        restore_ms.push(ms(t.elapsed()));
        let t = Instant::now();
        let r = vm
            .exec(&true_spec, &mut Capture, &[])
            .map_err(|e| e.to_string())?;
        exec_ms.push(ms(t.elapsed()));
        if r.exit_code != Some(0) {
            return Err(format!("fork {i}: /bin/true: {r:?}"));
        }
        if i == 0 {
            std::thread::sleep(Duration::from_millis(500));
            one_alone_kb = pss_kb(vm.pid().unwrap_or(0));
        }
        forks.push(vm);
    }
    std::thread::sleep(Duration::from_millis(500));
    let each: Vec<u64> = forks.iter().map(|vm| pss_kb(vm.pid().unwrap_or(0))).collect();
    let total: u64 = each.iter().sum();
    let split = pss_split_kb(forks[0].pid().unwrap_or(0));
    let parent_kb = pss_kb(parent.pid().unwrap_or(0));
    drop(forks);
    drop(spawned);
    Ok(serde_json::json!({
        "accel": host.accel().0.as_str(),
        "vm_ram_mib": VmSize::for_limits(&limits).ram_mib,
        "program_holds_mib": hold_mib,
        "checkpoint_ms": ms(checkpoint),
        "ram_file_stored_mb": mb(ram.blocks() / 2),
        "restore_ms": restore_ms,
        "first_exec_ms": exec_ms,
        "pss_one_restored_mb": mb(one_alone_kb),
        "pss_each_of_n_mb": each.iter().map(|kb| mb(*kb)).collect::<Vec<_>>(),
        "pss_n_total_mb": mb(total),
        "pss_n_over_one": (total as f64 / one_alone_kb.max(1) as f64 * 100.0).round() / 100.0,
        "pss_parent_mb": mb(parent_kb),
        "pss_n_over_parent": (total as f64 / parent_kb.max(1) as f64 * 100.0).round() / 100.0,
        "pss_fork0_split_mb": { "ram_mapping": mb(split[0]), "ram_copied": mb(split[1]), "other": mb(split[2]) },
        "forks": n,
    }))
}

fn main() -> ExitCode {
    match run() {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("forks: {e}");
            ExitCode::FAILURE
        }
    }
}
