//! The service with `"isolation": "microvm"`: what only the micro-VM tier has (its VM
//! pool, a VM booted for an oversized request, pooled VMs at shutdown, sessions on pooled
//! VMs), with the real `airlock serve --vm-pool N` on 127.0.0.1:0 driven over real HTTP.
//! Files, sessions and egress, as on every tier, are in tests/contract.rs. VMs run
//! emulated (TCG) on hosts whose KVM cannot boot a guest, so each boot takes seconds: few
//! tests, generous time limits.
//!
//! Needs what tests/microvm.rs needs (QEMU, mksquashfs, the `airlock-guest` binary next
//! to `airlock`).

mod common;
mod serverutil;

use common::ok_stdout;
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
        (metric_of(&d, "airlock_pool_ready{isolation=\"microvm\"}") >= 1.0).then_some(())
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
        metric(
            &text,
            "airlock_provision_seconds_count{isolation=\"microvm\",pool=\"warm\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
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
        metric(
            &text,
            "airlock_provision_seconds_count{isolation=\"microvm\",pool=\"cold\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
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
fn the_memory_budget_counts_the_vm_template() {
    // A micro-VM session is admitted at its cap (256 MiB, the default) plus the VM's
    // overhead (128 MiB): 384 MiB. The budget fits two of them and 16 MiB more, but the
    // pool's template (its guest's RAM, tens of MiB at least) is held beside them: once
    // it exists, one session fits and a second does not.
    let d = Daemon::start(&[
        "--pool",
        "0",
        "--vm-pool",
        "1",
        "--memory-budget",
        "784M",
        "--max-memory",
        "512M",
        "--max-sandboxes",
        "10",
        "--max-sessions-per-key",
        "10",
        "--queue-timeout",
        "500ms",
    ]);
    let c = d.client();
    poll(POOL_FILL, || {
        (metric_of(&d, "airlock_pool_ready{isolation=\"microvm\"}") >= 1.0).then_some(())
    })
    .unwrap_or_else(|| panic!("the VM pool never filled; log:\n{}", d.log()));
    let first = c.create_session(&json!({"isolation": "microvm"}));
    let v = c.session_exec(&first, &sh("echo in")).expect(200).json();
    assert_eq!(ok_stdout(&v), "in\n");
    let e = c
        .post_json("/v1/sandboxes", &json!({"isolation": "microvm"}))
        .api_error(429);
    assert_eq!(e["code"], "queue_timeout", "{e}");
    // The first one gone, the second fits beside the template.
    c.delete(&format!("/v1/sandboxes/{first}")).expect(204);
    let second = poll(Duration::from_secs(30), || {
        let r = c.post_json("/v1/sandboxes", &json!({"isolation": "microvm"}));
        (r.status == 201).then(|| r.json()["id"].as_str().unwrap().to_owned())
    })
    .expect("a session was still refused after the first was deleted");
    c.delete(&format!("/v1/sandboxes/{second}")).expect(204);
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
    // An invalid proxy policy is a 400 naming it, before any VM is booted (proxy mode
    // itself is tested in contract.rs).
    let e = d
        .client()
        .post_json(
            "/v1/exec",
            &json!({"cmd": ["true"], "isolation": "microvm",
                    "network": {"mode": "proxy", "allow_cidrs": ["not a range"]}}),
        )
        .api_error(400);
    assert!(e["field"].as_str().unwrap().starts_with("network"), "{e}");
}

#[test]
fn sigterm_with_pooled_vms_leaves_no_vmm_cgroup_or_state() {
    let mut d = Daemon::start(&["--pool", "0", "--vm-pool", "1"]);
    poll(POOL_FILL, || {
        (metric_of(&d, "airlock_pool_ready{isolation=\"microvm\"}") >= 1.0).then_some(())
    })
    .unwrap_or_else(|| panic!("the VM pool never filled; log:\n{}", d.log()));
    let owner = d.owner.clone();
    assert!(
        !owner_processes(&owner).is_empty(),
        "the pooled VM's VMM is not in the daemon's cgroups"
    );
    sigterm_leaves_nothing(
        &mut d,
        &owner,
        &std::path::Path::new("/run/airlock/vm").join(&owner),
    );
}

/// `sh -c SCRIPT` as an exec request.
fn sh(script: &str) -> serde_json::Value {
    json!({"cmd": ["sh", "-c", script]})
}

/// Sends `POST /v1/sandboxes/{id}/exec` running `sh -c SCRIPT` on a raw connection and
/// closes it after `after`, unanswered.
fn abandoned_exec(d: &Daemon, id: &str, script: &str, after: Duration) {
    use std::io::Write;
    let body = sh(script).to_string();
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", d.port)).expect("connect");
    write!(
        conn,
        "POST /v1/sandboxes/{id}/exec HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    std::thread::sleep(after);
    drop(conn);
}

#[test]
fn microvm_sessions_expire_and_sigterm_purges_the_rest() {
    let mut d = Daemon::start(&["--pool", "0", "--vm-pool", "1"]);
    let c = d.client();
    poll(POOL_FILL, || {
        (metric_of(&d, "airlock_pool_ready{isolation=\"microvm\"}") >= 1.0).then_some(())
    })
    .unwrap_or_else(|| panic!("the VM pool never filled; log:\n{}", d.log()));
    // The first takes the pooled VM (its guest sandbox built ahead), the second a clone
    // started for it.
    let short = c.create_session(&json!({"isolation": "microvm", "ttl_s": 5}));
    let v = c
        .session_exec(&short, &sh("echo warm > w; cat w"))
        .expect(200)
        .json();
    assert_eq!(ok_stdout(&v), "warm\n");
    let long = c.create_session(&json!({"isolation": "microvm", "ttl_s": 600}));
    let v = c.session_exec(&long, &sh("echo up")).expect(200).json();
    assert_eq!(ok_stdout(&v), "up\n");
    // A client that goes away mid-exec cancels that exec only: its processes end in the
    // guest, and the session serves the next exec at once.
    abandoned_exec(&d, &long, "sleep 100", Duration::from_secs(4));
    let t0 = std::time::Instant::now();
    let v = c
        .session_exec(
            &long,
            &sh("for p in /proc/[0-9]*; do printf '%s ' \"$(cat $p/comm 2>/dev/null)\"; done; echo"),
        )
        .expect(200)
        .json();
    let comms = ok_stdout(&v);
    assert!(
        !comms.split_whitespace().any(|c| c == "sleep"),
        "the abandoned exec's sleep survived: {comms}"
    );
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
    // The short one expires: 410, and its VM is purged.
    let expired = poll(Duration::from_secs(60), || {
        (c.get(&format!("/v1/sandboxes/{short}")).status == 410).then_some(())
    });
    assert!(expired.is_some(), "{short} never expired");
    let state = std::path::Path::new("/run/airlock/vm").join(&d.owner);
    let purged = poll(Duration::from_secs(30), || {
        (!d.sandbox_cgroups().contains(&short) && !state.join(&short).exists()).then_some(())
    });
    assert!(purged.is_some(), "the expired session's VM was not purged");
    assert!(
        d.sandbox_cgroups().contains(&long),
        "the live session's VM went too"
    );

    // SIGTERM with the other one live: nothing of it remains.
    let owner = d.owner.clone();
    sigterm_leaves_nothing(&mut d, &owner, &state);
}

/// SIGTERMs the daemon: it exits 0 and leaves no process or cgroup of `owner`'s, and no
/// VM `state` directory.
fn sigterm_leaves_nothing(d: &mut Daemon, owner: &str, state: &std::path::Path) {
    let _g = serverutil::start_lock();
    d.signal(Signal::SIGTERM);
    let status = d.wait_exit(Duration::from_secs(60)).expect("exit after SIGTERM");
    assert!(status.success(), "{status:?}; log:\n{}", d.log());
    let left = owner_processes(owner);
    assert!(left.is_empty(), "processes left: {left:?}");
    let dirs = owner_dirs(owner);
    assert!(dirs.is_empty(), "cgroups left: {dirs:?}");
    assert!(!state.exists(), "state directory left: {}", state.display());
}
