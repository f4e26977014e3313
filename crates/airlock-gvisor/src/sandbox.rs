//! One gVisor sandbox: a bundle directory, a host cgroup, `runsc run` (with the Sentry
//! and Gofer it starts, all in that cgroup) and the channel to the agent inside.

use airlock_backend::Shape;
use airlock_backend::{DiskFull, Error, OutputSink, Sandbox};
use airlock_sandbox::cgroup::{Cgroup, CgroupLimits, Usage};
use airlock_spec::{ExecResult, FileEntry, Isolation, Limits, NetworkPolicy, Outcome, Spec, SpecError};
use airlock_vmwire::frame::{CHUNK, ToGuest, ToHost};
use std::ffi::CString;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::backend::Prepared;
use crate::channel::{Channel, Recv};
use crate::egress::HostProxy;
use crate::wire::ToGvAgent;

/// How long the Sentry may take to boot and the agent to say it is ready (a cold boot
/// takes a few hundred ms under ptrace; a loaded host much more).
const BOOT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request other than an exec (create, files) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `runsc pause`, `resume` (about 30 ms each, measured here) may take before
/// the sandbox is taken for broken.
const RUNSC_CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `runsc checkpoint` may take (it writes the sandbox's memory).
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(120);
/// What `runsc checkpoint` writes in its directory.
pub(crate) const CHECKPOINT_FILE: &str = "checkpoint.img";
/// How long past an exec's deadline the agent may take to kill, reap and report: past
/// it, the whole sandbox is killed from the host and the exec ends as `timeout`.
const DEADLINE_GRACE: Duration = Duration::from_secs(5);

/// The memory cap covers the whole sandbox: the host cgroup's `memory_bytes` holds the
/// program's memory and tmpfs pages (all of it the Sentry's memory file) and runsc, the
/// Sentry and the Gofer themselves (measured here: a sandbox that ran `/bin/true` peaks
/// at 20 MiB, `python3 -c pass` at 24 MiB). So nothing a sandbox costs the host lies
/// beyond its cap, and a peak never exceeds it; a program gets about 20 MiB less of it
/// than in the other tiers. Below this, a sandbox cannot boot and run a program.
pub const MIN_MEMORY_BYTES: u64 = 40 << 20;

/// Host tasks the Sentry, the Gofer, runsc and (under ptrace) the stub processes need
/// besides the program's own: gVisor's tasks are not host processes, so the program's
/// pids limit is RLIMIT_NPROC inside; the host cgroup's pids.max only bounds gVisor.
const HOST_TASKS: u32 = 512;

/// Refuses a memory cap the sandbox cannot live in.
fn check_memory(limits: &Limits) -> Result<(), Error> {
    if limits.memory_bytes < MIN_MEMORY_BYTES {
        return Err(Error::invalid(
            "limits.memory_bytes",
            format!(
                "a gVisor sandbox needs at least {}: its Sentry, Gofer and runsc (about 20 MiB) count against the cap",
                airlock_spec::format_size(MIN_MEMORY_BYTES)
            ),
        ));
    }
    Ok(())
}

/// The CPU a sandbox gets at least while it is built (its programs get their own cap).
const BUILD_CPUS: f64 = 1.0;

fn host_limits(limits: &Limits) -> CgroupLimits {
    CgroupLimits {
        memory_bytes: limits.memory_bytes,
        cpus: limits.cpus,
        pids: limits.pids + HOST_TASKS,
    }
}

/// One gVisor sandbox. Dropping it kills runsc, the Sentry and the Gofer (through its
/// cgroup), and removes its bundle, runsc state and cgroup.
#[derive(Debug)]
pub struct GvisorSandbox {
    id: String,
    /// Its root is an image's tree (not the host's system directories).
    image: bool,
    /// Owned: `runsc run`, whose Sentry and Gofer are in `cgroup`.
    runsc: Child,
    /// The runsc binary (for `pause`, `resume`).
    runsc_path: PathBuf,
    /// Paused, and how: every process of the sandbox is stopped, the agent too, so
    /// nothing is asked of it until `resume`.
    paused: Option<Paused>,
    /// Owned: the pipes to the agent.
    channel: Channel,
    /// Owned: the host cgroup around runsc, the Sentry and the Gofer.
    cgroup: Option<Cgroup>,
    /// Owned: the bundle directory (with runsc's state and log).
    dir: PathBuf,
    /// The limits it was built with.
    limits: Limits,
    setup: Duration,
    /// False once the agent or the Sentry is gone.
    alive: bool,
    /// Built ahead for a pool with others ready: in the background until its first exec.
    background: bool,
    /// Owned: proxy mode's egress proxy, served on the host.
    egress: Option<HostProxy>,
    /// The platform runsc runs it on (reported in every result).
    platform: crate::Platform,
    /// Owned: the socket of the agent's process keeper (spawned programs, ports).
    procs: Option<crate::process::Hub>,
    /// The `cgroup.procs` files runsc is started in (again, after a checkpoint).
    procs_paths: Vec<CString>,
    /// What a restore from its snapshots must build alike.
    snapshot_info: SnapshotInfo,
}

/// Written beside a checkpoint ([`SNAPSHOT_INFO_FILE`]): what a sandbox restored from
/// it must have as the checkpointed one had, or runsc cannot restore it (the same
/// mounts, the same platform) or it would not be what it claims (the disk's size is
/// the checkpointed tmpfs's).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct SnapshotInfo {
    platform: String,
    disk_bytes: u64,
    /// The image's digest.
    image: Option<String>,
    rootfs: Option<PathBuf>,
    /// Proxy mode (the egress mounts and the agent's relay).
    proxy: bool,
}

/// The file [`SnapshotInfo`] is written to.
pub(crate) const SNAPSHOT_INFO_FILE: &str = "airlock-gvisor.json";

impl SnapshotInfo {
    pub(crate) fn of(platform: crate::Platform, shape: &Shape) -> SnapshotInfo {
        SnapshotInfo {
            platform: platform.as_str().to_owned(),
            disk_bytes: shape.limits.disk_bytes,
            image: shape.image.as_ref().map(|i| i.digest.clone()),
            rootfs: shape.rootfs.clone(),
            proxy: matches!(shape.network, NetworkPolicy::Proxy(_)),
        }
    }

