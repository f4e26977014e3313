//! The filter on a real kernel: real programs run under it, and the refused syscalls are refused
//! with the errno the policy promises.
//!
//! Each test spawns a child that sets `PR_SET_NO_NEW_PRIVS` and applies the filter between
//! fork and exec (`pre_exec`), so only that child and its descendants are filtered, never the
//! test process. Every probe of a refused syscall is chosen to be harmless if the filter let
//! it through: it then fails with some other errno (bad pointer, missing path, invalid magic),
//! or acts only on a throwaway child process, and the assertion reports the escape.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use airlock_seccomp::{apply, build};

const PYTHON: &str = "/usr/bin/python3";

/// A command whose process runs under the filter (stdin is /dev/null).
fn filtered(program: &str) -> Command {
    let filter = build().expect("the policy compiles");
    let mut command = Command::new(program);
    command.stdin(Stdio::null());
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // work is allowed. It makes two syscalls (prctl, then seccomp through `apply`, which does
    // not allocate or lock) and reads `filter`, built before the fork and only borrowed here;
    // on failure it returns an `io::Error` made from an errno, which does not allocate either.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            apply(&filter)
        });
    }
    command
}

fn run(command: &mut Command) -> Output {
    let output = command.output().expect("spawn under the filter");
    assert!(
        output.status.success(),
        "{command:?} failed under the filter: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "airlock-seccomp-{tag}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn true_runs() {
    run(&mut filtered("/bin/true"));
}

#[test]
fn filter_is_installed_and_no_new_privs_set() {
    let output = run(filtered("/bin/sh").args(["-c", "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status"]));
    let status = stdout(&output);
    assert!(status.contains("Seccomp:\t2"), "{status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
}

/// What the probe script expects of one syscall.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// Returns >= 0.
    Ok,
    /// Returns -1 with this errno.
    Errno(i32),
}

/// One probe per line: a name, then Python expressions for the syscall number and arguments
/// (in scope: `p` for a NUL-terminated path to nowhere, `null`, `buf`, `pipe_r`).
fn probes() -> Vec<(&'static str, String, Expect)> {
    use Expect::*;
    let eperm = Errno(libc::EPERM);
    let nowhere = "p";
    let mut probes: Vec<(&'static str, String, Expect)> = vec![
        ("getpid", format!("{}", libc::SYS_getpid), Ok),
        // New namespaces: in this throwaway Python process, or a throwaway clone of it.
        (
            "unshare_newuser",
            format!("{}, {}", libc::SYS_unshare, libc::CLONE_NEWUSER),
            eperm,
        ),
        (
            "unshare_newns",
            format!("{}, {}", libc::SYS_unshare, libc::CLONE_NEWNS),
            eperm,
        ),
        (
            "unshare_newnet",
            format!("{}, {}", libc::SYS_unshare, libc::CLONE_NEWNET),
            eperm,
        ),
        ("setns", format!("{}, -1, 0", libc::SYS_setns), eperm),
        // Mounts: onto paths that do not exist.
        (
            "mount",
            format!("{}, b'none', {nowhere}, b'tmpfs', 0, null", libc::SYS_mount),
            eperm,
        ),
        ("umount2", format!("{}, {nowhere}, 0", libc::SYS_umount2), eperm),
        (
            "pivot_root",
            format!("{}, {nowhere}, {nowhere}", libc::SYS_pivot_root),
            eperm,
        ),
        ("chroot", format!("{}, {nowhere}", libc::SYS_chroot), eperm),
        (
            "fsopen",
            format!("{}, b'airlock-no-such-fs', 0", libc::SYS_fsopen),
            eperm,
        ),
        (
            "open_tree",
            format!("{}, -1, {nowhere}, 0", libc::SYS_open_tree),
            eperm,
        ),
        // Other processes: a pid that does not exist.
        (
            "ptrace_attach",
            format!("{}, {}, 0x3ffffff0, 0, 0", libc::SYS_ptrace, libc::PTRACE_ATTACH),
            eperm,
        ),
        (
            "process_vm_readv",
            format!("{}, os.getpid(), null, 0, null, 0, 0", libc::SYS_process_vm_readv),
            eperm,
        ),
        (
            "kcmp",
            format!("{}, os.getpid(), os.getpid(), 0, 0, 0", libc::SYS_kcmp),
            eperm,
        ),
        (
            "pidfd_getfd",
            format!("{}, -1, -1, 0", libc::SYS_pidfd_getfd),
            eperm,
        ),
        // Kernel attack surface, with arguments the kernel would reject.
        ("keyctl", format!("{}, 0, -3, 0", libc::SYS_keyctl), eperm),
        ("bpf", format!("{}, 0, null, 0", libc::SYS_bpf), eperm),
        (
            "perf_event_open",
            format!("{}, null, 0, -1, -1, 0", libc::SYS_perf_event_open),
            eperm,
        ),
        ("userfaultfd", format!("{}, 0", libc::SYS_userfaultfd), eperm),
        (
            "io_uring_setup",
            format!("{}, 1, null", libc::SYS_io_uring_setup),
            eperm,
        ),
        (
            "init_module",
            format!("{}, null, 0, b''", libc::SYS_init_module),
            eperm,
        ),
        (
            "finit_module",
            format!("{}, -1, b'', 0", libc::SYS_finit_module),
            eperm,
        ),
        (
            "open_by_handle_at",
            format!("{}, -1, null, 0", libc::SYS_open_by_handle_at),
            eperm,
        ),
        (
            "name_to_handle_at",
            format!("{}, -1, {nowhere}, null, null, 0", libc::SYS_name_to_handle_at),
            eperm,
        ),
        (
            "fanotify_init",
            format!("{}, 0, 0", libc::SYS_fanotify_init),
            eperm,
        ),
        (
            "process_madvise",
            format!("{}, -1, null, 0, 0, 0", libc::SYS_process_madvise),
            eperm,
        ),
        // The machine: reboot with an invalid magic; a clock id that does not exist; a
        // size-of-buffer query; accounting to a path that does not exist.
        ("reboot", format!("{}, 0, 0, 0, null", libc::SYS_reboot), eperm),
        (
            "clock_settime",
            format!("{}, -1, null", libc::SYS_clock_settime),
            eperm,
        ),
        (
            "settimeofday",
            format!("{}, null, null", libc::SYS_settimeofday),
            eperm,
        ),
        ("syslog", format!("{}, 10, null, 0", libc::SYS_syslog), eperm),
        ("acct", format!("{}, {nowhere}", libc::SYS_acct), eperm),
        ("swapon", format!("{}, {nowhere}, 0", libc::SYS_swapon), eperm),
        (
            "set_mempolicy",
            format!("{}, 0, null, 0", libc::SYS_set_mempolicy),
            eperm,
        ),
        // Terminal injection: stdin is /dev/null, so an escape would only get ENOTTY.
        (
            "ioctl_tiocsti",
            format!("{}, 0, 0x5412, null", libc::SYS_ioctl),
            eperm,
        ),
        (
            "ioctl_tiocsti_high_bits",
            format!("{}, 0, 0x100005412, null", libc::SYS_ioctl),
            eperm,
        ),
        (
            "ioctl_tioclinux",
            format!("{}, 0, 0x541C, null", libc::SYS_ioctl),
            eperm,
        ),
        (
            "ioctl_fionread",
            format!("{}, pipe_r, {}, buf", libc::SYS_ioctl, libc::FIONREAD),
            Ok,
        ),
        // Socket families.
        (
            "socket_netlink",
            format!(
                "{}, {}, {}, 0",
                libc::SYS_socket,
                libc::AF_NETLINK,
                libc::SOCK_RAW
            ),
            Errno(libc::EAFNOSUPPORT),
        ),
        (
            "socket_vsock",
            format!(
                "{}, {}, {}, 0",
                libc::SYS_socket,
                libc::AF_VSOCK,
                libc::SOCK_STREAM
            ),
            Errno(libc::EAFNOSUPPORT),
        ),
        (
            "socket_packet",
            format!("{}, {}, {}, 0", libc::SYS_socket, libc::AF_PACKET, libc::SOCK_RAW),
            Errno(libc::EAFNOSUPPORT),
        ),
        (
            "socket_alg",
            format!(
                "{}, {}, {}, 0",
                libc::SYS_socket,
                libc::AF_ALG,
                libc::SOCK_SEQPACKET
            ),
            Errno(libc::EAFNOSUPPORT),
        ),
        (
            "socket_unix",
            format!(
                "{}, {}, {}, 0",
                libc::SYS_socket,
                libc::AF_UNIX,
                libc::SOCK_STREAM
            ),
            Ok,
        ),
        (
            "socket_inet",
            format!(
                "{}, {}, {}, 0",
                libc::SYS_socket,
                libc::AF_INET,
                libc::SOCK_STREAM
            ),
            Ok,
        ),
        (
            "socketpair_unix",
            format!(
                "{}, {}, {}, 0, buf",
                libc::SYS_socketpair,
                libc::AF_UNIX,
                libc::SOCK_STREAM
            ),
            Ok,
        ),
        (
            "socketpair_inet",
            format!(
                "{}, {}, {}, 0, buf",
                libc::SYS_socketpair,
                libc::AF_INET,
                libc::SOCK_STREAM
            ),
            Errno(libc::EAFNOSUPPORT),
        ),
        // clone3 says "not implemented" so libc falls back to clone.
        (
            "clone3",
            format!("{}, null, 0", libc::SYS_clone3),
            Errno(libc::ENOSYS),
        ),
        // personality: query and PER_LINUX only; ADDR_NO_RANDOMIZE is refused.
        (
            "personality_query",
            format!("{}, 0xffffffff", libc::SYS_personality),
            Ok,
        ),
        ("personality_linux", format!("{}, 0", libc::SYS_personality), Ok),
        (
            "personality_no_aslr",
            format!("{}, 0x0040000", libc::SYS_personality),
            eperm,
        ),
        (
            "pidfd_open",
            format!("{}, os.getpid(), 0", libc::SYS_pidfd_open),
            Ok,
        ),
    ];
    // IPv6 may be compiled out or disabled on the host; expect what the host says without the
    // filter.
    // SAFETY: socket() with constant arguments reads no memory of ours; we close the descriptor
    // it returns, which nothing else owns.
    let inet6 = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_STREAM, 0) };
    if inet6 >= 0 {
        // SAFETY: `inet6` is a descriptor we just opened and own.
        unsafe { libc::close(inet6) };
        probes.push((
            "socket_inet6",
            format!(
                "{}, {}, {}, 0",
                libc::SYS_socket,
                libc::AF_INET6,
                libc::SOCK_STREAM
            ),
            Ok,
        ));
    }
    #[cfg(target_arch = "x86_64")]
    probes.push((
        // getpid through the x32 ABI. Without the filter this is ENOSYS on kernels built
        // without CONFIG_X86_X32_ABI, or the pid on kernels with it.
        "x32_getpid",
        format!("{}", libc::SYS_getpid | 0x4000_0000),
        eperm,
    ));
    #[cfg(target_arch = "x86_64")]
    probes.push(("iopl", format!("{}, 3", libc::SYS_iopl), eperm));
    probes
}

