//! Security guarantees of the namespace tier (`airlock run`), each shown by a real
//! attacking program run in a real sandbox: the seccomp wall with its own answers (one
//! denied syscall per test, its errno), the host's view of the program, the terminal,
//! landlock, init's fds, the network's mechanisms, /proc/*/exe and init's signals.
//!
//! What a caller relies on whatever the tier (identity and capabilities, syscall escapes
//! refused, host files and sysctls, the pid namespace and signals to the host, inherited
//! fds and environment, the host's loopback, metadata SSRF) is tests/contract_attacks.rs,
//! run on every tier.
//!
//! Every attack is harmless should it ever get through: mounts target an empty temporary
//! directory, reboot uses an invalid magic, sysctls and files are written with their current
//! content, traffic only goes to loopback (or is a UDP `connect`, which sends nothing).

mod common;

use common::{TestCommand, compile_attack, ok_stdout, sandbox_processes};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `airlock run` with a deadline generous enough for a loaded CI machine (the tests run in
/// parallel, each sandbox gets half a core by default).
fn sandbox() -> TestCommand {
    TestCommand::run().args(["--timeout", "60s"])
}

/// Runs python3 code in a sandbox and parses the JSON it prints on stdout.
fn python_json(code: &str) -> Value {
    let v = sandbox().python(code);
    let out = ok_stdout(&v);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("program output is not JSON ({e}): {v:#}"))
}

/// The compiled attack programs, built once per test process. They are compiled into a
/// private directory and renamed into a shared one, so concurrent test processes never see a
/// half-written binary.
fn attack_program(name: &'static str) -> PathBuf {
    static SYSCALLS: OnceLock<PathBuf> = OnceLock::new();
    static INT80: OnceLock<PathBuf> = OnceLock::new();
    let cell = match name {
        "syscalls" => &SYSCALLS,
        "int80" => &INT80,
        _ => panic!("unknown attack program {name}"),
    };
    cell.get_or_init(|| {
        let shared = Path::new(env!("CARGO_TARGET_TMPDIR")).join("airlock-attacks");
        std::fs::create_dir_all(&shared).unwrap();
        let private = tempfile::tempdir_in(&shared).unwrap();
        let built = compile_attack(name, private.path());
        let dest = shared.join(name);
        std::fs::rename(&built, &dest).unwrap();
        dest
    })
    .clone()
}

/// Result of one call made by `tests/attacks/syscalls.c` inside a sandbox.
#[derive(Debug)]
struct CallResult {
    ret: i64,
    errno: i32,
    raw: Value,
}

/// Runs `syscalls NAME` in a sandbox (the program is copied in with `--file`).
fn attack(name: &str) -> CallResult {
    let bin = attack_program("syscalls");
    let v = sandbox()
        .args(["--file", &format!("{}:syscalls", bin.display())])
        .json(&["./syscalls", name]);
    let out = ok_stdout(&v);
    let line = out
        .lines()
        .next()
        .unwrap_or_else(|| panic!("no output from the attack: {v:#}"));
    let field = |key: &str| -> i64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
    };
    CallResult {
        ret: field("ret="),
        errno: field("errno=") as i32,
        raw: v,
    }
}

/// Asserts the named attack's call failed with one of `errnos`.
fn assert_denied(name: &str, errnos: &[i32]) {
    let r = attack(name);
    assert_eq!(
        r.ret, -1,
        "{name} was not refused (returned {}): {:#}",
        r.ret, r.raw
    );
    assert!(
        errnos.contains(&r.errno),
        "{name} failed with errno {} ({}), expected one of {errnos:?}: {:#}",
        r.errno,
        std::io::Error::from_raw_os_error(r.errno),
        r.raw
    );
}

