//! Issue 16 on the gVisor tier, through the backend itself: programs spawned alongside a
//! session's execs (pipes and terminals), their signals and waits, connections into the
//! sandbox's own loopback ports, and what dropping the sandbox leaves (nothing). Each
//! test builds its own sandbox with the real runsc; without runsc, each says so and
//! skips.

use airlock_backend::{Backend, Capture, ErrorKind, Exit, Purpose, Sandbox, Shape, Spawned, Stdio};
use airlock_gvisor::{GvisorBackend, GvisorOptions};
use airlock_spec::Spec;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The backend, or `None` (after saying why) when runsc is not installed here.
fn backend() -> Option<&'static GvisorBackend> {
    static B: OnceLock<Option<GvisorBackend>> = OnceLock::new();
    B.get_or_init(|| {
        let mut options = GvisorOptions::from_env();
        // The airlock binary is the agent too (it calls maybe_serve first).
        options.agent = env!("CARGO_BIN_EXE_airlock").into();
        if options.runsc.is_none() && !std::path::Path::new("/usr/bin/runsc").exists() {
            eprintln!("SKIPPED: runsc is not installed here, so the gVisor tier cannot be tested");
            return None;
        }
        let b = GvisorBackend::new(options);
        b.prepare()
            .expect("gVisor is available (runsc is installed and tests run as root)");
        Some(b)
    })
    .as_ref()
}

fn spec(argv: &[&str]) -> Spec {
    Spec::new(argv.iter().map(|s| s.to_string()).collect())
}

fn sh(script: &str) -> Spec {
    spec(&["/bin/sh", "-c", script])
}

fn session() -> Option<Box<dyn Sandbox>> {
    session_of(&sh("true"))
}

fn session_of(shape: &Spec) -> Option<Box<dyn Sandbox>> {
    let b = backend()?;
    let mut s = b
        .create(&Shape::of(shape), Purpose::Session)
        .expect("a session sandbox");
    s.open_session(&Shape::of(shape)).expect("open the session");
    Some(s)
}

