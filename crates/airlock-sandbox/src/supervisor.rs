//! The supervisor: everything outside the sandbox for one run. It creates the cgroup,
//! clones init into fresh namespaces, writes the uid maps, hands init its config, then
//! feeds stdin, drains stdout/stderr up to the cap, enforces the deadline from outside,
//! and purges everything the sandbox owned, on every path.

use airlock_spec::{ExecResult, Outcome, Spec};
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, poll};

use crate::cgroup::{Cgroup, CgroupLimits};
use crate::protocol::{InitConfig, InitReport, write_config};
use crate::{Engine, SandboxError, init::INIT_ARG, sys};

/// Namespaces the sandbox is cloned into. The cgroup namespace is not among them: init
/// unshares it itself once the supervisor has moved it into every v1 cgroup, so that
/// its cgroup root is the sandbox's own cgroup in every hierarchy (a cgroup namespace
/// made at clone time would be rooted in the supervisor's v1 cgroups and show the
/// host's cgroup paths).
const NAMESPACES: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS) as u64;

/// Building the sandbox takes milliseconds; this bounds a setup that hangs.
const SETUP_DEADLINE: Duration = Duration::from_secs(30);
/// After the program ends (or is killed), how long stray holders of the output pipes
/// get to die before the result is returned without their last bytes.
const DRAIN_GRACE: Duration = Duration::from_millis(250);
/// Read size per wake-up: large enough to drain a flood in few syscalls.
const CHUNK: usize = 64 * 1024;
/// Child-side fds are first moved above this, so the dup2 into 0..=4 never clobbers.
const HIGH_FD: RawFd = 100;

/// Where live output goes while it is captured (the CLI streams it to its own stdio).
pub trait OutputSink {
    /// Bytes the program wrote to stdout, within the output limit.
    fn stdout(&mut self, _data: &[u8]) {}
    /// Bytes the program wrote to stderr, within the output limit.
    fn stderr(&mut self, _data: &[u8]) {}
}

/// An [`OutputSink`] that only captures.
#[derive(Debug, Default)]
pub struct Capture;
impl OutputSink for Capture {}

/// First host uid of the ranges sandboxes are mapped to: well above any real account.
pub const HOST_UID_BASE: u32 = 0x4000_0000;
/// Number of distinct 65536-id slots handed out round-robin.
pub const HOST_UID_SLOTS: u32 = 8192;

/// The host uid that sandbox uid 0 maps to for the `n`th sandbox of this process.
fn host_uid_base(n: u32) -> u32 {
    let mix = std::process::id().wrapping_mul(7919).wrapping_add(n);
    HOST_UID_BASE + (mix % HOST_UID_SLOTS) * 65536
}

/// One stream's capture: keeps up to `limit` bytes, counts everything.
#[derive(Debug)]
struct Stream {
    fd: Option<OwnedFd>,
    kept: Vec<u8>,
    total: u64,
    limit: u64,
}

impl Stream {
    fn new(fd: OwnedFd, limit: u64) -> Self {
        Stream {
            fd: Some(fd),
            kept: Vec::new(),
            total: 0,
            limit,
        }
    }

    /// Reads what is available; returns the newly kept bytes' range.
    fn read_some(&mut self, buf: &mut [u8]) -> Option<std::ops::Range<usize>> {
        let fd = self.fd.as_ref()?;
        match nix::unistd::read(fd, buf) {
            Ok(0) => {
                self.fd = None;
                None
            }
            Ok(n) => {
                self.total += n as u64;
                let room = self.limit.saturating_sub(self.kept.len() as u64) as usize;
                let keep = n.min(room);
                let start = self.kept.len();
                self.kept.extend_from_slice(&buf[..keep]);
                Some(start..start + keep)
            }
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => None,
            Err(_) => {
                self.fd = None;
                None
            }
        }
    }

    fn truncated(&self) -> bool {
        self.total > self.kept.len() as u64
    }
}

