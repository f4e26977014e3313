//! The run request: what to execute, with which inputs, under which limits.
//! [`Spec::validate`] is the single gate every front end passes through before a sandbox
//! is built; its errors name the field and what is allowed.

use serde::{Deserialize, Serialize};

use crate::NetworkPolicy;
use std::path::{Component, Path, PathBuf};

/// Bounds on [`Limits`]. Each exists so one request cannot ask for something the host
/// cannot honor or that makes no sense as a sandbox.
mod bounds {
    /// Below this the dynamic loader and a shell cannot start at all.
    pub const MIN_MEMORY: u64 = 4 << 20;
    /// A sandbox never gets more than a terabyte; anything larger is a typo.
    pub const MAX_MEMORY: u64 = 1 << 40;
    /// 1/100 of a core: the smallest quota the CFS period of 100 ms expresses well.
    pub const MIN_CPUS: f64 = 0.01;
    pub const MAX_CPUS: f64 = 1024.0;
    /// Processes plus threads inside the sandbox (airlock's own init is not counted).
    pub const MAX_PIDS: u32 = 1 << 16;
    pub const MAX_TIMEOUT_MS: u64 = 24 * 3600 * 1000;
    /// The writable tmpfs needs room for at least a few files.
    pub const MIN_DISK: u64 = 1 << 20;
    pub const MAX_DISK: u64 = 1 << 40;
    /// Output is held in the supervisor's memory: bound it.
    pub const MAX_OUTPUT: u64 = 256 << 20;
    /// execve's own limit on the argument and environment block is 2 MiB with the
    /// default stack; staying under it gives an error here instead of E2BIG later.
    pub const MAX_ARGV_ENV_BYTES: usize = 1 << 20;
    pub const MAX_FILES: usize = 4096;
}

/// A rejected request: which field, and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// The field, in the API's spelling (`limits.memory_bytes`, `files[2].path`).
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl SpecError {
    /// A new error for `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        SpecError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Resource limits enforced on everything inside one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Memory cap in bytes for all processes, tmpfs pages included; swap is off.
    pub memory_bytes: u64,
    /// CPU quota in cores (0.5 = half of one core).
    pub cpus: f64,
    /// Maximum processes plus threads.
    pub pids: u32,
    /// Wall-clock deadline for the program, in milliseconds.
    pub timeout_ms: u64,
    /// Size of the writable tmpfs shared by /tmp, /workspace and /dev/shm.
    pub disk_bytes: u64,
    /// Bytes of stdout and of stderr kept (each); the rest is counted and dropped.
    pub output_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 256 << 20,
            cpus: 0.5,
            pids: 64,
            timeout_ms: 10_000,
            disk_bytes: 64 << 20,
            output_bytes: 1 << 20,
        }
    }
}

/// Which isolation runs the program. Both answer the same [`Spec`] with the same
/// `ExecResult`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Linux namespaces, cgroup, seccomp and landlock on the host's kernel.
    #[default]
    Namespaces,
    /// A user-space kernel: gVisor's Sentry serves the program's system calls, so the
    /// host kernel sees only the Sentry's own, narrow set.
    Gvisor,
    /// The same sandbox inside a micro-VM of its own: a guest kernel between the program
    /// and the host's.
    Microvm,
}

impl Isolation {
    /// The name used by the CLI flag and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Namespaces => "namespaces",
            Isolation::Gvisor => "gvisor",
            Isolation::Microvm => "microvm",
        }
    }
}

impl std::str::FromStr for Isolation {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "namespaces" => Ok(Isolation::Namespaces),
            "gvisor" => Ok(Isolation::Gvisor),
            "microvm" => Ok(Isolation::Microvm),
            _ => Err(SpecError::new(
                "isolation",
                format!("{s:?} is not an isolation; use namespaces, gvisor or microvm"),
            )),
        }
    }
}

/// A file placed in the work directory before the program starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpec {
    /// Destination relative to /workspace.
    pub path: String,
    /// The bytes.
    pub content: Vec<u8>,
    /// Permission bits (0o644 or 0o755).
    pub mode: u32,
}

