//! `airlock run [OPTIONS] [--] COMMAND [ARGS...]`.

use airlock_backend::{Capture, Error, OutputSink, Shape};
use airlock_spec::{
    FileSpec, Limits, NetworkPolicy, Spec, format_ms, format_size, human_size, parse_duration, parse_size,
};
use anyhow::{Context, bail};
use clap::Args;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::SignalFd;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

/// Reading `--stdin` is bounded: the whole input is held in memory before the run.
const MAX_STDIN: u64 = 256 << 20;

#[derive(Debug, Args)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    /// Memory cap for everything in the sandbox, tmpfs pages included (128M, 1G; a unit
    /// is required).
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = size, allow_hyphen_values = true)]
    memory: u64,
    /// CPU quota in cores (0.5 = half a core).
    #[arg(long, value_name = "N", default_value_t = 0.5, allow_negative_numbers = true)]
    cpus: f64,
    /// Processes plus threads.
    #[arg(long, value_name = "N", default_value_t = 64, allow_negative_numbers = true)]
    pids: u32,
    /// Wall-clock limit (500ms, 10s, 2m; a unit is required).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration_ms, allow_hyphen_values = true)]
    timeout: u64,
    /// Size of the writable tmpfs; /tmp, /workspace and /dev/shm share it (64M, 1G).
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = size, allow_hyphen_values = true)]
    disk: u64,
    /// Bytes kept per stream; the rest is counted and dropped (1M, 64K).
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = size, allow_hyphen_values = true)]
    output_limit: u64,
    /// Copy a host file into the sandbox (DEST relative to /workspace; default: its name).
    #[arg(long = "file", value_name = "SRC:DEST")]
    files: Vec<String>,
    /// Add an environment variable; the caller's environment is never inherited.
    #[arg(long = "env", value_name = "K=V")]
    env: Vec<String>,
    /// What the program reads: a file, or - for airlock's own stdin (default: empty).
    #[arg(long, value_name = "FILE")]
    stdin: Option<PathBuf>,
    /// A root filesystem directory to take /usr, /bin, /lib… and /etc data from.
    #[arg(long, value_name = "DIR")]
    rootfs: Option<PathBuf>,
    /// Network: `none` (only loopback, no route out) or `proxy` (out only through the
    /// filtering egress proxy, to the hosts given with --allow).
    #[arg(long = "net", value_name = "MODE", default_value = "none", value_parser = ["none", "proxy"])]
    net: String,
    /// With --net proxy: a host the program may reach (`pypi.org`, `*.pythonhosted.org`,
    /// `api.example.com:8443`; without a port, 80 and 443); repeatable.
    #[arg(long = "allow", value_name = "HOST[:PORT]")]
    allow: Vec<String>,
    /// With --net proxy: an address range allowed even though it is private or special
    /// (how to reach an internal service on purpose); repeatable.
    #[arg(long = "allow-cidr", value_name = "CIDR")]
    allow_cidrs: Vec<String>,
    /// With --net proxy: a host (`example.com`, `*.internal.example.com`) or address
    /// range never reached, whatever --allow says (deny wins); repeatable.
    #[arg(long = "deny", value_name = "HOST|CIDR")]
    deny: Vec<String>,
    /// With --net proxy: the program sees a placeholder in variable NAME, which the
    /// proxy replaces with the value of NAME in airlock's own environment only in
    /// requests to HOSTs (headers; TLS to them is intercepted); repeatable.
    #[arg(long = "secret", value_name = "NAME@HOST[,HOST]")]
    secrets: Vec<String>,
    /// As --secret, and the placeholder is replaced in the URL's query string too.
    #[arg(long = "secret-in-query", value_name = "NAME@HOST[,HOST]")]
    secrets_in_query: Vec<String>,
    /// Isolation: `namespaces` (the host kernel's namespaces, cgroup, seccomp and
    /// landlock), `gvisor` (a user-space kernel, gVisor's Sentry, serves the program's
    /// system calls) or `microvm` (the same sandbox inside a micro-VM of its own).
    #[arg(long, value_name = "MODE", default_value = "namespaces", value_parser = ["namespaces", "gvisor", "microvm"])]
    isolation: String,
    /// Print the result as JSON on stdout (exit 0 whenever the sandbox ran).
    #[arg(long)]
    json: bool,
    /// Run in this image (`python:3.12-slim`, a name from `airlock image ls`, or a
    /// digest) instead of the host's system directories; its Env goes under --env, and
    /// its Entrypoint and Cmd are the command when none is given.
    #[arg(long, value_name = "IMAGE", conflicts_with = "rootfs")]
    image: Option<String>,
    /// With --image: pull it when it is not in the store (`missing`), never, or always.
    #[arg(long, value_name = "WHEN", default_value = "missing", value_parser = ["missing", "never", "always"], requires = "image")]
    pull: String,
    #[command(flatten)]
    store: super::image::StoreArgs,
    #[command(flatten)]
    registry: super::image::RegistryArgs,
    /// Where sandbox cgroups go: `auto` (under this process's own cgroup when it is
    /// delegated to it, e.g. a systemd unit with Delegate=yes; else each hierarchy's
    /// root), `root`, or a cgroup PATH such as /airlock.slice (docs/cgroups.md).
    #[arg(long, value_name = "auto|root|PATH", default_value = "auto")]
    cgroup_parent: airlock_sandbox::cgroup::CgroupParent,
    /// The program and its arguments (with --image, default: the image's).
    #[arg(required_unless_present = "image", value_name = "COMMAND")]
    command: Vec<String>,
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.reason.to_string())
}

