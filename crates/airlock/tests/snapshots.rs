//! SNAPSHOTS (issue 17), end to end through the real `airlock serve` on the real kernel:
//! every exec's changeset (`files_changed`), snapshots of a session's files, restores in
//! place, sessions from a snapshot, forks, pauses (by request and when idle), the store's
//! budget, its records across a restart and a `kill -9`, and the errors of bad requests.
//! Namespaces here; the other tiers in their own files.

mod common;
mod serverutil;
mod tierutil;

use serde_json::{Value, json};
use serverutil::{Client, Daemon, poll};
use std::path::{Path, PathBuf};
use std::time::Duration;

const KEY: &str = "snapshot-test-key-0123456789abcdef";
const OTHER: &str = "snapshot-other-key-0123456789abcdef";

fn keys() -> String {
    format!("tests:{KEY}\nother:{OTHER}")
}

fn daemon_with(args: &[&str]) -> Daemon {
    let d = Daemon::start_env(args, &[("AIRLOCK_API_KEYS", &keys())]);
    d.wait_ready();
    d
}

fn daemon() -> Daemon {
    daemon_with(&["--pool", "1"])
}

/// A temporary directory of the test's own, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("airlock-snaptest-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[track_caller]
fn sh(c: &Client, id: &str, script: &str) -> Value {
    let r = c
        .session_exec(id, &json!({"cmd": ["sh", "-c", script]}))
        .expect(200)
        .json();
    assert_eq!(r["exit_code"], 0, "{script}: {r:#}");
    r
}

#[track_caller]
fn stdout(c: &Client, id: &str, script: &str) -> String {
    sh(c, id, script)["stdout"].as_str().unwrap().to_owned()
}

/// Every entry under /workspace and /tmp with its type, mode, size, link target and
/// content digest: what "exactly the same files" means.
const TREE: &str = "cd / && find workspace tmp -mindepth 1 | LC_ALL=C sort | while read -r p; do \
if [ -L \"$p\" ]; then echo \"$p l $(readlink \"$p\")\"; \
elif [ -d \"$p\" ]; then echo \"$p d $(stat -c %a \"$p\")\"; \
else echo \"$p f $(stat -c '%a %s' \"$p\") $(sha256sum < \"$p\" | cut -c1-16)\"; fi; done";

