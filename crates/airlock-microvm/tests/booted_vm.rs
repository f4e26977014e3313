//! The host API a pool builds on, against a real VM: boot first, run later, read the
//! program's files back, and nothing left once the VM is dropped. Needs root,
//! qemu-system-x86_64, mksquashfs, and the `airlock-guest` binary of this build
//! (`cargo build -p airlock-guest`; `cargo build --workspace` builds it).

mod common;

use airlock_microvm::{MicroVmHost, VmSize};
use airlock_sandbox::Capture;
use airlock_spec::{FileSpec, Spec};
use std::path::PathBuf;

#[test]
fn a_booted_vm_runs_one_program_and_gives_its_files_back() {
    let options = common::options();
    let host = MicroVmHost::new(&options).expect("micro-VM host");
    let mut spec = Spec::new(vec![
        "sh".into(),
        "-c".into(),
        "mkdir -p out && tr a-z A-Z < in.txt > out/result.txt && echo done".into(),
    ]);
    spec.files.push(FileSpec {
        path: "in.txt".into(),
        content: b"hello from the host\n".to_vec(),
        mode: 0o644,
    });

    // Boot now, run later: what a pool of pre-booted VMs does.
    let mut vm = host.boot(VmSize::for_limits(&spec.limits)).expect("boot");
    let pid = vm.pid().expect("VMM pid");
    let state = PathBuf::from(format!("/proc/{pid}"));
    assert!(state.exists());
    assert!(vm.guest_info().kernel.contains('.'), "{:?}", vm.guest_info());
    assert_eq!(vm.accelerator().expect("QMP"), host.accel().0.as_str());

    // The sandbox inside is built ahead too; a run must match its disk size.
    vm.prepare(&spec.limits).expect("prepare");
    assert!(vm.sandbox_setup_time() > std::time::Duration::ZERO);
    let mut other_disk = spec.clone();
    other_disk.limits.disk_bytes *= 2;
    let err = vm.run(&other_disk, &mut Capture, &[]).unwrap_err();
    assert!(err.to_string().contains("disk"), "{err}");

    let result = vm.run(&spec, &mut Capture, &[]).expect("run");
    assert_eq!(result.exit_code, Some(0), "{result:?}");
    assert_eq!(result.stdout, "done\n");
    assert_eq!(result.id, vm.id());
    // The hand-off did not include the boot or the sandbox, which were ready.
    assert!(
        result.setup_ms < vm.sandbox_setup_time().as_secs_f64() * 1e3 + vm.boot_time().as_secs_f64() * 1e3,
        "{result:?}"
    );

    // Files out.
    let out = vm.read_file("out/result.txt", 1 << 20).expect("read_file");
    assert_eq!(out, b"HELLO FROM THE HOST\n");
    let missing = vm.read_file("out/nope.txt", 1 << 20).unwrap_err();
    assert!(missing.to_string().contains("nope"), "{missing}");

    // One run per VM.
    let again = vm.run(&spec, &mut Capture, &[]).unwrap_err();
    assert!(again.to_string().contains("already ran"), "{again}");

    let id = vm.id().to_owned();
    drop(vm);
    // The VMM is reaped (its /proc entry is gone) and its state directory removed.
    assert!(!state.exists(), "VMM {pid} still exists");
    let leftovers: Vec<_> = std::fs::read_dir(&options.state)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|owner| std::fs::read_dir(owner.path()).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy() == id)
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