fn duration_ms(s: &str) -> Result<u64, String> {
    let d = parse_duration(s).map_err(|e| e.reason.to_string())?;
    Ok(d.as_millis().try_into().unwrap_or(u64::MAX))
}

impl RunArgs {
    /// Raw flags -> a validated spec (reads --file and --stdin from the host).
    fn into_spec(self) -> anyhow::Result<(Spec, bool)> {
        let mut spec = Spec::new(self.command);
        spec.image = self.image;
        spec.limits = Limits {
            memory_bytes: self.memory,
            cpus: self.cpus,
            pids: self.pids,
            timeout_ms: self.timeout,
            disk_bytes: self.disk,
            output_bytes: self.output_limit,
        };
        for kv in &self.env {
            let Some((k, v)) = kv.split_once('=') else {
                bail!("--env {kv:?}: expected K=V");
            };
            spec.env.push((k.to_owned(), v.to_owned()));
        }
        let mut files_bytes = 0u64;
        for arg in &self.files {
            let (src, dest) = match arg.split_once(':') {
                Some((src, dest)) => (PathBuf::from(src), dest.to_owned()),
                None => {
                    let src = PathBuf::from(arg);
                    let name = src
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    (src, name)
                }
            };
            let meta = std::fs::metadata(&src)
                .with_context(|| format!("--file {arg}: cannot read {}", src.display()))?;
            if !meta.is_file() {
                bail!("--file {arg}: {} is not a regular file", src.display());
            }
            // Refused before anything starts (or is read): it could never fit. The disk
            // is a tmpfs whose pages count against --memory, so the files must fit that
            // too (with room left for the program).
            let before = files_bytes;
            files_bytes = files_bytes.saturating_add(meta.len());
            let what = || {
                if before == 0 {
                    format!("the file ({})", human_size(meta.len()))
                } else {
                    format!(
                        "the file ({}) with the --file before it ({} in all)",
                        human_size(meta.len()),
                        human_size(files_bytes)
                    )
                }
            };
            if files_bytes > self.disk {
                bail!(
                    "--file {arg}: {} does not fit the sandbox's disk (--disk {}); give a larger --disk",
                    what(),
                    format_size(self.disk)
                );
            }
            if files_bytes >= self.memory {
                bail!(
                    "--file {arg}: {} does not fit the sandbox's memory (--memory {}), which the files on its disk count against; give a larger --memory",
                    what(),
                    format_size(self.memory)
                );
            }
            let content = std::fs::read(&src)
                .with_context(|| format!("--file {arg}: cannot read {}", src.display()))?;
            let mode = if meta.permissions().mode() & 0o111 != 0 {
                0o755
            } else {
                0o644
            };
            spec.files.push(FileSpec {
                path: dest,
                content,
                mode,
            });
        }
        if let Some(path) = &self.stdin {
            let mut data = Vec::new();
            if path.as_os_str() == "-" {
                std::io::stdin()
                    .take(MAX_STDIN)
                    .read_to_end(&mut data)
                    .context("--stdin -: reading stdin")?;
            } else {
                std::fs::File::open(path)
                    .and_then(|f| f.take(MAX_STDIN).read_to_end(&mut data))
                    .with_context(|| format!("--stdin {}: cannot read it", path.display()))?;
            }
            spec.stdin = data;
        }
        match self.net.as_str() {
            "proxy" => {
                let mut secrets = Vec::new();
                for (flag, list, query) in [
                    ("--secret", &self.secrets, false),
                    ("--secret-in-query", &self.secrets_in_query, true),
                ] {
                    for arg in list {
                        secrets.push(secret_arg(flag, arg, query)?);
                    }
                }
                spec.network = NetworkPolicy::Proxy(airlock_spec::ProxyPolicy {
                    allow: self.allow.clone(),
                    allow_cidrs: self.allow_cidrs.clone(),
                    deny: self.deny.clone(),
                    secrets,
                    ..airlock_spec::ProxyPolicy::default()
                });
            }
            _ if !self.allow.is_empty()
                || !self.allow_cidrs.is_empty()
                || !self.deny.is_empty()
                || !self.secrets.is_empty()
                || !self.secrets_in_query.is_empty() =>
            {
                bail!("--allow, --allow-cidr, --deny and --secret need --net proxy");
            }
            _ => {}
        }
        spec.isolation = self
            .isolation
            .parse()
            .map_err(|e: airlock_spec::SpecError| anyhow::anyhow!("--isolation: {}", e.message))?;
        if let Some(root) = self.rootfs {
            let root = std::fs::canonicalize(&root)
                .with_context(|| format!("--rootfs {}: cannot open it", root.display()))?;
            if !root.is_dir() {
                bail!("--rootfs {}: not a directory", root.display());
            }
            spec.rootfs = Some(root);
        }
        spec.validate()
            .map_err(|e| anyhow::anyhow!("{}: {}", flag_for(&e.field), e.message))?;
        Ok((spec, self.json))
    }
}

