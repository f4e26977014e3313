//! ROOTLESS: `airlock run` as an ordinary user (docs/rootless.md). The test, as root, makes
//! a user account of its own (removed at the end), copies the binary where that user can
//! run it, and runs airlock as the user:
//! - with a delegated cgroup (a directory per v1 controller and on the unified cgroup2,
//!   under this test's own cgroups, chowned to the user, the user's process placed in them
//!   before it execs, as `systemd-run --user -p Delegate=yes` or an administrator would):
//!   the same sandbox as root's (the program is uid 1000 with no capability, no_new_privs
//!   and seccomp; memory, pids and time limits; no network; /workspace files), proxy mode
//!   refused in one line where /dev/net/tun is root's only (as here), other tiers refused;
//! - without one: `run`, `serve` and `doctor` say, in the same words, that the cgroup is
//!   missing, and run and serve exit 2;
//! - in a user namespace whose `user.max_user_namespaces` is 0: they name user namespaces.
//!
//! Every piece of host state the tests make (the account, the cgroup directories, the
//! binary's copy) has a drop guard that removes it on every path, failures included.

mod common;

use serde_json::Value;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Whether the tests can run here: as root, on a host with v1 (hybrid) cgroups, with
/// `useradd` and `setpriv`.
fn skip() -> Option<&'static str> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: cannot make a user account");
    }
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        return Some(
            "a pure cgroup v2 host: this suite delegates v1 directories (a v2 delegation is systemd's job)",
        );
    }
    for tool in ["useradd", "userdel", "setpriv", "unshare"] {
        if !Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            return Some("useradd, userdel, setpriv or unshare is missing");
        }
    }
    None
}

macro_rules! skip_unless_able {
    () => {
        if let Some(why) = skip() {
            eprintln!("NOTE: skipped: {why}");
            return;
        }
    };
}

/// A user account made for one test (no home directory, a group of its own); deleted on
/// drop.
struct TestUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl TestUser {
    fn new(tag: &str) -> TestUser {
        let name = format!("alr{tag}{}", std::process::id());
        let out = Command::new("useradd")
            .args([
                "--no-create-home",
                "--user-group",
                "--shell",
                "/usr/sbin/nologin",
                &name,
            ])
            .output()
            .expect("useradd");
        assert!(
            out.status.success(),
            "useradd {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = |flag: &str| -> u32 {
            let out = Command::new("id").args([flag, &name]).output().expect("id");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("a numeric id")
        };
        let (uid, gid) = (id("-u"), id("-g"));
        TestUser { name, uid, gid }
    }
}

