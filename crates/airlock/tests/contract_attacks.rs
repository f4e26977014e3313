//! THE ATTACKS THAT MATTER, ON EVERY TIER (issue 13): each case is written once and runs
//! on every isolation tier as its own test, `contract_attacks::<tier>::<case>`
//! (`cargo test --test contract_attacks microvm` runs one tier). A case asserts what a
//! caller relies on whatever the tier: the attack failed, was refused, or changed nothing
//! on the host; never a tier's own errno or mechanism (tests/security.rs keeps the
//! namespace tier's seccomp answers, tests/microvm.rs the VMM's own confinement).
//!
//! The cases: the program's identity (non-root, no capability, no way to gain one, a
//! syscall filter), syscall escapes (one compiled program makes every call in one run,
//! tests/attacks/escapes.c), the host's files and kernel tunables, the pid namespace and
//! signals, what the caller holds (fds, environment), the host's loopback with egress
//! `none`, cloud-metadata SSRF through the egress proxy, and the service's pooled and
//! session sandboxes meeting the same walls as `airlock run`. Fork and memory bombs are
//! contract cases already (tests/contract.rs: `pids_limit_holds_a_fork_bomb`,
//! `oom_is_reported`, `memfds_over_the_memory_cap_end_as_oom`); they are not repeated
//! here. After every run, nothing of it may be left on the host (tests/tierutil).
//!
//! Every attack is harmless should it ever get through, since these tests run as root:
//! mounts target an empty directory the program made and takes down, reboot and kexec
//! carry invalid magic, sysctls, the hostname and the clock are written back with the
//! values just read, no real file is written, signals are ones whose default action is to
//! be ignored, and all traffic stays on a loopback (the metadata server is a fake one in a
//! network namespace of the test's own: tests/egressutil).
//!
//! Micro-VMs run emulated on hosts without a usable KVM (seconds per run): each case makes
//! one run per tier (the service case a few execs), and nothing is timed.

mod common;
mod egressutil;
mod serverutil;
mod tierutil;

use egressutil::{METADATA, Net, PRELUDE, egress, in_netns};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use serverutil::{Daemon, poll};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;
use tierutil::{Tier, assert_run_left_nothing, daemon_leftovers};

tierutil::contract! {
    identity_is_unprivileged_and_filtered,
    syscall_escapes_are_refused,
    host_files_and_kernel_tunables_are_out_of_reach,
    pid_namespace_hides_the_host_and_signals_stay_inside,
    nothing_of_the_caller_is_inherited,
    host_loopback_is_unreachable_with_egress_none,
    metadata_ssrf_is_refused_through_the_proxy,
    the_service_sandboxes_have_the_same_walls,
}

/// Generous for an emulated micro-VM on a loaded machine; no case relies on it.
const TIMEOUT: &str = "120s";

/// The uid and gid the program runs as, user and group `sandbox`: what the README
/// documents for the namespace sandbox, which the micro-VM runs inside its guest. A tier
/// that documents another says so here, by name.
fn documented_ids(t: Tier) -> (u32, &'static str) {
    match t.name {
        "namespaces" | "gvisor" | "microvm" => (1000, "sandbox"),
        other => panic!("which uid and gid does tier {other} document? Say it here"),
    }
}

/// `airlock run --isolation TIER --timeout 120s ARGS --json -- python3 -c CODE`: the
/// program must exit 0 and print one JSON document, returned with the result.
#[track_caller]
fn python(t: Tier, args: &[&str], code: &str) -> (Value, Value) {
    let mut full = vec!["--timeout", TIMEOUT];
    full.extend_from_slice(args);
    let v = t.json(&full, &["python3", "-c", code]);
    (v.clone(), printed(&v))
}

/// The JSON document the program printed last, after checking it exited 0.
#[track_caller]
fn printed(v: &Value) -> Value {
    let out = common::ok_stdout(v);
    serde_json::from_str(out.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("the program printed no JSON ({e}): {v:#}"))
}

/// What errno `n` means (`Invalid argument (os error 22)`).
fn errno_text(n: i64) -> String {
    i32::try_from(n).map_or_else(
        |_| n.to_string(),
        |n| std::io::Error::from_raw_os_error(n).to_string(),
    )
}

// ---------------------------------------------------------------------------------------
// Identity.
// ---------------------------------------------------------------------------------------

