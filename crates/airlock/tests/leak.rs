//! LEAK: 1,000 consecutive sandboxes leave the host where it was: the number of host
//! processes, processes with sandbox uids, airlock cgroup directories, the host's mounts,
//! and this test process's own open fds.
//!
//! A single test: cargo runs test binaries one after another, so nothing else of this
//! project's suites runs airlock while it counts.

mod common;

use common::host::{ProcInfo, airlock_cgroup_bases, proc_infos, subdirs};
use common::{airlock_bin, sandbox_process_pid, sandbox_processes};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RUNS: usize = 1000;
/// Other things happen on a shared machine: allow this much drift in the process count.
const PROCESS_NOISE: usize = 5;
/// How long unrelated host activity gets to settle before a difference counts as a leak
/// (a real leak persists; a compiler another user started finishes).
const SETTLE: Duration = Duration::from_secs(30);

/// Every host process, by pid (in pid order, for readable reports).
fn host_processes() -> BTreeMap<u32, ProcInfo> {
    proc_infos().into_iter().collect()
}

/// Every directory below every `airlock` cgroup directory (owners and sandboxes), in
/// every hierarchy: v1 controllers, the unified hierarchy, or the root of a v2 host.
fn airlock_cgroup_dirs() -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    let mut todo = airlock_cgroup_bases();
    while let Some(dir) = todo.pop() {
        for path in subdirs(&dir) {
            found.insert(path.clone());
            todo.push(path);
        }
    }
    found
}

fn mountinfo_lines() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("read mountinfo")
        .lines()
        .count()
}

fn own_fds() -> BTreeMap<String, String> {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .flatten()
        .map(|e| {
            let target = std::fs::read_link(e.path())
                .map(|t| t.display().to_string())
                .unwrap_or_default();
            (e.file_name().to_string_lossy().into_owned(), target)
        })
        .collect()
}

#[derive(Debug)]
struct Snapshot {
    processes: BTreeMap<u32, ProcInfo>,
    sandbox_processes: Vec<String>,
    cgroups: BTreeSet<PathBuf>,
    mounts: usize,
    fds: BTreeMap<String, String>,
}

/// Airlock processes other than this test's runs (a daemon someone else started before
/// the test): their sandboxes and cgroups come and go on their own and are not counted.
fn foreign_airlocks(processes: &BTreeMap<u32, ProcInfo>) -> BTreeSet<u32> {
    processes
        .iter()
        .filter(|(pid, p)| **pid != 1 && p.name == "airlock")
        .map(|(pid, _)| *pid)
        .collect()
}

impl Snapshot {
    /// A snapshot that leaves out the sandboxes and cgroups of `foreign` airlock processes.
    fn take_excluding(foreign: &BTreeSet<u32>) -> Self {
        let processes = host_processes();
        let sandbox_processes = sandbox_processes()
            .into_iter()
            .filter(|line| {
                let pid = sandbox_process_pid(line).unwrap_or(0);
                !processes.get(&pid).is_some_and(|p| foreign.contains(&p.ppid))
            })
            .collect();
        let cgroups = airlock_cgroup_dirs()
            .into_iter()
            .filter(|dir| {
                // <mount>/airlock/<owner pid>-<start time>[/<id>]
                let owner = dir.components().rev().find_map(|c| {
                    let s = c.as_os_str().to_str()?;
                    let (pid, start) = s.split_once('-')?;
                    start
                        .chars()
                        .all(|c| c.is_ascii_digit())
                        .then(|| pid.parse::<u32>().ok())?
                });
                !owner.is_some_and(|pid| foreign.contains(&pid))
            })
            .collect();
        Snapshot {
            processes,
            sandbox_processes,
            cgroups,
            mounts: mountinfo_lines(),
            fds: own_fds(),
        }
    }

    /// Processes that exist now and did not in `before`.
    fn new_processes(&self, before: &Snapshot) -> Vec<(u32, &ProcInfo)> {
        self.processes
            .iter()
            .filter(|(pid, _)| !before.processes.contains_key(pid))
            .map(|(p, i)| (*p, i))
            .collect()
    }

