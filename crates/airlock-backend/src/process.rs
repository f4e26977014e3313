//! Programs that run alongside a session's execs: background processes, terminals, the
//! code interpreter's kernel. And the one way into a session from outside: a connection
//! to a TCP port its programs listen on.

use crate::Error;
use std::os::fd::{BorrowedFd, OwnedFd};

/// How a spawned program's stdio is wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdio {
    /// Three pipes: stdin, stdout, stderr.
    Pipes,
    /// A pseudo-terminal of this size made inside the sandbox: the program is its
    /// session leader and the terminal is its controlling terminal and stdin, stdout and
    /// stderr.
    Terminal {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
}

/// How a spawned program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// This signal ended it.
    Signal(i32),
}

/// A program started by [`crate::Sandbox::spawn`]. It runs until it ends, is killed, or
/// its session is purged; its own processes live and die with it (when it ends, whatever
/// it left running is killed, as after an exec), and they count against the session's
/// memory, CPU and pids limits. A session's execs never kill it.
///
/// The host ends of its stdio are plain fds (pipes, sockets, a terminal's master side):
/// the caller reads and writes them as it likes, from any thread. End of file on
/// `stdout` (and `stderr`) comes when the program and everything it started have closed
/// them, at the latest when it ends.
#[derive(Debug)]
pub struct Spawned {
    /// Writes go to the program's stdin (a terminal's input). Close it to send end of
    /// file (for a terminal: send `^D` instead).
    pub stdin: OwnedFd,
    /// The program's stdout (a terminal's output: everything it shows).
    pub stdout: OwnedFd,
    /// The program's stderr; `None` with a terminal (it writes to the terminal).
    pub stderr: Option<OwnedFd>,
    /// What controls it and says when it ended.
    pub handle: Box<dyn ProcessHandle>,
}

/// Controls one spawned program. Shared between threads (one may wait while another
/// signals), so every method takes `&self`.
pub trait ProcessHandle: Send + Sync + std::fmt::Debug {
    /// Its process id as its own processes see it (for messages and `ps`), if the tier
    /// knows it.
    fn pid(&self) -> Option<u32>;

    /// Sends `signal` to the program (its top process). `SIGKILL` also kills every
    /// process it started. A program that has ended is not an error (nothing happens).
    fn signal(&self, signal: i32) -> Result<(), Error>;

    /// Resizes its terminal (the program gets `SIGWINCH`); [`Error::Invalid`] on
    /// `rows` when it has none.
    fn resize(&self, rows: u16, cols: u16) -> Result<(), Error>;

    /// Waits (blocking) until it ends and returns how; when a `cancel` fd turns
    /// readable first, returns [`Error::Cancelled`] and the program runs on. Once it has
    /// ended, every later call answers at once with the same exit. When its session is
    /// purged, it answers `Signal(SIGKILL)`.
    fn wait(&self, cancel: &[BorrowedFd<'_>]) -> Result<Exit, Error>;
}

/// Opens connections to TCP ports on a session's own loopback: what a program in it
/// listens on (`python3 -m http.server 8000`). Held apart from the sandbox (like its
/// egress proxy) so connections open while an exec runs; it reaches nothing but the
/// sandbox's own network, and nothing once the sandbox is purged.
pub trait PortConnector: Send + Sync + std::fmt::Debug {
    /// A connected stream socket to `port` on the sandbox's loopback (127.0.0.1)
    /// (blocking, bounded by a few seconds). Nothing listening: [`Error::NotFound`]
    /// naming the port. The socket is a plain fd the caller reads and writes; closing it
    /// closes the connection.
    fn connect(&self, port: u16) -> Result<OwnedFd, Error>;
}