/// What the program learns about itself from the kernel it talks to (the calls, not
/// /proc, so that every tier answers the same questions): its ids, its capability sets
/// (capget; the bounding and ambient sets, one capability at a time), no_new_privs and
/// its seccomp mode (prctl), and its /proc/self/status for a cross-check.
const IDENTITY: &str = r#"
import ctypes, grp, json, os, pwd
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
def prctl(option, arg2=0, arg3=0):
    r = libc.prctl(option, arg2, arg3, 0, 0)
    return r if r >= 0 else -ctypes.get_errno()
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
capget = libc.capget(ctypes.byref(header), data)
caps = {k: getattr(data[0], k) | getattr(data[1], k) << 32 for k in ("effective", "permitted", "inheritable")}
PR_GET_SECCOMP, PR_CAPBSET_READ, PR_GET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET = 21, 23, 39, 47, 1
def each_cap(ask):
    """The answer for every capability the kernel knows (it says EINVAL past the last)."""
    answers = []
    for cap in range(64):
        r = ask(cap)
        if r == -22:
            break
        answers.append(r)
    return answers
out = {
    "user": pwd.getpwuid(os.getuid()).pw_name,
    "group": grp.getgrgid(os.getgid()).gr_name,
    "uids": list(os.getresuid()),
    "gids": list(os.getresgid()),
    "groups": os.getgroups(),
    "capget": capget,
    "caps": caps,
    "bounding": each_cap(lambda c: prctl(PR_CAPBSET_READ, c)),
    "ambient": each_cap(lambda c: prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, c)),
    "ambient_raise": prctl(PR_CAP_AMBIENT, 2, 0),  # PR_CAP_AMBIENT_RAISE of CAP_CHOWN
    "no_new_privs": prctl(PR_GET_NO_NEW_PRIVS),
    "seccomp": prctl(PR_GET_SECCOMP),
    "status": dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l),
}
print(json.dumps(out))
"#;

fn identity_is_unprivileged_and_filtered(t: Tier) {
    let (v, r) = python(t, &[], IDENTITY);
    assert_identity(t, &v, &r);
}

