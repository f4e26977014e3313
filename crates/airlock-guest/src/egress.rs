//! Proxy mode, the guest's half. The VM has no network device; the program reaches the
//! host's egress proxy through the sandbox's own loopback, where the agent binds (in the
//! sandbox's network namespace, as the namespace backend's init does on a host):
//!
//! - 127.0.0.1:3128 (TCP), the explicit proxy: each connection is opened on the egress
//!   port ([`airlock_vmwire::mux`]) as `Open`;
//! - 127.0.0.1:3129 (TCP), the transparent port, where the sandbox's nf_tables redirect
//!   every connection to a non-loopback address: each is opened as `OpenTo` with its
//!   original destination (`SO_ORIGINAL_DST`); one without (a program connecting to the
//!   port itself) is closed, never relayed;
//! - 127.0.0.1:53 (UDP), airlock's resolver, where DNS datagrams to any address are
//!   redirected: each is sent as a `DnsQuery`, and the host's answer goes back to the
//!   sender.
//!
//! The same port carries what the host opens (mux version 3): connections to TCP ports
//! of the sandbox's loopback (`Connect`, made from a thread in the sandbox's network
//! namespace), and the stdio of programs spawned alongside the execs (see `spawn`), whose
//! signals and terminal sizes come on it too. The port is served from boot, whatever the
//! network mode; the proxy's listeners join it on `Egress`.
//!
//! Threads, not an event loop: one per listener, one reads the port and dispatches, and
//! each connection has one thread per direction. No thread ever blocks the port on one
//! connection: what the host sends is queued per connection (at most a window, which the
//! host respects) and written to the socket by that connection's own thread.

use airlock_vmwire::mux::{
    self, EGRESS_PORT, MAX_CONNECTIONS, MAX_DNS, MAX_DNS_QUERIES, MUX_CHUNK, MuxFrame, WINDOW,
};
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use airlock_sandbox::PROXY_PORT;

/// The transparent port, where the sandbox's nf_tables redirect direct connections.
pub const TRANSPARENT_PORT: u16 = 3129;
/// The resolver's port (UDP), where the sandbox's DNS datagrams are redirected.
pub const DNS_PORT: u16 = 53;
/// How long a DNS query waits for the host's answer before its slot may be reused (the
/// host answers every query; this only bounds a slow one): longer than any resolver
/// waits for an answer.
const DNS_EXPIRY: Duration = Duration::from_secs(30);

/// The sockets the agent serves in the sandbox's network namespace.
#[derive(Debug)]
pub struct Listeners {
    /// 127.0.0.1:3128, the explicit proxy.
    pub proxy: TcpListener,
    /// 127.0.0.1:3129, the transparent port.
    pub transparent: TcpListener,
    /// 127.0.0.1:53 (UDP), the resolver.
    pub dns: UdpSocket,
}

/// Sets up proxy mode in the network namespace of the sandbox whose cgroup is named
/// `sandbox_id`, on a thread of its own that joins the namespace (a network namespace is
/// per thread) and ends: the TUN device, default route and nf_tables rules that send
/// every connection and DNS datagram to the agent's sockets (airlock-sandbox's, as its
/// init installs them on a host: [`airlock_sandbox::route_to_proxy_here`]), then the
/// sockets, which stay in the namespace they were made in. The sandbox was built without
/// proxy mode (a VM's sandbox may be built before its network policy is known, in a
/// template), so its init bound none of these ports.
pub fn bind_in_sandbox(sandbox_id: &str) -> Result<Listeners, String> {
    let pid = sandbox_pid(sandbox_id).ok_or_else(|| format!("no process of sandbox {sandbox_id}"))?;
    let ns = File::open(format!("/proc/{pid}/ns/net")).map_err(|e| format!("its network namespace: {e}"))?;
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("joining the sandbox's network namespace: {e}"))?;
        airlock_sandbox::route_to_proxy_here()?;
        let tcp = |port: u16| {
            TcpListener::bind((Ipv4Addr::LOCALHOST, port))
                .map_err(|e| format!("binding 127.0.0.1:{port} (TCP) in the sandbox: {e}"))
        };
        Ok(Listeners {
            proxy: tcp(PROXY_PORT)?,
            transparent: tcp(TRANSPARENT_PORT)?,
            dns: UdpSocket::bind((Ipv4Addr::LOCALHOST, DNS_PORT))
                .map_err(|e| format!("binding 127.0.0.1:{DNS_PORT} (UDP) in the sandbox: {e}"))?,
        })
    })
    .join()
    .map_err(|_| "the binding thread panicked".to_owned())?
}

