//! One exec, supervised by the agent: the ready child gets its command, the program's
//! output goes to the host as it comes (up to the output limit; the rest is counted),
//! and the exec ends when its top process ends, its deadline passes or the host cancels
//! it. Then every process of the exec (of the execs' cgroup, see `jobs`; the egress
//! relay is in it too) is killed and reaped, so nothing of this exec outlives it, and
//! the programs spawned alongside execs (each in a cgroup of its own) are not touched.
//! Without cgroups, the agent, the sandbox's init, kills every other process
//! (`kill(-1)`).

use airlock_spec::{ExecResult, Limits, Outcome};
use airlock_vmwire::frame::{CHUNK, ToHost};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use super::Port;
use super::ready::{ReadyChild, Request};

/// How an exec ended.
pub enum Ran {
    /// With a result (its output went to the host as chunks).
    Result(Box<ExecResult>),
    /// The host cancelled it; its processes are gone.
    Cancelled,
    /// It could not run; its processes are gone.
    Failed(String),
}

/// One output stream of the program.
struct Stream {
    fd: Option<OwnedFd>,
    /// Bytes seen.
    total: u64,
    /// Bytes passed on (at most the limit).
    kept: u64,
    limit: u64,
}

impl Stream {
    fn new(fd: OwnedFd, limit: u64) -> Stream {
        Stream {
            fd: Some(fd),
            total: 0,
            kept: 0,
            limit,
        }
    }

    /// Reads what is there; sends what fits the limit as `msg` frames. `false` at EOF.
    fn pump(&mut self, port: &Port, msg: &ToHost, buf: &mut [u8]) -> std::io::Result<bool> {
        let Some(fd) = self.fd.as_ref() else {
            return Ok(false);
        };
        let n = match nix::unistd::read(fd, buf) {
            Ok(0) => {
                self.fd = None;
                return Ok(false);
            }
            Ok(n) => n,
            Err(Errno::EAGAIN | Errno::EINTR) => return Ok(true),
            Err(e) => {
                self.fd = None;
                return Err(e.into());
            }
        };
        self.total += n as u64;
        let room = self.limit.saturating_sub(self.kept).min(n as u64) as usize;
        if room > 0 {
            port.send(msg, &buf[..room])?;
            self.kept += room as u64;
        }
        Ok(true)
    }
}

fn nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
        .map(drop)
        .map_err(std::io::Error::from)
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Kills every process of the exec (of `cgroup`; without one, of the sandbox but the
/// agent) and reaps them all.
pub fn kill_all(cgroup: Option<&Path>) {
    match cgroup {
        Some(dir) => {
            super::jobs::kill_all(dir, reap_ended);
            reap_ended();
        }
        None => {
            // The agent is the sandbox's init: kill(-1) signals every other process of
            // the sandbox, whichever user it runs as.
            let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
            // Until ECHILD: none left.
            while matches!(waitpid(None, None), Ok(_) | Err(Errno::EINTR)) {}
        }
    }
}

/// Sends SIGKILL once to every process of the exec.
fn kill_rest(cgroup: Option<&Path>) {
    match cgroup {
        Some(dir) => {
            super::jobs::kill_round(dir);
        }
        None => {
            let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
        }
    }
}

/// Reaps every child of the agent that has ended (the exec's, the orphans of spawned
/// programs); never waits.
pub fn reap_ended() {
    while let Ok(s) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if s == WaitStatus::StillAlive {
            break;
        }
    }
}

