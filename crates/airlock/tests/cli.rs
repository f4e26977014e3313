//! CLI ROBUSTNESS: bad flags, unreadable inputs and a missing rootfs exit 2 with one clear
//! line on stderr, a command that cannot be run exits 126 or 127 as in a shell, and nothing
//! is left behind; `doctor` and the `--json` contract work as documented. (`--file`,
//! `--env` and a command not found, as every tier handles them, are in tests/contract.rs.)
//!
//! Every test drives the real binary. The tests of this file run one at a time (see
//! [`common::host::serial`]) because they check host-wide state after each invocation.

mod common;

use common::host::{Run, airlock, assert_nothing_left, serial};
use serde_json::Value;

// ---------------------------------------------------------------------------------------
// Helpers (local to this file; the shared ones live in common/mod.rs and common/host.rs).
// ---------------------------------------------------------------------------------------

/// Runs `airlock ARGS...` and asserts: exit 2, nothing on stdout, exactly one non-empty
/// line on stderr that contains every one of `needles`, nothing left behind. Returns it.
fn assert_usage_error(args: &[&str], needles: &[&str]) -> String {
    let Run { pid, out, .. } = airlock(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "airlock {args:?}: status {:?}, stderr: {stderr}",
        out.status
    );
    assert!(
        out.stdout.is_empty(),
        "airlock {args:?} wrote to stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "airlock {args:?}: stderr is not exactly one line: {stderr:?}"
    );
    let line = lines[0];
    assert!(!line.trim().is_empty(), "airlock {args:?}: empty error line");
    for needle in needles {
        assert!(
            line.to_lowercase().contains(&needle.to_lowercase()),
            "airlock {args:?}: the error line does not mention {needle:?}: {line:?}"
        );
    }
    assert_nothing_left(pid);
    line.to_owned()
}