/// Waits until something listens on `port` in the sandbox.
fn connect_when_up(ports: &dyn airlock_backend::PortConnector, port: u16) -> OwnedFd {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match ports.connect(port) {
            Ok(c) => return c,
            Err(e) if e.kind() == ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

fn exec(s: &mut Box<dyn Sandbox>, script: &str) -> airlock_spec::ExecResult {
    s.exec(&sh(script), &mut Capture, &[]).expect("exec")
}

/// Reads `fd` until `want` shows up in what came (or `within` passes): all of it.
fn read_until(fd: &OwnedFd, want: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut f = std::fs::File::from(fd.try_clone().unwrap());
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(want) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no {want:?} in time; got {:?}",
            String::from_utf8_lossy(&got)
        );
        let mut p = [nix::poll::PollFd::new(fd.as_fd(), nix::poll::PollFlags::POLLIN)];
        let _ = nix::poll::poll(&mut p, nix::poll::PollTimeout::try_from(left).unwrap());
        if p[0].revents().is_some_and(|r| !r.is_empty()) {
            let n = f.read(&mut buf).unwrap_or(0);
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn write(fd: &OwnedFd, bytes: &[u8]) {
    std::fs::File::from(fd.try_clone().unwrap())
        .write_all(bytes)
        .unwrap();
}

/// The pids of host processes whose command line names `id` (runsc and its Sentry and
/// Gofer name the sandbox's id).
fn host_processes_of(id: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(id))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// A cancel fd that is readable at once.
fn cancelled() -> (OwnedFd, OwnedFd) {
    let (r, w) = nix::unistd::pipe().unwrap();
    nix::unistd::write(&w, b"x").unwrap();
    (r, w)
}

#[test]
fn a_spawned_program_survives_execs_whose_own_leftovers_die() {
    let Some(mut s) = session() else { return };
    let Spawned { handle, .. } = s.spawn(&spec(&["sleep", "300"]), Stdio::Pipes).unwrap();
    let pid = handle.pid().expect("a pid");
    // An exec that leaves a process behind: it dies at the exec's end.
    let r = exec(&mut s, "sleep 200 & echo $!");
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    for i in 0..3 {
        let r = exec(
            &mut s,
            &format!(
                "ps -eo pid,args | grep -v grep | grep -c 'sleep [23]00' || true; kill -0 {pid} && echo alive{i}"
            ),
        );
        assert!(
            r.stdout.contains(&format!("alive{i}")),
            "the spawned sleep died: {r:?}"
        );
        // Only the spawned sleep 300 is left: the exec's sleep 200 is gone.
        assert!(r.stdout.starts_with("1\n"), "{r:?}");
    }
    // The program cannot reach the keeper's socket or the cgroups that keep processes
    // apart (root's only), so it can neither pose as the keeper nor leave its cgroup.
    let r = exec(
        &mut s,
        "python3 -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"/.airlock/procs/procs.sock\")' 2>&1 | tail -1; ls /.scratch/cgroup 2>&1 | tail -1",
    );
    assert!(r.stdout.contains("PermissionError"), "{r:?}");
    assert!(r.stdout.contains("Permission denied"), "{r:?}");
    // Still waiting for it.
    let (c, _w) = cancelled();
    assert_eq!(
        handle.wait(&[c.as_fd()]).unwrap_err().kind(),
        ErrorKind::Cancelled
    );
    handle.signal(libc::SIGKILL).unwrap();
    assert_eq!(handle.wait(&[]).unwrap(), Exit::Signal(libc::SIGKILL));
}

#[test]
fn signals_waits_and_what_a_spawned_program_started() {
    let Some(mut s) = session() else { return };
    // A shell that starts a background sleep and waits: SIGTERM ends the top process.
    let Spawned { handle, stdout, .. } = s
        .spawn(&sh("sleep 400 & echo started; exec sleep 500"), Stdio::Pipes)
        .unwrap();
    read_until(&stdout, "started", Duration::from_secs(30));
    // Cancelled waits return and it runs on.
    let (c, _w) = cancelled();
    assert_eq!(
        handle.wait(&[c.as_fd()]).unwrap_err().kind(),
        ErrorKind::Cancelled
    );
    assert!(exec(&mut s, "ps -eo args").stdout.contains("sleep 500"));
    handle.signal(libc::SIGTERM).unwrap();
    assert_eq!(handle.wait(&[]).unwrap(), Exit::Signal(libc::SIGTERM));
    // Once ended: the same answer, at once.
    assert_eq!(handle.wait(&[]).unwrap(), Exit::Signal(libc::SIGTERM));
    // A signal to an ended program is no error.
    handle.signal(libc::SIGTERM).unwrap();
    // What it started died with it.
    let ps = exec(&mut s, "ps -eo args").stdout;
    assert!(!ps.contains("sleep 400"), "{ps}");
    // Its exit code, and a resize without a terminal is refused.
    let Spawned { handle, .. } = s.spawn(&sh("exit 7"), Stdio::Pipes).unwrap();
    assert_eq!(handle.wait(&[]).unwrap(), Exit::Code(7));
    assert_eq!(handle.resize(10, 10).unwrap_err().kind(), ErrorKind::Invalid);
}

#[test]
fn pipes_carry_stdin_stdout_and_stderr() {
    let Some(mut s) = session() else { return };
    let Spawned {
        stdin,
        stdout,
        stderr,
        handle,
    } = s.spawn(&sh("echo to-err >&2; exec cat"), Stdio::Pipes).unwrap();
    write(&stdin, b"hello cat\n");
    assert_eq!(
        read_until(&stdout, "hello cat\n", Duration::from_secs(30)),
        "hello cat\n"
    );
    assert_eq!(
        read_until(stderr.as_ref().unwrap(), "to-err", Duration::from_secs(30)),
        "to-err\n"
    );
    drop(stdin); // end of file: cat ends
    assert_eq!(handle.wait(&[]).unwrap(), Exit::Code(0));
    // End of file on stdout once it ended.
    assert_eq!(read_until(&stdout, "never", Duration::from_secs(30)), "");
    // A program in a workdir with the request's env, as an exec's.
    let mut sp = sh("pwd; echo $GREETING; id -u");
    sp.workdir = Some("/tmp".into());
    sp.env = vec![("GREETING".into(), "hi".into())];
    let Spawned { stdout, handle, .. } = s.spawn(&sp, Stdio::Pipes).unwrap();
    assert_eq!(handle.wait(&[]).unwrap(), Exit::Code(0));
    assert_eq!(
        read_until(&stdout, "1000\n", Duration::from_secs(30)),
        "/tmp\nhi\n1000\n"
    );
}

#[test]
fn a_terminal_is_interactive_and_resizable() {
    let Some(mut s) = session() else { return };
    let Spawned {
        stdin,
        stdout,
        stderr,
        handle,
    } = s
        .spawn(
            &sh("tty; read l; echo got:$l"),
            Stdio::Terminal { rows: 24, cols: 80 },
        )
        .unwrap();
    assert!(stderr.is_none());
    assert!(read_until(&stdout, "/dev/pts/", Duration::from_secs(30)).contains("/dev/pts/"));
    write(&stdin, b"typed\r");
    read_until(&stdout, "got:typed", Duration::from_secs(30));
    assert_eq!(handle.wait(&[]).unwrap(), Exit::Code(0));

    // An interactive sh; stty size follows a resize.
    let Spawned {
        stdin,
        stdout,
        handle,
        ..
    } = s
        .spawn(&spec(&["sh", "-i"]), Stdio::Terminal { rows: 24, cols: 80 })
        .unwrap();
    write(&stdin, b"stty size\r");
    read_until(&stdout, "24 80", Duration::from_secs(30));
    handle.resize(40, 120).unwrap();
    write(&stdin, b"trap 'echo winched' WINCH; stty size\r");
    read_until(&stdout, "40 120", Duration::from_secs(30));
    // SIGWINCH itself: the shell runs its trap before the next command.
    handle.resize(41, 121).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    write(&stdin, b"stty size\r");
    let after = read_until(&stdout, "41 121", Duration::from_secs(30));
    assert!(after.contains("winched"), "{after}");
    write(&stdin, b"exit 3\r");
    assert_eq!(handle.wait(&[]).unwrap(), Exit::Code(3));
}

#[test]
fn ports_reach_a_server_on_the_sandboxs_loopback() {
    let Some(mut s) = session() else { return };
    let ports = s.ports().expect("the gVisor tier connects to ports");
    let e = ports.connect(8123).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("8123"), "{e}");
    exec(&mut s, "echo served > /workspace/hello.txt");
    let Spawned { stderr, handle, .. } = s
        .spawn(
            &spec(&["python3", "-m", "http.server", "8123", "--bind", "127.0.0.1"]),
            Stdio::Pipes,
        )
        .unwrap();
    let conn = connect_when_up(&*ports, 8123);
    // While an exec runs: from another thread.
    let t = std::thread::spawn(move || {
        write(&conn, b"GET /hello.txt HTTP/1.0\r\n\r\n");
        read_until(&conn, "served", Duration::from_secs(30))
    });
    let r = exec(&mut s, "sleep 2; echo done");
    assert_eq!(r.stdout, "done\n");
    let answer = t.join().unwrap();
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    // The server's log went to its stderr.
    read_until(
        stderr.as_ref().unwrap(),
        "GET /hello.txt",
        Duration::from_secs(30),
    );
    handle.signal(libc::SIGKILL).unwrap();
    assert_eq!(handle.wait(&[]).unwrap(), Exit::Signal(libc::SIGKILL));
    assert_eq!(ports.connect(8123).unwrap_err().kind(), ErrorKind::NotFound);
}

#[test]
fn dropping_the_sandbox_kills_everything_and_leaves_nothing() {
    let Some(mut s) = session() else { return };
    let id = s.id().to_owned();
    let ports = s.ports().unwrap();
    let Spawned { handle, stdout, .. } = s.spawn(&sh("sleep 600 & sleep 700"), Stdio::Pipes).unwrap();
    assert!(
        !host_processes_of(&id).is_empty(),
        "the test looks for the wrong id"
    );
    drop(s);
    assert_eq!(handle.wait(&[]).unwrap(), Exit::Signal(libc::SIGKILL));
    assert_eq!(read_until(&stdout, "never", Duration::from_secs(10)), "");
    assert_eq!(ports.connect(80).unwrap_err().kind(), ErrorKind::Gone);
    assert_eq!(host_processes_of(&id), Vec::<String>::new());
}

#[test]
fn in_proxy_mode_spawned_programs_get_the_proxy_and_ports_still_connect() {
    let mut shape = sh("true");
    shape.network = airlock_spec::NetworkPolicy::Proxy(airlock_spec::ProxyPolicy {
        allow: vec!["example.invalid".into()],
        ..airlock_spec::ProxyPolicy::default()
    });
    let Some(mut s) = session_of(&shape) else { return };
    let Spawned { stdout, handle, .. } = s.spawn(&sh("echo $HTTP_PROXY"), Stdio::Pipes).unwrap();
    assert_eq!(handle.wait(&[]).unwrap(), Exit::Code(0));
    assert_eq!(
        read_until(&stdout, "\n", Duration::from_secs(30)),
        "http://127.0.0.1:3128\n"
    );
    // A server on a port of the loopback (not redirected to the proxy), reached from the
    // host; the proxy's relay still serves execs after each exec's end.
    let Spawned { handle, stderr, .. } = s
        .spawn(
            &spec(&["python3", "-m", "http.server", "8124", "--bind", "127.0.0.1"]),
            Stdio::Pipes,
        )
        .unwrap();
    let ports = s.ports().unwrap();
    let conn = connect_when_up(&*ports, 8124);
    write(&conn, b"GET / HTTP/1.0\r\n\r\n");
    let answer = read_until(&conn, "HTTP/1.0 200", Duration::from_secs(30));
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    // From an exec too, past the proxy's variables.
    let r = exec(
        &mut s,
        "python3 -c 'import urllib.request as u; print(u.build_opener(u.ProxyHandler({})).open(\"http://127.0.0.1:8124/\").status)'",
    );
    assert_eq!(r.stdout, "200\n", "{r:?}");
    read_until(stderr.as_ref().unwrap(), "GET /", Duration::from_secs(30));
    for _ in 0..2 {
        let r = exec(
            &mut s,
            "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 3128), timeout=5); print(\"relay up\")'",
        );
        assert_eq!(r.stdout, "relay up\n", "{r:?}");
    }
    assert_eq!(ports.connect(9).unwrap_err().kind(), ErrorKind::NotFound);
    handle.signal(libc::SIGKILL).unwrap();
    assert_eq!(handle.wait(&[]).unwrap(), Exit::Signal(libc::SIGKILL));
}