fn changes(r: &Value) -> Vec<(String, String, String)> {
    r["files_changed"]
        .as_array()
        .unwrap_or_else(|| panic!("no files_changed: {r:#}"))
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_owned(),
                c["change"].as_str().unwrap().to_owned(),
                c["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn change(path: &str, change: &str, kind: &str) -> (String, String, String) {
    (path.into(), change.into(), kind.into())
}

#[test]
fn every_exec_says_which_files_it_created_modified_and_deleted() {
    let d = daemon();
    let c = d.client_with_key(KEY);
    // A one-shot exec: what the tool wrote.
    let r = c.exec_ok(&json!({"cmd": ["sh", "-c", "mkdir out && echo hi > out/a.txt && echo x > /tmp/t"]}));
    assert_eq!(
        changes(&r),
        [
            change("/workspace/out", "created", "dir"),
            change("/workspace/out/a.txt", "created", "file")
        ],
        "{r:#}"
    );
    assert_eq!(r["files_changed"][1]["bytes"], 3);
    assert_eq!(r["files_changed_truncated"], false);
    // /tmp only when asked; none at all with [].
    let r = c.exec_ok(
        &json!({"cmd": ["sh", "-c", "echo x > /tmp/t && echo y > w"], "files_changed_in": ["/tmp"]}),
    );
    assert_eq!(changes(&r), [change("/tmp/t", "created", "file")], "{r:#}");
    let r = c.exec_ok(&json!({"cmd": ["sh", "-c", "echo y > w"], "files_changed_in": []}));
    assert_eq!(changes(&r), [], "{r:#}");
    // A session: modified (same size too), deleted, renamed, mode, symlink.
    let id = c.create_session(&json!({}));
    sh(
        &c,
        &id,
        "echo one > keep && echo two > same && echo old > gone && echo r > from && echo m > mode && mkdir d",
    );
    let r = sh(
        &c,
        &id,
        "echo ONE > same && echo more >> keep && rm gone && mv from to && chmod 700 mode && ln -s /etc/passwd d/link && rmdir d 2>/dev/null; true",
    );
    assert_eq!(
        changes(&r),
        [
            change("/workspace/d/link", "created", "symlink"),
            change("/workspace/from", "deleted", "file"),
            change("/workspace/gone", "deleted", "file"),
            change("/workspace/keep", "modified", "file"),
            change("/workspace/mode", "modified", "file"),
            change("/workspace/same", "modified", "file"),
            change("/workspace/to", "created", "file"),
        ],
        "{r:#}"
    );
    // An exec that changes nothing lists nothing.
    let r = sh(&c, &id, "cat keep > /dev/null");
    assert_eq!(changes(&r), [], "{r:#}");
    // More than a result lists: truncated.
    let r = sh(
        &c,
        &id,
        "mkdir many && cd many && i=0; while [ $i -lt 1100 ]; do : > f$i; i=$((i+1)); done",
    );
    assert_eq!(
        r["files_changed"].as_array().unwrap().len(),
        1000,
        "{}",
        r["files_changed"].as_array().unwrap().len()
    );
    assert_eq!(r["files_changed_truncated"], true);
    // A bad files_changed_in names the field.
    let e = c
        .exec(&json!({"cmd": ["true"], "files_changed_in": ["/etc"]}))
        .api_error(400);
    assert_eq!(e["field"], "files_changed_in[0]", "{e}");
}

#[test]
fn restore_brings_back_exactly_the_snapshot_and_nothing_written_after() {
    let d = daemon();
    let c = d.client_with_key(KEY);
    let id = c.create_session(&json!({}));
    sh(
        &c,
        &id,
        "mkdir -p src/empty deep/a/b && printf 'print(1)\\n' > src/main.py && chmod 755 src/main.py \
         && head -c 300000 /dev/urandom > blob && ln -s src/main.py link && ln -s /nowhere dangling \
         && echo t > /tmp/kept && chmod 600 blob",
    );
    let before = stdout(&c, &id, TREE);
    let snap = c
        .post_json(&format!("/v1/sandboxes/{id}/snapshots"), &json!({}))
        .expect(201)
        .json();
    let sid = snap["snapshot_id"].as_str().unwrap().to_owned();
    assert!(sid.starts_with("snap-"), "{snap}");
    assert_eq!(snap["kind"], "filesystem");
    assert_eq!(snap["sandbox_id"], id.as_str());
    assert!(snap["bytes"].as_u64().unwrap() >= 300_000, "{snap}");
    // Everything changes after it.
    sh(
        &c,
        &id,
        "rm -rf src && echo new > new && echo changed >> blob && rm /tmp/kept && mkdir after",
    );
    assert_ne!(stdout(&c, &id, TREE), before);
    let info = c
        .post_json(
            &format!("/v1/sandboxes/{id}/restore"),
            &json!({"snapshot_id": sid}),
        )
        .expect(200)
        .json();
    assert_eq!(info["id"], id.as_str());
    assert_eq!(stdout(&c, &id, TREE), before);
    // The restored files are the sandbox user's to change.
    sh(
        &c,
        &id,
        "echo more >> src/main.py && rm blob && touch src/empty/x",
    );
    // A second snapshot of the same content stores (almost) nothing new.
    sh(&c, &id, "rm -rf * /tmp/* ; true");
    let r = c.post_json(
        &format!("/v1/sandboxes/{id}/restore"),
        &json!({"snapshot_id": sid}),
    );
    r.expect(200);
    let again = c
        .post_json(
            &format!("/v1/sandboxes/{id}/snapshots"),
            &json!({"kind": "filesystem"}),
        )
        .expect(201)
        .json();
    assert!(
        again["stored_bytes"].as_u64().unwrap() < 50_000,
        "the same 300 kB stored again: {again}"
    );
    let list = c.get("/v1/snapshots").expect(200).json();
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 2, "{list}");
    assert!(list["used_bytes"].as_u64().unwrap() >= 300_000, "{list}");
    // Another key sees none of them, and cannot use them.
    let o = d.client_with_key(OTHER);
    assert_eq!(o.get("/v1/snapshots").expect(200).json()["snapshots"], json!([]));
    o.get(&format!("/v1/snapshots/{sid}")).api_error(404);
    let oid = o.create_session(&json!({}));
    o.post_json(
        &format!("/v1/sandboxes/{oid}/restore"),
        &json!({"snapshot_id": sid}),
    )
    .api_error(404);
    o.post_json("/v1/sandboxes", &json!({"from_snapshot": sid}))
        .api_error(404);
    o.delete(&format!("/v1/snapshots/{sid}")).api_error(404);
    // DELETE frees what the other snapshot does not share.
    c.delete(&format!(
        "/v1/snapshots/{}",
        again["snapshot_id"].as_str().unwrap()
    ))
    .expect(204);
    c.delete(&format!("/v1/snapshots/{sid}")).expect(204);
    c.get(&format!("/v1/snapshots/{sid}")).api_error(404);
    let list = c.get("/v1/snapshots").expect(200).json();
    assert_eq!(list["snapshots"], json!([]));
    assert!(list["used_bytes"].as_u64().unwrap() < 100_000, "{list}");
}