/// Installs the trust bundle `pem` in the sandbox whose cgroup is named `sandbox_id`, at
/// [`airlock_vmwire::GUEST_CA_BUNDLE`]: through its init's root, as a new root-owned,
/// read-only file (never through a link the program could have planted: `O_NOFOLLOW`,
/// `O_EXCL`; /tmp is sticky, so the program can neither change nor replace it).
pub fn install_ca_bundle(sandbox_id: &str, pem: &str) -> Result<(), String> {
    let pid = sandbox_pid(sandbox_id).ok_or_else(|| format!("no process of sandbox {sandbox_id}"))?;
    // The sandbox's tmpfs belongs to its user namespace: a file there must be owned by a
    // uid it maps. Made as the sandbox's root (never its user, uid 1000), on a thread of
    // its own whose filesystem ids are switched (they are per thread).
    let uid = outer_root(&format!("/proc/{pid}/uid_map"))?;
    let gid = outer_root(&format!("/proc/{pid}/gid_map"))?;
    let path = format!("/proc/{pid}/root{}", airlock_vmwire::GUEST_CA_BUNDLE);
    let pem = pem.to_owned();
    std::thread::spawn(move || {
        // SAFETY: setfsuid/setfsgid change only this thread's filesystem ids, which this
        // short-lived thread uses for the one file it creates.
        unsafe {
            libc::setfsgid(gid);
            libc::setfsuid(uid);
        }
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| format!("creating {}: {e}", airlock_vmwire::GUEST_CA_BUNDLE))?;
        f.write_all(pem.as_bytes())
            .map_err(|e| format!("writing {}: {e}", airlock_vmwire::GUEST_CA_BUNDLE))
    })
    .join()
    .map_err(|_| "the installing thread panicked".to_owned())?
}

/// The id outside a user namespace of its id 0, from its `uid_map` or `gid_map`.
fn outer_root(map: &str) -> Result<u32, String> {
    let text = fs::read_to_string(map).map_err(|e| format!("{map}: {e}"))?;
    text.lines()
        .find_map(|l| {
            let mut f = l.split_whitespace().map(|x| x.parse::<u32>().ok());
            match (f.next()??, f.next()??) {
                (0, outer) => Some(outer),
                _ => None,
            }
        })
        .ok_or_else(|| format!("{map} maps no id 0"))
}

/// A process of the sandbox (any: they share its network namespace): one whose cgroup v2 path
/// ends with the sandbox's id. Right after the sandbox is built, its init (the only one).
pub fn sandbox_pid(sandbox_id: &str) -> Option<u32> {
    let suffix = format!("/{sandbox_id}");
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cgroup = fs::read_to_string(e.path().join("cgroup")).ok()?;
        cgroup
            .lines()
            .any(|l| l.starts_with("0::") && l.ends_with(&suffix))
            .then_some(pid)
    })
}

/// Opens the egress port.
pub fn open_port() -> Result<File, String> {
    let dev = fs::read_dir("/sys/class/virtio-ports")
        .map_err(|e| format!("/sys/class/virtio-ports: {e}"))?
        .flatten()
        .find(|e| fs::read_to_string(e.path().join("name")).is_ok_and(|n| n.trim() == EGRESS_PORT))
        .map(|e| Path::new("/dev").join(e.file_name()))
        .ok_or_else(|| format!("no virtio port {EGRESS_PORT}"))?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&dev)
        .map_err(|e| format!("{}: {e}", dev.display()))
}