/// A sandbox being run: owns its cgroup, its init process and the supervisor's ends of
/// the pipes. Dropping it kills and reaps init and removes the cgroup, on every path.
struct Running {
    /// The cgroup; removed on drop (after init is reaped).
    cgroup: Option<Cgroup>,
    /// Init's pid in the host pid namespace (reaped on drop).
    pid: libc::pid_t,
    /// pidfd of init: signals without pid-reuse races; readable once init exits.
    pidfd: OwnedFd,
    /// Whether init has been reaped already.
    reaped: Option<nix::sys::wait::WaitStatus>,
}

impl Running {
    fn kill(&self) {
        let _ = sys::pidfd_send_signal(self.pidfd.as_raw_fd(), libc::SIGKILL);
        if let Some(cg) = &self.cgroup {
            let _ = cg.kill();
        }
    }

    fn reap(&mut self) -> nix::sys::wait::WaitStatus {
        if let Some(status) = self.reaped {
            return status;
        }
        let status = loop {
            match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None) {
                Err(nix::errno::Errno::EINTR) => continue,
                Ok(status) => break status,
                Err(_) => break nix::sys::wait::WaitStatus::StillAlive,
            }
        };
        self.reaped = Some(status);
        status
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.reaped.is_none() {
            self.kill();
            self.reap();
        }
        if let Some(cg) = self.cgroup.take() {
            let _ = cg.destroy();
        }
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
        .map(drop)
        .map_err(io::Error::from)
}

/// Moves `fd` to a number >= HIGH_FD (close-on-exec), for the child's dup2 step.
fn high(fd: &OwnedFd) -> io::Result<OwnedFd> {
    let raw = fcntl(fd, FcntlArg::F_DUPFD_CLOEXEC(HIGH_FD)).map_err(io::Error::from)?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new fd that nothing else owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) })
}

