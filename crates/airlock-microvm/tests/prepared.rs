//! Clones of a template saved with its guest's sandbox built (what the service's VM pool
//! uses), against real VMs: the clone starts with the sandbox, a warm-up leaves it as
//! fresh as before, each clone draws its own random bytes, and under emulation the
//! programs run at a fixed layout. Needs what `template.rs` needs. Its own test binary:
//! `template.rs` counts its process's template files.

mod common;

use airlock_microvm::{MicroVmHost, VmSize};
use airlock_sandbox::Capture;
use airlock_spec::Spec;
use common::{ok, sh};
use std::time::Duration;

#[test]
fn a_prepared_clone_starts_with_its_sandbox_and_emulation_fixes_the_layout() {
    let options = common::options();
    let host = MicroVmHost::new(&options).expect("micro-VM host");
    let limits = Spec::new(vec!["true".into()]).limits;
    let size = VmSize::for_limits(&limits);
    let probe = "grep -m1 ld-linux /proc/self/maps | cut -d' ' -f1; cat /proc/sys/kernel/random/uuid";
    let mut seen = Vec::new();
    for _ in 0..2 {
        // The guest's sandbox was built in the template: the clone has it already.
        let mut vm = host.clone_prepared(size, &limits).expect("prepared clone");
        assert_eq!(vm.sandbox_setup_time(), Duration::ZERO);
        vm.warm_up(&limits).expect("warm up");
        let a = ok(vm.exec(&sh(probe), &mut Capture, &[]).expect("exec"));
        let b = ok(vm
            .exec(&sh(&format!("{probe}; ls -A")), &mut Capture, &[])
            .expect("exec"));
        let (a, b): (Vec<&str>, Vec<&str>) = (a.stdout.lines().collect(), b.stdout.lines().collect());
        match host.accel().0 {
            // Emulated: the loader sits where the warm-up's did, so its translation serves.
            airlock_microvm::vmm::Accel::Tcg => assert_eq!(a[0], b[0], "{a:?} {b:?}"),
            airlock_microvm::vmm::Accel::Kvm => assert_ne!(a[0], b[0], "{a:?} {b:?}"),
        }
        // The warm-up left nothing in the workspace, and each clone draws its own random
        // bytes although their sandboxes were built once, in the template.
        assert_eq!(b.len(), 2, "{b:?}");
        seen.push(a[1].to_owned());
        // After the warm-up, the VM still runs its one program.
        let mut fresh = host.clone_prepared(size, &limits).expect("prepared clone");
        fresh.warm_up(&limits).expect("warm up");
        ok(fresh.run(&sh("true"), &mut Capture, &[]).expect("run"));
        assert!(fresh.run(&sh("true"), &mut Capture, &[]).is_err(), "a second run");
    }
    assert_ne!(seen[0], seen[1], "two prepared clones drew the same random bytes");
}
