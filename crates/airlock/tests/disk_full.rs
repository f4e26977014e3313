//! Issue 12, item 7: a file larger than the sandbox's free space wedged everything (the CLI
//! hung ignoring SIGTERM, a session answered every later request with a stale error, the
//! daemon never exited on SIGTERM). A failed write now fails once, with 507 `disk_full`
//! naming the disk and the file, and leaves the sandbox usable; the CLI refuses an
//! oversized `--file` before it starts anything. The same on every tier, with small
//! sizes, is in `contract.rs`.
//!
//! Host checks look only at what the test's own daemon owns.

mod common;
mod serverutil;

use common::{TestCommand, ok_stdout};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use serverutil::{Client, Daemon, owner_dirs, owner_processes, poll};
use std::time::Duration;

const MIB: usize = 1 << 20;

fn sh(script: &str) -> Value {
    json!({"cmd": ["sh", "-c", script]})
}

/// Runs `airlock ARGS`, killing it if it has not ended within `bound`: the bug was a
/// hang, which must fail the test rather than hang it.
fn airlock_within(args: &[&str], bound: Duration) -> std::process::Output {
    let mut cmd = std::process::Command::new(common::airlock_bin());
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().expect("spawn airlock");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(bound) {
        Ok(out) => out.expect("wait airlock"),
        Err(_) => {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
            panic!("airlock {args:?} still running after {bound:?}");
        }
    }
}

#[test]
fn cli_file_larger_than_the_disk_is_refused_before_anything_starts() {
    let dir = tempfile::Builder::new()
        .prefix("airlock-test-disk-full-cli-")
        .tempdir()
        .unwrap();
    // Sparse: 100 GiB that take no room on the host. Refused from its size alone, it is
    // never read (reading it would take minutes and 100 GiB of memory).
    let huge = dir.path().join("big100g.bin");
    std::fs::File::create(&huge).unwrap().set_len(100 << 30).unwrap();
    let huge = huge.to_str().unwrap();
    let out = airlock_within(&["run", "--file", huge, "--", "ls"], Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(
        err.contains(&format!("--file {huge}"))
            && err.contains("the file (100 GiB)")
            && err.contains("does not fit the sandbox's disk (--disk 64 MiB)"),
        "{err}"
    );

    // The disk is a tmpfs whose pages count against --memory: a file larger than the
    // memory cap could never be written either (init would be OOM-killed part-way).
    let out = airlock_within(
        &["run", "--disk", "1G", "--file", huge, "--", "ls"],
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    std::fs::File::options()
        .write(true)
        .open(huge)
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    let out = airlock_within(
        &["run", "--disk", "1G", "--file", huge, "--", "ls"],
        Duration::from_secs(30),
    );
    let err2 = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        err.contains("does not fit the sandbox's disk (--disk 1 GiB)")
            && err2.contains(
                "the file (300 MiB) does not fit the sandbox's memory (--memory 256 MiB), which the files on its disk count against"
            ),
        "{err}\n{err2}"
    );

    // Two files that fit one by one but not together; the error names the one that
    // overflows and the --disk given.
    let a = dir.path().join("a.bin");
    let b = dir.path().join("b.bin");
    std::fs::write(&a, vec![1u8; 700 << 10]).unwrap();
    std::fs::write(&b, vec![2u8; 700 << 10]).unwrap();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let b_arg = format!("{b}:data/b.bin");
    let out = airlock_within(
        &["run", "--disk", "1M", "--file", a, "--file", &b_arg, "--", "ls"],
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        err.contains(&format!("--file {b_arg}"))
            && err.contains("1.4 MiB in all")
            && err.contains("(--disk 1 MiB)"),
        "{err}"
    );

    // What fits is still copied in, up to the whole disk.
    let out = TestCommand::run()
        .args(["--disk", "2M", "--file", a, "--file", &b_arg, "--", "sh", "-c"])
        .args(["wc -c a.bin data/b.bin"])
        .output();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("716800 a.bin") && text.contains("716800 data/b.bin"),
        "{text}"
    );
}

/// Creates a session (with `body`), and fails one upload larger than its whole disk and
/// one larger than what is left of it.
fn session_with_failed_uploads(c: &Client, body: &Value) -> String {
    let id = c.create_session(body);
    // Larger than the whole 64 MiB disk: refused unsent.
    let m = c.put_disk_full(&id, "big.bin", 100 * MIB);
    assert!(
        m.contains("the sandbox's disk (64 MiB) has no room for file 'big.bin' (100 MiB)"),
        "{m}"
    );
    // 60 MiB fit; 15 MiB more do not: the disk fills part-way through the write.
    c.put(
        &format!("/v1/sandboxes/{id}/files?path=data/a.bin"),
        &vec![1u8; 60 * MIB],
    )
    .expect(204);
    let m = c.put_disk_full(&id, "data/b.bin", 15 * MIB);
    assert!(
        m.contains("the sandbox's disk (64 MiB) has no room for file 'data/b.bin' (15 MiB)")
            && m.contains("of it is free"),
        "{m}"
    );
    id
}