/// What the relay's threads share.
pub struct Shared {
    /// The port's writing side: one whole frame at a time.
    port: Mutex<File>,
    /// Open connections by id.
    conns: Mutex<HashMap<u32, Arc<Conn>>>,
    /// The resolver's socket (answers are sent from it), once proxy mode is on.
    dns: OnceLock<UdpSocket>,
    /// DNS queries sent to the host and not answered yet: who asked, and when.
    queries: Mutex<HashMap<u32, (SocketAddr, Instant)>>,
    /// The sandbox's network namespace (`/proc/<init>/ns/net`), once it exists: where
    /// the host's `Connect`s are made.
    netns: OnceLock<File>,
    /// Spawned programs by id: what their `Signal` and `Resize` reach.
    pub(crate) procs: Mutex<HashMap<u32, Arc<crate::spawn::Running>>>,
    /// Set by [`restored`]: the host's marker, which the port's reader looks for in
    /// what it reads next, dropping everything before it.
    resync: Mutex<Option<Vec<u8>>>,
}

/// The socket of one stream: a connection of the program's, a port the host connects
/// to, a spawned program's stdio (a socketpair's end) or its terminal's master side.
pub enum Sock {
    /// TCP.
    Tcp(TcpStream),
    /// One end of a socketpair.
    Unix(UnixStream),
    /// A terminal's master side (no half-close: it ends when the terminal hangs up).
    Pty(File),
}

impl Sock {
    fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
            Sock::Pty(f) => Sock::Pty(f.try_clone()?),
        })
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.shutdown(how),
            Sock::Unix(s) => s.shutdown(how),
            Sock::Pty(_) => Ok(()),
        }
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(buf),
            Sock::Unix(s) => s.read(buf),
            Sock::Pty(f) => f.read(buf),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(buf),
            Sock::Unix(s) => s.write(buf),
            Sock::Pty(f) => f.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One connection of the program's.
struct Conn {
    /// The program's socket.
    stream: Sock,
    /// Bytes from the host, for the writer thread; `None` is the host's `Eof`.
    to_socket: Mutex<Option<mpsc::Sender<Option<Vec<u8>>>>>,
    /// How many more bytes the host will take (its acknowledgements), and whether the
    /// connection was reset.
    credit: Mutex<(u32, bool)>,
    credit_changed: Condvar,
    /// Threads of the connection that have ended; the last one forgets it.
    ended: AtomicU8,
    /// Its host is gone (the VM was restored from a snapshot): what the program writes
    /// is read and dropped, so it never blocks on a window nobody acknowledges.
    detached: AtomicBool,
}

impl Shared {
    /// Sends one frame to the host.
    pub fn send(&self, frame: &MuxFrame) -> io::Result<()> {
        let bytes = frame.encode();
        let mut port = self.port.lock().unwrap_or_else(|e| e.into_inner());
        port.write_all(&bytes)
    }

    fn get(&self, id: u32) -> Option<Arc<Conn>> {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    fn forget(&self, id: u32) -> Option<Arc<Conn>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&id)
    }

    /// A connection's thread ended; after both, the connection is forgotten.
    fn thread_ended(&self, id: u32, conn: &Conn) {
        if conn.ended.fetch_add(1, Ordering::AcqRel) == 1 {
            self.forget(id);
        }
    }
}

impl Conn {
    /// Resets the connection here: its socket is shut both ways (waking its threads)
    /// and nothing more goes to it.
    fn reset(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
        self.to_socket.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.credit.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        self.credit_changed.notify_all();
    }
}

