//! Sandbox cgroups under a parent, on this host's real cgroupfs (as root): an explicit
//! `--cgroup-parent` whose limit bounds the sandbox, and an ordinary user's delegated v1
//! (or v2) directories, found by `auto`.
//!
//! Everything happens in directories the test makes (`/airlock-test-*-<pid>` in each
//! hierarchy) and removes. The ordinary-user case re-runs this test binary as a child
//! (`child_entry`), which joins those directories as root, drops to an unused uid and
//! then does what `airlock run` does with cgroups.

use std::fs;
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use airlock_sandbox::cgroup::{CgroupError, CgroupHost, CgroupLimits, CgroupParent, ParentKind};

/// The child's instructions: `<uid>:<mode>:<dir>,<dir>...`.
const CHILD_ENV: &str = "AIRLOCK_TEST_CGROUP_CHILD";

const LIMITS: CgroupLimits = CgroupLimits {
    memory_bytes: 128 << 20,
    cpus: 0.5,
    pids: 16,
};

fn python() -> &'static str {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("python3 for the memory test")
}

/// A uid and gid no account uses, different per test process.
fn test_uid() -> u32 {
    0x3fff_0000 + (std::process::id() & 0xfff)
}

/// Removes the test's parent directories (deepest first: cgroupfs removes only empty
/// cgroups, and ignores their files), whatever a failed test left in them.
struct Dirs(Vec<PathBuf>);

impl Drop for Dirs {
    fn drop(&mut self) {
        fn rmdir_tree(dir: &Path) {
            if let Ok(entries) = fs::read_dir(dir) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        rmdir_tree(&entry.path());
                    }
                }
            }
            let _ = fs::remove_dir(dir);
        }
        for dir in &self.0 {
            rmdir_tree(dir);
        }
    }
}

fn read(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .trim()
        .to_owned()
}

fn stat_value(path: &Path, key: &str) -> Option<u64> {
    read(path).lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// `sh` that waits for one line on stdin, then runs `then`.
fn gated(then: &str, arg0: &str) -> Child {
    Command::new("sh")
        .args(["-c", &format!("read x; {then}"), arg0])
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn sh")
}

fn open_gate(child: &mut Child) {
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("gate");
}

/// (a) Root with `--cgroup-parent PATH`: the sandbox's cgroup lands under PATH in every
/// hierarchy, and the parent's memory limit, smaller than the sandbox's own, bounds it:
/// a program that asks for more is OOM-killed at the parent's limit.
#[test]
fn explicit_parent_bounds_the_sandbox() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let name = format!("/airlock-test-parent-{}", std::process::id());
    let host = CgroupHost::detect_with(&CgroupParent::Path(name.clone().into())).expect("detect");
    assert_eq!(host.parent_kind(), &ParentKind::Explicit);
    let parents = host.parent_dirs();
    let dirs = Dirs(parents.clone());
    for dir in &parents {
        assert!(dir.ends_with(&name[1..]), "{}", dir.display());
        fs::create_dir(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    }
    println!("cgroup parent: {}", host.describe_parent());

    // The parent allows 48 MiB; the sandbox asks for 128 MiB.
    const PARENT_LIMIT: u64 = 48 << 20;
    let memory_parent = parents
        .iter()
        .find(|d| d.join("memory.limit_in_bytes").exists() || d.join("memory.max").exists())
        .expect("a memory hierarchy")
        .clone();
    let v1 = memory_parent.join("memory.limit_in_bytes").exists();
    if v1 {
        fs::write(
            memory_parent.join("memory.limit_in_bytes"),
            PARENT_LIMIT.to_string(),
        )
        .unwrap();
        let memsw = memory_parent.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            fs::write(memsw, PARENT_LIMIT.to_string()).unwrap();
        }
    } else {
        fs::write(memory_parent.join("memory.max"), PARENT_LIMIT.to_string()).unwrap();
        let _ = fs::write(memory_parent.join("memory.swap.max"), "0");
    }

    let cg = host.create("test-parent-oom", &LIMITS).expect("create");
    let paths: Vec<PathBuf> = cg.paths().map(Path::to_owned).collect();
    assert_eq!(paths.len(), parents.len());
    for (path, parent) in paths.iter().zip(&parents) {
        assert!(
            path.starts_with(parent),
            "{} not under {}",
            path.display(),
            parent.display()
        );
        assert!(path.ends_with("test-parent-oom"));
    }
    let memory_dir = paths.iter().find(|p| p.starts_with(&memory_parent)).unwrap();
    let limit_file = if v1 { "memory.limit_in_bytes" } else { "memory.max" };
    assert_eq!(read(&memory_dir.join(limit_file)), (128u64 << 20).to_string());

    let mut child = gated(
        r#"exec "$0" -c 'x = bytearray(100 * 1024 * 1024); print(len(x))'"#,
        python(),
    );
    cg.attach(i32::try_from(child.id()).unwrap(), false)
        .expect("attach");
    open_gate(&mut child);
    let status = child.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    let usage = cg.usage();
    println!("sandbox usage: {usage:?}");
    assert!(usage.memory_peak_bytes <= PARENT_LIMIT, "{usage:?}");
    if v1 {
        // v1: the limit hit is the parent's: its peak reaches its limit and the OOM
        // killer picks the sandbox's program. The kill is counted in the victim's own
        // memory.oom_control (v1 does not pass memory events up to parents), which is
        // what the sandbox's usage reports; the parent's oom_kill stays 0. Failure
        // counters: the parent's memory.failcnt climbs when only memory is capped; with
        // memory+swap capped too (as here, so the program cannot escape into swap), the
        // memsw counter is charged first and fails first, and this kernel counts no
        // failures for it: both read 0.
        let peak = |dir: &Path| -> u64 { read(&dir.join("memory.max_usage_in_bytes")).parse().unwrap() };
        let failcnt = |dir: &Path| -> Vec<String> {
            ["memory.failcnt", "memory.memsw.failcnt"]
                .iter()
                .map(|f| dir.join(f))
                .filter(|f| f.exists())
                .map(|f| read(&f))
                .collect()
        };
        let parent_kills = stat_value(&memory_parent.join("memory.oom_control"), "oom_kill");
        let sandbox_kills = stat_value(&memory_dir.join("memory.oom_control"), "oom_kill");
        println!(
            "v1 OOM at the parent's limit: parent peak {} of {PARENT_LIMIT}, failcnt {:?}, oom_kill {parent_kills:?}; \
             sandbox peak {}, failcnt {:?}, oom_kill {sandbox_kills:?}",
            peak(&memory_parent),
            failcnt(&memory_parent),
            peak(memory_dir),
            failcnt(memory_dir)
        );
        assert!(peak(&memory_parent) > PARENT_LIMIT / 4 * 3 && peak(&memory_parent) <= PARENT_LIMIT);
        assert!(sandbox_kills >= Some(1));
        assert!(usage.oom_kills >= 1, "{usage:?}");
    } else {
        // v2: the parent's memory.events counts the OOM (`oom`) and, propagated, the kill.
        let events = memory_parent.join("memory.events");
        println!("v2 parent memory.events: {}", read(&events).replace('\n', ", "));
        assert!(stat_value(&events, "oom").unwrap_or(0) >= 1);
        assert!(usage.oom_kills >= 1, "{usage:?}");
    }
    cg.destroy().expect("destroy");
    for path in &paths {
        assert!(!path.exists(), "{} left behind", path.display());
    }
    // The parent is the operator's: left in place (the guard removes the test's).
    assert!(memory_parent.is_dir());
    drop(dirs);
    assert!(!memory_parent.exists());
}

