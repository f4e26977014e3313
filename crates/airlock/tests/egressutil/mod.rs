//! Helpers for the egress tests: a network namespace of the test's own with fake "remote"
//! hosts on its loopback, test servers bound to them (counting every connection), and
//! `airlock` run inside that namespace with an `/etc/hosts` of the test's own.
//!
//! Nothing here ever sends traffic outside the namespace: it has only its loopback, and
//! every "remote" address (169.254.169.254, 10.9.9.9, …) is an address of that loopback.
#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The allowed "remote" host: a web server on :80 and a TCP echo on :7000.
pub const ALLOWED: &str = "10.9.9.9";
/// The echo port on [`ALLOWED`].
pub const ECHO_PORT: u16 = 7000;
/// A second allowed host, reached by name (a documentation address: special, so it
/// needs `--allow-cidr` too).
pub const API: &str = "203.0.113.7";
/// The fake cloud metadata server (IPv4), and its IPv6 twin (AWS's IPv6 endpoint).
pub const METADATA: &str = "169.254.169.254";
pub const METADATA6: &str = "fd00:ec2::254";
/// A private address with a server on it.
pub const PRIVATE: &str = "10.0.0.5";

/// The servers every namespace gets: (name, kind, host, port).
const SERVERS: &[(&str, &str, &str, u16)] = &[
    ("allowed", "web", ALLOWED, 80),
    ("echo", "echo", ALLOWED, ECHO_PORT),
    ("api", "web", API, 80),
    ("metadata", "web", METADATA, 80),
    ("metadata443", "echo", METADATA, 443),
    ("metadata6", "web", METADATA6, 80),
    ("loopback", "web", "127.0.0.1", 80),
    ("private", "web", PRIVATE, 80),
];

/// The namespace's `/etc/hosts`, bound over the real one only in airlock's own mount
/// namespace (`unshare --mount`): the proxy resolves names with getaddrinfo.
const HOSTS: &str = "\
127.0.0.1 localhost
::1 localhost ip6-localhost
203.0.113.7 api.allowed.test
10.9.9.9 intranet.allowed.test
10.9.9.9 notlisted.test
169.254.169.254 rebind.allowed.test
fd00:ec2::254 rebind6.allowed.test
10.9.9.9 multi.allowed.test
169.254.169.254 multi.allowed.test
169.254.169.254 metadata.google.internal metadata
";

/// Functions for the Python programs run inside the sandbox; each program fills `out`
/// and the caller prints it as JSON.
pub const PRELUDE: &str = r#"
import errno, json, os, socket, sys, urllib.error, urllib.request
PROXY = ("127.0.0.1", 3128)

def read_all(s):
    buf = b""
    while True:
        c = s.recv(65536)
        if not c:
            return buf
        buf += c

def split(resp):
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    return lines[0], lines[1:], body.decode("latin-1")

def proxy_get(host, path="/latest/meta-data/"):
    """An absolute-form GET through the proxy: [status line, headers, body]."""
    s = socket.create_connection(PROXY, timeout=30)
    s.sendall(f"GET http://{host}{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    try:
        return split(read_all(s))
    finally:
        s.close()

def proxy_connect(authority):
    """CONNECT through the proxy: (status line, the tunnel or None, a refusal's body)."""
    s = socket.create_connection(PROXY, timeout=30)
    s.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(1)
        if not c:
            break
        head += c
    status = head.split(b"\r\n")[0].decode("latin-1")
    if status.split(" ")[1:2] == ["200"]:
        return status, s, ""
    body = read_all(s).decode("latin-1")
    s.close()
    return status, None, body

def direct(host, port):
    """A direct TCP connection, bypassing the proxy: "connected" or the errno's name."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, port))
        return "connected"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
    finally:
        s.close()

def udp(host, port):
    """A UDP datagram sent directly: "sent" or the errno's name."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.sendto(b"x", (host, port))
        return "sent"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
    finally:
        s.close()

def interfaces():
    """The network interfaces the program sees (None if /proc/net/dev is unreadable)."""
    try:
        with open("/proc/net/dev") as f:
            return [l.split(":")[0].strip() for l in f.readlines()[2:]]
    except OSError:
        return None

def urlopen(url):
    """urllib with the environment's proxy settings: [status, body]."""
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return [r.status, r.read().decode("latin-1")]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode("latin-1")]

