//! `airlock run --cgroup-parent PATH` (as root): the sandbox's cgroups go under PATH in
//! every hierarchy, and the limits an operator puts on PATH bound it: a program within
//! its own `--memory` but over PATH's memory limit is reported as OOM-killed.
//!
//! Everything happens in `/airlock-test-cli-parent-<pid>` directories the test makes in
//! each hierarchy and removes.

mod common;

use airlock_sandbox::cgroup::{CgroupHost, CgroupParent};
use common::host::{airlock_run, serial, subdirs, wait_until};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Removes the test's parent directories, deepest first, whatever a failure left.
struct Parents(Vec<PathBuf>);

impl Drop for Parents {
    fn drop(&mut self) {
        fn rmdir_tree(dir: &Path) {
            for sub in subdirs(dir) {
                rmdir_tree(&sub);
            }
            let _ = fs::remove_dir(dir);
        }
        for dir in &self.0 {
            rmdir_tree(dir);
        }
    }
}

/// The sandbox directories (`<parent>/airlock/<owner>/<id>`) below `parent`.
fn sandboxes_under(parent: &Path) -> Vec<PathBuf> {
    subdirs(&parent.join("airlock"))
        .iter()
        .flat_map(|owner| subdirs(owner))
        .collect()
}

#[test]
fn run_under_an_explicit_parent_is_bounded_by_its_limit() {
    let _guard = serial();
    let name = format!("/airlock-test-cli-parent-{}", std::process::id());
    let host = CgroupHost::detect_with(&CgroupParent::Path(name.clone().into())).expect("detect");
    let parents = Parents(host.parent_dirs());
    for dir in &parents.0 {
        fs::create_dir(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    }
    // The operator's cap: 64 MiB for everything under the parent.
    const CAP: u64 = 64 << 20;
    let memory = parents
        .0
        .iter()
        .find(|d| d.join("memory.limit_in_bytes").exists() || d.join("memory.max").exists())
        .expect("a memory hierarchy")
        .clone();
    if memory.join("memory.limit_in_bytes").exists() {
        fs::write(memory.join("memory.limit_in_bytes"), CAP.to_string()).unwrap();
        let memsw = memory.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            fs::write(memsw, CAP.to_string()).unwrap();
        }
    } else {
        fs::write(memory.join("memory.max"), CAP.to_string()).unwrap();
        let _ = fs::write(memory.join("memory.swap.max"), "0");
    }

    // While a run is live, its sandbox is below the parent in every hierarchy.
    let mut live = Command::new(common::airlock_bin())
        .args(["run", "--cgroup-parent", &name, "--", "sleep", "2"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn airlock");
    let seen = wait_until(Duration::from_secs(10), || {
        parents.0.iter().all(|p| !sandboxes_under(p).is_empty())
    });
    let status = live.wait().expect("wait");
    assert!(seen, "no sandbox cgroup appeared under every parent");
    assert!(status.success(), "{status:?}");

    // Within its own --memory (256M) but over the parent's 64 MiB: OOM-killed.
    let run = airlock_run(&[
        "--cgroup-parent",
        &name,
        "--memory",
        "256M",
        "--json",
        "--",
        "python3",
        "-c",
        "x = bytearray(150 * 1024 * 1024); print(len(x))",
    ]);
    let v = run.json();
    assert_eq!(v["outcome"], "oom", "{v:#}");
    assert_eq!(v["oom_killed"], true, "{v:#}");
    let peak = v["memory_peak_bytes"].as_u64().expect("peak");
    assert!(peak <= CAP, "peak {peak} over the parent's cap: {v:#}");

    // Each run removed its sandbox; the parent is the operator's and stays.
    for dir in &parents.0 {
        assert!(sandboxes_under(dir).is_empty(), "left in {}", dir.display());
        assert!(dir.is_dir());
    }
    // A parent that is not a cgroup path is refused before anything runs.
    let bad = airlock_run(&["--cgroup-parent", "relative/path", "--", "true"]);
    assert_eq!(bad.code(), Some(2), "{}", bad.stderr());
    assert!(bad.stderr().contains("--cgroup-parent"), "{}", bad.stderr());
}
