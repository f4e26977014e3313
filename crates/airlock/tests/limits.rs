//! LIMITS: each resource limit, when reached, gives the right outcome, keeps usage under
//! the cap and leaves the host fine: memory (tmpfs pages included), processes and threads,
//! CPU quota, output, disk and file size, rlimits; and usage is reported.
//! (The memory, pids and output limits as every tier keeps them are in tests/contract.rs.)
//!
//! Every test drives the real binary. The tests of this file run one at a time (see
//! [`common::host::serial`]): they load the machine, measure CPU time and check host-wide
//! state.

mod common;

use common::host::{Run, airlock_run, assert_nothing_left, serial};
use common::ok_stdout;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

// ---------------------------------------------------------------------------------------
// Helpers (local to this file; the shared ones live in common/mod.rs and common/host.rs).
// ---------------------------------------------------------------------------------------

const MIB: u64 = 1 << 20;

/// `airlock run --json OPTIONS -- python3 -c CODE`.
fn python(options: &[&str], code: &str) -> (Value, Run) {
    let mut args = vec!["--json"];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--", "python3", "-c", code]);
    let run = airlock_run(&args);
    (run.json(), run)
}

/// The host still works: it can start a process, and airlock can run a fresh sandbox.
fn assert_host_fine() {
    let status = Command::new("true")
        .status()
        .expect("the host cannot spawn `true`");
    assert!(status.success());
    let run = airlock_run(&["--json", "--", "sh", "-c", "echo alive"]);
    assert_eq!(ok_stdout(&run.json()), "alive\n");
    assert_nothing_left(run.pid);
}

