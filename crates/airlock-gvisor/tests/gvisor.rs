//! The gVisor tier through the `airlock_backend` traits, with the real runsc (run as
//! root). Each test builds its own sandboxes and checks what it asked for.

use airlock_backend::{Backend, Capture, ErrorKind, Purpose, Sandbox, Shape};
use airlock_gvisor::{GvisorBackend, GvisorOptions};
use airlock_spec::{Outcome, Spec};
use std::sync::OnceLock;

fn backend() -> &'static GvisorBackend {
    static B: OnceLock<GvisorBackend> = OnceLock::new();
    B.get_or_init(|| {
        let mut options = GvisorOptions::from_env();
        options.agent = env!("CARGO_BIN_EXE_airlock-gvisor-agent").into();
        let b = GvisorBackend::new(options);
        b.prepare()
            .expect("gVisor is available (tests run as root with runsc installed)");
        b
    })
}

fn spec(argv: &[&str]) -> Spec {
    Spec::new(argv.iter().map(|s| s.to_string()).collect())
}

fn sh(script: &str) -> Spec {
    spec(&["/bin/sh", "-c", script])
}

#[test]
fn output_and_exit_code() {
    let r = backend()
        .run(&sh("echo out; echo err >&2; exit 3"), &mut Capture, &[])
        .unwrap();
    assert_eq!(r.stdout, "out\n");
    assert_eq!(r.stderr, "err\n");
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(r.outcome, Outcome::Exited);
}

fn session(shape_spec: &Spec) -> Box<dyn Sandbox> {
    backend()
        .create(&Shape::of(shape_spec), Purpose::Session)
        .expect("a session sandbox")
}

#[test]
fn the_program_runs_as_the_sandbox_user_without_privileges() {
    let r = backend()
        .run(
            &sh("id -u; grep -E '^(CapEff|CapBnd|Seccomp):' /proc/self/status; python3 -c 'import ctypes; print(\"no_new_privs\", ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'"),
            &mut Capture,
            &[],
        )
        .unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let out = r.stdout;
    assert!(out.starts_with("1000\n"), "{out}");
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(out.contains("CapBnd:\t0000000000000000"), "{out}");
    assert!(out.contains("no_new_privs 1"), "{out}");
    assert!(out.contains("Seccomp:\t2"), "{out}");
}

#[test]
fn a_command_that_is_not_there_ends_like_a_shell_says() {
    let r = backend()
        .run(&spec(&["no-such-program"]), &mut Capture, &[])
        .unwrap();
    assert_eq!(r.exit_code, Some(127));
    assert!(r.stderr.contains("command not found"), "{}", r.stderr);
}

#[test]
fn stdin_reaches_the_program() {
    let mut s = spec(&["/bin/cat"]);
    s.stdin = b"hello from stdin".to_vec();
    let r = backend().run(&s, &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "hello from stdin");
}

#[test]
fn the_deadline_kills_every_process_of_the_exec() {
    let mut s = sh("sleep 1000 & sleep 1000 & sleep 1000");
    s.limits.timeout_ms = 1000;
    let mut sb = session(&s);
    let r = sb.exec(&s, &mut Capture, &[]).unwrap();
    assert_eq!(r.outcome, Outcome::Timeout, "{r:?}");
    assert!(r.timed_out);
    assert_eq!(r.signal, Some(9));
    // The next exec sees no process of the first: only the agent (pid 1) and itself.
    let r = sb
        .exec(
            &sh("cat /proc/[0-9]*/comm | sort | tr '\\n' ' '"),
            &mut Capture,
            &[],
        )
        .unwrap();
    assert!(!r.stdout.contains("sleep"), "{}", r.stdout);
}

#[test]
fn the_memory_cap_ends_the_program_as_oom() {
    let mut s = spec(&["python3", "-c", "b = b'x' * (600 << 20); print(len(b))"]);
    s.limits.memory_bytes = 128 << 20;
    let r = backend().run(&s, &mut Capture, &[]).unwrap();
    assert_eq!(r.outcome, Outcome::Oom, "{r:?}");
    assert!(r.oom_killed);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    // The cap is the whole sandbox's (the Sentry's included): the peak stays under it.
    assert!(r.memory_peak_bytes <= (128 << 20) + (4 << 20), "{r:?}");
    assert!(r.memory_peak_bytes > 64 << 20, "{r:?}");
}