/// `airlock run --json ARGS...`: the parsed result, after checking nothing is left behind.
fn run_json(args: &[&str]) -> Value {
    let mut full = vec!["run", "--json"];
    full.extend_from_slice(args);
    let Run { pid, out, .. } = airlock(&full);
    assert_eq!(
        out.status.code(),
        Some(0),
        "airlock {full:?}: {out:?}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    assert_nothing_left(pid);
    v
}

// ---------------------------------------------------------------------------------------
// Bad flags.
// ---------------------------------------------------------------------------------------

#[test]
fn bad_memory_size_is_rejected() {
    let _guard = serial();
    assert_usage_error(&["run", "--memory", "12X", "--", "true"], &["--memory", "12X"]);
    assert_usage_error(&["run", "--memory", "1K", "--", "true"], &["--memory"]);
}

#[test]
fn negative_cpus_is_rejected() {
    let _guard = serial();
    assert_usage_error(&["run", "--cpus=-1", "--", "true"], &["--cpus", "-1"]);
    assert_usage_error(&["run", "--cpus", "0", "--", "true"], &["--cpus"]);
    // The form a user types: the error must name --cpus, not just the stray "-1".
    assert_usage_error(&["run", "--cpus", "-1", "--", "true"], &["--cpus", "-1"]);
}

#[test]
fn zero_pids_is_rejected() {
    let _guard = serial();
    assert_usage_error(&["run", "--pids", "0", "--", "true"], &["--pids"]);
    assert_usage_error(&["run", "--pids", "many", "--", "true"], &["--pids", "many"]);
}

#[test]
fn bad_timeout_is_rejected() {
    let _guard = serial();
    assert_usage_error(
        &["run", "--timeout", "forever", "--", "true"],
        &["--timeout", "forever"],
    );
    assert_usage_error(&["run", "--timeout", "0s", "--", "true"], &["--timeout"]);
}

#[test]
fn bad_disk_and_output_limit_are_rejected() {
    let _guard = serial();
    assert_usage_error(&["run", "--disk", "lots", "--", "true"], &["--disk", "lots"]);
    assert_usage_error(
        &["run", "--output-limit", "1Q", "--", "true"],
        &["--output-limit", "1Q"],
    );
}

/// Issue 12, item 8: sizes and durations. A bare number is ambiguous (`--memory 10`
/// was 10 bytes, `--timeout 5` 5 seconds): it is refused naming the flag and the units
/// allowed, on `run` and on `serve`; `0` means the same in every unit and stays allowed.
#[test]
fn sizes_and_durations_need_a_unit() {
    let _guard = serial();
    for flag in ["--memory", "--disk", "--output-limit"] {
        let line = assert_usage_error(&["run", flag, "10", "--", "true"], &[flag, "10", "ambiguous"]);
        for unit in ["10M", "10MiB", "10B"] {
            assert!(
                line.contains(unit),
                "{flag} 10: the error does not offer {unit}: {line}"
            );
        }
    }
    let line = assert_usage_error(
        &["run", "--timeout", "5", "--", "true"],
        &["--timeout", "5", "ambiguous"],
    );
    assert!(line.contains("5s") && line.contains("5ms"), "{line}");
    for (flag, value) in [
        ("--max-memory", "4096"),
        ("--memory-budget", "8"),
        ("--max-body", "100"),
        ("--queue-timeout", "2"),
        ("--grace", "10"),
        ("--max-session-ttl", "3600"),
    ] {
        assert_usage_error(
            &["serve", "--listen", "127.0.0.1:0", flag, value],
            &[flag, "ambiguous"],
        );
    }
    // With units, the same values work; `0` needs none.
    let v = run_json(&[
        "--memory",
        "64MiB",
        "--disk",
        "8M",
        "--output-limit",
        "0",
        "--timeout",
        "5s",
        "--",
        "echo",
        "hi",
    ]);
    assert_eq!(v["exit_code"], 0, "{v}");
    assert_eq!(v["stdout"], "", "--output-limit 0 keeps nothing: {v}");
    assert_eq!(v["stdout_bytes"], 3, "{v}");
}

/// Issue 12, item 8: `--timeout -1` said to write `-- -1`, which would run `-1` as the
/// command. A negative size or duration is an invalid value of its flag.
#[test]
fn timeout_minus_one_says_the_value_is_invalid() {
    let _guard = serial();
    for (flag, value) in [
        ("--timeout", "-1"),
        ("--timeout", "-5s"),
        ("--memory", "-1M"),
        ("--disk", "-1"),
    ] {
        let line = assert_usage_error(&["run", flag, value, "--", "true"], &[flag, value, "negative"]);
        assert!(
            !line.contains("-- "),
            "{flag} {value}: suggests a `--` separator: {line}"
        );
    }
    let line = assert_usage_error(&["run", "--pids", "-1", "--", "true"], &["--pids", "-1"]);
    assert!(!line.contains("-- "), "{line}");
    for cmd in ["serve", "mcp"] {
        let line = assert_usage_error(&[cmd, "--default-ttl", "-1"], &["--default-ttl", "negative"]);
        assert!(!line.contains("-- "), "{cmd}: {line}");
    }
    assert_usage_error(&["mcp", "--max-ttl", "600"], &["--max-ttl", "ambiguous"]);
}

/// Issue 12, item 8: limits are printed in the units they were given (`64 MiB`, `2 s`),
/// not as `67108864 byte` or `2000 ms`, on the CLI and in the API's and spec's errors.
#[test]
fn limits_are_printed_in_the_units_given() {
    let _guard = serial();
    let Run { pid, out, .. } = airlock(&[
        "run",
        "--memory",
        "32M",
        "--timeout",
        "30s",
        "--",
        "python3",
        "-c",
        "x = bytearray(200 << 20)",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the 32 MiB memory limit (--memory)"), "{stderr}");
    assert_nothing_left(pid);
    let Run { pid, out, .. } = airlock(&["run", "--timeout", "500ms", "--", "sleep", "5"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("killed at the 500 ms deadline"), "{stderr}");
    assert_nothing_left(pid);
    let Run { pid, out, .. } = airlock(&[
        "run",
        "--timeout",
        "2m",
        "--output-limit",
        "1K",
        "--",
        "head",
        "-c",
        "5000",
        "/dev/zero",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--output-limit 1 KiB (4.9 KiB written in all)")
            || stderr.contains("--output-limit 1 KiB (5000 bytes written in all)"),
        "{stderr}"
    );
    assert_nothing_left(pid);
    // The spec's bounds, through the CLI: sizes in binary units.
    let line = assert_usage_error(&["run", "--memory", "1K", "--", "true"], &["--memory"]);
    assert!(line.contains("between 4 MiB and 1 TiB, got 1 KiB"), "{line}");
    let line = assert_usage_error(&["run", "--timeout", "25h", "--", "true"], &["--timeout"]);
    assert!(line.contains("between 1 ms and 24 h, got 25 h"), "{line}");
}

#[test]
fn unknown_flag_is_rejected() {
    let _guard = serial();
    assert_usage_error(&["run", "--frobnicate", "--", "true"], &["--frobnicate"]);
    assert_usage_error(&["run", "--frobnicate"], &["--frobnicate"]);
}

#[test]
fn missing_command_is_rejected() {
    let _guard = serial();
    for args in [
        &["run"][..],
        &["run", "--json"],
        &["run", "--"],
        &["run", "--memory", "128M"],
    ] {
        assert_usage_error(args, &["command"]);
    }
}

// ---------------------------------------------------------------------------------------
// Nonexistent command, unreadable inputs, rootfs without the command.
// ---------------------------------------------------------------------------------------

/// A command that cannot be found or run ends as in a shell (issue 12, item 8): 127 when
/// it is not found, 126 when it is found but cannot be executed, with one line on its
/// stderr (a bare name not found, and its `--json` result, on every tier: contract.rs).
#[test]
fn command_not_found_exits_127_as_in_a_shell() {
    let _guard = serial();
    let wrapper = tempfile::tempdir().unwrap();
    let script = wrapper.path().join("s.sh");
    std::fs::write(&script, "#!/no/such/interpreter\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let file = format!("{}:s.sh", script.display());
    // A bare name not found, and its --json result, are in tests/contract.rs (every tier).
    for (args, status, needle) in [
        (
            vec!["run", "--", "/nonexistent/bin/prog"],
            127,
            "/nonexistent/bin/prog",
        ),
        // Exists but is not executable.
        (vec!["run", "--", "/etc/passwd"], 126, "/etc/passwd"),
        // Its interpreter is missing.
        (vec!["run", "--file", &file, "--", "./s.sh"], 127, "interpreter"),
    ] {
        let Run { pid, out, .. } = airlock(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("airlock: ") && stderr.contains(needle),
            "{args:?}: {stderr}"
        );
        assert_nothing_left(pid);
    }
}

#[test]
fn nonexistent_file_is_rejected_by_name() {
    let _guard = serial();
    let src = "/nonexistent/airlock-test/input.txt";
    assert_usage_error(
        &["run", "--file", &format!("{src}:input.txt"), "--", "true"],
        &["--file", src],
    );
}

#[test]
fn directory_as_file_is_rejected_by_name() {
    let _guard = serial();
    let (dir, _) = common::setup("file-dir");
    let src = dir.path().to_str().unwrap();
    assert_usage_error(
        &["run", "--file", &format!("{src}:x"), "--", "true"],
        &["--file", src],
    );
}

#[test]
fn unreadable_stdin_file_is_rejected_by_name() {
    let _guard = serial();
    let path = "/nonexistent/airlock-test/stdin.txt";
    assert_usage_error(&["run", "--stdin", path, "--", "cat"], &["--stdin", path]);
}

#[test]
fn rootfs_without_the_command_is_a_clear_error() {
    let _guard = serial();
    let (dir, _) = common::setup("rootfs-empty");
    for sub in ["usr/bin", "etc"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    let root = dir.path().to_str().unwrap();
    // As in a shell: the sandbox ran, the command was not found in it.
    let Run { pid, out, .. } = airlock(&["run", "--rootfs", root, "--", "python3", "-c", "print(1)"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{stderr}");
    assert!(stderr.contains("python3: command not found"), "{stderr}");
    assert_nothing_left(pid);
    assert_usage_error(
        &["run", "--rootfs", "/nonexistent/airlock-root", "--", "true"],
        &["/nonexistent/airlock-root"],
    );
}

// ---------------------------------------------------------------------------------------
// --file and --env.
// ---------------------------------------------------------------------------------------

#[test]
fn env_without_equals_is_rejected() {
    let _guard = serial();
    assert_usage_error(
        &["run", "--env", "NOEQUALS", "--", "true"],
        &["--env", "NOEQUALS"],
    );
    assert_usage_error(&["run", "--env", "=value", "--", "true"], &["--env"]);
}

// ---------------------------------------------------------------------------------------
// doctor.
// ---------------------------------------------------------------------------------------

#[test]
fn doctor_reports_every_feature() {
    let _guard = serial();
    let Run { pid, out, .. } = airlock(&["doctor"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "doctor failed on this host:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<String> = stdout.lines().map(str::to_lowercase).collect();
    for feature in [
        "user namespaces",
        "cgroup",
        "seccomp",
        "landlock",
        "clone3",
        "pidfd",
        "cgroup.kill",
        "proxy mode: tun + nf_tables",
        "/dev/kvm",
    ] {
        assert!(
            lines.iter().any(|l| l.contains(feature)),
            "doctor has no line for {feature:?}:\n{stdout}"
        );
    }
    assert_nothing_left(pid);
}

/// Issue 12, item 8: `airlock doctor` as a non-root user says "needs root" (with what to
/// do) where a check needs root, instead of suggesting packages or kernel modules, exits
/// non-zero, and prints no Rust debug formatting. (Issue 18: the namespace tier runs
/// without root given a delegated cgroup; nobody has none.)
#[test]
fn doctor_as_a_non_root_user_says_needs_root() {
    use std::os::unix::process::CommandExt;
    let _guard = serial();
    let out = std::process::Command::new(common::airlock_bin())
        .arg("doctor")
        .uid(65534)
        .gid(65534)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run airlock doctor as nobody");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let line = |name: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no {name:?} line in:\n{stdout}"))
            .to_owned()
    };
    // Not being root is no failure in itself (docs/rootless.md): the preflight says it
    // runs rootless, and fails here on what a user lacks (no delegated cgroup).
    let preflight = line("preflight");
    assert!(
        preflight.starts_with("FAIL") && preflight.contains("rootless, as uid 65534"),
        "{preflight}"
    );
    let cgroup = line("cgroup");
    assert!(
        cgroup.starts_with("FAIL") && cgroup.contains("cannot isolate: a cgroup"),
        "{cgroup}"
    );
    let micro = line("microvm");
    assert!(micro.contains("needs root"), "{micro}");
    if std::path::Path::new("/dev/kvm").exists() {
        let kvm = line("/dev/kvm");
        assert!(kvm.contains("needs root"), "{kvm}");
    }
    for wrong in ["apt-get", "kvm_intel", "modprobe", "Some(", "None", "Err(", "Ok("] {
        assert!(
            !stdout.contains(wrong),
            "doctor as non-root says {wrong:?}:\n{stdout}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The --json contract.
// ---------------------------------------------------------------------------------------

#[test]
fn json_result_has_every_contract_field() {
    let _guard = serial();
    let v = run_json(&["--", "sh", "-c", "echo out; echo err >&2"]);
    let obj = v.as_object().unwrap_or_else(|| panic!("not an object: {v:#}"));
    let strings = ["id", "outcome", "stdout", "stderr"];
    let bools = ["timed_out", "oom_killed", "stdout_truncated", "stderr_truncated"];
    let counts = ["stdout_bytes", "stderr_bytes", "memory_peak_bytes"];
    let millis = ["wall_ms", "setup_ms", "cpu_ms"];
    for key in strings {
        assert!(
            obj.get(key).is_some_and(Value::is_string),
            "{key} missing or not a string: {v:#}"
        );
    }
    for key in bools {
        assert!(
            obj.get(key).is_some_and(Value::is_boolean),
            "{key} missing or not a bool: {v:#}"
        );
    }
    for key in counts {
        assert!(
            obj.get(key).is_some_and(Value::is_u64),
            "{key} missing or not a count: {v:#}"
        );
    }
    for key in millis {
        let ms = obj.get(key).and_then(Value::as_f64);
        assert!(
            ms.is_some_and(|ms| ms >= 0.0),
            "{key} missing or not a duration: {v:#}"
        );
    }
    for key in ["exit_code", "signal"] {
        assert!(obj.contains_key(key), "{key} missing: {v:#}");
    }
    assert!(!v["id"].as_str().unwrap().is_empty());
    assert_eq!(v["outcome"], "exited");
    assert_eq!(v["exit_code"], 0);
    assert!(v["signal"].is_null());
    assert_eq!(v["timed_out"], false);
    assert_eq!(v["oom_killed"], false);
    assert_eq!(v["stdout"], "out\n");
    assert_eq!(v["stderr"], "err\n");
    assert_eq!(v["stdout_truncated"], false);
    assert_eq!(v["stderr_truncated"], false);
    assert_eq!(v["stdout_bytes"], 4);
    assert_eq!(v["stderr_bytes"], 4);
    assert!(v["wall_ms"].as_f64().unwrap() > 0.0);
}

#[test]
fn json_output_replaces_invalid_utf8() {
    let _guard = serial();
    let v = run_json(&["--", "sh", "-c", "printf 'a\\377b'; printf '\\300' >&2"]);
    assert_eq!(v["stdout"], "a\u{fffd}b", "{v:#}");
    assert_eq!(v["stderr"], "\u{fffd}", "{v:#}");
    assert_eq!(v["stdout_bytes"], 3, "bytes count what the program wrote: {v:#}");
    assert_eq!(v["stderr_bytes"], 1, "{v:#}");
}

#[test]
fn json_ids_differ_between_runs() {
    let _guard = serial();
    let a = run_json(&["--", "true"]);
    let b = run_json(&["--", "true"]);
    assert_ne!(a["id"], b["id"], "two runs got the same id");
}
