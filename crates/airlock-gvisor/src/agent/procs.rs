//! The process keeper: starts and keeps the programs spawned alongside execs, and
//! relays connections from the host to ports on the sandbox's loopback (the wire is
//! [`crate::procs`]).
//!
//! The agent forks it at `Create`, while single-threaded; it stays single-threaded
//! itself, so it may fork. It is in no exec's cgroup: an exec's end kills only the
//! execs' cgroup (see `jobs`). Each spawned program gets a cgroup of its own and a
//! parent ([`super::ready::program_init`]) that forks it (privileges dropped as an
//! exec's, [`super::ready::child`]), relays its terminal, passes signals on, and when
//! the program ends kills whatever is left in its cgroup and exits. `SIGKILL` kills
//! the whole cgroup. When the host's control connection closes, the keeper kills every
//! program and exits, unless it was asked to detach (before a checkpoint: see
//! [`crate::procs`]); then it holds no connection to the host until the agent sends it
//! `SIGUSR1` (reconnect, its programs still the host's) or `SIGUSR2` (reconnect to a
//! new host, a sandbox restored from a snapshot: its programs are nobody's and their
//! ends are not reported).

use super::jobs::{self, Jobs};
use super::pump::{Pumps, Way};
use super::ready::{self, Chores};
use crate::procs::{Event, Hello, MAX_LINE, Request, SANDBOX_DIR, SOCKET};
use airlock_backend::ErrorKind;
use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::{ForkResult, Pid, fork};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// How long a connection to a port on the loopback may take (it is refused or accepted
/// at once unless the listener's backlog is full).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Forks the keeper when the host serves its socket. The caller must be
/// single-threaded.
pub fn fork_keeper(
    seccomp: &airlock_seccomp::BpfProgram,
    disk_bytes: u64,
    jobs: &Jobs,
) -> io::Result<Option<Pid>> {
    let socket = Path::new(SANDBOX_DIR).join(SOCKET);
    if !socket.exists() {
        return Ok(None);
    }
    // SAFETY: the agent is single-threaded whenever it forks, so the child may allocate.
    match unsafe { fork() }? {
        ForkResult::Parent { child } => Ok(Some(child)),
        ForkResult::Child => {
            let code = match keep(seccomp, disk_bytes, jobs.clone()) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("airlock gVisor agent: the process keeper: {e}");
                    1
                }
            };
            // SAFETY: ends this forked child without the agent's atexit handlers.
            unsafe { libc::_exit(code) }
        }
    }
}

/// Opens a connection to the host's socket and says what it is.
fn connect(hello: &Hello) -> io::Result<UnixStream> {
    let mut s = UnixStream::connect(Path::new(SANDBOX_DIR).join(SOCKET))?;
    let mut line = serde_json::to_vec(hello).map_err(io::Error::other)?;
    line.push(b'\n');
    s.write_all(&line)?;
    Ok(s)
}

/// One spawned program.
struct Job {
    /// Its parent (see the module docs).
    init: Pid,
    /// Its cgroup.
    cgroup: std::path::PathBuf,
    /// Where the init writes the program's wait status.
    status: File,
    /// Signals for the program go to the init here.
    signals: File,
    /// Its terminal's master side (for resizes), if it has one.
    master: Option<OwnedFd>,
}

struct Keeper<'a> {
    seccomp: &'a airlock_seccomp::BpfProgram,
    disk_bytes: u64,
    /// The write side of the control connection; `None` while detached.
    control: Option<UnixStream>,
    jobs: HashMap<u64, Job>,
    /// Programs started for a host before a restore: reaped, never reported.
    orphans: Vec<Job>,
    cgroups: Jobs,
    /// The copies between programs' pipes and the host's streams.
    pumps: Pumps,
    /// Port relays (forked, each holding a connection to the host).
    relays: Vec<Pid>,
    /// Asked to detach: the control connection's end is not the host's.
    detaching: bool,
    /// Programs started so far (their cgroups' names).
    started: u64,
}

