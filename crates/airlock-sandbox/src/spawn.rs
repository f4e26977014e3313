//! Programs alongside a session's execs, seen from the host: [`Sandbox::spawn`] asks init
//! for a keeper (see `keeper`), waits until the program started, and returns its stdio
//! and a [`ProcessHandle`] that talks to the keeper on the program's own channel.
//!
//! With a terminal, `stdout` and `stdin` are the master side (two fds of it): once no
//! process holds the slave side any more, reading it fails with `EIO` rather than
//! returning end of file; a reader takes that for end of file.
//!
//! Init serves one request at a time: while an exec runs, a spawn is refused as busy (the
//! server serializes a session's requests, so it never asks for one then). Once
//! started, the program is independent of init's requests: execs come and go, and their
//! sweeps spare it.

use airlock_backend::{Error, Exit, ProcessHandle, Spawned, Stdio};
use airlock_spec::Spec;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

use crate::protocol::{self, KeeperReply, KeeperRequest, Reply, Request};
use crate::sandbox::{Sandbox, unresolved_image};
use crate::{SandboxError, supervisor};

/// Starting a program takes milliseconds; this bounds a start that hangs.
const START_DEADLINE: Duration = Duration::from_secs(30);

impl Sandbox {
    /// Starts `spec`'s program alongside this session's execs and returns once it runs
    /// (see `airlock_backend::Sandbox::spawn`). Its command, env and workdir are used as
    /// an exec's are; its limits are the sandbox's (the spec's are not applied). Refused
    /// while an exec runs.
    pub fn spawn(&mut self, spec: &Spec, stdio: Stdio) -> Result<Spawned, SandboxError> {
        spec.validate()?;
        if spec.image.is_some() && !self.has_image() {
            return Err(SandboxError::Spec(unresolved_image()));
        }
        if !self.is_alive() {
            return Err(SandboxError::Gone);
        }
        self.refuse_paused()?;
        self.forget_index();
        self.leave_background()?;
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| SandboxError::Spawn(e.into()))?;
        let terminal = match stdio {
            Stdio::Terminal { rows, cols } => Some((rows, cols)),
            Stdio::Pipes => None,
        };
        // Pipes: the program's ends belong to the sandbox user (see `supervisor::exec`).
        let pipes = match terminal {
            Some(_) => None,
            None => {
                let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| SandboxError::Spawn(e.into()));
                let (stdin_r, stdin_w) = pipe()?;
                let (stdout_r, stdout_w) = pipe()?;
                let (stderr_r, stderr_w) = pipe()?;
                for fd in [&stdin_r, &stdout_w, &stderr_w] {
                    let user = self.host_user();
                    nix::unistd::fchown(fd, Some(user.into()), Some(self.host_group().into()))
                        .map_err(|e| SandboxError::Spawn(e.into()))?;
                }
                Some(([stdin_r, stdout_w, stderr_w], [stdin_w, stdout_r, stderr_r]))
            }
        };
        let mut fds: Vec<RawFd> = vec![theirs.as_raw_fd()];
        if let Some((program, _)) = &pipes {
            fds.extend(program.iter().map(AsRawFd::as_raw_fd));
        }
        let request = Request::Spawn {
            command: spec.command.clone(),
            env: supervisor::environment(spec, self.egress().as_deref()),
            max_file_bytes: self.disk_bytes(),
            workdir: spec.workdir.clone(),
            terminal,
        };
        self.send_fds(&request, &[], &fds)?;
        // Only the keeper holds the program's ends now.
        drop(theirs);
        let ours_of_pipes = pipes.map(|(program, ours)| {
            drop(program);
            ours
        });
        match self.file_reply()? {
            Reply::Ok => {}
            Reply::Failed { message } => return Err(SandboxError::Setup(message)),
            Reply::Error { message, .. } => return Err(SandboxError::Setup(message)),
            other => return Err(self.desync(&other)),
        }
        let (pid, master) = started(&ours)?;
        self.mark_spawned();
        let handle = Keeper {
            channel: ours,
            pid,
            terminal: match &master {
                Some(m) => Some(m.try_clone().map_err(SandboxError::Spawn)?),
                None => None,
            },
            exit: Mutex::new(None),
        };
        let (stdin, stdout, stderr) = match (ours_of_pipes, master) {
            (Some([stdin, stdout, stderr]), _) => (stdin, stdout, Some(stderr)),
            (None, Some(master)) => (master.try_clone().map_err(SandboxError::Spawn)?, master, None),
            (None, None) => return Err(SandboxError::Setup("the keeper sent no terminal".into())),
        };
        Ok(Spawned {
            stdin,
            stdout,
            stderr,
            handle: Box::new(handle),
        })
    }
}