impl Drop for TestUser {
    /// Its processes are gone by now (airlock's runs end; what ran in the delegated
    /// cgroup was killed by pid when it was removed): `userdel` refuses a user with live
    /// processes, so it is retried for a moment.
    fn drop(&mut self) {
        for _ in 0..50 {
            let removed = Command::new("userdel")
                .arg(&self.name)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if removed {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("NOTE: could not remove the test user {}", self.name);
    }
}

/// A copy of the binary the test user can run (target/ under /work may not be reachable
/// by other users); removed on drop.
struct BinCopy {
    dir: PathBuf,
    bin: PathBuf,
}

impl BinCopy {
    fn new(tag: &str) -> BinCopy {
        let dir = std::env::temp_dir().join(format!("airlock-rootless-{tag}{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let bin = dir.join("airlock");
        if !bin.exists() {
            std::fs::copy(env!("CARGO_BIN_EXE_airlock"), &bin).expect("copying airlock");
        }
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        BinCopy { dir, bin }
    }

    /// A file the user can read, for `--file`.
    fn file(&self, name: &str, content: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, content).expect("writing a file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        path
    }
}

impl Drop for BinCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Directories delegated to the user: one under this process's own cgroup in each v1
/// hierarchy airlock uses and on the unified cgroup2, chowned to the user. On drop,
/// whatever runs in them is killed and every directory below them (airlock's) and they
/// are removed.
struct Delegated {
    dirs: Vec<PathBuf>,
}

impl Delegated {
    fn new(user: &TestUser) -> Delegated {
        let own = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
        let mut dirs = Vec::new();
        for line in own.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            let mount = if controllers.is_empty() {
                PathBuf::from("/sys/fs/cgroup/unified")
            } else {
                let Some(c) = controllers
                    .split(',')
                    .find(|c| ["memory", "pids", "cpu", "cpuacct", "freezer"].contains(c))
                else {
                    continue;
                };
                PathBuf::from("/sys/fs/cgroup").join(c)
            };
            if !mount.exists() {
                continue;
            }
            let dir = mount
                .join(path.trim_start_matches('/'))
                .join(format!("airlock-rootless-{}", user.name));
            if dirs.contains(&dir) {
                continue;
            }
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
            dirs.push(dir.clone());
            let out = Command::new("chown")
                .args(["-R", &format!("{}:{}", user.uid, user.gid)])
                .arg(&dir)
                .output()
                .expect("chown");
            assert!(
                out.status.success(),
                "chown {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Delegated { dirs }
    }

    /// The `cgroup.procs` files the user's process is placed in.
    fn procs(&self) -> Vec<String> {
        self.dirs
            .iter()
            .map(|d| d.join("cgroup.procs").display().to_string())
            .collect()
    }
}

/// Kills what is left in `dir` and its subdirectories, then removes them, deepest first.
fn remove_cgroup_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&e.path());
        }
    }
    for _ in 0..50 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace() {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Delegated {
    fn drop(&mut self) {
        for dir in &self.dirs {
            remove_cgroup_tree(dir);
        }
    }
}

/// /dev/net/tun opened to every user for a test, its mode put back on drop.
struct TunMode {
    path: PathBuf,
    mode: u32,
}

impl TunMode {
    fn open_to_users(path: &Path, mode: u32) -> TunMode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | 0o666))
            .expect("chmod /dev/net/tun");
        TunMode {
            path: path.to_owned(),
            mode,
        }
    }
}

impl Drop for TunMode {
    fn drop(&mut self) {
        let _ = std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(self.mode));
    }
}

/// The command that runs `args` as `user`: a root shell first places itself in the
/// delegated cgroup (when given), then becomes the user (no supplementary groups) and
/// execs (so the child's pid is the program's).
fn user_command(user: &TestUser, cgroup: Option<&Delegated>, args: &[&str]) -> Command {
    let script = r#"for f in $AIRLOCK_TEST_PROCS; do echo $$ > "$f" || exit 97; done
exec setpriv --reuid="$AIRLOCK_TEST_UID" --regid="$AIRLOCK_TEST_GID" --clear-groups -- "$@""#;
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script, "as-user"])
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("HOME", "/nonexistent")
        .env(
            "AIRLOCK_TEST_PROCS",
            cgroup.map(|c| c.procs().join(" ")).unwrap_or_default(),
        )
        .env("AIRLOCK_TEST_UID", user.uid.to_string())
        .env("AIRLOCK_TEST_GID", user.gid.to_string())
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs `args` as `user` (see [`user_command`]). Killed after `within` (a refusal that
/// did not come must not hang the suite).
fn as_user(user: &TestUser, cgroup: Option<&Delegated>, args: &[&str], within: Duration) -> Output {
    let mut child = user_command(user, cgroup, args).spawn().expect("spawning sh");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stderr.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} as {} did not end within {within:?}", user.name);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_reader.join().expect("stdout reader"),
        stderr: err_reader.join().expect("stderr reader"),
    }
}

const RUN_WITHIN: Duration = Duration::from_secs(60);

