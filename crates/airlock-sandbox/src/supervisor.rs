//! Supervising one exec from outside the sandbox: hand init the program and its stdio
//! pipes, feed stdin, drain stdout/stderr up to the cap, enforce the wall-clock deadline
//! from outside (through the cgroup), and turn what happened into an `ExecResult`.

use airlock_spec::{ExecResult, Outcome, Spec};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, poll};

use crate::SandboxError;
use crate::protocol::{Reply, Request};
use crate::sandbox::Sandbox;

/// After the program ends (or is killed), how long stray holders of the output pipes get
/// to die before the result is returned without their last bytes.
const DRAIN_GRACE: Duration = Duration::from_millis(250);
/// After a session's exec was killed at its deadline, how long init gets to report; past
/// it, the whole sandbox is killed.
const KILL_GRACE: Duration = Duration::from_secs(1);
/// How often a running program's memory is looked at for thrashing.
const THRASH_TICK: Duration = Duration::from_millis(250);
/// Major faults (a mapped page read back from disk) within one [`THRASH_TICK`] that make
/// the tick a thrashing one: 25, a hundred a second.
const THRASH_FAULTS: u64 = 25;
/// Or, where the kernel accounts pressure stalls per cgroup (v2 with PSI), a tick in
/// which every task of the sandbox was stalled on memory at once for at least this share
/// of it (in 1/1000): thrashing measured by the time lost, which a slow machine (a
/// micro-VM's guest under emulation, a host short of CPU) does not hide as it hides the
/// fault rate.
const THRASH_STALL_PERMILLE: u64 = 500;
/// Thrashing ticks in a row, with the sandbox at its memory cap all along, that end the
/// program as `oom` (two seconds). At its cap, a program whose anonymous and shared
/// memory cannot be dropped (no swap) keeps only its file pages (its own code, its
/// libraries) reclaimable: the kernel evicts them and reads them back over and over,
/// and may never call its OOM killer. The program makes next to no progress: it is out
/// of memory, and is ended as the OOM killer would have ended it.
const THRASH_TICKS: u32 = 8;
/// Read size per wake-up: large enough to drain a flood in few syscalls.
const CHUNK: usize = 64 * 1024;

pub use airlock_backend::{Capture, OutputSink};

/// One look at a running program's memory for thrashing (see [`THRASH_TICKS`]).
#[derive(Debug)]
struct Thrash {
    at: Instant,
    /// The cgroup's major faults so far.
    faults: u64,
    /// Its full memory stall so far, in µs, where the kernel accounts it.
    stall_us: Option<u64>,
    /// Thrashing ticks in a row, up to this look.
    hot: u32,
}

impl Thrash {
    /// Whether the program thrashed between `last` and this look: a hundred major faults
    /// a second, or half the time stalled on memory.
    fn thrashing_since(&self, last: &Thrash) -> bool {
        if self.faults >= last.faults + THRASH_FAULTS {
            return true;
        }
        let (Some(now), Some(then)) = (self.stall_us, last.stall_us) else {
            return false;
        };
        let tick_us = self.at.duration_since(last.at).as_micros() as u64;
        now.saturating_sub(then) * 1000 >= tick_us * THRASH_STALL_PERMILLE
    }
}

/// Kills a session's exec from outside: every process of the sandbox but init and the
/// keepers' (see `Cgroup::kill_except`). Returns whether the CPU quota was lifted for
/// that, until init reports them gone (it is, when the sandbox has a cgroup).
fn kill_exec(sb: &Sandbox) -> bool {
    sb.cgroup().is_some_and(|cg| {
        let _ = cg.kill_except(sb.init_pid(), sb.keeper_uid());
        true
    })
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

    /// Reads what is available; returns the range of newly kept bytes.
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

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.kept).into_owned()
    }
}