#[test]
fn a_memory_cap_too_small_for_gvisor_is_refused() {
    let mut s = spec(&["true"]);
    s.limits.memory_bytes = 16 << 20;
    let e = backend().create(&Shape::of(&s), Purpose::OneShot).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("limits.memory_bytes"), "{e}");
    // The smallest accepted cap runs a python program.
    s.limits.memory_bytes = airlock_gvisor::MIN_MEMORY_BYTES;
    s.command = vec!["python3".into(), "-c".into(), "print('fits')".into()];
    let r = backend().run(&s, &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "fits\n", "{r:?}");
}

#[test]
fn the_pids_limit_holds_against_a_fork_loop() {
    // Children that sleep until the exec ends; forks fail once the limit is reached.
    let script = "import os, time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n            time.sleep(1000)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('refused', e.errno)\nprint('forked', n)\n";
    let mut s = spec(&["python3", "-c", script]);
    s.limits.pids = 16;
    let r = backend().run(&s, &mut Capture, &[]).unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert!(r.stdout.contains("refused 11"), "{}", r.stdout);
    let forked: u32 = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("forked "))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(forked < 16, "{forked} forks under a limit of 16");
}

#[test]
fn a_fork_bomb_is_contained_and_the_session_goes_on() {
    let mut s = sh("b() { b | b & }; b");
    s.limits.pids = 32;
    s.limits.timeout_ms = 2000;
    let mut sb = session(&s);
    let r = sb.exec(&s, &mut Capture, &[]).unwrap();
    assert!(matches!(r.outcome, Outcome::Exited | Outcome::Timeout), "{r:?}");
    let r = sb.exec(&sh("echo still here"), &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "still here\n");
}

#[test]
fn output_over_the_limit_is_counted_and_dropped() {
    let mut s = sh("head -c 100000 /dev/zero | tr '\\0' a");
    s.limits.output_bytes = 1000;
    let r = backend().run(&s, &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout.len(), 1000);
    assert!(r.stdout_truncated);
    assert_eq!(r.stdout_bytes, 100000);
    assert!(!r.stderr_truncated);
}

#[test]
fn files_are_written_read_listed_and_missing_ones_are_not_found() {
    let s = spec(&["true"]);
    let mut sb = session(&s);
    sb.write_file("dir/a.txt", 0o644, b"hello", &[]).unwrap();
    sb.write_file("run.sh", 0o755, b"#!/bin/sh\necho ran\n", &[])
        .unwrap();
    assert_eq!(sb.read_file("dir/a.txt", 1 << 20).unwrap(), b"hello");
    let listing = sb.list_files().unwrap();
    let paths: Vec<&str> = listing.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["dir", "dir/a.txt", "run.sh"]);
    assert!(listing[0].dir);
    assert_eq!(listing[1].size, 5);
    assert_eq!(listing[2].mode, 0o755);
    let e = sb.read_file("nope.txt", 1 << 20).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = sb.write_file("../escape", 0o644, b"x", &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let r = sb.exec(&spec(&["./run.sh"]), &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "ran\n");
}

#[test]
fn a_file_larger_than_the_disk_is_disk_full() {
    let mut s = spec(&["true"]);
    s.limits.disk_bytes = 1 << 20;
    let mut sb = session(&s);
    let e = sb.write_file("big", 0o644, &vec![0u8; 2 << 20], &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DiskFull, "{e}");
    sb.write_file("a", 0o644, &vec![0u8; 600 << 10], &[]).unwrap();
    let e = sb.write_file("b", 0o644, &vec![0u8; 600 << 10], &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DiskFull, "{e}");
    // The part of `b` that fit was removed.
    let paths: Vec<String> = sb.list_files().unwrap().into_iter().map(|e| e.path).collect();
    assert_eq!(paths, ["a"]);
}

#[test]
fn a_session_keeps_its_files_between_execs() {
    let s = sh("true");
    let mut sb = session(&s);
    let r = sb
        .exec(
            &sh("echo 42 > /workspace/x; echo tmp > /tmp/y"),
            &mut Capture,
            &[],
        )
        .unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let r = sb
        .exec(&sh("cat /workspace/x /tmp/y"), &mut Capture, &[])
        .unwrap();
    assert_eq!(r.stdout, "42\ntmp\n");
    assert_eq!(sb.read_file("x", 100).unwrap(), b"42\n");
}

