//! Pause and resume, and full snapshots of a running VM, against real VMs: a paused VM
//! refuses requests and comes back with the host's clock; a snapshot restored twice
//! gives two VMs that run on from it, each with its own randomness and files, a
//! background program's memory intact in both. Needs root, qemu-system-x86_64,
//! mksquashfs, python3 in the guest's rootfs, and the `airlock-guest` binary of this
//! build (`cargo build -p airlock-guest`). Skipped, with the reason printed, without
//! QEMU.
//!
//! Few tests: each VM costs seconds under emulation.

mod common;

use airlock_backend::{ErrorKind, Stdio};
use airlock_microvm::{BootedVm, MicroVmHost, VmSize};
use airlock_sandbox::Capture;
use airlock_spec::{Limits, Spec};
use common::{ok, sh};
use std::io::Read;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// One test at a time: each makes a `MicroVmHost`, and a host dropped removes the
/// process's VM state directory under another host's VM being born (the service has one
/// host; this binary's tests would have four at once).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Whether QEMU is here; says why not when it is not.
fn have_qemu() -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join("qemu-system-x86_64").is_file()));
    if !found {
        eprintln!("skipped: qemu-system-x86_64 is not installed");
    }
    found
}

fn stdout(vm: &mut BootedVm, script: &str) -> String {
    ok(vm.exec(&sh(script), &mut Capture, &[]).expect("exec")).stdout
}

/// A session's VM: sandbox built, the egress port's relay running.
fn session(host: &MicroVmHost) -> BootedVm {
    let limits = Limits::default();
    let mut vm = host.boot(VmSize::for_limits(&limits)).expect("boot");
    vm.ensure_sandbox(&limits).expect("sandbox");
    vm.start_mux().expect("relay");
    vm
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn a_paused_vm_refuses_requests_and_resumes_with_the_hosts_clock() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !have_qemu() {
        return;
    }
    let host = MicroVmHost::new(&common::options()).expect("micro-VM host");
    let mut vm = session(&host);
    vm.write_file("before.txt", 0o644, b"1").expect("write");

    vm.pause().expect("pause");
    vm.pause().expect("pausing twice does nothing");
    assert!(vm.is_paused());
    let t = Instant::now();
    let refused: airlock_backend::Error = vm.exec(&sh("true"), &mut Capture, &[]).unwrap_err().into();
    assert_eq!(refused.kind(), ErrorKind::Invalid, "{refused}");
    assert!(refused.to_string().contains("sandbox: is paused"), "{refused}");
    for err in [
        vm.write_file("x", 0o644, b"x").unwrap_err(),
        vm.read_file("before.txt", 10).unwrap_err(),
        vm.list_files().unwrap_err(),
    ] {
        let err: airlock_backend::Error = err.into();
        assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    }
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "refusals must not wait for the guest"
    );
    // Long enough that a clock that stood still is visibly behind.
    std::thread::sleep(Duration::from_secs(3));
    assert!(vm.agent_alive(), "a paused VM is alive");

    vm.resume().expect("resume");
    vm.resume().expect("resuming twice does nothing");
    let guest: f64 = stdout(&mut vm, "date +%s.%N").trim().parse().expect("date");
    let skew = (guest - now_s()).abs();
    assert!(skew < 1.5, "the guest's clock is {skew:.3} s off after the pause");
    assert_eq!(vm.read_file("before.txt", 10).expect("read"), b"1");
}

/// A background program that keeps a secret and a counter in memory, serves
/// "<secret> <count>" on port 7000 (one count per connection) and writes 64 KiB to its
/// stdout per connection (a restored copy, whose stdout nobody reads, must not block).
const COUNTER: &str = r#"
import os, socket, sys
secret = os.urandom(8).hex()
n = 0
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7000))
s.listen(8)
open("/workspace/ready", "w").write(secret)
while True:
    c, _ = s.accept()
    n += 1
    c.sendall(f"{secret} {n}\n".encode())
    c.close()
    sys.stdout.write("x" * 65536)
    sys.stdout.flush()
"#;

/// Connects to the counter through the host's port connector.
fn ask(vm: &BootedVm) -> String {
    let ports = vm.ports().expect("ports");
    let fd = ports.connect(7000).expect("connect to port 7000");
    let mut s = std::fs::File::from(fd);
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out.trim().to_owned()
}

fn urandom(vm: &mut BootedVm) -> String {
    stdout(vm, "od -An -tx1 -N16 /dev/urandom | tr -d ' \\n'")
}