/// One validated run request.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// argv; `command[0]` is looked up in the sandbox's PATH.
    pub command: Vec<String>,
    /// The program's whole environment beyond airlock's defaults (PATH, HOME, …).
    pub env: Vec<(String, String)>,
    /// Files copied into /workspace.
    pub files: Vec<FileSpec>,
    /// What the program reads on stdin.
    pub stdin: Vec<u8>,
    /// Resource limits.
    pub limits: Limits,
    /// A root filesystem to take the system directories from instead of the host's.
    pub rootfs: Option<PathBuf>,
    /// An OCI image to run in (a reference as the user wrote it: `python:3.12-slim`,
    /// `registry.example.com/team/tools@sha256:…`), resolved against the image store.
    pub image: Option<String>,
    /// Where the program starts (absolute); `None`: /workspace. Set from an image's
    /// `WorkingDir` when the image gives the command.
    pub workdir: Option<String>,
    /// Network policy.
    pub network: NetworkPolicy,
    /// Which isolation runs the program.
    pub isolation: Isolation,
    /// Where the result's `files_changed` looks: some of [`TRACKABLE_DIRS`] (default
    /// /workspace; empty: no changeset).
    pub files_changed_in: Vec<String>,
}

/// The directories an exec's changeset can cover (`Spec::files_changed_in`).
pub const TRACKABLE_DIRS: [&str; 2] = ["/workspace", "/tmp"];

impl Spec {
    /// A spec running `command` with default limits and nothing else.
    pub fn new(command: Vec<String>) -> Self {
        Spec {
            command,
            env: Vec::new(),
            files: Vec::new(),
            stdin: Vec::new(),
            limits: Limits::default(),
            rootfs: None,
            image: None,
            workdir: None,
            network: NetworkPolicy::None,
            isolation: Isolation::Namespaces,
            files_changed_in: vec!["/workspace".into()],
        }
    }

    /// Replaces the limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Checks every field; the first problem found is returned.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.validate_command()?;
        self.limits.validate()?;
        validate_env(&self.env)?;
        validate_files(&self.files)?;
        self.network.validate()?;
        self.network.validate_env(&self.env)?;
        if let Some(root) = &self.rootfs
            && !root.is_absolute()
        {
            return Err(SpecError::new("rootfs", "must be an absolute path"));
        }
        if let Some(image) = &self.image {
            validate_image(image)?;
        }
        if self.image.is_some() && self.rootfs.is_some() {
            return Err(SpecError::new("image", "cannot be combined with rootfs"));
        }
        if let Some(dir) = &self.workdir {
            validate_workdir(dir)?;
        }
        self.validate_isolation()?;
        for (i, dir) in self.files_changed_in.iter().enumerate() {
            if !TRACKABLE_DIRS.contains(&dir.as_str()) {
                return Err(SpecError::new(
                    format!("files_changed_in[{i}]"),
                    format!("{dir:?} cannot be tracked; use \"/workspace\" or \"/tmp\""),
                ));
            }
            if self.files_changed_in[..i].contains(dir) {
                return Err(SpecError::new(
                    format!("files_changed_in[{i}]"),
                    format!("{dir:?} is listed twice"),
                ));
            }
        }
        let block: usize = self.command.iter().map(|a| a.len() + 1).sum::<usize>()
            + self.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum::<usize>();
        if block > bounds::MAX_ARGV_ENV_BYTES {
            return Err(SpecError::new(
                "command",
                format!(
                    "arguments and environment total {block} bytes; at most {} are allowed (pass data as a file instead)",
                    bounds::MAX_ARGV_ENV_BYTES
                ),
            ));
        }
        Ok(())
    }

    /// What the micro-VM backend does not provide (yet) is refused, never ignored.
    fn validate_isolation(&self) -> Result<(), SpecError> {
        if self.isolation != Isolation::Microvm {
            return Ok(());
        }
        if self.rootfs.is_some() {
            return Err(SpecError::new(
                "rootfs",
                "is not available with isolation microvm (the guest's system directories come from its image of the host's)",
            ));
        }
        Ok(())
    }

    fn validate_command(&self) -> Result<(), SpecError> {
        let Some(first) = self.command.first() else {
            // An image may give the command (its Entrypoint and Cmd), merged later by
            // `apply_image_config`, which refuses an image that gives none.
            if self.image.is_some() {
                return Ok(());
            }
            return Err(SpecError::new("command", "is empty: give the program to run"));
        };
        if first.is_empty() {
            return Err(SpecError::new("command[0]", "is an empty string"));
        }
        for (i, arg) in self.command.iter().enumerate() {
            if arg.contains('\0') {
                return Err(SpecError::new(format!("command[{i}]"), "contains a NUL byte"));
            }
        }
        Ok(())
    }
}