#[test]
fn with_network_none_there_is_no_network() {
    // Listeners on the host's loopback (TCP and UDP): the sandbox's 127.0.0.1 is its
    // own, so nothing arrives here. Only loopback traffic is tried, so nothing leaves the
    // host should the test fail.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let (tport, uport) = (tcp.local_addr().unwrap().port(), udp.local_addr().unwrap().port());
    let script = format!(
        r#"
import errno, os, socket
def name(e):
    return errno.errorcode.get(e.errno, str(e))
print("interfaces", [l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]])
print("proxy env", sorted(k for k in os.environ if "proxy" in k.lower()))
for port in [{tport}, 3128]:
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        print("tcp", port, "connected")
    except OSError as e:
        print("tcp", port, name(e))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(b"x", ("127.0.0.1", {uport}))
"#
    );
    let r = backend()
        .run(&spec(&["python3", "-c", &script]), &mut Capture, &[])
        .unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let expected =
        format!("interfaces ['lo']\nproxy env []\ntcp {tport} ECONNREFUSED\ntcp 3128 ECONNREFUSED\n");
    assert_eq!(r.stdout, expected, "{r:?}");
    assert!(tcp.accept().is_err(), "a connection reached the host");
    assert!(udp.recv(&mut [0u8; 8]).is_err(), "a datagram reached the host");
    assert!(r.egress.is_empty(), "{r:?}");
}

#[test]
fn a_cancelled_exec_is_cancelled_and_the_session_goes_on() {
    let (r, w) = nix::unistd::pipe().unwrap();
    nix::unistd::write(&w, b"x").unwrap();
    let s = sh("sleep 1000");
    let mut sb = session(&s);
    let e = sb
        .exec(&s, &mut Capture, &[std::os::fd::AsFd::as_fd(&r)])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
    let r = sb.exec(&sh("echo next"), &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "next\n");
}

/// Host paths and processes of sandbox `id`: cgroup directories, the bundle, and
/// processes whose command line names it.
fn traces_of(id: &str) -> Vec<String> {
    let mut found = Vec::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let airlock = hierarchy.path().join("airlock");
        for owner in std::fs::read_dir(&airlock).into_iter().flatten().flatten() {
            if owner.path().join(id).exists() {
                found.push(owner.path().join(id).display().to_string());
            }
        }
    }
    let state = backend().options().state.clone();
    for owner in std::fs::read_dir(&state).into_iter().flatten().flatten() {
        if owner.path().join(id).exists() {
            found.push(owner.path().join(id).display().to_string());
        }
    }
    for proc_ in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(proc_.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(id)
        {
            found.push(format!("process {}", proc_.file_name().to_string_lossy()));
        }
    }
    found
}

#[test]
fn nothing_is_left_after_a_sandbox_is_dropped() {
    let s = sh("sleep 1000 &");
    let mut sb = session(&s);
    let id = sb.id().to_owned();
    sb.exec(&s, &mut Capture, &[]).unwrap();
    assert!(!traces_of(&id).is_empty(), "the live sandbox is visible");
    drop(sb);
    assert_eq!(traces_of(&id), Vec::<String>::new());
}

#[test]
fn a_pooled_sandbox_serves_an_exec_and_leaves_nothing() {
    let s = spec(&["/bin/true"]);
    let mut sb = backend()
        .create(&Shape::of(&s), Purpose::Pool { behind: true })
        .unwrap();
    let id = sb.id().to_owned();
    let r = sb.exec_once(&s, &mut Capture, &[]).unwrap();
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.id, id);
    assert!(r.cpu_ms >= 0.0 && r.memory_peak_bytes > 0, "{r:?}");
    drop(sb);
    assert_eq!(traces_of(&id), Vec::<String>::new());
}

#[test]
fn the_pids_limit_counts_threads() {
    let script = "import threading, time\nn = 0\ntry:\n    for _ in range(200):\n        threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()\n        n += 1\nexcept RuntimeError as e:\n    print('refused', e)\nprint('threads', n)\n";
    let mut s = spec(&["python3", "-c", script]);
    s.limits.pids = 16;
    let r = backend().run(&s, &mut Capture, &[]).unwrap();
    assert!(r.stdout.contains("refused"), "{r:?}");
    let threads: u32 = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("threads "))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(threads < 16, "{threads} threads under a limit of 16");
}

