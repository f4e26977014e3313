//! A service's spare cgroup directories (see `cgroup::Spares`): a sandbox that ended
//! cleanly leaves its v1 directories, renamed `.spare-N`, for the next one, which takes
//! them under its own id with its own limits; the next sandbox's results are its own; at
//! most `SPARE_CGROUPS` are kept, and releasing them removes them and the owner directory.
//! On a host without v1 controllers (cgroup v2) nothing is kept, and that is checked too.
//! The sandbox's init is this test binary re-executed (`harness = false`).

use airlock_sandbox::{Capture, Engine, SPARE_CGROUPS, SandboxConfig};
use airlock_spec::Spec;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The v1 owner directories of this process (`<hierarchy>/airlock/<pid>-<start>`).
fn owner_dirs() -> Vec<PathBuf> {
    let prefix = format!("{}-", std::process::id());
    let mut dirs = Vec::new();
    for h in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        let base = h.path().join("airlock");
        for o in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            if o.file_name().to_string_lossy().starts_with(&prefix) {
                dirs.push(o.path());
            }
        }
    }
    dirs
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn spares() -> usize {
    owner_dirs()
        .iter()
        .map(|d| names(d).iter().filter(|n| n.starts_with(".spare-")).count())
        .sum()
}

/// Whether a v1 hierarchy carries the memory controller here.
fn v1_memory() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
        m.lines().any(|l| {
            l.split_once(" - cgroup ")
                .is_some_and(|(_, opts)| opts.split([' ', ',']).any(|o| o == "memory"))
        })
    })
}

fn main() {
    airlock_sandbox::maybe_run_init();
    let engine = Engine::new().expect("the namespace tier (run as root)");
    engine.keep_spare_cgroups();
    let spec = Spec::new(vec![
        "sh".into(),
        "-c".into(),
        "head -c 64000000 /dev/zero | tail -c 1 >/dev/null".into(),
    ]);
    let small = Spec::new(vec!["/bin/true".into()]);

    let first = engine.create(&SandboxConfig::of(&spec)).expect("a sandbox");
    let first_id = first.id().to_owned();
    drop(first);
    if !v1_memory() {
        assert_eq!(spares(), 0, "spares kept without v1 controllers");
        println!("test result: 1 passed; 0 failed (no v1 controllers: nothing is kept, as it must be)");
        return;
    }
    assert!(
        spares() > 0,
        "no spare kept after a clean end: {:?}",
        owner_dirs()
    );
    assert!(
        owner_dirs().iter().all(|d| !names(d).contains(&first_id)),
        "the ended sandbox's name stayed"
    );

    // The next sandbox takes them, under its own name, with its own limits.
    let before = spares();
    let mut config = SandboxConfig::of(&spec);
    config.limits.memory_bytes = 200 << 20;
    let mut second = engine.create(&config).expect("a sandbox from spares");
    assert!(
        spares() < before,
        "the spares were not taken ({before} before, {} now)",
        spares()
    );
    let id = second.id().to_owned();
    let mine: Vec<PathBuf> = owner_dirs()
        .iter()
        .map(|d| d.join(&id))
        .filter(|p| p.is_dir())
        .collect();
    assert!(mine.len() >= 2, "the second sandbox's directories: {mine:?}");
    let limit = mine
        .iter()
        .find_map(|d| std::fs::read_to_string(d.join("memory.limit_in_bytes")).ok())
        .expect("a memory directory");
    assert_eq!(
        limit.trim(),
        (200u64 << 20).to_string(),
        "the limit is the new sandbox's"
    );
    let r = second.exec(&spec, &mut Capture, &[]).expect("exec");
    assert_eq!(r.exit_code, Some(0), "{r:#?}");
    let r = second.exec(&small, &mut Capture, &[]).expect("exec");
    assert!(r.memory_peak_bytes < 32 << 20, "the peak is this exec's: {r:#?}");
    drop(second);

    // Never more than SPARE_CGROUPS sets, however many end at once.
    let many: Vec<_> = (0..SPARE_CGROUPS + 4)
        .map(|_| engine.create(&SandboxConfig::of(&small)).expect("a sandbox"))
        .collect();
    drop(many);
    let per_set = owner_dirs()
        .iter()
        .filter(|d| names(d).iter().any(|n| n.starts_with(".spare-")))
        .count();
    assert!(per_set > 0);
    assert!(
        spares() <= SPARE_CGROUPS * per_set,
        "{} spares for {per_set} hierarchies",
        spares()
    );

    // Releasing them leaves nothing of this process.
    engine.release_spare_cgroups();
    assert!(
        owner_dirs().is_empty(),
        "left after the release: {:?}",
        owner_dirs()
    );
    println!("test result: 1 passed; 0 failed");
}