/// `airlock run --json ARGS` as the user; the result.
fn run_json(user: &TestUser, cg: &Delegated, bin: &BinCopy, args: &[&str]) -> Value {
    let mut all = vec![bin.bin.to_str().expect("utf-8 path"), "run", "--json"];
    all.extend_from_slice(args);
    let out = as_user(user, Some(cg), &all, RUN_WITHIN);
    assert!(
        out.status.success(),
        "{args:?}: exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn stdout_of(v: &Value) -> &str {
    v["stdout"].as_str().unwrap_or_default()
}

/// The one refusal line of a run that exited 2: `airlock: cannot isolate: …`.
fn refusal(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "expected exit 2; stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let refusals: Vec<&&str> = lines
        .iter()
        .filter(|l| l.starts_with("airlock: cannot isolate: "))
        .collect();
    assert_eq!(refusals.len(), 1, "expected one refusal line in: {stderr}");
    (*refusals[0]).to_owned()
}

/// `doctor` as the user names the same thing, in the same words (the part of the line
/// that names no process: `what` up to its first parenthesis, and `how`).
fn assert_doctor_says_the_same(
    user: &TestUser,
    cg: Option<&Delegated>,
    bin: &BinCopy,
    prefix: &[&str],
    line: &str,
) {
    let mut args: Vec<&str> = prefix.to_vec();
    args.extend_from_slice(&[bin.bin.to_str().expect("utf-8"), "doctor", "--no-boot"]);
    let out = as_user(user, cg, &args, RUN_WITHIN);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "doctor passed although run refused: {report}"
    );
    let body = line.trim_start_matches("airlock: ");
    let what = body.split(" (").next().expect("a what");
    let how = body.rsplit_once("): ").map(|(_, how)| how).unwrap_or(body);
    let fail = report
        .lines()
        .find(|l| l.starts_with("FAIL") && l.contains(what))
        .unwrap_or_else(|| panic!("doctor has no FAIL line with {what:?}:\n{report}"));
    assert!(fail.contains(how), "doctor's line {fail:?} lacks the fix {how:?}");
}