    /// Refuses to restore the snapshot in `dir` as a sandbox of `wanted`.
    pub(crate) fn check(dir: &Path, wanted: &SnapshotInfo) -> Result<(), Error> {
        let path = dir.join(SNAPSHOT_INFO_FILE);
        let text = std::fs::read(&path).map_err(|e| {
            Error::invalid(
                "snapshot",
                format!("{} holds no gVisor checkpoint ({e})", dir.display()),
            )
        })?;
        let had: SnapshotInfo = serde_json::from_slice(&text)
            .map_err(|e| Error::invalid("snapshot", format!("{}: {e}", path.display())))?;
        let differs = |field: &str, had: String, wanted: String| {
            Err(Error::invalid(
                field,
                format!(
                    "the snapshot's sandbox had {had}, this one would have {wanted}: a full snapshot restores only as the sandbox it was"
                ),
            ))
        };
        if had.platform != wanted.platform {
            return differs(
                "snapshot",
                format!("the {} platform", had.platform),
                format!("the {} platform", wanted.platform),
            );
        }
        if had.disk_bytes != wanted.disk_bytes {
            return differs(
                "limits.disk_bytes",
                airlock_spec::format_size(had.disk_bytes),
                airlock_spec::format_size(wanted.disk_bytes),
            );
        }
        if had.image != wanted.image {
            let name = |i: &Option<String>| i.clone().unwrap_or_else(|| "no image".into());
            return differs("image", name(&had.image), name(&wanted.image));
        }
        if had.rootfs != wanted.rootfs {
            let name = |r: &Option<PathBuf>| {
                r.as_ref().map_or("the host's system directories".into(), |r| {
                    r.display().to_string()
                })
            };
            return differs("rootfs", name(&had.rootfs), name(&wanted.rootfs));
        }
        if had.proxy != wanted.proxy {
            let name = |p: bool| if p { "the proxy network" } else { "no network" }.to_owned();
            return differs("network", name(had.proxy), name(wanted.proxy));
        }
        Ok(())
    }
}

/// How `runsc run` (or `runsc restore`) is started for a sandbox.
struct Launch<'a> {
    runsc: &'a Path,
    platform: crate::Platform,
    dir: &'a Path,
    id: &'a str,
    /// Proxy mode (the agent needs raw sockets in its netstack).
    net_raw: bool,
    /// The `cgroup.procs` files of the sandbox's cgroup.
    procs: Vec<CString>,
}

impl Launch<'_> {
    /// Starts runsc in the sandbox's cgroup, its stdio the agent's pipes: `runsc run`,
    /// or `runsc restore` from the checkpoint in `from`.
    fn start(&self, from: Option<&Path>) -> Result<(Child, Channel), Error> {
        let (to_agent_r, to_agent_w) = pipe()?;
        let (from_agent_r, from_agent_w) = pipe()?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("runsc.stderr"))
            .map_err(|e| Error::host("creating runsc's log", e))?;
        let mut cmd = Command::new(self.runsc);
        cmd.arg("--root")
            .arg(self.dir.join("state"))
            .arg(format!("--platform={}", self.platform.as_str()))
            .args(["--network=none", "--ignore-cgroups"])
            // The Sentry may connect to the host's Unix sockets bound in (the process
            // keeper's; in proxy mode, the proxy's), root-only directories inside.
            .arg("--host-uds=open")
            // Proxy mode: iptables in the Sentry's netstack (the agent's redirections to
            // the proxy) needs raw sockets; only the agent has CAP_NET_RAW.
            .args(self.net_raw.then_some("--net-raw"));
        match from {
            None => cmd.arg("run"),
            Some(image) => cmd.arg("restore").arg("--image-path").arg(image),
        };
        cmd.arg("--bundle")
            .arg(self.dir)
            .arg(self.id)
            .stdin(Stdio::from(to_agent_r))
            .stdout(Stdio::from(from_agent_w))
            .stderr(Stdio::from(log))
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        let procs = self.procs.clone();
        // SAFETY: the closure runs between fork and exec: it only calls prctl, open,
        // write and close on the prepared CStrings, all async-signal-safe, and allocates
        // nothing.
        unsafe {
            cmd.pre_exec(move || {
                // runsc (and through it the Sentry and the Gofer) dies with the thread
                // that created the sandbox.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Into the sandbox's cgroup before runsc starts anything: the Sentry and
                // the Gofer are born there.
                for path in &procs {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                    if n != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let runsc = cmd.spawn().map_err(|e| Error::host("starting runsc", e))?;
        drop(cmd);
        let channel = Channel::new(to_agent_w, from_agent_r).map_err(|e| Error::host("agent pipes", e))?;
        Ok((runsc, channel))
    }
}

/// The pipes of `runsc run`'s stdio: ours, then the child's.
fn pipe() -> Result<(OwnedFd, OwnedFd), Error> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::host("creating a pipe", e))
}

