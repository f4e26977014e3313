//! Template VMs and their clones, against real VMs: a clone runs programs like a booted
//! VM, shares nothing writable with the template or with other clones, gets its own
//! random state and the host's clock, and leaves nothing behind. Needs root,
//! qemu-system-x86_64, mksquashfs, sha256sum, and the `airlock-guest` binary of this
//! build (`cargo build -p airlock-guest`; `cargo build --workspace` builds it).
//!
//! One test, so the suite boots one template VM (TCG boots are slow).

mod common;

use airlock_microvm::{MicroVmHost, VmSize};
use airlock_sandbox::Capture;
use airlock_spec::Spec;
use common::{ok, sh};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The template's RAM file as the clone's VMM holds it (passed as fd 5, a memfd).
fn ram_file_of(pid: u32) -> PathBuf {
    let fd = PathBuf::from(format!("/proc/{pid}/fd/5"));
    let target = std::fs::read_link(&fd).expect("fd 5 of the VMM");
    assert!(
        target.to_string_lossy().contains("memfd:airlock-vm-ram"),
        "{target:?}"
    );
    fd
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().expect("sha256sum");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The cgroup directories of a process (v2, or v1 controllers' hierarchies), but the roots.
fn cgroups_of(pid: u32) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    let dirs: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let mount = match controllers {
                "" => "/sys/fs/cgroup".to_owned(),
                c if c.starts_with("name=") => return None,
                c => format!("/sys/fs/cgroup/{c}"),
            };
            (path != "/").then(|| PathBuf::from(format!("{mount}{path}")))
        })
        .filter(|d| d.is_dir())
        .collect();
    assert!(!dirs.is_empty(), "the VMM is in no cgroup of its own: {text}");
    dirs
}

/// Descriptors of this process that are the templates' memfds.
fn own_template_files() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .map(|t| t.to_string_lossy().contains("memfd:airlock-vm-"))
                .unwrap_or(false)
        })
        .count()
}

#[test]
fn clones_run_apart_with_their_own_randomness_and_clock_and_leave_nothing() {
    let options = common::options();
    let host = MicroVmHost::new(&options).expect("micro-VM host");
    let size = VmSize::for_limits(&Spec::new(vec!["true".into()]).limits);
    let built = host.prepare_template(size).expect("template");
    assert_eq!(own_template_files(), 2, "the RAM and the device state");

    // A clone runs a program, and leaves a file and some memory behind in its guest.
    let mut first = host.clone_vm(size).expect("clone");
    let first_pid = first.pid().expect("VMM pid");
    let ram = ram_file_of(first_pid);
    let pristine = sha256(&ram);
    let script = "echo secret > mark; head -c 8M /dev/zero | tr '\\0' x > /tmp/fill; \
                  cat /proc/sys/kernel/random/uuid; date +%s; ls";
    let one = ok(first.run(&sh(script), &mut Capture, &[]).expect("run"));
    let one_lines: Vec<&str> = one.stdout.lines().collect();
    assert!(one_lines.contains(&"mark"), "{one:?}");

    // The template's RAM file cannot be changed, not even by root through a descriptor
    // opened for writing (QEMU opens it so).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&ram)
        .expect("open the RAM file");
    let err = file.write_at(b"x", 4096).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    let err = (&file).write_all(b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    assert!(file.set_len(4096).is_err());
    drop(file);

    // The next clone sees the template, not the first clone: no file, same RAM file.
    let cgroups = cgroups_of(first_pid);
    let state_dir = options.state.clone();
    drop(first);
    assert!(
        !Path::new(&format!("/proc/{first_pid}")).exists(),
        "VMM {first_pid} lives on"
    );
    assert!(cgroups.iter().all(|d| !d.exists()), "{cgroups:?} remain");

    let mut second = host.clone_vm(size).expect("second clone");
    let second_pid = second.pid().expect("VMM pid");
    assert_eq!(
        sha256(&ram_file_of(second_pid)),
        pristine,
        "a clone changed the template"
    );
    let restore = second.boot_time();
    let two = ok(second
        .run(
            &sh(script.replace("echo secret > mark; ", "ls; ").as_str()),
            &mut Capture,
            &[],
        )
        .expect("run"));
    let two_lines: Vec<&str> = two.stdout.lines().collect();
    assert!(
        !two_lines.contains(&"mark"),
        "the first clone's file is here: {two:?}"
    );

    // Each clone has its own random state (the template's was the same for both).
    let uuid = |lines: &[&str]| {
        lines
            .iter()
            .find(|l| l.len() == 36 && l.matches('-').count() == 4)
            .map(|s| s.to_string())
    };
    let (u1, u2) = (
        uuid(&one_lines).expect("uuid 1"),
        uuid(&two_lines).expect("uuid 2"),
    );
    assert_ne!(u1, u2, "two clones drew the same random bytes");

    // And the host's clock, not the template's.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    let guest: i64 = two_lines.iter().find_map(|l| l.parse().ok()).expect("date +%s");
    assert!((now - guest).abs() <= 5, "guest clock {guest}, host {now}");

    eprintln!(
        "template built in {built:?}; clone restored to ready in {restore:?}; first clone's run {} ms, second's {} ms",
        one.wall_ms, two.wall_ms
    );
    assert!(
        restore < built,
        "restoring ({restore:?}) is not faster than a boot ({built:?})"
    );
    assert!(restore < Duration::from_secs(30));

    let cgroups = cgroups_of(second_pid);
    drop(second);
    assert!(!Path::new(&format!("/proc/{second_pid}")).exists());
    assert!(cgroups.iter().all(|d| !d.exists()), "{cgroups:?} remain");

    // The template's files go with the host, and no VM state is left.
    drop(host);
    assert_eq!(own_template_files(), 0);
    let leftovers: Vec<_> = std::fs::read_dir(&state_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|owner| {
            // This process's VMs (other airlock processes may be running theirs).
            owner
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("{}-", std::process::id()))
        })
        .flat_map(|owner| std::fs::read_dir(owner.path()).into_iter().flatten().flatten())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
