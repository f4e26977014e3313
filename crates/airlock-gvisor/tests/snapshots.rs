//! Snapshots on the gVisor tier (issue 17) with the real runsc, run as root: pause and
//! resume, full snapshots (which this runsc cannot take of airlock's sandboxes: see
//! `GvisorSandbox::checkpoint`). Each test skips, saying why, where gVisor cannot run.

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
    let e = sb
        .spawn(&sh("true"), airlock_backend::Stdio::Pipes)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "refusals took {:?}", t.elapsed());
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

#[test]
fn a_gvisor_sandbox_takes_filesystem_snapshots_only() {
    let Some(b) = backend() else { return };
    let mut sb = session(b);
    let dir = tempfile::tempdir().unwrap();
    // runsc 20221219 cannot save a sandbox holding connections to the host's Unix
    // sockets (see `GvisorSandbox::checkpoint`): the tier says so and writes nothing.
    assert!(!sb.checkpoint(dir.path()).unwrap());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // The sandbox runs on.
    let r = sb.exec(&sh("echo on"), &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "on\n");
    let e = b
        .restore(&Shape::of(&sh("true")), dir.path(), Purpose::Session)
        .err()
        .expect("no restore");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
}