#[test]
fn a_full_snapshot_restores_twice_into_independent_vms_with_the_programs_memory() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !have_qemu() {
        return;
    }
    let host = MicroVmHost::new(&common::options()).expect("micro-VM host");
    let mut parent = session(&host);
    parent.write_file("shared.txt", 0o644, b"before").expect("write");
    let mut spec = Spec::new(vec!["python3".into(), "-c".into(), COUNTER.into()]);
    spec.limits = Limits::default();
    let spawned = parent.spawn(&spec, Stdio::Pipes).expect("spawn");
    // The parent's host drains the program's output.
    let mut out = std::fs::File::from(spawned.stdout);
    let drain = std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = out.read_to_end(&mut sink);
        sink.len()
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let secret = loop {
        match parent.read_file("ready", 100) {
            Ok(s) if !s.is_empty() => break String::from_utf8(s).unwrap(),
            _ if Instant::now() > deadline => panic!("the counter did not start"),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    assert_eq!(ask(&parent), format!("{secret} 1"));

    let dir = tempfile::tempdir().expect("tempdir");
    let t = Instant::now();
    assert!(parent.checkpoint(dir.path()).expect("checkpoint"));
    let checkpoint_ms = t.elapsed().as_secs_f64() * 1e3;
    let ram_stored = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dir.path().join("ram")).expect("ram").blocks() * 512
    };

    // The parent runs on.
    assert_eq!(ask(&parent), format!("{secret} 2"));
    parent.write_file("shared.txt", 0o644, b"parent").expect("write");

    let disk = Limits::default().disk_bytes;
    let t = Instant::now();
    let mut a = host.restore(dir.path(), None, disk).expect("restore a");
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let mut b = host.restore(dir.path(), None, disk).expect("restore b");
    let second_ms = t.elapsed().as_secs_f64() * 1e3;
    eprintln!(
        "checkpoint {checkpoint_ms:.0} ms ({} MiB of RAM stored); restores {first_ms:.0} ms, then {second_ms:.0} ms",
        ram_stored >> 20
    );
    drop(dir); // a restored VM needs nothing of it any more

    // Each runs on from the snapshot: the program's memory (its secret, its count) and
    // the files as they were, then each its own way.
    assert_eq!(ask(&a), format!("{secret} 2"));
    assert_eq!(ask(&a), format!("{secret} 3"));
    assert_eq!(ask(&b), format!("{secret} 2"));
    assert_eq!(ask(&parent), format!("{secret} 3"));
    // Its output goes nowhere, and does not stop it: more than a window (256 KiB).
    for _ in 0..6 {
        assert!(ask(&a).starts_with(&secret));
    }
    assert_eq!(a.read_file("shared.txt", 100).expect("read"), b"before");
    a.write_file("only-a.txt", 0o644, b"a").expect("write");
    b.write_file("shared.txt", 0o644, b"b").expect("write");
    assert_eq!(
        stdout(&mut a, "cat shared.txt; ls"),
        "beforeonly-a.txt\nready\nshared.txt\n"
    );
    assert_eq!(stdout(&mut b, "cat shared.txt; ls"), "bready\nshared.txt\n");
    assert_eq!(
        stdout(&mut parent, "cat shared.txt; ls"),
        "parentready\nshared.txt\n"
    );

    // Their own random state and the host's clock.
    let (ra, rb) = (urandom(&mut a), urandom(&mut b));
    assert_ne!(ra, rb, "two restores of one snapshot share their random state");
    for vm in [&mut a, &mut b] {
        let guest: f64 = stdout(vm, "date +%s.%N").trim().parse().expect("date");
        assert!((guest - now_s()).abs() < 1.5, "the restored clock is off");
    }

    // Its own uid, cgroup and VMM; gone when dropped.
    let (pa, pb) = (a.pid().unwrap(), b.pid().unwrap());
    assert_ne!(pa, pb);
    drop(a);
    drop(b);
    assert!(!std::path::Path::new(&format!("/proc/{pa}")).exists());
    assert_eq!(ask(&parent), format!("{secret} 4"));
    drop(spawned.stdin);
    drop(parent);
    assert!(drain.join().unwrap() >= 65536);
}

#[test]
fn a_snapshot_of_another_image_or_disk_is_refused_and_a_missing_one_is_invalid() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !have_qemu() {
        return;
    }
    let host = MicroVmHost::new(&common::options()).expect("micro-VM host");
    let empty = tempfile::tempdir().expect("tempdir");
    let err: airlock_backend::Error = host
        .restore(empty.path(), None, Limits::default().disk_bytes)
        .unwrap_err()
        .into();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    assert!(err.to_string().contains("snapshot"), "{err}");
}

