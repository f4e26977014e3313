//! Snapshots on the gVisor tier (issue 17) with the real runsc, run as root: pause and
//! resume, full snapshots (checkpoint, restore, forks), each exec's changeset, and the
//! writable filesystem exported and imported as tar. Each test skips, saying why, where
//! gVisor cannot run.

use airlock_backend::{Backend, Capture, ErrorKind, Purpose, Sandbox, Shape};
use airlock_gvisor::{GvisorBackend, GvisorOptions};
use airlock_spec::Spec;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The backend, or `None` (with the reason printed) where gVisor cannot run.
fn backend() -> Option<&'static GvisorBackend> {
    static B: OnceLock<Result<GvisorBackend, String>> = OnceLock::new();
    let b = B.get_or_init(|| {
        let mut options = GvisorOptions::from_env();
        options.agent = env!("CARGO_BIN_EXE_airlock-gvisor-agent").into();
        let b = GvisorBackend::new(options);
        b.prepare().map(|()| b).map_err(|e| e.to_string())
    });
    match b {
        Ok(b) => Some(b),
        Err(reason) => {
            eprintln!("skipped: gVisor is not available here: {reason}");
            None
        }
    }
}

fn sh(script: &str) -> Spec {
    Spec::new(vec!["/bin/sh".into(), "-c".into(), script.into()])
}

fn session(b: &GvisorBackend) -> Box<dyn Sandbox> {
    b.create(&Shape::of(&sh("true")), Purpose::Session)
        .expect("a session sandbox")
}

/// Lines of `fd` that arrive within `wait` (non-blocking reads).
fn lines_within(fd: &OwnedFd, wait: Duration) -> Vec<u64> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
    let mut file = std::fs::File::from(fd.try_clone().unwrap());
    let mut text = Vec::new();
    let end = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("reading the program's output: {e}"),
        }
    }
    String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[test]