/// Set in the environment of the process [`nothing_is_left_after_airlock_is_killed`]
/// starts: that process builds a sandbox, prints its id and waits to be killed.
const VICTIM: &str = "AIRLOCK_GVISOR_TEST_VICTIM";

#[test]
fn victim_process() {
    if std::env::var_os(VICTIM).is_none() {
        return; // only a helper of the test below
    }
    let sb = session(&sh("true"));
    println!("sandbox {}", sb.id());
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::park();
    }
}

#[test]
fn nothing_is_left_after_airlock_is_killed() {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "victim_process", "--nocapture", "--test-threads=1"])
        .env(VICTIM, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    let id = out
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.split_once("sandbox ").map(|(_, id)| id.trim().to_owned()))
        .expect("the victim built a sandbox");
    assert!(
        traces_of(&id).iter().any(|t| t.starts_with("process")),
        "the sandbox runs"
    );
    child.kill().unwrap(); // SIGKILL: no destructor runs
    child.wait().unwrap();
    // runsc dies with its parent (PDEATHSIG), the agent with its stdin: the Sentry and
    // the Gofer follow. Wait (bounded) for the kernel to reap them.
    let mut procs = Vec::new();
    for _ in 0..200 {
        procs = traces_of(&id)
            .into_iter()
            .filter(|t| t.starts_with("process"))
            .collect();
        if procs.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(procs, Vec::<String>::new(), "processes outlived airlock");
    // What cannot remove itself (the bundle, runsc's state, the empty cgroup) is purged by
    // the next airlock process's prepare(); a new backend here does the same.
    let mut options = GvisorOptions::from_env();
    options.agent = env!("CARGO_BIN_EXE_airlock-gvisor-agent").into();
    GvisorBackend::new(options).prepare().unwrap();
    assert_eq!(traces_of(&id), Vec::<String>::new());
}

#[test]
fn after_an_oom_the_session_is_gone_and_says_so() {
    let mut s = spec(&["python3", "-c", "b = b'x' * (600 << 20)"]);
    s.limits.memory_bytes = 128 << 20;
    let mut sb = session(&s);
    let r = sb.exec(&s, &mut Capture, &[]).unwrap();
    assert_eq!(r.outcome, Outcome::Oom, "{r:?}");
    // The host's OOM killer ended the Sentry: unlike the namespace tier's, a gVisor
    // session does not survive its memory cap, and says so.
    assert!(!sb.is_alive());
    let e = sb.exec(&sh("echo next"), &mut Capture, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Gone, "{e}");
}

#[test]
fn memfds_over_the_memory_cap_end_as_oom() {
    // The issue's parity case: 32 memfds of 32 MiB under a 96 MiB cap.
    let script = "import os\nfds = []\nfor i in range(32):\n    fd = os.memfd_create('m%d' % i)\n    os.write(fd, b'x' * (32 << 20))\n    fds.append(fd)\nprint('survived')\n";
    let mut s = spec(&["python3", "-c", script]);
    s.limits.memory_bytes = 96 << 20;
    let r = backend().run(&s, &mut Capture, &[]).unwrap();
    assert_eq!(r.outcome, Outcome::Oom, "{r:?}");
    assert!(!r.stdout.contains("survived"));
}

#[test]
fn in_proxy_mode_the_program_reaches_the_proxy_and_only_the_proxy() {
    use std::io::{Read, Write};
    // A web server on the host's loopback, allowed by the policy's allow_cidrs (the
    // proxy refuses loopback otherwise).
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let served = std::thread::spawn(move || {
        let (mut conn, _) = server.accept().unwrap();
        let mut buf = [0u8; 4096];
        let n = conn.read(&mut buf).unwrap();
        let request = String::from_utf8_lossy(&buf[..n]).into_owned();
        conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n")
            .unwrap();
        request
    });
    let script = format!(
        r#"
import os, socket
def via_proxy(url):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    host = url.split("/")[2]
    s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (url, host)).encode())
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")
print("env", os.environ.get("HTTP_PROXY"))
print("allowed", via_proxy("http://127.0.0.1:{port}/hello").splitlines()[0])
print("metadata", via_proxy("http://169.254.169.254/latest/meta-data/").splitlines()[0])
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("direct connected")
except OSError as e:
    print("direct refused", e.errno)