/// What [`IDENTITY`] printed (`r`, from the result `v`) shows a program that is not
/// root, holds no capability and cannot gain one, under a syscall filter.
#[track_caller]
fn assert_identity(t: Tier, v: &Value, r: &Value) {
    let (id, name) = documented_ids(t);
    // Not root: the documented user, every id of it (real, effective, saved), and no
    // group but its own.
    assert_eq!((&r["user"], &r["group"]), (&json!(name), &json!(name)), "{r:#}");
    assert_eq!(r["uids"], json!([id, id, id]), "uids: {r:#}");
    assert_eq!(r["gids"], json!([id, id, id]), "gids: {r:#}");
    let groups = r["groups"].as_array().unwrap();
    assert!(groups.iter().all(|g| *g == id), "groups beyond its own: {r:#}");
    // No capability in any set, none to gain by exec, and a syscall filter in force.
    assert_eq!(r["capget"], 0, "capget failed: {r:#}");
    assert_eq!(
        r["caps"],
        json!({"effective": 0, "permitted": 0, "inheritable": 0}),
        "{r:#}"
    );
    // One answer per capability, each "not in the set" (0); CAP_AUDIT_READ (37) is the
    // last one every kernel since Linux 3.16 knows.
    for set in ["bounding", "ambient"] {
        let answers = r[set].as_array().unwrap();
        // gVisor has no ambient set at all (PR_CAP_AMBIENT is EINVAL from the first
        // capability): then raising one must fail too.
        let no_ambient_set = set == "ambient" && answers.is_empty() && r["ambient_raise"].as_i64() < Some(0);
        assert!(
            answers.len() >= 38 || no_ambient_set,
            "{set}: too few answers: {r:#}"
        );
        assert!(answers.iter().all(|a| *a == 0), "{set} set: {r:#}");
    }
    assert!(
        r["ambient_raise"].as_i64() < Some(0),
        "an ambient capability was raised: {r:#}"
    );
    assert_eq!(r["no_new_privs"], 1, "no_new_privs: {r:#}");
    assert_eq!(r["seccomp"], 2, "seccomp mode (2: a filter): {r:#}");
    // /proc/self/status says the same, in each field the tier reports.
    let want = [
        ("Uid", vec![id.to_string(); 4].join(" ")),
        ("Gid", vec![id.to_string(); 4].join(" ")),
        ("CapInh", "0".repeat(16)),
        ("CapPrm", "0".repeat(16)),
        ("CapEff", "0".repeat(16)),
        ("CapBnd", "0".repeat(16)),
        ("CapAmb", "0".repeat(16)),
        ("NoNewPrivs", "1".to_owned()),
        ("Seccomp", "2".to_owned()),
    ];
    for (key, value) in want {
        if let Some(got) = r["status"][key].as_str() {
            let got = got.split_whitespace().collect::<Vec<_>>().join(" ");
            assert_eq!(got, value, "/proc/self/status {key}: {v:#}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Syscall escapes.
// ---------------------------------------------------------------------------------------

/// tests/attacks/escapes.c, compiled once per test process (into a private directory,
/// then renamed into a shared one: concurrent test processes never see half a binary).
fn escapes_program() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let shared = Path::new(env!("CARGO_TARGET_TMPDIR")).join("airlock-contract-attacks");
        std::fs::create_dir_all(&shared).unwrap();
        let private = tempfile::tempdir_in(&shared).unwrap();
        let built = common::compile_attack("escapes", private.path());
        let dest = shared.join("escapes");
        std::fs::rename(&built, &dest).unwrap();
        dest
    })
}

/// Every call tests/attacks/escapes.c makes, each of which must be refused: mounts and the
/// root (chroot_escape: the classic climb out of a chroot, then a look for a file of the
/// host's), new user and mount namespaces (the first step to holding every capability),
/// other namespaces, tracing, kexec and reboot, kernel modules, kernel attack surface
/// (bpf, perf, keyrings, userfaultfd, io_uring, file handles), vsock (a VM's channel to its
/// host), port I/O, swap, the clock and the hostname.
const ESCAPES: &[&str] = &[
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "chroot_escape",
    "unshare_user",
    "unshare_user_mount",
    "unshare_mount",
    "clone_user",
    "clone_mount",
    "clone3_user",
    "setns",
    "ptrace",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "init_module",
    "finit_module",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "userfaultfd",
    "io_uring_setup",
    "socket_vsock",
    "open_by_handle_at",
    "iopl",
    "ioperm",
    "swapon",
    "settimeofday",
    "clock_adjtime",
    "sethostname",
];

/// How a call may be refused, whatever the tier's mechanism: not permitted (EPERM,
/// EACCES), not there at all (ENOSYS), or the caller killed. Each call's arguments are
/// such that a caller holding the privilege gets anything but these (escapes.c).
const REFUSALS: &[i32] = &[libc::EPERM, libc::EACCES, libc::ENOSYS];

/// Whether call `name` failing with `errno` is a refusal ([`REFUSALS`]; for a socket, its
/// address family not being there at all counts too).
fn is_refusal(name: &str, errno: i64) -> bool {
    let family = name.starts_with("socket_") && errno == i64::from(libc::EAFNOSUPPORT);
    family || REFUSALS.iter().any(|&x| i64::from(x) == errno)
}

fn syscall_escapes_are_refused(t: Tier) {
    let (dir, _) = common::setup("contract-escapes");
    // A file only the host has: visible to the program only if it got out.
    let marker = dir.path().join("host-only-marker");
    std::fs::write(&marker, "host\n").unwrap();
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let file = format!("{}:escapes", escapes_program().display());
    let v = t.json(
        &["--timeout", TIMEOUT, "--file", &file],
        &["./escapes", marker.to_str().unwrap()],
    );
    assert_escapes_refused(t, &v);
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        hostname,
        "the host's hostname changed"
    );
}