#[test]
fn refused_syscalls_get_the_promised_errno() {
    let probes = probes();
    let mut script = String::from(
        r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
p = b"/nonexistent/airlock-seccomp-probe"
null = None
buf = ctypes.create_string_buffer(64)
pipe_r, pipe_w = os.pipe()
def sc(name, nr, *args):
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *args)
    e = ctypes.get_errno()
    print(name, r, e, flush=True)
"#,
    );
    // The unshare probes go last: should one get through, the process would be in a new user
    // namespace, and every later probe would see that namespace's errors instead of the host's.
    let (unshares, others): (Vec<_>, Vec<_>) = probes
        .iter()
        .partition(|(name, _, _)| name.starts_with("unshare"));
    for (name, call, _) in others {
        script.push_str(&format!("sc({name:?}, {call})\n"));
    }
    // A clone that asks for a new user namespace. Should it get through, the child is a copy
    // of this process that leaves at once.
    script.push_str(&format!(
        r#"
for name, flag in (("clone_newuser", {newuser}), ("clone_newpid", {newpid}), ("clone_newns", {newns})):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long({clone}), ctypes.c_long(flag | {sigchld}), None, None, None, None)
    if r == 0:
        os._exit(0)
    e = ctypes.get_errno()
    if r > 0:
        os.waitpid(r, 0)
    print(name, r, e, flush=True)
"#,
        newuser = libc::CLONE_NEWUSER,
        newpid = libc::CLONE_NEWPID,
        newns = libc::CLONE_NEWNS,
        clone = libc::SYS_clone,
        sigchld = libc::SIGCHLD,
    ));
    for (name, call, _) in unshares {
        script.push_str(&format!("sc({name:?}, {call})\n"));
    }

    let output = run(filtered(PYTHON).args(["-c", &script]));
    let results: BTreeMap<String, (i64, i32)> = stdout(&output)
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields.len(), 3, "odd line {line:?}");
            (
                fields[0].to_owned(),
                (fields[1].parse().unwrap(), fields[2].parse().unwrap()),
            )
        })
        .collect();

    let mut expected: Vec<(&str, Expect)> = probes.iter().map(|(n, _, e)| (*n, *e)).collect();
    for name in ["clone_newuser", "clone_newpid", "clone_newns"] {
        expected.push((name, Expect::Errno(libc::EPERM)));
    }
    let mut failures = Vec::new();
    for (name, expect) in expected {
        let Some(&(ret, errno)) = results.get(name) else {
            failures.push(format!("{name}: no result"));
            continue;
        };
        let good = match expect {
            Expect::Ok => ret >= 0,
            Expect::Errno(e) => ret == -1 && errno == e,
        };
        if !good {
            failures.push(format!(
                "{name}: expected {expect:?}, got ret={ret} errno={errno} ({})",
                std::io::Error::from_raw_os_error(errno)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn python_runtime_works() {
    let script = r#"
import threading, multiprocessing, subprocess, socket, ssl, json, ctypes, os, tempfile

ran = []
t = threading.Thread(target=lambda: ran.append(1))
t.start(); t.join()
assert ran == [1], ran

out = subprocess.run(["/bin/echo", "hi"], capture_output=True, check=True).stdout
assert out == b"hi\n", out

with multiprocessing.Pool(2) as pool:
    assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]

a, b = socket.socketpair()
a.sendall(b"x"); assert b.recv(1) == b"x"
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", 0)); s.listen(1); s.close()

ssl.create_default_context()
assert json.loads(json.dumps({"a": [1, 2]})) == {"a": [1, 2]}
assert ctypes.CDLL(None).getpid() == os.getpid()

with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "f")
    with open(p, "w") as f: f.write("data")
    os.rename(p, p + "2"); os.chmod(p + "2", 0o600); os.symlink(p + "2", p)
    assert open(p).read() == "data"
print("ok")
"#;
    let output = run(filtered(PYTHON).args(["-c", script]));
    assert_eq!(stdout(&output), "ok");
}

#[test]
fn pip_runs() {
    let output = run(filtered(PYTHON).args(["-m", "pip", "--version"]));
    assert!(stdout(&output).starts_with("pip "), "{}", stdout(&output));
}

#[test]
fn node_runs() {
    let output = run(filtered("node").args(["-e", "console.log(1+1)"]));
    assert_eq!(stdout(&output), "2");
}

#[test]
fn bash_and_coreutils_run() {
    let output = run(filtered("bash").args([
        "-c",
        "echo $((6*7)) | cat; ls / >/dev/null; date >/dev/null; \
         printf 'b\\na\\n' | sort | head -n1; d=$(mktemp -d); cp /etc/hostname $d/x; \
         mv $d/x $d/y; chmod 600 $d/y; rm -r $d; sleep 0.01",
    ]));
    assert_eq!(stdout(&output), "42\na");
}

#[test]
fn gcc_and_make_build_and_run_hello_world() {
    let dir = TempDir::new("gcc");
    std::fs::write(
        dir.path().join("hello.c"),
        "#include <stdio.h>\n#include <pthread.h>\n\
         static void *f(void *a) { return a; }\n\
         int main(void) { pthread_t t; pthread_create(&t, 0, f, 0); pthread_join(t, 0);\n\
         puts(\"hello\"); return 0; }\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("Makefile"),
        "hello: hello.c\n\tgcc -O1 -pthread -o $@ $<\n",
    )
    .unwrap();
    let output = run(filtered("bash").current_dir(dir.path()).args([
        "-c",
        "make -s && ./hello && gcc -o hello2 hello.c -pthread && ./hello2",
    ]));
    assert_eq!(stdout(&output), "hello\nhello");
}
