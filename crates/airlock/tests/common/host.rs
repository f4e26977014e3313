//! Host-state helpers for the suites that check what a run leaves on the machine (cli,
//! limits, lifecycle, leak): one test at a time, `airlock` invocations with their pid,
//! the airlock cgroup directories, the host's process table, and the "nothing left
//! behind" check.

use super::{airlock_bin, sandbox_process_pid, sandbox_processes};
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// One test at a time.
// ---------------------------------------------------------------------------------------

static SERIAL: Mutex<()> = Mutex::new(());

/// One test at a time (within one test binary): the checks look at host-wide state, and
/// CPU measurements must not overlap. A test that panicked does not poison the others.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls `f` every 20 ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------
// airlock invocations.
// ---------------------------------------------------------------------------------------

/// One finished `airlock` invocation.
#[derive(Debug)]
pub struct Run {
    /// Host pid of the airlock process (names its cgroup owner directory).
    pub pid: u32,
    pub out: Output,
    pub elapsed: Duration,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    pub fn code(&self) -> Option<i32> {
        self.out.status.code()
    }

    /// Parses stdout as the `--json` result; panics unless airlock exited 0.
    pub fn json(&self) -> Value {
        assert_eq!(
            self.code(),
            Some(0),
            "airlock failed: {self:#?}\nstderr: {}",
            self.stderr()
        );
        serde_json::from_slice(&self.out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout()))
    }
}

/// `airlock ARGS...` (any subcommand) with empty stdin, output captured.
pub fn airlock(args: &[&str]) -> Run {
    let start = Instant::now();
    let child = Command::new(airlock_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn airlock");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait airlock");
    Run {
        pid,
        out,
        elapsed: start.elapsed(),
    }
}

/// `airlock run ARGS...` with empty stdin, output captured.
pub fn airlock_run(args: &[&str]) -> Run {
    let mut full = vec!["run"];
    full.extend_from_slice(args);
    airlock(&full)
}

// ---------------------------------------------------------------------------------------
// Cgroups.
// ---------------------------------------------------------------------------------------

/// Every `airlock` directory of a cgroup hierarchy here: v1 controllers, the unified
/// hierarchy of a hybrid host, or the root of a pure v2 host.
pub fn airlock_cgroup_bases() -> Vec<PathBuf> {
    let mut bases = vec![PathBuf::from("/sys/fs/cgroup/airlock")];
    if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
        bases.extend(entries.flatten().map(|e| e.path().join("airlock")));
    }
    bases.into_iter().filter(|p| p.is_dir()).collect()
}

/// The directories directly below `dir` (none if it cannot be read).
pub fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect()
}

/// The cgroup owner directories (`airlock/<pid>-<start time>`) of airlock process `pid`
/// in every hierarchy (v1 controllers, the unified hierarchy, or a v2 root).
pub fn owner_cgroups(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("{pid}-");
    airlock_cgroup_bases()
        .iter()
        .flat_map(|b| subdirs(b))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect()
}

/// [`owner_cgroups`] of `pid` once it has exited: a directory of a process that runs now
/// under the same pid (another airlock that reused it) is not its.
pub fn left_cgroups(pid: u32) -> Vec<PathBuf> {
    let live = start_time(pid).map(|s| format!("{pid}-{s}"));
    owner_cgroups(pid)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| live.as_deref() != Some(&*n.to_string_lossy()))
        })
        .collect()
}

/// When process `pid` started (clock ticks after boot, `/proc/<pid>/stat` field 22): with
/// the pid, what names an airlock's cgroups (`airlock/<pid>-<start>`).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The airlock owners (`<pid>-<start>`) whose cgroups process `pid` is in.
pub fn cgroup_owners(pid: u32) -> BTreeSet<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let path = l.splitn(3, ':').nth(2)?;
            let rest = path.split("/airlock/").nth(1)?;
            Some(rest.split('/').next()?.to_owned())
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Host processes.
// ---------------------------------------------------------------------------------------

