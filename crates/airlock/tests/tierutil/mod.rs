//! Helpers for the contract suite (tests/contract.rs): which tiers run here, `airlock run
//! --isolation TIER` with the "nothing left behind" check after every run, and the same
//! check for a daemon's session and for a daemon that was stopped.
//!
//! Every check is scoped to what the test started: an airlock process is named on the host
//! by its owner tag `<pid>-<start time>`, which names its cgroups
//! (`/sys/fs/cgroup/…/airlock/<owner>/…`) and its state directories
//! (`/run/airlock/<tier>/<owner>…`); other airlock processes on the machine (other suites,
//! other tiers, another user's daemon) have other tags.
#![allow(dead_code)]

pub mod image;

use crate::common::host::{Run, airlock_run, cgroup_owners, left_cgroups, start_time, wait_until};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// Restricts the tiers the contract suite runs on, for a developer machine that lacks
/// one (`AIRLOCK_TEST_TIERS=namespaces cargo test --test contract`): a comma-separated
/// list of tier names. Unset (as in CI), every tier runs, and a tier this host cannot run
/// fails its cases: a missing tier never passes silently.
pub const TIERS_ENV: &str = "AIRLOCK_TEST_TIERS";

/// Generates, for every tier airlock has, `mod <tier> { #[test] fn <case>() }` for each
/// case named: each case is a function `fn(Tier)` of the test file, which also imports
/// [`Tier`] at its root. A new tier is one more name here, and every contract suite runs
/// on it.
#[allow(unused_macros)]
macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        const TIERS: &[&str] = &["namespaces", "gvisor", "microvm"];
        $crate::tierutil::contract!(@tier namespaces [$($case),*]);
        $crate::tierutil::contract!(@tier gvisor [$($case),*]);
        $crate::tierutil::contract!(@tier microvm [$($case),*]);
    };
    (@tier $tier:ident [$($case:ident),*]) => {
        mod $tier {
            $(
                #[test]
                fn $case() {
                    if let Some(tier) = crate::Tier::selected(stringify!($tier), crate::TIERS) {
                        crate::$case(tier);
                    }
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use contract;

/// Generates the image variant of a contract suite: `mod image { mod <tier> { #[test] fn
/// <case>() } }` for each case named, each run with every `airlock run` in the python image
/// ([`image::python_image`], through [`Tier::run`]). Invoked after [`contract!`] (whose
/// `TIERS` it uses), for the cases that run only `airlock run` and need only python3 and
/// a shell. The micro-VM tier's image cases are ignored until its image support merges.
#[allow(unused_macros)]
macro_rules! contract_image {
    ($($case:ident),* $(,)?) => {
        mod image {
            $crate::tierutil::contract_image!(@tier namespaces [$($case),*]);
            $crate::tierutil::contract_image!(@tier gvisor [$($case),*]);
            $crate::tierutil::contract_image!(@tier microvm [$($case),*]);
        }
    };
    (@tier $tier:ident [$($case:ident),*]) => {
        mod $tier {
            $(
                #[test]
                fn $case() {
                    $crate::tierutil::contract_image!(@body $tier $case);
                }
            )*
        }
    };
    (@body $tier:ident $case:ident) => {
        if let Some(tier) = crate::Tier::selected(stringify!($tier), crate::TIERS) {
            crate::$case(tier.with_image(crate::tierutil::image::python_image()));
        }
    };
}
#[allow(unused_imports)]
pub(crate) use contract_image;

/// Where airlock keeps per-run state (VM state directories today: `/run/airlock/vm`).
const STATE_ROOT: &str = "/run/airlock";

/// One isolation tier, as `--isolation` and `"isolation"` name it.
#[derive(Debug, Clone, Copy)]
pub struct Tier {
    /// `namespaces`, `microvm`, …
    pub name: &'static str,
    /// The image every `airlock run` of [`Tier::run`] names (`--image`), if any: the
    /// image variant of the contract suite ([`contract_image!`]).
    pub image: Option<&'static image::TestImage>,
}

impl Tier {
    /// The tier `name` if this run includes it ([`TIERS_ENV`]); `None` (with a note on
    /// stderr) when the developer left it out. Panics on a name the variable lists that is
    /// no tier of `known`: a typo must not skip every case.
    pub fn selected(name: &'static str, known: &[&str]) -> Option<Tier> {
        let Ok(list) = std::env::var(TIERS_ENV) else {
            return Some(Tier { name, image: None });
        };
        let wanted: Vec<&str> = list.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        for w in &wanted {
            assert!(
                known.contains(w),
                "{TIERS_ENV}={list}: no tier {w:?} (tiers: {known:?})"
            );
        }
        if wanted.contains(&name) {
            Some(Tier { name, image: None })
        } else {
            eprintln!("SKIPPED: tier {name} left out by {TIERS_ENV}={list}");
            None
        }
    }

    /// This tier, every run of it in image `img` ([`Tier::run`]).
    pub fn with_image(self, img: &'static image::TestImage) -> Tier {
        Tier {
            image: Some(img),
            ..self
        }
    }

    /// `airlock run --isolation TIER ARGS...` (with `--image-store STORE --image NAME
    /// --pull never` first when the tier has an image); asserts afterwards that the run
    /// left nothing on the host ([`assert_run_left_nothing`]).
    #[track_caller]
    pub fn run(&self, args: &[&str]) -> Run {
        let mut full = vec!["--isolation", self.name];
        if let Some(img) = self.image {
            full.extend([
                "--image-store",
                img.store.to_str().expect("UTF-8 store path"),
                "--image",
                img.name,
                "--pull",
                "never",
            ]);
        }
        full.extend_from_slice(args);
        let run = airlock_run(&full);
        assert_run_left_nothing(run.pid);
        run
    }

    /// `airlock run --isolation TIER ARGS... --json -- ARGV...`: the result (airlock must
    /// exit 0), after the "nothing left" check.
    #[track_caller]
    pub fn json(&self, args: &[&str], argv: &[&str]) -> Value {
        let mut full: Vec<&str> = args.to_vec();
        full.extend(["--json", "--"]);
        full.extend_from_slice(argv);
        let run = self.run(&full);
        self.parse(&run)
    }

    /// The `--json` result of `run`; a failure names the tier and how to leave it out.
    #[track_caller]
    pub fn parse(&self, run: &Run) -> Value {
        assert_eq!(
            run.code(),
            Some(0),
            "airlock --isolation {} failed (a host without this tier fails here: see {TIERS_ENV} \
             in tests/tierutil): {run:#?}\nstderr: {}",
            self.name,
            run.stderr()
        );
        serde_json::from_slice(&run.out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", run.stdout()))
    }

    /// `airlock serve` options for this tier: a small warm pool of its sandboxes.
    pub fn serve_args(&self) -> &'static [&'static str] {
        match self.name {
            "microvm" => &["--pool", "0", "--vm-pool", "1"],
            "gvisor" => &["--pool", "0", "--gvisor-pool", "1"],
            _ => &["--pool", "1"],
        }
    }
}

// ---------------------------------------------------------------------------------------
// Nothing left behind.
// ---------------------------------------------------------------------------------------

/// Live processes (any uid: sandbox processes, VMMs, runtimes) in a cgroup of the airlock
/// process `pid` that has exited (its owner tag `<pid>-<start>`, not a process that reuses
/// the pid now).
pub fn processes_of_dead(pid: u32) -> Vec<String> {
    let prefix = format!("{pid}-");
    let live = start_time(pid).map(|s| format!("{pid}-{s}"));
    processes_where(|owners| {
        owners
            .iter()
            .any(|o| o.starts_with(&prefix) && live.as_deref() != Some(o.as_str()))
    })
}

/// Live processes (any uid) in a cgroup of owner tag `owner`.
pub fn processes_of(owner: &str) -> Vec<String> {
    processes_where(|owners| owners.contains(owner))
}

/// Live processes whose cgroup owner tags satisfy `f`, as `"<pid> <comm>"`.
fn processes_where(f: impl Fn(&std::collections::BTreeSet<String>) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if zombie || !f(&cgroup_owners(p)) {
            continue;
        }
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        found.push(format!("{p} {}", comm.trim()));
    }
    found
}

/// State directories (and files) of owner tags starting with `prefix`, under every
/// tier's state root (`/run/airlock/<tier>/`).
fn state_entries(prefix: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for tier in std::fs::read_dir(STATE_ROOT).into_iter().flatten().flatten() {
        for e in std::fs::read_dir(tier.path()).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(prefix) {
                found.push(e.path());
            }
        }
    }
    found
}

/// Host mounts a run could leak: any mount point naming an owner tag that starts with
/// `prefix`, and the places where a sandbox builds its root (`/tmp`, `/tmp/oldroot`),
/// which no run may ever mount on the host.
fn leaked_mounts(prefix: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("read mountinfo")
        .lines()
        .filter(|l| {
            let point = l.split_whitespace().nth(4).unwrap_or("");
            point.contains(&format!("/{prefix}")) || point == "/tmp" || point.starts_with("/tmp/oldroot")
        })
        .map(str::to_owned)
        .collect()
}

/// What airlock process `pid` (exited) left on the host: processes in its cgroups, its
/// cgroup directories, its state directories, mounts. Empty when nothing.
pub fn run_leftovers(pid: u32) -> Vec<String> {
    let prefix = format!("{pid}-");
    // A live process that reuses the pid now is not the run: its tag is not the run's.
    let live = start_time(pid).map(|s| format!("{pid}-{s}"));
    let mut left = Vec::new();
    let procs = processes_of_dead(pid);
    if !procs.is_empty() {
        left.push(format!("processes: {procs:?}"));
    }
    let cgroups = left_cgroups(pid);
    if !cgroups.is_empty() {
        left.push(format!("cgroups: {cgroups:?}"));
    }
    let state: Vec<_> = state_entries(&prefix)
        .into_iter()
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                live.as_deref()
                    .is_none_or(|l| !n.to_string_lossy().starts_with(l))
            })
        })
        .collect();
    if !state.is_empty() {
        left.push(format!("state: {state:?}"));
    }
    let mounts = leaked_mounts(&prefix);
    if !mounts.is_empty() {
        left.push(format!("mounts: {mounts:?}"));
    }
    left
}

