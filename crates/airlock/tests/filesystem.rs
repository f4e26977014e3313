//! Filesystem guarantees of `airlock run`: what the sandbox sees of the host (nothing but the
//! read-only system directories and a synthesized /etc), masked /proc, minimal /dev, the
//! capped writable tmpfs, mount flags, `--file`, `--rootfs`, and that real programs
//! (python3 with TLS, gcc, node) still work inside.

mod common;

use common::{TestCommand, ok_stdout, setup};
use serde_json::Value;
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

/// `airlock run` with a deadline generous enough for a loaded CI machine.
fn sandbox() -> TestCommand {
    TestCommand::run().args(["--timeout", "60s"])
}

/// Runs python3 code in a sandbox and parses the JSON it prints on stdout.
fn python_json_with(cmd: TestCommand, code: &str) -> Value {
    let v = cmd.python(code);
    let out = ok_stdout(&v);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("program output is not JSON ({e}): {v:#}"))
}

fn python_json(code: &str) -> Value {
    python_json_with(sandbox(), code)
}

/// Python helper prepended to snippets: `err(e)` names an OSError's errno.
const PY_PRELUDE: &str = r#"
import errno, json, os, stat, sys
def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))
"#;

fn py(code: &str) -> String {
    format!("{PY_PRELUDE}\n{code}")
}

// --- what of the host is visible ---------------------------------------------------------