out = {}
"#;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// The host's python (the sandbox runs /usr/bin/python3 too).
pub fn python3() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// Runs a setup command, panicking with its output on failure.
#[track_caller]
fn must(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls `f` every 20 ms until it returns `Some`, or `timeout` passes.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t0.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One test's network namespace with its fake remote hosts; `Drop` stops the servers and
/// deletes the namespace.
#[derive(Debug)]
pub struct Net {
    /// `airlock-eg-<pid>-<n>`.
    pub name: String,
    /// Host-side files: the hosts file, the connection log, the servers' files.
    pub dir: tempfile::TempDir,
    servers: Option<Child>,
    created: bool,
}

impl Net {
    /// A new namespace: loopback up, the fake hosts' addresses on it, their servers
    /// listening, and a hosts file.
    pub fn start() -> Net {
        let name = format!(
            "airlock-eg-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let dir = tempfile::Builder::new()
            .prefix("airlock-egress-")
            .tempdir()
            .expect("tempdir");
        let mut net = Net {
            name,
            dir,
            servers: None,
            created: false,
        };
        must(Command::new("ip").args(["netns", "add", &net.name]));
        net.created = true;
        must(Command::new("ip").args(["-n", &net.name, "link", "set", "lo", "up"]));
        for a in [ALLOWED, API, METADATA, PRIVATE] {
            must(Command::new("ip").args(["-n", &net.name, "addr", "add", &format!("{a}/32"), "dev", "lo"]));
        }
        must(Command::new("ip").args([
            "-n",
            &net.name,
            "addr",
            "add",
            &format!("{METADATA6}/128"),
            "dev",
            "lo",
            "nodad",
        ]));
        std::fs::write(net.hosts_file(), HOSTS).expect("write hosts");
        net.start_servers();
        net
    }

    /// The namespace's path, for `nsenter --net=`.
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// The test's hosts file.
    pub fn hosts_file(&self) -> PathBuf {
        self.dir.path().join("hosts")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("connections.log")
    }

    fn start_servers(&mut self) {
        let ready = self.dir.path().join("ready");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/egressutil/servers.py");
        let mut cmd = self.nsenter(python3());
        cmd.arg(&script).arg(self.log_file()).arg(&ready);
        for (name, kind, host, port) in SERVERS {
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                (*host).to_owned()
            };
            cmd.arg(format!("{name}={kind}@{host}:{port}"));
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::from(
            std::fs::File::create(self.dir.path().join("servers.err")).unwrap(),
        ));
        let mut child = cmd.spawn().expect("spawn the test servers");
        let up = poll(Duration::from_secs(20), || {
            if ready.exists() {
                return Some(true);
            }
            child.try_wait().expect("try_wait").map(|_| false)
        });
        let err = std::fs::read_to_string(self.dir.path().join("servers.err")).unwrap_or_default();
        self.servers = Some(child);
        assert_eq!(up, Some(true), "the test servers did not start: {err}");
    }

    /// `nsenter --net=NS PROGRAM`: a program on the host side, inside the namespace.
    pub fn nsenter(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path())).arg("--").arg(program);
        cmd
    }

    /// `airlock ARGS` inside the namespace, with the test's hosts file bound over
    /// /etc/hosts in a mount namespace of its own (never the real /etc/hosts).
    pub fn airlock(&self) -> Command {
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            r#"h=$1; n=$2; shift 2; mount --bind "$h" /etc/hosts && exec nsenter --net="$n" -- "$@""#,
            "sh",
        ])
        .arg(self.hosts_file())
        .arg(self.path())
        .arg(env!("CARGO_BIN_EXE_airlock"));
        cmd
    }

    /// `airlock run ARGS --json -- ARGV` inside the namespace: the raw output.
    pub fn run_output(&self, args: &[&str], argv: &[&str]) -> Output {
        let mut cmd = self.airlock();
        cmd.arg("run").args(args).args(["--json", "--"]).args(argv);
        cmd.stdin(Stdio::null());
        cmd.output().expect("run airlock")
    }

    /// `airlock run ARGS --json -- ARGV` inside the namespace; the parsed result (airlock
    /// itself must succeed).
    #[track_caller]
    pub fn run(&self, args: &[&str], argv: &[&str]) -> Value {
        let out = self.run_output(args, argv);
        assert!(
            out.status.success(),
            "airlock run {args:?} -- {argv:?} failed: {}\nstderr: {}\nstdout: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// Runs [`PRELUDE`] + `code` with python3 in the sandbox; `code` fills `out`, printed
    /// as JSON. Returns (the ExecResult, `out`); the program must exit 0.
    #[track_caller]
    pub fn python(&self, args: &[&str], code: &str) -> (Value, Value) {
        let program = format!("{PRELUDE}\n{code}\nprint(json.dumps(out))\n");
        let v = self.run(args, &["python3", "-c", &program]);
        assert_eq!(v["outcome"], "exited", "{v:#}");
        assert_eq!(v["exit_code"], 0, "the program failed: {v:#}");
        let stdout = v["stdout"].as_str().unwrap_or_default();
        let out: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("the program printed no JSON ({e}): {v:#}"));
        (v, out)
    }

    /// Connections each server accepted so far, by server name.
    pub fn connections(&self) -> BTreeMap<String, usize> {
        let mut counts: BTreeMap<String, usize> = SERVERS.iter().map(|s| (s.0.to_owned(), 0)).collect();
        let log = std::fs::read_to_string(self.log_file()).unwrap_or_default();
        for line in log.lines() {
            *counts.entry(line.to_owned()).or_default() += 1;
        }
        counts
    }

    /// Connections the server `name` accepted so far.
    pub fn connections_to(&self, name: &str) -> usize {
        self.connections()[name]
    }

    /// Asserts that none of the servers on denied addresses (metadata, loopback, private)
    /// ever saw a connection.
    #[track_caller]
    pub fn assert_no_forbidden_connections(&self) {
        let c = self.connections();
        for name in ["metadata", "metadata443", "metadata6", "loopback", "private"] {
            assert_eq!(c[name], 0, "the {name} server saw connections: {c:?}");
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(mut child) = self.servers.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if self.created {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The egress log of an ExecResult.
#[track_caller]
pub fn egress(v: &Value) -> Vec<Value> {
    v["egress"]
        .as_array()
        .unwrap_or_else(|| panic!("no egress array: {v:#}"))
        .clone()
}

/// Runs `f` on a thread that entered the namespace `net` (sockets it makes live there).
pub fn in_netns<T: Send>(net: &Net, f: impl FnOnce() -> T + Send) -> T {
    let path = net.path();
    std::thread::scope(|s| {
        s.spawn(move || {
            let ns = std::fs::File::open(&path).expect("open the netns");
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("the netns thread panicked")
    })
}

/// `airlock serve` started inside the namespace `net` (on 127.0.0.1:0, with `args` after
/// that), ready once it printed its listening line; killed when dropped, or stopped with
/// SIGTERM by [`Serve::stop`].
pub struct Serve {
    child: Child,
    /// The port it listens on, in the namespace.
    pub port: u16,
}

impl Serve {
    /// Starts it and waits up to `timeout` for its listening line.
    pub fn start(net: &Net, args: &[&str], timeout: Duration) -> Serve {
        Serve::start_env(net, args, &[], timeout)
    }

    /// [`Serve::start`] with more environment variables (`AIRLOCK_LOG`); its stderr is
    /// [`Serve::stderr`].
    pub fn start_env(net: &Net, args: &[&str], env: &[(&str, &str)], timeout: Duration) -> Serve {
        use std::io::{BufRead, BufReader};
        let err_path = Serve::err_path(net);
        let mut child = net
            .nsenter(env!("CARGO_BIN_EXE_airlock"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .envs(env.iter().copied())
            .env_remove("AIRLOCK_API_KEYS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&err_path).unwrap()))
            .spawn()
            .expect("spawn airlock serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            for _ in lines {}
        });
        let line = rx.recv_timeout(timeout);
        let mut serve = Serve { child, port: 0 };
        let err = std::fs::read_to_string(&err_path).unwrap_or_default();
        let line = line.unwrap_or_else(|_| panic!("airlock serve printed no listening line: {err}"));
        serve.port = line
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected listening line {line:?}"));
        serve
    }

    fn err_path(net: &Net) -> PathBuf {
        net.dir.path().join("serve.err")
    }

    /// What the daemon started in `net` wrote on stderr so far.
    pub fn stderr(net: &Net) -> String {
        std::fs::read_to_string(Serve::err_path(net)).unwrap_or_default()
    }

    /// The daemon's pid (nsenter execs airlock in place).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, and the daemon's exit (it purges what it owns first).
    pub fn stop(&mut self) {
        // nsenter execs airlock in place: the child is the daemon.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let ended = poll(Duration::from_secs(60), || self.child.try_wait().ok().flatten());
        assert!(ended.is_some(), "airlock serve did not exit after SIGTERM");
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
