//! Proxy mode in a micro-VM, the host's half: the VM's egress port carries the program's
//! connections to its proxy and its DNS queries ([`airlock_vmwire::mux`]); here each is
//! handed to an airlock-egress [`Proxy`] with the run's policy, as the namespace backend
//! serves the connections of its sandbox's loopback listeners: an explicit one
//! (`Open`) as a proxy client, a redirected one (`OpenTo`) with its original destination,
//! a query to the proxy's resolver. The guest has no network device: this relay is its
//! only way out. It runs on a thread of its own with its own small runtime, so one VM
//! flooding its proxy cannot slow another's.
//!
//! The same relay ([`MuxRelay`], started for a session whatever its network mode) carries
//! what the host opens (mux version 3): connections to TCP ports of the sandbox's
//! loopback ([`MuxRelay::connect`]) and the stdio of spawned programs
//! ([`MuxRelay::attach`]), each bridged to the relay's end of a host socketpair whose
//! other end the caller holds as a plain fd; and the ends of spawned programs
//! ([`ExitSlot`]).

use airlock_egress::Proxy;
use airlock_spec::EgressEntry;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};

use crate::VmError;
use airlock_backend::Exit;
use airlock_vmwire::mux::{
    ExitStatus, HOST_IDS, MAX_CONNECTIONS, MAX_DNS, MAX_DNS_QUERIES, MUX_CHUNK, MuxDecoder, MuxFrame, WINDOW,
};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;

/// The transparent path's two entry points into airlock-egress, and the only place that
/// calls them: a connection the sandbox's nf_tables redirected, with its original
/// destination, and a DNS query to airlock's resolver.
mod transparent {
    use super::*;

    /// Serves one redirected connection whose original destination is `dst`, judged by
    /// the proxy's policy and logged in its log; returns when it has ended (or, once
    /// `stop` resolves, after closing it).
    pub(super) async fn serve_redirected(
        proxy: Arc<Proxy>,
        stream: DuplexStream,
        dst: SocketAddr,
        stop: impl Future<Output = ()> + Send + 'static,
    ) {
        tracing::debug!(%dst, "egress relay: a redirected connection");
        proxy.serve_redirected(stream, dst, stop).await
    }