/// A workdir is an absolute path a kernel accepts (no NUL, at most `PATH_MAX` bytes).
fn validate_workdir(dir: &str) -> Result<(), SpecError> {
    /// The kernel's PATH_MAX.
    const MAX_WORKDIR_BYTES: usize = 4096;
    if !dir.starts_with('/') {
        return Err(SpecError::new("workdir", "must be an absolute path"));
    }
    if dir.contains('\0') {
        return Err(SpecError::new("workdir", "contains a NUL byte"));
    }
    if dir.len() >= MAX_WORKDIR_BYTES {
        return Err(SpecError::new(
            "workdir",
            format!(
                "is {} bytes long; at most {} are allowed",
                dir.len(),
                MAX_WORKDIR_BYTES - 1
            ),
        ));
    }
    Ok(())
}

impl Limits {
    /// Checks every limit against its bounds.
    pub fn validate(&self) -> Result<(), SpecError> {
        use bounds::*;
        range_of(
            "limits.memory_bytes",
            self.memory_bytes,
            MIN_MEMORY,
            MAX_MEMORY,
            crate::format_size,
        )?;
        if !(self.cpus.is_finite() && (MIN_CPUS..=MAX_CPUS).contains(&self.cpus)) {
            return Err(SpecError::new(
                "limits.cpus",
                format!(
                    "must be between {MIN_CPUS} and {MAX_CPUS} cores, got {}",
                    self.cpus
                ),
            ));
        }
        range("limits.pids", u64::from(self.pids), 1, u64::from(MAX_PIDS))?;
        range_of(
            "limits.timeout_ms",
            self.timeout_ms,
            1,
            MAX_TIMEOUT_MS,
            crate::format_ms,
        )?;
        range_of(
            "limits.disk_bytes",
            self.disk_bytes,
            MIN_DISK,
            MAX_DISK,
            crate::format_size,
        )?;
        range_of(
            "limits.output_bytes",
            self.output_bytes,
            0,
            MAX_OUTPUT,
            crate::format_size,
        )?;
        Ok(())
    }
}

fn range(field: &str, value: u64, min: u64, max: u64) -> Result<(), SpecError> {
    range_of(field, value, min, max, |n| n.to_string())
}

/// `value` within `min..=max`, else an error printing the three with `show` (sizes as
/// `64 MiB`, durations as `10 s`).
fn range_of(field: &str, value: u64, min: u64, max: u64, show: fn(u64) -> String) -> Result<(), SpecError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(SpecError::new(
            field,
            format!(
                "must be between {} and {}, got {}",
                show(min),
                show(max),
                show(value)
            ),
        ))
    }
}

/// The longest image reference accepted: a registry host, a repository path and a tag or
/// digest fit well within it (the distribution spec caps a repository name at 255).
const MAX_IMAGE_REFERENCE: usize = 512;

/// The shape of an image reference; whether it names a stored image is the store's to say.
fn validate_image(image: &str) -> Result<(), SpecError> {
    if image.is_empty() {
        return Err(SpecError::new(
            "image",
            "is empty: name an image (python:3.12-slim) or omit it",
        ));
    }
    if image.len() > MAX_IMAGE_REFERENCE {
        return Err(SpecError::new(
            "image",
            format!(
                "is {} bytes long; at most {MAX_IMAGE_REFERENCE} are allowed",
                image.len()
            ),
        ));
    }
    if let Some(c) = image.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(SpecError::new(
            "image",
            format!("{image:?} contains {c:?}; an image reference is printable ASCII without spaces"),
        ));
    }
    Ok(())
}

fn validate_env(env: &[(String, String)]) -> Result<(), SpecError> {
    for (key, value) in env {
        let field = || format!("env.{key}");
        if key.is_empty() {
            return Err(SpecError::new("env", "a variable name is empty (expected K=V)"));
        }
        if key.contains('=') || key.contains('\0') {
            return Err(SpecError::new(field(), "the name may not contain '=' or NUL"));
        }
        if value.contains('\0') {
            return Err(SpecError::new(field(), "the value contains a NUL byte"));
        }
    }
    Ok(())
}