    /// New processes that can only come from these runs, whatever else the machine does:
    /// below this test process, an airlock binary or its re-executed init (`exe`), or a
    /// process with a sandbox uid.
    fn attributable(&self, before: &Snapshot) -> Vec<String> {
        let me = std::process::id();
        let below_me = |mut pid: u32| {
            for _ in 0..64 {
                match self.processes.get(&pid) {
                    Some(info) if info.ppid == me => return true,
                    Some(info) if info.ppid > 1 => pid = info.ppid,
                    _ => return false,
                }
            }
            false
        };
        self.new_processes(before)
            .into_iter()
            .filter(|(pid, info)| {
                info.name.contains("airlock")
                    || info.name == "exe"
                    || info.uid >= airlock_sandbox::HOST_UID_BASE
                    || below_me(*pid)
            })
            .map(|(pid, info)| format!("{pid}: {info}"))
            .collect()
    }

    /// What differs from `before` beyond the allowed noise; empty when nothing leaked.
    fn leaks_since(&self, before: &Snapshot) -> Vec<String> {
        let mut leaks = Vec::new();
        let (b, a) = (before.processes.len(), self.processes.len());
        if a.abs_diff(b) > PROCESS_NOISE {
            let new: Vec<String> = self
                .new_processes(before)
                .iter()
                .map(|(pid, info)| format!("{pid}: {info}"))
                .collect();
            leaks.push(format!(
                "host processes: {b} before, {a} after; new ones: {new:#?}"
            ));
        }
        let ours = self.attributable(before);
        if !ours.is_empty() {
            leaks.push(format!("new processes of airlock remain: {ours:#?}"));
        }
        if !self.sandbox_processes.is_empty() {
            leaks.push(format!(
                "processes with sandbox uids remain: {:#?}",
                self.sandbox_processes
            ));
        }
        if self.cgroups != before.cgroups {
            let added: Vec<_> = self.cgroups.difference(&before.cgroups).collect();
            let removed: Vec<_> = before.cgroups.difference(&self.cgroups).collect();
            leaks.push(format!(
                "airlock cgroup directories changed: added {added:#?}, removed {removed:#?}"
            ));
        }
        if self.mounts != before.mounts {
            leaks.push(format!(
                "host mountinfo: {} lines before, {} after",
                before.mounts, self.mounts
            ));
        }
        if self.fds != before.fds {
            leaks.push(format!(
                "this process's fds: {:?} before, {:?} after",
                before.fds, self.fds
            ));
        }
        leaks
    }
}

#[test]
fn a_thousand_runs_leave_nothing_behind() {
    // Warm up once (page cache, first-run purge of stale cgroups) before counting.
    let warm = Command::new(airlock_bin())
        .args(["run", "--", "/bin/true"])
        .output()
        .expect("spawn airlock");
    assert!(warm.status.success(), "warm-up run failed: {warm:?}");

    // Sandboxes of earlier test binaries may still be dying (this host's PID 1 reaps
    // orphaned zombies slowly): let them settle before the baseline.
    // Daemons that were already running (another user of this machine) are left out.
    let foreign = foreign_airlocks(&host_processes());
    let settle = Instant::now();
    let mut before = Snapshot::take_excluding(&foreign);
    while !before.sandbox_processes.is_empty() && settle.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(200));
        before = Snapshot::take_excluding(&foreign);
    }
    assert!(
        before.sandbox_processes.is_empty(),
        "sandbox processes exist before the test (is another airlock running?): {:#?}",
        before.sandbox_processes
    );

    let start = Instant::now();
    for i in 0..RUNS {
        let out = Command::new(airlock_bin())
            .args(["run", "--", "/bin/true"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("spawn airlock");
        assert!(
            out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
            "run {i} failed: {:?}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let elapsed = start.elapsed();
    println!(
        "{RUNS} sequential `airlock run -- /bin/true` in {:.1} s: {:.1} runs/s, {:.1} ms per run",
        elapsed.as_secs_f64(),
        RUNS as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / RUNS as f64
    );

    // Give unrelated host activity a chance to settle: a real leak persists.
    let settle = Instant::now();
    let mut first_seen: Option<Vec<String>> = None;
    let leaks = loop {
        let leaks = Snapshot::take_excluding(&foreign).leaks_since(&before);
        if first_seen.is_none() {
            first_seen = Some(leaks.clone());
        }
        if leaks.is_empty() || settle.elapsed() > SETTLE {
            break leaks;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if settle.elapsed() > Duration::from_secs(1) {
        let first = first_seen.unwrap_or_default().join("\n");
        println!(
            "host state settled after {:.1} s; right after the runs:\n{first}",
            settle.elapsed().as_secs_f64()
        );
    }
    assert!(leaks.is_empty(), "after {RUNS} runs:\n{}", leaks.join("\n"));
}