    /// The answer of the proxy's resolver to one DNS query; `None`: no answer.
    pub(super) async fn answer_dns(proxy: &Proxy, query: &[u8]) -> Option<Vec<u8>> {
        tracing::debug!(query = %hex(query), "egress relay: a DNS query");
        proxy.answer_dns(query).await
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// How long the log may take to settle after a program ends: its connections are closed
/// in the guest, and the closes cross the port (emulated, under TCG) before the proxy
/// logs them.
const SETTLE: Duration = Duration::from_secs(2);
/// On stop, how long the proxy's connections get to end and be logged.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// Proxy mode's part of a VM's relay: the proxy its connections and queries are served
/// with; dropping it refuses what the proxy holds.
#[derive(Debug)]
pub(crate) struct EgressRelay {
    proxy: Arc<Proxy>,
    /// The policy's source, to tell a request that asks for another one.
    network: airlock_spec::NetworkPolicy,
    /// Entries of the log already returned by [`EgressRelay::take_new`].
    seen: usize,
}

impl EgressRelay {
    /// Serves the proxy's connections and queries of `mux` with `proxy` from now on.
    pub(crate) fn start(
        proxy: Arc<Proxy>,
        network: airlock_spec::NetworkPolicy,
        mux: &MuxRelay,
    ) -> EgressRelay {
        let _ = mux.proxy.send(Some(Arc::clone(&proxy)));
        EgressRelay {
            proxy,
            network,
            seen: 0,
        }
    }

    /// The network policy this relay serves.
    pub(crate) fn network(&self) -> &airlock_spec::NetworkPolicy {
        &self.network
    }

    /// The proxy.
    pub(crate) fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    /// Log entries recorded since the last call (one exec's egress), once the proxy's
    /// connections have ended (a bounded wait).
    pub(crate) fn take_new(&mut self) -> Vec<EgressEntry> {
        self.proxy.log_since(&mut self.seen, SETTLE)
    }
}

impl Drop for EgressRelay {
    fn drop(&mut self) {
        // Held connections are refused now: nobody will answer for this VM any more.
        self.proxy.control().refuse_all();
    }
}

/// How a spawned program ended, once it has: what its handle's `wait` answers. A pipe's
/// write end is held until then; its read end turns readable (end of file) at the end,
/// so a waiter polls it with its cancel fds.
#[derive(Debug)]
pub(crate) struct ExitSlot {
    exit: Mutex<Option<Exit>>,
    ended: OwnedFd,
    writer: Mutex<Option<OwnedFd>>,
}

impl ExitSlot {
    fn new() -> std::io::Result<ExitSlot> {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok(ExitSlot {
            exit: Mutex::new(None),
            ended: r,
            writer: Mutex::new(Some(w)),
        })
    }

    /// Records the end (`None`: the VM is gone, which killed it), once.
    fn finish(&self, exit: Option<Exit>) {
        let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if writer.is_none() {
            return;
        }
        *self.exit.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(exit.unwrap_or(Exit::Signal(libc::SIGKILL)));
        writer.take();
    }

    /// The end, if it came.
    pub(crate) fn exit(&self) -> Option<Exit> {
        *self.exit.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What turns readable at the end.
    pub(crate) fn ended(&self) -> std::os::fd::BorrowedFd<'_> {
        self.ended.as_fd()
    }
}

/// What the host asks of the relay.
enum Cmd {
    /// Relay stream `id` (a spawned program's stdio) to `sock`; `done` once registered.
    Attach {
        id: u32,
        sock: UnixStream,
        done: std::sync::mpsc::Sender<()>,
    },
    /// Open stream `id` to `port` in the sandbox, relayed to `sock`; `answer` says whether
    /// something listened there.
    Connect {
        id: u32,
        port: u16,
        sock: UnixStream,
        answer: std::sync::mpsc::Sender<bool>,
    },
    /// Tell `slot` when spawned program `id` ends; `done` once registered.
    Process {
        id: u32,
        slot: Arc<ExitSlot>,
        done: std::sync::mpsc::Sender<()>,
    },
}

/// A VM's egress port, relayed on a thread of its own; dropping it stops the relay (and
/// with it every stream it carries).
#[derive(Debug)]
pub(crate) struct MuxRelay {
    /// The proxy-mode proxy, once there is one.
    proxy: watch::Sender<Option<Arc<Proxy>>>,
    cmds: mpsc::UnboundedSender<Cmd>,
    /// Frames to the guest (signals, resizes).
    out: mpsc::UnboundedSender<Vec<u8>>,
    /// The next id the host picks (with [`HOST_IDS`] set).
    next_id: AtomicU32,
    /// The next id of a connection to a port (see [`Ports`]).
    next_port_id: Arc<AtomicU32>,
    /// The VM is paused ([`MuxRelay::set_paused`]).
    paused: Arc<std::sync::atomic::AtomicBool>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cmd")
    }
}

/// Set, with [`HOST_IDS`], in the ids of connections to ports: they are picked by
/// [`Ports`] apart from the relay's other ids.
const PORT_IDS: u32 = 1 << 30;

/// How long the guest gets to answer a `Connect` (it connects on its loopback: quick,
/// but emulated).
const CONNECT_WAIT: Duration = Duration::from_secs(20);

/// How a restored VM's relay starts over (mux version 4): the ids the snapshot's relay
/// had reached, and the two markers of the guest's `Restored`.
#[derive(Debug, Clone)]
pub(crate) struct Resync {
    /// The relay's next ids ([`MuxRelay::ids`]) when the snapshot was taken.
    pub ids: [u32; 2],
    /// Sent before any frame: the guest skips to it.
    pub host_marker: Vec<u8>,
    /// What the guest sent before its first frame: skipped to.
    pub guest_marker: Vec<u8>,
}

impl MuxRelay {
    /// Serves the host's end of a VM's egress port on a new thread; with `resync`, a
    /// restored VM's (see [`Resync`]).
    pub(crate) fn start(port: UnixStream, vm: &str, resync: Option<Resync>) -> Result<MuxRelay, VmError> {
        let host_err = |e: std::io::Error| VmError::Host(format!("egress relay: {e}"));
        port.set_nonblocking(true).map_err(host_err)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(host_err)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (proxy, proxy_rx) = watch::channel(None);
        let (cmds, cmds_rx) = mpsc::unbounded_channel();
        let (out, out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let out_relay = out.clone();
        let ids = resync.as_ref().map_or([0, 0], |r| r.ids);
        // First in the queue: nothing is written before it.
        let skip_to = resync.map(|r| {
            let _ = out.send(r.host_marker);
            r.guest_marker
        });
        let thread = std::thread::Builder::new()
            .name(format!("airlock-egress-{vm}"))
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::UnixStream::from_std(port) {
                        Ok(port) => relay(port, skip_to, proxy_rx, cmds_rx, out_relay, out_rx, stopped).await,
                        Err(e) => tracing::error!(error = %e, "egress relay: the port"),
                    }
                });
            })
            .map_err(host_err)?;
        Ok(MuxRelay {
            proxy,
            cmds,
            out,
            next_id: AtomicU32::new(ids[0]),
            next_port_id: Arc::new(AtomicU32::new(ids[1])),
            paused: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The counters of the ids it picks (streams and programs, connections to ports):
    /// what a restored VM's relay continues from, so that no id the guest still knows
    /// is picked again.
    pub(crate) fn ids(&self) -> [u32; 2] {
        [
            self.next_id.load(Ordering::Relaxed),
            self.next_port_id.load(Ordering::Relaxed),
        ]
    }

    /// Says whether the VM is paused: its ports refuse connections meanwhile.
    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// A fresh host id.
    pub(crate) fn next_id(&self) -> u32 {
        HOST_IDS | (self.next_id.fetch_add(1, Ordering::Relaxed) & !(HOST_IDS | PORT_IDS))
    }

    /// Relays stream `id` to `sock` (registered when this returns).
    pub(crate) fn attach(&self, id: u32, sock: UnixStream) -> Result<(), VmError> {
        let (done, registered) = std::sync::mpsc::channel();
        self.cmds
            .send(Cmd::Attach { id, sock, done })
            .map_err(|_| VmError::Gone)?;
        registered.recv().map_err(|_| VmError::Gone)
    }

    /// A slot for the end of spawned program `id` (registered when this returns).
    pub(crate) fn process(&self, id: u32) -> Result<Arc<ExitSlot>, VmError> {
        let slot = Arc::new(ExitSlot::new().map_err(|e| VmError::Host(format!("a pipe: {e}")))?);
        let (done, registered) = std::sync::mpsc::channel();
        self.cmds
            .send(Cmd::Process {
                id,
                slot: Arc::clone(&slot),
                done,
            })
            .map_err(|_| VmError::Gone)?;
        registered.recv().map_err(|_| VmError::Gone)?;
        Ok(slot)
    }

    /// What sends frames to the guest.
    pub(crate) fn sender(&self) -> mpsc::UnboundedSender<Vec<u8>> {
        self.out.clone()
    }

    /// What opens connections to the sandbox's ports.
    pub(crate) fn ports(&self) -> Ports {
        Ports {
            cmds: self.cmds.clone(),
            next: Arc::clone(&self.next_port_id),
            paused: Arc::clone(&self.paused),
        }
    }
}

impl Drop for MuxRelay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Opens connections to TCP ports of a VM's sandbox (its [`airlock_backend::PortConnector`]).
#[derive(Debug, Clone)]
pub(crate) struct Ports {
    cmds: mpsc::UnboundedSender<Cmd>,
    /// Ids of connections, in a range of their own: `HOST_IDS | PORT_IDS | n`.
    next: Arc<AtomicU32>,
    /// The VM is paused: a connection is refused at once rather than waited for.
    paused: Arc<std::sync::atomic::AtomicBool>,
}

impl airlock_backend::PortConnector for Ports {
    fn connect(&self, port: u16) -> Result<OwnedFd, airlock_backend::Error> {
        let gone = || airlock_backend::Error::Gone("the VM is gone".into());
        if self.paused.load(Ordering::Relaxed) {
            return Err(airlock_backend::Error::invalid(
                "sandbox",
                "is paused: resume it first",
            ));
        }
        let id = HOST_IDS | PORT_IDS | (self.next.fetch_add(1, Ordering::Relaxed) & !(HOST_IDS | PORT_IDS));
        let (caller, relayed) =
            UnixStream::pair().map_err(|e| airlock_backend::Error::host("a socketpair", e))?;
        let (answer, answered) = std::sync::mpsc::channel();
        self.cmds
            .send(Cmd::Connect {
                id,
                port,
                sock: relayed,
                answer,
            })
            .map_err(|_| gone())?;
        match answered.recv_timeout(CONNECT_WAIT) {
            Ok(true) => Ok(OwnedFd::from(caller)),
            Ok(false) => Err(airlock_backend::Error::NotFound(format!(
                "nothing listens on port {port} in the sandbox"
            ))),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(airlock_backend::Error::host(
                format!("connecting to port {port}"),
                "the VM did not answer",
            )),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
        }
    }
}

/// A program spawned in a VM (its [`airlock_backend::ProcessHandle`]): signals and
/// resizes go to the guest on the egress port; its end comes back there.
#[derive(Debug)]
pub(crate) struct VmProcess {
    /// Its id on the port.
    id: u32,
    /// Its pid as its processes see it.
    pid: u32,
    /// It has a terminal.
    terminal: bool,
    /// Frames to the guest.
    out: mpsc::UnboundedSender<Vec<u8>>,
    /// Its end.
    slot: Arc<ExitSlot>,
}

impl VmProcess {
    pub(crate) fn new(
        id: u32,
        pid: u32,
        terminal: bool,
        out: mpsc::UnboundedSender<Vec<u8>>,
        slot: Arc<ExitSlot>,
    ) -> VmProcess {
        VmProcess {
            id,
            pid,
            terminal,
            out,
            slot,
        }
    }
}

impl airlock_backend::ProcessHandle for VmProcess {
    fn pid(&self) -> Option<u32> {
        Some(self.pid)
    }

    fn signal(&self, signal: i32) -> Result<(), airlock_backend::Error> {
        if !(1..=64).contains(&signal) {
            return Err(airlock_backend::Error::invalid(
                "signal",
                format!("{signal} is no signal"),
            ));
        }
        if self.slot.exit().is_none() {
            // A VM that is gone took the program with it: nothing to signal.
            let _ = self.out.send(MuxFrame::Signal(self.id, signal as u32).encode());
        }
        Ok(())
    }

    fn resize(&self, rows: u16, cols: u16) -> Result<(), airlock_backend::Error> {
        if !self.terminal {
            return Err(airlock_backend::Error::invalid(
                "rows",
                "the program has no terminal",
            ));
        }
        if self.slot.exit().is_none() {
            let _ = self.out.send(MuxFrame::Resize(self.id, rows, cols).encode());
        }
        Ok(())
    }

    fn wait(&self, cancel: &[std::os::fd::BorrowedFd<'_>]) -> Result<Exit, airlock_backend::Error> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        loop {
            if let Some(exit) = self.slot.exit() {
                return Ok(exit);
            }
            let mut fds = vec![PollFd::new(self.slot.ended(), PollFlags::POLLIN)];
            fds.extend(cancel.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)));
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(airlock_backend::Error::host("waiting for a program", e)),
            }
            if let Some(exit) = self.slot.exit() {
                return Ok(exit);
            }
            if fds[1..].iter().any(|f| f.any().unwrap_or(false)) {
                return Err(airlock_backend::Error::Cancelled);
            }
        }
    }
}