/// The result `v` of escapes.c shows every call refused and the host's marker unseen.
#[track_caller]
fn assert_escapes_refused(t: Tier, v: &Value) {
    let r = printed(v);
    assert_eq!(r["marker_visible"], 0, "the program sees the host's /tmp: {r:#}");
    // The harness reaches the kernel: an ordinary call succeeds.
    assert!(
        r["getpid"]["ret"].as_i64().is_some_and(|p| p > 0),
        "getpid failed: {r:#}"
    );
    let mut got_through = Vec::new();
    for name in ESCAPES {
        let c = &r[*name];
        let refused = c["signal"].is_i64()
            || (c["ret"] == -1 && c["errno"].as_i64().is_some_and(|e| is_refusal(name, e)));
        if !refused {
            let how = match (c["ret"].as_i64(), c["errno"].as_i64()) {
                (Some(-1), Some(e)) => format!("failed past the permission check: {}", errno_text(e)),
                (Some(ret), _) => format!("succeeded (returned {ret})"),
                _ => format!("no verdict: {c}"),
            };
            got_through.push(format!("{name}: {how}"));
        }
    }
    assert!(
        got_through.is_empty(),
        "calls not refused on {}:\n{}\n{v:#}",
        t.name,
        got_through.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// Host files and kernel tunables.
// ---------------------------------------------------------------------------------------

/// Content and modification time of a host file (None if it is not there).
fn snapshot(path: &str) -> Option<(Vec<u8>, std::time::SystemTime)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((std::fs::read(path).ok()?, meta.modified().ok()?))
}

fn host_files_and_kernel_tunables_are_out_of_reach(t: Tier) {
    let tag = format!("airlock-contract-probe-{}", std::process::id());
    let dirs = [
        "/",
        "/usr",
        "/usr/bin",
        "/usr/lib",
        "/usr/local",
        "/etc",
        "/bin",
        "/sbin",
        "/lib",
    ];
    let files = [
        "/etc/passwd",
        "/etc/hosts",
        "/etc/ld.so.cache",
        "/usr/bin/python3",
        "/bin/sh",
    ];
    // Kernel tunables, each written back with the value just read: the hostname, the
    // swappiness, and core_pattern (a pipe there runs a program as root on the host: the
    // classic container escape).
    let sysctls = [
        "/proc/sys/kernel/hostname",
        "/proc/sys/vm/swappiness",
        "/proc/sys/kernel/core_pattern",
    ];
    let before: Vec<_> = files.iter().map(|p| snapshot(p)).collect();
    // (A /proc file's times are its inode's, made again whenever it is looked up anew:
    // the values alone are compared.)
    let tunables = || sysctls.map(|p| std::fs::read_to_string(p).ok());
    let tunables_before = tunables();
    let code = format!(
        r#"
import errno, json, os
def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))
res = {{}}
for d in {dirs:?}:
    p = os.path.join(d, '{tag}')
    try:
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        res[p] = 'created'
    except OSError as e:
        res[p] = err(e)
    try:
        os.mkdir(p + '.d')
        res[p + '.d'] = 'created'
    except OSError as e:
        res[p + '.d'] = err(e)
# Existing files: opened for writing, nothing written.
for p in {files:?}:
    try:
        os.close(os.open(p, os.O_WRONLY | os.O_APPEND))
        res[p] = 'opened'
    except OSError as e:
        res[p] = err(e)
for p in {sysctls:?}:
    try:
        value = open(p, 'rb').read()
        fd = os.open(p, os.O_WRONLY)
    except OSError as e:
        res[p] = err(e)
        continue
    try:
        os.write(fd, value)
        res[p] = 'written'
    except OSError as e:
        res[p] = 'opened, write ' + err(e)
    os.close(fd)
print(json.dumps(res))
"#
    );
    let (v, r) = python(t, &[], &code);
    // The host first: nothing new in its system directories (what a write that got
    // through made, named after this test, is removed before the test fails), its files
    // and tunables as they were.
    let mut appeared = Vec::new();
    for d in dirs {
        let file = Path::new(d).join(&tag);
        let dir = PathBuf::from(format!("{}.d", file.display()));
        if file.exists() {
            let _ = std::fs::remove_file(&file);
            appeared.push(file);
        }
        if dir.exists() {
            let _ = std::fs::remove_dir(&dir);
            appeared.push(dir);
        }
    }
    assert!(appeared.is_empty(), "appeared on the host: {appeared:?}; {v:#}");
    let after: Vec<_> = files.iter().map(|p| snapshot(p)).collect();
    for ((p, b), a) in files.iter().zip(&before).zip(&after) {
        assert!(b.is_some(), "no host file {p} to watch");
        assert!(b == a, "the host's {p} changed");
    }
    for ((p, b), a) in sysctls.iter().zip(tunables_before).zip(tunables()) {
        assert!(b.is_some(), "no host tunable {p} to watch");
        assert_eq!(b, a, "the host's {p} changed");
    }
    // And inside, every write was refused (in a micro-VM the files are the guest's own:
    // refused all the same).
    assert_eq!(
        r.as_object().unwrap().len(),
        2 * dirs.len() + files.len() + sysctls.len(),
        "{r:#}"
    );
    let reached: Vec<String> = r
        .as_object()
        .unwrap()
        .iter()
        .filter_map(|(path, res)| {
            let res = res.as_str().unwrap_or_default();
            (res == "created" || res == "written" || res.starts_with("opened"))
                .then(|| format!("{path}: {res}"))
        })
        .collect();
    assert!(
        reached.is_empty(),
        "writes that got through on {}:\n{}\n{v:#}",
        t.name,
        reached.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// Processes and signals.
// ---------------------------------------------------------------------------------------

/// A host process that counts the SIGWINCH and SIGURG it receives (both ignored by
/// default, so the signal is harmless to any other process it might reach), its argv
/// naming it so the program can look for it.
struct Canary {
    child: std::process::Child,
    marker: String,
}

impl Canary {
    fn start() -> Canary {
        use std::io::BufRead;
        let marker = format!("airlock-canary-{}", std::process::id());
        let code = "import signal, sys\n\
                    sigs = [signal.SIGWINCH, signal.SIGURG]\n\
                    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)\n\
                    print('ready', flush=True)\n\
                    while True:\n\
                    \x20   print('got', int(signal.sigwait(sigs)), flush=True)\n";
        let mut child = Command::new(egressutil::python3())
            .args(["-c", code, &marker])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the canary");
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert_eq!(first, "ready\n", "the canary did not start");
        Canary { child, marker }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops it; what it received meanwhile, one `got N` line per signal.
    fn stop(mut self) -> String {
        use std::io::Read;
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the host's canary died during the run"
        );
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        let mut got = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut got)
            .unwrap();
        got
    }
}

