//! The process keeper's copies between spawned programs' pipes and the host's streams:
//! non-blocking, one buffer each, so a host that does not read holds up only its own
//! program (whose pipe fills), never the keeper.

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};
use std::os::fd::{AsFd, OwnedFd};

/// Bytes held per copy: as much as a pipe.
const BUF: usize = 64 << 10;

/// Which way a copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// From the host's stream to a program's stdin pipe.
    In,
    /// From a program's stdout or stderr pipe to the host's stream.
    Out,
}

/// One copy, from `from` to `to`.
struct Pump {
    /// The program it belongs to.
    job: u64,
    way: Way,
    /// `None` once it ended (end of file or an error) or, for `In`, once detached.
    from: Option<OwnedFd>,
    /// `None`: what is read is dropped (`Out` after a detach, or once the host stopped
    /// reading).
    to: Option<OwnedFd>,
    buf: Vec<u8>,
    /// Bytes of `buf` not yet written.
    start: usize,
}

/// Every copy of the keeper.
#[derive(Default)]
pub struct Pumps {
    pumps: Vec<Pump>,
    /// Programs' stdin pipes kept open (never written) after a detach, so that a program
    /// reading its stdin waits instead of seeing end of file; dropped with their program.
    held: Vec<(u64, OwnedFd)>,
}

fn nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

impl Pumps {
    /// Copies `from` to `to` for program `job`.
    pub fn add(&mut self, job: u64, way: Way, from: OwnedFd, to: OwnedFd) -> std::io::Result<()> {
        nonblocking(&from)?;
        nonblocking(&to)?;
        self.pumps.push(Pump {
            job,
            way,
            from: Some(from),
            to: Some(to),
            buf: Vec::with_capacity(BUF),
            start: 0,
        });
        Ok(())
    }

    /// What to poll, one entry per copy: each waits on its source while its buffer is
    /// empty, on its destination while it is not. (A copy with neither end open is
    /// never kept: `service`, `detach` and `ended` remove it.)
    pub fn poll_fds(&self) -> Vec<PollFd<'_>> {
        self.pumps
            .iter()
            .filter_map(|p| {
                let pending = p.start < p.buf.len();
                match (&p.from, &p.to) {
                    (_, Some(to)) if pending => Some(PollFd::new(to.as_fd(), PollFlags::POLLOUT)),
                    (Some(from), _) => Some(PollFd::new(from.as_fd(), PollFlags::POLLIN)),
                    // Ended and flushed: polled for nothing, removed at the next `service`.
                    (None, Some(to)) => Some(PollFd::new(to.as_fd(), PollFlags::empty())),
                    (None, None) => None,
                }
            })
            .collect()
    }

    /// Copies what can be copied now without blocking; `ready[i]` says whether copy
    /// `i` (in [`Pumps::poll_fds`]'s order) had an event.
    pub fn service(&mut self, ready: &[bool]) {
        let polled = self
            .pumps
            .iter_mut()
            .filter(|p| p.from.is_some() || p.to.is_some());
        for (p, &ready) in polled.zip(ready) {
            if ready {
                p.step();
            }
        }
        self.pumps
            .retain(|p| p.from.is_some() || (p.to.is_some() && p.start < p.buf.len()));
    }

    /// Drops every end that is the host's: `In` copies go (their stdin pipe is held),
    /// `Out` copies read on and drop what they read.
    pub fn detach(&mut self) {
        let mut kept = Vec::new();
        for mut p in self.pumps.drain(..) {
            match p.way {
                Way::In => {
                    if let Some(to) = p.to.take() {
                        self.held.push((p.job, to));
                    }
                }
                Way::Out => {
                    p.to = None;
                    p.buf.clear();
                    p.start = 0;
                    if p.from.is_some() {
                        kept.push(p);
                    }
                }
            }
        }
        self.pumps = kept;
    }

    /// Program `job` ended: its held stdin pipe goes (its output is still copied until
    /// its pipes are drained).
    pub fn ended(&mut self, job: u64) {
        self.held.retain(|(j, _)| *j != job);
        for p in self.pumps.iter_mut().filter(|p| p.job == job && p.way == Way::In) {
            // Nothing reads the stdin pipe any more.
            p.from = None;
            p.to = None;
        }
        self.pumps.retain(|p| p.from.is_some() || p.to.is_some());
    }
}

impl Pump {
    /// One read or one write, whichever is due.
    fn step(&mut self) {
        if self.start < self.buf.len() {
            let Some(to) = self.to.as_ref() else { return };
            match nix::unistd::write(to, &self.buf[self.start..]) {
                Ok(n) => self.start += n,
                Err(Errno::EAGAIN | Errno::EINTR) => {}
                Err(_) => {
                    // The reader is gone: the source is not read any more either, so the
                    // program sees its pipe break as it would have seen the socket's.
                    self.to = None;
                    self.from = None;
                }
            }
            if self.start == self.buf.len() {
                self.buf.clear();
                self.start = 0;
            }
            return;
        }
        let Some(from) = self.from.as_ref() else {
            // Ended and flushed: closing `to` passes the end of file on.
            self.to = None;
            return;
        };
        self.buf.resize(BUF, 0);
        match nix::unistd::read(from, &mut self.buf) {
            Ok(0) | Err(Errno::EIO | Errno::ECONNRESET | Errno::EPIPE) => {
                self.buf.clear();
                self.from = None;
                self.to = None;
            }
            Ok(n) => {
                self.buf.truncate(n);
                if self.to.is_none() {
                    self.buf.clear();
                }
            }
            Err(Errno::EAGAIN | Errno::EINTR) => self.buf.clear(),
            Err(_) => {
                self.buf.clear();
                self.from = None;
                self.to = None;
            }
        }
        // Written at once when it can be (the next poll waits only if it cannot).
        if !self.buf.is_empty() {
            self.step();
        }
    }
}