/// Waits for the keeper's first report: the program's pid and, with a terminal, its
/// master side.
fn started(channel: &OwnedFd) -> Result<(i32, Option<OwnedFd>), SandboxError> {
    let deadline = Instant::now() + START_DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(SandboxError::Setup("the program did not start in time".into()));
        }
        let ms = left.as_millis().clamp(1, u128::from(u16::MAX)) as u16;
        let mut fds = [PollFd::new(channel.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, ms) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => break,
            Err(e) => return Err(SandboxError::Spawn(e.into())),
        }
    }
    let frame = match protocol::recv::<KeeperReply>(channel.as_fd()) {
        Ok(Some(frame)) => frame,
        Ok(None) | Err(_) => {
            return Err(SandboxError::Setup(
                "the program's keeper ended before the program started".into(),
            ));
        }
    };
    match frame.msg {
        KeeperReply::Started { pid } => Ok((pid, frame.fds.into_iter().next())),
        KeeperReply::Failed { message } => Err(SandboxError::Setup(message)),
        KeeperReply::Refused { field, message } => {
            Err(SandboxError::Spec(airlock_spec::SpecError::new(field, message)))
        }
        other => Err(SandboxError::Setup(format!(
            "unexpected report from the program's keeper: {other:?}"
        ))),
    }
}

/// The host's handle on one spawned program: the program's channel to its keeper.
#[derive(Debug)]
struct Keeper {
    /// The channel (signals go out, the exit comes back).
    channel: OwnedFd,
    /// The program's pid in the sandbox.
    pid: i32,
    /// The terminal's master side, for resizing; `None` with pipes.
    terminal: Option<OwnedFd>,
    /// How it ended, once known. Held while the exit is read, so two waiters never
    /// both read.
    exit: Mutex<Option<Exit>>,
}

impl ProcessHandle for Keeper {
    fn pid(&self) -> Option<u32> {
        u32::try_from(self.pid).ok()
    }

    fn signal(&self, signal: i32) -> Result<(), Error> {
        if !(1..=64).contains(&signal) {
            return Err(Error::invalid("signal", format!("{signal} is no signal number")));
        }
        if self.exit.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            return Ok(());
        }
        match protocol::send(self.channel.as_fd(), &KeeperRequest::Signal { signal }, &[], &[]) {
            Ok(()) => Ok(()),
            // The keeper is gone: the program has ended (or the sandbox with it).
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) => Ok(()),
            Err(e) => Err(Error::host("signalling the program", e)),
        }
    }

    fn resize(&self, rows: u16, cols: u16) -> Result<(), Error> {
        let Some(master) = &self.terminal else {
            return Err(Error::invalid("rows", "the program has no terminal"));
        };
        crate::keeper::resize(master.as_fd(), rows, cols).map_err(|e| Error::host("resizing the terminal", e))
    }

    fn wait(&self, cancel: &[BorrowedFd<'_>]) -> Result<Exit, Error> {
        loop {
            if let Some(exit) = *self.exit.lock().unwrap_or_else(|e| e.into_inner()) {
                return Ok(exit);
            }
            let mut fds = vec![PollFd::new(self.channel.as_fd(), PollFlags::POLLIN)];
            fds.extend(cancel.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)));
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(Error::host("waiting for the program", e)),
            }
            let ended = fds[0].any().unwrap_or(false);
            let cancelled = fds[1..].iter().any(|f| f.any().unwrap_or(false));
            drop(fds);
            if ended {
                let mut exit = self.exit.lock().unwrap_or_else(|e| e.into_inner());
                if exit.is_none() {
                    // Readable: the keeper's report, or its end (its channel closes when
                    // it dies: killed with the sandbox, the program is too).
                    let reply = protocol::recv::<KeeperReply>(self.channel.as_fd());
                    *exit = Some(match reply {
                        Ok(Some(f)) => match f.msg {
                            KeeperReply::Exited { code } => Exit::Code(code),
                            KeeperReply::Signaled { signal } => Exit::Signal(signal),
                            _ => Exit::Signal(libc::SIGKILL),
                        },
                        Ok(None) | Err(_) => Exit::Signal(libc::SIGKILL),
                    });
                }
                continue;
            }
            if cancelled {
                return Err(Error::Cancelled);
            }
        }
    }
}
