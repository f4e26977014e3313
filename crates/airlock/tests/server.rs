//! End to end: the real `airlock serve` on 127.0.0.1:0, driven over real HTTP.
//!
//! One behaviour per test; each test starts its own daemon (its `Drop` stops it). Host
//! checks look only at what the test's own daemon owns (`airlock/<pid>-<start>` cgroups
//! and the processes in them), since other tests run daemons at the same time. No test
//! asserts a latency; where timing matters (streaming, grace), the margins are seconds.
//! Files and sessions as every tier serves them are in tests/contract.rs.
//!
//! Shutdown checks hold `serverutil::start_lock` from the signal to the check: a daemon
//! starting meanwhile purges dead owners' leftovers and would hide a leak.

mod common;
mod serverutil;

use common::ok_stdout;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use serverutil::{
    Daemon, Resp, alive, cpu_background, keys_file, metric, owner_dirs, owner_processes, poll, serve_refuses,
};
use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn sh(script: &str) -> Value {
    json!({"cmd": ["sh", "-c", script]})
}

// ---------------------------------------------------------------------------------------
// Routes
// ---------------------------------------------------------------------------------------

#[test]
fn healthz_answers_ok() {
    let d = Daemon::start(&["--pool", "1"]);
    let r = d.client().get("/healthz").expect(200);
    assert_eq!(r.json()["status"], "ok");
}

#[test]
fn readyz_is_200_once_the_pool_is_warm() {
    let d = Daemon::start(&["--pool", "2"]);
    d.wait_ready();
    let v = d.client().get("/readyz").expect(200).json();
    assert_eq!(v["ready"], true, "{v}");
    assert!(v["pool_ready"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(v["pool_target"], 2, "{v}");
}

#[test]
fn openapi_document_describes_every_route() {
    let d = Daemon::start(&["--pool", "1"]);
    let r = d.client().get("/openapi.json").expect(200);
    let v = r.json();
    assert!(
        v["openapi"].as_str().is_some_and(|s| s.starts_with('3')),
        "openapi version: {}",
        v["openapi"]
    );
    for path in [
        "/v1/exec",
        "/v1/sandboxes",
        "/v1/sandboxes/{id}",
        "/v1/sandboxes/{id}/exec",
        "/v1/sandboxes/{id}/files",
    ] {
        assert!(v["paths"][path].is_object(), "{path} missing from openapi paths");
    }
}

#[test]
fn exec_by_cmd_reports_output_exit_code_and_timings() {
    let d = Daemon::start(&["--pool", "2"]);
    let v = d.client().exec_ok(&sh("echo out; echo err >&2; exit 3"));
    assert_eq!(v["outcome"], "exited", "{v:#}");
    assert_eq!(v["exit_code"], 3, "{v:#}");
    assert_eq!(v["stdout"], "out\n");
    assert_eq!(v["stderr"], "err\n");
    assert!(v["id"].as_str().is_some_and(|s| !s.is_empty()), "{v:#}");
    for f in ["queue_ms", "setup_ms", "wall_ms", "cpu_ms"] {
        assert!(v[f].as_f64().is_some_and(|x| x >= 0.0), "{f}: {v:#}");
    }
    assert!(v["memory_peak_bytes"].is_u64(), "{v:#}");
}

#[test]
fn exec_python_code() {
    let d = Daemon::start(&["--pool", "1"]);
    let v = d.client().exec_ok(
        &json!({"language": "python", "code": "import sys\nprint(6*7)\nprint(sys.version_info[0])"}),
    );
    assert_eq!(ok_stdout(&v), "42\n3\n");
}

#[test]
fn exec_javascript_code() {
    let d = Daemon::start(&["--pool", "1"]);
    let v = d.client().exec_ok(
        &json!({"language": "javascript", "code": "console.log([1,2,3].map(x => x * 2).join(','))"}),
    );
    assert_eq!(ok_stdout(&v), "2,4,6\n");
}

#[test]
fn exec_bash_code() {
    let d = Daemon::start(&["--pool", "1"]);
    let v = d
        .client()
        .exec_ok(&json!({"language": "bash", "code": "a=(x y z); echo ${#a[@]} ${a[1]}"}));
    assert_eq!(ok_stdout(&v), "3 y\n");
}

#[test]
fn exec_feeds_stdin() {
    let d = Daemon::start(&["--pool", "1"]);
    let v = d
        .client()
        .exec_ok(&json!({"cmd": ["sh", "-c", "tr a-z A-Z; echo"], "stdin": "hello stdin"}));
    assert_eq!(ok_stdout(&v), "HELLO STDIN\n");
}

#[test]
fn exec_writes_files_utf8_and_base64_with_modes() {
    let d = Daemon::start(&["--pool", "1"]);
    let v = d.client().exec_ok(&json!({
        "cmd": ["sh", "-c", "cat notes/a.txt; od -An -tx1 b.bin; ./run.sh; stat -c %a run.sh"],
        "files": [
            {"path": "notes/a.txt", "content": "héllo utf8\n"},
            {"path": "b.bin", "content": "AAH/fg==", "encoding": "base64"},
            {"path": "run.sh", "content": "#!/bin/sh\necho script ran\n", "encoding": "utf8", "mode": 0o755},
        ],
    }));
    assert_eq!(ok_stdout(&v), "héllo utf8\n 00 01 ff 7e\nscript ran\n755\n");
}

#[test]
fn exec_passes_env() {
    let d = Daemon::start(&["--pool", "1"]);
    let v = d.client().exec_ok(&json!({
        "cmd": ["sh", "-c", "echo \"$GREETING/$OTHER\""],
        "env": {"GREETING": "hi there", "OTHER": "x=y"},
    }));
    assert_eq!(ok_stdout(&v), "hi there/x=y\n");
}

#[test]
fn exec_answers_200_whatever_the_program_did() {
    let d = Daemon::start(&["--pool", "1"]);
    let c = d.client();
    let v = c.exec_ok(&json!({"cmd": ["sleep", "30"], "limits": {"timeout_ms": 300}}));
    assert_eq!(v["outcome"], "timeout", "{v:#}");
    assert_eq!(v["timed_out"], true, "{v:#}");
    let v = c.exec_ok(&sh("kill -KILL $$"));
    assert_eq!(v["outcome"], "signaled", "{v:#}");
    let v = c.exec_ok(&sh("exit 7"));
    assert_eq!(v["exit_code"], 7, "{v:#}");
}

#[test]
fn exec_accepts_json_with_a_charset_and_non_utf8_output() {
    let d = Daemon::start(&["--pool", "1"]);
    let r = d.client().request(
        "POST",
        "/v1/exec",
        &[("Content-Type", "application/json; charset=utf-8")],
        Some(sh("printf '\\377\\376ok'").to_string().as_bytes()),
    );
    let v = r.expect(200).json();
    let out = ok_stdout(&v);
    assert!(out.ends_with("ok"), "{out:?}");
    assert_eq!(v["stdout_bytes"], 4, "{v:#}");
}

#[test]
fn an_empty_post_creates_a_session_with_defaults() {
    let d = Daemon::start(&["--pool", "1"]);
    let c = d.client();
    let r = c.request("POST", "/v1/sandboxes", &[], None).expect(201);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let v = c.session_exec(&id, &sh("echo hi")).expect(200).json();
    assert_eq!(ok_stdout(&v), "hi\n");
}

#[test]
fn exec_applies_request_limits() {
    let d = Daemon::start(&["--pool", "1"]);
    let c = d.client();
    let v = c.exec_ok(&json!({
        "cmd": ["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' a"],
        "limits": {"output_bytes": 1000},
    }));
    assert_eq!(v["stdout_truncated"], true, "{v:#}");
    assert!(
        v["stdout"].as_str().unwrap().len() <= 1000,
        "{}",
        v["stdout"].as_str().unwrap().len()
    );
    let v = c.exec_ok(&json!({
        "language": "python",
        "code": "x = b'a' * (200 << 20)\nprint(len(x))",
        "limits": {"memory_bytes": 64 << 20},
    }));
    assert_eq!(v["outcome"], "oom", "{v:#}");
    assert_eq!(v["oom_killed"], true, "{v:#}");
}

#[test]
fn exec_network_none_has_no_way_out() {
    let d = Daemon::start(&["--pool", "1"]);
    let v = d.client().exec_ok(&json!({
        "language": "python",
        "code": "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=3)\n    print('connected')\nexcept OSError as e:\n    print('blocked')\n",
        "network": {"mode": "none"},
    }));
    assert_eq!(ok_stdout(&v), "blocked\n");
}

// ---------------------------------------------------------------------------------------
// Concurrency and overload
// ---------------------------------------------------------------------------------------

#[test]
fn fifty_concurrent_execs_return_their_own_results() {
    const N: usize = 50;
    let d = Daemon::start(&["--pool", "4", "--queue-timeout", "300s"]);
    d.wait_ready();
    let barrier = Arc::new(Barrier::new(N));
    let threads: Vec<_> = (0..N)
        .map(|i| {
            let c = d.client();
            let b = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let token = format!("tok-{i}-{:x}", i * 7919 + 12345);
                b.wait();
                let r = c.exec(&json!({
                    "cmd": ["sh", "-c", "read line; echo \"$TOKEN $line\"; echo \"err-$TOKEN\" >&2"],
                    "env": {"TOKEN": token},
                    "stdin": format!("in-{i}\n"),
                }));
                (i, token, r)
            })
        })
        .collect();
    let mut ids = BTreeSet::new();
    for t in threads {
        let (i, token, r) = t.join().unwrap();
        let v = r.expect(200).json();
        assert_eq!(ok_stdout(&v), format!("{token} in-{i}\n"), "request {i}: {v:#}");
        assert_eq!(v["stderr"], format!("err-{token}\n"), "request {i}: {v:#}");
        assert!(
            ids.insert(v["id"].as_str().unwrap().to_owned()),
            "duplicate sandbox id: {v:#}"
        );
    }
    assert_eq!(ids.len(), N);
}