macro_rules! denied_syscalls {
    ($($(#[$meta:meta])* $test:ident: $attack:literal => $errnos:expr;)*) => {
        $(
            $(#[$meta])*
            #[test]
            fn $test() {
                assert_denied($attack, &$errnos);
            }
        )*
    };
}

const EPERM: i32 = libc::EPERM;
const ENOSYS: i32 = libc::ENOSYS;
const EAFNOSUPPORT: i32 = libc::EAFNOSUPPORT;

denied_syscalls! {
    mount_is_denied: "mount" => [EPERM];
    umount2_is_denied: "umount2" => [EPERM];
    pivot_root_is_denied: "pivot_root" => [EPERM];
    chroot_is_denied: "chroot" => [EPERM];
    unshare_new_user_namespace_is_denied: "unshare_newuser" => [EPERM];
    unshare_new_mount_namespace_is_denied: "unshare_newns" => [EPERM];
    unshare_new_network_namespace_is_denied: "unshare_newnet" => [EPERM];
    setns_is_denied: "setns" => [EPERM];
    clone_with_new_user_namespace_flag_is_denied: "clone_newuser" => [EPERM];
    clone_with_new_mount_namespace_flag_is_denied: "clone_newns" => [EPERM];
    /// clone3's flags are behind a pointer: refused with ENOSYS so libc falls back to clone.
    clone3_returns_enosys: "clone3" => [ENOSYS];
    ptrace_attach_is_denied: "ptrace_attach" => [EPERM];
    ptrace_traceme_is_denied: "ptrace_traceme" => [EPERM];
    /// Reads the caller's own memory: only the filter can make this fail.
    process_vm_readv_is_denied: "process_vm_readv" => [EPERM];
    process_vm_writev_is_denied: "process_vm_writev" => [EPERM];
    keyctl_is_denied: "keyctl" => [EPERM];
    add_key_is_denied: "add_key" => [EPERM];
    request_key_is_denied: "request_key" => [EPERM];
    bpf_is_denied: "bpf" => [EPERM];
    perf_event_open_is_denied: "perf_event_open" => [EPERM];
    userfaultfd_is_denied: "userfaultfd" => [EPERM];
    io_uring_setup_is_denied: "io_uring_setup" => [EPERM];
    init_module_is_denied: "init_module" => [EPERM];
    finit_module_is_denied: "finit_module" => [EPERM];
    delete_module_is_denied: "delete_module" => [EPERM];
    kexec_load_is_denied: "kexec_load" => [EPERM];
    kexec_file_load_is_denied: "kexec_file_load" => [EPERM];
    open_by_handle_at_is_denied: "open_by_handle_at" => [EPERM];
    /// tmpfs exports handles: only the filter can make this fail.
    name_to_handle_at_is_denied: "name_to_handle_at" => [EPERM];
    fsopen_is_denied: "fsopen" => [EPERM];
    open_tree_is_denied: "open_tree" => [EPERM];
    move_mount_is_denied: "move_mount" => [EPERM];
    mount_setattr_is_denied: "mount_setattr" => [EPERM];
    /// With an invalid magic: EINVAL would mean the call reached the kernel's reboot code.
    reboot_is_denied: "reboot" => [EPERM];
    swapon_is_denied: "swapon" => [EPERM];
    swapoff_is_denied: "swapoff" => [EPERM];
    acct_is_denied: "acct" => [EPERM];
    syslog_is_denied: "syslog" => [EPERM];
    personality_addr_no_randomize_is_denied: "personality_addr_no_randomize" => [EPERM];
    personality_read_implies_exec_is_denied: "personality_read_implies_exec" => [EPERM];
    /// stdin is not a terminal: ENOTTY would mean the ioctl reached the tty layer.
    ioctl_tiocsti_is_denied: "tiocsti" => [EPERM];
    /// The kernel truncates the request to 32 bits: 0x1_0000_5412 is TIOCSTI too.
    ioctl_tiocsti_with_high_bits_is_denied: "tiocsti_high_bits" => [EPERM];
    ioctl_tioclinux_is_denied: "tioclinux" => [EPERM];
    socket_af_netlink_is_denied: "socket_netlink" => [EAFNOSUPPORT, EPERM];
    socket_af_packet_is_denied: "socket_packet" => [EAFNOSUPPORT, EPERM];
    socket_af_vsock_is_denied: "socket_vsock" => [EAFNOSUPPORT, EPERM];
    socketpair_af_inet_is_denied: "socketpair_inet" => [EAFNOSUPPORT, EPERM, libc::EOPNOTSUPP];
}

/// The harness itself: an allowed call succeeds, so the refusals above are the filter's.
#[test]
fn attack_harness_allowed_syscall_succeeds() {
    let r = attack("allowed_getpid");
    assert!(r.ret > 0, "getpid failed in the sandbox: {:#}", r.raw);
}

#[test]
fn x32_syscall_is_refused_with_eperm() {
    // getpid | __X32_SYSCALL_BIT: the process survives and gets an error, not a pid. EPERM
    // is the filter's answer; a kernel without x32 support would say ENOSYS by itself, so
    // ENOSYS would not show the filter at work.
    let r = attack("x32_getpid");
    assert_eq!(r.ret, -1, "x32 getpid succeeded: {:#}", r.raw);
    assert_eq!(r.errno, EPERM, "x32 getpid: {:#}", r.raw);
}

#[test]
fn i386_int80_entry_kills_with_sigsys() {
    let bin = attack_program("int80");
    let v = sandbox()
        .args(["--file", &format!("{}:int80", bin.display())])
        .json(&["./int80"]);
    assert_eq!(v["outcome"], "signaled", "int 0x80 was not killed: {v:#}");
    assert_eq!(
        v["signal"],
        libc::SIGSYS,
        "int 0x80 was killed by another signal: {v:#}"
    );
    assert!(!v["stdout"].as_str().unwrap().contains("survived"), "{v:#}");
}

// --- the host's view of the program ---------------------------------------------------

/// A host process whose cmdline is exactly `argv`.
#[derive(Debug)]
struct HostProc {
    pid: u32,
    status: String,
    stat_fields: Vec<String>,
}

impl HostProc {
    fn field(&self, key: &str) -> Vec<u64> {
        self.status
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
            .unwrap_or_else(|| panic!("no {key} in status of {}", self.pid))
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect()
    }
}

fn find_host_process(argv: &[&str]) -> Option<HostProc> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline != want {
            continue;
        }
        let (Ok(status), Ok(stat)) = (
            std::fs::read_to_string(entry.path().join("status")),
            std::fs::read_to_string(entry.path().join("stat")),
        ) else {
            continue;
        };
        // Fields after "pid (comm)": state is field 3, so index 0 here.
        let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
        let stat_fields = after_comm.split_whitespace().map(str::to_owned).collect();
        return Some(HostProc {
            pid,
            status,
            stat_fields,
        });
    }
    None
}

/// Runs `sleep SECS` in a sandbox in the background, waits until the host sees it, and
/// passes it to `check`; then waits for the run's result and returns it with the pid.
fn with_host_view_of_sleep(secs: &str, check: impl FnOnce(&HostProc)) -> (Value, u32) {
    let secs_owned = secs.to_owned();
    let run = std::thread::spawn(move || sandbox().json(&["sleep", &secs_owned]));
    let deadline = Instant::now() + Duration::from_secs(30);
    let proc = loop {
        if let Some(p) = find_host_process(&["sleep", secs]) {
            break p;
        }
        assert!(
            !run.is_finished(),
            "the sandboxed sleep ended before the host saw it"
        );
        assert!(
            Instant::now() < deadline,
            "the sandboxed sleep never appeared on the host"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    check(&proc);
    let v = run.join().expect("the airlock thread panicked");
    (v, proc.pid)
}

#[test]
fn host_sees_program_under_unprivileged_mapped_uid_and_it_goes_away() {
    let base = u64::from(airlock_sandbox::HOST_UID_BASE);
    let (v, pid) = with_host_view_of_sleep("3.1415", |p| {
        for key in ["Uid", "Gid"] {
            let ids = p.field(key);
            assert_eq!(ids.len(), 4);
            assert!(
                ids.iter().all(|&id| id >= base),
                "host {key} of the sandboxed program: {ids:?} (< {base})"
            );
            assert!(ids.iter().all(|&id| id == ids[0]), "host {key}s differ: {ids:?}");
        }
        assert_eq!(p.field("CapEff"), [0], "host view of CapEff");
        // In a child pid namespace: NSpid has the host pid and the sandbox pid.
        assert!(
            p.field("NSpid").len() >= 2,
            "not in its own pid namespace: {}",
            p.status
        );
        assert!(
            sandbox_processes()
                .iter()
                .any(|l| l.starts_with(&format!("{}:", p.pid))),
            "common::sandbox_processes() misses pid {}",
            p.pid
        );
    });
    ok_stdout(&v);
    // After the run: the process is gone (not left as a zombie or orphan either).
    assert!(
        find_host_process(&["sleep", "3.1415"]).is_none(),
        "the sandboxed sleep (host pid {pid}) survived its run"
    );
    assert!(
        !sandbox_processes()
            .iter()
            .any(|l| l.starts_with(&format!("{pid}:"))),
        "host pid {pid} still runs under a sandbox uid"
    );
}

#[test]
fn program_has_its_own_session_without_terminal_from_host_view() {
    // SAFETY: getsid(0) only reads the calling process's session id.
    let own_sid = unsafe { libc::getsid(0) };
    let (v, _) = with_host_view_of_sleep("2.7182", |p| {
        // stat fields after "pid (comm)": state ppid pgrp session tty_nr ...
        let session: i32 = p.stat_fields[3].parse().unwrap();
        let tty_nr: i32 = p.stat_fields[4].parse().unwrap();
        assert_ne!(
            session, own_sid,
            "the sandboxed program shares the test's session"
        );
        assert_eq!(
            session as u32, p.pid,
            "the sandboxed program does not lead its own session"
        );
        assert_eq!(tty_nr, 0, "the sandboxed program has a controlling terminal");
    });
    ok_stdout(&v);
}

// --- terminal ----------------------------------------------------------------------------

#[test]
fn dev_tty_cannot_be_opened() {
    let r = python_json(
        r#"
import errno, json, os
try:
    os.open('/dev/tty', os.O_RDWR)
    res = 'opened'
except OSError as e:
    res = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps({'tty': res}))
"#,
    );
    assert_ne!(r["tty"], "opened", "/dev/tty opened inside the sandbox");
}

#[test]
fn program_leads_its_own_session() {
    let r = python_json(
        r#"
import json, os
stat = open('/proc/self/stat').read()
fields = stat[stat.rindex(')') + 2:].split()
print(json.dumps({'pid': os.getpid(), 'sid': os.getsid(0), 'tty_nr': int(fields[4])}))
"#,
    );
    // A session inherited from the host would have a leader outside the pid namespace: 0.
    assert_ne!(r["sid"], 0, "session leader outside the sandbox: {r}");
    assert_eq!(r["sid"], r["pid"], "the program is not its session's leader: {r}");
    assert_eq!(r["tty_nr"], 0, "the program has a controlling terminal: {r}");
}

/// airlock started from a terminal (a pty that is its controlling terminal and stdin):
/// nothing inside can reach the terminal or push input into it.
#[test]
fn caller_terminal_cannot_receive_keystrokes() {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;

    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two fds into the provided ints; name, termios and winsize
    // may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: openpty just returned these fds, nothing else owns them.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    // Raw mode: injected bytes become readable at once, without waiting for a newline.
    // SAFETY: termios is plain data, filled by tcgetattr before use.
    let mut tio: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and a valid termios pointer.
    assert_eq!(unsafe { libc::tcgetattr(slave.as_raw_fd(), &mut tio) }, 0);
    // SAFETY: cfmakeraw only edits the struct; tcsetattr reads it.
    unsafe {
        libc::cfmakeraw(&mut tio);
        assert_eq!(libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &tio), 0);
    }

    let code = r#"
import errno, fcntl, json, os, termios
res = {}
for fd in (0, 1, 2):
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b'#')
        res['tiocsti%d' % fd] = 'ok'
    except OSError as e:
        res['tiocsti%d' % fd] = errno.errorcode.get(e.errno, str(e.errno))
    res['isatty%d' % fd] = os.isatty(fd)
try:
    fd = os.open('/dev/tty', os.O_RDWR)
    fcntl.ioctl(fd, termios.TIOCSTI, b'#')
    res['devtty'] = 'injected'
except OSError as e:
    res['devtty'] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(res))