/// One connection as the relay tracks it.
struct Conn {
    /// Bytes from the guest, to the proxy; `None` once the guest sent `Eof`.
    to_proxy: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// Bytes the guest sent and the proxy has not taken yet: at most a [`WINDOW`].
    pending: Arc<AtomicU32>,
    /// How much more the guest will take of the proxy's answer (its acknowledgements).
    credit: Arc<Semaphore>,
    /// The proxy's side has ended (its `Eof` or `Reset` was sent).
    up_done: bool,
    /// The connection's tasks, aborted on a reset.
    tasks: [AbortHandle; 2],
}

/// What a connection's tasks tell the relay.
enum Event {
    /// The proxy closed its side: `Eof` was sent.
    UpDone(u32),
    /// The connection failed: `Reset` was sent; forget it.
    Failed(u32),
}

/// Relays the port until `stop`, the port's end, or a framing error; with `skip_to`, what
/// is read before those bytes is dropped (a restored VM's port: see [`Resync`]).
#[allow(clippy::too_many_arguments)]
async fn relay(
    port: tokio::net::UnixStream,
    mut skip_to: Option<Vec<u8>>,
    proxy: watch::Receiver<Option<Arc<Proxy>>>,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    out: mpsc::UnboundedSender<Vec<u8>>,
    mut out_rx: mpsc::UnboundedReceiver<Vec<u8>>,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    let (mut rd, mut wr) = port.into_split();
    // Frames to the guest: data within each connection's window, acknowledgements and
    // closes: bounded by the windows, so the queue needs no bound of its own.
    let writer = tokio::spawn(async move {
        while let Some(frame) = out_rx.recv().await {
            if wr.write_all(&frame).await.is_err() {
                break;
            }
        }
    });
    let (events, mut events_rx) = mpsc::unbounded_channel::<Event>();
    let (stop_proxy, proxy_stopped) = watch::channel(false);
    let mut served = JoinSet::new();
    let mut conn_tasks = JoinSet::new();
    let mut conns: HashMap<u32, Conn> = HashMap::new();
    let dns_slots = Arc::new(Semaphore::new(MAX_DNS_QUERIES));
    let mut decoder = MuxDecoder::default();
    let mut skipped = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut stop = std::pin::pin!(stop);
    // Host-opened connections waiting for the guest's `Connected`.
    let mut connecting: HashMap<u32, (UnixStream, std::sync::mpsc::Sender<bool>)> = HashMap::new();
    // Spawned programs, until they end.
    let mut processes: HashMap<u32, Arc<ExitSlot>> = HashMap::new();
    'relay: loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(cmd) = cmds.recv() => match cmd {
                Cmd::Attach { id, sock, done } => {
                    if let Some(conn) = local(id, sock, &out, &events, &mut conn_tasks) {
                        conns.insert(id, conn);
                    }
                    let _ = done.send(());
                }
                Cmd::Connect { id, port, sock, answer } => {
                    if conns.len() + connecting.len() >= MAX_CONNECTIONS {
                        let _ = answer.send(false);
                        continue;
                    }
                    connecting.insert(id, (sock, answer));
                    let _ = out.send(MuxFrame::Connect(id, port).encode());
                }
                Cmd::Process { id, slot, done } => {
                    processes.insert(id, slot);
                    let _ = done.send(());
                }
            },
            Some(_) = served.join_next(), if !served.is_empty() => {}
            Some(_) = conn_tasks.join_next(), if !conn_tasks.is_empty() => {}
            Some(event) = events_rx.recv() => match event {
                Event::UpDone(id) => {
                    if let Some(c) = conns.get_mut(&id) {
                        c.up_done = true;
                        if c.to_proxy.is_none() {
                            conns.remove(&id);
                        }
                    }
                }
                Event::Failed(id) => {
                    if let Some(c) = conns.remove(&id) {
                        c.tasks.iter().for_each(AbortHandle::abort);
                    }
                }
            },
            read = rd.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                match skip_to.as_ref() {
                    None => decoder.push(&buf[..n]),
                    Some(marker) => {
                        skipped.extend_from_slice(&buf[..n]);
                        match skipped.windows(marker.len()).position(|w| w == marker.as_slice()) {
                            Some(at) => {
                                decoder.push(&skipped[at + marker.len()..]);
                                skipped = Vec::new();
                                skip_to = None;
                            }
                            None => {
                                let keep = skipped.len().saturating_sub(marker.len() - 1);
                                skipped.drain(..keep);
                                continue;
                            }
                        }
                    }
                }
                loop {
                    let frame = match decoder.next_frame() {
                        Ok(Some(f)) => f,
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "egress relay: the guest sent a bad frame; closing");
                            break 'relay;
                        }
                    };
                    match frame {
                        MuxFrame::Open(id) | MuxFrame::OpenTo(id, _) => {
                            let dst = match frame {
                                MuxFrame::OpenTo(_, dst) => Some(dst),
                                _ => None,
                            };
                            // Only proxy mode serves the guest's connections, never with
                            // a host id.
                            let served_by = proxy.borrow().clone();
                            let Some(proxy) = served_by.filter(|_| {
                                id & HOST_IDS == 0 && conns.len() < MAX_CONNECTIONS && !conns.contains_key(&id)
                            }) else {
                                let _ = out.send(MuxFrame::Reset(id).encode());
                                continue;
                            };
                            let conn = open(id, dst, &proxy, &proxy_stopped, &out, &events, &mut served, &mut conn_tasks);
                            conns.insert(id, conn);
                        }
                        MuxFrame::Connected(id) => {
                            if let Some((sock, answer)) = connecting.remove(&id) {
                                match local(id, sock, &out, &events, &mut conn_tasks) {
                                    Some(conn) => {
                                        conns.insert(id, conn);
                                        let _ = answer.send(true);
                                    }
                                    None => {
                                        let _ = out.send(MuxFrame::Reset(id).encode());
                                        let _ = answer.send(false);
                                    }
                                }
                            }
                        }
                        MuxFrame::Exited(id, status) => {
                            if let Some(slot) = processes.remove(&id) {
                                slot.finish(Some(match status {
                                    ExitStatus::Code(c) => Exit::Code(i32::from(c)),
                                    ExitStatus::Signal(s) => Exit::Signal(i32::from(s)),
                                }));
                            }
                        }
                        // Only the host sends these.
                        MuxFrame::Connect(..) | MuxFrame::Signal(..) | MuxFrame::Resize(..) => {}
                        MuxFrame::DnsQuery(id, query) => {
                            let Some(proxy) = proxy.borrow().clone() else {
                                let _ = out.send(MuxFrame::DnsNone(id).encode());
                                continue;
                            };
                            // Every query is answered once; over the bound, with no answer.
                            let Ok(permit) = Arc::clone(&dns_slots).try_acquire_owned() else {
                                let _ = out.send(MuxFrame::DnsNone(id).encode());
                                continue;
                            };
                            let (proxy, out) = (Arc::clone(&proxy), out.clone());
                            conn_tasks.spawn(async move {
                                let answer = transparent::answer_dns(&proxy, &query).await;
                                let frame = match answer {
                                    Some(a) if !a.is_empty() && a.len() <= MAX_DNS => MuxFrame::DnsAnswer(id, a),
                                    Some(a) => {
                                        tracing::warn!(bytes = a.len(), "egress relay: a DNS answer that cannot cross the port (1 to {MAX_DNS} bytes): none sent");
                                        MuxFrame::DnsNone(id)
                                    }
                                    None => MuxFrame::DnsNone(id),
                                };
                                let _ = out.send(frame.encode());
                                drop(permit);
                            });
                        }
                        // Only the host answers queries.
                        MuxFrame::DnsAnswer(..) | MuxFrame::DnsNone(_) => {}
                        MuxFrame::Data(id, data) => {
                            let Some(c) = conns.get_mut(&id) else { continue };
                            let len = data.len() as u32;
                            let over = c.pending.fetch_add(len, Ordering::Relaxed) + len > WINDOW;
                            let sent = !over && c.to_proxy.as_ref().is_some_and(|tx| tx.send(data).is_ok());
                            if !sent {
                                // Past its window, or after its Eof: the guest broke the rules.
                                let _ = out.send(MuxFrame::Reset(id).encode());
                                if let Some(c) = conns.remove(&id) {
                                    c.tasks.iter().for_each(AbortHandle::abort);
                                }
                            }
                        }
                        MuxFrame::Eof(id) => {
                            if let Some(c) = conns.get_mut(&id) {
                                c.to_proxy = None;
                                if c.up_done {
                                    conns.remove(&id);
                                }
                            }
                        }
                        MuxFrame::Reset(id) => {
                            if let Some(c) = conns.remove(&id) {
                                c.tasks.iter().for_each(AbortHandle::abort);
                            }
                            // A connection to a port where nothing listens.
                            if let Some((_, answer)) = connecting.remove(&id) {
                                let _ = answer.send(false);
                            }
                        }
                        MuxFrame::Ack(id, n) => {
                            if let Some(c) = conns.get(&id) {
                                let room = (WINDOW as usize).saturating_sub(c.credit.available_permits());
                                c.credit.add_permits((n as usize).min(room));
                            }
                        }
                    }
                }
            }
        }
    }
    // The VM is gone: so is every program it ran.
    for slot in processes.values() {
        slot.finish(None);
    }
    // The proxy closes what is still open and logs it; the relay's tasks go.
    let _ = stop_proxy.send(true);
    let _ = tokio::time::timeout(STOP_WAIT, async { while served.join_next().await.is_some() {} }).await;
    served.abort_all();
    conn_tasks.abort_all();
    writer.abort();
}

