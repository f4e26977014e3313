//! TENANTS: what one sandbox's program leaves behind, the next sandbox does not find.
//!
//! Sandboxes share things to save cost (docs/design.md, "What sandboxes share, and why it
//! is clean"): the service's fork server clones every init, a warm pool builds sandboxes
//! before anyone asks, the engine's seccomp program, fanotify group and host uid slots
//! serve all of them, a service hands a purged sandbox's v1 cgroup directories to the next
//! one, and `airlock run` clones init from itself. Each tenant here tries to leave
//! something for the next one: files in every writable place, System V IPC objects, a
//! background process holding an abstract unix socket and a TCP listener, memory and CPU
//! spent (the next result's `memory_peak_bytes` and `cpu_ms` must be its own), and the
//! next one looks for each of them — through the service (one-shot execs from the pool,
//! then sessions) and through `airlock run`.

mod common;
mod serverutil;

use serde_json::{Value, json};
use serverutil::Daemon;

/// The first tenant: leaves something everywhere it can, and says it did.
const LEAVE: &str = r#"
set -e
for d in /tmp /workspace /dev/shm /home/sandbox; do
  [ -d "$d" ] && [ -w "$d" ] && echo tenant-a > "$d/left-by-a"
done
ipcmk -M 4096 >/dev/null
ipcmk -Q >/dev/null
ipcmk -S 1 >/dev/null
setsid python3 -c '
import os, socket, time
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); u.bind("\0airlock-tenant-a"); u.listen()
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("127.0.0.1", 4567)); t.listen()
open("/tmp/listening", "w").close()
time.sleep(60)
' </dev/null >/dev/null 2>&1 &
while [ ! -e /tmp/listening ]; do sleep 0.01; done
python3 -c '
import time
b = bytearray(96 << 20)
for i in range(0, len(b), 4096): b[i] = 1
t = time.process_time()
while time.process_time() - t < 0.3: pass
'
echo left
"#;

/// The next tenant: reports each thing it finds (nothing, when all is well).
const LOOK: &str = r#"
for d in /tmp /workspace /dev/shm /home/sandbox; do
  ls -A "$d" 2>/dev/null | sed "s|^|file in $d: |"
done
ipcs -m -q -s | awk '$1 ~ /^0x/ {print "ipc object: " $0}'
python3 -c '
import socket
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    u.connect("\0airlock-tenant-a"); print("abstract socket of tenant a answers")
except OSError: pass
t = socket.socket()
try:
    t.connect(("127.0.0.1", 4567)); print("tcp listener of tenant a answers")
except OSError: pass
'
for p in /proc/[0-9]*; do
  c=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)
  case "$c" in python3*) echo "process: ${p#/proc/} $c";; esac
done
tr '\0' '\n' < /proc/1/cmdline | grep -v -x -e airlock-init -e __airlock_init__ -e airlock-zygote -e __airlock_zygote__ -e '' | sed 's/^/init argument: /'
echo looked
"#;

/// Checks the second tenant's result: it found nothing, and its usage is its own.
fn assert_clean(how: &str, a: &Value, b: &Value) {
    assert_eq!(
        a["stdout"], "left\n",
        "{how}: tenant a did not run as planned: {a:#}"
    );
    assert_eq!(b["exit_code"], 0, "{how}: {b:#}");
    assert_eq!(
        b["stdout"], "looked\n",
        "{how}: tenant b found tenant a's leftovers: {b:#}"
    );
    let peak_a = a["memory_peak_bytes"].as_u64().unwrap_or(0);
    let peak_b = b["memory_peak_bytes"].as_u64().unwrap_or(u64::MAX);
    assert!(
        peak_a >= 96 << 20,
        "{how}: tenant a's peak {peak_a} misses its 96 MiB: {a:#}"
    );
    assert!(
        peak_b < 48 << 20,
        "{how}: tenant b's memory peak {peak_b} counts tenant a's 96 MiB: {b:#}"
    );
    let cpu_a = a["cpu_ms"].as_f64().unwrap_or(0.0);
    let cpu_b = b["cpu_ms"].as_f64().unwrap_or(f64::MAX);
    assert!(
        cpu_a >= 300.0,
        "{how}: tenant a's cpu_ms {cpu_a} misses its 300 ms: {a:#}"
    );
    assert!(
        cpu_b < 250.0,
        "{how}: tenant b's cpu_ms {cpu_b} counts tenant a's: {b:#}"
    );
}

fn spec(script: &str) -> Value {
    json!({"cmd": ["sh", "-c", script], "limits": {"memory_bytes": 256u64 << 20, "timeout_ms": 30000}})
}

#[test]
fn one_shot_execs_from_the_pool_leave_nothing_for_the_next() {
    let d = Daemon::start(&["--pool", "2"]);
    let c = d.client();
    for round in 0..3 {
        let a = c.exec_ok(&spec(LEAVE));
        let b = c.exec_ok(&spec(LOOK));
        assert_clean(&format!("one-shot round {round}"), &a, &b);
    }
}

#[test]
fn a_deleted_session_leaves_nothing_for_the_next() {
    let d = Daemon::start(&["--pool", "0"]);
    let c = d.client();
    for round in 0..2 {
        let first = c.create_session(&json!({"limits": {"memory_bytes": 256u64 << 20}}));
        let a = c.session_exec(&first, &spec(LEAVE)).expect(200).json();
        c.delete(&format!("/v1/sandboxes/{first}")).expect(204);
        let second = c.create_session(&json!({"limits": {"memory_bytes": 256u64 << 20}}));
        let b = c.session_exec(&second, &spec(LOOK)).expect(200).json();
        c.delete(&format!("/v1/sandboxes/{second}")).expect(204);
        assert_clean(&format!("session round {round}"), &a, &b);
    }
}

#[test]
fn airlock_run_leaves_nothing_for_the_next() {
    let _guard = common::host::serial();
    let run = |script: &str| -> Value {
        let r = common::host::airlock_run(&[
            "--json",
            "--memory",
            "256M",
            "--timeout",
            "30s",
            "--",
            "sh",
            "-c",
            script,
        ]);
        r.json()
    };
    for round in 0..2 {
        let a = run(LEAVE);
        let b = run(LOOK);
        assert_clean(&format!("airlock run round {round}"), &a, &b);
    }
}

/// The checks can fail: within one session, what the first exec left is found.
#[test]
fn the_checks_find_leftovers_where_there_are_some() {
    let d = Daemon::start(&["--pool", "0"]);
    let c = d.client();
    let id = c.create_session(&json!({"limits": {"memory_bytes": 256u64 << 20}}));
    let a = c.session_exec(&id, &spec(LEAVE)).expect(200).json();
    assert_eq!(a["stdout"], "left\n", "{a:#}");
    let b = c.session_exec(&id, &spec(LOOK)).expect(200).json();
    c.delete(&format!("/v1/sandboxes/{id}")).expect(204);
    let found = b["stdout"].as_str().unwrap_or_default();
    for needle in [
        "file in /tmp: left-by-a",
        "file in /workspace: left-by-a",
        "file in /dev/shm: left-by-a",
        "ipc object: ",
    ] {
        assert!(found.contains(needle), "the look missed {needle:?}: {b:#}");
    }
}
