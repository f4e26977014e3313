//! Programs alongside a micro-VM session's execs (`Sandbox::spawn`) and connections into
//! its ports (`Sandbox::ports`), against a real VM through the tier's backend. VMs are
//! slow under emulation: one session VM serves every case, and a second, in proxy mode,
//! only the ports. Needs root, qemu-system-x86_64, mksquashfs and the `airlock-guest`
//! binary of this build (`cargo build -p airlock-guest`).

use airlock_backend::{Backend, ErrorKind, Exit, Purpose, Sandbox, Shape, Spawned, Stdio};
use airlock_microvm::{HostOptions, VmBackend};
use airlock_spec::{NetworkPolicy, Spec};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `airlock-guest` from the target directory this test was built in.
fn agent() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("airlock-guest"))
        .expect("target dir");
    assert!(
        path.is_file(),
        "{} is missing: cargo build -p airlock-guest",
        path.display()
    );
    path
}

/// The tier; with `templates`, a session's VM is a clone of a template saved with its
/// sandbox built (what a service with a pool does).
fn backend(templates: bool) -> VmBackend {
    VmBackend::new(
        HostOptions {
            agent: agent(),
            ..HostOptions::from_env()
        },
        templates.then(|| Spec::new(vec!["true".into()]).limits),
    )
}

fn sh(script: &str) -> Spec {
    Spec::new(vec!["sh".into(), "-c".into(), script.into()])
}

fn session(network: NetworkPolicy, templates: bool) -> Box<dyn Sandbox> {
    let b = backend(templates);
    b.prepare().expect("micro-VMs");
    let mut shape = Shape::of(&Spec::new(vec!["true".into()]));
    shape.network = network;
    let mut vm = b.create(&shape, Purpose::Session).expect("a VM");
    vm.open_session(&shape).expect("open_session");
    vm
}

fn exec(vm: &mut Box<dyn Sandbox>, script: &str) -> String {
    let r = vm
        .exec(&sh(script), &mut airlock_backend::Capture, &[])
        .expect("exec");
    assert_eq!(r.exit_code, Some(0), "{script}: {r:?}");
    r.stdout
}