#[test]
fn as_a_user_with_a_delegated_cgroup_the_sandbox_is_the_same() {
    skip_unless_able!();
    let user = TestUser::new("d");
    let bin = BinCopy::new("d");
    let cg = Delegated::new(&user);

    // Who the program is, and what it holds: as with root.
    let r = run_json(&user, &cg, &bin, &["--", "id", "-u"]);
    assert_eq!(r["outcome"], "exited", "{r}");
    assert_eq!(stdout_of(&r), "1000\n", "{r}");
    let r = run_json(
        &user,
        &cg,
        &bin,
        &[
            "--",
            "sh",
            "-c",
            "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status; id -g",
        ],
    );
    let status = stdout_of(&r);
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            status.contains(&format!("{set}:\t0000000000000000")),
            "{set} not empty: {status}"
        );
    }
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");
    assert!(status.ends_with("1000\n"), "gid: {status}");

    // Seccomp and landlock as with root: unshare is refused, the host's /usr read-only.
    let r = run_json(
        &user,
        &cg,
        &bin,
        &[
            "--",
            "sh",
            "-c",
            "unshare -U true 2>/dev/null; echo unshare=$?; touch /usr/x 2>/dev/null; echo touch=$?",
        ],
    );
    assert_eq!(stdout_of(&r), "unshare=1\ntouch=1\n", "{r}");

    // Memory: a bomb ends as oom.
    let r = run_json(
        &user,
        &cg,
        &bin,
        &[
            "--memory",
            "64M",
            "--",
            "python3",
            "-c",
            "x = []\nwhile True: x.append(bytearray(1 << 20))",
        ],
    );
    assert_eq!(r["outcome"], "oom", "{r}");
    assert!(
        r["memory_peak_bytes"].as_u64().unwrap_or(u64::MAX) <= 64 << 20,
        "{r}"
    );

    // Processes: a fork bomb is capped at --pids.
    let r = run_json(
        &user,
        &cg,
        &bin,
        &[
            "--pids",
            "16",
            "--",
            "python3",
            "-c",
            "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)",
        ],
    );
    let out = stdout_of(&r);
    let (n, errno) = out.trim().split_once(' ').unwrap_or_else(|| panic!("{r}"));
    let n: u32 = n.parse().expect("a count");
    assert!(n < 16, "{n} children under --pids 16: {r}");
    assert_eq!(errno, libc::EAGAIN.to_string(), "{r}");

    // Time: killed at the deadline.
    let r = run_json(&user, &cg, &bin, &["--timeout", "1s", "--", "sleep", "30"]);
    assert_eq!(r["outcome"], "timeout", "{r}");
    assert!(r["wall_ms"].as_f64().unwrap_or(f64::MAX) < 5000.0, "{r}");

    // Network none: loopback only.
    let r = run_json(
        &user,
        &cg,
        &bin,
        &[
            "--",
            "sh",
            "-c",
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
        ],
    );
    assert_eq!(stdout_of(&r), "lo\n", "{r}");

    // Files in /workspace: given ones in, new ones reported.
    let src = bin.file("given.txt", "from the host\n");
    let file_arg = format!("{}:given.txt", src.display());
    let r = run_json(
        &user,
        &cg,
        &bin,
        &[
            "--file",
            &file_arg,
            "--",
            "sh",
            "-c",
            "cat /workspace/given.txt; echo made > /workspace/made.txt; stat -c %u /workspace/made.txt",
        ],
    );
    assert_eq!(stdout_of(&r), "from the host\n1000\n", "{r}");
    let changed = r["files_changed"].to_string();
    assert!(changed.contains("/workspace/made.txt"), "{r}");

    // Proxy mode: refused in one line naming /dev/net/tun where the user may not open it
    // (root's only, as on this host); where the user may, the same proxy as root's: the
    // metadata address is refused by the proxy, whether asked through it or connected to
    // directly (redirected by the sandbox's TUN route and nftables rules).
    let exe = bin.bin.to_str().expect("utf-8");
    let tun = Path::new("/dev/net/tun");
    let user_may_open = |m: u32| m & 0o006 == 0o006;
    let mode = std::fs::metadata(tun).map(|m| m.permissions().mode() & 0o7777);
    if mode.as_ref().is_ok_and(|m| !user_may_open(*m)) {
        let out = as_user(
            &user,
            Some(&cg),
            &[exe, "run", "--net", "proxy", "--", "true"],
            RUN_WITHIN,
        );
        let line = refusal(&out);
        assert!(
            line.starts_with(
                "airlock: cannot isolate: /dev/net/tun for --net proxy (open: Permission denied"
            ),
            "{line}"
        );
    }
    if let Ok(mode) = mode {
        let _opened = (!user_may_open(mode)).then(|| TunMode::open_to_users(tun, mode));
        let r = run_json(
            &user,
            &cg,
            &bin,
            &[
                "--net",
                "proxy",
                "--",
                "python3",
                "-c",
                "import socket, urllib.request, urllib.error\n\
                 try:\n    urllib.request.urlopen('http://169.254.169.254/', timeout=5)\n\
                 except urllib.error.HTTPError as e:\n    print(e.code)\n\
                 s = socket.create_connection(('169.254.169.254', 80), timeout=5)\n\
                 s.sendall(b'GET / HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n')\n\
                 print(s.recv(12).decode())",
            ],
        );
        assert_eq!(stdout_of(&r), "403\nHTTP/1.1 403\n", "{r}");
        let egress = r["egress"].as_array().cloned().unwrap_or_default();
        assert!(
            !egress.is_empty() && egress.iter().all(|e| e["allowed"] == false),
            "{r}"
        );
    }

    // The tiers that need root say so.
    for tier in ["gvisor", "microvm"] {
        let args = [
            bin.bin.to_str().expect("utf-8"),
            "run",
            "--isolation",
            tier,
            "--",
            "true",
        ];
        let line = refusal(&as_user(&user, Some(&cg), &args, RUN_WITHIN));
        assert!(line.contains(&format!("--isolation {tier} needs root")), "{line}");
    }
}