#[test]
fn an_exec_reports_its_file_changes_and_the_files_go_out_and_back_as_tar() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !have_qemu() {
        return;
    }
    let host = MicroVmHost::new(&common::options()).expect("micro-VM host");
    let mut vm = session(&host);
    vm.write_file("keep.txt", 0o644, b"keep").expect("write");
    vm.write_file("old.txt", 0o644, b"old").expect("write");
    vm.write_file("gone.txt", 0o644, b"gone").expect("write");

    // Created, modified, deleted, renamed (a delete and a create), in /workspace and /tmp.
    let mut spec = sh(
        "mkdir d && echo new > d/new.txt && echo more >> old.txt && rm gone.txt \
         && mv keep.txt kept.txt && echo t > /tmp/t.txt && ln -s kept.txt link",
    );
    spec.files_changed_in = vec!["/workspace".into(), "/tmp".into()];
    let r = ok(vm.exec(&spec, &mut Capture, &[]).expect("exec"));
    let got: Vec<(String, String, String, u64)> = r
        .files_changed
        .iter()
        .map(|c| {
            let v = serde_json::to_value(c).unwrap();
            (
                c.path.clone(),
                v["change"].as_str().unwrap().to_owned(),
                v["kind"].as_str().unwrap().to_owned(),
                c.bytes,
            )
        })
        .collect();
    let want = [
        ("/tmp/t.txt", "created", "file", 2),
        ("/workspace/d", "created", "dir", 0),
        ("/workspace/d/new.txt", "created", "file", 4),
        ("/workspace/gone.txt", "deleted", "file", 4),
        ("/workspace/keep.txt", "deleted", "file", 4),
        ("/workspace/kept.txt", "created", "file", 4),
        ("/workspace/link", "created", "symlink", 8),
        ("/workspace/old.txt", "modified", "file", 8),
    ];
    let want: Vec<(String, String, String, u64)> = want
        .iter()
        .map(|(p, c, k, b)| (p.to_string(), c.to_string(), k.to_string(), *b))
        .collect();
    assert_eq!(got, want, "{:?}", r.files_changed);
    assert!(!r.files_changed_truncated);
    // Nothing changed, nothing listed; none asked for, none given.
    let r = ok(vm.exec(&sh("cat kept.txt"), &mut Capture, &[]).expect("exec"));
    assert!(r.files_changed.is_empty(), "{:?}", r.files_changed);
    let mut quiet = sh("echo x > quiet.txt");
    quiet.files_changed_in = Vec::new();
    assert!(
        ok(vm.exec(&quiet, &mut Capture, &[]).expect("exec"))
            .files_changed
            .is_empty()
    );

    // A 10 MB, 1,000-file workspace out and back in.
    let mut fill = Spec::new(vec![
        "python3".into(),
        "-c".into(),
        "import os\nos.mkdir('big')\nfor i in range(1000): open(f'big/f{i}', 'wb').write(os.urandom(10000))"
            .into(),
    ]);
    fill.limits.timeout_ms = 120_000;
    let r = ok(vm.exec(&fill, &mut Capture, &[]).expect("exec"));
    // 1,001 changes (the directory and its files): the list stops at its bound, and says so.
    assert_eq!(r.files_changed.len(), airlock_spec::MAX_FILES_CHANGED);
    assert!(r.files_changed_truncated);
    let sums = "find /workspace /tmp -type f | sort | xargs sha256sum; find /workspace -printf '%p %y %m %u\\n' | sort";
    let mut sums = sh(sums);
    sums.limits.timeout_ms = 120_000;
    let sums = |vm: &mut BootedVm| ok(vm.exec(&sums, &mut Capture, &[]).expect("exec")).stdout;
    let before = sums(&mut vm);
    let t = Instant::now();
    let mut tar = Vec::new();
    vm.export_files(&mut tar).expect("export");
    let export_ms = t.elapsed().as_secs_f64() * 1e3;
    assert!(tar.len() > 10_000_000, "{} bytes", tar.len());
    ok(vm
        .exec(
            &sh("rm -rf /workspace/* /tmp/t.txt && echo stray > /workspace/stray"),
            &mut Capture,
            &[],
        )
        .expect("exec"));
    let t = Instant::now();
    vm.import_files(&mut tar.as_slice()).expect("import");
    let import_ms = t.elapsed().as_secs_f64() * 1e3;
    eprintln!(
        "10 MB, 1,000 files: export {export_ms:.0} ms ({} bytes of tar), import {import_ms:.0} ms",
        tar.len()
    );
    assert_eq!(sums(&mut vm), before);
    assert_eq!(
        stdout(&mut vm, "stat -c '%u:%g' kept.txt big/f1 d"),
        "1000:1000\n1000:1000\n1000:1000\n"
    );
    assert_eq!(stdout(&mut vm, "readlink link"), "kept.txt\n");

    // A stream that does not fit the disk.
    let mut huge = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    let size = Limits::default().disk_bytes + (1 << 20);
    header.set_size(size);
    header.set_mode(0o644);
    header.set_cksum();
    huge.append_data(&mut header, "workspace/huge", std::io::repeat(7).take(size))
        .expect("tar");
    let huge = huge.into_inner().expect("tar");
    let err: airlock_backend::Error = vm.import_files(&mut huge.as_slice()).unwrap_err().into();
    assert_eq!(err.kind(), ErrorKind::DiskFull, "{err}");
    assert!(vm.agent_alive());
    ok(vm.exec(&sh("true"), &mut Capture, &[]).expect("the VM goes on"));
}