"#
    );
    let mut s = spec(&["python3", "-c", &script]);
    s.network = airlock_spec::NetworkPolicy::Proxy(airlock_spec::ProxyPolicy {
        allow: vec![],
        allow_cidrs: vec!["127.0.0.1/32".into()],
        ..airlock_spec::ProxyPolicy::default()
    });
    let r = backend().run(&s, &mut Capture, &[]).unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert!(r.stdout.contains("env http://127.0.0.1:3128\n"), "{}", r.stdout);
    assert!(r.stdout.contains("allowed HTTP/1.1 200 OK\n"), "{}", r.stdout);
    assert!(r.stdout.contains("metadata HTTP/1.1 403"), "{}", r.stdout);
    assert!(r.stdout.contains("direct refused"), "{}", r.stdout);
    assert!(served.join().unwrap().starts_with("GET /hello HTTP/1.1"));
    let hosts: Vec<(&str, bool)> = r.egress.iter().map(|e| (e.host.as_str(), e.allowed)).collect();
    assert!(hosts.contains(&("127.0.0.1", true)), "{:?}", r.egress);
    assert!(hosts.contains(&("169.254.169.254", false)), "{:?}", r.egress);
}

#[test]
fn airlocks_seccomp_filter_is_in_force_inside_gvisor() {
    // gVisor lets an unprivileged task create a user namespace; airlock's filter
    // refuses unshare of namespaces with EPERM. A harmless call if it escaped.
    let script = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.unshare(0x10000000)\nprint('unshare', r, ctypes.get_errno())\n";
    let r = backend()
        .run(&spec(&["python3", "-c", script]), &mut Capture, &[])
        .unwrap();
    assert_eq!(r.stdout, format!("unshare -1 {}\n", libc::EPERM), "{r:?}");
}

#[test]
fn system_directories_and_the_agent_are_read_only() {
    let r = backend()
        .run(
            &sh("touch /usr/airlock-test 2>/dev/null && echo usr-written; cp /bin/true /.airlock/agent 2>/dev/null && echo agent-written; touch /etc/passwd 2>/dev/null && echo etc-written; echo done"),
            &mut Capture,
            &[],
        )
        .unwrap();
    assert_eq!(r.stdout, "done\n", "{r:?}");
    assert!(!std::path::Path::new("/usr/airlock-test").exists());
}

#[test]
fn doctor_says_gvisor_runs_and_on_which_platform() {
    let checks = airlock_gvisor::doctor::run(backend().options(), false);
    let sandbox = checks
        .iter()
        .find(|c| c.name == "gvisor sandbox")
        .unwrap_or_else(|| panic!("{checks:?}"));
    assert!(sandbox.ok, "{checks:?}");
    let platform = backend().platform().unwrap().as_str();
    assert!(
        sandbox.detail.starts_with(&format!("platform {platform}:")),
        "{}",
        sandbox.detail
    );
    assert!(sandbox.detail.contains("seccomp"), "{}", sandbox.detail);
}

#[test]
fn a_sandbox_whose_agent_cannot_start_is_a_host_failure() {
    // A file that is not a program where the agent should be: runsc cannot start it.
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("not-an-agent");
    std::fs::write(&fake, "this is not a program\n").unwrap();
    let mut options = backend().options().clone();
    options.agent = fake;
    let b = GvisorBackend::new(options);
    let e = b
        .create(&Shape::of(&spec(&["true"])), Purpose::OneShot)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Host, "{e}");
    assert!(e.to_string().starts_with("booting the gVisor sandbox"), "{e}");
}

#[test]
fn the_cpu_limit_holds_on_the_whole_sandbox() {
    // A busy loop until the deadline: with half a core, the sandbox's cgroup (Sentry
    // included) gets at most about half of the wall time.
    let mut s = spec(&["python3", "-c", "while True: pass"]);
    s.limits.cpus = 0.5;
    s.limits.timeout_ms = 2000;
    let r = backend().run(&s, &mut Capture, &[]).unwrap();
    assert_eq!(r.outcome, Outcome::Timeout, "{r:?}");
    assert!(r.cpu_ms > 0.0, "{r:?}");
    assert!(
        r.cpu_ms < 0.75 * r.wall_ms,
        "cpu {} ms in {} ms",
        r.cpu_ms,
        r.wall_ms
    );
}