fn keep(seccomp: &airlock_seccomp::BpfProgram, disk_bytes: u64, cgroups: Jobs) -> io::Result<()> {
    // Only stderr (runsc's log) of the agent's fds: fds 0 and 1 are the agent's port,
    // whose ends must close when the agent's do.
    super::relay::close_all_but(&[2]);
    let null = File::options().read(true).write(true).open("/dev/null")?;
    for fd in [0, 1] {
        // SAFETY: dup2 of an open fd onto 0 and 1, which this process no longer uses.
        unsafe { libc::dup2(null.as_raw_fd(), fd) };
    }
    drop(null);
    let control = connect(&Hello::Control)?;
    // SIGCHLD is blocked (the agent's mask, inherited): it is read from a signalfd.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    let sigchld = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
    // The agent's word to reconnect after a detach (programs reset their mask).
    let mut wake_mask = SigSet::empty();
    wake_mask.add(Signal::SIGUSR1);
    wake_mask.add(Signal::SIGUSR2);
    wake_mask.thread_block().map_err(io::Error::from)?;
    let wake = SignalFd::with_flags(&wake_mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
    let mut keeper = Keeper {
        seccomp,
        disk_bytes,
        control: Some(control.try_clone()?),
        jobs: HashMap::new(),
        orphans: Vec::new(),
        cgroups,
        pumps: Pumps::default(),
        relays: Vec::new(),
        detaching: false,
        started: 0,
    };
    let mut reader = Some(control);
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let (host, child, woken, pumped) = {
            let mut fds = vec![
                nix::poll::PollFd::new(sigchld.as_fd(), nix::poll::PollFlags::POLLIN),
                nix::poll::PollFd::new(wake.as_fd(), nix::poll::PollFlags::POLLIN),
            ];
            if let Some(r) = reader.as_ref() {
                fds.push(nix::poll::PollFd::new(r.as_fd(), nix::poll::PollFlags::POLLIN));
            }
            let first_pump = fds.len();
            fds.extend(keeper.pumps.poll_fds());
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
            let ready: Vec<bool> = fds
                .iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            let host = reader.is_some() && ready[2];
            (host, ready[0], ready[1], ready[first_pump..].to_vec())
        };
        keeper.pumps.service(&pumped);
        if child {
            while let Ok(Some(_)) = sigchld.read_signal() {}
            keeper.reap()?;
        }
        if woken {
            let mut orphan = false;
            let mut any = false;
            while let Ok(Some(sig)) = wake.read_signal() {
                any = true;
                orphan |= sig.ssi_signo == Signal::SIGUSR2 as u32;
            }
            if any && reader.is_none() {
                keeper.reattach(orphan)?;
                reader = keeper.control.as_ref().map(UnixStream::try_clone).transpose()?;
                pending.clear();
            }
        }
        if host && let Some(r) = reader.as_mut() {
            let n = match r.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                // The host is gone: so is every program.
                for job in keeper.jobs.values().chain(&keeper.orphans) {
                    jobs::kill_round(&job.cgroup);
                    let _ = kill(job.init, Signal::SIGKILL);
                }
                return Ok(());
            }
            pending.extend_from_slice(&buf[..n]);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                match serde_json::from_slice::<Request>(&line) {
                    Ok(request) => keeper.handle(request)?,
                    Err(e) => return Err(io::Error::other(format!("a bad request: {e}"))),
                }
                if keeper.detaching {
                    // Detached: the control connection goes too (its end tells the host),
                    // and whatever the host sent after the request with it.
                    keeper.detaching = false;
                    keeper.control = None;
                    reader = None;
                    pending.clear();
                    break;
                }
            }
            if pending.len() > MAX_LINE {
                return Err(io::Error::other("a request over the longest line"));
            }
        }
    }
}

