//! The host's end of the agent's frames: two pipes (the container's stdin and stdout).
//! Reads are non-blocking and polled beside the caller's cancel fds, with a deadline.

use airlock_vmwire::frame::{self as proto, Decoder, Frame, ToHost};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

/// What waiting for a frame gave.
pub enum Recv {
    /// A frame.
    Frame(Frame<ToHost>),
    /// The agent closed its end: the sandbox is gone.
    Closed,
    /// The deadline passed first.
    Deadline,
    /// A cancel fd turned readable first.
    Cancelled,
}

/// The pipes to and from the agent.
#[derive(Debug)]
pub struct Channel {
    /// Owned: the write end of the container's stdin.
    to: File,
    /// Owned: the read end of the container's stdout (non-blocking).
    from: OwnedFd,
    decoder: Decoder,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Recv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Recv::Frame(_) => "Frame",
            Recv::Closed => "Closed",
            Recv::Deadline => "Deadline",
            Recv::Cancelled => "Cancelled",
        })
    }
}

impl Channel {
    /// A channel over `to` (blocking) and `from` (made non-blocking here).
    pub fn new(to: OwnedFd, from: OwnedFd) -> io::Result<Channel> {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        fcntl(&from, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(io::Error::from)?;
        Ok(Channel {
            to: File::from(to),
            from,
            decoder: Decoder::default(),
            buf: vec![0; 256 << 10],
        })
    }

    /// Sends one frame (a `ToGuest` or a `wire::ToGvAgent`).
    pub fn send(&mut self, msg: &impl serde::Serialize, payload: &[u8]) -> io::Result<()> {
        proto::write(&mut self.to, msg, payload).map_err(|e| match e {
            proto::FrameError::Io(e) => e,
            e => io::Error::other(e),
        })
    }

    /// The next frame, waiting until `deadline` (`None`: forever) or until a `cancel`
    /// fd turns readable (polled, never read).
    pub fn recv(&mut self, deadline: Option<Instant>, cancel: &[BorrowedFd<'_>]) -> io::Result<Recv> {
        loop {
            if let Some(frame) = self
                .decoder
                .next_frame::<ToHost>()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?
            {
                return Ok(Recv::Frame(frame));
            }
            match nix::unistd::read(&self.from, &mut self.buf) {
                Ok(0) => return Ok(Recv::Closed),
                Ok(n) => {
                    self.decoder.push(&self.buf[..n]);
                    continue;
                }
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
            let timeout = match deadline {
                None => PollTimeout::NONE,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(Recv::Deadline);
                    }
                    PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX)
                }
            };
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(1 + cancel.len());
            fds.push(PollFd::new(self.from.as_fd(), PollFlags::POLLIN));
            fds.extend(cancel.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)));
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
            if fds[1..]
                .iter()
                .any(|f| f.revents().is_some_and(|r| !r.is_empty()))
            {
                return Ok(Recv::Cancelled);
            }
        }
    }
}