"#;
    let stdin_fd = slave.try_clone().unwrap();
    let stderr_fd = slave.try_clone().unwrap();
    let mut cmd = std::process::Command::new(common::airlock_bin());
    cmd.args(["run", "--timeout", "60s", "--json", "--", "python3", "-c", code])
        .stdin(std::process::Stdio::from(stdin_fd))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::from(stderr_fd));
    // SAFETY: between fork and exec only async-signal-safe calls are made: setsid and an
    // ioctl making stdin (the pty slave) the controlling terminal.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("run airlock on a pty");
    assert!(out.status.success(), "airlock failed: {out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let r: Value = serde_json::from_str(&ok_stdout(&v)).unwrap();
    for fd in 0..3 {
        assert_eq!(
            r[format!("isatty{fd}")],
            false,
            "fd {fd} inside is a terminal: {r}"
        );
        assert_ne!(
            r[format!("tiocsti{fd}")],
            "ok",
            "TIOCSTI on fd {fd} succeeded: {r}"
        );
    }
    assert_ne!(r["devtty"], "injected", "{r}");

    // Nothing was pushed into the terminal's input queue.
    // SAFETY: valid fd; F_SETFL with O_NONBLOCK only changes its flags.
    unsafe { libc::fcntl(slave.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    let mut buf = [0u8; 64];
    // SAFETY: reads into a buffer of the given length.
    let n = unsafe { libc::read(slave.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    let err = std::io::Error::last_os_error();
    assert!(
        n < 0 && err.raw_os_error() == Some(libc::EAGAIN),
        "the terminal received input from the sandbox: {:?}",
        &buf[..n.max(0) as usize]
    );
    drop(master);
}

// --- landlock ----------------------------------------------------------------------------

/// Programs may write their own /proc/self files (thread names through
/// /proc/self/task/*/comm, their oom_score_adj upwards): landlock allows file writes under
/// /proc for compatibility. Kernel tunables stay out of reach: /proc/sys is read-only.
/// Each value is written back unchanged.
#[test]
fn proc_self_is_writable_but_proc_sys_is_not() {
    let code = r#"
import errno, json, os
res = {}
for p in ('/proc/self/comm', '/proc/self/oom_score_adj', '/proc/sys/kernel/hostname', '/proc/sys/vm/overcommit_memory'):
    try:
        value = open(p, 'rb').read()
        fd = os.open(p, os.O_WRONLY)
        os.write(fd, value)
        os.close(fd)
        res[p] = 'written'
    except OSError as e:
        res[p] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(res))
"#;
    let r = python_json(code);
    assert_eq!(r["/proc/self/comm"], "written", "{r}");
    assert_eq!(r["/proc/self/oom_score_adj"], "written", "{r}");
    for p in ["/proc/sys/kernel/hostname", "/proc/sys/vm/overcommit_memory"] {
        let res = r[p].as_str().unwrap_or_default();
        assert!(
            res == "EROFS" || res == "EACCES" || res == "EPERM",
            "writing {p} inside: {r}"
        );
    }
}

// --- file descriptors ----------------------------------------------------------------------

/// init's control socket and whatever else init holds are out of the program's reach:
/// /proc/1/fd cannot even be listed. (That the program holds only its stdio and none of
/// the caller's fds: tests/contract_attacks.rs, on every tier.)
#[test]
fn init_fds_are_not_listable() {
    let r = python_json(
        r#"
import json, os
try:
    init_fds = os.listdir('/proc/1/fd')
except OSError as e:
    init_fds = e.errno
print(json.dumps({'init_fds': init_fds}))
"#,
    );
    assert_eq!(
        r["init_fds"],
        libc::EACCES,
        "init's fds are listable by the program: {r}"
    );
}

// --- network -----------------------------------------------------------------------------

#[test]
fn loopback_is_the_only_interface_and_it_is_up() {
    let r = python_json(
        r#"
import fcntl, json, socket, struct
lines = open('/proc/net/dev').read().splitlines()[2:]
names = sorted(l.split(':')[0].strip() for l in lines)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack('16sH', fcntl.ioctl(s.fileno(), 0x8913, struct.pack('16sH', b'lo', 0)))[1]
print(json.dumps({'interfaces': names, 'lo_up': bool(flags & 1)}))
"#,
    );
    assert_eq!(r["interfaces"], serde_json::json!(["lo"]), "{r}");
    assert_eq!(r["lo_up"], true, "loopback is down: {r}");
}

#[test]
fn tcp_connect_is_denied() {
    let r = python_json(
        r#"
import json, socket
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    s.connect(('127.0.0.1', 9))
    res = 0
except OSError as e:
    res = e.errno
print(json.dumps({'errno': res}))
"#,
    );
    // Landlock's TCP connect rule refuses before the stack answers (ECONNREFUSED).
    assert_eq!(r["errno"], libc::EACCES, "connect to 127.0.0.1:9: {r}");
}

/// A program may listen (a dev server in a session, reached only through airlock's port
/// forwarding: the sandbox's network namespace has nothing else), but in mode none it may
/// still connect to nothing, its own listener included: landlock's connect rule stays.
#[test]
fn tcp_bind_works_but_connect_stays_denied() {
    let r = python_json(
        r#"
import json, socket
res = {}
for fam, addr in ((socket.AF_INET, ('127.0.0.1', 18080)), (socket.AF_INET6, ('::1', 18080))):
    s = socket.socket(fam, socket.SOCK_STREAM)
    try:
        s.bind(addr)
        s.listen(1)
        res['bind%d' % fam] = 0
    except OSError as e:
        res['bind%d' % fam] = e.errno
    c = socket.socket(fam, socket.SOCK_STREAM)
    try:
        c.connect(addr)
        res['connect%d' % fam] = 0
    except OSError as e:
        res['connect%d' % fam] = e.errno
print(json.dumps(res))
"#,
    );
    for (what, errno) in r.as_object().unwrap() {
        let want = if what.starts_with("bind") { 0 } else { libc::EACCES };
        assert_eq!(errno, want, "{what} inside the sandbox: {r}");
    }
}

#[test]
fn no_route_out_udp_gets_enetunreach() {
    // A UDP connect only looks the route up: no packet is ever sent.
    let r = python_json(
        r#"
import json, socket
res = {}
for fam, addr in ((socket.AF_INET, ('8.8.8.8', 53)), (socket.AF_INET6, ('2001:4860:4860::8888', 53))):
    try:
        s = socket.socket(fam, socket.SOCK_DGRAM)
    except OSError as e:
        res[str(fam)] = 'socket:%d' % e.errno
        continue
    try:
        s.connect(addr)
        res[str(fam)] = 0
    except OSError as e:
        res[str(fam)] = e.errno
print(json.dumps(res))
"#,
    );
    assert_eq!(r["2"], libc::ENETUNREACH, "UDP to 8.8.8.8: {r}");
    assert_eq!(r["10"], libc::ENETUNREACH, "UDP to 2001:4860:4860::8888: {r}");
}

// --- host files --------------------------------------------------------------------------

/// Content and modification time of a host file.
fn snapshot(path: &Path) -> (Vec<u8>, std::time::SystemTime) {
    let meta = std::fs::metadata(path).unwrap();
    (std::fs::read(path).unwrap(), meta.modified().unwrap())
}

#[test]
fn host_airlock_binary_is_not_writable_through_proc_exe() {
    let airlock = common::airlock_bin();
    let python = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let before = (snapshot(&airlock), snapshot(&python));
    // Each open that succeeds would write back the first bytes it read: even then nothing
    // changes, but the open itself must fail.
    let r = python_json(
        r#"
import errno, json, os
res = {}
for p in ('/proc/self/exe', '/proc/1/exe', '/proc/%d/exe' % os.getppid()):
    for name, flags in (('wronly', os.O_WRONLY), ('rdwr', os.O_RDWR), ('append', os.O_WRONLY | os.O_APPEND)):
        key = p + ':' + name
        try:
            fd = os.open(p, flags)
        except OSError as e:
            res[key] = errno.errorcode.get(e.errno, str(e.errno))
            continue
        try:
            head = open(p, 'rb').read(4)
            os.pwrite(fd, head, 0)
            res[key] = 'written'
        except OSError as e:
            res[key] = 'opened'
        os.close(fd)
print(json.dumps(res))
"#,
    );
    for (key, res) in r.as_object().unwrap() {
        assert!(
            res != "written" && res != "opened",
            "{key} was opened for writing inside: {r}"
        );
    }
    let after = (snapshot(&airlock), snapshot(&python));
    assert!(before.0 == after.0, "the host's airlock binary changed");
    assert!(before.1 == after.1, "the host's python3 binary changed");
}

// --- signals and processes -------------------------------------------------------------

#[test]
fn kill_all_and_kill_init_only_affect_the_sandbox() {
    let mut canary = std::process::Command::new("sleep").arg("60").spawn().unwrap();
    let v = sandbox().python(
        r#"
import json, os, signal, subprocess
child = subprocess.Popen(['sleep', '30'])
res = {}
for name, pid, sig in (('init_kill', 1, signal.SIGKILL), ('init_term', 1, signal.SIGTERM)):
    try:
        os.kill(pid, sig)
        res[name] = 0
    except OSError as e:
        res[name] = e.errno
os.kill(-1, signal.SIGKILL)  # everything this program may signal, except itself
res['child'] = child.wait()
print(json.dumps(res))
"#,
    );
    let r: Value = serde_json::from_str(&ok_stdout(&v)).unwrap();
    assert_eq!(r["init_kill"], libc::EPERM, "signalling init: {r}");
    assert_eq!(r["init_term"], libc::EPERM, "signalling init: {r}");
    assert_eq!(
        r["child"], -9,
        "kill -1 inside did not reach the program's own child: {r}"
    );
    assert!(
        canary.try_wait().unwrap().is_none(),
        "a host process died during the run"
    );
    canary.kill().unwrap();
    canary.wait().unwrap();
}

#[test]
fn kill_minus_one_from_shell_ends_run_normally() {
    let v = sandbox().sh("sleep 30 & kill -9 -1; kill -9 1; echo still-here");
    assert_eq!(v["outcome"], "exited", "{v:#}");
    assert!(v["stdout"].as_str().unwrap().contains("still-here"), "{v:#}");
}