/// Grows the read buffer to [`CHUNK`] once a read of `read` bytes filled it: output is
/// flowing.
fn grow(buf: &mut Vec<u8>, read: u64) {
    if read == buf.len() as u64 && buf.len() < CHUNK {
        buf.resize(CHUNK, 0);
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

/// The environment every program starts with, on every tier; the caller's own is never
/// inherited. Each tier adds the proxy's variables (in proxy mode) and the request's own
/// on top: this tier's `environment`, the micro-VM guest agent (airlock-guest) and the
/// gVisor agent (airlock-gvisor).
pub fn base_env() -> Vec<(String, String)> {
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

/// The final environment: defaults, the proxy's variables in proxy mode (with the
/// secrets' placeholders), then the spec's
/// variables (a later one wins).
pub(crate) fn environment(spec: &Spec, proxy: Option<&airlock_egress::Proxy>) -> Vec<(String, String)> {
    let mut env = base_env();
    if let Some(dir) = &spec.workdir {
        env.retain(|(key, _)| key != "PWD");
        env.push(("PWD".into(), dir.clone()));
    }
    // The proxy's variables, each secret's placeholder, where the trust bundle is.
    if let Some(proxy) = proxy {
        env.extend(proxy.sandbox_env());
    }
    for (k, v) in &spec.env {
        env.retain(|(key, _)| key != k);
        env.push((k.clone(), v.clone()));
    }
    env
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// What the poll loop waits on.
#[derive(Clone, Copy)]
enum Source {
    Stdout,
    Stderr,
    Control,
    Stdin,
    Init,
    Cancel,
}

/// Runs `spec`'s program in `sb` (files already written, limits applied). With
/// `one_shot`, the deadline kills the whole sandbox; otherwise only the exec's processes.
/// `t0` is when the request started (for `setup_ms`).
pub(crate) fn exec(
    sb: &mut Sandbox,
    spec: &Spec,
    sink: &mut dyn OutputSink,
    cancel: &[BorrowedFd<'_>],
    one_shot: bool,
    t0: Instant,
) -> Result<ExecResult, SandboxError> {
    let before = match sb.take_baseline() {
        Some(usage) => usage,
        None => {
            let usage = sb.cgroup().map(|cg| cg.usage()).unwrap_or_default();
            if let Some(cg) = sb.cgroup() {
                cg.reset_peak();
            }
            usage
        }
    };
    let (stdin_r, stdin_w) = pipe().map_err(SandboxError::Spawn)?;
    let (stdout_r, stdout_w) = pipe().map_err(SandboxError::Spawn)?;
    let (stderr_r, stderr_w) = pipe().map_err(SandboxError::Spawn)?;
    // A pipe's inode belongs to its creator with mode 0600, and opening
    // /dev/stdin (/proc/self/fd/0) opens that inode afresh, checked against that owner: the
    // program's ends belong to the sandbox user, or `cat /dev/stdin` fails with EACCES.
    // (Landlock leaves pipes alone: they are outside every filesystem it rules.)
    for fd in [&stdin_r, &stdout_w, &stderr_w] {
        let user = sb.host_user();
        nix::unistd::fchown(fd, Some(user.into()), Some(sb.host_group().into()))
            .map_err(|e| SandboxError::Spawn(e.into()))?;
    }
    let request = Request::Exec {
        command: spec.command.clone(),
        env: environment(spec, sb.egress().as_deref()),
        max_file_bytes: sb.disk_bytes(),
        workdir: spec.workdir.clone(),
        last: one_shot,
        terminal: false,
    };
    sb.send_fds(
        &request,
        &[],
        &[stdin_r.as_raw_fd(), stdout_w.as_raw_fd(), stderr_w.as_raw_fd()],
    )?;
    // Only the sandbox holds the program's ends now: EOF means the program and all its
    // descendants are gone.
    drop((stdin_r, stdout_w, stderr_w));
    if let Err(e) = sb.leave_background() {
        // The program would run on the CPU time nobody else wants: never silently.
        sb.kill();
        return Err(e);
    }

    // Empty stdin: the write end closes here, so the program reads EOF at once.
    let mut stdin = (!spec.stdin.is_empty()).then_some(stdin_w);
    if let Some(w) = &stdin {
        set_nonblocking(w).map_err(SandboxError::Spawn)?;
    }
    for fd in [&stdout_r, &stderr_r] {
        set_nonblocking(fd).map_err(SandboxError::Spawn)?;
    }
    // Thrashing at the memory cap (see THRASH_TICKS): the last look.
    let mut thrash: Option<Thrash> = None;
    let mut thrashed = false;
    let mut out = Stream::new(stdout_r, spec.limits.output_bytes);
    let mut err = Stream::new(stderr_r, spec.limits.output_bytes);
    let mut stdin_pos = 0usize;
    // Small at first (most short programs write little or nothing), grown to CHUNK once a
    // read fills it.
    let mut buf = vec![0u8; 4096];

    let timeout = Duration::from_millis(spec.limits.timeout_ms);
    let mut started: Option<Instant> = None;
    let mut ended: Option<Instant> = None;
    let mut final_reply: Option<Reply> = None;
    let mut failure: Option<String> = None;
    let mut refused: Option<airlock_spec::SpecError> = None;
    let mut timed_out = false;
    let mut cancelled = false;
    let mut killed_all = false;
    let mut init_gone = false;
    // A session's exec killed with its init spared: the CPU quota is lifted until init
    // reports the killed processes gone (see `Cgroup::kill_except`).
    let mut quota_lifted = false;
    // Until Started, the deadline bounds the hand-over; then it is the program's own.
    let mut deadline = Instant::now() + Duration::from_secs(30);

    loop {
        let finished = final_reply.is_some() || failure.is_some() || refused.is_some() || init_gone;
        if finished && ended.is_none() {
            ended = Some(Instant::now());
            deadline = Instant::now() + DRAIN_GRACE;
        }
        if finished && out.fd.is_none() && err.fd.is_none() {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            if ended.is_some() {
                break; // drain grace over: stray pipe holders lose their last bytes
            }
            if started.is_none() {
                failure = Some("the program did not start in time".into());
                killed_all = true;
                sb.kill();
                continue;
            }
            if !timed_out && !cancelled && !thrashed {
                timed_out = true;
                // The deadline is enforced from outside the sandbox, through its cgroup.
                if one_shot {
                    killed_all = true;
                    sb.kill();
                } else {
                    quota_lifted |= kill_exec(sb);
                }
                deadline = Instant::now() + KILL_GRACE;
                continue;
            }
            // Init did not report within the grace: the whole sandbox goes.
            killed_all = true;
            sb.kill();
            init_gone = true;
            continue;
        }
        if started.is_some()
            && !(finished || timed_out || cancelled || thrashed)
            && thrash.as_ref().is_none_or(|t| now >= t.at + THRASH_TICK)
            && let Some(cg) = sb.cgroup()
            && let Some(faults) = cg.major_faults()
        {
            let look = Thrash {
                at: now,
                faults,
                stall_us: cg.memory_full_stall_us(),
                hot: 0,
            };
            let hot = match &thrash {
                Some(last) if look.thrashing_since(last) && cg.at_memory_cap() => last.hot + 1,
                _ => 0,
            };
            thrash = Some(Thrash { hot, ..look });
            if hot >= THRASH_TICKS {
                thrashed = true;
                if one_shot {
                    killed_all = true;
                    sb.kill();
                } else {
                    quota_lifted |= kill_exec(sb);
                    deadline = Instant::now() + KILL_GRACE;
                }
                continue;
            }
        }
        let mut wake = deadline;
        if let Some(t) = &thrash
            && !thrashed
        {
            wake = wake.min(t.at + THRASH_TICK);
        }
        let wait_ms = (wake.max(now) - now).as_millis().clamp(1, u128::from(u16::MAX)) as u16;

        let mut fds = Vec::with_capacity(6);
        let mut sources = Vec::with_capacity(6);
        if let Some(fd) = &out.fd {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            sources.push(Source::Stdout);
        }
        if let Some(fd) = &err.fd {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            sources.push(Source::Stderr);
        }
        if final_reply.is_none() && failure.is_none() && refused.is_none() && !init_gone {
            fds.push(PollFd::new(sb.control(), PollFlags::POLLIN));
            sources.push(Source::Control);
            fds.push(PollFd::new(sb.pidfd(), PollFlags::POLLIN));
            sources.push(Source::Init);
        }
        if let Some(fd) = &stdin {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLOUT));
            sources.push(Source::Stdin);
        }
        if !cancelled {
            for fd in cancel {
                fds.push(PollFd::new(*fd, PollFlags::POLLIN));
                sources.push(Source::Cancel);
            }
        }
        match poll(&mut fds, wait_ms) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(SandboxError::Spawn(e.into())),
        }
        let ready: Vec<Source> = fds
            .iter()
            .zip(&sources)
            .filter(|(fd, _)| fd.revents().is_some_and(|r| !r.is_empty()))
            .map(|(_, s)| *s)
            .collect();
        drop(fds);
        for source in ready {
            match source {
                Source::Stdout => {
                    let total = out.total;
                    if let Some(range) = out.read_some(&mut buf) {
                        sink.stdout(&out.kept[range]);
                    }
                    grow(&mut buf, out.total - total);
                }
                Source::Stderr => {
                    let total = err.total;
                    if let Some(range) = err.read_some(&mut buf) {
                        sink.stderr(&err.kept[range]);
                    }
                    grow(&mut buf, err.total - total);
                }
                Source::Control => match crate::protocol::recv::<Reply>(sb.control()) {
                    Ok(Some(frame)) => match frame.msg {
                        Reply::Started => {
                            let now = Instant::now();
                            started = Some(now);
                            deadline = now + timeout;
                            // Cancelled during the hand-over: the program goes now that
                            // it runs (see `Source::Cancel`).
                            if cancelled && !one_shot {
                                quota_lifted |= kill_exec(sb);
                                deadline = now + KILL_GRACE;
                            }
                        }
                        Reply::Failed { message } => failure = Some(message),
                        Reply::Refused { field, message } => {
                            refused = Some(airlock_spec::SpecError::new(field, message));
                        }
                        reply @ (Reply::Exited { .. } | Reply::Signaled { .. }) => final_reply = Some(reply),
                        other => failure = Some(format!("unexpected reply from init: {other:?}")),
                    },
                    Ok(None) | Err(_) => init_gone = true,
                },
                Source::Init => init_gone = true,
                Source::Stdin => {
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
                Source::Cancel if !cancelled => {
                    // Not read: one cancel fd may stop many execs at once. A one-shot
                    // sandbox dies whole; a session loses only this exec's processes
                    // (init then reports, or is killed too after the grace). During the
                    // hand-over they are killed once init says Started: a ready child
                    // killed before it took the command would be replaced by init and
                    // the program run anyway, and killing the whole session for a
                    // client that went away early would lose its files.
                    cancelled = true;
                    if one_shot {
                        killed_all = true;
                        sb.kill();
                        init_gone = true;
                    } else if started.is_some() {
                        quota_lifted |= kill_exec(sb);
                        deadline = Instant::now() + KILL_GRACE;
                    }
                    // Otherwise killed on Started, above; the hand-over deadline holds.
                }
                Source::Cancel => {}
            }
        }
    }

    let mut end = ended.unwrap_or_else(Instant::now);
    if init_gone || killed_all {
        // Without init nothing else can run here; make sure everything is dead.
        sb.kill();
        init_gone = true;
    }
    let init_status = if init_gone {
        let status = sb.reap();
        // Init exits only once every process of its namespace is gone: that, not the
        // moment it was told to die, is when the program ended.
        end = end.max(Instant::now());
        Some(status)
    } else {
        None
    };
    if quota_lifted
        && !init_gone
        && let Some(cg) = sb.cgroup()
        && cg.restore_cpu_quota(sb.cpus()).is_err()
    {
        // Never let the session's next exec run without the CPU limit it reports.
        sb.kill();
        sb.reap();
        return Err(SandboxError::Gone);
    }
    if cancelled {
        return Err(SandboxError::Cancelled);
    }
    let after = sb.cgroup().map(|cg| cg.usage()).unwrap_or_default();

    if let Some(e) = refused {
        return Err(SandboxError::Spec(e));
    }
    let Some(started) = started else {
        let message = failure
            .unwrap_or_else(|| format!("the sandbox ended before the program started ({init_status:?})"));
        return Err(SandboxError::Setup(message));
    };
    // Thrashing at the cap ended it as the OOM killer would have (see THRASH_TICKS).
    let oom_killed = after.oom_kills > before.oom_kills || thrashed;
    // How the program's own top process ended, whatever the outcome: init's report, or,
    // when init died with the sandbox before reporting (a one-shot's deadline, the OOM
    // killer choosing init), the signal that ended them both.
    let (exit_code, signal) = match final_reply {
        Some(Reply::Exited { code }) => (Some(code), None),
        Some(Reply::Signaled { signal }) => (None, Some(signal)),
        _ => match init_status {
            Some(nix::sys::wait::WaitStatus::Signaled(_, sig, _)) => (None, Some(sig as i32)),
            _ => (None, Some(libc::SIGKILL)),
        },
    };
    let outcome = Outcome::of(oom_killed, timed_out, exit_code.is_some());
    Ok(ExecResult {
        id: sb.id().to_owned(),
        outcome,
        exit_code,
        signal,
        timed_out,
        oom_killed,
        stdout_truncated: out.truncated(),
        stderr_truncated: err.truncated(),
        stdout_bytes: out.total,
        stderr_bytes: err.total,
        stdout: out.text(),
        stderr: err.text(),
        wall_ms: ms(end.saturating_duration_since(started)),
        setup_ms: ms(started.saturating_duration_since(t0)),
        cpu_ms: after.cpu_ns.saturating_sub(before.cpu_ns) as f64 / 1e6,
        memory_peak_bytes: after.memory_peak_bytes,
        egress: sb.take_egress(),
        isolation: airlock_spec::Isolation::Namespaces,
        platform: None,
        files_changed: Vec::new(),
        files_changed_truncated: false,
    })
}