fn f64_of(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number: {v:#}"))
}

fn u64_of(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not an unsigned integer: {v:#}"))
}

/// Slack over a memory cap that the peak reading may show (page-granular accounting).
const MEMORY_SLACK: u64 = 4 * MIB;

// ---------------------------------------------------------------------------------------
// Memory.
// ---------------------------------------------------------------------------------------

#[test]
fn tmpfs_pages_count_toward_memory() {
    let _guard = serial();
    // The disk is large enough for 100 MB: only the memory cap can stop the writer.
    for dir in ["/dev/shm", "/tmp", "/workspace"] {
        let script = format!("dd if=/dev/zero of={dir}/fill bs=1M count=100 && echo WROTE-ALL");
        let run = airlock_run(&[
            "--json",
            "--memory",
            "64M",
            "--disk",
            "512M",
            "--timeout",
            "30s",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        let v = run.json();
        assert_eq!(v["outcome"], "oom", "{dir}: {v:#}");
        assert_eq!(v["oom_killed"], true, "{dir}: {v:#}");
        let stdout = v["stdout"].as_str().unwrap();
        let stderr = v["stderr"].as_str().unwrap();
        assert!(
            !stdout.contains("WROTE-ALL"),
            "{dir}: 100 MB fit under a 64M cap: {v:#}"
        );
        assert!(
            !stderr.contains("No space left"),
            "{dir}: stopped by ENOSPC, not by the memory cap: {v:#}"
        );
        let peak = u64_of(&v, "memory_peak_bytes");
        assert!(
            peak <= 64 * MIB + MEMORY_SLACK,
            "{dir}: peak {peak} above the 64M cap: {v:#}"
        );
        assert_nothing_left(run.pid);
    }
}

// ---------------------------------------------------------------------------------------
// Processes and threads.
// ---------------------------------------------------------------------------------------

#[test]
fn shell_fork_bomb_is_contained() {
    let _guard = serial();
    let run = airlock_run(&[
        "--json",
        "--pids",
        "32",
        "--timeout",
        "3s",
        "--",
        "sh",
        "-c",
        "bomb() { bomb | bomb & }; bomb; sleep 100",
    ]);
    let v = run.json();
    let outcome = v["outcome"].as_str().unwrap();
    assert!(["timeout", "exited"].contains(&outcome), "{v:#}");
    assert!(
        run.elapsed < Duration::from_secs(15),
        "a 3 s fork bomb took {:?}",
        run.elapsed
    );
    assert_nothing_left(run.pid);
    assert_host_fine();
}

#[test]
fn python_fork_loop_is_contained_until_the_deadline() {
    let _guard = serial();
    // Every process forks forever; the run can only end at the deadline.
    let code = "import os, time\n\
                while True:\n    \
                    try:\n        \
                        os.fork()\n    \
                    except OSError:\n        \
                        time.sleep(0.05)\n";
    let (v, run) = python(&["--pids", "32", "--memory", "512M", "--timeout", "3s"], code);
    assert_eq!(v["outcome"], "timeout", "{v:#}");
    assert_eq!(v["timed_out"], true, "{v:#}");
    assert!(
        run.elapsed < Duration::from_secs(15),
        "a 3 s fork loop took {:?}",
        run.elapsed
    );
    assert_nothing_left(run.pid);
    assert_host_fine();
}

#[test]
fn thread_loop_hits_the_pids_limit() {
    let _guard = serial();
    let code = "import threading\n\
                stop = threading.Event()\n\
                n = 0\n\
                try:\n    \
                    while n < 1000:\n        \
                        threading.Thread(target=stop.wait, daemon=True).start()\n        \
                        n += 1\n\
                except RuntimeError as e:\n    \
                    print(n, e)\n\
                stop.set()\n";
    let (v, run) = python(&["--pids", "32", "--timeout", "30s"], code);
    let out = ok_stdout(&v);
    let (n, err) = out
        .trim()
        .split_once(' ')
        .unwrap_or_else(|| panic!("no thread failure reported: {v:#}"));
    let n: u32 = n.parse().unwrap();
    assert!(err.contains("can't start new thread"), "{v:#}");
    // 32 tasks: the main thread and 31 more; allow a little either way.
    assert!(
        (24..=32).contains(&n),
        "thread start failed after {n} threads with --pids 32: {v:#}"
    );
    assert_nothing_left(run.pid);
}

// ---------------------------------------------------------------------------------------
// CPU.
// ---------------------------------------------------------------------------------------

/// Python that spins for 2 s of wall-clock time, then exits.
const BUSY_2S: &str = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 2: pass";

#[test]
fn cpu_quota_is_enforced() {
    let _guard = serial();
    let (low, run) = python(&["--cpus", "0.25", "--timeout", "30s"], BUSY_2S);
    assert_eq!(low["outcome"], "exited", "{low:#}");
    assert_nothing_left(run.pid);
    let (high, run) = python(&["--cpus", "1", "--timeout", "30s"], BUSY_2S);
    assert_eq!(high["outcome"], "exited", "{high:#}");
    assert_nothing_left(run.pid);

    let (low_cpu, low_wall) = (f64_of(&low, "cpu_ms"), f64_of(&low, "wall_ms"));
    let high_cpu = f64_of(&high, "cpu_ms");
    // 0.25 cores over the run, +50% and 300 ms for accounting and start-up bursts.
    let bound = 0.25 * low_wall * 1.5 + 300.0;
    assert!(
        low_cpu <= bound,
        "--cpus 0.25: cpu_ms {low_cpu} > {bound} over wall_ms {low_wall}: {low:#}"
    );
    assert!(low_cpu > 0.0, "{low:#}");
    assert!(
        high_cpu > 1.4 * low_cpu,
        "--cpus 1 did not get noticeably more CPU than --cpus 0.25: {high_cpu} ms vs {low_cpu} ms"
    );
}

// ---------------------------------------------------------------------------------------
// Output.
// ---------------------------------------------------------------------------------------

#[test]
fn endless_output_flood_ends_at_the_deadline() {
    let _guard = serial();
    let run = airlock_run(&["--json", "--output-limit", "1K", "--timeout", "2s", "--", "yes"]);
    let v = run.json();
    assert_eq!(v["outcome"], "timeout", "{:?}", v["outcome"]);
    assert_eq!(v["stdout"].as_str().unwrap(), "y\n".repeat(512));
    assert_eq!(v["stdout_truncated"], true);
    let bytes = u64_of(&v, "stdout_bytes");
    assert!(
        bytes > MIB,
        "`yes` for 2 s wrote only {bytes} bytes: output was not drained"
    );
    assert!(
        run.elapsed < Duration::from_secs(8),
        "a 2 s deadline with a flood took {:?}",
        run.elapsed
    );
    assert_nothing_left(run.pid);
}

#[test]
fn live_output_is_cut_at_the_limit_too() {
    let _guard = serial();
    let code = "import sys\nsys.stdout.buffer.write(b'z' * (5 << 20))";
    let run = airlock_run(&[
        "--output-limit",
        "1K",
        "--timeout",
        "60s",
        "--",
        "python3",
        "-c",
        code,
    ]);
    assert_eq!(run.out.status.code(), Some(0), "{run:?}");
    assert_eq!(
        run.out.stdout.len(),
        1024,
        "airlock's own stdout got {} bytes",
        run.out.stdout.len()
    );
    assert!(run.out.stdout.iter().all(|&b| b == b'z'));
    assert_nothing_left(run.pid);
}

// ---------------------------------------------------------------------------------------
// Disk and files.
// ---------------------------------------------------------------------------------------

#[test]
fn writable_tmpfs_is_capped_with_enospc() {
    let _guard = serial();
    // Two 5 MB files in each writable place with --disk 8M: the second cannot fit,
    // whether the places share one 8M budget or have one each.
    let code = "import errno, os\n\
                for d in ['/tmp', '/workspace', '/dev/shm']:\n    \
                    written, err = 0, None\n    \
                    try:\n        \
                        for name in ['a', 'b']:\n            \
                            fd = os.open(f'{d}/{name}', os.O_WRONLY | os.O_CREAT)\n            \
                            try:\n                \
                                for _ in range(5):\n                    \
                                    os.write(fd, b'\\0' * (1 << 20))\n                    \
                                    written += 1 << 20\n            \
                            finally:\n                \
                                os.close(fd)\n    \
                    except OSError as e:\n        \
                        err = errno.errorcode.get(e.errno)\n    \
                    print(d, err, written)\n    \
                    for name in ['a', 'b']:\n        \
                        try: os.remove(f'{d}/{name}')\n        \
                        except OSError: pass\n";
    let (v, run) = python(&["--disk", "8M", "--memory", "256M", "--timeout", "30s"], code);
    let out = ok_stdout(&v);
    assert_eq!(out.lines().count(), 3, "{v:#}");
    for line in out.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(
            fields[1], "ENOSPC",
            "{line}: 10 MB did not hit ENOSPC with --disk 8M"
        );
        let written: u64 = fields[2].parse().unwrap();
        assert!(written <= 8 * MIB, "{line}: more than --disk 8M was written");
    }
    assert_eq!(v["oom_killed"], false, "{v:#}");
    assert_nothing_left(run.pid);
}

#[test]
fn file_size_is_capped_by_rlimit_fsize() {
    let _guard = serial();
    // A sparse file uses no tmpfs space: only RLIMIT_FSIZE stops a write past the cap.
    // (python3 ignores SIGXFSZ, so the write fails with EFBIG instead of killing it.)
    let code = "import errno, os, resource\n\
                soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)\n\
                print(soft, hard)\n\
                fd = os.open('/tmp/sparse', os.O_WRONLY | os.O_CREAT)\n\
                os.lseek(fd, (8 << 20) + (1 << 20), os.SEEK_SET)\n\
                try:\n    \
                    os.write(fd, b'x')\n    \
                    print('wrote past the cap')\n\
                except OSError as e:\n    \
                    print(errno.errorcode.get(e.errno))\n";
    let (v, run) = python(&["--disk", "8M", "--timeout", "30s"], code);
    let out = ok_stdout(&v);
    let mut lines = out.lines();
    let limits: Vec<i64> = lines
        .next()
        .unwrap()
        .split(' ')
        .map(|s| s.parse().unwrap())
        .collect();
    for l in &limits {
        assert!(
            *l >= 0 && *l as u64 <= 8 * MIB,
            "RLIMIT_FSIZE {limits:?} is not capped at --disk 8M"
        );
    }
    assert_eq!(lines.next(), Some("EFBIG"), "{v:#}");
    assert_nothing_left(run.pid);
}

#[test]
fn inode_count_is_capped() {
    let _guard = serial();
    let code = "import errno\n\
                n, err = 0, None\n\
                try:\n    \
                    while n < 200000:\n        \
                        open(f'/tmp/f{n}', 'w').close()\n        \
                        n += 1\n\
                except OSError as e:\n    \
                    err = errno.errorcode.get(e.errno)\n\
                print(n, err)\n";
    let (v, run) = python(&["--disk", "8M", "--timeout", "60s"], code);
    let out = ok_stdout(&v);
    let (n, err) = out.trim().split_once(' ').unwrap();
    let n: u64 = n.parse().unwrap();
    assert_eq!(
        err, "ENOSPC",
        "{n} empty files were created without hitting an inode cap: {v:#}"
    );
    assert!(n < 200_000, "{v:#}");
    assert_nothing_left(run.pid);
}

#[test]
fn rlimits_forbid_core_dumps_and_bound_open_files() {
    let _guard = serial();
    let run = airlock_run(&[
        "--json",
        "--",
        "sh",
        "-c",
        "ulimit -c; ulimit -Hc; ulimit -n; ulimit -Hn",
    ]);
    let v = run.json();
    let out = ok_stdout(&v);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{v:#}");
    assert_eq!(lines[0], "0", "soft RLIMIT_CORE: {v:#}");
    assert_eq!(lines[1], "0", "hard RLIMIT_CORE: {v:#}");
    for (which, line) in [("soft", lines[2]), ("hard", lines[3])] {
        let n: u64 = line
            .parse()
            .unwrap_or_else(|_| panic!("{which} RLIMIT_NOFILE is {line:?}"));
        assert!(
            (64..=65536).contains(&n),
            "{which} RLIMIT_NOFILE {n} is not a sane bound"
        );
    }
    assert_nothing_left(run.pid);
}

#[test]
fn open_files_stop_at_rlimit_nofile() {
    let _guard = serial();
    let code = "import errno, os, resource\n\
                soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n\
                fds = []\n\
                try:\n    \
                    while len(fds) < 1000000:\n        \
                        fds.append(os.open('/dev/null', os.O_RDONLY))\n\
                except OSError as e:\n    \
                    print(soft, len(fds), errno.errorcode.get(e.errno))\n";
    let (v, run) = python(&["--timeout", "60s"], code);
    let out = ok_stdout(&v);
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{v:#}");
    let soft: u64 = fields[0].parse().unwrap();
    let opened: u64 = fields[1].parse().unwrap();
    assert_eq!(fields[2], "EMFILE", "{v:#}");
    assert!(opened < soft, "{v:#}");
    assert_nothing_left(run.pid);
}

// ---------------------------------------------------------------------------------------
// Usage.
// ---------------------------------------------------------------------------------------

#[test]
fn usage_is_reported() {
    let _guard = serial();
    let code = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 0.2: pass";
    let (v, run) = python(&["--cpus", "1", "--timeout", "30s"], code);
    assert_eq!(v["outcome"], "exited", "{v:#}");
    let cpu = f64_of(&v, "cpu_ms");
    let wall = f64_of(&v, "wall_ms");
    let setup = f64_of(&v, "setup_ms");
    let peak = u64_of(&v, "memory_peak_bytes");
    assert!(cpu > 20.0, "a 200 ms busy loop reported cpu_ms {cpu}: {v:#}");
    assert!(wall >= 200.0, "a 200 ms loop reported wall_ms {wall}: {v:#}");
    assert!(
        wall < run.elapsed.as_secs_f64() * 1000.0 + 50.0,
        "wall_ms {wall} exceeds the observed {:?}",
        run.elapsed
    );
    assert!(setup > 0.0, "setup_ms {setup}: {v:#}");
    assert!(
        peak > MIB,
        "memory_peak_bytes {peak} is too small for python3: {v:#}"
    );
    assert_nothing_left(run.pid);
}
