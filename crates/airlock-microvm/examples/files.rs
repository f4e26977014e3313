//! Measures a micro-VM session's file features on this host: what an exec's changeset
//! (`files_changed`) adds to an exec that changes nothing and to one that writes 1,000
//! files, and the export and import of a 10 MB, 1,000-file workspace as a tar stream.
//! Prints one JSON object.
//!
//!     sudo AIRLOCK_GUEST=target/release/airlock-guest target/release/examples/files [RUNS]
//!
//! Needs what the micro-VM backend needs (root, qemu-system-x86_64, mksquashfs), and
//! python3 in the guest's root.

use airlock_microvm::{BootedVm, HostOptions, MicroVmHost, VmSize};
use airlock_sandbox::Capture;
use airlock_spec::{Limits, Spec};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

/// The median wall time of `runs` execs of `spec`.
fn median_exec(vm: &mut BootedVm, spec: &Spec, runs: usize) -> Result<f64, String> {
    let mut times = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let r = vm.exec(spec, &mut Capture, &[]).map_err(|e| e.to_string())?;
        times.push(t.elapsed());
        if r.exit_code != Some(0) {
            return Err(format!("{:?}: {r:?}", spec.command));
        }
    }
    times.sort();
    Ok(ms(times[times.len() / 2]))
}

fn python(script: &str) -> Spec {
    let mut s = Spec::new(vec!["python3".into(), "-c".into(), script.into()]);
    s.limits.timeout_ms = 120_000;
    s
}

fn run() -> Result<serde_json::Value, String> {
    let runs: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(9);
    let host = MicroVmHost::new(&HostOptions::from_env()).map_err(|e| e.to_string())?;
    let limits = Limits::default();
    let mut vm = host
        .boot(VmSize::for_limits(&limits))
        .map_err(|e| e.to_string())?;
    vm.ensure_sandbox(&limits).map_err(|e| e.to_string())?;
    let mut with = Spec::new(vec!["/bin/true".into()]);
    with.files_changed_in = vec!["/workspace".into(), "/tmp".into()];
    let mut without = with.clone();
    without.files_changed_in = Vec::new();
    median_exec(&mut vm, &without, 3)?; // translated once
    let empty_without = median_exec(&mut vm, &without, runs)?;
    let empty_with = median_exec(&mut vm, &with, runs)?;
    // The same with 1,000 files of 10 kB in the workspace, changing nothing.
    vm.exec(
        &python("import os\nos.mkdir('big')\nfor i in range(1000): open(f'big/f{i}', 'wb').write(os.urandom(10000))"),
        &mut Capture,
        &[],
    )
    .map_err(|e| e.to_string())?;
    let full_without = median_exec(&mut vm, &without, runs)?;
    let full_with = median_exec(&mut vm, &with, runs)?;
    // An exec that writes 1,000 files, with and without the changeset.
    let mut write = python(
        "import os\nos.makedirs('w', exist_ok=True)\nfor i in range(1000): open(f'w/f{i}', 'w').write(str(i))",
    );
    write.files_changed_in = Vec::new();
    let writes_without = median_exec(&mut vm, &write, 3)?;
    write.files_changed_in = vec!["/workspace".into()];
    let writes_with = median_exec(&mut vm, &write, 3)?;
    vm.exec(
        &Spec::new(vec!["rm".into(), "-rf".into(), "w".into()]),
        &mut Capture,
        &[],
    )
    .map_err(|e| e.to_string())?;

    let t = Instant::now();
    let mut tar = Vec::new();
    vm.export_files(&mut tar).map_err(|e| e.to_string())?;
    let export = t.elapsed();
    let t = Instant::now();
    vm.import_files(&mut tar.as_slice()).map_err(|e| e.to_string())?;
    let import = t.elapsed();
    Ok(serde_json::json!({
        "accel": host.accel().0.as_str(),
        "exec_true_ms": { "empty_workspace": [empty_without, empty_with], "files_1000": [full_without, full_with] },
        "exec_writing_1000_files_ms": [writes_without, writes_with],
        "note": "pairs are [without changeset, with changeset]; medians",
        "export_10mb_1000_files_ms": ms(export),
        "import_10mb_1000_files_ms": ms(import),
        "tar_bytes": tar.len(),
    }))
}

fn main() -> ExitCode {
    match run() {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("files: {e}");
            ExitCode::FAILURE
        }
    }
}