/// A fresh sandbox id: 16 hex digits from the kernel's random source.
fn new_id() -> Result<String, SandboxError> {
    let mut bytes = [0u8; 8];
    sys::getrandom(&mut bytes).map_err(SandboxError::Spawn)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The environment every program starts with; the caller's own is never inherited.
fn base_env() -> Vec<(String, String)> {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", "/workspace"),
        ("PWD", "/workspace"),
        ("TMPDIR", "/tmp"),
        ("USER", "sandbox"),
        ("LOGNAME", "sandbox"),
        ("LANG", "C.UTF-8"),
        ("HOSTNAME", "airlock"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// The final environment: defaults, then the spec's variables (a later one wins).
fn environment(spec: &Spec) -> Vec<(String, String)> {
    let mut env = base_env();
    for (k, v) in &spec.env {
        env.retain(|(key, _)| key != k);
        env.push((k.clone(), v.clone()));
    }
    env
}

/// Runs `spec` to completion. See [`Engine::run`].
pub(crate) fn run(
    engine: &Engine,
    spec: &Spec,
    sink: &mut dyn OutputSink,
    cancel: Option<BorrowedFd<'_>>,
) -> Result<ExecResult, SandboxError> {
    spec.validate()?;
    let t0 = Instant::now();
    let id = new_id()?;
    let limits = CgroupLimits {
        memory_bytes: spec.limits.memory_bytes,
        cpus: spec.limits.cpus,
        // airlock's init is one more process in the cgroup.
        pids: spec.limits.pids + 1,
    };
    let cgroup = engine.cgroups.create(&id, &limits)?;

    let (stdin_r, stdin_w) = pipe().map_err(SandboxError::Spawn)?;
    let (stdout_r, stdout_w) = pipe().map_err(SandboxError::Spawn)?;
    let (stderr_r, stderr_w) = pipe().map_err(SandboxError::Spawn)?;
    let (config_r, config_w) = pipe().map_err(SandboxError::Spawn)?;
    let (report_r, report_w) = pipe().map_err(SandboxError::Spawn)?;
    let child_fds = [&stdin_r, &stdout_w, &stderr_w, &config_r, &report_w]
        .map(high)
        .into_iter()
        .collect::<io::Result<Vec<_>>>()
        .map_err(SandboxError::Spawn)?;
    drop((stdin_r, stdout_w, stderr_w, config_r, report_w));

    // Everything the child touches before execve is prepared here: the child of a
    // multi-threaded supervisor must not allocate or take locks.
    let exe = c"/proc/self/exe";
    let init_arg = CString::new(INIT_ARG).expect("constant has no NUL");
    let argv: [*const libc::c_char; 3] = [c"airlock-init".as_ptr(), init_arg.as_ptr(), std::ptr::null()];
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let raw_fds: [RawFd; 5] = std::array::from_fn(|i| child_fds[i].as_raw_fd());

    let cgroup_fd = cgroup.clone_into_fd().map(|fd| fd.as_raw_fd());
    // SAFETY: the child branch below only calls async-signal-safe functions (dup2,
    // close_range, prctl, setsid, read, execve, _exit) on data prepared above.
    let cloned = unsafe { sys::clone_process(NAMESPACES, cgroup_fd) }.map_err(SandboxError::Spawn)?;
    let Some(cloned) = cloned else {
        // In the child.
        // SAFETY: async-signal-safe libc calls only; every pointer refers to memory
        // prepared before the clone and still mapped in this copy of the address space.
        unsafe {
            for (target, fd) in raw_fds.iter().enumerate() {
                if libc::dup2(*fd, target as RawFd) < 0 {
                    libc::_exit(120);
                }
            }
            if sys::close_from(5).is_err() {
                libc::_exit(121);
            }
            // Own session: a terminal's Ctrl-C reaches the supervisor only.
            libc::setsid();
            // Wait for the uid maps: exec before them would drop all capabilities.
            let mut go = 0u8;
            if libc::read(3, (&mut go as *mut u8).cast(), 1) != 1 {
                libc::_exit(122);
            }
            // Become the namespace's root: until now the credentials are the host's
            // (unmapped here), and an exec under them would drop every capability.
            // Drop the host's supplementary groups too. Raw syscalls, not glibc's
            // wrappers: those signal every thread glibc believes exists, and the
            // supervisor's other threads do not exist in this child.
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, 0, 0, 0) != 0
                || libc::syscall(libc::SYS_setresuid, 0, 0, 0) != 0
            {
                libc::_exit(124);
            }
            // Die with the supervisor. Set only now: a change of effective uid clears
            // it. A supervisor that died before this line leaves init a config pipe at
            // EOF, and init exits at once.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
            libc::execve(exe.as_ptr(), argv.as_ptr(), envp.as_ptr());
            libc::_exit(123)
        }
    };
    drop(child_fds);
    let mut running = Running {
        cgroup: Some(cgroup),
        pid: cloned.pid,
        pidfd: cloned.pidfd,
        reaped: None,
    };

    // The child waits on its config pipe: map its ids, then go.
    let base = host_uid_base(engine.next_slot());
    let map = format!("0 {base} {}\n", crate::mounts::SANDBOX_ID + 1);
    for file in ["uid_map", "gid_map"] {
        let path = format!("/proc/{}/{file}", cloned.pid);
        std::fs::write(&path, &map).map_err(|e| SandboxError::Setup(format!("writing {path}: {e}")))?;
    }
    let config = InitConfig {
        command: spec.command.clone(),
        env: environment(spec),
        files: spec
            .files
            .iter()
            .map(|f| (f.path.clone(), f.mode, f.content.len() as u64))
            .collect(),
        disk_bytes: spec.limits.disk_bytes,
        rootfs: spec.rootfs.clone(),
        seccomp_len: engine.seccomp.len() as u64,
    };
    let mut config_w = File::from(config_w);
    let contents: Vec<&[u8]> = spec.files.iter().map(|f| f.content.as_slice()).collect();
    let sent = config_w
        .write_all(b"G")
        .and_then(|()| write_config(&mut config_w, &config, &engine.seccomp, &contents));
    // Joining the v1 cgroups can wait for an RCU grace period (milliseconds); init builds
    // the filesystem meanwhile and waits for this byte before anything it does is worth
    // charging (the spec's files, the program).
    if let Some(cg) = &running.cgroup {
        cg.attach(cloned.pid, cloned.in_cgroup)?;
    }
    let sent = sent.and_then(|()| config_w.write_all(b"A"));
    drop(config_w);

    let mut stdin = if spec.stdin.is_empty() {
        None
    } else {
        Some(stdin_w)
    };
    if let Some(w) = &stdin {
        set_nonblocking(w).map_err(SandboxError::Spawn)?;
    }
    for fd in [&stdout_r, &stderr_r, &report_r] {
        set_nonblocking(fd).map_err(SandboxError::Spawn)?;
    }
    let mut out = Stream::new(stdout_r, spec.limits.output_bytes);
    let mut err = Stream::new(stderr_r, spec.limits.output_bytes);
    let mut report = Some(report_r);
    let mut report_buf = Vec::new();
    let mut stdin_pos = 0usize;

    let mut started: Option<Instant> = None;
    let mut ended: Option<Instant> = None;
    let mut final_report: Option<InitReport> = None;
    let mut failure: Option<String> = if let Err(e) = sent {
        Some(format!("sending the config: {e}"))
    } else {
        None
    };
    let mut timed_out = false;
    let mut init_gone = false;
    let mut deadline = t0 + SETUP_DEADLINE;
    let mut buf = vec![0u8; CHUNK];

    loop {
        let finished = final_report.is_some() || failure.is_some() || timed_out || init_gone;
        if finished && ended.is_none() {
            ended = Some(Instant::now());
            // The run is over: whatever still runs in the sandbox dies now.
            running.kill();
            deadline = Instant::now() + DRAIN_GRACE;
        }
        if finished && out.fd.is_none() && err.fd.is_none() && (report.is_none() || init_gone) {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            if ended.is_some() {
                break; // drain grace over
            }
            if started.is_some() {
                timed_out = true;
            } else {
                failure = Some(format!("the sandbox did not start within {SETUP_DEADLINE:?}"));
            }
            continue;
        }
        let wait_ms = (deadline - now).as_millis().clamp(1, u128::from(u16::MAX)) as u16;

        // Build the poll set; `slots` records which source each entry is.
        let mut fds = Vec::with_capacity(6);
        let mut slots = Vec::with_capacity(6);
        if let Some(fd) = &out.fd {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            slots.push(0);
        }
        if let Some(fd) = &err.fd {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            slots.push(1);
        }
        if let Some(fd) = &report {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            slots.push(2);
        }
        if let Some(fd) = &stdin {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLOUT));
            slots.push(3);
        }
        if !init_gone {
            fds.push(PollFd::new(running.pidfd.as_fd(), PollFlags::POLLIN));
            slots.push(4);
        }
        if let Some(fd) = cancel {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
            slots.push(5);
        }
        match poll(&mut fds, wait_ms) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(SandboxError::Spawn(e.into())),
        }
        let ready: Vec<usize> = fds
            .iter()
            .zip(&slots)
            .filter(|(fd, _)| fd.revents().is_some_and(|r| !r.is_empty()))
            .map(|(_, slot)| *slot)
            .collect();
        drop(fds);
        for slot in ready {
            match slot {
                0 => {
                    if let Some(range) = out.read_some(&mut buf) {
                        sink.stdout(&out.kept[range]);
                    }
                }
                1 => {
                    if let Some(range) = err.read_some(&mut buf) {
                        sink.stderr(&err.kept[range]);
                    }
                }
                2 => {
                    let Some(fd) = &report else { continue };
                    match nix::unistd::read(fd, &mut buf) {
                        Ok(0) => report = None,
                        Ok(n) => report_buf.extend_from_slice(&buf[..n]),
                        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                        Err(_) => report = None,
                    }
                    while let Some(nl) = report_buf.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = report_buf.drain(..=nl).collect();
                        match serde_json::from_slice::<InitReport>(&line) {
                            Ok(InitReport::Started) => {
                                let now = Instant::now();
                                started = Some(now);
                                deadline = now + Duration::from_millis(spec.limits.timeout_ms);
                            }
                            Ok(InitReport::Failed { message }) => failure = Some(message),
                            Ok(done) => final_report = Some(done),
                            Err(e) => failure = Some(format!("garbled report from init: {e}")),
                        }
                    }
                }
                3 => {
                    let Some(fd) = &stdin else { continue };
                    match nix::unistd::write(fd, &spec.stdin[stdin_pos..]) {
                        Ok(n) => stdin_pos += n,
                        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                        Err(_) => stdin_pos = spec.stdin.len(), // EPIPE: the program stopped reading
                    }
                    if stdin_pos >= spec.stdin.len() {
                        stdin = None; // EOF for the program
                    }
                }
                4 => {
                    // Init exited. Its last report may still sit in the pipe: read it first.
                    init_gone = true;
                    running.reap();
                    if let Some(fd) = report.take() {
                        let mut rest = Vec::new();
                        let _ = File::from(fd).read_to_end(&mut rest);
                        report_buf.extend_from_slice(&rest);
                        for line in report_buf.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                            match serde_json::from_slice::<InitReport>(line) {
                                Ok(InitReport::Started) if started.is_none() => {
                                    started = Some(Instant::now())
                                }
                                Ok(InitReport::Failed { message }) => failure = Some(message),
                                Ok(InitReport::Started) => {}
                                Ok(done) => final_report = Some(done),
                                Err(_) => {}
                            }
                        }
                        report_buf.clear();
                    }
                }
                _ => {
                    let _ = nix::unistd::read(cancel.expect("slot 5 is the cancel fd"), &mut buf);
                    return Err(SandboxError::Cancelled);
                }
            }
        }
    }

    let end = ended.unwrap_or_else(Instant::now);
    running.kill();
    let init_status = running.reap();
    let usage = running.cgroup.as_ref().map(Cgroup::usage).unwrap_or_default();
    drop(running); // removes the cgroup

    if let Some(message) = failure {
        if started.is_none() {
            return Err(SandboxError::Setup(message));
        }
    }
    let started = started.ok_or_else(|| {
        SandboxError::Setup(format!(
            "init ended before starting the program ({init_status:?})"
        ))
    })?;
    let oom_killed = usage.oom_kills > 0;
    let (outcome, exit_code, signal) = if timed_out {
        (Outcome::Timeout, None, Some(libc::SIGKILL))
    } else {
        let (exit_code, signal) = match final_report {
            Some(InitReport::Exited { code }) => (Some(code), None),
            Some(InitReport::Signaled { signal }) => (None, Some(signal)),
            // Init itself was killed (by the OOM killer, say) before reporting.
            _ => match init_status {
                nix::sys::wait::WaitStatus::Signaled(_, sig, _) => (None, Some(sig as i32)),
                _ => (None, Some(libc::SIGKILL)),
            },
        };
        if oom_killed {
            (Outcome::Oom, None, signal.or(Some(libc::SIGKILL)))
        } else if let Some(code) = exit_code {
            (Outcome::Exited, Some(code), None)
        } else {
            (Outcome::Signaled, None, signal)
        }
    };
    Ok(ExecResult {
        id,
        outcome,
        exit_code,
        signal,
        timed_out,
        oom_killed,
        stdout_truncated: out.truncated(),
        stderr_truncated: err.truncated(),
        stdout_bytes: out.total,
        stderr_bytes: err.total,
        stdout: String::from_utf8_lossy(&out.kept).into_owned(),
        stderr: String::from_utf8_lossy(&err.kept).into_owned(),
        wall_ms: ms(end.saturating_duration_since(started)),
        setup_ms: ms(started.saturating_duration_since(t0)),
        cpu_ms: usage.cpu_ns as f64 / 1e6,
        memory_peak_bytes: usage.memory_peak_bytes,
    })
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}