#[test]
fn overload_answers_429_with_retry_after_and_never_5xx() {
    const N: usize = 20;
    let d = Daemon::start(&["--pool", "2", "--max-sandboxes", "2", "--queue-timeout", "200ms"]);
    d.wait_ready();
    let barrier = Arc::new(Barrier::new(N));
    let threads: Vec<_> = (0..N)
        .map(|_| {
            let c = d.client();
            let b = Arc::clone(&barrier);
            std::thread::spawn(move || {
                b.wait();
                c.exec(&json!({"cmd": ["sleep", "1"]}))
            })
        })
        .collect();
    let responses: Vec<Resp> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let (mut ok, mut limited) = (0, 0);
    for r in &responses {
        match r.status {
            200 => {
                ok_stdout(&r.json());
                ok += 1;
            }
            429 => {
                r.api_error(429);
                let retry = r
                    .header("retry-after")
                    .unwrap_or_else(|| panic!("429 without Retry-After"));
                assert!(
                    retry.parse::<u64>().is_ok_and(|s| s >= 1),
                    "Retry-After {retry:?}"
                );
                limited += 1;
            }
            s => panic!("overload answered {s}: {}", r.text()),
        }
    }
    eprintln!("overload: {ok} x 200, {limited} x 429");
    assert!(limited > 0, "no 429 among {N} concurrent sleeps with 2 slots");
    assert!(ok > 0, "nothing was admitted");
    // The daemon is fine afterwards.
    assert_eq!(ok_stdout(&d.client().exec_ok(&sh("echo alive"))), "alive\n");
}

#[test]
fn a_full_queue_answers_429_at_once() {
    // One slot, held by a session; room for one waiting request; the rest are refused at
    // once (queue_full), long before the 60 s queue timeout.
    let d = Daemon::start(&[
        "--pool",
        "1",
        "--max-sandboxes",
        "1",
        "--max-queue",
        "1",
        "--queue-timeout",
        "60s",
    ]);
    let c = d.client();
    let id = c.create_session(&json!({}));
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..5 {
        let c = d.client();
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send((i, c.exec(&sh(&format!("echo queued-{i}")))));
        });
    }
    let mut refused = 0;
    for _ in 0..4 {
        let (i, r) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("4 of 5 requests should be refused at once with one queue place");
        let e = r.api_error(429);
        assert_eq!(e["code"], "queue_full", "request {i}: {e}");
        assert!(r.header("retry-after").is_some(), "429 without Retry-After");
        refused += 1;
    }
    assert_eq!(refused, 4);
    // Freeing the slot admits the queued one.
    c.delete(&format!("/v1/sandboxes/{id}")).expect(204);
    let (i, r) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the queued request never ran");
    let v = r.expect(200).json();
    assert_eq!(ok_stdout(&v), format!("queued-{i}\n"));
}

#[test]
fn the_memory_budget_bounds_admitted_memory_caps() {
    let d = Daemon::start(&[
        "--pool",
        "1",
        "--memory-budget",
        "600M",
        "--max-sandboxes",
        "10",
        "--max-memory",
        "512M",
        "--queue-timeout",
        "500ms",
    ]);
    let c = d.client();
    let id = c.create_session(&json!({"limits": {"memory_bytes": 512 << 20}}));
    // Idle, the session holds its 4 MiB idle charge; while an exec runs in it, its whole
    // 512 MiB cap of 600: a default (256 MiB) exec does not fit then, 64 MiB does.
    let sleeper = {
        let (c, id) = (c.clone(), id.clone());
        std::thread::spawn(move || c.session_exec(&id, &sh("sleep 3")).expect(200))
    };
    let r = poll(Duration::from_secs(2), || {
        let r = c.exec(&sh("echo big"));
        (r.status == 429).then_some(r)
    })
    .expect("a default exec was admitted while the session's exec held its 512 MiB cap");
    assert!(r.header("retry-after").is_some());
    let v = c.exec_ok(&json!({"cmd": ["echo", "small"], "limits": {"memory_bytes": 64 << 20}}));
    assert_eq!(ok_stdout(&v), "small\n");
    sleeper.join().unwrap();
    // A session exec may not raise its memory above what was admitted at creation.
    let small = c.create_session(&json!({"limits": {"memory_bytes": 32 << 20}}));
    let e = c
        .session_exec(
            &small,
            &json!({"cmd": ["true"], "limits": {"memory_bytes": 512 << 20}}),
        )
        .api_error(400);
    assert_eq!(e["field"], "limits.memory_bytes", "{e}");
    c.delete(&format!("/v1/sandboxes/{small}")).expect(204);
    // Once the big session is gone, the default exec fits.
    c.delete(&format!("/v1/sandboxes/{id}")).expect(204);
    let v = poll(Duration::from_secs(10), || {
        let r = c.exec(&sh("echo big"));
        (r.status == 200).then(|| r.json())
    })
    .expect("a default exec was still refused after the session was deleted");
    assert_eq!(ok_stdout(&v), "big\n");
}

#[test]
fn streaming_exec_under_overload_gets_429_with_retry_after() {
    // The non-streaming route answers 429 + Retry-After; a client that asked for a stream
    // must get the same status (admission happens before any event is sent).
    let d = Daemon::start(&["--pool", "1", "--max-sandboxes", "1", "--queue-timeout", "300ms"]);
    let c = d.client();
    let _id = c.create_session(&json!({}));
    let r = c.request(
        "POST",
        "/v1/exec",
        &[
            ("Content-Type", "application/json"),
            ("Accept", "text/event-stream"),
        ],
        Some(sh("echo hi").to_string().as_bytes()),
    );
    assert_eq!(
        r.status,
        429,
        "streaming exec under overload: content-type {:?}, retry-after {:?}, body: {}",
        r.header("content-type"),
        r.header("retry-after"),
        r.text()
    );
    assert!(r.header("retry-after").is_some(), "429 without Retry-After");
}

/// Sends a JSON POST on a raw connection and returns the connection unread (dropping it
/// is a client going away mid-request).
fn post_and_hold(d: &Daemon, path: &str, body: &Value) -> std::net::TcpStream {
    use std::io::Write;
    let body = body.to_string();
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    conn
}

#[test]
fn a_client_that_goes_away_does_not_free_the_slot_of_a_sandbox_still_running() {
    // --max-sandboxes 1: a client starts `sleep 30` and closes its connection. Either the
    // abandoned exec is killed, or its sandbox keeps its admission until it ends; never
    // may a second sandbox be admitted while the first still runs.
    let d = Daemon::start(&["--pool", "1", "--max-sandboxes", "1", "--queue-timeout", "500ms"]);
    let conn = post_and_hold(
        &d,
        "/v1/exec",
        &json!({"cmd": ["sleep", "30"], "limits": {"timeout_ms": 60_000}}),
    );
    wait_running(&d, "sleep");
    drop(conn);
    std::thread::sleep(Duration::from_secs(1));
    let r = d.client().exec(&sh("echo second"));
    let sleep_running = d.sandbox_processes().iter().any(|p| p.name == "sleep");
    assert!(
        !(r.status == 200 && sleep_running),
        "a second sandbox was admitted (200) with --max-sandboxes 1 while the abandoned `sleep 30` \
         still ran; /metrics says: {:?}",
        d.client()
            .get("/metrics")
            .text()
            .lines()
            .filter(|l| l.starts_with("airlock_sandboxes_active"))
            .collect::<Vec<_>>()
    );
    if r.status != 200 {
        r.api_error(429);
    }
}

// ---------------------------------------------------------------------------------------
// Auth and tenants
// ---------------------------------------------------------------------------------------

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-fedcba9876543210";