impl Keeper<'_> {
    fn send(&mut self, event: &Event) -> io::Result<()> {
        let mut line = serde_json::to_vec(event).map_err(io::Error::other)?;
        line.push(b'\n');
        match self.control.as_mut() {
            Some(c) => c.write_all(&line),
            // Detached: nobody to tell (a restored sandbox's host does not know it).
            None => Ok(()),
        }
    }

    /// `Detach`: every connection to the host is dropped but the control one, which
    /// the caller drops after the answer.
    fn detach(&mut self, id: u64) -> io::Result<()> {
        if self.jobs.values().any(|j| j.master.is_some()) {
            return self.fail(
                id,
                ErrorKind::Invalid,
                Some("sandbox"),
                "a program with a terminal is running: its connection to the host cannot be saved".into(),
            );
        }
        // Port connections end.
        for pid in self.relays.drain(..) {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(pid, None);
        }
        self.pumps.detach();
        self.send(&Event::Detached { id })?;
        self.detaching = true;
        Ok(())
    }

    /// Connects to the host again (after a detach). `orphan`: the host is a new one
    /// (a restored sandbox's), which never started the programs running here.
    fn reattach(&mut self, orphan: bool) -> io::Result<()> {
        if orphan {
            let jobs: Vec<Job> = self.jobs.drain().map(|(_, j)| j).collect();
            self.orphans.extend(jobs);
        }
        self.control = Some(connect(&Hello::Control)?);
        Ok(())
    }

    fn fail(&mut self, id: u64, kind: ErrorKind, field: Option<&str>, message: String) -> io::Result<()> {
        self.send(&Event::Failed {
            id,
            kind,
            field: field.map(str::to_owned),
            message,
        })
    }

    fn handle(&mut self, request: Request) -> io::Result<()> {
        match request {
            Request::Spawn {
                id,
                command,
                env,
                extra_env,
                workdir,
                nproc,
                terminal,
            } => {
                let workdir = workdir.unwrap_or_else(|| "/workspace".into());
                if !Path::new(&workdir).is_dir() {
                    return self.fail(
                        id,
                        ErrorKind::Invalid,
                        Some("workdir"),
                        format!("{workdir}: no such directory in the sandbox to start the program in"),
                    );
                }
                let mut extra = extra_env;
                extra.push(("PWD".into(), workdir.clone()));
                let request = ready::Request {
                    command,
                    env: super::environment(&extra, env),
                    workdir,
                    max_file_bytes: self.disk_bytes,
                    nproc,
                };
                match self.spawn(id, &request, terminal) {
                    Ok((job, pid)) => {
                        self.jobs.insert(id, job);
                        self.send(&Event::Started { id, pid })
                    }
                    Err(e) => self.fail(id, ErrorKind::Host, None, format!("starting the program: {e}")),
                }
            }
            Request::Signal { id, signal } => {
                if let Some(job) = self.jobs.get_mut(&id) {
                    if signal == libc::SIGKILL {
                        // Everything the program started; its parent then reports it.
                        jobs::kill_round(&job.cgroup);
                    }
                    let _ = job.signals.write_all(&signal.to_ne_bytes());
                }
                Ok(())
            }
            Request::Resize { id, rows, cols } => {
                if let Some(job) = self.jobs.get_mut(&id)
                    && let Some(master) = job.master.as_ref()
                    && set_size(master.as_raw_fd(), rows, cols).is_ok()
                {
                    // This gVisor release changes the size without telling anyone: the
                    // terminal's foreground process group gets SIGWINCH from here (the
                    // program itself when the terminal does not say which group).
                    match foreground(master.as_raw_fd()) {
                        Some(pgrp) => {
                            let _ = nix::sys::signal::killpg(pgrp, Signal::SIGWINCH);
                        }
                        None => {
                            let _ = job.signals.write_all(&libc::SIGWINCH.to_ne_bytes());
                        }
                    }
                }
                Ok(())
            }
            Request::Detach { id } => self.detach(id),
            Request::Connect { id, port } => {
                let at = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                let tcp = match TcpStream::connect_timeout(&at, CONNECT_TIMEOUT) {
                    Ok(tcp) => tcp,
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        return self.fail(
                            id,
                            ErrorKind::NotFound,
                            Some("port"),
                            format!("nothing listens on port {port} in the sandbox"),
                        );
                    }
                    Err(e) => {
                        return self.fail(
                            id,
                            ErrorKind::Host,
                            None,
                            format!("connecting to port {port}: {e}"),
                        );
                    }
                };
                // Forwarded requests go out in pieces: no Nagle wait for a delayed ACK.
                let _ = tcp.set_nodelay(true);
                match connect(&Hello::Stream { id, stream: 0 }).and_then(|host| fork_relay(tcp, host)) {
                    Ok(pid) => {
                        self.relays.push(pid);
                        self.send(&Event::Connected { id })
                    }
                    Err(e) => self.fail(id, ErrorKind::Host, None, format!("relaying port {port}: {e}")),
                }
            }
        }
    }

    /// Reaps whatever ended; reports the programs that did.
    fn reap(&mut self) -> io::Result<()> {
        use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
        loop {
            let pid = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => return Ok(()),
                Ok(s) => s.pid(),
            };
            if let Some(pid) = pid {
                self.relays.retain(|r| *r != pid);
            }
            if let Some(i) = self.orphans.iter().position(|j| Some(j.init) == pid) {
                let job = self.orphans.swap_remove(i);
                jobs::kill_all(&job.cgroup, || {});
                let _ = std::fs::remove_dir(&job.cgroup);
                continue;
            }
            let Some(id) = self
                .jobs
                .iter()
                .find(|(_, j)| Some(j.init) == pid)
                .map(|(id, _)| *id)
            else {
                continue; // a port relay
            };
            let Some(mut job) = self.jobs.remove(&id) else {
                continue;
            };
            self.pumps.ended(id);
            let mut raw = [0u8; 4];
            let (code, signal) = if job.status.read_exact(&mut raw).is_ok() {
                let raw = i32::from_ne_bytes(raw);
                if libc::WIFEXITED(raw) {
                    (Some(libc::WEXITSTATUS(raw)), None)
                } else if libc::WIFSIGNALED(raw) {
                    (None, Some(libc::WTERMSIG(raw)))
                } else {
                    (None, Some(libc::SIGKILL))
                }
            } else {
                // Its parent was killed (the sandbox is going), and the program with it.
                (None, Some(libc::SIGKILL))
            };
            // Its parent killed what was left in its cgroup before it exited.
            jobs::kill_all(&job.cgroup, || {});
            let _ = std::fs::remove_dir(&job.cgroup);
            self.send(&Event::Exited { id, code, signal })?;
        }
    }

    /// Starts `request` in a cgroup of its own, its stdio relayed to the host.
    fn spawn(
        &mut self,
        id: u64,
        request: &ready::Request,
        terminal: Option<(u16, u16)>,
    ) -> io::Result<(Job, Option<u32>)> {
        let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
        let pipe = || nix::unistd::pipe2(cloexec).map_err(io::Error::from);
        // The program's stdio and what the init keeps.
        let (stdio, tty, relay): ([OwnedFd; 3], Option<OwnedFd>, Option<(OwnedFd, UnixStream)>) =
            match terminal {
                None => {
                    // Pipes, the keeper's ends copied to and from the host's streams.
                    let s = |stream| connect(&Hello::Stream { id, stream }).map(OwnedFd::from);
                    let hosts = [s(0)?, s(1)?, s(2)?];
                    let (stdin_r, stdin_w) = pipe()?;
                    let (stdout_r, stdout_w) = pipe()?;
                    let (stderr_r, stderr_w) = pipe()?;
                    let [host_in, host_out, host_err] = hosts;
                    self.pumps.add(id, Way::In, host_in, stdin_w)?;
                    self.pumps.add(id, Way::Out, stdout_r, host_out)?;
                    self.pumps.add(id, Way::Out, stderr_r, host_err)?;
                    ([stdin_r, stdout_w, stderr_w], None, None)
                }
                Some((rows, cols)) => {
                    let pty = nix::pty::openpty(
                        Some(&nix::pty::Winsize {
                            ws_row: rows,
                            ws_col: cols,
                            ws_xpixel: 0,
                            ws_ypixel: 0,
                        }),
                        None,
                    )?;
                    for fd in [&pty.master, &pty.slave] {
                        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))?;
                    }
                    let host = connect(&Hello::Stream { id, stream: 0 })?;
                    let slave = pty.slave;
                    (
                        [slave.try_clone()?, slave.try_clone()?, slave.try_clone()?],
                        Some(slave),
                        Some((pty.master, host)),
                    )
                }
            };
        let (status_r, status_w) = pipe()?;
        let (signals_r, signals_w) = pipe()?;
        let (request_r, request_w) = pipe()?;
        let master = match &relay {
            Some((m, _)) => Some(m.try_clone()?),
            None => None,
        };
        // Named by the keeper's own count: a restored sandbox's host numbers its
        // programs afresh while those from before the snapshot still run.
        self.started += 1;
        let cgroup = self.cgroups.program(self.started)?;
        // SAFETY: the keeper is single-threaded, so the child may allocate.
        match unsafe { fork() }? {
            ForkResult::Child => {
                drop((status_r, signals_w, request_w, master));
                // SIGCHLD of the program, read from a signalfd.
                let mut mask = SigSet::empty();
                mask.add(Signal::SIGCHLD);
                let Ok(sigchld) = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
                else {
                    // SAFETY: ends this forked parent at once.
                    unsafe { libc::_exit(1) }
                };
                // SAFETY: this parent is single-threaded (forked from the keeper).
                match unsafe { fork() } {
                    Ok(ForkResult::Child) => {
                        drop((status_w, signals_r, relay, sigchld));
                        // Into its cgroup before it can start anything (still root).
                        if jobs::join(&cgroup, nix::unistd::getpid()).is_err() {
                            // SAFETY: ends this forked child at once.
                            unsafe { libc::_exit(126) }
                        }
                        let tty = tty.as_ref().map(AsRawFd::as_raw_fd);
                        ready::child(self.seccomp, request_r, stdio, tty)
                    }
                    Ok(ForkResult::Parent { child }) => {
                        drop((request_r, stdio, tty));
                        let mut chores = InitChores {
                            sigchld,
                            signals: Some(File::from(signals_r)),
                            relay: relay.map(|(master, host)| Relay::new(master, host)),
                            queued: Vec::new(),
                        };
                        ready::program_init(child, status_w, &mut chores, &cgroup)
                    }
                    // SAFETY: ends this forked parent at once.
                    Err(_) => unsafe { libc::_exit(1) },
                }
            }
            ForkResult::Parent { child: init } => {
                drop((status_w, signals_r, request_r, stdio, tty, relay));
                let bytes = serde_json::to_vec(request).map_err(io::Error::other)?;
                let mut request_w = File::from(request_w);
                if let Err(e) = request_w.write_all(&bytes) {
                    let _ = kill(init, Signal::SIGKILL);
                    return Err(e);
                }
                drop(request_w);
                let job = Job {
                    init,
                    cgroup,
                    status: File::from(status_r),
                    signals: File::from(signals_w),
                    master,
                };
                Ok((job, program_pid(init)))
            }
        }
    }
}