#[test]
fn as_a_user_without_a_delegated_cgroup_airlock_refuses_naming_it() {
    skip_unless_able!();
    let user = TestUser::new("n");
    let bin = BinCopy::new("n");
    let exe = bin.bin.to_str().expect("utf-8");

    let out = as_user(&user, None, &[exe, "run", "--", "id", "-u"], RUN_WITHIN);
    let line = refusal(&out);
    assert!(
        line.starts_with("airlock: cannot isolate: a cgroup for the memory, pids and CPU limits ("),
        "{line}"
    );
    assert!(line.contains("delegate a cgroup to this user"), "{line}");
    assert!(
        out.stdout.is_empty(),
        "the program ran: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_doctor_says_the_same(&user, None, &bin, &[], &line);

    // The daemon refuses to start, the same way.
    let out = as_user(
        &user,
        None,
        &[exe, "serve", "--listen", "127.0.0.1:0"],
        RUN_WITHIN,
    );
    let serve_line = refusal(&out);
    assert!(
        serve_line.starts_with("airlock: cannot isolate: a cgroup for the memory, pids and CPU limits ("),
        "{serve_line}"
    );
}

#[test]
fn as_a_user_without_user_namespaces_airlock_refuses_naming_them() {
    skip_unless_able!();
    let user = TestUser::new("u");
    let bin = BinCopy::new("u");
    let cg = Delegated::new(&user);
    let exe = bin.bin.to_str().expect("utf-8");
    // A user namespace of the user's own whose limit on user namespaces is 0 (the limit is
    // per user namespace; the host's is untouched); airlock runs in it.
    let prefix = [
        "unshare",
        "--user",
        "--map-root-user",
        "sh",
        "-c",
        "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"",
        "nouserns",
    ];
    let mut args = prefix.to_vec();
    args.extend_from_slice(&[exe, "run", "--", "id", "-u"]);
    let out = as_user(&user, Some(&cg), &args, RUN_WITHIN);
    let line = refusal(&out);
    assert!(
        line.starts_with("airlock: cannot isolate: user namespaces (clone(CLONE_NEWUSER): "),
        "{line}"
    );
    assert!(line.contains("max_user_namespaces = 0"), "{line}");
    assert!(out.stdout.is_empty());
    assert_doctor_says_the_same(&user, Some(&cg), &bin, &prefix, &line);
}

/// The preflight as root, in a mount namespace of its own whose /proc has a path mounted
/// over it as a container runtime masks /proc/keys: the kernel refuses a new proc in a
/// user namespace then, and airlock says so, naming the masked path, before any sandbox.
#[test]
fn a_masked_proc_is_named() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/proc/keys").exists() {
        eprintln!("NOTE: skipped: needs root and /proc/keys");
        return;
    }
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount --bind /dev/null /proc/keys && exec \"$@\"",
            "masked",
            env!("CARGO_BIN_EXE_airlock"),
            "run",
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("unshare");
    let line = refusal(&out);
    assert!(
        line.starts_with(
            "airlock: cannot isolate: proc in a new pid namespace (mount: Operation not permitted"
        ),
        "{line}"
    );
    assert!(line.contains("/proc/keys"), "{line}");
    assert!(line.contains("unmask"), "{line}");
}