#[test]
fn api_keys_are_required_and_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(dir.path(), &[("alice", ALICE), ("bob", BOB)]);
    let d = Daemon::start(&["--pool", "1", "--api-keys", keys.to_str().unwrap()]);
    let anon = d.client();
    let body = sh("echo authed");

    let e = anon.exec(&body).api_error(401);
    assert_eq!(e["code"], "unauthorized", "{e}");
    anon.get("/v1/sandboxes").api_error(401);
    anon.post_json("/v1/sandboxes", &json!({})).api_error(401);

    let wrong = d.client_with_key("alice-key-0123456789abcdeX");
    wrong.exec(&body).api_error(401);
    // A key's prefix is not the key.
    d.client_with_key(&ALICE[..16]).exec(&body).api_error(401);
    // Not a bearer token.
    anon.request(
        "POST",
        "/v1/exec",
        &[("Content-Type", "application/json"), ("Authorization", ALICE)],
        Some(body.to_string().as_bytes()),
    )
    .api_error(401);

    assert_eq!(ok_stdout(&d.client_with_key(ALICE).exec_ok(&body)), "authed\n");
    assert_eq!(ok_stdout(&d.client_with_key(BOB).exec_ok(&body)), "authed\n");

    // Probes stay open.
    anon.get("/healthz").expect(200);
    let r = anon.get("/readyz");
    assert!(
        r.status == 200 || r.status == 503,
        "/readyz: {} {}",
        r.status,
        r.text()
    );

    // The log names the key, never the key itself.
    std::thread::sleep(Duration::from_millis(200));
    let log = d.log();
    assert!(
        !log.contains(ALICE) && !log.contains(BOB),
        "a key leaked into the log:\n{log}"
    );
}

/// Issue 12, item 4: one client can hold every sandbox slot. With a per-key session
/// quota, the client at its quota gets a 429 `session_quota` at once (naming the quota,
/// with Retry-After), another key still gets sessions, the listing shows each caller its
/// own sessions, deleting one frees a place, and a TTL above `--max-session-ttl` is a 400
/// on `ttl_s` naming the cap. Anonymous callers (no keys) have a quota too.
#[test]
fn one_client_can_hold_every_sandbox_slot() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(dir.path(), &[("alice", ALICE), ("bob", BOB)]);
    let d = Daemon::start(&[
        "--pool",
        "1",
        "--max-sandboxes",
        "4",
        "--max-sessions-per-key",
        "2",
        "--max-session-ttl",
        "1h",
        "--queue-timeout",
        "20s",
        "--api-keys",
        keys.to_str().unwrap(),
    ]);
    let alice = d.client_with_key(ALICE);
    let bob = d.client_with_key(BOB);
    let a1 = alice.create_session(&json!({"ttl_s": 600}));
    let a2 = alice.create_session(&json!({"ttl_s": 300}));

    // The third is refused at once (not after the 20 s queue timeout), naming the quota.
    let t0 = Instant::now();
    let r = alice.post_json("/v1/sandboxes", &json!({}));
    let e = r.api_error(429);
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "the quota 429 waited {:?}",
        t0.elapsed()
    );
    assert_eq!(e["code"], "session_quota", "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("--max-sessions-per-key (2)") && msg.contains("\"alice\""),
        "the 429 does not name the quota and the key: {msg}"
    );
    // Retry-After: when alice's first session expires (the 300 s one), not sooner.
    let retry: u64 = r
        .header("retry-after")
        .expect("429 without Retry-After")
        .parse()
        .unwrap();
    assert!((250..=300).contains(&retry), "Retry-After {retry}");

    // Bob is not held back by alice, and sees only his own session.
    let b1 = bob.create_session(&json!({}));
    let list = bob.get("/v1/sandboxes").expect(200).json();
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [b1.as_str()], "{list}");
    let list = alice.get("/v1/sandboxes").expect(200).json();
    let ids: BTreeSet<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, BTreeSet::from([a1.as_str(), a2.as_str()]), "{list}");

    // Deleting one of alice's gives her place back.
    alice.delete(&format!("/v1/sandboxes/{a1}")).expect(204);
    let a3 = alice.create_session(&json!({}));

    // The TTL cap: a 400 on ttl_s that names it.
    let e = bob
        .post_json("/v1/sandboxes", &json!({"ttl_s": 7200}))
        .api_error(400);
    assert_eq!(e["field"], "ttl_s", "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("3600") && msg.contains("--max-session-ttl is 1 h"),
        "{msg}"
    );

    let metrics = alice.get("/metrics").expect(200).text();
    assert_eq!(
        metric(&metrics, "airlock_rejected_total{reason=\"session_quota\"}"),
        Some(1.0),
        "{metrics}"
    );
    for (c, id) in [(&alice, &a2), (&alice, &a3), (&bob, &b1)] {
        c.delete(&format!("/v1/sandboxes/{id}")).expect(204);
    }

    // Without keys, the anonymous caller has the quota too (the default: half of
    // --max-sandboxes).
    let d = Daemon::start(&["--pool", "1", "--max-sandboxes", "2"]);
    let anon = d.client();
    let id = anon.create_session(&json!({}));
    let e = anon.post_json("/v1/sandboxes", &json!({})).api_error(429);
    assert_eq!(e["code"], "session_quota", "{e}");
    assert!(e["message"].as_str().unwrap().contains("anonymous"), "{e}");
    // One-shot execs are not sessions: the second slot still serves them.
    assert_eq!(ok_stdout(&anon.exec_ok(&sh("echo still"))), "still\n");
    anon.delete(&format!("/v1/sandboxes/{id}")).expect(204);
}

#[test]
fn tenants_cannot_see_or_use_each_others_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(dir.path(), &[("alice", ALICE), ("bob", BOB)]);
    let d = Daemon::start(&["--pool", "1", "--api-keys", keys.to_str().unwrap()]);
    let alice = d.client_with_key(ALICE);
    let bob = d.client_with_key(BOB);

    let id = alice.create_session(&json!({}));
    alice
        .put(
            &format!("/v1/sandboxes/{id}/files?path=secret.txt"),
            b"alice's secret",
        )
        .expect(204);

    // Bob's listing does not show it; every route on it is a 404 for him.
    let list = bob.get("/v1/sandboxes").expect(200).json();
    assert!(
        !list.to_string().contains(&id),
        "bob sees alice's session: {list}"
    );
    bob.get(&format!("/v1/sandboxes/{id}")).api_error(404);
    bob.session_exec(&id, &sh("cat secret.txt")).api_error(404);
    let r = bob.get(&format!("/v1/sandboxes/{id}/files?path=secret.txt"));
    r.api_error(404);
    assert!(!r.text().contains("alice's secret"));
    bob.get(&format!("/v1/sandboxes/{id}/files")).api_error(404);
    bob.put(
        &format!("/v1/sandboxes/{id}/files?path=secret.txt"),
        b"bob was here",
    )
    .api_error(404);
    bob.delete(&format!("/v1/sandboxes/{id}")).api_error(404);

    // Alice's session is intact.
    let list = alice.get("/v1/sandboxes").expect(200).json();
    assert!(list.to_string().contains(&id), "alice lost her session: {list}");
    let v = alice.session_exec(&id, &sh("cat secret.txt")).expect(200).json();
    assert_eq!(ok_stdout(&v), "alice's secret");
    alice.delete(&format!("/v1/sandboxes/{id}")).expect(204);
}

#[test]
fn api_keys_from_the_environment_are_enforced() {
    let env = format!("alice:{ALICE}");
    let d = Daemon::start_env(&["--pool", "1"], &[("AIRLOCK_API_KEYS", &env)]);
    d.client().exec(&sh("true")).api_error(401);
    assert_eq!(
        ok_stdout(&d.client_with_key(ALICE).exec_ok(&sh("echo env"))),
        "env\n"
    );
}

#[test]
fn per_key_concurrency_caps_one_tenant_not_another() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(dir.path(), &[("alice", ALICE), ("bob", BOB)]);
    let d = Daemon::start(&[
        "--pool",
        "1",
        "--api-keys",
        keys.to_str().unwrap(),
        "--per-key-concurrency",
        "1",
        "--queue-timeout",
        "300ms",
    ]);
    let alice = d.client_with_key(ALICE);
    let bob = d.client_with_key(BOB);
    // Alice's session is her one concurrent sandbox.
    let id = alice.create_session(&json!({}));
    let r = alice.exec(&sh("true"));
    let e = r.api_error(429);
    assert_eq!(e["code"], "key_concurrency", "{e}");
    assert!(r.header("retry-after").is_some());
    assert_eq!(ok_stdout(&bob.exec_ok(&sh("echo bob"))), "bob\n");
    alice.delete(&format!("/v1/sandboxes/{id}")).expect(204);
    let v = poll(Duration::from_secs(10), || {
        let r = alice.exec(&sh("echo alice"));
        (r.status == 200).then(|| r.json())
    })
    .expect("alice still refused after deleting her session");
    assert_eq!(ok_stdout(&v), "alice\n");
}

