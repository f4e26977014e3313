//! The service with `"isolation": "microvm"`: the real `airlock serve --vm-pool N` on
//! 127.0.0.1:0, driven over real HTTP. VMs run emulated (TCG) on hosts whose KVM cannot
//! boot a guest, so each boot takes seconds: few tests, generous time limits.
//!
//! Needs what tests/microvm.rs needs (QEMU, mksquashfs, the `airlock-guest` binary next
//! to `airlock`).

mod common;
mod serverutil;

use nix::sys::signal::Signal;
use serde_json::json;
use serverutil::{Daemon, metric, owner_dirs, owner_processes, poll};
use std::time::Duration;

/// Booting the first VM may build the guest image (about a minute) on a fresh machine.
const POOL_FILL: Duration = Duration::from_secs(600);

fn metric_of(d: &Daemon, name: &str) -> f64 {
    metric(&d.client().get("/metrics").expect(200).text(), name).unwrap_or(0.0)
}

#[test]
fn a_pooled_vm_runs_a_one_shot_exec_in_the_guest_kernel_and_an_oversized_request_boots_its_own() {
    let d = Daemon::start(&["--pool", "1", "--vm-pool", "1"]);
    poll(POOL_FILL, || {
        (metric_of(&d, "airlock_vm_pool_ready") >= 1.0).then_some(())
    })
    .unwrap_or_else(|| panic!("the VM pool never filled; log:\n{}", d.log()));
    let host_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();

    // From the pool: the program runs under the guest's kernel, in the sandbox's uid.
    let r = d.client().post_json(
        "/v1/exec",
        &json!({
            "cmd": ["sh", "-c", "cat /proc/sys/kernel/osrelease; id -u; cat; echo oops >&2; exit 3"],
            "stdin": "in\n",
            "isolation": "microvm",
        }),
    );
    let v = r.expect(200).json();
    assert_eq!(v["outcome"], "exited", "{v}");
    assert_eq!(v["exit_code"], 3, "{v}");
    let out = v["stdout"].as_str().unwrap();
    let mut lines = out.lines();
    let guest_kernel = lines.next().unwrap();
    assert_ne!(guest_kernel, host_kernel.trim(), "ran on the host's kernel: {v}");
    assert_eq!(lines.next(), Some("1000"), "{v}");
    assert_eq!(lines.next(), Some("in"), "{v}");
    assert_eq!(v["stderr"], "oops\n");
    assert!(v["id"].as_str().unwrap().starts_with("vm-"), "{v}");
    let text = d.client().get("/metrics").expect(200).text();
    assert!(
        metric(&text, "airlock_vm_provision_seconds_count{pool=\"warm\"}").unwrap_or(0.0) >= 1.0,
        "{text}"
    );

    // Limits bigger than the pooled VMs' size: a VM is booted for the request, and the
    // namespace backend on the same daemon is unaffected.
    let r = d.client().post_json(
        "/v1/exec",
        &json!({"language": "python", "code": "print(6*7)", "isolation": "microvm",
                "limits": {"memory_bytes": 512 << 20}}),
    );
    let v = r.expect(200).json();
    assert_eq!(v["stdout"], "42\n", "{v}");
    let text = d.client().get("/metrics").expect(200).text();
    assert!(
        metric(&text, "airlock_vm_provision_seconds_count{pool=\"cold\"}").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    let v = d
        .client()
        .post_json("/v1/exec", &json!({"cmd": ["true"]}))
        .expect(200)
        .json();
    assert!(!v["id"].as_str().unwrap().starts_with("vm-"), "{v}");
}

#[test]
fn a_bad_isolation_is_a_400_naming_the_field() {
    let d = Daemon::start(&["--pool", "0"]);
    let e = d
        .client()
        .post_json("/v1/exec", &json!({"cmd": ["true"], "isolation": "vm"}))
        .api_error(400);
    assert_eq!(e["field"], "isolation", "{e}");
    assert!(e["message"].as_str().unwrap().contains("microvm"), "{e}");
    // microvm refuses what it cannot do instead of ignoring it.
    let e = d
        .client()
        .post_json(
            "/v1/exec",
            &json!({"cmd": ["true"], "isolation": "microvm",
                    "network": {"mode": "proxy", "allow": ["example.com"]}}),
        )
        .api_error(400);
    assert!(e["field"].as_str().unwrap().starts_with("network"), "{e}");
}

#[test]
fn sigterm_with_pooled_vms_leaves_no_vmm_cgroup_or_state() {
    let mut d = Daemon::start(&["--pool", "0", "--vm-pool", "1"]);
    poll(POOL_FILL, || {
        (metric_of(&d, "airlock_vm_pool_ready") >= 1.0).then_some(())
    })
    .unwrap_or_else(|| panic!("the VM pool never filled; log:\n{}", d.log()));
    let owner = d.owner.clone();
    assert!(
        !owner_processes(&owner).is_empty(),
        "the pooled VM's VMM is not in the daemon's cgroups"
    );
    let _g = serverutil::start_lock();
    d.signal(Signal::SIGTERM);
    let status = d.wait_exit(Duration::from_secs(60)).expect("exit after SIGTERM");
    assert!(status.success(), "{status:?}; log:\n{}", d.log());
    let left = owner_processes(&owner);
    assert!(left.is_empty(), "processes left: {left:?}");
    let dirs = owner_dirs(&owner);
    assert!(dirs.is_empty(), "cgroups left: {dirs:?}");
    let state = std::path::Path::new("/run/airlock/vm").join(&owner);
    assert!(!state.exists(), "state directory left: {}", state.display());
}