#[test]
fn output_is_streamed_to_the_sink_as_it_comes() {
    #[derive(Default)]
    struct Collect {
        out: Vec<u8>,
        err: Vec<u8>,
    }
    impl airlock_backend::OutputSink for Collect {
        fn stdout(&mut self, data: &[u8]) {
            self.out.extend_from_slice(data);
        }
        fn stderr(&mut self, data: &[u8]) {
            self.err.extend_from_slice(data);
        }
    }
    let mut sink = Collect::default();
    let mut s = sh("echo one; echo two >&2; head -c 5000 /dev/zero | tr '\\0' z");
    s.limits.output_bytes = 1000;
    let r = backend().run(&s, &mut sink, &[]).unwrap();
    assert_eq!(sink.out.len(), 1000);
    assert!(sink.out.starts_with(b"one\nzz"));
    assert_eq!(sink.err, b"two\n");
    assert_eq!(r.stdout.as_bytes(), &sink.out[..]);
}

#[test]
fn a_rootfs_gives_the_system_directories_and_a_bad_one_is_refused() {
    let mut s = sh("test -x /usr/bin/python3 && echo has-python");
    s.rootfs = Some("/".into());
    let r = backend().run(&s, &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "has-python\n", "{r:?}");
    let dir = tempfile::tempdir().unwrap();
    s.rootfs = Some(dir.path().to_owned());
    let e = backend().create(&Shape::of(&s), Purpose::OneShot).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

#[test]
fn a_proxy_mode_session_keeps_its_proxy_for_every_exec() {
    let mut shape = spec(&["true"]);
    shape.network = airlock_spec::NetworkPolicy::Proxy(airlock_spec::ProxyPolicy {
        allow: vec!["example.invalid".into()],
        allow_cidrs: vec![],
        ..airlock_spec::ProxyPolicy::default()
    });
    let mut sb = session(&shape);
    // Execs as a session's come: without a network of their own.
    for _ in 0..2 {
        let r = sb
            .exec(
                &sh("echo $HTTP_PROXY; python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 3128), timeout=5); print(\"relay up\")'"),
                &mut Capture,
                &[],
            )
            .unwrap();
        assert_eq!(r.stdout, "http://127.0.0.1:3128\nrelay up\n", "{r:?}");
    }
}

// --- An image's prepared tree as the root ------------------------------------------------

#[path = "../../airlock-sandbox/tests/common/image.rs"]
mod image;

/// One prepared image tree for every image test of this suite.
fn image_root() -> &'static std::path::Path {
    static ROOT: OnceLock<(tempfile::TempDir, std::path::PathBuf)> = OnceLock::new();
    &ROOT
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let root = image::make(dir.path());
            (dir, root)
        })
        .1
}

fn image_shape(spec: &Spec) -> Shape {
    let mut shape = Shape::of(spec);
    shape.image = Some(airlock_backend::ImageRoot {
        digest: "sha256:test".into(),
        root: image_root().to_owned(),
    });
    shape
}

fn run_in_image(spec: &Spec) -> Result<airlock_spec::ExecResult, airlock_backend::Error> {
    backend().run_in(&image_shape(spec), spec, &mut Capture, &[])
}

fn ok_in_image(spec: &Spec) -> airlock_spec::ExecResult {
    let r = run_in_image(spec).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
    assert_eq!(r.exit_code, Some(0), "{r:#?}");
    r
}

#[test]
fn image_files_are_readable() {
    let r = ok_in_image(&sh("cat /opt/hello.txt; cat /etc/private.conf"));
    assert_eq!(r.stdout, "hello from the image\nprivate=1\n");
}

#[test]
fn image_root_is_the_image_not_the_host() {
    let r = ok_in_image(&sh(
        "ls /usr 2>&1; test -e /usr/bin/python3 && echo HOST-PYTHON; test -e /etc/ssl && echo HOST-SSL; echo end",
    ));
    assert!(
        r.stdout.contains("No such file"),
        "/usr is the host's: {}",
        r.stdout
    );
    assert!(!r.stdout.contains("HOST-"), "{}", r.stdout);
}