fn pid_namespace_hides_the_host_and_signals_stay_inside(t: Tier) {
    let canary = Canary::start();
    let me = std::process::id();
    let host_init = std::fs::read("/proc/1/cmdline").unwrap_or_default();
    let code = format!(
        r#"
import errno, json, os, select, signal
def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))
out = {{'pid': os.getpid(), 'procs': {{}}}}
for p in os.listdir('/proc'):
    if p.isdigit():
        try:
            out['procs'][p] = open('/proc/%s/cmdline' % p, 'rb').read().decode('latin-1')
        except OSError as e:
            out['procs'][p] = err(e)
# A process of the sandbox's own that waits for SIGWINCH: kill(-1) must reach it.
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGWINCH])
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.write(w, b'r')
    signal.sigwait([signal.SIGWINCH])
    os.write(w, b'g')
    os._exit(0)
os.read(r, 1)
for name, target in (('test', {me}), ('canary', {canary})):
    out[name] = []
    for sig in (signal.SIGWINCH, signal.SIGURG):
        try:
            os.kill(target, sig)
            out[name].append('delivered')
        except OSError as e:
            out[name].append(err(e))
try:
    os.kill(-1, signal.SIGWINCH)
    os.kill(-1, signal.SIGURG)
    out['all'] = 'sent'
except OSError as e:
    out['all'] = err(e)
ready, _, _ = select.select([r], [], [], 60)
out['sibling'] = os.read(r, 1).decode() if ready else 'nothing'
os.waitpid(child, 0)
print(json.dumps(out))
"#,
        canary = canary.pid()
    );
    let (v, r) = python(t, &[], &code);
    let marker = canary.marker.clone();
    let got = canary.stop();

    // The program sees its own sandbox: a handful of processes, none of the host's.
    let procs = r["procs"].as_object().unwrap();
    assert!(
        procs.contains_key(&r["pid"].to_string()),
        "the program does not see itself: {r:#}"
    );
    assert!(procs.len() <= 3, "more than the sandbox's processes: {r:#}");
    let host_init = String::from_utf8_lossy(&host_init);
    for (pid, cmdline) in procs {
        let cmdline = cmdline.as_str().unwrap_or_default();
        assert!(
            !cmdline.contains(&marker),
            "the host's canary is visible as pid {pid}: {r:#}"
        );
        assert!(
            pid != "1" || host_init.is_empty() || cmdline != host_init,
            "pid 1 is the host's init: {r:#}"
        );
    }
    // Signals to host pids (the test's own, the canary's) find no such process; kill(-1)
    // reaches the sandbox's own processes and nothing on the host.
    for k in ["test", "canary"] {
        let sent = r[k].as_array().unwrap_or_else(|| panic!("{k}: {r:#}"));
        assert!(
            sent.len() == 2 && !sent.contains(&json!("delivered")),
            "a signal was delivered to the host's {k} pid (the test is {me}): {r:#}"
        );
    }
    assert_eq!(
        r["sibling"], "g",
        "kill(-1) did not reach the sandbox's own process: {v:#}"
    );
    assert_eq!(got, "", "the host's canary received signals from the sandbox");
}