/// Starts serving connection `id` (explicit, or redirected from `dst`): the proxy on one
/// end of an in-memory stream, and two tasks moving bytes between the other end and the
/// port.
#[allow(clippy::too_many_arguments)]
fn open(
    id: u32,
    dst: Option<SocketAddr>,
    proxy: &Arc<Proxy>,
    stopped: &watch::Receiver<bool>,
    out: &mpsc::UnboundedSender<Vec<u8>>,
    events: &mpsc::UnboundedSender<Event>,
    served: &mut JoinSet<()>,
    conn_tasks: &mut JoinSet<()>,
) -> Conn {
    let (proxy_end, relay_end) = tokio::io::duplex(WINDOW as usize);
    let mut stopped = stopped.clone();
    let stop = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    match dst {
        None => served.spawn(Arc::clone(proxy).serve_stream(proxy_end, stop)),
        Some(dst) => served.spawn(transparent::serve_redirected(
            Arc::clone(proxy),
            proxy_end,
            dst,
            stop,
        )),
    };
    bridge(id, relay_end, out, events, conn_tasks)
}

/// Starts relaying host-opened stream `id` to `sock` (the relay's end of a host
/// socketpair); `None` when the socket cannot be used.
fn local(
    id: u32,
    sock: UnixStream,
    out: &mpsc::UnboundedSender<Vec<u8>>,
    events: &mpsc::UnboundedSender<Event>,
    conn_tasks: &mut JoinSet<()>,
) -> Option<Conn> {
    sock.set_nonblocking(true).ok()?;
    let sock = tokio::net::UnixStream::from_std(sock).ok()?;
    Some(bridge(id, sock, out, events, conn_tasks))
}