#[test]
fn json_logs_have_one_line_per_exec_with_the_key_name() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(dir.path(), &[("alice", ALICE)]);
    let d = Daemon::start(&[
        "--pool",
        "1",
        "--log-format",
        "json",
        "--api-keys",
        keys.to_str().unwrap(),
    ]);
    let v = d.client_with_key(ALICE).exec_ok(&sh("echo logged"));
    let id = v["id"].as_str().unwrap().to_owned();
    let line = poll(Duration::from_secs(10), || {
        d.log()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["fields"]["id"] == id.as_str() || l["id"] == id.as_str())
    })
    .unwrap_or_else(|| panic!("no JSON log line for exec {id}:\n{}", d.log()));
    let fields = if line["fields"].is_object() {
        &line["fields"]
    } else {
        &line
    };
    assert_eq!(fields["key"], "alice", "{line}");
    assert_eq!(fields["outcome"], "exited", "{line}");
    for f in ["queue_ms", "setup_ms", "wall_ms", "memory_peak_bytes"] {
        assert!(fields[f].is_number(), "{f} missing: {line}");
    }
    let log = d.log();
    for l in log.lines() {
        assert!(
            serde_json::from_str::<Value>(l).is_ok(),
            "not a JSON log line: {l}"
        );
    }
    assert!(!log.contains(ALICE), "the key leaked into the log");
}

// ---------------------------------------------------------------------------------------
// Bad requests
// ---------------------------------------------------------------------------------------

/// One bad request and what it must get.
struct Bad {
    name: &'static str,
    method: &'static str,
    /// `{sid}` is replaced by a live session's id.
    path: &'static str,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    /// The `error.field` expected (`None`: not checked).
    field: Option<&'static str>,
    /// Text the message must contain.
    message_has: &'static [&'static str],
}

fn bad(name: &'static str, path: &'static str, body: &str, status: u16, field: Option<&'static str>) -> Bad {
    Bad {
        name,
        method: "POST",
        path,
        content_type: Some("application/json"),
        body: body.as_bytes().to_vec(),
        status,
        field,
        message_has: &[],
    }
}