/// Opens the egress port and serves it on a thread of its own for as long as the VM
/// lives: what the host opens, and (after [`start`]) the proxy's connections.
pub fn serve_port() -> Result<Arc<Shared>, String> {
    let port = open_port()?;
    let reader = port.try_clone().map_err(|e| format!("the egress port: {e}"))?;
    let shared = Arc::new(Shared {
        port: Mutex::new(port),
        conns: Mutex::new(HashMap::new()),
        dns: OnceLock::new(),
        queries: Mutex::new(HashMap::new()),
        netns: OnceLock::new(),
        procs: Mutex::new(HashMap::new()),
        resync: Mutex::new(None),
    });
    let s = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("egress-port".into())
        .spawn(move || read_port(reader, &s))
        .map_err(|e| format!("starting the egress port's reader: {e}"))?;
    Ok(shared)
}

/// The VM was just restored from a full snapshot, and a new host serves the port
/// (`Restored`): the port's reader drops what it holds and skips to `host_marker`
/// (which the host sends first), `own_marker` goes out before any frame of this side,
/// and every stream of the snapshot's host is cut from the port: a spawned program's
/// stdio stays open, its output read and dropped (it runs on undisturbed, nobody
/// streams it); connections (to the proxy, to the sandbox's ports) are reset.
pub fn restored(shared: &Shared, host_marker: &[u8], own_marker: &[u8]) -> io::Result<()> {
    *shared.resync.lock().unwrap_or_else(|e| e.into_inner()) = Some(host_marker.to_vec());
    let conns: Vec<Arc<Conn>> = shared
        .conns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .cloned()
        .collect();
    for conn in conns {
        match conn.stream {
            Sock::Tcp(_) => conn.reset(),
            Sock::Unix(_) | Sock::Pty(_) => {
                conn.detached.store(true, Ordering::Release);
                // Wakes its thread if it waits for a window.
                let _guard = conn.credit.lock().unwrap_or_else(|e| e.into_inner());
                conn.credit_changed.notify_all();
            }
        }
    }
    shared.queries.lock().unwrap_or_else(|e| e.into_inner()).clear();
    // Under the port's lock: after whatever frame was being written when the snapshot
    // was taken, before any other.
    let mut port = shared.port.lock().unwrap_or_else(|e| e.into_inner());
    port.write_all(own_marker)
}

/// Says where the host's `Connect`s go: the network namespace of the sandbox whose init
/// is `pid`.
pub fn set_sandbox(shared: &Shared, pid: u32) -> Result<(), String> {
    let ns = File::open(format!("/proc/{pid}/ns/net")).map_err(|e| format!("its network namespace: {e}"))?;
    let _ = shared.netns.set(ns);
    Ok(())
}

/// Serves the listeners' connections and datagrams over the port, on threads of their
/// own, for as long as the VM lives.
pub fn start(listeners: Listeners, shared: &Arc<Shared>) -> Result<(), String> {
    let failed = |e: io::Error| format!("starting the egress relay: {e}");
    let dns = listeners.dns.try_clone().map_err(failed)?;
    shared
        .dns
        .set(listeners.dns)
        .map_err(|_| "the egress relay runs already".to_owned())?;
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(f)
            .map(drop)
            .map_err(failed)
    };
    // Connection ids are shared by both listeners: each takes every other one.
    let s = Arc::clone(shared);
    let explicit = listeners.proxy;
    spawn(
        "egress-accept",
        Box::new(move || accept(explicit, &s, 0, |_| Some(None))),
    )?;
    let s = Arc::clone(shared);
    let transparent = listeners.transparent;
    spawn(
        "egress-redirect",
        Box::new(move || accept(transparent, &s, 1, |stream| original_dst(stream).map(Some))),
    )?;
    let s = Arc::clone(shared);
    spawn("egress-dns", Box::new(move || relay_dns(&dns, &s)))?;
    Ok(())
}

/// Where a connection redirected to the transparent port was going: its
/// `SO_ORIGINAL_DST`, when that is an address outside the sandbox's loopback. `None`
/// (the connection is closed) for one nf_tables did not redirect: the program connected
/// to the port itself.
fn original_dst(stream: &TcpStream) -> Option<SocketAddr> {
    let dst = match nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::OriginalDst) {
        Ok(sa) => SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
            u16::from_be(sa.sin_port),
        )),
        Err(e) => {
            eprintln!(
                "airlock-guest: a connection to the transparent port without an original destination ({e}): closed"
            );
            return None;
        }
    };
    if dst.ip().is_loopback() || dst.ip().is_unspecified() {
        eprintln!("airlock-guest: a connection to the transparent port whose destination is {dst}: closed");
        return None;
    }
    Some(dst)
}

