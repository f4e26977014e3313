//! What a run produced: the `ExecResult` JSON that the CLI, the service, the SDK and the
//! tests share. Fields may be added, never renamed.

use serde::{Deserialize, Serialize};

/// How the program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// It exited by itself; `exit_code` says how.
    Exited,
    /// A signal ended it (not airlock's deadline, not the memory cap).
    Signaled,
    /// The wall-clock deadline passed and airlock killed the sandbox.
    Timeout,
    /// The kernel's OOM killer acted in the sandbox's cgroup.
    Oom,
}

impl Outcome {
    /// The one rule for `outcome`, the same on every tier: what ended the run. The
    /// deadline first (airlock killed the program, whatever happened before: an earlier
    /// OOM kill of a child still shows in `oom_killed`), then the memory cap (the OOM
    /// killer acted in the sandbox during the exec, even if the program carried on and
    /// exited), then how the top process ended (`exited`: by itself, with an exit code).
    pub fn of(oom_killed: bool, timed_out: bool, exited: bool) -> Outcome {
        if timed_out {
            Outcome::Timeout
        } else if oom_killed {
            Outcome::Oom
        } else if exited {
            Outcome::Exited
        } else {
            Outcome::Signaled
        }
    }
}

/// The structured result of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecResult {
    /// The sandbox's id.
    pub id: String,
    /// How the program ended.
    pub outcome: Outcome,
    /// How the program's own top process ended, whatever the outcome: its exit status
    /// if it exited (a shell that carried on after its child was OOM-killed and exited 0
    /// reports `oom` with `exit_code` 0), else null.
    pub exit_code: Option<i32>,
    /// The signal that ended the top process (SIGKILL when the deadline or the memory
    /// cap killed it), else null. Exactly one of `exit_code` and `signal` is set.
    pub signal: Option<i32>,
    /// Whether the deadline killed it.
    pub timed_out: bool,
    /// Whether the OOM killer acted in the sandbox.
    pub oom_killed: bool,
    /// Captured stdout, UTF-8 with invalid bytes replaced, at most the output limit.
    pub stdout: String,
    /// Captured stderr, likewise.
    pub stderr: String,
    /// Whether stdout was cut at the output limit.
    pub stdout_truncated: bool,
    /// Whether stderr was cut at the output limit.
    pub stderr_truncated: bool,
    /// Every byte the program wrote to stdout, kept or not.
    pub stdout_bytes: u64,
    /// Every byte the program wrote to stderr, kept or not.
    pub stderr_bytes: u64,
    /// From the program's execve to its end, in milliseconds.
    pub wall_ms: f64,
    /// Provisioning the sandbox before the program's execve, in milliseconds.
    pub setup_ms: f64,
    /// CPU time of everything in the sandbox, from its cgroup.
    pub cpu_ms: f64,
    /// Peak memory of the sandbox's cgroup, tmpfs pages included.
    pub memory_peak_bytes: u64,
    /// Every connection or request the egress proxy saw, denied ones included (empty
    /// when the network policy is `none`).
    #[serde(default)]
    pub egress: Vec<EgressEntry>,
    /// The tier that ran the program.
    #[serde(default)]
    pub isolation: crate::Isolation,
    /// How that tier ran it: gVisor's platform (`ptrace`, `systrap`, `kvm`), a
    /// micro-VM's accelerator (`kvm`, `tcg`); `null` for namespaces.
    #[serde(default)]
    pub platform: Option<String>,
    /// What the program created, modified or deleted under the spec's `files_changed_in`
    /// (/workspace unless asked otherwise), sorted by path, at most
    /// [`MAX_FILES_CHANGED`] entries.
    #[serde(default)]
    pub files_changed: Vec<FileChange>,
    /// Whether more changed than `files_changed` lists.
    #[serde(default)]
    pub files_changed_truncated: bool,
}

/// A result lists at most this many changed files.
pub const MAX_FILES_CHANGED: usize = 1000;

/// One path an exec created, modified or deleted. A rename is the old path deleted and
/// the new one created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FileChange {
    /// The absolute path inside the sandbox (`/workspace/out/report.csv`).
    pub path: String,
    /// What happened to it.
    pub change: Change,
    /// What it is now (for a deleted path: what it was).
    pub kind: FileKind,
    /// Its size now in bytes (for a deleted path: the size it had; 0 for directories,
    /// a symlink's target length for symlinks).
    pub bytes: u64,
}