/// The CLI flag behind a spec field, so errors name what the user typed.
fn flag_for(field: &str) -> String {
    let name = match field.split(['[', '.']).next_back().unwrap_or(field) {
        "memory_bytes" => "--memory",
        "cpus" => "--cpus",
        "pids" => "--pids",
        "timeout_ms" => "--timeout",
        "disk_bytes" => "--disk",
        "output_bytes" => "--output-limit",
        _ if field.starts_with("files") => "--file",
        _ if field.starts_with("env") => "--env",
        _ if field.starts_with("network.allow_cidrs") => "--allow-cidr",
        _ if field.starts_with("network.deny") => "--deny",
        _ if field.starts_with("network.secrets") => "--secret",
        _ if field.starts_with("network.allow") => "--allow",
        "network" => "--net",
        "rootfs" => "--rootfs",
        "image" => "--image",
        "command" => "COMMAND",
        _ => return field.to_owned(),
    };
    name.to_owned()
}

/// Streams output live to airlock's own stdout/stderr.
struct Live;
impl OutputSink for Live {
    fn stdout(&mut self, data: &[u8]) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(data).and_then(|()| out.flush());
    }
    fn stderr(&mut self, data: &[u8]) {
        let _ = std::io::stderr().lock().write_all(data);
    }
}