fn pause_stops_progress_and_resume_continues() {
    let Some(b) = backend() else { return };
    let mut sb = session(b);
    // A program alongside execs counting on its stdout, and a file in /tmp it counts in.
    let spawned = sb
        .spawn(
            &sh("i=0; while :; do i=$((i+1)); echo $i; echo $i > /tmp/count; sleep 0.05; done"),
            airlock_backend::Stdio::Pipes,
        )
        .unwrap();
    let before = lines_within(&spawned.stdout, Duration::from_millis(500));
    assert!(!before.is_empty(), "the program counts before the pause");

    let t = Instant::now();
    sb.pause().unwrap();
    let paused_in = t.elapsed();
    sb.pause().unwrap(); // idempotent
    // What was written before the pause took effect is drained; then nothing comes.
    let _ = lines_within(&spawned.stdout, Duration::from_millis(300));
    let during = lines_within(&spawned.stdout, Duration::from_millis(1000));
    assert!(during.is_empty(), "a paused sandbox made progress: {during:?}");

    // Requests to the agent are refused at once, not left waiting for a resume.
    let t = Instant::now();
    let e = sb.exec(&sh("true"), &mut Capture, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("sandbox"), "{e}");
    assert!(e.to_string().contains("is paused"), "{e}");
    let e = sb.write_file("a.txt", 0o644, b"x", &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let e = sb.read_file("a.txt", 10).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let e = sb.list_files().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let e = sb.spawn(&sh("true"), airlock_backend::Stdio::Pipes).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "refusals took {:?}",
        t.elapsed()
    );
    let dir = tempfile::tempdir().unwrap();
    let e = sb.checkpoint(dir.path()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(sb.is_alive());

    let t = Instant::now();
    sb.resume().unwrap();
    let resumed_in = t.elapsed();
    sb.resume().unwrap(); // idempotent
    let after = lines_within(&spawned.stdout, Duration::from_millis(500));
    assert!(!after.is_empty(), "the program counts again after resume");
    // It went on from where it was: the same process, its memory kept.
    assert!(after[0] > *before.last().unwrap(), "{before:?} then {after:?}");
    assert!(
        after[0] <= before.last().unwrap() + 10,
        "the count jumped over the pause: {before:?} then {after:?}"
    );
    let r = sb.exec(&sh("cat /tmp/count"), &mut Capture, &[]).unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    eprintln!("pause {paused_in:?}, resume {resumed_in:?}");
    spawned.handle.signal(9).unwrap();
}

/// What the heartbeat program last wrote: its random seed (drawn once, kept in its
/// memory) and its count.
fn beat(sb: &mut Box<dyn Sandbox>) -> (String, u64) {
    for _ in 0..100 {
        let r = sb
            .exec(&sh("cat /tmp/beat 2>/dev/null"), &mut Capture, &[])
            .unwrap();
        if let Some((seed, n)) = r.stdout.split_once(' ')
            && let Ok(n) = n.trim().parse()
        {
            return (seed.to_owned(), n);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no heartbeat");
}

const HEARTBEAT: &str = "import os, time\nseed = os.urandom(8).hex()\nn = 0\nwhile True:\n    n += 1\n    open('/tmp/beat.new', 'w').write(f'{seed} {n}')\n    os.rename('/tmp/beat.new', '/tmp/beat')\n    time.sleep(0.05)\n";

#[test]
fn a_full_snapshot_restores_sandboxes_whose_programs_run_on_with_their_memory() {
    let Some(b) = backend() else { return };
    let shape = Shape::of(&sh("true"));
    let mut sb = b.create(&shape, Purpose::Session).unwrap();
    sb.write_file("note.txt", 0o644, b"before", &[]).unwrap();
    let heart = sb
        .spawn(
            &Spec::new(vec!["python3".into(), "-c".into(), HEARTBEAT.into()]),
            airlock_backend::Stdio::Pipes,
        )
        .unwrap();
    let (seed, _) = beat(&mut sb);
    let r = sb.exec(&sh("true"), &mut Capture, &[]).unwrap();
    eprintln!(
        "the original: memory peak during an exec {} MiB",
        r.memory_peak_bytes >> 20
    );
    let dir = tempfile::tempdir().unwrap();
    let t = Instant::now();
    assert!(b.checkpoints());
    assert!(sb.checkpoint(dir.path()).unwrap());
    let checkpointed = t.elapsed();
    let image: u64 = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let (seed0, n0) = beat(&mut sb);

    // The sandbox runs on: the same program (its seed), still counting; its handle
    // still signals and waits; new programs start.
    assert_eq!(seed0, seed);
    std::thread::sleep(Duration::from_millis(300));
    assert!(beat(&mut sb).1 > n0);
    let echo = sb.spawn(&sh("echo 8"), airlock_backend::Stdio::Pipes).unwrap();
    assert_eq!(lines_within(&echo.stdout, Duration::from_millis(1000)), [8]);

    // Two sandboxes from one snapshot (a fork): each has the program, its memory, the
    // files; each goes its own way.
    let mut forks = Vec::new();
    for i in 0..2 {
        let t = Instant::now();
        let mut f = b.restore(&shape, dir.path(), Purpose::Session).unwrap();
        let restored = t.elapsed();
        let (s, n) = beat(&mut f);
        assert_eq!(s, seed, "the restored program is the one that ran (its memory)");
        let r = f
            .exec(&sh("cat note.txt; echo fork > mine.txt"), &mut Capture, &[])
            .unwrap();
        assert_eq!(r.stdout, "before", "{r:?}");
        std::thread::sleep(Duration::from_millis(300));
        assert!(beat(&mut f).1 > n, "the restored program runs on");
        let r = f
            .exec(&sh("cat /proc/meminfo | head -0"), &mut Capture, &[])
            .unwrap();
        eprintln!(
            "restore {i}: {restored:?}, memory peak during an exec {} MiB",
            r.memory_peak_bytes >> 20
        );
        // It spawns programs of its own.
        let p = f.spawn(&sh("echo 7"), airlock_backend::Stdio::Pipes).unwrap();
        assert_eq!(lines_within(&p.stdout, Duration::from_millis(1000)), [7]);
        forks.push(f);
    }
    // Only as the sandbox it was.
    let mut bigger = shape.clone();
    bigger.limits.disk_bytes *= 2;
    let Err(e) = b.restore(&bigger, dir.path(), Purpose::Session) else {
        panic!("restored with another disk");
    };
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("limits.disk_bytes"), "{e}");
    // The snapshot's directory may go once the restores returned.
    drop(dir);
    let r = forks[1].exec(&sh("ls"), &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "mine.txt\nnote.txt\n");
    forks[0]
        .exec(&sh("rm mine.txt; echo zero > zero.txt"), &mut Capture, &[])
        .unwrap();
    let r = forks[1].exec(&sh("ls"), &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "mine.txt\nnote.txt\n", "forks share no files");
    eprintln!("checkpoint (and restore in place) {checkpointed:?}, image {image} bytes");
    // The handle from before the checkpoint still reaches its program, and hears how
    // it ended (a closed hub would answer SIGKILL).
    heart.handle.signal(libc::SIGTERM).unwrap();
    assert_eq!(
        heart.handle.wait(&[]).unwrap(),
        airlock_backend::Exit::Signal(libc::SIGTERM)
    );
}

#[test]
fn a_checkpoint_is_refused_while_a_terminal_program_runs_and_the_sandbox_goes_on() {
    let Some(b) = backend() else { return };
    let mut sb = session(b);
    let term = sb
        .spawn(
            &sh("sleep 1000"),
            airlock_backend::Stdio::Terminal { rows: 24, cols: 80 },
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let e = sb.checkpoint(dir.path()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("terminal"), "{e}");
    let r = sb.exec(&sh("echo on"), &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "on\n");
    term.handle.signal(9).unwrap();
    let e = b
        .restore(&Shape::of(&sh("true")), dir.path(), Purpose::Session)
        .err()
        .map(|e| e.kind());
    assert_eq!(e, Some(ErrorKind::Invalid));
}

/// `(path, change, kind, bytes)` of a result's changeset.
fn changes(r: &airlock_spec::ExecResult) -> Vec<(String, String, String, u64)> {
    r.files_changed
        .iter()
        .map(|c| {
            let v = serde_json::to_value(c).unwrap();
            (
                c.path.clone(),
                v["change"].as_str().unwrap().to_owned(),
                v["kind"].as_str().unwrap().to_owned(),
                c.bytes,
            )
        })
        .collect()
}

fn ch(path: &str, change: &str, kind: &str, bytes: u64) -> (String, String, String, u64) {
    (path.into(), change.into(), kind.into(), bytes)
}

#[test]
fn an_exec_lists_what_it_created_modified_deleted_and_renamed() {
    let Some(b) = backend() else { return };
    let mut sb = session(b);
    let setup = sb
        .exec(
            &sh("echo a > a.txt; echo b > b.txt; echo c > c.txt; mkdir d; echo x > d/x; echo t > /tmp/t"),
            &mut Capture,
            &[],
        )
        .unwrap();
    assert_eq!(setup.exit_code, Some(0), "{setup:?}");
    assert_eq!(
        changes(&setup),
        [
            ch("/workspace/a.txt", "created", "file", 2),
            ch("/workspace/b.txt", "created", "file", 2),
            ch("/workspace/c.txt", "created", "file", 2),
            ch("/workspace/d", "created", "dir", 0),
            ch("/workspace/d/x", "created", "file", 2),
        ],
        "/tmp is not looked at by default"
    );
    let r = sb
        .exec(
            &sh("echo more >> a.txt; rm b.txt; mv c.txt c2.txt; mkdir e; ln -s a.txt link; printf 1234567 > new.txt; rm -r d; echo u > /tmp/u"),
            &mut Capture,
            &[],
        )
        .unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert!(!r.files_changed_truncated);
    assert_eq!(
        changes(&r),
        [
            ch("/workspace/a.txt", "modified", "file", 7),
            ch("/workspace/b.txt", "deleted", "file", 2),
            ch("/workspace/c.txt", "deleted", "file", 2),
            ch("/workspace/c2.txt", "created", "file", 2),
            ch("/workspace/d", "deleted", "dir", 0),
            ch("/workspace/d/x", "deleted", "file", 2),
            ch("/workspace/e", "created", "dir", 0),
            ch("/workspace/link", "created", "symlink", 5),
            ch("/workspace/new.txt", "created", "file", 7),
        ]
    );
    // Nothing changed: nothing listed.
    let r = sb.exec(&sh("cat a.txt > /dev/null"), &mut Capture, &[]).unwrap();
    assert_eq!(changes(&r), []);
    assert!(!r.files_changed_truncated);
    // /tmp when asked; nothing when asked for nothing.
    let mut s = sh("echo v > /tmp/v; rm /tmp/t; echo w > w.txt");
    s.files_changed_in = vec!["/tmp".into(), "/workspace".into()];
    let r = sb.exec(&s, &mut Capture, &[]).unwrap();
    assert_eq!(
        changes(&r),
        [
            ch("/tmp/t", "deleted", "file", 2),
            ch("/tmp/v", "created", "file", 2),
            ch("/workspace/w.txt", "created", "file", 2),
        ]
    );
    let mut s = sh("echo y > y.txt");
    s.files_changed_in = vec![];
    let r = sb.exec(&s, &mut Capture, &[]).unwrap();
    assert_eq!(changes(&r), []);
    // A one-shot run has its changeset too.
    let r = b
        .run(&sh("mkdir out; echo 42 > out/r.txt"), &mut Capture, &[])
        .unwrap();
    assert_eq!(
        changes(&r),
        [
            ch("/workspace/out", "created", "dir", 0),
            ch("/workspace/out/r.txt", "created", "file", 3),
        ]
    );
}

#[test]
fn more_changes_than_a_result_lists_are_marked_truncated() {
    let Some(b) = backend() else { return };
    let r = b
        .run(
            &sh("mkdir m; cd m; for i in $(seq 1 1200); do : > f$i; done"),
            &mut Capture,
            &[],
        )
        .unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(r.files_changed.len(), airlock_spec::MAX_FILES_CHANGED);
    assert!(r.files_changed_truncated);
    assert_eq!(r.files_changed[0].path, "/workspace/m");
}

/// Every entry of the writable filesystem: path, type, mode, size, owner, symlink
/// target, and a file's checksum.
const LIST: &str = "cd / && find workspace tmp dev/shm -mindepth 1 -printf '%p %y %m %s %U:%G %l\\n' | sort; find workspace tmp dev/shm -type f -exec md5sum {} + | sort";

#[test]
fn files_exported_from_one_sandbox_are_exactly_the_files_imported_into_another() {
    let Some(b) = backend() else { return };
    let mut from = session(b);
    let r = from
        .exec(
            &sh("mkdir -p src/deep/er empty; echo hello > src/a.txt; printf '#!/bin/sh\\necho run\\n' > run.sh; chmod 755 run.sh; \
                 echo secret > private; chmod 600 private; ln -s src/a.txt link; ln -s /nowhere dangling; \
                 head -c 300000 /dev/urandom > src/deep/er/blob; : > empty-file; echo t > /tmp/t; mkdir /tmp/td; echo s > /dev/shm/s"),
            &mut Capture,
            &[],
        )
        .unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let mut tar = Vec::new();
    from.export_files(&mut tar, &[]).unwrap();
    let want = from.exec(&sh(LIST), &mut Capture, &[]).unwrap().stdout;

    let mut to = session(b);
    to.exec(
        &sh("echo old > old.txt; mkdir olddir; echo o > /tmp/old"),
        &mut Capture,
        &[],
    )
    .unwrap();
    to.import_files(&mut tar.as_slice(), &[]).unwrap();
    let got = to.exec(&sh(LIST), &mut Capture, &[]).unwrap().stdout;
    assert_eq!(got, want);
    assert!(!got.contains("old"), "{got}");
    assert!(got.contains("workspace/empty d 755"), "{got}");
    assert!(
        got.contains("workspace/link l 777 9 1000:1000 src/a.txt"),
        "{got}"
    );
    assert!(got.contains("workspace/private f 600"), "{got}");
    // Everything made is the sandbox user's.
    for line in got.lines().filter(|l| !l.contains("  ")) {
        assert!(line.contains(" 1000:1000"), "{line}");
    }
    let r = to
        .exec(&sh("./run.sh; cat /tmp/t /dev/shm/s"), &mut Capture, &[])
        .unwrap();
    assert_eq!(r.stdout, "run\nt\ns\n");
}

#[test]
fn an_import_larger_than_the_disk_is_disk_full_and_the_sandbox_goes_on() {
    let Some(b) = backend() else { return };
    let mut from = session(b);
    from.exec(&sh("head -c 3000000 /dev/urandom > big"), &mut Capture, &[])
        .unwrap();
    let mut tar = Vec::new();
    from.export_files(&mut tar, &[]).unwrap();
    let mut small = sh("true");
    small.limits.disk_bytes = 1 << 20;
    let mut to = b.create(&Shape::of(&small), Purpose::Session).unwrap();
    let e = to.import_files(&mut tar.as_slice(), &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DiskFull, "{e}");
    let r = to.exec(&small, &mut Capture, &[]).unwrap();
    assert_eq!(r.exit_code, Some(0));
    // A stream that is not a tar is refused as such.
    let e = to.import_files(&mut &[7u8; 5000][..], &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(to.exec(&small, &mut Capture, &[]).is_ok());
}

#[test]
fn a_paused_sandbox_refuses_export_and_import() {
    let Some(b) = backend() else { return };
    let mut sb = session(b);
    sb.pause().unwrap();
    let e = sb.export_files(&mut Vec::new(), &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let e = sb.import_files(&mut &[][..], &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    sb.resume().unwrap();
    sb.export_files(&mut Vec::new(), &[]).unwrap();
}

/// Figures, not bounds: export and import of a 10 MB workspace of 1,000 files.
#[test]
fn export_and_import_of_ten_megabytes_in_a_thousand_files() {
    let Some(b) = backend() else { return };
    let mut from = session(b);
    let r = from
        .exec(
            &Spec::new(vec![
                "python3".into(),
                "-c".into(),
                "import os\nfor d in range(10):\n    os.mkdir(f'd{d}')\n    for i in range(100):\n        open(f'd{d}/f{i}', 'wb').write(os.urandom(10000))\n".into(),
            ]),
            &mut Capture,
            &[],
        )
        .unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(r.files_changed.len(), 1000);
    assert!(r.files_changed_truncated);
    let t = Instant::now();
    let mut tar = Vec::new();
    from.export_files(&mut tar, &[]).unwrap();
    let exported = t.elapsed();
    let mut to = session(b);
    let t = Instant::now();
    to.import_files(&mut tar.as_slice(), &[]).unwrap();
    let imported = t.elapsed();
    let r = to
        .exec(
            &sh("find /workspace -type f | wc -l; du -sb /workspace | cut -f1"),
            &mut Capture,
            &[],
        )
        .unwrap();
    assert_eq!(r.stdout.lines().next(), Some("1000"), "{}", r.stdout);
    eprintln!(
        "10 MB in 1,000 files: tar {} bytes, export {exported:?}, import {imported:?}",
        tar.len()
    );
}

#[test]
fn a_paused_sandbox_is_purged_when_dropped() {
    let Some(b) = backend() else { return };
    let mut sb = session(b);
    let id = sb.id().to_owned();
    let _spawned = sb
        .spawn(&sh("sleep 1000"), airlock_backend::Stdio::Pipes)
        .unwrap();
    sb.pause().unwrap();
    drop(sb);
    // No cgroup of it is left in any hierarchy (its processes are gone: a cgroup with
    // processes cannot be removed).
    let out = std::process::Command::new("find")
        .args(["/sys/fs/cgroup", "-maxdepth", "5", "-type", "d", "-name"])
        .arg(format!("*{id}*"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "", "left behind");
}

#[test]
fn in_proxy_mode_a_snapshot_and_its_restores_still_reach_the_proxy() {
    use std::io::Write;
    let Some(b) = backend() else { return };
    // A web server on the host's loopback, allowed by the policy's allow_cidrs.
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in server.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ =
                conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n");
        }
    });
    let fetch = Spec::new(vec![
        "python3".into(),
        "-c".into(),
        format!(
            "import socket\ns = socket.create_connection(('127.0.0.1', 3128), timeout=10)\ns.sendall(b'GET http://127.0.0.1:{port}/ HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\nConnection: close\\r\\n\\r\\n')\ndata = b''\nwhile True:\n    c = s.recv(4096)\n    if not c: break\n    data += c\nprint(data.decode().splitlines()[0])\n"
        ),
    ]);
    let mut shape_spec = sh("true");
    shape_spec.network = airlock_spec::NetworkPolicy::Proxy(airlock_spec::ProxyPolicy {
        allow: vec![],
        allow_cidrs: vec!["127.0.0.1/32".into()],
        ..airlock_spec::ProxyPolicy::default()
    });
    let shape = Shape::of(&shape_spec);
    let mut sb = b.create(&shape, Purpose::Session).unwrap();
    let ok = |sb: &mut Box<dyn Sandbox>| {
        let r = sb.exec(&fetch, &mut Capture, &[]).unwrap();
        assert_eq!(r.stdout, "HTTP/1.1 200 OK\n", "{r:?}");
    };
    ok(&mut sb);
    let dir = tempfile::tempdir().unwrap();
    assert!(sb.checkpoint(dir.path()).unwrap());
    ok(&mut sb);
    let mut restored = b.restore(&shape, dir.path(), Purpose::Session).unwrap();
    ok(&mut restored);
    // Not as a sandbox without the network it had.
    let Err(e) = b.restore(&Shape::of(&sh("true")), dir.path(), Purpose::Session) else {
        panic!("restored without its network");
    };
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

#[path = "../../airlock-sandbox/tests/common/image.rs"]
mod image;

#[test]
fn a_sandbox_of_an_image_is_restored_with_its_image() {
    let Some(b) = backend() else { return };
    let tree_dir = tempfile::tempdir().unwrap();
    let tree = image::make(tree_dir.path());
    let mut shape = Shape::of(&sh("true"));
    shape.image = Some(airlock_backend::ImageRoot {
        digest: "sha256:snap".into(),
        root: tree,
    });
    let mut sb = b.create(&shape, Purpose::Session).unwrap();
    sb.write_file("w.txt", 0o644, b"kept", &[]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    assert!(sb.checkpoint(dir.path()).unwrap());
    let mut restored = b.restore(&shape, dir.path(), Purpose::Session).unwrap();
    let r = restored
        .exec(&sh("cat /opt/hello.txt /workspace/w.txt"), &mut Capture, &[])
        .unwrap();
    assert_eq!(r.stdout, "hello from the image\nkept", "{r:?}");
    // Not as a sandbox of another image.
    let mut other = shape.clone();
    other.image.as_mut().unwrap().digest = "sha256:other".into();
    let Err(e) = b.restore(&other, dir.path(), Purpose::Session) else {
        panic!("restored with another image");
    };
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("image"), "{e}");
}

#[test]
fn changes_made_between_execs_are_no_execs_changes() {
    let Some(b) = backend() else { return };
    let mut sb = session(b);
    let r = sb.exec(&sh("echo a > a.txt"), &mut Capture, &[]).unwrap();
    assert_eq!(changes(&r), [ch("/workspace/a.txt", "created", "file", 2)]);
    // A file the host writes.
    sb.write_file("host.txt", 0o644, b"h", &[]).unwrap();
    let r = sb.exec(&sh("true"), &mut Capture, &[]).unwrap();
    assert_eq!(changes(&r), []);
    // A program spawned between execs, ended before the next.
    let p = sb
        .spawn(&sh("echo bg > bg.txt; rm a.txt"), airlock_backend::Stdio::Pipes)
        .unwrap();
    assert_eq!(p.handle.wait(&[]).unwrap(), airlock_backend::Exit::Code(0));
    let r = sb.exec(&sh("echo c > c.txt"), &mut Capture, &[]).unwrap();
    assert_eq!(changes(&r), [ch("/workspace/c.txt", "created", "file", 2)]);
    // One still running between execs.
    let p = sb
        .spawn(
            &sh("sleep 0.5; echo late > late.txt; sleep 1000"),
            airlock_backend::Stdio::Pipes,
        )
        .unwrap();
    let r = sb.exec(&sh("true"), &mut Capture, &[]).unwrap();
    assert_eq!(changes(&r), []);
    std::thread::sleep(Duration::from_millis(1500));
    let r = sb.exec(&sh("echo d > d.txt"), &mut Capture, &[]).unwrap();
    assert_eq!(changes(&r), [ch("/workspace/d.txt", "created", "file", 2)]);
    p.handle.signal(9).unwrap();
    // Files imported.
    let mut tar = Vec::new();
    sb.export_files(&mut tar, &[]).unwrap();
    sb.exec(&sh("echo e > e.txt"), &mut Capture, &[]).unwrap();
    sb.import_files(&mut tar.as_slice(), &[]).unwrap();
    let r = sb.exec(&sh("true"), &mut Capture, &[]).unwrap();
    assert_eq!(changes(&r), []);
}

#[test]
fn a_cancelled_export_or_import_ends_and_the_sandbox_goes_on() {
    let Some(b) = backend() else { return };
    let mut sb = session(b);
    sb.exec(&sh("head -c 2000000 /dev/urandom > big"), &mut Capture, &[])
        .unwrap();
    let mut tar = Vec::new();
    sb.export_files(&mut tar, &[]).unwrap();
    // A cancel fd that is readable from the start.
    let (r, w) = nix::unistd::pipe().unwrap();
    nix::unistd::write(&w, b"x").unwrap();
    let e = sb.export_files(&mut Vec::new(), &[r.as_fd()]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
    let e = sb.import_files(&mut &[][..], &[r.as_fd()]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
    // The channel is in step: requests after them are answered as usual; an import
    // cancelled before it started changed nothing.
    let r = sb.exec(&sh("echo on; wc -c < big"), &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "on\n2000000\n");
    // Cancelled part way: it ends, cancelled.
    struct Slow<'a>(&'a [u8], std::os::fd::BorrowedFd<'a>, usize);
    impl Read for Slow<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.2 += 1;
            if self.2 == 3 {
                // The caller cancels while the stream is under way.
                nix::unistd::write(self.1, b"x").map_err(std::io::Error::from)?;
            }
            let n = buf.len().min(self.0.len()).min(30_000);
            let (head, tail) = self.0.split_at(n);
            buf[..n].copy_from_slice(head);
            self.0 = tail;
            Ok(n)
        }
    }
    let (r2, w2) = nix::unistd::pipe().unwrap();
    let e = sb
        .import_files(&mut Slow(&tar, w2.as_fd(), 0), &[r2.as_fd()])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
    let r = sb.exec(&sh("echo on"), &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "on\n");
    sb.import_files(&mut tar.as_slice(), &[]).unwrap();
    let r = sb.exec(&sh("wc -c < big"), &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout.trim(), "2000000");
}