fn validate_files(files: &[FileSpec]) -> Result<(), SpecError> {
    if files.len() > bounds::MAX_FILES {
        return Err(SpecError::new(
            "files",
            format!(
                "{} files given; at most {} are allowed",
                files.len(),
                bounds::MAX_FILES
            ),
        ));
    }
    for (i, file) in files.iter().enumerate() {
        let field = format!("files[{i}].path");
        if file.path.is_empty() || file.path.contains('\0') {
            return Err(SpecError::new(
                field,
                "must be a non-empty path without NUL bytes",
            ));
        }
        let path = Path::new(&file.path);
        let clean = path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !clean || path.components().all(|c| matches!(c, Component::CurDir)) {
            return Err(SpecError::new(
                field,
                format!(
                    "{:?} must be a relative path inside /workspace, without '..'",
                    file.path
                ),
            ));
        }
        if file.mode & !0o777 != 0 {
            return Err(SpecError::new(
                format!("files[{i}].mode"),
                "only permission bits (0o777) are allowed",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec::new(vec!["true".into()])
    }

    #[test]
    fn defaults_are_valid() {
        spec().validate().unwrap();
    }

    #[test]
    fn errors_name_the_field() {
        let mut s = spec();
        s.limits.memory_bytes = 1;
        assert_eq!(s.validate().unwrap_err().field, "limits.memory_bytes");

        let e = s.validate().unwrap_err();
        assert_eq!(
            e.message, "must be between 4 MiB and 1 TiB, got 1 byte",
            "sizes are printed in units"
        );
        let mut s = spec();
        s.limits.timeout_ms = 25 * 3600 * 1000;
        assert_eq!(
            s.validate().unwrap_err().message,
            "must be between 1 ms and 24 h, got 25 h"
        );

        let mut s = spec();
        s.limits.cpus = f64::NAN;
        assert_eq!(s.validate().unwrap_err().field, "limits.cpus");

        let mut s = spec();
        s.command.clear();
        assert_eq!(s.validate().unwrap_err().field, "command");

        let mut s = spec();
        s.env.push(("A=B".into(), "x".into()));
        assert_eq!(s.validate().unwrap_err().field, "env.A=B");
    }

    #[test]
    fn file_paths_stay_inside_the_workspace() {
        for bad in ["", "/etc/passwd", "../x", "a/../../x", ".", "a\0b"] {
            let mut s = spec();
            s.files.push(FileSpec {
                path: bad.into(),
                content: vec![],
                mode: 0o644,
            });
            assert_eq!(s.validate().unwrap_err().field, "files[0].path", "{bad:?}");
        }
        let mut s = spec();
        s.files.push(FileSpec {
            path: "dir/sub/x.py".into(),
            content: vec![],
            mode: 0o644,
        });
        s.validate().unwrap();
    }

    #[test]
    fn isolation_parses_and_refuses_what_microvm_lacks() {
        // A micro-VM has proxy mode (through its egress port), images and a workdir, not
        // --rootfs.
        assert_eq!("microvm".parse::<Isolation>().unwrap(), Isolation::Microvm);
        assert_eq!(
            serde_json::from_str::<Isolation>(r#""namespaces""#).unwrap(),
            Isolation::Namespaces
        );
        assert_eq!("vm".parse::<Isolation>().unwrap_err().field, "isolation");
        assert_eq!(spec().isolation, Isolation::Namespaces);

        let mut s = spec();
        s.isolation = Isolation::Microvm;
        s.validate().unwrap();
        s.network = NetworkPolicy::Proxy(crate::ProxyPolicy::default());
        s.validate().unwrap();
        let mut s = spec();
        s.isolation = Isolation::Microvm;
        s.rootfs = Some("/srv/root".into());
        assert_eq!(s.validate().unwrap_err().field, "rootfs");
        let mut s = spec();
        s.isolation = Isolation::Microvm;
        s.image = Some("busybox".into());
        s.workdir = Some("/opt".into());
        s.validate().unwrap();
    }

    #[test]
    fn image_and_rootfs_together_are_refused_on_image() {
        let mut s = spec();
        s.image = Some("busybox".into());
        s.validate().unwrap();
        s.rootfs = Some("/srv/root".into());
        let err = s.validate().unwrap_err();
        assert_eq!(err.field, "image");
        assert!(
            err.to_string().contains("cannot be combined with rootfs"),
            "{err}"
        );
    }

    #[test]
    fn workdir_must_be_an_absolute_path_a_kernel_takes() {
        let mut s = spec();
        s.workdir = Some("/opt/app".into());
        s.validate().unwrap();
        for bad in ["opt", "", "/a\0b"] {
            s.workdir = Some(bad.into());
            assert_eq!(s.validate().unwrap_err().field, "workdir", "{bad:?}");
        }
        s.workdir = Some(format!("/{}", "a".repeat(5000)));
        assert_eq!(s.validate().unwrap_err().field, "workdir");
    }

    #[test]
    fn limits_json_rejects_unknown_fields() {
        let err = serde_json::from_str::<Limits>(r#"{"memory": 5}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `memory`"), "{err}");
        let l: Limits = serde_json::from_str(r#"{"pids": 5}"#).unwrap();
        assert_eq!(l.pids, 5);
        assert_eq!(l.memory_bytes, Limits::default().memory_bytes);
    }
}
