//! Shared helpers for the integration tests: every test drives the real `airlock` binary.
#![allow(dead_code)]

pub mod docs;
pub mod host;
pub mod ws;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The binary under test.
pub fn airlock_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_airlock"))
}

/// A temp dir for the test's host-side files, and a command builder for `airlock run`.
pub fn setup(name: &str) -> (tempfile::TempDir, TestCommand) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("airlock-test-{name}-"))
        .tempdir()
        .expect("tempdir");
    (dir, TestCommand::run())
}

/// Builder for one `airlock` invocation.
#[derive(Debug)]
pub struct TestCommand {
    cmd: Command,
    stdin: Option<Vec<u8>>,
}

impl TestCommand {
    /// `airlock run` with no options yet.
    pub fn run() -> Self {
        let mut cmd = Command::new(airlock_bin());
        cmd.arg("run");
        TestCommand { cmd, stdin: None }
    }

    /// Any `airlock` subcommand.
    pub fn sub(args: &[&str]) -> Self {
        let mut cmd = Command::new(airlock_bin());
        cmd.args(args);
        TestCommand { cmd, stdin: None }
    }

    /// Adds options/arguments.
    pub fn args<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(mut self, args: I) -> Self {
        self.cmd.args(args);
        self
    }

    /// Sets an environment variable for airlock itself (the host side).
    pub fn host_env(mut self, k: &str, v: &str) -> Self {
        self.cmd.env(k, v);
        self
    }

    /// What airlock's own stdin receives.
    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(data.into());
        self
    }

    /// Runs to completion and returns the raw output.
    pub fn output(mut self) -> Output {
        use std::io::Write;
        self.cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        self.cmd.stdin(if self.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = self.cmd.spawn().expect("spawn airlock");
        if let Some(data) = self.stdin.take() {
            let mut w = child.stdin.take().unwrap();
            std::thread::spawn(move || {
                let _ = w.write_all(&data);
            });
        }
        child.wait_with_output().expect("wait airlock")
    }

    /// Runs with `--json -- argv...` and parses the result; panics unless airlock exits 0.
    pub fn json(self, argv: &[&str]) -> Value {
        let out = self.args(["--json", "--"]).args(argv).output();
        assert!(
            out.status.success(),
            "airlock failed: status {:?}\nstderr: {}\nstdout: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// `--json -- python3 -c CODE`.
    pub fn python(self, code: &str) -> Value {
        self.json(&["python3", "-c", code])
    }

    /// `--json -- sh -c SCRIPT`.
    pub fn sh(self, script: &str) -> Value {
        self.json(&["sh", "-c", script])
    }
}

/// Asserts the program exited 0 (an ExecResult of `--json` or of the service) and returns
/// its stdout.
#[track_caller]
pub fn ok_stdout(v: &Value) -> String {
    assert_eq!(v["outcome"], "exited", "{v:#}");
    assert_eq!(v["exit_code"], 0, "{v:#}");
    v["stdout"].as_str().expect("stdout").to_owned()
}

/// Compiles a C program from `tests/attacks/NAME.c` into `dir`, returns the binary's path.
pub fn compile_attack(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/attacks")
        .join(format!("{name}.c"));
    let out = dir.join(name);
    let status = Command::new("gcc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run gcc");
    assert!(status.success(), "gcc failed for {}", src.display());
    out
}

/// Host processes whose uid lies in airlock's sandbox range, one `"<pid>: <first line of
/// /proc/<pid>/status>"` each (see [`sandbox_process_pid`]).
pub fn sandbox_processes() -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let uid: u32 = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|u| u.parse().ok())
            .unwrap_or(0);
        if uid >= airlock_sandbox::HOST_UID_BASE {
            found.push(format!(
                "{}: {}",
                name.to_string_lossy(),
                status.lines().next().unwrap_or("")
            ));
        }
    }
    found
}

/// The pid of one entry of [`sandbox_processes`].
pub fn sandbox_process_pid(entry: &str) -> Option<u32> {
    entry.split(':').next().and_then(|p| p.trim().parse().ok())
}