/// Asserts that airlock process `pid` (exited) left nothing ([`run_leftovers`]); killed
/// processes get a few seconds to die.
#[track_caller]
pub fn assert_run_left_nothing(pid: u32) {
    wait_until(Duration::from_secs(5), || run_leftovers(pid).is_empty());
    let left = run_leftovers(pid);
    assert!(left.is_empty(), "airlock pid {pid} left behind: {left:#?}");
}

/// What sandbox `id` of the daemon with owner tag `owner` has on the host: processes in
/// its cgroup, the cgroup, its state directory. Empty when nothing.
pub fn sandbox_leftovers(owner: &str, id: &str) -> Vec<String> {
    let mut left = Vec::new();
    let cgroup = format!("/airlock/{owner}/{id}");
    let procs: Vec<String> = std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("cgroup"))
                .is_ok_and(|c| c.lines().any(|l| l.contains(&cgroup)))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if !procs.is_empty() {
        left.push(format!("processes: {procs:?}"));
    }
    let dirs: Vec<PathBuf> = crate::common::host::airlock_cgroup_bases()
        .iter()
        .map(|b| b.join(owner).join(id))
        .filter(|p| p.exists())
        .collect();
    if !dirs.is_empty() {
        left.push(format!("cgroups: {dirs:?}"));
    }
    let state: Vec<PathBuf> = std::fs::read_dir(STATE_ROOT)
        .into_iter()
        .flatten()
        .flatten()
        .map(|t| t.path().join(owner).join(id))
        .filter(|p| p.exists())
        .collect();
    if !state.is_empty() {
        left.push(format!("state: {state:?}"));
    }
    left
}

/// What the daemon with owner tag `owner` (stopped) left: processes in its cgroups, its
/// cgroup directories and state directories, mounts naming it.
pub fn daemon_leftovers(owner: &str) -> Vec<String> {
    let mut left = Vec::new();
    let procs = processes_of(owner);
    if !procs.is_empty() {
        left.push(format!("processes: {procs:?}"));
    }
    let dirs: Vec<PathBuf> = crate::common::host::airlock_cgroup_bases()
        .iter()
        .map(|b| b.join(owner))
        .filter(|p| p.exists())
        .collect();
    if !dirs.is_empty() {
        left.push(format!("cgroups: {dirs:?}"));
    }
    let state: Vec<PathBuf> = state_entries(owner);
    if !state.is_empty() {
        left.push(format!("state: {state:?}"));
    }
    let mounts = leaked_mounts(owner);
    if !mounts.is_empty() {
        left.push(format!("mounts: {mounts:?}"));
    }
    left
}