/// Accepts `listener`'s connections, ids `first`, `first + 2`, ...; `target` says how
/// each is opened on the port (`Some(None)`: `Open`, `Some(Some(dst))`: `OpenTo`) or that
/// it is closed (`None`).
fn accept(
    listener: TcpListener,
    shared: &Arc<Shared>,
    first: u32,
    target: impl Fn(&TcpStream) -> Option<Option<SocketAddr>>,
) {
    let mut next_id: u32 = first;
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let Some(target) = target(&stream) else {
            continue;
        };
        let id = next_id;
        next_id = next_id.wrapping_add(2);
        let open = match target {
            None => MuxFrame::Open(id),
            Some(dst) => MuxFrame::OpenTo(id, dst),
        };
        // Over the bound the connection is simply closed: the program sees its proxy
        // refuse, and nothing here grows.
        let _ = attach(shared, id, Sock::Tcp(stream), Some(open));
    }
}

/// Relays `stream` as stream `id` of the port: registers it, sends `announce` (the frame
/// that opens it on the host, if any), and starts its two threads. Fails (the stream is
/// dropped) past [`MAX_CONNECTIONS`] or when the port is gone.
pub fn attach(shared: &Arc<Shared>, id: u32, stream: Sock, announce: Option<MuxFrame>) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    let (reading, writing) = match (stream.try_clone(), stream.try_clone()) {
        (Ok(r), Ok(w)) => (r, w),
        (Err(e), _) | (_, Err(e)) => return Err(format!("stream {id}: {e}")),
    };
    let conn = Arc::new(Conn {
        stream,
        to_socket: Mutex::new(Some(tx)),
        credit: Mutex::new((WINDOW, false)),
        credit_changed: Condvar::new(),
        ended: AtomicU8::new(0),
        detached: AtomicBool::new(false),
    });
    {
        let mut conns = shared.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.len() >= MAX_CONNECTIONS {
            return Err(format!("{MAX_CONNECTIONS} streams are open already"));
        }
        conns.insert(id, Arc::clone(&conn));
    }
    if let Some(open) = announce
        && let Err(e) = shared.send(&open)
    {
        shared.forget(id);
        return Err(format!("the egress port: {e}"));
    }
    let (s, c) = (Arc::clone(shared), Arc::clone(&conn));
    let up = std::thread::Builder::new().spawn(move || {
        to_host(id, reading, &c, &s);
        s.thread_ended(id, &c);
    });
    let (s, c) = (Arc::clone(shared), Arc::clone(&conn));
    let down = std::thread::Builder::new().spawn(move || {
        to_socket(id, writing, &rx, &c, &s);
        s.thread_ended(id, &c);
    });
    if up.is_err() || down.is_err() {
        conn.reset();
        let _ = shared.send(&MuxFrame::Reset(id));
        shared.forget(id);
        return Err(format!("stream {id}: no thread"));
    }
    Ok(())
}

/// The host's `Connect`: a connection to `port` on the sandbox's loopback, made from a
/// thread in its network namespace, relayed as stream `id` (`Connected`), or `Reset`
/// when nothing listens there (or there is no sandbox yet).
fn connect(shared: &Arc<Shared>, id: u32, port: u16) {
    let s = Arc::clone(shared);
    let started = std::thread::Builder::new().spawn(move || {
        let connected = s.netns.get().ok_or(()).and_then(|ns| {
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(drop)?;
            let to = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            TcpStream::connect_timeout(&to, Duration::from_secs(3)).map_err(drop)
        });
        let attached = connected.and_then(|stream| {
            let _ = stream.set_nodelay(true);
            attach(&s, id, Sock::Tcp(stream), Some(MuxFrame::Connected(id))).map_err(drop)
        });
        if attached.is_err() {
            let _ = s.send(&MuxFrame::Reset(id));
        }
    });
    if started.is_err() {
        let _ = shared.send(&MuxFrame::Reset(id));
    }
}