// ---------------------------------------------------------------------------------------
// What the caller holds.
// ---------------------------------------------------------------------------------------

const SECRET_VAR: &str = "AIRLOCK_CONTRACT_SECRET";
const SECRET: &str = "airlock-contract-secret-7d41a9";

fn nothing_of_the_caller_is_inherited(t: Tier) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

    let (dir, _) = common::setup("contract-inherit");
    let secret_path = dir.path().join("secret-fd.txt");
    std::fs::write(&secret_path, SECRET).unwrap();
    let secret = std::fs::File::open(&secret_path).unwrap();
    let secret_fd = secret.as_raw_fd();
    let code = format!(
        r#"
import json, os
fds = {{}}
for fd in range(4096):
    try:
        os.fstat(fd)
    except OSError:
        continue
    try:
        fds[fd] = os.readlink('/proc/self/fd/%d' % fd)
    except OSError:
        fds[fd] = '?'
environs = []
for p in os.listdir('/proc'):
    if not p.isdigit():
        continue
    try:
        data = open('/proc/%s/environ' % p, 'rb').read()
    except OSError:
        continue
    if b'{SECRET_VAR}' in data or b'{SECRET}' in data:
        environs.append(p)
print(json.dumps({{'fds': fds, 'env': dict(os.environ), 'environs': environs}}))
"#
    );
    let mut cmd = Command::new(common::airlock_bin());
    cmd.args(["run", "--isolation", t.name, "--timeout", TIMEOUT])
        .args(["--env", "GIVEN=given", "--json", "--", "python3", "-c", &code])
        .env(SECRET_VAR, SECRET)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: between fork and exec only dup2 (async-signal-safe) runs; the new fd 9 has
    // no CLOEXEC flag, so airlock inherits an open file of the caller's.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(secret_fd, 9) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("spawn airlock");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for airlock");
    assert_run_left_nothing(pid);
    drop(secret);
    let run = common::host::Run {
        pid,
        out,
        elapsed: Duration::ZERO,
    };
    let v = t.parse(&run);
    let r = printed(&v);
    let fds: Vec<&String> = r["fds"].as_object().unwrap().keys().collect();
    assert_eq!(
        fds,
        ["0", "1", "2"],
        "the program holds more than its stdio: {r:#}"
    );
    assert!(
        !r["fds"].to_string().contains("secret-fd"),
        "the caller's open file reached the program: {r:#}"
    );
    // The environment is what --env gave, not the caller's, and no process inside can
    // read the caller's either.
    assert_eq!(r["env"]["GIVEN"], "given", "--env did not arrive: {r:#}");
    let env = r["env"].to_string();
    assert!(
        !env.contains(SECRET_VAR) && !env.contains(SECRET),
        "the caller's environment leaked in: {r:#}"
    );
    assert_eq!(
        r["environs"],
        json!([]),
        "a /proc/*/environ inside holds the caller's: {r:#}"
    );
}

// ---------------------------------------------------------------------------------------
// The network.
// ---------------------------------------------------------------------------------------