impl GvisorSandbox {
    /// Builds and boots a sandbox of `limits` (disk, memory, CPU), system directories
    /// from `rootfs`; `background`: its CPU share is the smallest until its first exec;
    /// `warm`: one `/bin/true` runs in it first (a pool's sandbox).
    ///
    /// `from`: a full snapshot (see [`Sandbox::checkpoint`]) it is restored from instead
    /// of booted: its agent, programs, memory and files as they were.
    pub(crate) fn create(
        prepared: &Prepared,
        shape: &Shape,
        background: bool,
        warm: bool,
        from: Option<&Path>,
    ) -> Result<GvisorSandbox, Error> {
        let limits = &shape.limits;
        check_memory(limits)?;
        if let Some(rootfs) = shape.rootfs.as_deref()
            && !rootfs.join("usr").is_dir()
        {
            return Err(Error::invalid(
                "rootfs",
                format!(
                    "{} has no usr directory to take system directories from",
                    rootfs.display()
                ),
            ));
        }
        // Proxy mode's policy, checked before anything is built.
        let policy = match &shape.network {
            NetworkPolicy::None => None,
            NetworkPolicy::Proxy(p) => Some(
                airlock_egress::Proxy::for_sandbox(
                    p,
                    airlock_egress::ProxyLimits::default(),
                    std::sync::Arc::new(airlock_egress::SystemResolver),
                )
                .map_err(|e| match e {
                    airlock_egress::SetupError::Policy(e) => {
                        Error::Invalid(SpecError::new(e.field, e.message))
                    }
                    airlock_egress::SetupError::Mitm(e) => {
                        Error::host("preparing the interception of secrets", e)
                    }
                })?,
            ),
        };
        let t0 = Instant::now();
        let id = new_id()?;
        let dir = crate::bundle::dir_of(&prepared.owner_dir, &id);
        std::fs::create_dir_all(&dir).map_err(|e| Error::host(format!("creating {}", dir.display()), e))?;
        // From here on, `Partial` removes what was made if a step fails.
        let mut partial = Partial {
            dir: Some(dir.clone()),
            cgroup: None,
        };
        let egress_dir = dir.join("egress");
        // The process keeper's socket, served before the sandbox starts (the keeper
        // connects at `Create`), in a directory only root can enter, inside too.
        let procs_dir = dir.join("procs");
        std::fs::create_dir(&procs_dir)
            .and_then(|()| {
                std::fs::set_permissions(&procs_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            })
            .map_err(|e| Error::host(format!("creating {}", procs_dir.display()), e))?;
        let hub = crate::process::Hub::start(&procs_dir.join(crate::procs::SOCKET), &id)
            .map_err(|e| Error::host("serving the process keeper's socket", e))?;
        let ca_bundle = policy.as_ref().and_then(|p| p.ca_bundle_pem());
        let image = match &shape.image {
            Some(image) => Some((image.root.as_path(), prepared.host_libs()?)),
            None => None,
        };
        crate::bundle::write(
            &dir,
            &crate::bundle::BundleSpec {
                rootfs: shape.rootfs.as_deref(),
                agent: &prepared.agent,
                compat: prepared.compat.as_deref(),
                egress_dir: policy.is_some().then_some(egress_dir.as_path()),
                procs_dir: Some(procs_dir.as_path()),
                ca_bundle: ca_bundle.as_deref().map(str::as_bytes),
                image,
            },
        )
        .map_err(|e| Error::host("writing the OCI bundle", e))?;
        let egress = match policy {
            Some(policy) => Some(
                HostProxy::start(policy, &egress_dir, &id)
                    .map_err(|e| Error::host("starting the egress proxy", e))?,
            ),
            None => None,
        };
        // Building runs the Sentry's own start (seconds of CPU at 1% of a core): it gets at
        // least a core; each exec sets the program's own cap before it starts.
        let building = Limits {
            cpus: limits.cpus.max(BUILD_CPUS),
            ..limits.clone()
        };
        let cgroup = prepared
            .cgroups
            .create(&id, &host_limits(&building))
            .map_err(|e| Error::host("creating the sandbox's cgroup", e))?;
        if background {
            let _ = cgroup.set_background(true);
        }
        let procs: Vec<CString> = cgroup
            .paths()
            .map(|p| CString::new(p.join("cgroup.procs").as_os_str().as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|e| Error::host("cgroup path", e))?;
        partial.cgroup = Some(cgroup);

        let launch = Launch {
            runsc: &prepared.runsc,
            platform: prepared.platform,
            dir: &dir,
            id: &id,
            net_raw: egress.is_some(),
            procs,
        };
        let (runsc, channel) = launch.start(from)?;
        let launch_procs = launch.procs;
        let mut sandbox = GvisorSandbox {
            id,
            image: shape.image.is_some(),
            snapshot_info: SnapshotInfo::of(prepared.platform, shape),
            runsc,
            runsc_path: prepared.runsc.clone(),
            paused: None,
            channel,
            cgroup: partial.cgroup.take(),
            dir: partial.dir.take().unwrap_or_default(),
            limits: limits.clone(),
            setup: Duration::ZERO,
            alive: true,
            // Set once built: the warm-up exec runs in the background as well.
            background: false,
            egress,
            platform: prepared.platform,
            procs: Some(hub),
            procs_paths: launch_procs,
        };
        // From here on, dropping `sandbox` purges everything.
        if from.is_some() {
            // Restored: its process keeper connects to this sandbox's new socket; the
            // programs it keeps are none of this sandbox's handles.
            sandbox.send(&ToGvAgent::Reattach { orphan: true }, &[])?;
            match sandbox.recv(Some(Instant::now() + BOOT_TIMEOUT), &[]) {
                Ok(ToHost::Ok) => {}
                Ok(other) => {
                    return Err(Error::host(
                        "restoring the gVisor sandbox",
                        format!("unexpected {other:?}"),
                    ));
                }
                Err(Error::Gone(reason)) => return Err(Error::host("restoring the gVisor sandbox", reason)),
                Err(e) => return Err(e),
            }
            sandbox.background = background;
            sandbox.setup = t0.elapsed();
            return Ok(sandbox);
        }
        // A sandbox that never came up is the host's failure (runsc refused the bundle,
        // the platform broke), not a sandbox that went away.
        match sandbox.recv(Some(Instant::now() + BOOT_TIMEOUT), &[]) {
            Ok(ToHost::Ready(_)) => {}
            Ok(other) => {
                return Err(Error::host(
                    "booting the gVisor sandbox",
                    format!("unexpected {other:?}"),
                ));
            }
            Err(Error::Gone(reason)) => return Err(Error::host("booting the gVisor sandbox", reason)),
            Err(e) => return Err(e),
        }
        sandbox.send(
            &ToGuest::Create {
                limits: limits.clone(),
                fixed_layout: false,
            },
            &[],
        )?;
        sandbox.expect_ok("creating the sandbox")?;
        if let Some(egress) = &sandbox.egress {
            // The agent's programs get the proxy's variables and the secrets' placeholders.
            let env = serde_json::to_vec(&egress.proxy().sandbox_env())
                .map_err(|e| Error::host("encoding the sandbox's environment", e))?;
            sandbox.send(&ToGuest::Egress, &env)?;
            sandbox.expect_ok("starting the egress relay")?;
        }
        if warm {
            sandbox.warm_up(shape.image.is_some())?;
        }
        sandbox.background = background;
        sandbox.setup = t0.elapsed();
        Ok(sandbox)
    }

    /// Runs `/bin/true` once, as a session exec, so that the exec path (the Sentry's
    /// execve, the loader and libc looked up through the Gofer and cached, the agent's
    /// supervision) is warm when the pool hands the sandbox its one program. The agent
    /// forks a fresh ready child after it, as after any exec: nothing of it remains.
    /// An image may have no /bin/true: in one, a program not found (127) or not runnable
    /// (126) has still warmed up the exec path.
    fn warm_up(&mut self, image: bool) -> Result<(), Error> {
        let mut spec = Spec::new(vec!["/bin/true".into()]);
        spec.limits = self.limits.clone();
        let r = self.exec_inner(&spec, &mut airlock_backend::Capture, &[])?;
        let acceptable = r.exit_code == Some(0) || (image && matches!(r.exit_code, Some(126 | 127)));
        if !acceptable {
            return Err(Error::host(
                "warming up the gVisor sandbox",
                format!("/bin/true ended {:?} ({})", r.outcome, r.stderr.trim()),
            ));
        }
        Ok(())
    }

    fn send(&mut self, msg: &impl serde::Serialize, payload: &[u8]) -> Result<(), Error> {
        if let Err(e) = self.channel.send(msg, payload) {
            self.alive = false;
            return Err(if e.kind() == std::io::ErrorKind::BrokenPipe {
                Error::Gone(self.gone_reason())
            } else {
                Error::host("writing to the gVisor agent", e)
            });
        }
        Ok(())
    }

    /// Why the sandbox is gone, from runsc's log when it says.
    fn gone_reason(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("runsc.stderr")).unwrap_or_default();
        match log.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(line) => format!("the gVisor sandbox is gone (runsc: {})", line.trim()),
            None => "the gVisor sandbox is gone (its Sentry or agent died)".into(),
        }
    }