fn interrupted() -> ExitCode {
    eprintln!("airlock: interrupted; the sandbox was killed and purged");
    ExitCode::from(130)
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    airlock_sandbox::cgroup::set_parent(args.cgroup_parent.clone());
    let store = args.store.clone();
    let registry = args.registry.clone();
    let pull = args.pull.clone();
    let (mut spec, json) = args.into_spec()?;
    let mut shape = Shape::of(&spec);
    if let Some(reference) = spec.image.clone() {
        let store = store.open()?;
        let image = super::image::for_run(&store, &reference, &pull, &registry)?;
        let resolved = airlock_server::images::prepare(&store, &image)
            .map_err(|e| anyhow::anyhow!("--image {reference}: {e}"))?;
        match resolved.apply(&mut spec) {
            Ok(()) => {}
            Err(Error::Invalid(e)) => bail!("{}: {}", flag_for(&e.field), e.message),
            Err(e) => return Err(e.into()),
        }
        shape.image = Some(resolved.root);
    }
    // Ctrl-C, SIGTERM and SIGHUP end the run cleanly (sandbox killed and purged) instead
    // of killing airlock mid-way; they arrive on a signalfd the supervisor polls.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(s);
    }
    signals.thread_block().context("blocking signals")?;
    let cancel = SignalFd::new(&signals).context("signalfd")?;

    let mut live = Live;
    let mut quiet = Capture;
    let sink: &mut dyn OutputSink = if json { &mut quiet } else { &mut live };
    // Refusals before any sandbox, in one line (see airlock_sandbox::preflight): the
    // namespace tier's checks run when its engine is made; the other tiers need root.
    if airlock_sandbox::preflight::rootless() && spec.isolation != airlock_spec::Isolation::Namespaces {
        bail!(
            "cannot isolate: --isolation {} needs root (its runtime and cgroups are set up as root): run airlock as root, or use --isolation namespaces, which runs as an ordinary user (docs/rootless.md)",
            spec.isolation.as_str()
        );
    }
    let backend = crate::tiers::one(spec.isolation)?;
    if spec.isolation == airlock_spec::Isolation::Namespaces
        && matches!(spec.network, NetworkPolicy::Proxy(_))
    {
        airlock_sandbox::preflight::require_proxy()?;
    }
    let result = match backend.run_in(&shape, &spec, sink, &[cancel.as_fd()]) {
        Ok(r) => r,
        Err(Error::Cancelled) => return Ok(interrupted()),
        Err(Error::Invalid(e)) => bail!("{}: {}", flag_for(&e.field), e.message),
        // What the host lacks, found when the sandbox failed to build (see
        // `Engine::for_one_run`): the same one line as a refusal before any sandbox.
        Err(Error::Unavailable { reason, .. }) if reason.starts_with("cannot isolate: ") => bail!("{reason}"),
        Err(e) => return Err(e.into()),
    };
    if json {
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(&mut out, &result).context("writing the result")?;
        writeln!(out).context("writing the result")?;
        return Ok(ExitCode::SUCCESS);
    }
    for (name, truncated, bytes) in [
        ("stdout", result.stdout_truncated, result.stdout_bytes),
        ("stderr", result.stderr_truncated, result.stderr_bytes),
    ] {
        if truncated {
            eprintln!(
                "airlock: {name} cut at --output-limit {} ({} written in all)",
                format_size(spec.limits.output_bytes),
                format_size(bytes)
            );
        }
    }
    match result.outcome {
        airlock_spec::Outcome::Timeout => eprintln!(
            "airlock: killed at the {} deadline (--timeout){}",
            format_ms(spec.limits.timeout_ms),
            if result.oom_killed {
                ", after the memory limit had killed a process"
            } else {
                ""
            }
        ),
        airlock_spec::Outcome::Oom if result.exit_code.is_some() => eprintln!(
            "airlock: a process was killed for exceeding the {} memory limit (--memory)",
            format_size(spec.limits.memory_bytes)
        ),
        airlock_spec::Outcome::Oom => eprintln!(
            "airlock: killed: exceeded the {} memory limit (--memory)",
            format_size(spec.limits.memory_bytes)
        ),
        _ => {}
    }
    Ok(ExitCode::from(result.shell_status().clamp(0, 255) as u8))
}

/// A `--secret NAME@HOST[,HOST]`: the value is airlock's own variable NAME (never a
/// command-line argument, which other users of the host can read).
pub(crate) fn secret_arg(flag: &str, arg: &str, query: bool) -> anyhow::Result<airlock_spec::Secret> {
    let Some((name, hosts)) = arg.split_once('@') else {
        bail!(
            "{flag} {arg:?}: expected NAME@HOST[,HOST] (the value is read from airlock's environment variable NAME)"
        );
    };
    let value = std::env::var(name).map_err(|_| {
        anyhow::anyhow!("{flag} {arg:?}: airlock's environment has no variable {name} to take the value from")
    })?;
    let hosts: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    if name.is_empty() || hosts.iter().any(String::is_empty) {
        bail!("{flag} {arg:?}: expected NAME@HOST[,HOST]");
    }
    Ok(airlock_spec::Secret {
        name: name.to_owned(),
        value,
        hosts,
        query,
    })
}
