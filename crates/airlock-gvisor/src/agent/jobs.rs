//! Which processes belong to what: each exec's and each spawned program's processes are
//! kept in a cgroup of their own in the Sentry's cgroupfs (a `pids` hierarchy with no
//! limits, mounted root-only on the sandbox's disk). A process never leaves its cgroup
//! by forking or by being orphaned, and the sandbox user cannot move itself (the files
//! are root's and it has no capabilities), so killing everything listed in a cgroup
//! until none is left kills exactly that exec's or program's processes, and nothing
//! else. (This gVisor release has no child subreapers, and in a nested PID namespace
//! /proc/self breaks, as the Sentry has no mount namespaces to give it its own /proc.)

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the hierarchy is mounted: on the sandbox's disk, root-only.
const DIR: &str = "cgroup";

/// How long killing a cgroup's processes may take (each round kills all there are;
/// what they forked meanwhile is killed the next round).
const KILL_TIMEOUT: Duration = Duration::from_secs(5);

/// The sandbox's cgroups.
#[derive(Debug, Clone)]
pub struct Jobs {
    root: PathBuf,
}

impl Jobs {
    /// Mounts the hierarchy under `scratch` (the disk's root, root's) and makes the
    /// execs' cgroup.
    pub fn setup(scratch: &Path) -> io::Result<Jobs> {
        use nix::mount::{MsFlags, mount};
        use std::os::unix::fs::PermissionsExt;
        let root = scratch.join(DIR);
        std::fs::create_dir(&root)?;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount(Some("airlock"), &root, Some("cgroup"), flags, Some("pids"))
            .map_err(|e| io::Error::other(format!("mounting a cgroupfs: {e}")))?;
        let jobs = Jobs { root };
        std::fs::create_dir(jobs.exec())?;
        Ok(jobs)
    }

    /// The execs' cgroup.
    pub fn exec(&self) -> PathBuf {
        self.root.join("exec")
    }

    /// Spawned program `id`'s cgroup (made; `id` counts the programs started, and is
    /// recorded: see [`Jobs::programs_started`]).
    pub fn program(&self, id: u64) -> io::Result<PathBuf> {
        let dir = self.root.join(format!("program-{id}"));
        std::fs::create_dir(&dir)?;
        std::fs::write(self.started_file(), id.to_string())?;
        Ok(dir)
    }

    /// Where the keeper records how many programs it started (beside the hierarchy,
    /// on the disk's root-only root).
    fn started_file(&self) -> PathBuf {
        self.root.with_file_name("programs-started")
    }

    /// How many programs were started so far.
    pub fn programs_started(&self) -> u64 {
        std::fs::read_to_string(self.started_file())
            .ok()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Whether a spawned program runs now (its cgroup is there until it ended).
    pub fn programs_running(&self) -> bool {
        std::fs::read_dir(&self.root).map_or(true, |d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("program-"))
        })
    }
}

/// Moves `pid` into the cgroup `dir`.
pub fn join(dir: &Path, pid: Pid) -> io::Result<()> {
    std::fs::write(dir.join("cgroup.procs"), pid.as_raw().to_string())
}

/// The processes in cgroup `dir`.
fn members(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Sends SIGKILL once to every process in cgroup `dir`; how many there were.
pub fn kill_round(dir: &Path) -> usize {
    let me = std::process::id() as i32;
    let pids: Vec<i32> = members(dir).into_iter().filter(|&p| p != me && p != 1).collect();
    for &pid in &pids {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    pids.len()
}

/// Kills every process in cgroup `dir` until none is left (bounded), calling `reap`
/// between rounds (the caller's zombies).
pub fn kill_all(dir: &Path, mut reap: impl FnMut()) {
    let deadline = Instant::now() + KILL_TIMEOUT;
    loop {
        reap();
        if kill_round(dir) == 0 || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