/// Reads `fd` until `want` appears in what was read (or the deadline passes, or EOF).
fn read_until(fd: &OwnedFd, want: &str, within: Duration) -> String {
    let mut got = Vec::new();
    let deadline = Instant::now() + within;
    let mut file = std::fs::File::from(fd.try_clone().unwrap());
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(want) && Instant::now() < deadline {
        let mut fds = [nix::poll::PollFd::new(fd.as_fd(), nix::poll::PollFlags::POLLIN)];
        if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(500u16)).unwrap_or(0) == 0 {
            continue;
        }
        match file.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Everything `fd` gives until end of file; `None` when it does not come in time.
fn read_to_end(fd: &OwnedFd, within: Duration) -> Option<String> {
    let mut got = Vec::new();
    let deadline = Instant::now() + within;
    let mut file = std::fs::File::from(fd.try_clone().unwrap());
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        let mut fds = [nix::poll::PollFd::new(fd.as_fd(), nix::poll::PollFlags::POLLIN)];
        if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(500u16)).unwrap_or(0) == 0 {
            continue;
        }
        match file.read(&mut buf) {
            Ok(0) => return Some(String::from_utf8_lossy(&got).into_owned()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
    None
}

fn write(fd: &OwnedFd, bytes: &[u8]) {
    std::fs::File::from(fd.try_clone().unwrap())
        .write_all(bytes)
        .unwrap();
}

fn alive(vm: &mut Box<dyn Sandbox>, name: &str) -> bool {
    // Spawned programs live in a pid namespace of their own: an exec sees only its own
    // processes and what earlier execs left.
    let script =
        format!("for p in /proc/[0-9]*; do cat $p/comm; done 2>/dev/null | grep -c '^{name}$' || true");
    exec(vm, &script).trim() != "0"
}

#[test]
fn spawned_programs_terminals_and_ports_in_a_micro_vm() {
    let mut vm = session(NetworkPolicy::None, false);
    let qemu_pid = {
        // The VMM of this VM: what must be gone once it is dropped.
        let vms: Vec<u32> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|pid: &u32| {
                std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(vm.id()))
            })
            .collect();
        assert!(!vms.is_empty(), "no VMM process names {}", vm.id());
        vms
    };

    // A spawned `sleep` survives execs, and an exec's leftover dies at its end.
    let Spawned { handle: sleeper, .. } = vm
        .spawn(&Spec::new(vec!["sleep".into(), "1000".into()]), Stdio::Pipes)
        .expect("spawn sleep");
    assert_eq!(sleeper.pid(), Some(2));
    exec(&mut vm, "sleep 999 >/dev/null 2>&1 & echo started");
    exec(&mut vm, "true");
    // The check sees an exec's processes (its own shell)...
    assert!(alive(&mut vm, "sh"));
    // ...and no `sleep`: the leftover is gone, the spawned one is not in its view.
    assert!(
        !alive(&mut vm, "sleep"),
        "the exec's leftover `sleep 999` survived it (or the spawned one shows)"
    );
    // The spawned one still runs: it answers signals, and has not ended.
    let (cancel_r, cancel_w) = nix::unistd::pipe().unwrap();
    write(&cancel_w, b"x");
    assert_eq!(
        sleeper.wait(&[cancel_r.as_fd()]).unwrap_err().kind(),
        ErrorKind::Cancelled,
        "the spawned sleep ended"
    );
    // An exec killed at its deadline (its processes swept from the sandbox's cgroup)
    // spares it too.
    let mut slow = sh("sleep 60 & sleep 60");
    slow.limits.timeout_ms = 3000;
    let r = vm.exec(&slow, &mut airlock_backend::Capture, &[]).expect("exec");
    assert!(r.timed_out, "{r:?}");
    assert!(!alive(&mut vm, "sleep"), "the timed-out exec left a `sleep`");
    write(&cancel_w, b"x");
    assert_eq!(
        sleeper.wait(&[cancel_r.as_fd()]).unwrap_err().kind(),
        ErrorKind::Cancelled,
        "the spawned sleep ended with the timed-out exec"
    );
    sleeper.signal(libc::SIGTERM).expect("signal");
    assert_eq!(sleeper.wait(&[]).expect("wait"), Exit::Signal(libc::SIGTERM));
    assert_eq!(
        sleeper.wait(&[]).expect("wait again"),
        Exit::Signal(libc::SIGTERM)
    );
    assert_eq!(sleeper.resize(10, 10).unwrap_err().kind(), ErrorKind::Invalid);

    // Programs that end at once, or cannot start (as a shell says: 127).
    for (command, exit) in [
        (vec!["true"], Exit::Code(0)),
        (vec!["sh", "-c", "exit 5"], Exit::Code(5)),
        (vec!["no-such-program"], Exit::Code(127)),
    ] {
        let spec = Spec::new(command.iter().map(|s| s.to_string()).collect());
        let p = vm.spawn(&spec, Stdio::Pipes).expect("spawn");
        assert_eq!(p.handle.wait(&[]).unwrap(), exit, "{command:?}");
        if exit == Exit::Code(127) {
            let err = read_to_end(&p.stderr.unwrap(), Duration::from_secs(30)).unwrap();
            assert!(err.contains("no-such-program"), "{err}");
        }
    }

    // Pipes: `cat` echoes; end of file on stdin ends it with 0.
    let cat = vm
        .spawn(&Spec::new(vec!["cat".into()]), Stdio::Pipes)
        .expect("spawn cat");
    write(&cat.stdin, b"hello through the pipes\n");
    assert_eq!(
        read_until(&cat.stdout, "pipes\n", Duration::from_secs(30)),
        "hello through the pipes\n"
    );
    drop(cat.stdin);
    assert_eq!(
        read_to_end(&cat.stdout, Duration::from_secs(30)).as_deref(),
        Some("")
    );
    assert_eq!(cat.handle.wait(&[]).expect("wait cat"), Exit::Code(0));

    // SIGKILL kills what the program started too.
    let tree = vm
        .spawn(&sh("sleep 1001 & sleep 1002; echo never"), Stdio::Pipes)
        .expect("spawn a tree");
    std::thread::sleep(Duration::from_secs(2));
    tree.handle.signal(libc::SIGKILL).unwrap();
    assert_eq!(tree.handle.wait(&[]).unwrap(), Exit::Signal(libc::SIGKILL));
    // End of file: the background `sleep 1001`, which holds stdout too, is gone.
    assert_eq!(
        read_to_end(&tree.stdout, Duration::from_secs(30)).as_deref(),
        Some("")
    );

    // A terminal: an interactive read, then the size after a resize.
    let term = vm
        .spawn(
            &sh("read l; echo got:$l; sleep 2; stty size"),
            Stdio::Terminal { rows: 24, cols: 80 },
        )
        .expect("spawn a terminal");
    assert!(term.stderr.is_none());
    write(&term.stdin, b"typed\n");
    let seen = read_until(&term.stdout, "got:typed", Duration::from_secs(30));
    assert!(seen.contains("got:typed"), "{seen:?}");
    term.handle.resize(33, 101).expect("resize");
    let seen = read_until(&term.stdout, "33 101", Duration::from_secs(30));
    assert!(seen.contains("33 101"), "{seen:?}");
    assert_eq!(term.handle.wait(&[]).unwrap(), Exit::Code(0));

    // An interactive shell.
    let shell = vm
        .spawn(
            &Spec::new(vec!["sh".into(), "-i".into()]),
            Stdio::Terminal { rows: 24, cols: 80 },
        )
        .expect("spawn sh");
    write(&shell.stdin, b"echo $((6*7))x\n");
    let seen = read_until(&shell.stdout, "42x", Duration::from_secs(30));
    assert!(seen.contains("42x"), "{seen:?}");
    write(&shell.stdin, b"exit 3\n");
    assert_eq!(shell.handle.wait(&[]).unwrap(), Exit::Code(3));

    // Ports: nothing listening, then a listener reached through connect.
    let ports = vm.ports().expect("ports");
    let err = ports.connect(8000).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("8000"), "{err}");
    let server = vm
        .spawn(
            &Spec::new(vec![
                "python3".into(),
                "-m".into(),
                "http.server".into(),
                "8000".into(),
            ]),
            Stdio::Pipes,
        )
        .expect("spawn a server");
    exec(&mut vm, "echo served-file > /workspace/hello.txt");
    let conn = (0..60)
        .find_map(|_| {
            ports.connect(8000).ok().or_else(|| {
                std::thread::sleep(Duration::from_secs(1));
                None
            })
        })
        .expect("the server listens");
    write(&conn, b"GET /hello.txt HTTP/1.0\r\n\r\n");
    let answer = read_until(&conn, "served-file", Duration::from_secs(30));
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer:?}");
    assert!(answer.contains("served-file"), "{answer:?}");
    // While an exec runs, too.
    let conn2 = {
        let ports = ports.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            ports.connect(8000)
        })
    };
    exec(&mut vm, "sleep 6");
    let conn2 = conn2.join().unwrap().expect("connect during an exec");
    write(&conn2, b"GET /hello.txt HTTP/1.0\r\n\r\n");
    assert!(read_until(&conn2, "served-file", Duration::from_secs(30)).contains("served-file"));
    let server_handle = server.handle;

    // Dropping the VM: the server's wait answers SIGKILL, and no VMM process is left.
    let waiter = std::thread::spawn(move || server_handle.wait(&[]));
    drop(vm);
    assert_eq!(waiter.join().unwrap().unwrap(), Exit::Signal(libc::SIGKILL));
    for pid in qemu_pid {
        assert!(
            !PathBuf::from(format!("/proc/{pid}")).exists(),
            "VMM {pid} is still there"
        );
    }
    assert_eq!(ports.connect(8000).unwrap_err().kind(), ErrorKind::Gone);
}