    /// The next frame (not an output chunk).
    fn recv(&mut self, deadline: Option<Instant>, cancel: &[BorrowedFd<'_>]) -> Result<ToHost, Error> {
        Ok(self.recv_frame(deadline, cancel)?.0)
    }

    fn recv_frame(
        &mut self,
        deadline: Option<Instant>,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<(ToHost, Vec<u8>), Error> {
        match self.channel.recv(deadline, cancel) {
            Ok(Recv::Frame(f)) => Ok((f.msg, f.payload)),
            Ok(Recv::Closed) => {
                self.alive = false;
                Err(Error::Gone(self.gone_reason()))
            }
            Ok(Recv::Deadline) => {
                self.kill();
                Err(Error::Gone(
                    "the gVisor agent stopped answering: the sandbox was killed".into(),
                ))
            }
            Ok(Recv::Cancelled) => Err(Error::Cancelled),
            Err(e) => {
                self.kill();
                Err(Error::host("reading from the gVisor agent", e))
            }
        }
    }

    fn expect_ok(&mut self, what: &str) -> Result<(), Error> {
        match self.recv(Some(Instant::now() + REQUEST_TIMEOUT), &[])? {
            ToHost::Ok => Ok(()),
            ToHost::Error { kind, field, message } => Err(match wire_error(kind, field, message) {
                Error::Host { source, .. } => Error::Host {
                    what: what.to_owned(),
                    source,
                },
                e => e,
            }),
            other => Err(Error::host(
                what.to_owned(),
                format!("unexpected answer {other:?}"),
            )),
        }
    }

    /// Kills everything of the sandbox; it is gone after.
    fn kill(&mut self) {
        self.alive = false;
        if let Some(cg) = self.cgroup.as_ref() {
            let _ = cg.kill();
        }
        let _ = self.runsc.kill();
    }

    /// Refuses a request the agent cannot answer now: the sandbox is gone, or paused
    /// (its agent is stopped with everything else: a request would wait for `resume`).
    fn check_usable(&mut self) -> Result<(), Error> {
        if !self.alive {
            return Err(Error::Gone("the gVisor sandbox is gone".into()));
        }
        if self.paused.is_some() {
            return Err(Error::invalid("sandbox", "is paused: resume it first"));
        }
        Ok(())
    }

    /// Runs `runsc <verb> <id>` on this sandbox's runsc state, bounded by
    /// [`RUNSC_CONTROL_TIMEOUT`]; its stderr is the error's text when it fails.
    fn runsc_control(&mut self, verb: &str) -> Result<(), Error> {
        let id = self.id.clone();
        self.runsc_command(&[verb.as_ref(), id.as_ref()], RUNSC_CONTROL_TIMEOUT)
    }

    /// Runs `runsc <args>` on this sandbox's runsc state, bounded by `timeout`; its
    /// stderr is the error's text when it fails.
    fn runsc_command(&mut self, args: &[&std::ffi::OsStr], timeout: Duration) -> Result<(), Error> {
        let verb = args
            .first()
            .map(|a| a.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut child = Command::new(&self.runsc_path)
            .arg("--root")
            .arg(self.dir.join("state"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .spawn()
            .map_err(|e| Error::host(format!("starting runsc {verb}"), e))?;
        let deadline = Instant::now() + timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    self.kill();
                    return Err(Error::Gone(format!(
                        "runsc {verb} did not answer within {timeout:?}: the sandbox was killed"
                    )));
                }
                Err(e) => return Err(Error::host(format!("waiting for runsc {verb}"), e)),
            }
        };
        if status.success() {
            return Ok(());
        }
        let mut err = String::new();
        if let Some(mut stderr) = child.stderr.take() {
            use std::io::Read;
            let _ = stderr.read_to_string(&mut err);
        }
        if !self.is_alive_now() {
            return Err(Error::Gone(self.gone_reason()));
        }
        // Its first line says why (a Go panic's stack follows it).
        let why: String = err
            .trim()
            .lines()
            .next()
            .unwrap_or_default()
            .chars()
            .take(2000)
            .collect();
        Err(Error::host(format!("runsc {verb}"), format!("{status}: {why}")))
    }

    /// Whether runsc still runs (the sandbox is not gone).
    fn is_alive_now(&mut self) -> bool {
        if self.alive && matches!(self.runsc.try_wait(), Ok(Some(_))) {
            self.alive = false;
        }
        self.alive
    }

    fn usage(&self) -> Usage {
        self.cgroup.as_ref().map(Cgroup::usage).unwrap_or_default()
    }

    fn exec_inner(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, Error> {
        spec.validate()?;
        check_memory(&spec.limits)?;
        if spec.image.is_some() && !self.image {
            // Never run on the host's system directories in the image's place.
            return Err(Error::invalid(
                "image",
                "was not resolved to an image's prepared root: this sandbox has the host's system directories",
            ));
        }
        self.check_usable()?;
        // The network is the sandbox's, fixed when it was built: an exec's own is not
        // consulted (a session's execs carry none), as in the other tiers.
        if spec.limits.disk_bytes != self.limits.disk_bytes {
            return Err(Error::invalid(
                "limits.disk_bytes",
                "differs from the sandbox's disk, which is fixed when it is built",
            ));
        }
        let t0 = Instant::now();
        if let Some(cg) = self.cgroup.as_ref() {
            cg.set_limits(&host_limits(&spec.limits))
                .map_err(|e| Error::host("setting the sandbox's limits", e))?;
            if std::mem::take(&mut self.background) {
                let _ = cg.set_background(false);
            }
            cg.reset_peak();
        }
        // The spec's files first (a write cut short by `cancel` leaves nothing half
        // written: see `write_file`).
        for file in &spec.files {
            airlock_backend::Sandbox::write_file(self, &file.path, file.mode, &file.content, cancel)?;
        }
        let before = self.usage();
        for chunk in spec.stdin.chunks(CHUNK) {
            self.send(&ToGuest::Stdin, chunk)?;
        }
        // Where the agent scans before the program starts and after it ends.
        self.send(
            &ToGvAgent::ChangesIn {
                roots: spec.files_changed_in.clone(),
            },
            &[],
        )?;
        self.send(
            &ToGuest::Exec {
                command: spec.command.clone(),
                env: spec.env.clone(),
                limits: spec.limits.clone(),
                workdir: spec.workdir.clone(),
            },
            &[],
        )?;
        let sent = Instant::now();
        let deadline = sent + Duration::from_millis(spec.limits.timeout_ms) + DEADLINE_GRACE;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let mut cancel_sent = false;
        let result = loop {
            let watch: &[BorrowedFd<'_>] = if cancel_sent { &[] } else { cancel };
            let frame = match self.channel.recv(Some(deadline), watch) {
                Ok(Recv::Frame(f)) => f,
                Ok(Recv::Cancelled) => {
                    self.send(&ToGuest::Cancel, &[])?;
                    cancel_sent = true;
                    continue;
                }
                Ok(Recv::Deadline) => {
                    // The agent did not end the exec at its deadline: the host does,
                    // with the whole sandbox.
                    self.kill();
                    break self.died(spec, stdout, stderr, before, sent, true);
                }
                Ok(Recv::Closed) => {
                    self.alive = false;
                    break self.died(spec, stdout, stderr, before, sent, false);
                }
                Err(e) => {
                    self.kill();
                    return Err(Error::host("reading from the gVisor agent", e));
                }
            };
            match frame.msg {
                ToHost::Stdout => {
                    sink.stdout(&frame.payload);
                    stdout.extend_from_slice(&frame.payload);
                }
                ToHost::Stderr => {
                    sink.stderr(&frame.payload);
                    stderr.extend_from_slice(&frame.payload);
                }
                ToHost::Exited { result } => {
                    let mut r = *result;
                    r.stdout = String::from_utf8_lossy(&stdout).into_owned();
                    r.stderr = String::from_utf8_lossy(&stderr).into_owned();
                    break Ok(r);
                }
                ToHost::Error { kind, field, message } => return Err(wire_error(kind, field, message)),
                other => {
                    self.kill();
                    return Err(Error::host(
                        "running the program",
                        format!("unexpected answer {other:?}"),
                    ));
                }
            }
        };
        let mut result = result?;
        let after = self.usage();
        result.id = self.id.clone();
        result.cpu_ms = (after.cpu_ns.saturating_sub(before.cpu_ns) as f64 / 1e3).round() / 1e3;
        result.memory_peak_bytes = after.memory_peak_bytes;
        if let Some(proxy) = self.egress.as_mut() {
            result.egress = proxy.take_new();
        }
        result.oom_killed = after.oom_kills > before.oom_kills;
        result.outcome = Outcome::of(result.oom_killed, result.timed_out, result.exit_code.is_some());
        result.setup_ms = ((result.setup_ms + ms_between(t0, sent)) * 1e3).round() / 1e3;
        Ok(result)
    }

    /// The result of an exec whose sandbox died under it: the memory cap (the host's
    /// OOM killer killed the Sentry or a part of it) or the host's deadline; otherwise
    /// the sandbox is just gone.
    ///
    /// At the memory cap the OOM killer picks the Sentry: the program's pages are the
    /// Sentry's memory file, mapped (and counted) in the Sentry itself. So unlike the
    /// namespace tier's, a gVisor sandbox does not outlive its memory cap: the exec ends
    /// as `oom` and the sandbox is gone. (Tried: raising the ptrace stubs' OOM score
    /// only makes the killer go through the stubs, two seconds each, before the Sentry;
    /// lowering the Sentry's needs CAP_SYS_RESOURCE, and this release has no memory
    /// limit of its own.)
    fn died(
        &mut self,
        spec: &Spec,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        before: Usage,
        started: Instant,
        timed_out: bool,
    ) -> Result<ExecResult, Error> {
        self.kill();
        let after = self.usage();
        let oom = after.oom_kills > before.oom_kills;
        if !oom && !timed_out {
            return Err(Error::Gone(self.gone_reason()));
        }
        let kept = |v: &[u8]| v.len() as u64;
        Ok(ExecResult {
            id: self.id.clone(),
            outcome: Outcome::of(oom, timed_out, false),
            exit_code: None,
            signal: Some(libc::SIGKILL),
            timed_out,
            oom_killed: oom,
            stdout_truncated: kept(&stdout) >= spec.limits.output_bytes && !stdout.is_empty(),
            stderr_truncated: kept(&stderr) >= spec.limits.output_bytes && !stderr.is_empty(),
            stdout_bytes: kept(&stdout),
            stderr_bytes: kept(&stderr),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            // From the request to the sandbox's death (the agent, which would have
            // timed the program itself, died with it).
            wall_ms: (ms_between(started, Instant::now()) * 1e3).round() / 1e3,
            setup_ms: 0.0,
            cpu_ms: (after.cpu_ns.saturating_sub(before.cpu_ns) as f64 / 1e3).round() / 1e3,
            memory_peak_bytes: after.memory_peak_bytes,
            egress: Vec::new(),
            isolation: Isolation::Gvisor,
            platform: None,
            files_changed: Vec::new(),
            files_changed_truncated: false,
        })
    }
}

/// The error the agent sent, by its kind.
fn wire_error(kind: airlock_backend::ErrorKind, field: Option<String>, message: String) -> Error {
    Error::from_wire(kind, field, message, Isolation::Gvisor)
}

fn ms_between(a: Instant, b: Instant) -> f64 {
    b.saturating_duration_since(a).as_secs_f64() * 1e3
}

/// A fresh sandbox id: `gv-` and 16 random hex digits (runsc container ids and cgroup
/// names both take it).
fn new_id() -> Result<String, Error> {
    let mut bytes = [0u8; 8];
    airlock_sandbox::sys::getrandom(&mut bytes).map_err(|e| Error::host("getrandom", e))?;
    Ok(format!(
        "gv-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// What a failed `create` has made so far, removed on drop.
struct Partial {
    dir: Option<PathBuf>,
    cgroup: Option<Cgroup>,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if let Some(cg) = self.cgroup.take() {
            let _ = cg.destroy();
        }
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Sandbox for GvisorSandbox {
    fn isolation(&self) -> airlock_spec::Isolation {
        airlock_spec::Isolation::Gvisor
    }

    fn id(&self) -> &str {
        &self.id
    }

    fn setup_time(&self) -> Duration {
        self.setup
    }

    fn exec(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, Error> {
        let mut result = self.exec_inner(spec, sink, cancel)?;
        result.isolation = Isolation::Gvisor;
        result.platform = Some(self.platform.as_str().to_owned());
        Ok(result)
    }

    fn write_file(
        &mut self,
        path: &str,
        mode: u32,
        content: &[u8],
        cancel: &[BorrowedFd<'_>],
    ) -> Result<(), Error> {
        self.check_usable()?;
        let disk = self.limits.disk_bytes;
        if content.len() as u64 > disk {
            return Err(Error::DiskFull(DiskFull {
                path: path.into(),
                bytes: content.len() as u64,
                disk_bytes: disk,
                free_bytes: None,
                memory_bytes: None,
            }));
        }
        let mut parts = content.chunks(CHUNK).peekable();
        let mut first = true;
        loop {
            if poll_any(cancel) {
                if first {
                    return Err(Error::Cancelled); // nothing of it was sent
                }
                // The parts sent so far are finished with an empty last part.
                self.send(
                    &ToGuest::WriteFile {
                        path: path.into(),
                        mode,
                        first,
                        last: true,
                    },
                    &[],
                )?;
                let _ = self.recv(Some(Instant::now() + REQUEST_TIMEOUT), &[]);
                return Err(Error::Cancelled);
            }
            let part = parts.next().unwrap_or(&[]);
            let last = parts.peek().is_none();
            self.send(
                &ToGuest::WriteFile {
                    path: path.into(),
                    mode,
                    first,
                    last,
                },
                part,
            )?;
            first = false;
            if last {
                break;
            }
        }
        match self.recv(Some(Instant::now() + REQUEST_TIMEOUT), &[])? {
            ToHost::Ok => Ok(()),
            ToHost::NoRoom {
                free_bytes,
                memory_bytes,
            } => Err(Error::DiskFull(DiskFull {
                path: path.into(),
                bytes: content.len() as u64,
                disk_bytes: disk,
                free_bytes,
                memory_bytes,
            })),
            ToHost::Error { kind, field, message } => Err(wire_error(kind, field, message)),
            other => Err(Error::host(
                "writing a file",
                format!("unexpected answer {other:?}"),
            )),
        }
    }

    fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>, Error> {
        self.check_usable()?;
        self.send(
            &ToGuest::ReadFile {
                path: path.into(),
                max_bytes,
            },
            &[],
        )?;
        let mut data = Vec::new();
        loop {
            let deadline = Some(Instant::now() + REQUEST_TIMEOUT);
            match self.recv_frame(deadline, &[])? {
                (ToHost::FileChunk { last }, payload) => {
                    data.extend_from_slice(&payload);
                    if last {
                        return Ok(data);
                    }
                }
                (ToHost::Error { kind, field, message }, _) => return Err(wire_error(kind, field, message)),
                (other, _) => {
                    return Err(Error::host(
                        "reading a file",
                        format!("unexpected answer {other:?}"),
                    ));
                }
            }
        }
    }

    fn list_files(&mut self) -> Result<Vec<FileEntry>, Error> {
        self.check_usable()?;
        self.send(&ToGuest::ListFiles, &[])?;
        match self.recv(Some(Instant::now() + REQUEST_TIMEOUT), &[])? {
            ToHost::Listing { entries } => Ok(entries),
            ToHost::Error { kind, field, message } => Err(wire_error(kind, field, message)),
            other => Err(Error::host(
                "listing /workspace",
                format!("unexpected answer {other:?}"),
            )),
        }
    }

    fn is_alive(&mut self) -> bool {
        self.is_alive_now()
    }

    /// Freezes the sandbox's host cgroup (cgroup v2's `cgroup.freeze`, in the unified
    /// hierarchy on a hybrid host): runsc, the Sentry, the Gofer and the ptrace stubs
    /// stop where they are, and with them every task inside (the agent, spawned
    /// programs); memory and files stay as they are. Where no v2 cgroup holds the
    /// sandbox, `runsc pause` (the Sentry stops its tasks itself). Measured here: the
    /// freeze takes about 1 ms and the thaw 0.3 ms; `runsc pause` and `resume` about
    /// 30 ms each (a runsc process each).
    fn pause(&mut self) -> Result<(), Error> {
        if self.paused.is_some() {
            return Ok(());
        }
        if !self.is_alive_now() {
            return Err(Error::Gone("the gVisor sandbox is gone".into()));
        }
        let v2 = self
            .cgroup
            .as_ref()
            .and_then(|cg| cg.paths().find(|p| p.join("cgroup.freeze").exists()))
            .map(Path::to_path_buf);
        match v2 {
            Some(dir) => {
                freeze(&dir).map_err(|e| Error::host("freezing the sandbox's cgroup", e))?;
                self.paused = Some(Paused::Freezer(dir));
            }
            None => {
                self.runsc_control("pause")?;
                self.paused = Some(Paused::Runsc);
            }
        }
        Ok(())
    }

    /// Thaws what `pause` froze.
    fn resume(&mut self) -> Result<(), Error> {
        let Some(paused) = self.paused.take() else {
            return Ok(());
        };
        if !self.is_alive_now() {
            return Err(Error::Gone("the gVisor sandbox is gone".into()));
        }
        let thawed = match &paused {
            Paused::Freezer(dir) => std::fs::write(dir.join("cgroup.freeze"), "0")
                .map_err(|e| Error::host("thawing the sandbox's cgroup", e)),
            Paused::Runsc => self.runsc_control("resume"),
        };
        if thawed.is_err() {
            self.paused = Some(paused);
        }
        thawed
    }

    fn egress(&self) -> Option<std::sync::Arc<airlock_egress::Proxy>> {
        self.egress.as_ref().map(|e| std::sync::Arc::clone(e.proxy()))
    }

    fn spawn(
        &mut self,
        spec: &Spec,
        stdio: airlock_backend::Stdio,
    ) -> Result<airlock_backend::Spawned, Error> {
        spec.validate()?;
        if spec.image.is_some() && !self.image {
            return Err(Error::invalid(
                "image",
                "was not resolved to an image's prepared root: this sandbox has the host's system directories",
            ));
        }
        if !self.is_alive() {
            return Err(Error::Gone("the gVisor sandbox is gone".into()));
        }
        self.check_usable()?;
        let terminal = match stdio {
            airlock_backend::Stdio::Pipes => None,
            airlock_backend::Stdio::Terminal { rows, cols } => {
                if rows == 0 || cols == 0 {
                    return Err(Error::invalid(
                        "rows",
                        "a terminal has at least one row and one column",
                    ));
                }
                Some((rows, cols))
            }
        };
        if std::mem::take(&mut self.background)
            && let Some(cg) = self.cgroup.as_ref()
        {
            let _ = cg.set_background(false);
        }
        for file in &spec.files {
            Sandbox::write_file(self, &file.path, file.mode, &file.content, &[])?;
        }
        let extra_env = self
            .egress
            .as_ref()
            .map(|e| e.proxy().sandbox_env())
            .unwrap_or_default();
        let Some(hub) = self.procs.as_ref() else {
            return Err(Error::Gone("the gVisor sandbox is gone".into()));
        };
        let (handle, mut fds) = hub.spawn(
            |id| crate::procs::Request::Spawn {
                id,
                command: spec.command.clone(),
                env: spec.env.clone(),
                extra_env,
                workdir: spec.workdir.clone(),
                // As an exec's: the program's first process is not counted by gVisor.
                nproc: u64::from(spec.limits.pids.saturating_sub(1).max(1)),
                terminal,
            },
            terminal.is_some(),
        )?;
        let (stdin, stdout, stderr) = if terminal.is_some() {
            let both = fds
                .pop()
                .ok_or_else(|| Error::host("spawning", "no terminal stream"))?;
            let stdin = both.try_clone().map_err(|e| Error::host("dup", e))?;
            (stdin, both, None)
        } else {
            let mut it = fds.into_iter();
            match (it.next(), it.next(), it.next()) {
                (Some(i), Some(o), Some(e)) => (i, o, Some(e)),
                _ => return Err(Error::host("spawning", "missing streams")),
            }
        };
        Ok(airlock_backend::Spawned {
            stdin,
            stdout,
            stderr,
            handle: Box::new(handle),
        })
    }

    /// The agent writes the tar (airlock-fstree's export of /workspace, /tmp and
    /// /dev/shm) in frames of 64 KiB, copied to `out` as they come.
    fn export_files(&mut self, out: &mut dyn std::io::Write, cancel: &[BorrowedFd<'_>]) -> Result<(), Error> {
        self.check_usable()?;
        if poll_any(cancel) {
            return Err(Error::Cancelled);
        }
        self.send(&ToGvAgent::ExportFiles, &[])?;
        // Once cancelled (or once `out` fails), the rest of the stream is read and
        // dropped: the channel must be at a frame boundary for the next request.
        let mut stopped: Option<Error> = None;
        loop {
            if stopped.is_none() && poll_any(cancel) {
                stopped = Some(Error::Cancelled);
            }
            let watch: &[BorrowedFd<'_>] = if stopped.is_some() { &[] } else { cancel };
            let frame = match self.recv_frame(Some(Instant::now() + REQUEST_TIMEOUT), watch) {
                Err(Error::Cancelled) => {
                    stopped = Some(Error::Cancelled);
                    continue;
                }
                other => other?,
            };
            match frame {
                (ToHost::FileChunk { last }, payload) => {
                    if stopped.is_none()
                        && let Err(e) = out.write_all(&payload)
                    {
                        stopped = Some(Error::host("writing the exported files", e));
                    }
                    if last {
                        return match stopped {
                            Some(e) => Err(e),
                            None => Ok(()),
                        };
                    }
                }
                (ToHost::Error { kind, field, message }, _) => return Err(wire_error(kind, field, message)),
                (other, _) => {
                    self.kill();
                    return Err(Error::host(
                        "exporting files",
                        format!("unexpected answer {other:?}"),
                    ));
                }
            }
        }
    }

    /// The tar goes to the agent in frames of 64 KiB as it is read from `input`; the
    /// agent clears the disk and unpacks it as it comes (airlock-fstree's import, owner
    /// the sandbox user). Cancelled part way, the stream is cut short: what was
    /// unpacked so far stays.
    fn import_files(
        &mut self,
        input: &mut dyn std::io::Read,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<(), Error> {
        self.check_usable()?;
        // Cancelled before it started: nothing is sent (an empty stream would clear the
        // disk).
        if poll_any(cancel) {
            return Err(Error::Cancelled);
        }
        let mut buf = vec![0u8; CHUNK];
        let mut failed: Option<Error> = None;
        loop {
            if poll_any(cancel) {
                failed = Some(Error::Cancelled);
            }
            // A full chunk is read before it is sent: a short one is the last.
            let n = if failed.is_some() {
                0
            } else {
                read_full(input, &mut buf).unwrap_or_else(|e| {
                    failed = Some(Error::host("reading the files to import", e));
                    0
                })
            };
            let last = failed.is_some() || n < buf.len();
            self.send(&ToGvAgent::ImportFiles { last }, &buf[..n])?;
            if last {
                break;
            }
        }
        let answer = self.recv(Some(Instant::now() + REQUEST_TIMEOUT), &[])?;
        if let Some(e) = failed {
            return Err(e);
        }
        match answer {
            ToHost::Ok => Ok(()),
            ToHost::NoRoom {
                free_bytes,
                memory_bytes,
            } => Err(Error::DiskFull(DiskFull {
                path: "/workspace".into(),
                bytes: 0,
                disk_bytes: self.limits.disk_bytes,
                free_bytes,
                memory_bytes,
            })),
            ToHost::Error { kind, field, message } => Err(wire_error(kind, field, message)),
            other => Err(Error::host(
                "importing files",
                format!("unexpected answer {other:?}"),
            )),
        }
    }

    /// `runsc checkpoint` into `dir` (`checkpoint.img`: the Sentry's state
    /// with the sandbox's memory, tmpfs included; and `airlock-gvisor.json`, what a
    /// restore must build alike), then `runsc restore` of it in place,
    /// since this runsc's `--leave-running` does not work ("destroying container:
    /// stopping container: context deadline exceeded", and the sandbox is gone).
    ///
    /// runsc cannot save a connection to a host Unix socket ("encoding error at object
    /// transport.connectionedEndpoint{... (*transport.SCMConnectedEndpoint) ...}: runtime
    /// error: invalid memory address or nil pointer dereference", and the sandbox dies):
    /// first the agent's process keeper drops every one it holds (see
    /// [`crate::procs`]). So spawned programs run on, but their handles from before the
    /// checkpoint lose their streams (output from then on is dropped; `wait` and
    /// `signal` still work); port connections end. Refused (nothing done) while a
    /// program with a terminal runs or the sandbox is paused. A connection through the
    /// egress proxy open at that moment makes runsc fail: the sandbox is gone then.
    fn checkpoint(&mut self, dir: &Path) -> Result<bool, Error> {
        self.check_usable()?;
        let Some(hub) = self.procs.as_ref() else {
            return Err(Error::Gone("the gVisor sandbox is gone".into()));
        };
        hub.detach()?;
        let image = dir.as_os_str().to_owned();
        let id = self.id.clone();
        let saved = self.runsc_command(
            &[
                "checkpoint".as_ref(),
                "--image-path".as_ref(),
                image.as_os_str(),
                id.as_ref(),
            ],
            CHECKPOINT_TIMEOUT,
        );
        // `runsc run` ends with the sandbox, saved or not.
        let deadline = Instant::now() + RUNSC_CONTROL_TIMEOUT;
        while matches!(self.runsc.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Err(e) = saved {
            self.kill();
            let _ = self.runsc.wait();
            return Err(match e {
                Error::Gone(reason) => Error::Gone(reason),
                e => Error::Gone(format!("the gVisor sandbox is gone: its checkpoint failed ({e})")),
            });
        }
        if matches!(self.runsc.try_wait(), Ok(None)) {
            self.kill();
            let _ = self.runsc.wait();
            return Err(Error::Gone(
                "the gVisor sandbox is gone: runsc did not end after its checkpoint".into(),
            ));
        }
        let info = serde_json::to_vec(&self.snapshot_info)
            .map_err(|e| Error::host("encoding the snapshot's description", e));
        let written = info.and_then(|info| {
            std::fs::write(dir.join(SNAPSHOT_INFO_FILE), info)
                .map_err(|e| Error::host(format!("writing {}", dir.join(SNAPSHOT_INFO_FILE).display()), e))
        });
        // The same sandbox again, from what was just saved.
        let launch = Launch {
            runsc: &self.runsc_path,
            platform: self.platform,
            dir: &self.dir,
            id: &self.id,
            net_raw: self.egress.is_some(),
            procs: self.procs_paths.clone(),
        };
        let started = launch.start(Some(dir));
        let (runsc, channel) = match started {
            Ok(started) => started,
            Err(e) => {
                self.kill();
                return Err(e);
            }
        };
        self.runsc = runsc;
        self.channel = channel;
        self.alive = true;
        // Its keeper connects again; the programs it keeps are still this sandbox's.
        self.send(&ToGvAgent::Reattach { orphan: false }, &[])?;
        match self.recv(Some(Instant::now() + BOOT_TIMEOUT), &[])? {
            // It runs on either way; a snapshot without its description is no snapshot.
            ToHost::Ok => written.map(|()| true),
            other => {
                self.kill();
                Err(Error::host(
                    "restoring the gVisor sandbox after its checkpoint",
                    format!("unexpected answer {other:?}"),
                ))
            }
        }
    }

    fn ports(&self) -> Option<std::sync::Arc<dyn airlock_backend::PortConnector>> {
        self.procs.as_ref().map(crate::process::Hub::ports)
    }
}

/// How a sandbox was paused.
#[derive(Debug)]
enum Paused {
    /// Its v2 cgroup (this directory) is frozen.
    Freezer(PathBuf),
    /// `runsc pause`.
    Runsc,
}

/// How long a cgroup may take to say it is frozen (each of its tasks must reach the
/// freezer; a task in the middle of a system call gets there when the call returns).
const FREEZE_TIMEOUT: Duration = Duration::from_secs(5);

/// Freezes the v2 cgroup `dir` and waits until `cgroup.events` says every task in it is
/// frozen; past [`FREEZE_TIMEOUT`] it is thawed again and this fails.
fn freeze(dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join("cgroup.freeze"), "1")?;
    let deadline = Instant::now() + FREEZE_TIMEOUT;
    let mut nap = Duration::from_micros(100);
    loop {
        let events = std::fs::read_to_string(dir.join("cgroup.events"))?;
        if events.lines().any(|l| l == "frozen 1") {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let _ = std::fs::write(dir.join("cgroup.freeze"), "0");
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("its tasks were not all frozen within {FREEZE_TIMEOUT:?}"),
            ));
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(10));
    }
}

/// Reads until `buf` is full or `input` ends; how many bytes were read.
fn read_full(input: &mut dyn std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Whether any of `fds` is readable now.
fn poll_any(fds: &[BorrowedFd<'_>]) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    if fds.is_empty() {
        return false;
    }
    let mut p: Vec<PollFd<'_>> = fds.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)).collect();
    poll(&mut p, PollTimeout::ZERO).is_ok_and(|n| n > 0)
}

impl Drop for GvisorSandbox {
    fn drop(&mut self) {
        // Every process of the sandbox (runsc, the Sentry, the Gofer, ptrace stubs) is in
        // the cgroup: kill them all, reap runsc, then remove the cgroup, the bundle and
        // runsc's state (inside the bundle directory).
        self.kill();
        let _ = self.runsc.wait();
        // Every spawned program's wait answers SIGKILL from here on.
        drop(self.procs.take());
        if let Some(cg) = self.cgroup.take()
            && let Err(e) = cg.destroy()
        {
            tracing::warn!(sandbox = %self.id, "removing the gVisor sandbox's cgroup: {e}");
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(sandbox = %self.id, "removing {}: {e}", self.dir.display());
        }
        // This process's directory goes with its last sandbox (a later one recreates
        // it), so nothing is left even if the process never drops its backend.
        if let Some(owner_dir) = self.dir.parent() {
            let _ = std::fs::remove_dir(owner_dir);
        }
    }
}