/// (b) `auto` for an ordinary user whose cgroups root delegated (v1: directories made
/// and chowned to it by root; the process moved into them): a child drops to an unused
/// uid there and creates, uses and removes a sandbox cgroup, and the same child outside
/// them is refused with `NotDelegated`.
#[test]
fn auto_uses_an_ordinary_users_delegated_cgroups() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let uid = test_uid();
    let name = format!("/airlock-test-rootless-{}", std::process::id());
    // The directories root hands the user: one in every hierarchy airlock uses here.
    let host = CgroupHost::detect_with(&CgroupParent::Path(name.clone().into())).expect("detect");
    let parents = host.parent_dirs();
    let dirs = Dirs(parents.clone());
    for dir in &parents {
        fs::create_dir(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        chown_tree(dir, uid);
    }
    let joined: Vec<String> = parents.iter().map(|d| d.display().to_string()).collect();

    let run_child = |mode: &str| {
        let out = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{uid}:{mode}:{}", joined.join(",")))
            .output()
            .expect("run child");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("--- child ({mode}) ---\n{text}");
        assert!(out.status.success(), "child ({mode}) failed: {:?}", out.status);
        assert!(text.contains("1 passed"), "the child test did not run");
    };
    run_child("delegated");
    run_child("not-delegated");
    // v1 needs no move of the user's processes: `--cgroup-parent` naming the chowned
    // directories is enough (a v1 move checks only the mover's euid and the target's
    // cgroup.procs; cgroup2, which checks the source too, is then left out).
    if !host.is_v2() {
        run_child("explicit");
    }
    // The child removed its sandbox: only the parents (and `airlock/`) are left.
    for dir in &parents {
        let left: Vec<PathBuf> = fs::read_dir(dir.join("airlock"))
            .map(|e| e.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
    drop(dirs);
}

/// `chown -R uid:uid dir` (a fresh cgroup: its interface files).
fn chown_tree(dir: &Path, uid: u32) {
    std::os::unix::fs::chown(dir, Some(uid), Some(uid)).expect("chown");
    for entry in fs::read_dir(dir).unwrap().flatten() {
        if entry.file_type().unwrap().is_file() {
            std::os::unix::fs::chown(entry.path(), Some(uid), Some(uid)).expect("chown");
        }
    }
}

/// The child of `auto_uses_an_ordinary_users_delegated_cgroups` (a no-op otherwise).
#[test]
fn child_entry() {
    let Some(spec) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let spec = spec.into_string().expect("utf-8");
    let mut fields = spec.splitn(3, ':');
    let uid: u32 = fields.next().unwrap().parse().unwrap();
    let mode = fields.next().unwrap().to_owned();
    let dirs: Vec<PathBuf> = fields.next().unwrap().split(',').map(PathBuf::from).collect();

    if mode == "delegated" {
        // As root: join the delegated cgroups, as a login session placed there would.
        for dir in &dirs {
            fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
                .unwrap_or_else(|e| panic!("join {}: {e}", dir.display()));
        }
    }
    let id = nix::unistd::Uid::from_raw(uid);
    let gid = nix::unistd::Gid::from_raw(uid);
    nix::unistd::setgroups(&[]).expect("setgroups");
    nix::unistd::setresgid(gid, gid, gid).expect("setresgid");
    nix::unistd::setresuid(id, id, id).expect("setresuid");
    assert_eq!(nix::unistd::geteuid().as_raw(), uid);

    let parent = match mode.as_str() {
        "explicit" => {
            let base = dirs[0].file_name().unwrap().to_str().unwrap();
            CgroupParent::Path(format!("/{base}").into())
        }
        _ => CgroupParent::Auto,
    };
    let detected = CgroupHost::detect_with(&parent);
    if mode == "not-delegated" {
        let err = detected.expect_err("an ordinary user without a delegated cgroup is refused");
        println!("refused: {err}");
        assert!(
            matches!(err, CgroupError::NotDelegated { uid: u, .. } if u == uid),
            "{err:?}"
        );
        return;
    }
    let host = detected.expect("detect as the user");
    println!("cgroups: {}", host.describe());
    println!("cgroup parent: {}", host.describe_parent());
    if mode == "explicit" {
        assert_eq!(host.parent_kind(), &ParentKind::Explicit);
        // cgroup2 cannot be used: this process's own cgroup there is outside the parent.
        let line = host.describe_parent();
        assert!(
            line.contains("not delegated, so not used: ") && line.contains("cgroup2 ("),
            "{line}"
        );
    } else {
        assert!(
            matches!(host.parent_kind(), ParentKind::Delegated(why) if why.contains(&format!("uid {uid}"))),
            "{:?}",
            host.parent_kind()
        );
    }
    host.purge_stale();
    let cg = host.create("test-rootless", &LIMITS).expect("create as the user");
    let paths: Vec<PathBuf> = cg.paths().map(Path::to_owned).collect();
    for path in &paths {
        assert!(
            dirs.iter().any(|d| path.starts_with(d)),
            "{} is not in a delegated directory",
            path.display()
        );
        // New cgroups (and their files) belong to their creator.
        let meta = fs::metadata(path).unwrap();
        assert_eq!(
            std::os::unix::fs::MetadataExt::uid(&meta),
            uid,
            "{}",
            path.display()
        );
    }
    let memory = paths
        .iter()
        .find(|p| p.join("memory.limit_in_bytes").exists() || p.join("memory.max").exists())
        .expect("memory dir");
    let limit = ["memory.limit_in_bytes", "memory.max"]
        .iter()
        .map(|f| memory.join(f))
        .find(|f| f.exists())
        .unwrap();
    assert_eq!(read(&limit), (128u64 << 20).to_string());

    // A process of the user moves in (v1 needs the mover's euid to match the process's).
    let mut sleeper = gated("exec sleep 30", "sh");
    let pid = i32::try_from(sleeper.id()).unwrap();
    cg.attach(pid, false).expect("attach as the user");
    for path in &paths {
        let procs = read(&path.join("cgroup.procs"));
        assert!(
            procs.lines().any(|l| l == pid.to_string()),
            "{pid} not in {}",
            path.display()
        );
    }
    open_gate(&mut sleeper);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep") {
        assert!(Instant::now() < deadline, "sleep did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(cg.usage().memory_peak_bytes > 0);
    cg.kill().expect("kill as the user");
    assert_eq!(sleeper.wait().expect("wait").signal(), Some(libc::SIGKILL));
    cg.destroy().expect("destroy as the user");
    for path in &paths {
        assert!(!path.exists(), "{} left behind", path.display());
    }
}