#[test]
fn session_upload_beyond_the_disk_fails_once_with_507_and_the_session_still_works() {
    let d = Daemon::start(&["--pool", "0", "--max-body", "128M"]);
    let c = d.client();
    let id = session_with_failed_uploads(&c, &json!({"ttl_s": 600}));

    // Every later request gets its own answer: the listing (without the failed file's
    // part, which was removed), a read, a small write, an exec.
    let entries = c.get(&format!("/v1/sandboxes/{id}/files")).expect(200).json();
    let listed: Vec<(&str, u64)> = entries
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["size"].as_u64().unwrap()))
        .collect();
    assert_eq!(listed, [("data", 0), ("data/a.bin", 60 << 20)], "{entries}");
    c.put(
        &format!("/v1/sandboxes/{id}/files?path=note.txt"),
        b"still here\n",
    )
    .expect(204);
    let got = c
        .get(&format!("/v1/sandboxes/{id}/files?path=note.txt"))
        .expect(200);
    assert_eq!(got.body, b"still here\n");
    c.get(&format!("/v1/sandboxes/{id}/files?path=data/b.bin"))
        .api_error(404);
    let v = c
        .session_exec(&id, &sh("cat note.txt; wc -c < data/a.bin; rm data/a.bin"))
        .expect(200)
        .json();
    assert_eq!(ok_stdout(&v), format!("still here\n{}\n", 60 * MIB), "{v}");
    // With the room freed, the same upload succeeds.
    c.put(
        &format!("/v1/sandboxes/{id}/files?path=data/b.bin"),
        &vec![2u8; 15 * MIB],
    )
    .expect(204);
    let v = c.session_exec(&id, &sh("wc -c < data/b.bin")).expect(200).json();
    assert_eq!(ok_stdout(&v), format!("{}\n", 15 * MIB), "{v}");

    // The disk is a tmpfs whose pages count against the memory cap: a file as large as
    // the cap is refused unsent too (writing it got init OOM-killed), and the session
    // stays usable.
    let small = c.create_session(&json!({
        "ttl_s": 600, "limits": {"memory_bytes": 32 * MIB, "disk_bytes": 64 * MIB},
    }));
    let e = c
        .put(
            &format!("/v1/sandboxes/{small}/files?path=big.bin"),
            &vec![3u8; 40 * MIB],
        )
        .api_error(507);
    assert!(
        e["message"].as_str().unwrap().contains(
            "the sandbox's memory (32 MiB), which the files on its disk count against, has no room for file 'big.bin' (40 MiB)"
        ),
        "{e}"
    );
    let v = c.session_exec(&small, &sh("ls; echo ok")).expect(200).json();
    assert_eq!(ok_stdout(&v), "ok\n", "{v}");

    // A one-shot exec whose files do not fit its disk: the same 507, nothing run.
    let e = c
        .exec(&json!({
            "cmd": ["ls"],
            "files": [{"path": "x.txt", "content": "x".repeat(2 * MIB)}],
            "limits": {"disk_bytes": MIB},
        }))
        .api_error(507);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("the sandbox's disk (1 MiB) has no room for file 'x.txt' (2 MiB)"),
        "{e}"
    );
}

#[test]
fn sigterm_of_a_daemon_whose_session_upload_failed_exits_and_expiry_purges() {
    let mut d = Daemon::start(&["--pool", "0", "--max-body", "128M"]);
    let c = d.client();
    let short = session_with_failed_uploads(&c, &json!({"ttl_s": 2}));
    let long = session_with_failed_uploads(&c, &json!({"ttl_s": 600}));
    // The short one expires as any other: 410, its sandbox purged.
    let expired = poll(Duration::from_secs(30), || {
        (c.get(&format!("/v1/sandboxes/{short}")).status == 410 && !d.sandbox_cgroups().contains(&short))
            .then_some(())
    });
    assert!(
        expired.is_some(),
        "{short} did not expire and go: {:?}",
        d.sandbox_cgroups()
    );
    assert!(d.sandbox_cgroups().contains(&long), "the live session went too");
    let v = c.session_exec(&long, &sh("echo up")).expect(200).json();
    assert_eq!(ok_stdout(&v), "up\n");

    // SIGTERM with the other one live: the daemon exits 0 and leaves nothing.
    let _g = serverutil::start_lock();
    d.signal(Signal::SIGTERM);
    let status = d
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("still running 60 s after SIGTERM; log:\n{}", d.log()));
    assert_eq!(status.code(), Some(0), "{status:?}; log:\n{}", d.log());
    let procs_gone = poll(Duration::from_secs(5), || {
        owner_processes(&d.owner).is_empty().then_some(())
    });
    assert!(
        procs_gone.is_some(),
        "processes left: {:?}",
        owner_processes(&d.owner)
    );
    let dirs = owner_dirs(&d.owner);
    assert!(dirs.is_empty(), "cgroups left: {dirs:?}");
}
