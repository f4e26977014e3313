//! The host's half of programs alongside execs and of port connections: the socket the
//! agent's process keeper connects to (wire: [`crate::procs`]), served by one thread
//! per sandbox that accepts the keeper's connections and reads its events. Nothing here
//! goes through the exec's channel, so handles and port connections work while an exec
//! runs.

use crate::procs::{Event, Hello, MAX_LINE, Request};
use airlock_backend::{Error, Exit, PortConnector, ProcessHandle};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the keeper may take to answer a request (a spawn forks twice in gVisor).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a port connection may take (the keeper's own connect is bounded by 3 s).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new connection may take to say what it is.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// What the hub's thread learned, shared with the callers.
#[derive(Default)]
struct State {
    /// The keeper's control connection is gone (or the hub stopped): no answers come.
    closed: bool,
    /// The keeper connected.
    connected: bool,
    /// The keeper was asked to detach: the end of its control connection is not the
    /// sandbox's, and it connects again after.
    detaching: bool,
    /// Answers to requests (started, connected, failed), by request.
    answers: HashMap<u64, Event>,
    /// Streams the keeper connected, by request and stream.
    streams: HashMap<(u64, u8), OwnedFd>,
    /// How each program ended.
    exits: HashMap<u64, Exit>,
    /// Write ends of each running program's "ended" pipe: dropped when it ends.
    ending: HashMap<u64, OwnedFd>,
}

/// One sandbox's socket for its keeper, and what came through it.
#[derive(Debug)]
pub(crate) struct Hub {
    shared: Arc<Shared>,
    /// Owned: the thread serving the socket (joined on drop).
    thread: Option<JoinHandle<()>>,
    /// Owned: writing to it (or dropping it) stops the thread.
    stop: Option<OwnedFd>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// The write side of the control connection, once the keeper connected.
    control: Mutex<Option<UnixStream>>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
}

impl Hub {
    /// Listens on `socket` (in a directory only root can enter) and serves it.
    pub(crate) fn start(socket: &Path, sandbox: &str) -> io::Result<Hub> {
        let listener = UnixListener::bind(socket)?;
        listener.set_nonblocking(true)?;
        let (stop_r, stop_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            control: Mutex::new(None),
            next_id: AtomicU64::new(1),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("procs-{sandbox}"))
            .spawn(move || serve(&s, &listener, &stop_r))?;
        Ok(Hub {
            shared,
            thread: Some(thread),
            stop: Some(stop_w),
        })
    }

    /// Starts a program: `request` is a [`Request::Spawn`] without its id. Returns the
    /// handle and its streams (three, or one for a terminal).
    pub(crate) fn spawn(
        &self,
        make: impl FnOnce(u64) -> Request,
        terminal: bool,
    ) -> Result<(GvisorProcess, Vec<OwnedFd>), Error> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        // The pipe whose write end is dropped when it ends (or the sandbox goes).
        let (ended_r, ended_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| Error::host("creating a pipe", e))?;
        self.shared.lock().ending.insert(id, ended_w);
        let streams = if terminal { 1 } else { 3 };
        match self.shared.ask(make(id), id, streams, ANSWER_TIMEOUT) {
            Ok((Event::Started { pid, .. }, fds)) => Ok((
                GvisorProcess {
                    shared: Arc::clone(&self.shared),
                    id,
                    pid,
                    terminal,
                    ended: ended_r,
                },
                fds,
            )),
            Ok((other, _)) => {
                self.shared.lock().ending.remove(&id);
                Err(Error::host(
                    "starting the program",
                    format!("unexpected answer {other:?}"),
                ))
            }
            Err(e) => {
                self.shared.lock().ending.remove(&id);
                Err(e)
            }
        }
    }

    /// What opens connections to the sandbox's ports.
    /// Asks the keeper to drop every connection to the host (see
    /// [`crate::procs::Request::Detach`]) and waits until it has closed the last one.
    /// Until it connects again, requests wait for it (a bounded time).
    pub(crate) fn detach(&self) -> Result<(), Error> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        self.shared.lock().detaching = true;
        let answer = self.shared.ask(Request::Detach { id }, id, 0, ANSWER_TIMEOUT);
        match answer {
            Ok((Event::Detached { .. }, _)) => {}
            Ok((other, _)) => {
                self.shared.lock().detaching = false;
                return Err(Error::host(
                    "detaching the process keeper",
                    format!("unexpected answer {other:?}"),
                ));
            }
            Err(e) => {
                self.shared.lock().detaching = false;
                return Err(e);
            }
        }
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        let mut st = self.shared.lock();
        while st.connected && !st.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::host(
                    "detaching the process keeper",
                    "its control connection stayed open",
                ));
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if st.closed {
            return Err(gone());
        }
        Ok(())
    }

    pub(crate) fn ports(&self) -> Arc<dyn PortConnector> {
        Arc::new(GvisorPorts {
            shared: Arc::clone(&self.shared),
        })
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.shared.close();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// No more answers: every waiter wakes, every running program counts as killed.
    fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        st.ending.clear();
        drop(st);
        self.changed.notify_all();
        *self.control.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Sends `request` to the keeper (waiting a bounded time for it to connect).
    fn send(&self, request: &Request) -> Result<(), Error> {
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        let mut st = self.lock();
        while !st.connected && !st.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if st.closed || !st.connected {
            return Err(gone());
        }
        drop(st);
        let mut line = serde_json::to_vec(request).map_err(|e| Error::host("encoding a request", e))?;
        line.push(b'\n');
        let mut control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        match control.as_mut() {
            Some(c) => c.write_all(&line).map_err(|_| gone()),
            None => Err(gone()),
        }
    }

    /// Sends `request` and waits for its answer and, when it succeeded, its `streams`.
    fn ask(
        &self,
        request: Request,
        id: u64,
        streams: u8,
        timeout: Duration,
    ) -> Result<(Event, Vec<OwnedFd>), Error> {
        self.send(&request)?;
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            let answered = st.answers.contains_key(&id);
            let failed = matches!(st.answers.get(&id), Some(Event::Failed { .. }));
            let arrived = (0..streams).all(|s| st.streams.contains_key(&(id, s)));
            if failed || (answered && arrived) {
                let Some(event) = st.answers.remove(&id) else {
                    return Err(gone());
                };
                // A failed request's streams (connected before it failed) are dropped.
                let fds: Vec<OwnedFd> = (0..streams).filter_map(|s| st.streams.remove(&(id, s))).collect();
                return match event {
                    Event::Failed {
                        kind, field, message, ..
                    } => Err(Error::from_wire(
                        kind,
                        field,
                        message,
                        airlock_spec::Isolation::Gvisor,
                    )),
                    e => Ok((e, fds)),
                };
            }
            if st.closed {
                return Err(gone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                for s in 0..streams {
                    st.streams.remove(&(id, s));
                }
                return Err(Error::host(
                    "talking to the gVisor agent's process keeper",
                    "no answer in time",
                ));
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

fn gone() -> Error {
    Error::Gone("the gVisor sandbox is gone".into())
}

/// The hub's thread: accepts the keeper's connections, reads its events, until `stop`
/// turns readable (closed) or the keeper's control connection closes.
fn serve(shared: &Shared, listener: &UnixListener, stop: &OwnedFd) {
    let mut control: Option<UnixStream> = None;
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let mut fds = vec![
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
        ];
        if let Some(c) = control.as_ref() {
            fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => break,
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        if ready[0] {
            break;
        }
        if ready[1] {
            while let Ok((conn, _)) = listener.accept() {
                match hello(&conn) {
                    Ok(Hello::Control) if control.is_none() => {
                        let Ok(writer) = conn.try_clone() else { continue };
                        *shared.control.lock().unwrap_or_else(|e| e.into_inner()) = Some(writer);
                        control = Some(conn);
                        shared.lock().connected = true;
                        shared.changed.notify_all();
                    }
                    Ok(Hello::Stream { id, stream }) => {
                        shared.lock().streams.insert((id, stream), OwnedFd::from(conn));
                        shared.changed.notify_all();
                    }
                    Ok(Hello::Control) | Err(_) => {} // dropped
                }
            }
        }
        if ready.get(2).copied().unwrap_or(false) {
            let Some(c) = control.as_mut() else { break };
            match c.read(&mut buf) {
                Ok(0) if shared.lock().detaching => {
                    // Detached: it connects again once restored.
                    control = None;
                    pending.clear();
                    *shared.control.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    let mut st = shared.lock();
                    st.connected = false;
                    st.detaching = false;
                    drop(st);
                    shared.changed.notify_all();
                    continue;
                }
                Ok(0) => break,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let Ok(event) = serde_json::from_slice::<Event>(&line) else {
                    tracing::warn!("a bad line from the gVisor process keeper");
                    continue;
                };
                let mut st = shared.lock();
                match event {
                    Event::Exited { id, code, signal } => {
                        let exit = match (code, signal) {
                            (Some(c), _) => Exit::Code(c),
                            (None, Some(s)) => Exit::Signal(s),
                            (None, None) => Exit::Signal(libc::SIGKILL),
                        };
                        st.exits.insert(id, exit);
                        st.ending.remove(&id);
                    }
                    Event::Started { id, .. }
                    | Event::Connected { id }
                    | Event::Detached { id }
                    | Event::Failed { id, .. } => {
                        st.answers.insert(id, event);
                    }
                }
                drop(st);
                shared.changed.notify_all();
            }
            if pending.len() > MAX_LINE {
                break;
            }
        }
    }
    shared.close();
}

/// The first line of a new connection (read byte by byte: what follows is the stream's).
fn hello(conn: &UnixStream) -> io::Result<Hello> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(HELLO_TIMEOUT))?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        (&*conn).read_exact(&mut byte)?;
        if byte[0] == b'\n' {
            break;
        }
        if line.len() > 256 {
            return Err(io::Error::other("hello too long"));
        }
        line.push(byte[0]);
    }
    conn.set_read_timeout(None)?;
    serde_json::from_slice(&line).map_err(io::Error::other)
}

/// A program spawned in a gVisor sandbox.
#[derive(Debug)]
pub(crate) struct GvisorProcess {
    shared: Arc<Shared>,
    id: u64,
    pid: Option<u32>,
    terminal: bool,
    /// Turns readable (end of file) when it ended or the sandbox went.
    ended: OwnedFd,
}

impl GvisorProcess {
    /// How it ended, if it did (a gone sandbox: killed).
    fn exit(&self) -> Option<Exit> {
        let st = self.shared.lock();
        match st.exits.get(&self.id) {
            Some(e) => Some(*e),
            None if st.closed => Some(Exit::Signal(libc::SIGKILL)),
            None => None,
        }
    }
}

impl ProcessHandle for GvisorProcess {
    fn pid(&self) -> Option<u32> {
        self.pid
    }

    fn signal(&self, signal: i32) -> Result<(), Error> {
        if nix::sys::signal::Signal::try_from(signal).is_err() {
            return Err(Error::invalid("signal", format!("{signal} is no signal")));
        }
        if self.exit().is_some() {
            return Ok(());
        }
        match self.shared.send(&Request::Signal { id: self.id, signal }) {
            Ok(()) | Err(Error::Gone(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn resize(&self, rows: u16, cols: u16) -> Result<(), Error> {
        if !self.terminal {
            return Err(Error::invalid("rows", "the program has no terminal to resize"));
        }
        if rows == 0 || cols == 0 {
            return Err(Error::invalid(
                "rows",
                "a terminal has at least one row and one column",
            ));
        }
        if self.exit().is_some() {
            return Ok(());
        }
        match self.shared.send(&Request::Resize {
            id: self.id,
            rows,
            cols,
        }) {
            Ok(()) | Err(Error::Gone(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn wait(&self, cancel: &[BorrowedFd<'_>]) -> Result<Exit, Error> {
        loop {
            if let Some(exit) = self.exit() {
                return Ok(exit);
            }
            let mut fds = Vec::with_capacity(1 + cancel.len());
            fds.push(PollFd::new(self.ended.as_fd(), PollFlags::POLLIN));
            fds.extend(cancel.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)));
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(Error::host("waiting for the program", e)),
            }
            if fds[1..]
                .iter()
                .any(|f| f.revents().is_some_and(|r| !r.is_empty()))
            {
                // Ended at the same moment: the end wins.
                return self.exit().ok_or(Error::Cancelled);
            }
        }
    }
}

/// Port connections into a gVisor sandbox, through its keeper.
#[derive(Debug)]
struct GvisorPorts {
    shared: Arc<Shared>,
}

impl PortConnector for GvisorPorts {
    fn connect(&self, port: u16) -> Result<OwnedFd, Error> {
        if port == 0 {
            return Err(Error::invalid("port", "port 0 is no port"));
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (_, mut fds) = self
            .shared
            .ask(Request::Connect { id, port }, id, 1, CONNECT_TIMEOUT)?;
        fds.pop()
            .ok_or_else(|| Error::host("connecting to a port", "no stream"))
    }
}