/// The program's bytes, to the host, within the host's window.
fn to_host(id: u32, mut stream: Sock, conn: &Conn, shared: &Shared) {
    let mut buf = vec![0u8; MUX_CHUNK];
    loop {
        if conn.detached.load(Ordering::Acquire) {
            // Nobody reads it any more: drained and dropped until the program closes it.
            match stream.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
        let room = {
            let mut credit = conn.credit.lock().unwrap_or_else(|e| e.into_inner());
            while credit.0 == 0 && !credit.1 && !conn.detached.load(Ordering::Acquire) {
                credit = conn
                    .credit_changed
                    .wait(credit)
                    .unwrap_or_else(|e| e.into_inner());
            }
            if credit.1 {
                return;
            }
            if conn.detached.load(Ordering::Acquire) {
                continue;
            }
            credit.0 as usize
        };
        let n = match stream.read(&mut buf[..room.min(MUX_CHUNK)]) {
            Ok(0) => {
                let _ = shared.send(&MuxFrame::Eof(id));
                return;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                let _ = shared.send(&MuxFrame::Reset(id));
                conn.reset();
                return;
            }
        };
        if conn.detached.load(Ordering::Acquire) {
            continue;
        }
        conn.credit.lock().unwrap_or_else(|e| e.into_inner()).0 -= n as u32;
        if shared.send(&MuxFrame::Data(id, buf[..n].to_vec())).is_err() {
            conn.reset();
            return;
        }
    }
}

/// The host's bytes, to the program; each chunk acknowledged once the socket took it.
fn to_socket(id: u32, mut stream: Sock, rx: &mpsc::Receiver<Option<Vec<u8>>>, conn: &Conn, shared: &Shared) {
    while let Ok(Some(data)) = rx.recv() {
        if stream.write_all(&data).is_err() {
            let _ = shared.send(&MuxFrame::Reset(id));
            conn.reset();
            return;
        }
        let _ = shared.send(&MuxFrame::Ack(id, data.len() as u32));
    }
    // The host's Eof (or a reset): the program reads the end of the answer.
    let _ = stream.shutdown(Shutdown::Write);
}

/// Reads the port and dispatches each frame to its connection, never waiting on one.
fn read_port(mut port: File, shared: &Arc<Shared>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut decoder = mux::MuxDecoder::default();
    // After a restore: the host's marker, and what was read since while looking for it.
    let mut hunting: Option<(Vec<u8>, Vec<u8>)> = None;
    // No host on the other end (yet, or any more: a one-shot VM's host never opens it):
    // look again, less and less often. A wake-up every 10 ms took emulated CPU from the
    // program's VM all its life; after a quarter of a second idle, 4 a second do.
    let mut idle = std::time::Duration::from_millis(10);
    loop {
        let n = match port.read(&mut buf) {
            Ok(0) => {
                std::thread::sleep(idle);
                idle = (idle * 2).min(std::time::Duration::from_millis(250));
                continue;
            }
            Ok(n) => {
                idle = std::time::Duration::from_millis(10);
                n
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("airlock-guest: egress port: {e}");
                return;
            }
        };
        // The marker is asked for before the host can send it (the host sends it once
        // `Restored` is answered), so the read that brings its first byte comes after:
        // whatever the decoder holds then is the snapshot's, a frame perhaps cut in two.
        if let Some(marker) = shared.resync.lock().unwrap_or_else(|e| e.into_inner()).take() {
            decoder = mux::MuxDecoder::default();
            hunting = Some((marker, Vec::new()));
        }
        let mut fresh = &buf[..n];
        if let Some((marker, seen)) = hunting.as_mut() {
            seen.extend_from_slice(fresh);
            match seen.windows(marker.len()).position(|w| w == marker.as_slice()) {
                Some(at) => {
                    decoder.push(&seen[at + marker.len()..]);
                    hunting = None;
                }
                None => {
                    let keep = seen.len().saturating_sub(marker.len() - 1);
                    seen.drain(..keep);
                }
            }
            fresh = &[];
        }
        decoder.push(fresh);
        loop {
            let frame = match decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    eprintln!("airlock-guest: egress port: {e}");
                    return;
                }
            };
            dispatch(frame, shared);
        }
    }
}