fn host_loopback_is_unreachable_with_egress_none(t: Tier) {
    // Services only the host's loopback offers: TCP on IPv4 and IPv6, and UDP.
    let tcp4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp6 = std::net::TcpListener::bind("[::1]:0").ok();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for l in std::iter::once(&tcp4).chain(&tcp6) {
        l.set_nonblocking(true).unwrap();
    }
    udp.set_nonblocking(true).unwrap();
    let port = |a: std::io::Result<std::net::SocketAddr>| a.unwrap().port();
    let code = format!(
        r#"
{PRELUDE}
out["tcp4"] = direct("127.0.0.1", {tcp4})
out["tcp6"] = direct("::1", {tcp6})
out["udp"] = udp("127.0.0.1", {udp})
print(json.dumps(out))
"#,
        tcp4 = port(tcp4.local_addr()),
        tcp6 = tcp6.as_ref().map_or(0, |l| port(l.local_addr())),
        udp = port(udp.local_addr()),
    );
    let (v, r) = python(t, &["--net", "none"], &code);
    assert_ne!(r["tcp4"], "connected", "{v:#}");
    if tcp6.is_some() {
        assert_ne!(r["tcp6"], "connected", "{v:#}");
    }
    // Whatever the program was told, the host's services saw nothing.
    for l in std::iter::once(&tcp4).chain(&tcp6) {
        match l.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("a host loopback listener saw a connection: {other:?}; {v:#}"),
        }
    }
    let mut buf = [0u8; 16];
    match udp.recv_from(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the host's UDP socket received a datagram: {other:?}; {v:#}"),
    }
    assert_eq!(v["egress"], json!([]), "{v:#}");
}

