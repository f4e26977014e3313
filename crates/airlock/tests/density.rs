//! Idle-session density through the real `airlock serve` on 127.0.0.1:0: the memory budget
//! counts an idle namespace session at its idle charge (`--session-idle-memory`), not at
//! its cap, so many small sessions are admitted; and it still refuses what would exceed
//! it, counting a session at its cap while an exec runs in it, and from its first
//! background program on (docs/service.md, "Capacity"). bench/density.py measures what an idle session costs the host.

mod common;
mod serverutil;

use common::ok_stdout;
use serde_json::json;
use serverutil::{Daemon, poll};
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// GET /readyz's body, whatever its status (503 while the pool refills).
fn readyz(c: &serverutil::Client) -> serde_json::Value {
    c.get("/readyz").json()
}

/// 120 sessions of 16 MiB under a 1 GiB budget: the old rule (each counted at its cap,
/// at most budget / 256 MiB = 4 sandboxes) admitted 4; at the 4 MiB idle charge all fit.
/// Then the budget still refuses a one-shot exec larger than what is left, and a session's
/// exec holds its whole cap while it runs.
#[test]
fn many_small_idle_sessions_fit_and_the_budget_still_refuses_what_it_must() {
    let d = Daemon::start(&[
        "--pool",
        "2",
        "--memory-budget",
        "1G",
        "--max-memory",
        "1G",
        "--max-sessions-per-key",
        "200",
        "--queue-timeout",
        "300ms",
    ]);
    d.wait_ready();
    let c = d.client();
    let ready = readyz(&c);
    let max = ready["sandboxes_max"].as_u64().unwrap();
    assert_eq!(max, 256, "1 GiB / 4 MiB idle charge: {ready}");

    const N: usize = 120;
    let ids: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                s.spawn(move || {
                    (0..N / 4)
                        .map(|_| c.create_session(&json!({"limits": {"memory_bytes": 16 * MIB}})))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    });
    assert_eq!(ids.len(), N);
    let ready = readyz(&c);
    assert_eq!(ready["sandboxes_active"], N, "{ready}");
    let free = ready["memory_free_bytes"].as_u64().unwrap();
    assert_eq!(
        free,
        (1024 - 4 * N as u64) * MIB,
        "each idle session holds 4 MiB: {ready}"
    );

    // Every session works (one exec in a few of them: each holds its 16 MiB meanwhile).
    for id in ids.iter().step_by(30) {
        let v = c
            .session_exec(id, &json!({"cmd": ["echo", "ok"]}))
            .expect(200)
            .json();
        assert_eq!(ok_stdout(&v), "ok\n");
    }

    // 544 MiB left: a one-shot exec capped at 768 MiB is refused; 256 MiB runs.
    let r = c.exec(&json!({"cmd": ["true"], "limits": {"memory_bytes": 768 * MIB}}));
    let e = r.api_error(429);
    assert_eq!(e["code"], "queue_timeout", "{e}");
    assert!(r.header("retry-after").is_some());
    c.exec_ok(&json!({"cmd": ["true"], "limits": {"memory_bytes": 256 * MIB}}));

    // A big session is admitted at 4 MiB; while an exec runs in it, it holds its 512 MiB
    // cap: 544 - 4 - 508 = 32 MiB left, so a 256 MiB one-shot exec is refused meanwhile.
    let big = c.create_session(&json!({"limits": {"memory_bytes": 512 * MIB}}));
    let sleeper = {
        let c = c.clone();
        let big = big.clone();
        std::thread::spawn(move || c.session_exec(&big, &json!({"cmd": ["sleep", "4"]})).expect(200))
    };
    let refused = poll(Duration::from_secs(3), || {
        let r = c.exec(&json!({"cmd": ["true"], "limits": {"memory_bytes": 256 * MIB}}));
        (r.status == 429).then_some(r)
    })
    .expect("a 256 MiB exec was admitted while the 512 MiB session's exec held its cap");
    assert_eq!(refused.api_error(429)["code"], "queue_timeout");
    // What is left still admits a small one meanwhile.
    c.exec_ok(&json!({"cmd": ["true"], "limits": {"memory_bytes": 16 * MIB}}));
    sleeper.join().unwrap();
    // The exec over, the session is back to its idle charge.
    c.exec_ok(&json!({"cmd": ["true"], "limits": {"memory_bytes": 256 * MIB}}));
    // (A one-shot exec's memory comes back when its sandbox is purged, after its answer.)
    let idle = (1024 - 4 * (N as u64 + 1)) * MIB;
    poll(Duration::from_secs(10), || {
        let free = readyz(&c)["memory_free_bytes"].as_u64().unwrap();
        (free == idle).then_some(())
    })
    .expect("the budget did not come back to the sessions' idle charges");

    // A background program runs between execs: from the first one on, the session holds
    // its whole cap (16 MiB), not its idle charge, until it ends.
    let bg = c.create_session(&json!({"limits": {"memory_bytes": 16 * MIB}}));
    c.session_exec(&bg, &json!({"cmd": ["sleep", "60"], "background": true}))
        .expect(201);
    let free = readyz(&c)["memory_free_bytes"].as_u64().unwrap();
    assert_eq!(
        free,
        idle - 16 * MIB,
        "a session with a background program holds its cap"
    );
    c.delete(&format!("/v1/sandboxes/{bg}")).expect(204);
    poll(Duration::from_secs(10), || {
        (readyz(&c)["memory_free_bytes"].as_u64() == Some(idle)).then_some(())
    })
    .expect("a deleted session's cap was not given back");

    c.delete(&format!("/v1/sandboxes/{big}")).expect(204);
    for id in &ids {
        c.delete(&format!("/v1/sandboxes/{id}")).expect(204);
    }
    poll(Duration::from_secs(10), || {
        let ready = readyz(&c);
        (ready["sandboxes_active"] == 0 && ready["memory_free_bytes"] == 1024 * MIB).then_some(())
    })
    .expect("sessions or budget still held after deleting every session");
}