/// The daemon as the user, with a delegated cgroup: its sandboxes are cloned by the zygote
/// (no exec of init), and a one-shot exec and a session's exec and file read answer as
/// root's do. SIGTERM stops it.
#[test]
fn as_a_user_with_a_delegated_cgroup_the_daemon_serves() {
    use std::io::{BufRead, BufReader, Write};
    skip_unless_able!();
    let user = TestUser::new("s");
    let bin = BinCopy::new("s");
    let cg = Delegated::new(&user);
    let exe = bin.bin.to_str().expect("utf-8");
    let mut child = user_command(&user, Some(&cg), &[exe, "serve", "--listen", "127.0.0.1:0"])
        .spawn()
        .expect("spawning serve");
    /// SIGTERM to the daemon (our child, by pid) and a wait, on every path.
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            // SAFETY: kill with our own child's pid and a signal number.
            unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while self.0.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().expect("stdout");
    let mut daemon = Stop(child);
    let mut first = String::new();
    BufReader::new(stdout)
        .read_line(&mut first)
        .expect("reading serve's stdout");
    let Some(addr) = first.trim().strip_prefix("airlock: listening on http://") else {
        let mut err = String::new();
        let _ = daemon.0.stderr.take().map(|mut e| e.read_to_string(&mut err));
        panic!("serve did not start: {first:?} {err}");
    };
    let addr = addr.to_owned();
    let request = |method: &str, path: &str, body: &str| -> (u16, String) {
        let mut conn = std::net::TcpStream::connect(&addr).expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        write!(
            conn,
            "{method} {path} HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        let mut reply = String::new();
        conn.read_to_string(&mut reply).expect("read");
        let status = reply.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = reply
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    };
    let (code, body) = request(
        "POST",
        "/v1/exec",
        r#"{"cmd":["sh","-c","id -u; grep CapEff /proc/self/status"]}"#,
    );
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(stdout_of(&v), "1000\nCapEff:\t0000000000000000\n", "{v}");

    let (code, body) = request("POST", "/v1/sandboxes", r#"{"ttl_s":60}"#);
    assert_eq!(code, 201, "{body}");
    let id = serde_json::from_str::<Value>(&body).expect("JSON")["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let (code, body) = request(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        r#"{"cmd":["sh","-c","echo kept > /workspace/a; id -u"]}"#,
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(stdout_of(&serde_json::from_str(&body).expect("JSON")), "1000\n");
    let (code, body) = request("GET", &format!("/v1/sandboxes/{id}/files?path=a"), "");
    assert_eq!((code, body.as_str()), (200, "kept\n"));
    let (code, _) = request("DELETE", &format!("/v1/sandboxes/{id}"), "");
    assert!((200..300).contains(&code), "delete: {code}");
}

/// docs/cgroups.md's v1 delegation block, as typed but for the user's name (`U=alice` is
/// the reader's own account; here it is the test's), run as root; then the user runs a
/// sandbox with `--cgroup-parent /airlock-<user>` without being moved there, and the
/// sandbox's cgroup is made under those directories (the memory limit written there by
/// root bounds it).
#[test]
fn docs_cgroups_v1_delegation_block_runs_as_typed() {
    skip_unless_able!();
    let user = TestUser::new("b");
    let bin = BinCopy::new("b");
    let block = common::docs::doc_shell_block("docs/cgroups.md", "## Delegating a cgroup");
    assert!(
        block.starts_with("U=alice;"),
        "the block's first line changed: {block}"
    );
    let script = block.replacen("U=alice;", &format!("U={};", user.name), 1);
    let n = format!("airlock-{}", user.name);
    // Removed on every path, even when the block fails half-way.
    struct Dirs(Vec<PathBuf>);
    impl Drop for Dirs {
        fn drop(&mut self) {
            for d in &self.0 {
                remove_cgroup_tree(d);
            }
        }
    }
    let dirs = Dirs(
        ["memory", "pids", "cpu", "cpuacct", "freezer", "unified"]
            .iter()
            .map(|h| Path::new("/sys/fs/cgroup").join(h).join(&n))
            .collect(),
    );
    let out = Command::new("sh").args(["-ec", &script]).output().expect("sh");
    assert!(
        out.status.success(),
        "the block failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let memory = dirs.0[0].clone();
    assert!(memory.is_dir(), "the block made no {}", memory.display());
    // What root may then write there bounds all the user's sandboxes.
    std::fs::write(memory.join("memory.limit_in_bytes"), "64M").expect("a limit on the parent");
    let parent = format!("/{n}");
    let mut args = vec![
        bin.bin.to_str().expect("utf-8"),
        "run",
        "--json",
        "--cgroup-parent",
        &parent,
        "--memory",
        "256M",
        "--",
    ];
    let r = {
        args.extend_from_slice(&["id", "-u"]);
        let out = as_user(&user, None, &args, RUN_WITHIN);
        assert!(
            out.status.success(),
            "exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).expect("JSON")
    };
    assert_eq!(stdout_of(&r).trim(), "1000", "{r}");
    // 150 MiB under a 64 MiB parent: the parent's limit ends it, not the sandbox's 256M.
    args.truncate(args.len() - 2);
    args.extend_from_slice(&["python3", "-c", "b = bytearray(150 << 20); print('survived')"]);
    let out = as_user(&user, None, &args, RUN_WITHIN);
    let r: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(r["outcome"], "oom", "{r}");
    drop(dirs);
}