#[test]
fn sessions_from_a_snapshot_and_forks_are_independent_copies() {
    let d = daemon();
    let c = d.client_with_key(KEY);
    let id = c.create_session(&json!({"limits": {"memory_bytes": 134217728}}));
    sh(&c, &id, "mkdir data && echo base > data/f && ln -s data/f l");
    let tree = stdout(&c, &id, TREE);
    let sid = c
        .post_json(&format!("/v1/sandboxes/{id}/snapshots"), &json!({}))
        .expect(201)
        .json()["snapshot_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // A new session from it: the files, the limits.
    let r = c
        .post_json("/v1/sandboxes", &json!({"from_snapshot": sid}))
        .expect(201)
        .json();
    let copy = r["id"].as_str().unwrap().to_owned();
    assert_eq!(stdout(&c, &copy, TREE), tree);
    let info = c.get(&format!("/v1/sandboxes/{copy}")).expect(200).json();
    assert_eq!(info["from_snapshot"], sid.as_str());
    assert_eq!(info["status"], "running");
    let peak = c
        .session_exec(
            &copy,
            &json!({"cmd": ["true"], "limits": {"memory_bytes": 268435456}}),
        )
        .api_error(400);
    assert_eq!(
        peak["field"], "limits.memory_bytes",
        "the snapshot's 128 MiB cap: {peak}"
    );
    // Forks: each a copy of the parent now, none seeing the others' writes.
    sh(&c, &id, "echo after-snapshot > data/g");
    let forked = c
        .post_json(&format!("/v1/sandboxes/{id}/fork"), &json!({"count": 3}))
        .expect(201)
        .json();
    let kids: Vec<String> = forked["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kids.len(), 3, "{forked}");
    let parent_tree = stdout(&c, &id, TREE);
    for (i, k) in kids.iter().enumerate() {
        assert_eq!(stdout(&c, k, TREE), parent_tree, "fork {i}");
        sh(&c, k, &format!("echo fork{i} > mine && echo {i} >> data/f"));
    }
    for (i, k) in kids.iter().enumerate() {
        assert_eq!(
            stdout(&c, k, "ls; cat data/f"),
            format!("data\nl\nmine\nbase\n{i}\n"),
            "fork {i}"
        );
    }
    assert_eq!(stdout(&c, &id, "ls; cat data/f"), "data\nl\nbase\n");
    for s in kids.iter().chain([&copy]) {
        c.delete(&format!("/v1/sandboxes/{s}")).expect(204);
    }
    // A policy changed while the session ran is what its forks and snapshots get.
    let net = c.create_session(&json!({"network": {"mode": "proxy", "allow": ["a.example", "b.example"]}}));
    c.request(
        "PATCH",
        &format!("/v1/sandboxes/{net}/network"),
        &[("Content-Type", "application/json")],
        Some(json!({"allow": ["a.example"]}).to_string().as_bytes()),
    )
    .expect(200);
    let kid = c
        .post_json(&format!("/v1/sandboxes/{net}/fork"), &json!({"count": 1}))
        .expect(201)
        .json()["sandboxes"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let nsid = c
        .post_json(&format!("/v1/sandboxes/{net}/snapshots"), &json!({}))
        .expect(201)
        .json()["snapshot_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let from_net = c
        .post_json("/v1/sandboxes", &json!({"from_snapshot": nsid}))
        .expect(201)
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for s in [&kid, &from_net] {
        let shown = c.get(&format!("/v1/sandboxes/{s}/network")).expect(200).json();
        assert_eq!(shown["allow"], json!(["a.example"]), "{shown}");
    }
    for s in [&kid, &from_net, &net] {
        c.delete(&format!("/v1/sandboxes/{s}")).expect(204);
    }
    // The fork's bounds.
    for count in [json!(0), json!(17), json!(-1), json!("2")] {
        let e = c
            .post_json(&format!("/v1/sandboxes/{id}/fork"), &json!({"count": count}))
            .api_error(400);
        assert_eq!(e["field"], "count", "{count}: {e}");
    }
    let e = c
        .post_json(&format!("/v1/sandboxes/{id}/fork"), &json!({}))
        .api_error(400);
    assert_eq!(e["field"], "count", "{e}");
    // A snapshot's tier is the session's: another isolation or an image is refused.
    let e = c
        .post_json(
            "/v1/sandboxes",
            &json!({"from_snapshot": sid, "isolation": "gvisor"}),
        )
        .api_error(400);
    assert_eq!(e["field"], "isolation", "{e}");
    let e = c
        .post_json(
            "/v1/sandboxes",
            &json!({"from_snapshot": sid, "image": "python:3.12-slim"}),
        )
        .api_error(400);
    assert_eq!(e["field"], "image", "{e}");
}

#[test]
fn a_paused_session_refuses_execs_until_resumed_and_its_processes_make_no_progress() {
    let d = daemon();
    let c = d.client_with_key(KEY);
    let id = c.create_session(&json!({}));
    // A background counter: it appends a line every 50 ms.
    c.session_exec(
        &id,
        &json!({"cmd": ["sh", "-c", "while :; do echo x >> /tmp/count; sleep 0.05; done"], "background": true}),
    )
    .expect(201);
    poll(Duration::from_secs(10), || {
        (stdout(&c, &id, "wc -l < /tmp/count 2>/dev/null || echo 0").trim() != "0").then_some(())
    })
    .expect("the counter counts");
    let info = c
        .post_json(&format!("/v1/sandboxes/{id}/pause"), &json!({}))
        .expect(200)
        .json();
    assert_eq!(info["status"], "paused");
    let e = c.session_exec(&id, &json!({"cmd": ["true"]})).api_error(409);
    assert_eq!(e["code"], "paused", "{e}");
    assert!(e["message"].as_str().unwrap().contains("resume"), "{e}");
    c.get(&format!("/v1/sandboxes/{id}/files?path=x")).api_error(409);
    // Listing and showing it still work.
    assert_eq!(
        c.get(&format!("/v1/sandboxes/{id}")).expect(200).json()["status"],
        "paused"
    );
    // A snapshot of a paused session works (and it stays paused).
    c.post_json(&format!("/v1/sandboxes/{id}/snapshots"), &json!({}))
        .expect(201);
    assert_eq!(
        c.get(&format!("/v1/sandboxes/{id}")).expect(200).json()["status"],
        "paused"
    );
    // Frozen: the count of a second's wait is the count of no wait.
    let frozen_count = |c: &Client| {
        c.post_json(&format!("/v1/sandboxes/{id}/resume"), &json!({}))
            .expect(200);
        let n: u64 = stdout(c, &id, "wc -l < /tmp/count").trim().parse().unwrap();
        c.post_json(&format!("/v1/sandboxes/{id}/pause"), &json!({}))
            .expect(200);
        n
    };
    let a = frozen_count(&c);
    std::thread::sleep(Duration::from_millis(1000));
    let b: u64 = {
        c.post_json(&format!("/v1/sandboxes/{id}/resume"), &json!({}))
            .expect(200);
        stdout(&c, &id, "wc -l < /tmp/count").trim().parse().unwrap()
    };
    assert!(b <= a + 3, "the counter ran while paused: {a} -> {b}");
    // Resumed, it goes on.
    std::thread::sleep(Duration::from_millis(500));
    let later: u64 = stdout(&c, &id, "wc -l < /tmp/count").trim().parse().unwrap();
    assert!(
        later > b + 3,
        "the counter did not go on after resume: {b} -> {later}"
    );
    // Pause and resume twice are harmless.
    c.post_json(&format!("/v1/sandboxes/{id}/resume"), &json!({}))
        .expect(200);
    c.post_json(&format!("/v1/sandboxes/{id}/pause"), &json!({}))
        .expect(200);
    c.post_json(&format!("/v1/sandboxes/{id}/pause"), &json!({}))
        .expect(200);
    // A paused session is deleted like any other.
    c.delete(&format!("/v1/sandboxes/{id}")).expect(204);
}

#[test]
fn an_idle_session_pauses_itself_and_the_next_request_resumes_it() {
    let d = daemon();
    let c = d.client_with_key(KEY);
    let id = c.create_session(&json!({"on_idle": "pause", "idle_timeout_s": 1}));
    sh(&c, &id, "echo 1 > f");
    let info = c.get(&format!("/v1/sandboxes/{id}")).expect(200).json();
    assert_eq!(info["on_idle"], "pause");
    poll(Duration::from_secs(10), || {
        (c.get(&format!("/v1/sandboxes/{id}")).expect(200).json()["status"] == "paused").then_some(())
    })
    .expect("the idle session paused");
    // The next exec resumes it by itself.
    assert_eq!(stdout(&c, &id, "cat f"), "1\n");
    assert_eq!(
        c.get(&format!("/v1/sandboxes/{id}")).expect(200).json()["status"],
        "running"
    );
    let e = c
        .post_json("/v1/sandboxes", &json!({"on_idle": "sleep"}))
        .api_error(400);
    assert_eq!(e["field"], "on_idle", "{e}");
    let e = c
        .post_json("/v1/sandboxes", &json!({"on_idle": "pause", "idle_timeout_s": 0}))
        .api_error(400);
    assert_eq!(e["field"], "idle_timeout_s", "{e}");
}

#[test]
fn bad_snapshot_requests_get_clear_errors_and_change_nothing() {
    let d = daemon();
    let c = d.client_with_key(KEY);
    let id = c.create_session(&json!({}));
    sh(&c, &id, "echo keep > f");
    for (method, path, body) in [
        (
            "POST",
            format!("/v1/sandboxes/{id}/restore"),
            json!({"snapshot_id": "snap-0000000000000000"}),
        ),
        (
            "POST",
            "/v1/sandboxes".to_owned(),
            json!({"from_snapshot": "snap-0000000000000000"}),
        ),
    ] {
        let e = c
            .request(
                method,
                &path,
                &[("Content-Type", "application/json")],
                Some(body.to_string().as_bytes()),
            )
            .api_error(404);
        assert!(
            e["message"].as_str().unwrap().contains("snap-0000000000000000"),
            "{e}"
        );
    }
    c.get("/v1/snapshots/snap-0000000000000000").api_error(404);
    c.delete("/v1/snapshots/nonsense").api_error(404);
    let e = c
        .post_json(&format!("/v1/sandboxes/{id}/restore"), &json!({}))
        .api_error(400);
    assert_eq!(e["field"], "snapshot_id", "{e}");
    let e = c
        .post_json(&format!("/v1/sandboxes/{id}/snapshots"), &json!({"kind": "full"}))
        .api_error(400);
    assert_eq!(e["field"], "kind", "{e}");
    let e = c
        .post_json(
            &format!("/v1/sandboxes/{id}/snapshots"),
            &json!({"kind": "everything"}),
        )
        .api_error(400);
    assert_eq!(e["field"], "kind", "{e}");
    assert_eq!(stdout(&c, &id, "cat f"), "keep\n");
    // Unknown and expired sessions.
    c.post_json("/v1/sandboxes/nope/snapshots", &json!({}))
        .api_error(404);
    let short = c.create_session(&json!({"ttl_s": 1}));
    poll(Duration::from_secs(10), || {
        (c.get(&format!("/v1/sandboxes/{short}")).status == 410).then_some(())
    })
    .expect("the session expires");
    c.post_json(&format!("/v1/sandboxes/{short}/snapshots"), &json!({}))
        .api_error(410);
    assert_eq!(c.get("/v1/snapshots").expect(200).json()["snapshots"], json!([]));
}

#[test]
fn the_budget_refuses_what_does_not_fit_and_leaves_nothing() {
    let dir = TempDir::new("budget");
    let store = dir.path().join("store");
    let d = daemon_with(&[
        "--pool",
        "0",
        "--snapshot-dir",
        store.to_str().unwrap(),
        "--snapshot-budget",
        "1M",
    ]);
    let c = d.client_with_key(KEY);
    let id = c.create_session(&json!({}));
    sh(&c, &id, "head -c 600000 /dev/urandom > a");
    c.post_json(&format!("/v1/sandboxes/{id}/snapshots"), &json!({}))
        .expect(201);
    let files_before = files_under(&store);
    sh(&c, &id, "head -c 600000 /dev/urandom > b");
    let e = c
        .post_json(&format!("/v1/sandboxes/{id}/snapshots"), &json!({}))
        .api_error(507);
    assert_eq!(e["code"], "snapshot_budget", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("--snapshot-budget"),
        "{e}"
    );
    assert_eq!(files_under(&store), files_before, "a refused snapshot left files");
    assert_eq!(
        c.get("/v1/snapshots").expect(200).json()["snapshots"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// Every file under `dir` (relative paths, sorted), but the store's lock.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path().strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn snapshots_outlive_the_daemon_even_a_killed_one() {
    let dir = TempDir::new("restart");
    let store = dir.path().join("store");
    let args = ["--pool", "0", "--snapshot-dir", store.to_str().unwrap()];
    let sid;
    {
        let mut d = daemon_with(&args);
        let c = d.client_with_key(KEY);
        let id = c.create_session(&json!({}));
        sh(&c, &id, "echo survives > f && mkdir e");
        sid = c
            .post_json(&format!("/v1/sandboxes/{id}/snapshots"), &json!({}))
            .expect(201)
            .json()["snapshot_id"]
            .as_str()
            .unwrap()
            .to_owned();
        // A second daemon on the same store finds it in use: no snapshots, and it says why.
        let second = daemon_with(&args);
        let e = second.client_with_key(KEY).get("/v1/snapshots").api_error(503);
        assert_eq!(e["code"], "snapshots_unavailable", "{e}");
        drop(second);
        d.signal(nix::sys::signal::Signal::SIGKILL);
        d.wait_exit(Duration::from_secs(10)).expect("killed");
    }
    let files_after_kill = files_under(&store);
    let d = daemon_with(&args);
    let c = d.client_with_key(KEY);
    let list = c.get("/v1/snapshots").expect(200).json();
    assert_eq!(list["snapshots"][0]["snapshot_id"], sid.as_str(), "{list}");
    let id = c
        .post_json("/v1/sandboxes", &json!({"from_snapshot": sid}))
        .expect(201)
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(stdout(&c, &id, "cat f; ls -d e"), "survives\ne\n");
    // Nothing the records do not own was left by the kill.
    assert_eq!(files_under(&store), files_after_kill);
    c.delete(&format!("/v1/snapshots/{sid}")).expect(204);
    let left: Vec<String> = files_under(&store)
        .into_iter()
        .filter(|f| !f.ends_with("lock"))
        .collect();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "files left after the last snapshot was deleted"
    );
}

/// docs/snapshots.md's example, run as typed against a daemon on its own port.
#[test]
fn readme_snapshots_block_runs_as_typed() {
    let d = Daemon::start(&["--pool", "1"]);
    d.wait_ready();
    let script = common::docs::doc_shell_block("docs/snapshots.md", "# Snapshots")
        .replace("localhost:8710", &format!("127.0.0.1:{}", d.port));
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the docs/snapshots.md block failed: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "[[\"/workspace/app.py\",\"created\"],[\"/workspace/data\",\"created\"]]\n\
         [[\"/workspace/app.py\",\"modified\"],[\"/workspace/data\",\"deleted\"]]\n\
         running\n\
         v1\napp.py\ndata\n\
         3\n\
         v1\n\
         paused\n\
         running\n\
         204\n"
    );
}

/// A tier that takes full snapshots: a session's background program (a counter kept in
/// its memory) goes on in each fork and in a session from the snapshot, from where it
/// was; the files come along; a fork's writes are its own; pause, changesets and an
/// in-place restore of the files work as on the namespace tier.
fn tier_snapshots(tier: &'static str) {
    let Some(t) = tierutil::Tier::selected(tier, &["namespaces", "gvisor", "microvm"]) else {
        return;
    };
    let d = Daemon::start_env(t.serve_args(), &[("AIRLOCK_API_KEYS", &keys())]);
    d.wait_ready();
    let c = d.client_with_key(KEY);
    let id = c.create_session(&json!({"isolation": tier, "limits": {"memory_bytes": 536870912}}));
    let r = sh(&c, &id, "echo base > f && mkdir d");
    assert_eq!(
        changes(&r),
        [
            change("/workspace/d", "created", "dir"),
            change("/workspace/f", "created", "file")
        ],
        "{tier}: {r:#}"
    );
    // The counter lives in the program's memory; the file only shows it.
    c.session_exec(
        &id,
        &json!({"cmd": ["python3", "-c", "import time\nn = 0\nwhile True:\n    n += 1\n    open('/tmp/n', 'w').write(str(n))\n    time.sleep(0.1)"], "background": true}),
    )
    .expect(201);
    let count = |c: &Client, id: &str| -> u64 {
        stdout(c, id, "cat /tmp/n 2>/dev/null || echo 0")
            .trim()
            .parse()
            .unwrap_or(0)
    };
    poll(Duration::from_secs(120), || (count(&c, &id) >= 3).then_some(())).expect("the counter counts");
    let snap = c
        .post_json(&format!("/v1/sandboxes/{id}/snapshots"), &json!({}))
        .expect(201)
        .json();
    assert_eq!(snap["kind"], "full", "{tier}: {snap}");
    let at_snapshot = count(&c, &id);
    let sid = snap["snapshot_id"].as_str().unwrap().to_owned();
    let kids: Vec<String> = c
        .post_json(&format!("/v1/sandboxes/{id}/fork"), &json!({"count": 2}))
        .expect(201)
        .json()["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    let from = c
        .post_json("/v1/sandboxes", &json!({"from_snapshot": sid}))
        .expect(201)
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for k in kids.iter().chain([&from]) {
        assert_eq!(stdout(&c, k, "cat f; ls"), "base\nd\nf\n", "{tier}: {k}");
        let first = count(&c, k);
        assert!(
            first >= at_snapshot.min(3),
            "{tier}: {k} counts from {first}, the snapshot had {at_snapshot}"
        );
        poll(Duration::from_secs(120), || {
            (count(&c, k) > first + 2).then_some(())
        })
        .unwrap_or_else(|| panic!("{tier}: the counter does not go on in {k}"));
    }
    // Sandboxes started again by a checkpoint or made by a restore outlive the thread
    // that asked (tokio's blocking threads end after 10 s idle, and processes tied to
    // one die with it).
    std::thread::sleep(Duration::from_secs(12));
    for k in kids.iter().chain([&from, &id]) {
        assert_eq!(stdout(&c, k, "cat f"), "base\n", "{tier}: {k} after 12 s");
    }
    sh(&c, &kids[0], "echo mine > f");
    assert_eq!(stdout(&c, &kids[1], "cat f"), "base\n", "{tier}");
    assert_eq!(stdout(&c, &id, "cat f"), "base\n", "{tier}");
    // Pause, resume; an in-place restore of the files.
    c.post_json(&format!("/v1/sandboxes/{id}/pause"), &json!({}))
        .expect(200);
    let e = c.session_exec(&id, &json!({"cmd": ["true"]})).api_error(409);
    assert_eq!(e["code"], "paused", "{tier}: {e}");
    c.post_json(&format!("/v1/sandboxes/{id}/resume"), &json!({}))
        .expect(200);
    sh(&c, &id, "rm -r d && echo changed > f");
    c.post_json(
        &format!("/v1/sandboxes/{id}/restore"),
        &json!({"snapshot_id": sid}),
    )
    .expect(200);
    assert_eq!(stdout(&c, &id, "cat f; ls"), "base\nd\nf\n", "{tier}");
    for k in kids.iter().chain([&from, &id]) {
        c.delete(&format!("/v1/sandboxes/{k}")).expect(204);
    }
    c.delete(&format!("/v1/snapshots/{sid}")).expect(204);
}

#[test]
fn gvisor_takes_full_snapshots_and_forks() {
    tier_snapshots("gvisor");
}

#[test]
fn microvm_takes_full_snapshots_and_forks() {
    tier_snapshots("microvm");
}