/// The pid (in the sandbox's namespace) of the only child of `init`, from /proc.
fn program_pid(init: Pid) -> Option<u32> {
    for _ in 0..50 {
        let found = std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid ...: comm may hold spaces and parentheses.
            let rest = &stat[stat.rfind(')')? + 1..];
            let ppid: i32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == init.as_raw()).then_some(pid)
        });
        if found.is_some() {
            return found;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// The foreground process group of the terminal whose master side is `fd`.
fn foreground(fd: RawFd) -> Option<Pid> {
    let mut pgrp: libc::pid_t = 0;
    // SAFETY: TIOCGPGRP writes one pid_t through a valid pointer to a local.
    let r = unsafe { libc::ioctl(fd, libc::TIOCGPGRP, &mut pgrp) };
    (r == 0 && pgrp > 0).then(|| Pid::from_raw(pgrp))
}

/// `TIOCSWINSZ` on a terminal: its foreground process group gets SIGWINCH.
fn set_size(fd: RawFd, rows: u16, cols: u16) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from a valid pointer to a local.
    if unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A spawned program's init's chores: SIGCHLD wakes it, signals from the keeper are
/// passed on, its terminal is relayed to the host.
struct InitChores {
    sigchld: SignalFd,
    /// `None` once the keeper is gone.
    signals: Option<File>,
    relay: Option<Relay>,
    queued: Vec<i32>,
}

impl Chores for InitChores {
    fn fds(&self) -> Vec<RawFd> {
        let mut fds = vec![self.sigchld.as_raw_fd()];
        fds.extend(self.signals.as_ref().map(AsRawFd::as_raw_fd));
        if let Some(r) = &self.relay {
            fds.extend(r.fds());
        }
        fds
    }

    fn ready(&mut self) {
        while let Ok(Some(_)) = self.sigchld.read_signal() {}
        if let Some(signals) = self.signals.as_mut()
            && poll_now(signals.as_raw_fd())
        {
            let mut raw = [0u8; 4];
            match signals.read_exact(&mut raw) {
                Ok(()) => self.queued.push(i32::from_ne_bytes(raw)),
                Err(_) => {
                    // The keeper is gone (the sandbox is going): so is the program.
                    self.signals = None;
                    self.queued.push(libc::SIGKILL);
                }
            }
        }
        if let Some(r) = self.relay.as_mut() {
            r.pump();
        }
    }

    fn finish(&mut self) {
        if let Some(r) = self.relay.as_mut() {
            r.drain();
        }
    }

    fn signal(&mut self) -> Option<i32> {
        self.queued.pop()
    }
}

/// Whether `fd` is readable now.
fn poll_now(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, no wait.
    unsafe { libc::poll(&mut p, 1, 0) > 0 && p.revents != 0 }
}

/// A terminal's master side relayed to the host's stream, both ways (blocking writes:
/// the host reads what the terminal shows, and the program waits when it does not).
struct Relay {
    master: Option<OwnedFd>,
    host: Option<UnixStream>,
    buf: Vec<u8>,
}

impl Relay {
    fn new(master: OwnedFd, host: UnixStream) -> Relay {
        Relay {
            master: Some(master),
            host: Some(host),
            buf: vec![0; 16 << 10],
        }
    }

    /// Both sides while both are open; neither once one is gone (nothing to copy).
    fn fds(&self) -> Vec<RawFd> {
        match (&self.master, &self.host) {
            (Some(m), Some(h)) => vec![m.as_raw_fd(), h.as_raw_fd()],
            _ => Vec::new(),
        }
    }

    /// Copies what is readable now, each way.
    fn pump(&mut self) {
        if let (Some(m), Some(h)) = (&self.master, &mut self.host)
            && poll_now(m.as_raw_fd())
        {
            match nix::unistd::read(m, &mut self.buf) {
                Ok(n) if n > 0 => {
                    if h.write_all(&self.buf[..n]).is_err() {
                        self.host = None;
                    }
                }
                // EIO: no process holds the terminal's slave side any more.
                Ok(_) | Err(_) => self.master = None,
            }
        }
        if let (Some(m), Some(h)) = (&self.master, &mut self.host)
            && poll_now(h.as_raw_fd())
        {
            match h.read(&mut self.buf) {
                Ok(n) if n > 0 => {
                    if write_all(m, &self.buf[..n]).is_err() {
                        self.master = None;
                    }
                }
                // The host closed its side: nothing more to type.
                Ok(_) | Err(_) => self.host = None,
            }
        }
    }

    /// After the program ended: what the terminal still holds goes to the host.
    fn drain(&mut self) {
        while let (Some(m), Some(h)) = (&self.master, &mut self.host) {
            if !poll_now(m.as_raw_fd()) {
                break;
            }
            match nix::unistd::read(m, &mut self.buf) {
                Ok(n) if n > 0 => {
                    if h.write_all(&self.buf[..n]).is_err() {
                        break;
                    }
                }
                _ => break,
            }
        }
    }
}

fn write_all(fd: &OwnedFd, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match nix::unistd::write(fd, bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Forks a process that copies both ways between `tcp` and `host` until both sides
/// are done. The keeper is single-threaded, so the child may allocate.
fn fork_relay(tcp: TcpStream, host: UnixStream) -> io::Result<Pid> {
    // SAFETY: the keeper is single-threaded.
    match unsafe { fork() }? {
        ForkResult::Parent { child } => Ok(child),
        ForkResult::Child => {
            super::relay::close_all_but(&[tcp.as_raw_fd(), host.as_raw_fd(), 2]);
            copy_both_ways(tcp, host);
            // SAFETY: ends this forked child without the agent's atexit handlers.
            unsafe { libc::_exit(0) }
        }
    }
}

fn copy_both_ways(mut tcp: TcpStream, mut host: UnixStream) {
    use std::net::Shutdown;
    let mut buf = vec![0u8; 64 << 10];
    let (mut up, mut down) = (true, true); // host -> tcp, tcp -> host
    while up || down {
        let mut fds = Vec::new();
        if up {
            fds.push(nix::poll::PollFd::new(host.as_fd(), nix::poll::PollFlags::POLLIN));
        }
        if down {
            fds.push(nix::poll::PollFd::new(tcp.as_fd(), nix::poll::PollFlags::POLLIN));
        }
        if let Err(e) = nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE)
            && e != Errno::EINTR
        {
            return;
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        let mut i = 0;
        if up {
            if ready[i] {
                match host.read(&mut buf) {
                    Ok(n) if n > 0 => {
                        if tcp.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                    _ => {
                        up = false;
                        let _ = tcp.shutdown(Shutdown::Write);
                    }
                }
            }
            i += 1;
        }
        if down && ready[i] {
            match tcp.read(&mut buf) {
                Ok(n) if n > 0 => {
                    if host.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
                _ => {
                    down = false;
                    let _ = host.shutdown(Shutdown::Write);
                }
            }
        }
    }
}