/// Runs `request` in `child` with `stdin`, supervising it (see the module docs).
/// `cancel_pending`: the host's `Cancel` was read already.
pub fn run(
    child: ReadyChild,
    request: Request,
    stdin: Vec<u8>,
    limits: &Limits,
    sigchld: &SignalFd,
    port: &Port,
    cancel_pending: bool,
) -> Ran {
    let t0 = Instant::now();
    let ReadyChild {
        pid,
        cgroup,
        request: mut request_pipe,
        stdin: mut stdin_pipe,
        stdout,
        stderr,
    } = child;
    let cgroup = cgroup.as_deref();
    let sent = serde_json::to_vec(&request)
        .map_err(std::io::Error::other)
        .and_then(|bytes| request_pipe.write_all(&bytes));
    drop(request_pipe);
    if let Err(e) = sent {
        kill_all(cgroup);
        return Ran::Failed(format!("handing the command over: {e}"));
    }
    if let Err(e) = nonblocking(&stdout).and_then(|()| nonblocking(&stderr)) {
        kill_all(cgroup);
        return Ran::Failed(format!("output pipes: {e}"));
    }
    // Stdin is fed by a thread of its own (a program may not read it, or read it slowly);
    // it ends when the program closes its end or dies, at the latest at kill_all.
    // Without stdin, the pipe is closed at once: no thread (a clone in the Sentry).
    let feeder = (!stdin.is_empty()).then(|| {
        std::thread::spawn(move || {
            let _ = stdin_pipe.write_all(&stdin);
        })
    });
    let started = Instant::now();
    let setup_ms = ms(started - t0);
    let deadline = started + Duration::from_millis(limits.timeout_ms);
    let mut out = Stream::new(stdout, limits.output_bytes);
    let mut err = Stream::new(stderr, limits.output_bytes);
    let mut buf = vec![0u8; CHUNK];
    let mut status: Option<WaitStatus> = None;
    let mut timed_out = false;
    let mut cancelled = false;
    if cancel_pending {
        // The host's `Cancel` came with the request itself.
        cancelled = true;
        kill_top_and_rest(pid, &mut status, cgroup);
    }
    let mut failed: Option<String> = None;
    // Until the top process ended and both pipes are closed. Once it ended, whatever
    // else holds the pipes is killed, so they close.
    while status.is_none() || out.fd.is_some() || err.fd.is_some() {
        let now = Instant::now();
        if status.is_none() && now >= deadline {
            timed_out = true;
            kill_top_and_rest(pid, &mut status, cgroup);
            continue;
        }
        let wait = if status.is_none() {
            PollTimeout::try_from(deadline - now).unwrap_or(PollTimeout::MAX)
        } else {
            PollTimeout::from(100u8)
        };
        let mut fds = Vec::with_capacity(4);
        fds.push(PollFd::new(sigchld.as_fd(), PollFlags::POLLIN));
        fds.push(PollFd::new(port.readable(), PollFlags::POLLIN));
        if let Some(fd) = out.fd.as_ref() {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        }
        if let Some(fd) = err.fd.as_ref() {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, wait) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => {
                failed = Some(format!("poll: {e}"));
                kill_top_and_rest(pid, &mut status, cgroup);
                break;
            }
        }
        let ready = |i: usize| {
            fds.get(i)
                .and_then(|f| f.revents())
                .is_some_and(|r| !r.is_empty())
        };
        let (child_ready, cancel_ready) = (ready(0), ready(1));
        let (mut out_ready, mut err_ready) = (false, false);
        let mut i = 2;
        if out.fd.is_some() {
            out_ready = ready(i);
            i += 1;
        }
        if err.fd.is_some() {
            err_ready = ready(i);
        }
        drop(fds);
        if child_ready {
            while let Ok(Some(_)) = sigchld.read_signal() {}
            reap(pid, &mut status);
            if status.is_some() {
                // The top process ended: the exec ends with it.
                kill_rest(cgroup);
            }
        }
        if cancel_ready && status.is_none() {
            cancelled = true;
            kill_top_and_rest(pid, &mut status, cgroup);
        }
        if out_ready && let Err(e) = out.pump(port, &ToHost::Stdout, &mut buf) {
            return fail_after(format!("port: {e}"), cgroup, feeder);
        }
        if err_ready && let Err(e) = err.pump(port, &ToHost::Stderr, &mut buf) {
            return fail_after(format!("port: {e}"), cgroup, feeder);
        }
        if status.is_some() && !out_ready && !err_ready && !child_ready {
            // Ended, and a poll round passed with nothing to read: whatever still holds
            // a pipe was killed and is being reaped (or forked since: killed now).
            kill_rest(cgroup);
            reap(pid, &mut status);
        }
    }
    let wall_ms = ms(started.elapsed());
    kill_all(cgroup);
    if let Some(feeder) = feeder {
        let _ = feeder.join();
    }
    if let Some(e) = failed {
        return Ran::Failed(e);
    }
    if cancelled {
        return Ran::Cancelled;
    }
    let (exit_code, signal) = match status {
        Some(WaitStatus::Exited(_, code)) => (Some(code), None),
        Some(WaitStatus::Signaled(_, sig, _)) => (None, Some(sig as i32)),
        _ => (None, Some(Signal::SIGKILL as i32)),
    };
    Ran::Result(Box::new(ExecResult {
        id: String::new(),
        outcome: Outcome::of(false, timed_out, exit_code.is_some()),
        exit_code,
        signal,
        timed_out,
        oom_killed: false,
        stdout: String::new(),
        stderr: String::new(),
        stdout_truncated: out.total > out.kept,
        stderr_truncated: err.total > err.kept,
        stdout_bytes: out.total,
        stderr_bytes: err.total,
        wall_ms,
        setup_ms,
        cpu_ms: 0.0,
        memory_peak_bytes: 0,
        egress: Vec::new(),
        // The host side says which platform it was.
        isolation: airlock_spec::Isolation::Gvisor,
        platform: None,
        files_changed: Vec::new(),
        files_changed_truncated: false,
    }))
}

fn fail_after(e: String, cgroup: Option<&Path>, feeder: Option<std::thread::JoinHandle<()>>) -> Ran {
    kill_all(cgroup);
    if let Some(feeder) = feeder {
        let _ = feeder.join();
    }
    Ran::Failed(e)
}

/// Reaps whatever ended; notes the top process's status.
fn reap(top: Pid, status: &mut Option<WaitStatus>) {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(s) => {
                if s.pid() == Some(top) {
                    *status = Some(s);
                }
            }
        }
    }
}

/// Kills every process of the exec and waits for the top one.
fn kill_top_and_rest(top: Pid, status: &mut Option<WaitStatus>, cgroup: Option<&Path>) {
    kill_rest(cgroup);
    if cgroup.is_some() {
        // Not in the cgroup yet if it was killed before it moved itself there.
        let _ = kill(top, Signal::SIGKILL);
    }
    while status.is_none() {
        match waitpid(top, None) {
            Ok(s) if s.pid() == Some(top) => *status = Some(s),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => break,
        }
    }
}
