//! The service's zygote (the fork server that clones every sandbox's init): sandboxes are
//! still the daemon's own children, the zygote carries nothing of the daemon's
//! environment, the service keeps working without it, and it dies with the daemon.

mod common;
mod serverutil;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use serverutil::{Daemon, ProcInfo, alive, poll};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// The daemon's zygote among its children.
fn zygote(d: &Daemon) -> ProcInfo {
    poll(WAIT, || {
        d.children()
            .into_iter()
            .find(|p| cmdline(p.pid).contains(airlock_sandbox::ZYGOTE_ARG))
    })
    .expect("the daemon has no zygote child")
}

/// Whether `p` has ended (gone, reused, or a zombie).
fn ended(p: &ProcInfo) -> bool {
    !alive(p)
        || std::fs::read_to_string(format!("/proc/{}/stat", p.pid))
            .map(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')))
            .unwrap_or(true)
}

fn exec_true(d: &Daemon) {
    let v = d
        .client()
        .post_json("/v1/exec", &json!({"cmd": ["sh", "-c", "echo ok"]}))
        .expect(200)
        .json();
    assert_eq!(v["stdout"], "ok\n", "{v}");
}

#[test]
fn sandboxes_are_the_daemons_children_and_the_zygote_has_no_environment() {
    let d = Daemon::start_env(&["--pool", "2"], &[("AIRLOCK_TEST_SECRET", "do-not-copy")]);
    d.wait_ready();
    let z = zygote(&d);
    let environ = std::fs::read(format!("/proc/{}/environ", z.pid)).expect("read the zygote's environ");
    assert!(
        environ.is_empty(),
        "the zygote inherited an environment: {environ:?}"
    );
    // Every process in the sandboxes' cgroups is the daemon's child (init) or init's.
    // (A pooled sandbox holds its init and init's ready child, the next program's process.)
    let procs: Vec<ProcInfo> = poll(WAIT, || {
        let procs = d.sandbox_processes();
        (procs.iter().filter(|p| p.ppid == d.pid).count() >= 2).then_some(procs)
    })
    .expect("the pool's sandboxes never appeared");
    let inits: Vec<u32> = procs.iter().filter(|p| p.ppid == d.pid).map(|p| p.pid).collect();
    for p in &procs {
        assert!(
            p.ppid == d.pid || inits.contains(&p.ppid),
            "sandbox process {p:?} is neither the daemon's child nor an init's"
        );
    }
    exec_true(&d);
}

#[test]
fn the_service_works_on_when_the_zygote_is_gone() {
    let d = Daemon::start(&["--pool", "1"]);
    d.wait_ready();
    let z = zygote(&d);
    kill(Pid::from_raw(z.pid as i32), Signal::SIGKILL).expect("kill the zygote");
    assert!(
        poll(WAIT, || ended(&z).then_some(())).is_some(),
        "the zygote survived SIGKILL"
    );
    for _ in 0..5 {
        exec_true(&d);
    }
}

#[test]
fn the_zygote_dies_with_the_daemon() {
    let mut d = Daemon::start(&["--pool", "1"]);
    d.wait_ready();
    let z = zygote(&d);
    d.signal(Signal::SIGKILL);
    d.wait_exit(WAIT).expect("the daemon survived SIGKILL");
    assert!(
        poll(WAIT, || ended(&z).then_some(())).is_some(),
        "the zygote outlived its daemon"
    );
}