#[test]
fn bad_requests_get_the_right_status_and_field() {
    let d = Daemon::start(&[
        "--pool",
        "1",
        "--max-body",
        "64K",
        "--max-memory",
        "1G",
        "--max-timeout",
        "30s",
        "--max-ttl",
        "1h",
    ]);
    let c = d.client();
    let sid = c.create_session(&json!({}));
    let table = vec![
        bad(
            "unknown field",
            "/v1/exec",
            r#"{"cmd":["true"],"bogus":1}"#,
            400,
            Some("bogus"),
        ),
        bad(
            "unknown field in limits",
            "/v1/exec",
            r#"{"cmd":["true"],"limits":{"memroy_bytes":1}}"#,
            400,
            None,
        ),
        Bad {
            message_has: &["line 1", "column"],
            ..bad("malformed JSON", "/v1/exec", r#"{"cmd": ["true""#, 400, None)
        },
        Bad {
            message_has: &["line 2", "column"],
            ..bad(
                "malformed JSON, line 2",
                "/v1/exec",
                "{\"cmd\": [\"true\"],\n  \"env\": {,}}",
                400,
                None,
            )
        },
        bad("wrong type", "/v1/exec", r#"{"cmd":"true"}"#, 400, None),
        Bad {
            content_type: Some("text/plain"),
            ..bad("text/plain", "/v1/exec", r#"{"cmd":["true"]}"#, 415, None)
        },
        Bad {
            content_type: None,
            ..bad("no content type", "/v1/exec", r#"{"cmd":["true"]}"#, 415, None)
        },
        Bad {
            content_type: Some("text/plain"),
            ..bad("text/plain on create", "/v1/sandboxes", r#"{}"#, 415, None)
        },
        Bad {
            message_has: &["1073741824"],
            ..bad(
                "memory above --max-memory",
                "/v1/exec",
                r#"{"cmd":["true"],"limits":{"memory_bytes":2147483648}}"#,
                400,
                Some("limits.memory_bytes"),
            )
        },
        Bad {
            message_has: &["30000"],
            ..bad(
                "timeout above --max-timeout",
                "/v1/exec",
                r#"{"cmd":["true"],"limits":{"timeout_ms":60000}}"#,
                400,
                Some("limits.timeout_ms"),
            )
        },
        Bad {
            message_has: &["1073741824"],
            ..bad(
                "session memory above --max-memory",
                "/v1/sandboxes",
                r#"{"limits":{"memory_bytes":2147483648}}"#,
                400,
                Some("limits.memory_bytes"),
            )
        },
        bad("neither cmd nor code", "/v1/exec", r#"{}"#, 400, Some("cmd")),
        bad(
            "language without code",
            "/v1/exec",
            r#"{"language":"python"}"#,
            400,
            Some("code"),
        ),
        bad(
            "code without language",
            "/v1/exec",
            r#"{"code":"print(1)"}"#,
            400,
            Some("language"),
        ),
        bad(
            "cmd and code",
            "/v1/exec",
            r#"{"cmd":["true"],"language":"bash","code":"true"}"#,
            400,
            Some("cmd"),
        ),
        bad(
            "unknown language",
            "/v1/exec",
            r#"{"language":"cobol","code":"x"}"#,
            400,
            None,
        ),
        bad(
            "bad base64",
            "/v1/exec",
            r#"{"cmd":["true"],"files":[{"path":"a","content":"not base64!!","encoding":"base64"}]}"#,
            400,
            Some("files[0].content"),
        ),
        bad(
            "file path ../x",
            "/v1/exec",
            r#"{"cmd":["true"],"files":[{"path":"../x","content":"a"}]}"#,
            400,
            Some("files[0].path"),
        ),
        bad(
            "absolute file path",
            "/v1/exec",
            r#"{"cmd":["true"],"files":[{"path":"ok","content":"a"},{"path":"/etc/x","content":"a"}]}"#,
            400,
            Some("files[1].path"),
        ),
        bad(
            "unknown sandbox exec",
            "/v1/sandboxes/0123456789abcdef/exec",
            r#"{"cmd":["true"]}"#,
            404,
            None,
        ),
        Bad {
            method: "GET",
            ..bad(
                "unknown sandbox show",
                "/v1/sandboxes/0123456789abcdef",
                "",
                404,
                None,
            )
        },
        Bad {
            method: "DELETE",
            ..bad(
                "unknown sandbox delete",
                "/v1/sandboxes/0123456789abcdef",
                "",
                404,
                None,
            )
        },
        Bad {
            method: "GET",
            ..bad(
                "unknown sandbox files",
                "/v1/sandboxes/0123456789abcdef/files",
                "",
                404,
                None,
            )
        },
        bad("ttl_s 0", "/v1/sandboxes", r#"{"ttl_s":0}"#, 400, Some("ttl_s")),
        bad(
            "ttl_s above --max-session-ttl",
            "/v1/sandboxes",
            r#"{"ttl_s":7200}"#,
            400,
            Some("ttl_s"),
        ),
        bad(
            "unknown field on create",
            "/v1/sandboxes",
            r#"{"ttl":5}"#,
            400,
            Some("ttl"),
        ),
        Bad {
            method: "PUT",
            content_type: Some("application/octet-stream"),
            ..bad(
                "PUT ../x",
                "/v1/sandboxes/{sid}/files?path=../x",
                "data",
                400,
                Some("path"),
            )
        },
        Bad {
            method: "PUT",
            content_type: Some("application/octet-stream"),
            ..bad(
                "PUT /etc/x",
                "/v1/sandboxes/{sid}/files?path=/etc/x",
                "data",
                400,
                Some("path"),
            )
        },
        Bad {
            method: "PUT",
            content_type: Some("application/octet-stream"),
            ..bad(
                "PUT without path",
                "/v1/sandboxes/{sid}/files",
                "data",
                400,
                Some("path"),
            )
        },
        Bad {
            method: "PUT",
            content_type: Some("application/octet-stream"),
            ..bad(
                "PUT bad mode",
                "/v1/sandboxes/{sid}/files?path=a&mode=999",
                "data",
                400,
                Some("mode"),
            )
        },
        Bad {
            method: "GET",
            ..bad(
                "GET ../../etc/passwd",
                "/v1/sandboxes/{sid}/files?path=../../etc/passwd",
                "",
                400,
                Some("path"),
            )
        },
        Bad {
            method: "GET",
            ..bad(
                "GET a missing file",
                "/v1/sandboxes/{sid}/files?path=nope.txt",
                "",
                404,
                None,
            )
        },
        Bad {
            method: "GET",
            ..bad("unknown route", "/v2/nothing", "", 404, None)
        },
    ];
    let mut failures = Vec::new();
    for b in &table {
        let path = b.path.replace("{sid}", &sid);
        let headers: Vec<(&str, &str)> = b
            .content_type
            .map(|ct| ("Content-Type", ct))
            .into_iter()
            .collect();
        let body =
            (!b.body.is_empty() || b.method != "GET" && b.method != "DELETE").then_some(b.body.as_slice());
        // A fresh connection per row: this table is about statuses and fields (see
        // `a_413_does_not_break_the_clients_next_request` for connection reuse).
        let fresh = serverutil::Client::new(&d.base, None);
        let r = match fresh.try_request(b.method, &path, &headers, body) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{}: transport error {e}", b.name));
                continue;
            }
        };
        let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        let e = &v["error"];
        let mut problems = Vec::new();
        if r.status != b.status {
            problems.push(format!("status {} (want {})", r.status, b.status));
        }
        if !e["code"].is_string() || !e["message"].is_string() {
            problems.push("no {error:{code,message}} body".to_owned());
        }
        if let Some(f) = b.field
            && e["field"] != f
        {
            problems.push(format!("field {} (want {f:?})", e["field"]));
        }
        for m in b.message_has {
            if !e["message"].as_str().is_some_and(|s| s.contains(m)) {
                problems.push(format!("message lacks {m:?}"));
            }
        }
        if !problems.is_empty() {
            failures.push(format!(
                "{}: {} {path}: {}\n    body: {}",
                b.name,
                b.method,
                problems.join("; "),
                String::from_utf8_lossy(&r.body.iter().copied().take(400).collect::<Vec<_>>())
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "bad requests answered wrongly:\n{}",
        failures.join("\n")
    );
    // None of it hurt the daemon or the session.
    assert_eq!(ok_stdout(&c.exec_ok(&sh("echo fine"))), "fine\n");
    let v = c.session_exec(&sid, &sh("echo fine")).expect(200).json();
    assert_eq!(ok_stdout(&v), "fine\n");
}

/// A JSON exec body of about `size` bytes.
fn big_body(size: usize) -> Vec<u8> {
    format!(r#"{{"cmd":["true"],"stdin":"{}"}}"#, "x".repeat(size)).into_bytes()
}

const TRIES_413: usize = 40;

#[test]
fn a_body_over_max_body_gets_413() {
    // Each try on a fresh connection, written with a plain socket that sends the whole
    // body: every one must *receive* its 413 (the server reads and discards the rest of an
    // over-size body before answering, and says `Connection: close`).
    use std::io::{Read, Write};
    let d = Daemon::start(&["--pool", "1", "--max-body", "64K"]);
    let body = big_body(1 << 20);
    let addr = d.base.trim_start_matches("http://").to_owned();
    let mut failures = Vec::new();
    for i in 0..TRIES_413 {
        let attempt = (|| -> std::io::Result<String> {
            let mut s = std::net::TcpStream::connect(&addr)?;
            s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
            write!(
                s,
                "POST /v1/exec HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )?;
            s.write_all(&body)?;
            let mut resp = Vec::new();
            s.read_to_end(&mut resp)?;
            Ok(String::from_utf8_lossy(&resp).into_owned())
        })();
        match attempt {
            Ok(resp) if resp.starts_with("HTTP/1.1 413") => {
                assert!(resp.contains("65536"), "{resp}");
                assert!(resp.to_ascii_lowercase().contains("connection: close"), "{resp}");
            }
            Ok(resp) => failures.push(format!("try {i}: {}", resp.lines().next().unwrap_or(""))),
            Err(e) => failures.push(format!("try {i}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {TRIES_413} over-size requests did not receive their 413:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn a_413_does_not_break_the_clients_next_request() {
    // A keep-alive client (one connection pool) sends a body over --max-body, then a
    // normal request. If the server closes the connection after the 413 (it did not read
    // the rest of the body), the 413 must say so (`Connection: close`), or the next request
    // on the reused connection fails.
    let d = Daemon::start(&["--pool", "1", "--max-body", "64K"]);
    let body = big_body(1 << 20);
    let next = sh("echo next").to_string();
    let mut failures = Vec::new();
    for i in 0..TRIES_413 {
        let c = serverutil::Client::new(&d.base, None);
        let r = c.try_request(
            "POST",
            "/v1/exec",
            &[("Content-Type", "application/json")],
            Some(&body),
        );
        let connection = match &r {
            Ok(r) if r.status == 413 => r.header("connection").map(str::to_owned),
            // Not receiving the 413 at all is `a_body_over_max_body_gets_413`'s business.
            _ => continue,
        };
        match c.try_request(
            "POST",
            "/v1/exec",
            &[("Content-Type", "application/json")],
            Some(next.as_bytes()),
        ) {
            Ok(r) if r.status == 200 => assert_eq!(ok_stdout(&r.json()), "next\n"),
            Ok(r) => failures.push(format!(
                "try {i}: next request answered {} {}",
                r.status,
                r.text()
            )),
            Err(e) => failures.push(format!(
                "try {i}: next request failed: {e} (the 413 had Connection: {connection:?})"
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {TRIES_413} requests following a 413 on the same client failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------------------

#[test]
fn concurrent_execs_in_one_session_are_serialized() {
    let d = Daemon::start(&["--pool", "1"]);
    let c = d.client();
    let id = c.create_session(&json!({}));
    let threads: Vec<_> = (0..3)
        .map(|i| {
            let c = d.client();
            let id = id.clone();
            std::thread::spawn(move || {
                c.session_exec(
                    &id,
                    &sh(&format!(
                        "echo start-{i} >> log; sleep 0.3; echo end-{i} >> log; echo {i}"
                    )),
                )
            })
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let v = t.join().unwrap().expect(200).json();
        assert_eq!(ok_stdout(&v), format!("{i}\n"));
    }
    // Never two at once: every start is followed by its own end.
    let log = c
        .get(&format!("/v1/sandboxes/{id}/files?path=log"))
        .expect(200)
        .text();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 6, "{log}");
    for pair in lines.chunks(2) {
        assert_eq!(
            pair[0].replace("start", "end"),
            pair[1],
            "interleaved execs:\n{log}"
        );
    }
}

#[test]
fn pooled_sandboxes_wait_in_the_background_and_an_exec_runs_at_an_ordinary_share() {
    let d = Daemon::start(&["--pool", "2"]);
    d.wait_ready();
    // The pool's first sandboxes are built at an ordinary share (a request may soon wait
    // for them); replacements built while another one is ready wait in the background.
    // After two execs, each once the pool was full again, both pooled sandboxes are such
    // replacements.
    for _ in 0..2 {
        d.client().exec_ok(&sh("true"));
        poll(Duration::from_secs(10), || {
            (d.client().get("/readyz").json()["pool_ready"] == 2).then_some(())
        })
        .expect("the pool refills");
    }
    let pooled = poll(Duration::from_secs(10), || {
        let shares = cpu_background(&d.owner);
        (shares.len() == 2 && shares.values().all(|&b| b)).then_some(shares)
    })
    .unwrap_or_else(|| {
        panic!(
            "two pooled sandboxes in the background: {:?}",
            cpu_background(&d.owner)
        )
    });
    // The exec that takes one runs at an ordinary share.
    let running = std::thread::spawn({
        let c = d.client();
        move || c.exec_ok(&sh("sleep 2; echo done"))
    });
    let ordinary = poll(Duration::from_secs(10), || {
        let shares = cpu_background(&d.owner);
        shares
            .into_iter()
            .find(|(_, background)| !background)
            .map(|(id, _)| id)
    })
    .expect("no sandbox at an ordinary share while the exec runs");
    assert!(
        pooled.contains_key(&ordinary),
        "{ordinary} was not a pooled sandbox: {pooled:?}"
    );
    let v = running.join().expect("exec thread");
    assert_eq!(ok_stdout(&v), "done\n", "{v:#}");
    assert_eq!(v["id"], ordinary, "{v:#}");
    // A session, built because someone asked, is never in the background.
    let id = d.client().create_session(&json!({}));
    let shares = cpu_background(&d.owner);
    assert_eq!(shares.get(&id), Some(&false), "{shares:?}");
}

#[test]
fn each_exec_gets_a_fresh_address_space_layout() {
    // Only a sandbox inside an emulated VM runs programs at a fixed layout.
    let d = Daemon::start(&["--pool", "1"]);
    let c = d.client();
    let id = c.create_session(&json!({}));
    let loader = || {
        let v = c
            .session_exec(&id, &sh("grep -m1 ld-linux /proc/self/maps"))
            .expect(200)
            .json();
        ok_stdout(&v).split('-').next().unwrap_or_default().to_owned()
    };
    let (a, b) = (loader(), loader());
    assert!(!a.is_empty(), "no loader mapping");
    assert_ne!(a, b, "two execs mapped the loader at the same address");
}

#[test]
fn a_sessions_ready_child_waits_unprivileged_and_a_killed_one_is_replaced() {
    let d = Daemon::start(&["--pool", "0"]);
    let c = d.client();
    let id = c.create_session(&json!({}));
    let v = c.session_exec(&id, &sh("echo one")).expect(200).json();
    assert_eq!(ok_stdout(&v), "one\n", "{v:#}");
    // Between execs the session holds its init (the daemon's child) and init's ready
    // child: the next program's process, already the sandbox user.
    let ready = poll(Duration::from_secs(5), || {
        let procs = d.sandbox_processes();
        let init = procs.iter().find(|p| p.ppid == d.pid)?.pid;
        // Freshly forked, it is still init's uid for a moment, until it drops; then it
        // sleeps, waiting for the next exec (read while it runs, it may be between
        // dropping its uid and its capabilities).
        procs
            .into_iter()
            .find(|p| p.ppid == init && p.uid != 0 && p.state == "S")
    })
    .expect("no ready child in the idle session");
    let status = std::fs::read_to_string(format!("/proc/{}/status", ready.pid)).expect("its status");
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(str::trim);
    assert_ne!(ready.uid, 0, "the ready child is root on the host: {ready:?}");
    assert_eq!(
        cap_eff,
        Some("0000000000000000"),
        "the ready child holds capabilities: {ready:?}"
    );
    // Killed while it waits (as the OOM killer might): the exec forks another.
    kill(Pid::from_raw(ready.pid as i32), Signal::SIGKILL).expect("kill the ready child");
    // SIGKILL lands asynchronously: an exec sent before the child is dead is handed to it
    // and ends with its death (a race of the test, not of the sandbox).
    let dead = poll(Duration::from_secs(5), || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", ready.pid)).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next());
        matches!(state, None | Some("Z" | "X")).then_some(())
    });
    assert!(dead.is_some(), "the ready child did not die");
    let v = c.session_exec(&id, &sh("echo two; id -u")).expect(200).json();
    assert_eq!(ok_stdout(&v), "two\n1000\n", "{v:#}");
}

#[test]
fn session_ttl_expiry_gives_410_and_purges_the_cgroup() {
    let d = Daemon::start(&["--pool", "1"]);
    let c = d.client();
    let id = c.create_session(&json!({"ttl_s": 1}));
    assert!(d.sandbox_cgroups().contains(&id), "no cgroup for session {id}");
    std::thread::sleep(Duration::from_millis(2500));
    let e = c.session_exec(&id, &sh("echo too late")).api_error(410);
    assert_eq!(e["code"], "expired", "{e}");
    c.get(&format!("/v1/sandboxes/{id}")).api_error(410);
    c.get(&format!("/v1/sandboxes/{id}/files?path=x")).api_error(410);
    c.put(&format!("/v1/sandboxes/{id}/files?path=x"), b"late")
        .api_error(410);
    let gone = poll(Duration::from_secs(15), || {
        (!d.sandbox_cgroups().contains(&id)).then_some(())
    });
    assert!(
        gone.is_some(),
        "cgroup of expired session {id} still there: {:?}",
        d.sandbox_cgroups()
    );
    let listed = c.get("/v1/sandboxes").expect(200).json();
    assert!(
        !listed.to_string().contains(&id),
        "expired session still listed: {listed}"
    );
}

/// Starts `sleep SECS` in session `id` from another thread; the thread returns the
/// exec's outcome (a transport error is fine: the exec may be cut).
fn session_sleep(d: &Daemon, id: &str, secs: u32) -> std::thread::JoinHandle<Result<Resp, String>> {
    let c = d.client();
    let path = format!("/v1/sandboxes/{id}/exec");
    let body = json!({"cmd": ["sleep", secs.to_string()], "limits": {"timeout_ms": 300_000}}).to_string();
    std::thread::spawn(move || {
        c.try_request(
            "POST",
            &path,
            &[("Content-Type", "application/json")],
            Some(body.as_bytes()),
        )
    })
}

#[test]
fn delete_purges_a_session_now_even_while_it_runs_an_exec() {
    // "DELETE: purge now": a running exec of the session ends with it, the request does
    // not wait for the program to finish on its own.
    let d = Daemon::start(&["--pool", "1"]);
    let c = d.client();
    let id = c.create_session(&json!({}));
    let running = session_sleep(&d, &id, 40);
    wait_running(&d, "sleep");
    let t0 = Instant::now();
    let r = c.delete(&format!("/v1/sandboxes/{id}"));
    let took = t0.elapsed();
    let sleep_left = d.sandbox_processes().iter().any(|p| p.name == "sleep");
    let cgroup_left = d.sandbox_cgroups().contains(&id);
    let exec = running.join().unwrap();
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(
        took < Duration::from_secs(15) && !sleep_left && !cgroup_left,
        "DELETE of a session running `sleep 40` took {took:?} (sleep still running right after: \
         {sleep_left}, cgroup still there: {cgroup_left}); the exec ended with {:?}",
        exec.map(|r| (r.status, r.text().chars().take(120).collect::<String>()))
    );
}

#[test]
fn ttl_expiry_purges_a_session_even_while_it_runs_an_exec() {
    // A session's TTL bounds its life: when it passes, what the session owns is purged,
    // including a program still running in it.
    let d = Daemon::start(&["--pool", "1"]);
    let c = d.client();
    let created = Instant::now();
    let id = c.create_session(&json!({"ttl_s": 2}));
    let running = session_sleep(&d, &id, 40);
    wait_running(&d, "sleep");
    let purged = poll(Duration::from_secs(15), || {
        let sleeping = d.sandbox_processes().iter().any(|p| p.name == "sleep");
        (!sleeping && !d.sandbox_cgroups().contains(&id)).then_some(())
    });
    let waited = created.elapsed();
    let exec = running.join().unwrap();
    assert!(
        purged.is_some(),
        "session with ttl_s 2 still ran its `sleep 40` (or kept its cgroup) {waited:?} after creation; \
         the exec ended after {:?} with {:?}",
        created.elapsed(),
        exec.map(|r| (r.status, r.text().chars().take(120).collect::<String>()))
    );
    c.get(&format!("/v1/sandboxes/{id}")).api_error(410);
}

#[test]
fn a_client_that_goes_away_mid_exec_does_not_destroy_its_session() {
    // A session exec whose client disconnects (a timeout, a crash) must leave the
    // session and its files usable.
    let d = Daemon::start(&["--pool", "1"]);
    let c = d.client();
    let id = c.create_session(&json!({}));
    c.put(&format!("/v1/sandboxes/{id}/files?path=keep.txt"), b"precious")
        .expect(204);
    let conn = post_and_hold(
        &d,
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({"cmd": ["sleep", "2"]}),
    );
    wait_running(&d, "sleep");
    drop(conn);
    let done = poll(Duration::from_secs(30), || {
        (!d.sandbox_processes().iter().any(|p| p.name == "sleep")).then_some(())
    });
    assert!(done.is_some(), "the abandoned sleep never ended");
    std::thread::sleep(Duration::from_millis(500));
    let r = c.session_exec(&id, &sh("cat keep.txt"));
    assert_eq!(
        r.status,
        200,
        "the session broke after a client went away mid-exec: {} (it is still listed: {})",
        r.text(),
        c.get("/v1/sandboxes").text().contains(&id)
    );
    assert_eq!(ok_stdout(&r.json()), "precious");
}

#[test]
fn session_file_routes_are_symlink_safe() {
    let d = Daemon::start(&["--pool", "1"]);
    let c = d.client();
    let canary_dir = tempfile::Builder::new()
        .prefix("airlock-canary-")
        .tempdir()
        .unwrap();
    let canary = canary_dir.path().join("canary");
    std::fs::write(&canary, "host canary, do not touch\n").unwrap();
    let canary_abs = canary.to_str().unwrap().to_owned();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let passwd_line = passwd.lines().next().unwrap().to_owned();

    let id = c.create_session(&json!({}));
    let script = format!(
        "ln -s /etc/passwd link && ln -s / root && ln -s {canary_abs} canarylink && \
         ln -s {dir} dirlink && mkdir -p sub && ln -s /etc sub/etc && ls -l",
        dir = canary_dir.path().display()
    );
    let v = c.session_exec(&id, &sh(&script)).expect(200).json();
    ok_stdout(&v);

    let mut exposed = Vec::new();
    let mut check_get = |path: &str| {
        let r = c.get(&format!("/v1/sandboxes/{id}/files?path={path}"));
        let text = r.text();
        if (200..300).contains(&r.status) || text.contains(&passwd_line) || text.contains("host canary") {
            exposed.push(format!(
                "GET {path}: {} {}",
                r.status,
                text.chars().take(200).collect::<String>()
            ));
        }
    };
    for p in [
        "link",
        "root/etc/passwd",
        "sub/etc/passwd",
        "canarylink",
        "dirlink/canary",
    ] {
        check_get(p);
    }
    // Writes through a symlinked directory must fail.
    let through_canary = format!("root{canary_abs}");
    for path in [
        "root/x",
        "root/tmp/x",
        "dirlink/canary",
        "dirlink/new",
        &through_canary,
    ] {
        let r = c.put(&format!("/v1/sandboxes/{id}/files?path={path}"), b"pwned");
        if (200..300).contains(&r.status) {
            exposed.push(format!("PUT {path}: {} {}", r.status, r.text()));
        }
    }
    // A write whose last component is a symlink may fail, or replace the link inside
    // the sandbox; either way the host target stays untouched (checked below).
    for path in ["link", "canarylink"] {
        let r = c.put(&format!("/v1/sandboxes/{id}/files?path={path}"), b"pwned");
        assert!(r.status < 500, "PUT {path}: {} {}", r.status, r.text());
    }
    // The listing must not follow symlinks out either.
    let list = c.get(&format!("/v1/sandboxes/{id}/files")).expect(200).text();
    if list.contains("passwd") || list.contains("canary\"") && list.contains("dirlink/") {
        exposed.push(format!("listing followed a symlink: {list}"));
    }
    assert_eq!(
        std::fs::read_to_string(&canary).unwrap(),
        "host canary, do not touch\n",
        "the host canary was modified"
    );
    assert!(
        !canary_dir.path().join("new").exists(),
        "a file was created in a host directory"
    );
    assert!(!std::path::Path::new("/x").exists(), "/x was created on the host");
    assert_eq!(
        std::fs::read_to_string("/etc/passwd").unwrap(),
        passwd,
        "/etc/passwd changed"
    );
    assert!(
        exposed.is_empty(),
        "symlinks were followed:\n{}",
        exposed.join("\n")
    );
    // The session still works.
    let v = c.session_exec(&id, &sh("echo ok")).expect(200).json();
    assert_eq!(ok_stdout(&v), "ok\n");
}

// ---------------------------------------------------------------------------------------
// Streaming
// ---------------------------------------------------------------------------------------

const THREE_LINES: &str = "import sys, time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.5)\nprint('done', file=sys.stderr, flush=True)\n";

/// Reads every event; checks the shape; returns (first stdout arrival, result arrival, result).
fn read_stream(mut s: serverutil::SseStream) -> (Instant, Instant, Value) {
    let events = s.collect_all();
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    let last = events.last().unwrap_or_else(|| panic!("no events"));
    assert_eq!(last.event, "result", "events: {names:?}; last: {}", last.data);
    assert_eq!(names.iter().filter(|n| **n == "result").count(), 1, "{names:?}");
    let mut stdout = String::new();
    let mut stderr = String::new();
    for e in &events[..events.len() - 1] {
        let text = e.json()["data"].as_str().expect("data").to_owned();
        match e.event.as_str() {
            "stdout" => stdout.push_str(&text),
            "stderr" => stderr.push_str(&text),
            other => panic!("unexpected event {other:?}: {}", e.data),
        }
    }
    assert_eq!(stdout, "line 0\nline 1\nline 2\n", "{names:?}");
    assert_eq!(stderr, "done\n", "{names:?}");
    let result = last.json();
    assert_eq!(ok_stdout(&result), "line 0\nline 1\nline 2\n");
    let first = events.iter().find(|e| e.event == "stdout").unwrap().at;
    (first, last.at, result)
}

#[test]
fn streaming_exec_delivers_output_before_the_result() {
    let d = Daemon::start(&["--pool", "1"]);
    let stream = d
        .client()
        .sse("/v1/exec", &json!({"language": "python", "code": THREE_LINES}));
    let (first, result_at, _) = read_stream(stream);
    // The program sleeps 1.5 s after its first line; half of that is margin enough.
    let lead = result_at.duration_since(first);
    assert!(
        lead >= Duration::from_millis(750),
        "first stdout only {lead:?} before the result"
    );
}

#[test]
fn streaming_session_exec_delivers_output_before_the_result() {
    let d = Daemon::start(&["--pool", "1"]);
    let c = d.client();
    let id = c.create_session(&json!({}));
    let stream = c.sse(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({"language": "python", "code": THREE_LINES}),
    );
    let (first, result_at, _) = read_stream(stream);
    let lead = result_at.duration_since(first);
    assert!(
        lead >= Duration::from_millis(750),
        "first stdout only {lead:?} before the result"
    );
}

// ---------------------------------------------------------------------------------------
// Lifecycle: SIGTERM, kill -9, restart
// ---------------------------------------------------------------------------------------

/// Waits until a process named `name` runs in the daemon's sandboxes.
fn wait_running(d: &Daemon, name: &str) {
    let found = poll(Duration::from_secs(60), || {
        d.sandbox_processes().iter().any(|p| p.name == name).then_some(())
    });
    assert!(
        found.is_some(),
        "{name} never started in a sandbox; log:\n{}",
        d.log()
    );
}

/// Asserts nothing of `owner` is left on the host: no cgroup directory, no process.
///
/// Call it after the daemon exited, while holding [`serverutil::start_lock`] since before
/// the signal: a daemon starting meanwhile would purge the dead owner's leftovers itself
/// and hide them. The cgroup directories are checked at once (an exited daemon purges
/// nothing more); processes get a moment to be reaped.
fn assert_owner_purged(owner: &str) {
    let dirs = owner_dirs(owner);
    let sandboxes = serverutil::owner_sandbox_dirs(owner);
    let procs_gone = poll(Duration::from_secs(5), || {
        owner_processes(owner).is_empty().then_some(())
    });
    assert!(
        dirs.is_empty() && procs_gone.is_some(),
        "left behind by {owner} after it exited: cgroup dirs {dirs:?} (sandbox dirs below them: \
         {sandboxes:?}), processes {:?}",
        owner_processes(owner)
    );
}

#[test]
fn shutdown_right_after_execs_leaves_no_cgroup_directory() {
    // A request that takes a warm sandbox makes the pool refill in the background, and a
    // one-shot exec is purged after its response. A shutdown that follows at once must
    // still purge everything: no sandbox cgroup, no owner directory left. Several rounds:
    // it is a race.
    for round in 0..5 {
        let mut d = Daemon::start(&["--pool", "2"]);
        d.wait_ready();
        let c = d.client();
        let sid = c.create_session(&json!({}));
        let v = c.exec_ok(&sh("true"));
        ok_stdout(&v);
        let _lock = serverutil::start_lock();
        d.signal(Signal::SIGTERM);
        let status = d
            .wait_exit(Duration::from_secs(60))
            .unwrap_or_else(|| panic!("round {round}: still running 60 s after SIGTERM"));
        assert_eq!(status.code(), Some(0), "round {round}: {status:?}");
        // A leftover that is neither of these is a warm sandbox being built at shutdown.
        eprintln!("round {round}: session {sid}, one-shot exec {}", v["id"]);
        assert_owner_purged(&d.owner);
    }
}

#[test]
fn sigterm_lets_an_inflight_exec_finish_then_exits_0_and_purges() {
    let mut d = Daemon::start(&["--pool", "2", "--grace", "10s"]);
    d.wait_ready();
    let c = d.client();
    let id = c.create_session(&json!({}));
    let c2 = d.client();
    let inflight = std::thread::spawn(move || c2.exec(&sh("sleep 2; echo finished")));
    wait_running(&d, "sleep");
    wait_pool_full(&d);
    let _lock = serverutil::start_lock();
    d.signal(Signal::SIGTERM);

    // New work is refused (connection refused, or 503) while the exec finishes.
    std::thread::sleep(Duration::from_millis(300));
    if let Ok(r) = serverutil::Client::new(&d.base, None).try_request(
        "POST",
        "/v1/exec",
        &[("Content-Type", "application/json")],
        Some(sh("echo new").to_string().as_bytes()),
    ) {
        assert_ne!(
            r.status,
            200,
            "a new exec was accepted after SIGTERM: {}",
            r.text()
        );
    }

    let r = inflight.join().unwrap();
    let v = r.expect(200).json();
    assert_eq!(ok_stdout(&v), "finished\n");
    let status = d
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("daemon still running 60 s after SIGTERM; log:\n{}", d.log()));
    assert_eq!(
        status.code(),
        Some(0),
        "exit status {status:?}; log:\n{}",
        d.log()
    );
    assert_owner_purged(&d.owner);
    let _ = id;
}

#[test]
fn sigterm_past_the_grace_cuts_a_long_exec_and_exits_0_promptly() {
    let mut d = Daemon::start(&["--pool", "1", "--grace", "500ms"]);
    let c = d.client();
    let inflight = std::thread::spawn(move || {
        c.try_request(
            "POST",
            "/v1/exec",
            &[("Content-Type", "application/json")],
            Some(
                json!({"cmd": ["sleep", "120"], "limits": {"timeout_ms": 300000}})
                    .to_string()
                    .as_bytes(),
            ),
        )
    });
    wait_running(&d, "sleep");
    wait_pool_full(&d);
    let t0 = Instant::now();
    let _lock = serverutil::start_lock();
    d.signal(Signal::SIGTERM);
    let status = d
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("daemon still running 60 s after SIGTERM; log:\n{}", d.log()));
    let took = t0.elapsed();
    assert_eq!(
        status.code(),
        Some(0),
        "exit status {status:?}; log:\n{}",
        d.log()
    );
    // The program would have slept 120 s: the daemon cut it.
    assert!(took < Duration::from_secs(60), "exit took {took:?}");
    match inflight.join().unwrap() {
        Ok(r) => assert!(
            !(200..300).contains(&r.status),
            "the cut exec answered {}: {}",
            r.status,
            r.text()
        ),
        Err(e) => eprintln!("cut exec: transport error (acceptable): {e}"),
    }
    assert_owner_purged(&d.owner);
}

#[test]
fn kill_9_takes_the_sandboxes_along_and_the_next_start_purges_leftovers() {
    // Hold the start-up lock from the kill to the restart: no other daemon of this test
    // binary may start (and purge the dead owner's leftovers) in between.
    let lock = serverutil::start_lock();
    let mut d = Daemon::start_locked(&["--pool", "2"], &[]);
    d.wait_ready();
    let c = d.client();
    let id = c.create_session(&json!({}));
    let c2 = d.client();
    let inflight = std::thread::spawn(move || {
        c2.try_request(
            "POST",
            "/v1/exec",
            &[("Content-Type", "application/json")],
            Some(
                json!({"cmd": ["sleep", "1000"], "limits": {"timeout_ms": 600000}})
                    .to_string()
                    .as_bytes(),
            ),
        )
    });
    wait_running(&d, "sleep");
    let owner = d.owner.clone();
    let before = d.sandbox_processes();
    let sandbox_uid: Vec<_> = before
        .iter()
        .filter(|p| p.uid >= airlock_sandbox::HOST_UID_BASE)
        .cloned()
        .collect();
    assert!(
        sandbox_uid.iter().any(|p| p.name == "sleep"),
        "no sandbox-uid sleep among {before:?}"
    );
    assert!(d.sandbox_cgroups().contains(&id));

    d.signal(Signal::SIGKILL);
    d.wait_exit(Duration::from_secs(30))
        .expect("daemon survived SIGKILL");
    let _ = inflight.join();

    // Every sandbox process dies with the daemon.
    let dead = poll(Duration::from_secs(15), || {
        (before.iter().all(|p| !alive(p)) && owner_processes(&owner).is_empty()).then_some(())
    });
    let survivors: Vec<_> = before.iter().filter(|p| alive(p)).collect();
    assert!(
        dead.is_some(),
        "sandbox processes outlived the daemon by 15 s: {survivors:?} / in its cgroups: {:?}",
        owner_processes(&owner)
    );
    let sandbox_uid_left: Vec<_> = serverutil::sandbox_uid_processes()
        .into_iter()
        .filter(|p| before.iter().any(|b| b.pid == p.pid && b.start == p.start))
        .collect();
    assert!(sandbox_uid_left.is_empty(), "{sandbox_uid_left:?}");

    // What the dead daemon owned is still on the host until the next start.
    let leftovers = serverutil::owner_sandbox_dirs(&owner);
    let d2 = Daemon::start_locked(&["--pool", "1"], &[]);
    drop(lock);
    assert!(
        owner_dirs(&owner).is_empty(),
        "the restart left the dead daemon's cgroups: {:?}",
        owner_dirs(&owner)
    );
    if leftovers.is_empty() {
        // Only another airlock process on this host (outside this test binary) can have
        // purged them first; the restart then had nothing to do.
        eprintln!("note: leftovers of {owner} were gone before the restart");
    } else {
        assert!(
            leftovers.contains(&id),
            "session {id} not among leftovers {leftovers:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
        let log = d2.log();
        assert!(
            log.to_lowercase().contains("purged"),
            "the restart did not log what it purged ({} sandboxes were left):\n{log}",
            leftovers.len()
        );
    }
    // And the new daemon serves.
    d2.wait_ready();
    assert_eq!(ok_stdout(&d2.client().exec_ok(&sh("echo back"))), "back\n");
}

/// Waits until the warm pool is full again (no refill in flight).
fn wait_pool_full(d: &Daemon) {
    let c = d.client();
    let full = poll(Duration::from_secs(60), || {
        let v = c.get("/readyz").json();
        (v["pool_ready"] == v["pool_target"]).then_some(())
    });
    assert!(full.is_some(), "the pool never refilled; log:\n{}", d.log());
}

#[test]
fn sigint_shuts_down_cleanly_too() {
    let mut d = Daemon::start(&["--pool", "2"]);
    d.wait_ready();
    let c = d.client();
    let _id = c.create_session(&json!({}));
    ok_stdout(&c.exec_ok(&sh("true")));
    // (A refill in flight at shutdown is `shutdown_right_after_execs_leaves_no_cgroup_directory`.)
    wait_pool_full(&d);
    let _lock = serverutil::start_lock();
    d.signal(Signal::SIGINT);
    let status = d
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("daemon still running 60 s after SIGINT; log:\n{}", d.log()));
    assert_eq!(status.code(), Some(0), "exit status {status:?}");
    assert_owner_purged(&d.owner);
}

#[test]
fn refuses_a_non_loopback_listen_address_without_keys() {
    let f = serve_refuses(&["--listen", "0.0.0.0:0"]);
    assert_eq!(f.status.code(), Some(2), "{f:?}");
    assert!(
        f.stderr.contains("API keys") || f.stderr.contains("api-keys"),
        "{f:?}"
    );
    assert!(!f.stdout.contains("listening"), "{f:?}");
}

#[test]
fn refuses_a_short_api_key() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(dir.path(), &[("alice", "short")]);
    let f = serve_refuses(&["--api-keys", keys.to_str().unwrap()]);
    assert_eq!(f.status.code(), Some(2), "{f:?}");
    assert!(!f.stdout.contains("listening"), "{f:?}");
}

#[test]
fn non_loopback_listen_address_with_keys_requires_them() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(dir.path(), &[("alice", ALICE)]);
    let d = Daemon::start(&[
        "--listen",
        "0.0.0.0:0",
        "--pool",
        "1",
        "--api-keys",
        keys.to_str().unwrap(),
    ]);
    d.client().exec(&sh("true")).api_error(401);
    assert_eq!(
        ok_stdout(&d.client_with_key(ALICE).exec_ok(&sh("echo hi"))),
        "hi\n"
    );
}

// ---------------------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------------------

#[test]
fn metrics_export_the_documented_series() {
    // One slot: a session holds it, so a one-shot exec is refused after the queue timeout
    // (long enough for the previous exec's asynchronous purge to release the slot first).
    let d = Daemon::start(&["--pool", "1", "--max-sandboxes", "1", "--queue-timeout", "3s"]);
    d.wait_ready();
    let c = d.client();
    // Warm: the default disk. Cold: a disk size the pool does not have.
    ok_stdout(&c.exec_ok(&sh("true")));
    ok_stdout(&c.exec_ok(&json!({"cmd": ["true"], "limits": {"disk_bytes": 16 << 20}})));
    let id = c.create_session(&json!({}));
    let r = c.exec(&sh("true"));
    let e = r.api_error(429);
    assert!(r.header("retry-after").is_some(), "429 without Retry-After: {e}");

    let r = c.get("/metrics").expect(200);
    let ct = r.header("content-type").unwrap_or("").to_owned();
    assert!(
        ct.starts_with("text/plain") || ct.starts_with("application/openmetrics-text"),
        "{ct}"
    );
    let text = r.text();
    let m = |name: &str| metric(&text, name).unwrap_or_else(|| panic!("{name} missing:\n{text}"));
    assert!(m("airlock_exec_total{outcome=\"exited\"}") >= 2.0, "{text}");
    assert!(m("airlock_exec_duration_seconds_count") >= 2.0);
    assert!(
        text.contains("airlock_exec_duration_seconds_bucket{le="),
        "{text}"
    );
    assert!(m("airlock_provision_seconds_count{isolation=\"namespaces\",pool=\"warm\"}") >= 1.0);
    assert!(m("airlock_provision_seconds_count{isolation=\"namespaces\",pool=\"cold\"}") >= 1.0);
    assert_eq!(
        m("airlock_sandboxes_active"),
        1.0,
        "the session is the one live sandbox"
    );
    let pool = m("airlock_pool_ready{isolation=\"namespaces\"}");
    assert!((0.0..=1.0).contains(&pool), "pool_ready {pool}");
    assert!(
        m("airlock_rejected_total{reason=\"queue_timeout\"}") >= 1.0,
        "{text}"
    );
    assert!(m("airlock_queue_wait_seconds_count") >= 2.0);
    c.delete(&format!("/v1/sandboxes/{id}")).expect(204);
}

#[test]
fn a_pooled_sandbox_that_died_while_it_waited_is_replaced_not_served() {
    // Its init killed from outside (the host's OOM killer, an operator): the pool must not
    // hand it to a request, which would only get "the sandbox is gone".
    let d = Daemon::start(&["--pool", "1"]);
    poll(Duration::from_secs(10), || {
        (d.client().get("/readyz").json()["pool_ready"] == 1).then_some(())
    })
    .expect("the pool fills");
    let pooled = d.sandbox_processes();
    assert!(
        !pooled.is_empty(),
        "no pooled sandbox process found; log:\n{}",
        d.log()
    );
    for p in &pooled {
        let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGKILL);
    }
    // Dead, if not reaped yet (a zombie until the pool purges it).
    let dead = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
            s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'))
        })
    };
    poll(Duration::from_secs(5), || {
        pooled.iter().all(|p| dead(p.pid)).then_some(())
    })
    .expect("the pooled sandbox's processes die");
    let v = d.client().exec_ok(&sh("echo alive"));
    assert_eq!(v["stdout"], "alive\n", "{v}");
    assert!(
        d.log().contains("a ready sandbox died while it waited"),
        "the dead one was not noticed; log:\n{}",
        d.log()
    );
}