/// Two tasks moving bytes between `relay_end` and stream `id` of the port, within the
/// windows.
fn bridge(
    id: u32,
    relay_end: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
    out: &mpsc::UnboundedSender<Vec<u8>>,
    events: &mpsc::UnboundedSender<Event>,
    conn_tasks: &mut JoinSet<()>,
) -> Conn {
    let (mut from_proxy, mut to_proxy) = tokio::io::split(relay_end);
    let credit = Arc::new(Semaphore::new(WINDOW as usize));
    let pending = Arc::new(AtomicU32::new(0));

    // The proxy's answer, to the guest, within the guest's window.
    let up = {
        let (out, events, credit) = (out.clone(), events.clone(), Arc::clone(&credit));
        conn_tasks.spawn(async move {
            let mut buf = vec![0u8; MUX_CHUNK];
            loop {
                match from_proxy.read(&mut buf).await {
                    Ok(0) => {
                        let _ = out.send(MuxFrame::Eof(id).encode());
                        let _ = events.send(Event::UpDone(id));
                        return;
                    }
                    Ok(n) => {
                        match credit.acquire_many(n as u32).await {
                            Ok(p) => p.forget(),
                            Err(_) => return,
                        }
                        let _ = out.send(MuxFrame::Data(id, buf[..n].to_vec()).encode());
                    }
                    Err(_) => {
                        let _ = out.send(MuxFrame::Reset(id).encode());
                        let _ = events.send(Event::Failed(id));
                        return;
                    }
                }
            }
        })
    };
    // The guest's bytes, to the proxy; each chunk acknowledged once the proxy took it.
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let down = {
        let (out, events, pending) = (out.clone(), events.clone(), Arc::clone(&pending));
        conn_tasks.spawn(async move {
            while let Some(data) = rx.recv().await {
                if to_proxy.write_all(&data).await.is_err() {
                    let _ = out.send(MuxFrame::Reset(id).encode());
                    let _ = events.send(Event::Failed(id));
                    return;
                }
                let n = data.len() as u32;
                pending.fetch_sub(n, Ordering::Relaxed);
                let _ = out.send(MuxFrame::Ack(id, n).encode());
            }
            // The guest's Eof: the proxy reads the end of the request.
            let _ = to_proxy.shutdown().await;
        })
    };
    Conn {
        to_proxy: Some(tx),
        pending,
        credit,
        up_done: false,
        tasks: [up, down],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_egress::{Policy, ProxyLimits, SystemResolver};
    use airlock_vmwire::mux::read_frame;
    use std::io::Write;

    /// What the host opens (version 3): a connection to a port where nothing listens is
    /// `NotFound` naming the port, one the guest answers carries bytes both ways to the
    /// caller's fd, and a spawned program's end reaches its waiter; once the relay stops,
    /// a program still running ends as killed and connections are refused as gone.
    #[test]
    fn connections_to_ports_and_the_ends_of_spawned_programs_cross_the_port() {
        use airlock_backend::{ErrorKind, PortConnector, ProcessHandle};
        use std::io::Read;
        let (host, mut guest) = UnixStream::pair().unwrap();
        let mux = MuxRelay::start(host, "vm-test", None).unwrap();
        let ports = mux.ports();

        // Nothing listens on 8000: the guest resets the stream.
        let refused = std::thread::spawn({
            let ports = ports.clone();
            move || ports.connect(8000)
        });
        let Some(MuxFrame::Connect(id, 8000)) = read_frame(&mut guest).unwrap() else {
            panic!("no connect frame")
        };
        assert_ne!(id & HOST_IDS, 0);
        guest.write_all(&MuxFrame::Reset(id).encode()).unwrap();
        let err = refused.join().unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert!(err.to_string().contains("8000"), "{err}");

        // Something listens on 8001: bytes both ways.
        let accepted = std::thread::spawn({
            let ports = ports.clone();
            move || ports.connect(8001)
        });
        let Some(MuxFrame::Connect(id, 8001)) = read_frame(&mut guest).unwrap() else {
            panic!("no connect frame")
        };
        guest.write_all(&MuxFrame::Connected(id).encode()).unwrap();
        let fd = accepted.join().unwrap().expect("connected");
        let mut caller = std::fs::File::from(fd);
        caller.write_all(b"ping").unwrap();
        assert_eq!(
            read_frame(&mut guest).unwrap(),
            Some(MuxFrame::Data(id, b"ping".to_vec()))
        );
        guest
            .write_all(&MuxFrame::Data(id, b"pong".to_vec()).encode())
            .unwrap();
        guest.write_all(&MuxFrame::Eof(id).encode()).unwrap();
        let mut answer = String::new();
        caller.read_to_string(&mut answer).unwrap();
        assert_eq!(answer, "pong");

        // Two spawned programs: one ends, the other is running when the relay stops.
        let (a, b) = (mux.next_id(), mux.next_id());
        let ended = VmProcess::new(a, 2, false, mux.sender(), mux.process(a).unwrap());
        let running = VmProcess::new(b, 2, true, mux.sender(), mux.process(b).unwrap());
        assert_eq!(ended.resize(1, 1).unwrap_err().kind(), ErrorKind::Invalid);
        running.resize(30, 100).unwrap();
        running.signal(libc::SIGTERM).unwrap();
        // The connection's acknowledgement and end may come first.
        let mut next = || loop {
            match read_frame(&mut guest).unwrap() {
                Some(MuxFrame::Ack(..) | MuxFrame::Eof(_)) => continue,
                other => return other,
            }
        };
        assert_eq!(next(), Some(MuxFrame::Resize(b, 30, 100)));
        assert_eq!(next(), Some(MuxFrame::Signal(b, libc::SIGTERM as u32)));
        guest
            .write_all(&MuxFrame::Exited(a, ExitStatus::Code(7)).encode())
            .unwrap();
        assert_eq!(ended.wait(&[]).unwrap(), Exit::Code(7));
        assert_eq!(ended.wait(&[]).unwrap(), Exit::Code(7));
        let (cancel_r, cancel_w) = nix::unistd::pipe().unwrap();
        nix::unistd::write(&cancel_w, b"x").unwrap();
        assert_eq!(
            running.wait(&[cancel_r.as_fd()]).unwrap_err().kind(),
            ErrorKind::Cancelled
        );
        drop(mux);
        assert_eq!(running.wait(&[]).unwrap(), Exit::Signal(libc::SIGKILL));
        assert_eq!(ports.connect(8001).unwrap_err().kind(), ErrorKind::Gone);
    }

    /// The host's end of the egress port, version 2: every DNS query is answered exactly
    /// once (an answer or `DnsNone`), also past [`MAX_DNS_QUERIES`] at once, and a
    /// redirected connection reaches the proxy's policy with its original destination
    /// (a private address: refused before any connection, and logged with it).
    #[test]
    fn every_dns_query_is_answered_once_and_a_redirected_connection_meets_the_policy() {
        let (host, mut guest) = UnixStream::pair().unwrap();
        host.set_nonblocking(true).unwrap();
        let proxy = Proxy::new(
            Policy::new(&[], &[]).unwrap(),
            ProxyLimits::default(),
            Arc::new(SystemResolver),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = Arc::clone(&proxy);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let (_proxy, proxy_rx) = watch::channel(Some(served));
                let (_cmds, cmds_rx) = mpsc::unbounded_channel();
                let (out, out_rx) = mpsc::unbounded_channel();
                let port = tokio::net::UnixStream::from_std(host).unwrap();
                relay(port, None, proxy_rx, cmds_rx, out, out_rx, stopped).await;
            });
        });
        let queries = 2 * MAX_DNS_QUERIES as u32;
        let mut wire = Vec::new();
        for id in 0..queries {
            wire.extend(MuxFrame::DnsQuery(id, vec![0x12, 0x34, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]).encode());
        }
        let private: SocketAddr = "10.0.0.5:80".parse().unwrap();
        wire.extend(MuxFrame::OpenTo(7, private).encode());
        guest.write_all(&wire).unwrap();

        let mut answered = std::collections::BTreeMap::new();
        let mut closed = false;
        while answered.len() < queries as usize || !closed {
            match read_frame(&mut guest).unwrap().expect("the relay ended") {
                MuxFrame::DnsAnswer(id, _) | MuxFrame::DnsNone(id) => {
                    *answered.entry(id).or_insert(0) += 1;
                }
                MuxFrame::Eof(7) | MuxFrame::Reset(7) => closed = true,
                MuxFrame::Data(7, _) | MuxFrame::Ack(..) => {}
                other => panic!("unexpected frame {other:?}"),
            }
        }
        assert!(answered.values().all(|n| *n == 1), "{answered:?}");
        assert_eq!(
            answered.keys().copied().collect::<Vec<_>>(),
            (0..queries).collect::<Vec<_>>()
        );
        let _ = stop.send(());
        thread.join().unwrap();
        let log = proxy.log();
        let entry = log
            .iter()
            .find(|e| e.port == 80 && (e.host == "10.0.0.5" || e.addr.as_deref() == Some("10.0.0.5")))
            .unwrap_or_else(|| panic!("no entry for {private}: {log:?}"));
        assert!(!entry.allowed, "{entry:?}");
    }
}