/// What `/proc/<pid>/status` says about one host process.
#[derive(Debug, Clone)]
pub struct ProcInfo {
    pub name: String,
    pub ppid: u32,
    pub uid: u32,
    pub state: char,
}

impl std::fmt::Display for ProcInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (ppid {}, uid {}, state {})",
            self.name, self.ppid, self.uid, self.state
        )
    }
}

/// Every host process, by pid.
pub fn proc_infos() -> HashMap<u32, ProcInfo> {
    let mut infos = HashMap::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        let first = |v: String| v.split_whitespace().next().unwrap_or("").to_owned();
        infos.insert(
            pid,
            ProcInfo {
                name: field("Name:"),
                ppid: first(field("PPid:")).parse().unwrap_or(0),
                uid: first(field("Uid:")).parse().unwrap_or(0),
                state: field("State:").chars().next().unwrap_or('?'),
            },
        );
    }
    infos
}

/// Processes with a sandbox uid (`common::sandbox_processes`) that no running airlock
/// supervises: alive (a zombie holds nothing but its pid, and this host's PID 1 reaps
/// re-parented ones only after a second or two), and whose nearest ancestor outside the
/// sandbox uid range is not an `airlock` process. Sandboxes of airlock runs still going
/// on elsewhere on the machine (other suites) are not strays; a leftover of a finished
/// run is: its airlock is gone, so it hangs below the host's PID 1 (or a subreaper).
pub fn stray_sandbox_processes() -> Vec<String> {
    let infos = proc_infos();
    let base = airlock_sandbox::HOST_UID_BASE;
    let mut strays = Vec::new();
    for entry in sandbox_processes() {
        let Some(pid) = sandbox_process_pid(&entry) else {
            continue;
        };
        let Some(info) = infos.get(&pid) else { continue };
        if info.state == 'Z' {
            continue;
        }
        let mut chain = vec![format!("{pid} {} uid {}", info.name, info.uid)];
        let mut parent = info.ppid;
        let supervised = loop {
            match infos.get(&parent) {
                Some(p) if p.uid >= base && chain.len() < 64 => {
                    chain.push(format!("{parent} {} uid {}", p.name, p.uid));
                    parent = p.ppid;
                }
                Some(p) => {
                    chain.push(format!("{parent} {} uid {}", p.name, p.uid));
                    break p.name == "airlock";
                }
                None => break false,
            }
        };
        if !supervised {
            strays.push(chain.join(" <- "));
        }
    }
    strays
}

/// The unsupervised sandbox processes ([`stray_sandbox_processes`]) that are in a cgroup
/// of airlock process `pid` (which has exited): what that run left, whatever other
/// airlock processes on the host do meanwhile.
pub fn strays_of(pid: u32) -> Vec<String> {
    let prefix = format!("{pid}-");
    let live = start_time(pid).map(|s| format!("{pid}-{s}"));
    stray_sandbox_processes()
        .into_iter()
        .filter(|chain| {
            let Some(p) = chain.split_whitespace().next().and_then(|p| p.parse().ok()) else {
                return false;
            };
            cgroup_owners(p)
                .iter()
                .any(|o| o.starts_with(&prefix) && live.as_deref() != Some(o.as_str()))
        })
        .collect()
}

/// Asserts that airlock process `pid` (which has exited) left no cgroup directory and that
/// no sandbox process of it remains on the host (killed ones get a moment to die). Only
/// what that run owned counts: other airlock processes (another suite, another user's
/// daemon) may start and stop sandboxes meanwhile.
#[track_caller]
pub fn assert_nothing_left(pid: u32) {
    let gone = wait_until(Duration::from_secs(3), || strays_of(pid).is_empty());
    assert!(
        gone,
        "sandbox processes remain after airlock pid {pid} ended: {:#?}",
        strays_of(pid)
    );
    let cgroups = left_cgroups(pid);
    assert!(
        cgroups.is_empty(),
        "airlock pid {pid} left cgroup directories behind: {cgroups:?}"
    );
}