#[test]
fn host_directories_are_invisible() {
    let (dir, _) = setup("invisible");
    let own = dir.path().display().to_string();
    let mut paths: Vec<String> = [
        "/root",
        "/home",
        "/work",
        "/run",
        "/var",
        "/srv",
        "/mnt",
        "/opt",
        "/sys",
        "/media",
        "/boot",
        "/snap",
        "/lost+found",
        "/process_api",
        "/var/run/docker.sock",
        "/run/systemd",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    paths.push(own.clone());
    let code = py(&format!(
        "print(json.dumps({{p: os.path.lexists(p) for p in {:?}}}))",
        paths
    ));
    let r = python_json(&code);
    for p in &paths {
        assert_eq!(r[p], false, "{p} is visible inside the sandbox: {r}");
    }
    // The test's temp dir exists on the host: it is absence inside, not absence anywhere.
    assert!(Path::new(&own).exists());
}

#[test]
fn root_directory_holds_only_the_sandbox_layout() {
    let r = python_json(&py("print(json.dumps(sorted(os.listdir('/'))))"));
    let allowed: BTreeSet<&str> = [
        "bin",
        "sbin",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "usr",
        "etc",
        "tmp",
        "workspace",
        "dev",
        "proc",
    ]
    .into();
    for entry in r.as_array().unwrap() {
        let e = entry.as_str().unwrap();
        assert!(allowed.contains(e), "unexpected /{e} in the sandbox's root: {r}");
    }
    for needed in ["usr", "etc", "tmp", "workspace", "dev", "proc"] {
        assert!(
            r.as_array().unwrap().iter().any(|e| e == needed),
            "/{needed} missing: {r}"
        );
    }
}

#[test]
fn proc_1_is_airlock_init_not_host_init() {
    let host_init = std::fs::read("/proc/1/cmdline").unwrap();
    let r = python_json(&py(r#"
try:
    data = open('/proc/1/cmdline', 'rb').read()
    res = {'cmdline': data.decode('utf-8', 'replace')}
except OSError as e:
    res = {'error': err(e)}
print(json.dumps(res))
"#));
    if let Some(cmdline) = r["cmdline"].as_str() {
        assert_ne!(
            cmdline.as_bytes(),
            &host_init[..],
            "/proc/1 inside is the host's init"
        );
        assert!(
            cmdline.contains("airlock"),
            "/proc/1 inside is not airlock's init: {cmdline:?}"
        );
    } else {
        assert!(r["error"].is_string(), "{r}");
    }
}

#[test]
fn etc_holds_only_synthesized_files() {
    let r = python_json(&py(r#"
print(json.dumps({
    'entries': sorted(os.listdir('/etc')),
    'hostname': open('/etc/hostname').read() if os.path.exists('/etc/hostname') else None,
}))
"#));
    let allowed: BTreeSet<&str> = [
        "passwd",
        "group",
        "hostname",
        "hosts",
        "nsswitch.conf",
        "resolv.conf",
        "ld.so.cache",
        "ld.so.conf",
        "ld.so.conf.d",
        "protocols",
        "services",
        "mime.types",
        "localtime",
        "matplotlibrc",
        "ssl",
        "ca-certificates",
        "alternatives",
        "pki",
        "crypto-policies",
    ]
    .into();
    let entries: Vec<&str> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    for e in &entries {
        assert!(
            allowed.contains(e),
            "/etc/{e} inside the sandbox is not a synthesized file: {entries:?}"
        );
    }
    for secret in [
        "shadow",
        "gshadow",
        "sudoers",
        "sudoers.d",
        "ssh",
        "machine-id",
        "environment",
    ] {
        assert!(!entries.contains(&secret), "/etc/{secret} is visible inside");
    }
    let host_etc = std::fs::read_dir("/etc").unwrap().count();
    assert!(
        host_etc > entries.len(),
        "host /etc has {host_etc} entries, sandbox {}",
        entries.len()
    );
    let host_hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    if !host_hostname.trim().is_empty() && host_hostname.trim() != "airlock" {
        assert_ne!(
            r["hostname"], host_hostname,
            "the host's /etc/hostname is visible inside"
        );
    }
}

#[test]
fn etc_passwd_and_group_name_the_sandbox_user() {
    let out = ok_stdout(&sandbox().sh("cat /etc/passwd; echo ---; cat /etc/group"));
    let (passwd, group) = out.split_once("---").unwrap();
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with("sandbox:x:1000:1000:") && l.contains(":/workspace:")),
        "/etc/passwd: {passwd}"
    );
    assert!(
        group.lines().any(|l| l.starts_with("sandbox:x:1000:")),
        "/etc/group: {group}"
    );
    // Nothing of the host's accounts.
    let host = std::fs::read_to_string("/etc/passwd").unwrap();
    let sandbox_users: BTreeSet<&str> = passwd.lines().filter_map(|l| l.split(':').next()).collect();
    for line in host.lines() {
        let user = line.split(':').next().unwrap_or("");
        if !["root", "nobody", "sandbox", ""].contains(&user) {
            assert!(
                !sandbox_users.contains(user),
                "host account {user} is in the sandbox's /etc/passwd"
            );
        }
    }
}

#[test]
fn hostname_is_airlock() {
    let out = ok_stdout(
        &sandbox().python("import os, socket; print(socket.gethostname()); print(os.uname().nodename)"),
    );
    assert_eq!(out.lines().collect::<Vec<_>>(), ["airlock", "airlock"]);
}

// --- /proc -------------------------------------------------------------------------------

#[test]
fn proc_sensitive_files_read_empty_or_denied() {
    let r = python_json(&py(r#"
res = {}
for p in ('/proc/kcore', '/proc/keys', '/proc/timer_list', '/proc/sched_debug', '/proc/kallsyms',
          '/proc/vmallocinfo', '/proc/iomem', '/proc/slabinfo', '/proc/key-users'):
    try:
        with open(p, 'rb') as f:
            data = f.read(4096)
        res[p] = len(data)
    except OSError as e:
        res[p] = err(e)
print(json.dumps(res))
"#));
    for (path, res) in r.as_object().unwrap() {
        // Either an error (EACCES, EPERM, ENOENT) or nothing at all to read.
        assert!(
            res.is_string() || res == 0,
            "{path} reads {res} bytes inside the sandbox"
        );
    }
}

#[test]
fn proc_sysrq_trigger_is_not_writable() {
    // Never write to it: opening for writing either fails or yields the /dev/null mask.
    let r = python_json(&py(r#"
try:
    fd = os.open('/proc/sysrq-trigger', os.O_WRONLY)
    st = os.fstat(fd)
    res = {'opened': True, 'chr': stat.S_ISCHR(st.st_mode), 'rdev': [os.major(st.st_rdev), os.minor(st.st_rdev)]}
    os.close(fd)
except OSError as e:
    res = {'opened': False, 'error': err(e)}
print(json.dumps(res))
"#));
    if r["opened"] == true {
        assert_eq!(
            r["chr"], true,
            "/proc/sysrq-trigger opened for writing and is not masked: {r}"
        );
        assert_eq!(
            r["rdev"],
            serde_json::json!([1, 3]),
            "/proc/sysrq-trigger is not /dev/null: {r}"
        );
    }
}

#[test]
fn proc_sys_is_read_only() {
    // Each value is written back unchanged: harmless even if it were accepted.
    let r = python_json(&py(r#"
res = {}
for p in ('/proc/sys/vm/overcommit_ratio', '/proc/sys/kernel/core_pattern', '/proc/sys/net/ipv4/ip_forward',
          '/proc/sys/kernel/hostname'):
    try:
        value = open(p, 'rb').read()
    except OSError as e:
        res[p] = 'read:' + err(e)
        continue
    try:
        fd = os.open(p, os.O_WRONLY)
        try:
            os.write(fd, value)
            res[p] = 'written'
        finally:
            os.close(fd)
    except OSError as e:
        res[p] = err(e)
print(json.dumps(res))
"#));
    for (path, res) in r.as_object().unwrap() {
        assert!(
            res == "EROFS" || res == "EACCES" || res == "EPERM",
            "writing {path} inside: {res}"
        );
    }
}

// --- /dev --------------------------------------------------------------------------------

#[test]
fn dev_holds_exactly_the_minimal_set() {
    let r = python_json(&py(r#"
print(json.dumps({e: os.readlink('/dev/' + e) if os.path.islink('/dev/' + e) else
                  ('dir' if os.path.isdir('/dev/' + e) else
                   '%d:%d' % (os.major(os.lstat('/dev/' + e).st_rdev), os.minor(os.lstat('/dev/' + e).st_rdev)))
                  for e in os.listdir('/dev')}))
"#));
    // pts and ptmx: the sandbox's own devpts instance, for its terminals (issue 16); tty:
    // the host's /dev/tty node when the host has one, which opens only the opener's own
    // controlling terminal (see `only_the_sandboxs_own_terminals`).
    let mut expected = serde_json::json!({
        "null": "1:3", "zero": "1:5", "full": "1:7", "random": "1:8", "urandom": "1:9",
        "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
        "stderr": "/proc/self/fd/2", "shm": "dir", "pts": "dir", "ptmx": "pts/ptmx",
    });
    if std::path::Path::new("/dev/tty").exists() {
        expected["tty"] = "5:0".into();
    }
    // The conventional /dev/core link points at /proc/kcore, which is masked.
    if r.get("core").is_some() {
        expected["core"] = "/proc/kcore".into();
    }
    assert_eq!(r, expected, "/dev inside the sandbox");
}

#[test]
fn dev_nodes_behave() {
    let r = python_json(&py(r#"
res = {}
with open('/dev/null', 'wb') as f:
    res['null_write'] = f.write(b'x' * 100)
res['null_read'] = len(open('/dev/null', 'rb').read())
res['zero'] = open('/dev/zero', 'rb').read(8) == b'\0' * 8
res['urandom'] = len(open('/dev/urandom', 'rb').read(16))
res['random'] = len(open('/dev/random', 'rb').read(16))
try:
    fd = os.open('/dev/full', os.O_WRONLY)
    os.write(fd, b'x')
    res['full'] = 'written'
except OSError as e:
    res['full'] = err(e)
print(json.dumps(res))
"#));
    assert_eq!(
        r,
        serde_json::json!({"null_write": 100, "null_read": 0, "zero": true, "urandom": 16, "random": 16, "full": "ENOSPC"})
    );
}

/// No device of the host's but the minimal set: no console, no host terminal (the
/// sandbox's /dev/pts is a devpts instance of its own, holding only its ptmx until one of
/// its terminals is opened; /dev/tty opens only the opener's own controlling terminal,
/// which an exec has none of), no memory, kernel log, VM, socket or block devices.
#[test]
fn only_the_sandboxs_own_terminals() {
    let r = python_json(&py(r#"
res = {p: os.path.lexists(p) for p in
    ('/dev/console', '/dev/tty0', '/dev/tty1', '/dev/mem', '/dev/kmsg', '/dev/kvm',
     '/dev/vsock', '/dev/fuse', '/dev/net/tun', '/dev/sda', '/dev/vda')}
res['pts'] = sorted(os.listdir('/dev/pts'))
try:
    open('/dev/tty', 'rb')
    res['tty'] = 'opened'
except OSError as e:
    res['tty'] = err(e)
print(json.dumps(res))
"#));
    for (p, present) in r.as_object().unwrap() {
        match p.as_str() {
            "pts" => assert_eq!(
                present,
                &serde_json::json!(["ptmx"]),
                "the host's terminals are visible: {r}"
            ),
            "tty" => assert!(present == "ENXIO" || present == "ENOENT", "/dev/tty: {r}"),
            _ => assert_eq!(present, false, "{p} exists inside the sandbox"),
        }
    }
}

// --- writable space ----------------------------------------------------------------------

#[test]
fn cwd_and_home_are_workspace() {
    let r = python_json(&py(
        "print(json.dumps({'cwd': os.getcwd(), 'home': os.environ.get('HOME'), \
                             'expanded': os.path.expanduser('~')}))",
    ));
    assert_eq!(
        r,
        serde_json::json!({"cwd": "/workspace", "home": "/workspace", "expanded": "/workspace"})
    );
}

#[test]
fn tmp_workspace_and_shm_are_writable() {
    let r = python_json(&py(r#"
res = {}
for d in ('/tmp', '/workspace', '/dev/shm'):
    p = os.path.join(d, 'probe.txt')
    try:
        with open(p, 'w') as f:
            f.write('hello ' + d)
        res[d] = open(p).read()
        os.mkdir(os.path.join(d, 'subdir'))
        os.rename(p, os.path.join(d, 'subdir', 'moved.txt'))
    except OSError as e:
        res[d] = err(e)
print(json.dumps(res))
"#));
    assert_eq!(
        r,
        serde_json::json!({"/tmp": "hello /tmp", "/workspace": "hello /workspace", "/dev/shm": "hello /dev/shm"})
    );
}

#[test]
fn files_given_with_file_appear_with_content_and_modes() {
    let (dir, cmd) = setup("files");
    let script = dir.path().join("run.sh");
    std::fs::write(&script, "#!/bin/sh\necho script-ran \"$@\"\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("data.txt");
    std::fs::write(&data, "line one\nline two\n").unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cmd = cmd.args(["--timeout", "60s"]).args([
        "--file",
        &format!("{}:run.sh", script.display()),
        "--file",
        &format!("{}:nested/dir/data.txt", data.display()),
    ]);
    let r = python_json_with(
        cmd,
        &py(r#"
import subprocess
res = {}
for p in ('run.sh', 'nested/dir/data.txt'):
    st = os.stat(p)
    res[p] = {'content': open(p).read(), 'exec': bool(st.st_mode & 0o111), 'uid': st.st_uid,
              'abs': os.path.exists('/workspace/' + p)}
res['ran'] = subprocess.run(['./run.sh', 'arg'], capture_output=True, text=True).stdout
print(json.dumps(res))
"#),
    );
    assert_eq!(
        r["run.sh"]["content"], "#!/bin/sh\necho script-ran \"$@\"\n",
        "{r}"
    );
    assert_eq!(r["run.sh"]["exec"], true, "{r}");
    assert_eq!(r["run.sh"]["abs"], true, "{r}");
    assert_eq!(r["nested/dir/data.txt"]["content"], "line one\nline two\n", "{r}");
    assert_eq!(r["nested/dir/data.txt"]["exec"], false, "{r}");
    assert_eq!(r["nested/dir/data.txt"]["abs"], true, "{r}");
    assert_eq!(r["run.sh"]["uid"], 1000, "{r}");
    assert_eq!(r["ran"], "script-ran arg\n", "{r}");
}

/// Python that fills `dir` with 1 MiB files (each below the file-size rlimit) until a write
/// fails; prints the error and how many bytes made it.
fn fill_code(dir: &str, max_mib: u32) -> String {
    py(&format!(
        r#"
written, res = 0, 'none'
chunk = b'x' * 65536
try:
    for i in range({max_mib}):
        with open(os.path.join('{dir}', 'fill%d' % i), 'wb') as f:
            for _ in range(16):
                f.write(chunk)
                f.flush()
                written += len(chunk)
except OSError as e:
    res = err(e)
print(json.dumps({{'error': res, 'written': written}}))
"#
    ))
}

fn assert_disk_capped(dir: &str) {
    const DISK: u64 = 2 << 20;
    let r = python_json_with(sandbox().args(["--disk", "2M"]), &fill_code(dir, 8));
    assert_eq!(
        r["error"], "ENOSPC",
        "writing 8 MiB into {dir} with --disk 2M: {r}"
    );
    assert!(
        r["written"].as_u64().unwrap() <= DISK,
        "more than --disk was written to {dir}: {r}"
    );
}

#[test]
fn workspace_is_size_capped() {
    assert_disk_capped("/workspace");
}

#[test]
fn tmp_is_size_capped() {
    assert_disk_capped("/tmp");
}

#[test]
fn dev_shm_is_size_capped() {
    assert_disk_capped("/dev/shm");
}

#[test]
fn single_file_larger_than_disk_fails() {
    // One file: the file-size rlimit (EFBIG) or the full tmpfs (ENOSPC) stops it.
    let r = python_json_with(
        sandbox().args(["--disk", "2M"]),
        &py(r#"
written, res = 0, 'none'
chunk = b'x' * 65536
try:
    with open('/workspace/big', 'wb') as f:
        for _ in range(64):
            f.write(chunk)
            f.flush()
            written += len(chunk)
except OSError as e:
    res = err(e)
print(json.dumps({'error': res, 'written': written}))
"#),
    );
    assert!(r["error"] == "ENOSPC" || r["error"] == "EFBIG", "{r}");
    assert!(r["written"].as_u64().unwrap() <= 2 << 20, "{r}");
}

#[test]
fn workspace_is_inode_capped() {
    // Empty files take no blocks: only the inode cap stops them.
    let r = python_json_with(
        sandbox().args(["--disk", "1M"]),
        &py(r#"
n, res = 0, 'none'
try:
    for n in range(200000):
        os.close(os.open('/workspace/f%d' % n, os.O_CREAT | os.O_WRONLY, 0o644))
except OSError as e:
    res = err(e)
print(json.dumps({'error': res, 'created': n}))
"#),
    );
    assert_eq!(r["error"], "ENOSPC", "creating 200000 empty files: {r}");
}

// --- mount flags -------------------------------------------------------------------------

/// One line of /proc/self/mountinfo.
#[derive(Debug)]
struct MountEntry {
    point: String,
    options: BTreeSet<String>,
    fstype: String,
}

fn mounts_inside() -> Vec<MountEntry> {
    let out = ok_stdout(&sandbox().json(&["cat", "/proc/self/mountinfo"]));
    out.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let sep = fields
                .iter()
                .position(|f| *f == "-")
                .expect("mountinfo separator");
            MountEntry {
                point: fields[4].replace("\\040", " "),
                options: fields[5].split(',').map(str::to_owned).collect(),
                fstype: fields[sep + 1].to_owned(),
            }
        })
        .collect()
}

#[test]
fn mounts_are_nosuid_nodev_and_read_only_where_claimed() {
    let mounts = mounts_inside();
    let dump = || {
        mounts
            .iter()
            .map(|m| format!("{} {:?} {}", m.point, m.options, m.fstype))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let find = |p: &str| mounts.iter().rev().find(|m| m.point == p);
    let device_mount =
        |p: &str| p == "/dev" || p.starts_with("/dev/") && p != "/dev/shm" || p.starts_with("/proc/");

    for m in &mounts {
        assert!(
            m.options.contains("nosuid"),
            "{} is not nosuid\n{}",
            m.point,
            dump()
        );
        if !device_mount(&m.point) {
            assert!(
                m.options.contains("nodev"),
                "{} is not nodev\n{}",
                m.point,
                dump()
            );
        }
        // devpts: only the sandbox's own instance at /dev/pts (its terminals).
        assert!(
            m.fstype != "devpts" || m.point == "/dev/pts",
            "a devpts at {}\n{}",
            m.point,
            dump()
        );
        let bad = [
            "sysfs",
            "cgroup",
            "cgroup2",
            "debugfs",
            "securityfs",
            "bpf",
            "tracefs",
            "mqueue",
            "hugetlbfs",
        ];
        assert!(
            !bad.contains(&m.fstype.as_str()),
            "{} is a {} mount\n{}",
            m.point,
            m.fstype,
            dump()
        );
        for hidden in ["/sys", "/run", "/home", "/root", "/work", "/var", "/mnt", "/opt"] {
            assert!(
                m.point != hidden && !m.point.starts_with(&format!("{hidden}/")),
                "{} is mounted inside\n{}",
                m.point,
                dump()
            );
        }
    }

    let mut read_only = vec!["/", "/usr", "/proc/sys", "/dev"];
    read_only.extend(
        mounts
            .iter()
            .filter(|m| m.point.starts_with("/etc/"))
            .map(|m| m.point.as_str()),
    );
    read_only.extend(
        ["/bin", "/sbin", "/lib", "/lib64", "/proc/irq", "/proc/bus"]
            .into_iter()
            .filter(|p| find(p).is_some()),
    );
    for p in read_only {
        let m = find(p).unwrap_or_else(|| panic!("no mount at {p}\n{}", dump()));
        assert!(m.options.contains("ro"), "{p} is not read-only\n{}", dump());
    }
    for p in ["/tmp", "/workspace", "/dev/shm"] {
        let m = find(p).unwrap_or_else(|| panic!("no mount at {p}\n{}", dump()));
        assert!(m.options.contains("rw"), "{p} is not writable\n{}", dump());
        assert_eq!(m.fstype, "tmpfs", "{p}\n{}", dump());
    }
    let proc = find("/proc").unwrap_or_else(|| panic!("no /proc mount\n{}", dump()));
    assert_eq!(proc.fstype, "proc");
    assert!(proc.options.contains("noexec"), "/proc is not noexec\n{}", dump());
    let dev = find("/dev").unwrap();
    assert!(dev.options.contains("noexec"), "/dev is not noexec\n{}", dump());
}

#[test]
fn usr_is_read_only_even_for_renames_and_chmod() {
    let r = python_json(&py(r#"
res = {}
for name, fn in (('chmod', lambda: os.chmod('/usr/bin/python3', 0o777)),
                 ('rename', lambda: os.rename('/usr/bin/env', '/usr/bin/env2')),
                 ('unlink', lambda: os.unlink('/etc/passwd')),
                 ('symlink', lambda: os.symlink('/tmp', '/usr/airlock-link')),
                 ('utime', lambda: os.utime('/usr/bin/env'))):
    try:
        fn()
        res[name] = 'ok'
    except OSError as e:
        res[name] = err(e)
print(json.dumps(res))
"#));
    for (op, res) in r.as_object().unwrap() {
        assert!(
            res == "EROFS" || res == "EACCES" || res == "EPERM",
            "{op} on a system path inside: {res}"
        );
    }
    assert!(
        Path::new("/usr/bin/env").exists(),
        "the host's /usr/bin/env is gone"
    );
    assert!(!Path::new("/usr/airlock-link").exists());
}

// --- --rootfs ----------------------------------------------------------------------------

/// A rootfs holding only a statically linked probe at /usr/bin/probe (and /bin -> usr/bin).
fn tiny_rootfs(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("rootfs");
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/attacks/rootfs_probe.c");
    let status = Command::new("gcc")
        .args(["-static", "-O1", "-Wall", "-o"])
        .arg(root.join("usr/bin/probe"))
        .arg(&src)
        .status()
        .expect("run gcc");
    assert!(status.success(), "gcc -static failed for {}", src.display());
    root
}

#[test]
fn rootfs_replaces_host_system_directories() {
    let (dir, cmd) = setup("rootfs");
    let root = tiny_rootfs(dir.path());
    let v = cmd.args(["--timeout", "60s", "--rootfs"]).args([&root]).json(&[
        "/usr/bin/probe",
        "/usr/bin/probe",
        "/bin/probe",
        "/usr/bin/python3",
        "/usr/bin/sh",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64/ld-linux-x86-64.so.2",
        "/etc/passwd",
        "/workspace",
        "/tmp",
    ]);
    let out = ok_stdout(&v);
    let seen: std::collections::BTreeMap<&str, &str> =
        out.lines().filter_map(|l| l.split_once('=')).collect();
    assert_eq!(seen.get("/usr/bin/probe"), Some(&"yes"), "{out}");
    assert_eq!(seen.get("/bin/probe"), Some(&"yes"), "{out}");
    for host_only in [
        "/usr/bin/python3",
        "/usr/bin/sh",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64/ld-linux-x86-64.so.2",
    ] {
        assert_eq!(
            seen.get(host_only),
            Some(&"no"),
            "the host's {host_only} is visible with --rootfs: {out}"
        );
    }
    for sandbox_path in ["/etc/passwd", "/workspace", "/tmp"] {
        assert_eq!(
            seen.get(sandbox_path),
            Some(&"yes"),
            "{sandbox_path} missing with --rootfs: {out}"
        );
    }
    assert!(out.contains("probe done"), "{out}");
}

#[test]
fn rootfs_without_the_command_exits_127_with_a_clear_message() {
    let (dir, cmd) = setup("rootfs-missing");
    let root = tiny_rootfs(dir.path());
    let out = cmd
        .args(["--timeout", "60s", "--rootfs"])
        .args([&root])
        .args(["--", "python3", "-c", "print(1)"])
        .output();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // As in a shell: the sandbox ran, and the command was not found in it.
    assert_eq!(
        out.status.code(),
        Some(127),
        "status {:?}, stderr: {stderr}",
        out.status
    );
    assert!(
        stderr.contains("python3: command not found"),
        "the message does not name the command: {stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "not one clear line: {stderr}");
    assert!(
        out.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

// --- real programs work ------------------------------------------------------------------

#[test]
fn python_tls_default_context_has_certificates() {
    let r = python_json(
        "import json, ssl; c = ssl.create_default_context(); print(json.dumps(c.cert_store_stats()))",
    );
    assert!(
        r["x509_ca"].as_u64().unwrap() > 0,
        "no CA certificates loaded inside: {r}"
    );
}

#[test]
fn gcc_compiles_and_runs_hello_world_in_workspace() {
    let (dir, cmd) = setup("gcc");
    let src = dir.path().join("hello.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\nint main(void) { printf(\"hello from %d\\n\", 6 * 7); return 0; }\n",
    )
    .unwrap();
    let v = cmd
        .args(["--timeout", "120s", "--cpus", "1", "--memory", "512M", "--file"])
        .args([format!("{}:hello.c", src.display())])
        .json(&["sh", "-c", "gcc -O1 -o hello hello.c && ./hello"]);
    assert_eq!(ok_stdout(&v), "hello from 42\n", "{v:#}");
}

#[test]
fn node_runs() {
    let v = sandbox()
        .args(["--memory", "512M"])
        .json(&["node", "-e", "console.log(6 * 7)"]);
    assert_eq!(ok_stdout(&v), "42\n", "{v:#}");
}

#[test]
fn python_runs() {
    let v = sandbox().python("print(6 * 7)");
    assert_eq!(ok_stdout(&v), "42\n", "{v:#}");
}