/// Ports in proxy mode: the sandbox's loopback is reached as in mode `none` (the proxy's
/// rules redirect only what leaves it). The VM is a clone of a template saved with its
/// sandbox built: the guest's relay and its record of the sandbox cross the snapshot.
#[test]
fn ports_in_a_proxy_mode_micro_vm_cloned_from_a_template() {
    let mut vm = session(NetworkPolicy::Proxy(Default::default()), true);
    let ports = vm.ports().expect("ports");
    assert_eq!(ports.connect(8080).unwrap_err().kind(), ErrorKind::NotFound);
    let server = vm
        .spawn(
            &sh("echo proxied > page.txt && exec python3 -m http.server 8080"),
            Stdio::Pipes,
        )
        .expect("spawn a server");
    let conn = (0..60)
        .find_map(|_| {
            ports.connect(8080).ok().or_else(|| {
                std::thread::sleep(Duration::from_secs(1));
                None
            })
        })
        .expect("the server listens");
    write(&conn, b"GET /page.txt HTTP/1.0\r\n\r\n");
    let answer = read_until(&conn, "proxied", Duration::from_secs(30));
    assert!(answer.contains("proxied"), "{answer:?}");
    server.handle.signal(libc::SIGKILL).unwrap();
    assert_eq!(server.handle.wait(&[]).unwrap(), Exit::Signal(libc::SIGKILL));
    // What the server started died with it: nothing listens any more.
    assert_eq!(ports.connect(8080).unwrap_err().kind(), ErrorKind::NotFound);
}