/// Hands one frame from the host to its connection, query or program.
fn dispatch(frame: MuxFrame, shared: &Arc<Shared>) {
    match frame {
        MuxFrame::Data(id, data) => {
            if let Some(c) = shared.get(id) {
                let sent = c
                    .to_socket
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                    .is_some_and(|tx| tx.send(Some(data)).is_ok());
                if !sent {
                    c.reset();
                }
            }
        }
        MuxFrame::Eof(id) => {
            if let Some(c) = shared.get(id)
                && let Some(tx) = c.to_socket.lock().unwrap_or_else(|e| e.into_inner()).take()
            {
                let _ = tx.send(None);
            }
        }
        MuxFrame::Reset(id) => {
            if let Some(c) = shared.get(id) {
                c.reset();
            }
        }
        MuxFrame::Ack(id, n) => {
            if let Some(c) = shared.get(id) {
                let mut credit = c.credit.lock().unwrap_or_else(|e| e.into_inner());
                credit.0 = credit.0.saturating_add(n).min(WINDOW);
                c.credit_changed.notify_all();
            }
        }
        MuxFrame::DnsAnswer(id, answer) => {
            let asker = shared
                .queries
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            if let (Some((to, _)), Some(dns)) = (asker, shared.dns.get()) {
                let _ = dns.send_to(&answer, to);
            }
        }
        MuxFrame::DnsNone(id) => {
            shared
                .queries
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        }
        MuxFrame::Connect(id, port) => connect(shared, id, port),
        MuxFrame::Signal(id, signal) => {
            let p = shared
                .procs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&id)
                .cloned();
            if let Some(p) = p {
                p.signal(signal);
            }
        }
        MuxFrame::Resize(id, rows, cols) => {
            let p = shared
                .procs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&id)
                .cloned();
            if let Some(p) = p {
                p.resize(rows, cols);
            }
        }
        // Only the guest opens connections this way and asks.
        MuxFrame::Open(id) | MuxFrame::OpenTo(id, _) => {
            let _ = shared.send(&MuxFrame::Reset(id));
        }
        MuxFrame::DnsQuery(..) | MuxFrame::Connected(_) | MuxFrame::Exited(..) => {}
    }
}

/// The resolver's datagrams, to the host, each under an id of its own; at most
/// [`MAX_DNS_QUERIES`] wait for their answer at once (past it a query is dropped, as a
/// lost datagram: the program's resolver retries).
fn relay_dns(socket: &UdpSocket, shared: &Shared) {
    let mut buf = vec![0u8; MAX_DNS + 1];
    let mut next_id: u32 = 0;
    loop {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("airlock-guest: the resolver's socket: {e}");
                return;
            }
        };
        // Not a DNS message airlock answers (empty, or larger than any resolver sends).
        if n == 0 || n > MAX_DNS {
            continue;
        }
        let id = next_id;
        {
            let mut queries = shared.queries.lock().unwrap_or_else(|e| e.into_inner());
            if queries.len() >= MAX_DNS_QUERIES {
                queries.retain(|_, (_, at)| at.elapsed() < DNS_EXPIRY);
            }
            if queries.len() >= MAX_DNS_QUERIES || queries.contains_key(&id) {
                continue;
            }
            queries.insert(id, (from, Instant::now()));
        }
        next_id = next_id.wrapping_add(1);
        if shared.send(&MuxFrame::DnsQuery(id, buf[..n].to_vec())).is_err() {
            shared
                .queries
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        }
    }
}