#[test]
fn image_program_is_uid_1000_and_the_image_is_read_only() {
    let r = ok_in_image(&sh(
        "id -u; for f in /opt/x /bin/x /etc/passwd /x; do touch $f 2>/dev/null && echo WROTE $f; done; echo end",
    ));
    assert_eq!(r.stdout, "1000\nend\n");
}

#[test]
fn image_scratch_is_writable_and_the_tree_is_unchanged() {
    // A tree of its own, that no sandbox has run in yet, in proxy mode (one more mount).
    let dir = tempfile::tempdir().unwrap();
    let tree = image::make(dir.path());
    let before = image::snapshot(&tree);
    let mut spec = sh("echo a > /workspace/a && echo b > /tmp/b && cat /workspace/a /tmp/b && pwd");
    spec.network = airlock_spec::NetworkPolicy::Proxy(airlock_spec::ProxyPolicy {
        allow: vec!["example.com".into()],
        allow_cidrs: vec![],
        ..airlock_spec::ProxyPolicy::default()
    });
    let mut shape = Shape::of(&spec);
    shape.image = Some(airlock_backend::ImageRoot {
        digest: "sha256:fresh".into(),
        root: tree.clone(),
    });
    let r = backend().run_in(&shape, &spec, &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "a\nb\n/workspace\n", "{r:#?}");
    assert_eq!(image::snapshot(&tree), before, "the prepared tree changed");
}

#[test]
fn image_etc_identity_files_are_generated() {
    let r = ok_in_image(&sh("cat /etc/passwd; id -un"));
    let passwd = airlock_sandbox::GENERATED_ETC
        .iter()
        .find(|(n, _)| *n == "passwd")
        .unwrap()
        .1;
    assert_eq!(r.stdout, format!("{passwd}sandbox\n"));
}

#[test]
fn image_program_starts_in_its_workdir() {
    let mut spec = sh("pwd; echo $PWD; cat hello.txt");
    spec.workdir = Some("/opt".into());
    assert_eq!(ok_in_image(&spec).stdout, "/opt\n/opt\nhello from the image\n");
    let mut spec = sh("pwd");
    spec.workdir = Some("/no/such/dir".into());
    let err = run_in_image(&spec).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    let airlock_backend::Error::Invalid(e) = &err else {
        unreachable!()
    };
    assert_eq!(e.field, "workdir", "{err}");
}

#[test]
fn workdir_without_an_image() {
    let mut spec = sh("pwd");
    spec.workdir = Some("/usr".into());
    let r = backend().run(&spec, &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "/usr\n", "{r:#?}");
}

#[test]
fn image_pool_sandbox_warms_up_without_bin_true_and_serves_its_image() {
    let spec = sh("cat /opt/hello.txt");
    let shape = image_shape(&spec);
    let mut sb = backend()
        .create(&shape, Purpose::Pool { behind: false })
        .expect("a pooled sandbox of an image with no /bin/true");
    let r = sb.exec_once(&spec, &mut Capture, &[]).unwrap();
    assert_eq!(r.stdout, "hello from the image\n", "{r:#?}");
    let mut other = shape.clone();
    other.image.as_mut().unwrap().digest = "sha256:other".into();
    assert!(!backend().serves(&shape, &other));
}

#[test]
fn image_session_in_proxy_mode_gets_the_proxy() {
    let mut spec = sh("echo $HTTP_PROXY; cat /opt/hello.txt");
    spec.network = airlock_spec::NetworkPolicy::Proxy(airlock_spec::ProxyPolicy {
        allow: vec!["example.com".into()],
        allow_cidrs: vec![],
        ..airlock_spec::ProxyPolicy::default()
    });
    let r = ok_in_image(&spec);
    assert!(r.stdout.contains("127.0.0.1:3128"), "{r:#?}");
    assert!(r.stdout.ends_with("hello from the image\n"), "{r:#?}");
}

#[test]
fn image_named_by_the_spec_but_unresolved_never_runs_on_the_host_root() {
    let mut spec = sh("true");
    spec.image = Some("busybox".into());
    let err = backend().run(&spec, &mut Capture, &[]).unwrap_err();
    let airlock_backend::Error::Invalid(e) = &err else {
        panic!("{err}")
    };
    assert_eq!(e.field, "image", "{err}");
}