/// What happened to a path during an exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// It did not exist before and does now.
    Created,
    /// It existed before and after, and its content, size, mode or kind changed.
    Modified,
    /// It existed before and does not now.
    Deleted,
}

/// What a changed path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
}

/// One connection or request through the egress proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EgressEntry {
    /// What the entry records: a request through the proxy variables, a connection
    /// redirected to the proxy, a DNS query, or a change of the policy.
    #[serde(default)]
    pub kind: EgressKind,
    /// The host asked for (a name or an address literal, as the program wrote it).
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// The address connected to (or the denied one), when resolution got that far.
    pub addr: Option<String>,
    /// Whether the proxy let it through.
    pub allowed: bool,
    /// Why: `"allowed by pypi.org"`, `"not in allowlist"`, `"link-local address 169.254.169.254"`.
    pub reason: String,
    /// Bytes from the program to the remote host.
    pub bytes_up: u64,
    /// Bytes from the remote host to the program.
    pub bytes_down: u64,
    /// From the request to the end of the connection, in milliseconds.
    pub ms: f64,
}

/// What an [`EgressEntry`] records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum EgressKind {
    /// A request the program sent to the proxy (`HTTP_PROXY`, `HTTPS_PROXY`).
    #[default]
    Proxy,
    /// A connection the program made directly, redirected to the proxy.
    Redirected,
    /// A DNS query to airlock's resolver (`host` is the name asked for).
    Dns,
    /// A change of the session's policy (`reason` says what changed).
    Policy,
}

/// One entry of a sandbox's /workspace listing (every tier lists the same way).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path relative to /workspace.
    pub path: String,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Whether it is a directory.
    pub dir: bool,
}

impl ExecResult {
    /// The exit status `airlock run` uses without `--json`: the program's code,
    /// 128+N for signal N, 124 on timeout, 137 when the memory cap killed it.
    pub fn shell_status(&self) -> i32 {
        match self.outcome {
            Outcome::Exited => self.exit_code.unwrap_or(1),
            Outcome::Timeout => 124,
            Outcome::Oom => 137,
            Outcome::Signaled => 128 + self.signal.unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_rule_is_deadline_then_memory_then_the_top_process() {
        for (oom, timeout, exited, want) in [
            (true, true, false, Outcome::Timeout),
            (false, true, false, Outcome::Timeout),
            (true, false, true, Outcome::Oom),
            (true, false, false, Outcome::Oom),
            (false, false, true, Outcome::Exited),
            (false, false, false, Outcome::Signaled),
        ] {
            assert_eq!(
                Outcome::of(oom, timeout, exited),
                want,
                "{oom} {timeout} {exited}"
            );
        }
    }

    #[test]
    fn json_field_names_are_the_contract() {
        let r = ExecResult {
            id: "x".into(),
            outcome: Outcome::Oom,
            exit_code: None,
            signal: Some(9),
            timed_out: false,
            oom_killed: true,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_bytes: 0,
            stderr_bytes: 0,
            wall_ms: 1.0,
            setup_ms: 1.0,
            cpu_ms: 1.0,
            memory_peak_bytes: 1,
            egress: vec![],
            isolation: crate::Isolation::Gvisor,
            platform: Some("ptrace".into()),
            files_changed: vec![FileChange {
                path: "/workspace/a".into(),
                change: Change::Created,
                kind: FileKind::File,
                bytes: 3,
            }],
            files_changed_truncated: false,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["outcome"], "oom");
        assert!(v["exit_code"].is_null());
        for key in [
            "id",
            "outcome",
            "exit_code",
            "signal",
            "timed_out",
            "oom_killed",
            "stdout",
            "stderr",
            "stdout_truncated",
            "stderr_truncated",
            "stdout_bytes",
            "stderr_bytes",
            "wall_ms",
            "setup_ms",
            "cpu_ms",
            "memory_peak_bytes",
            "isolation",
            "platform",
            "files_changed",
            "files_changed_truncated",
        ] {
            assert!(v.get(key).is_some(), "{key}");
        }
        assert_eq!(v["files_changed"][0]["change"], "created");
        assert_eq!(v["files_changed"][0]["kind"], "file");
        assert_eq!(r.shell_status(), 137);
        let back: ExecResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }
}