fn metadata_ssrf_is_refused_through_the_proxy(t: Tier) {
    let net = Net::start();
    // A UDP socket on the fake metadata address: a datagram that found a way past the
    // proxy would land here.
    let metadata_udp = in_netns(&net, || {
        let s = std::net::UdpSocket::bind((METADATA, 53)).expect("bind the metadata UDP port");
        s.set_nonblocking(true).unwrap();
        s
    });
    let program = format!(
        "{PRELUDE}\n{}\nprint(json.dumps(out))\n",
        r#"
out["control"] = urlopen("http://10.9.9.9/hello")
out["ip"] = urlopen("http://169.254.169.254/latest/meta-data/iam/security-credentials/")
out["name"] = urlopen("http://metadata.google.internal/computeMetadata/v1/")
out["short_name"] = urlopen("http://metadata/computeMetadata/v1/")
out["ipv6"] = urlopen("http://[fd00:ec2::254]/latest/meta-data/")
out["rebind"] = urlopen("http://rebind.allowed.test/latest/meta-data/")
# The namespace's own loopback, where a host's local services listen (urllib would not
# use the proxy for it: the program asks the proxy itself).
out["loopback"] = proxy_get("127.0.0.1", "/")[::2]
out["connect443"] = list(proxy_connect("169.254.169.254:443")[::2])
out["direct"] = direct("169.254.169.254", 80)
out["direct443"] = direct("169.254.169.254", 443)
out["direct6"] = direct("fd00:ec2::254", 80)
out["udp"] = udp("169.254.169.254", 53)
"#
    );
    let child = net
        .airlock()
        .args(["run", "--isolation", t.name, "--timeout", TIMEOUT])
        .args(["--net", "proxy", "--allow-cidr", "10.9.9.9/32"])
        .args(["--allow", "rebind.allowed.test"])
        .args(["--json", "--", "python3", "-c", &program])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn airlock");
    // `unshare` and `nsenter` exec in place: the child's pid is airlock's.
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for airlock");
    assert_run_left_nothing(pid);
    let run = common::host::Run {
        pid,
        out,
        elapsed: Duration::ZERO,
    };
    let v = t.parse(&run);
    let r = printed(&v);

    // The proxy route works (the refusals below are its decisions, not a dead route).
    assert_eq!(r["control"], json!([200, "hello from allowed\n"]), "{v:#}");
    let link_local = "link-local address 169.254.169.254";
    let wants = [
        ("ip", link_local),
        ("name", "cloud metadata name"),
        ("short_name", "cloud metadata name"),
        ("ipv6", "unique-local address fd00:ec2::254"),
        ("rebind", link_local),
    ];
    for (k, reason) in wants {
        assert_eq!(r[k], json!([403, format!("{reason}\n")]), "{k}: {v:#}");
    }
    let forbidden = |reason: &str| json!(["HTTP/1.1 403 Forbidden", format!("{reason}\n")]);
    assert_eq!(r["connect443"], forbidden(link_local), "{v:#}");
    assert_eq!(r["loopback"], forbidden("loopback address 127.0.0.1"), "{v:#}");
    // No way around the proxy: a direct connection is redirected to the proxy (issue 15),
    // which refuses it by its original destination (the metadata servers see nothing:
    // below); IPv6 has no route.
    assert_ne!(r["direct6"], "connected", "{v:#}");
    // A connection the program closes at once, unused, may end before the proxy sees it
    // (a relay ends with the exec): whatever entries there are, each is a refusal.
    let log = egress(&v);
    for e in log.iter().filter(|e| e["kind"] == "redirected") {
        assert_eq!(
            (&e["host"], &e["allowed"], &e["reason"]),
            (&json!(METADATA), &json!(false), &json!(link_local)),
            "{log:#?}"
        );
    }
    // What a datagram to port 53 was (no DNS message: logged, not answered).
    assert!(
        log.iter()
            .filter(|e| e["kind"] == "dns")
            .all(|e| e["allowed"] == false),
        "{log:#?}"
    );
    // Each refusal of a request to the proxy is in the run's egress log, with its
    // reason; the one allowed request too.
    let log: Vec<serde_json::Value> = log.into_iter().filter(|e| e["kind"] == "proxy").collect();
    let denied: Vec<(String, String)> = log
        .iter()
        .filter(|e| e["allowed"] == false)
        .map(|e| {
            (
                e["host"].as_str().unwrap_or_default().to_owned(),
                e["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        (METADATA, link_local),
        ("metadata.google.internal", "cloud metadata name"),
        ("metadata", "cloud metadata name"),
        ("[fd00:ec2::254]", "unique-local address fd00:ec2::254"),
        ("rebind.allowed.test", link_local),
        ("127.0.0.1", "loopback address 127.0.0.1"),
        (METADATA, link_local),
    ]
    .iter()
    .map(|(h, r)| ((*h).to_owned(), (*r).to_owned()))
    .collect();
    assert_eq!(denied, want, "the refused requests in the log: {log:#?}");
    assert_eq!(log.len(), want.len() + 1, "{log:#?}");
    // The fake metadata servers (and the namespace's loopback ones) saw nothing.
    net.assert_no_forbidden_connections();
    let mut buf = [0u8; 16];
    match metadata_udp.recv_from(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("a datagram reached the metadata address: {other:?}; {v:#}"),
    }
}

// ---------------------------------------------------------------------------------------
// The service.
// ---------------------------------------------------------------------------------------

/// `airlock serve` hands out sandboxes it started ahead (its warm pool) and keeps
/// sessions: a one-shot exec and a session's execs meet the same walls as `airlock run`.
fn the_service_sandboxes_have_the_same_walls(t: Tier) {
    let (dir, _) = common::setup("contract-service-walls");
    let marker = dir.path().join("host-only-marker");
    std::fs::write(&marker, "host\n").unwrap();
    let mut d = Daemon::start(t.serve_args());
    let ready = poll(Duration::from_secs(600), || {
        (d.client().get("/readyz").status == 200).then_some(())
    });
    assert!(ready.is_some(), "/readyz never answered 200; log:\n{}", d.log());
    let c = d.client();

    // A one-shot exec, from the pool.
    let v = c.exec_ok(&json!({"cmd": ["python3", "-c", IDENTITY], "isolation": t.name}));
    assert_identity(t, &v, &printed(&v));

    // A session: the attack program goes in through the files API.
    let id = c.create_session(&json!({"isolation": t.name, "ttl_s": 600}));
    let binary = std::fs::read(escapes_program()).unwrap();
    c.put(
        &format!("/v1/sandboxes/{id}/files?path=escapes&mode=755"),
        &binary,
    )
    .expect(204);
    let exec = |cmd: Value| c.session_exec(&id, &json!({"cmd": cmd})).expect(200).json();
    let v = exec(json!(["python3", "-c", IDENTITY]));
    assert_identity(t, &v, &printed(&v));
    let v = exec(json!(["./escapes", marker.to_str().unwrap()]));
    assert_escapes_refused(t, &v);
    c.delete(&format!("/v1/sandboxes/{id}")).expect(204);

    // Stopped, the daemon leaves nothing.
    assert!(
        !daemon_leftovers(&d.owner).is_empty(),
        "nothing on the host for the running daemon"
    );
    d.signal(Signal::SIGTERM);
    let status = d
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("still running 60 s after SIGTERM; log:\n{}", d.log()));
    assert_eq!(status.code(), Some(0), "{status:?}; log:\n{}", d.log());
    let gone = poll(Duration::from_secs(5), || {
        daemon_leftovers(&d.owner).is_empty().then_some(())
    });
    assert!(
        gone.is_some(),
        "left after SIGTERM: {:?}",
        daemon_leftovers(&d.owner)
    );
}
