//! Proxy mode, the guest's half. The VM has no network device; the program reaches the
//! host's egress proxy through the sandbox's own loopback: a listener on 127.0.0.1:3128
//! in the sandbox's network namespace (where the namespace backend's init binds it), whose
//! connections are relayed over the egress port ([`airlock_vmwire::mux`]).
//!
//! Threads, not an event loop: one accepts, one reads the port and dispatches, and each
//! connection has one thread per direction. No thread ever blocks the port on one
//! connection: what the host sends is queued per connection (at most a window, which the
//! host respects) and written to the socket by that connection's own thread.

use airlock_vmwire::mux::{self, EGRESS_PORT, MAX_CONNECTIONS, MUX_CHUNK, MuxFrame, WINDOW};
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

pub use airlock_sandbox::PROXY_PORT;

/// Binds the proxy's listener in the network namespace of the sandbox whose cgroup is
/// named `sandbox_id`: on a thread of its own that joins the namespace (a network
/// namespace is per thread) and ends; the socket stays in the namespace it was made in.
pub fn bind_in_sandbox(sandbox_id: &str) -> Result<TcpListener, String> {
    let pid = sandbox_pid(sandbox_id).ok_or_else(|| format!("no process of sandbox {sandbox_id}"))?;
    let ns = File::open(format!("/proc/{pid}/ns/net")).map_err(|e| format!("its network namespace: {e}"))?;
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("joining the sandbox's network namespace: {e}"))?;
        TcpListener::bind((Ipv4Addr::LOCALHOST, PROXY_PORT))
            .map_err(|e| format!("binding 127.0.0.1:{PROXY_PORT} in the sandbox: {e}"))
    })
    .join()
    .map_err(|_| "the binding thread panicked".to_owned())?
}

/// A process of the sandbox (any: they share its network namespace): one whose cgroup v2 path
/// ends with the sandbox's id.
fn sandbox_pid(sandbox_id: &str) -> Option<u32> {
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
struct Shared {
    /// The port's writing side: one whole frame at a time.
    port: Mutex<File>,
    /// Open connections by id.
    conns: Mutex<HashMap<u32, Arc<Conn>>>,
}

/// One connection of the program's.
struct Conn {
    /// The program's socket.
    stream: TcpStream,
    /// Bytes from the host, for the writer thread; `None` is the host's `Eof`.
    to_socket: Mutex<Option<mpsc::Sender<Option<Vec<u8>>>>>,
    /// How many more bytes the host will take (its acknowledgements), and whether the
    /// connection was reset.
    credit: Mutex<(u32, bool)>,
    credit_changed: Condvar,
    /// Threads of the connection that have ended; the last one forgets it.
    ended: AtomicU8,
}

impl Shared {
    fn send(&self, frame: &MuxFrame) -> io::Result<()> {
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

/// Serves `listener`'s connections over `port`, on threads of their own, for as long as
/// the VM lives.
pub fn start(listener: TcpListener, port: File) -> Result<(), String> {
    let reader = port.try_clone().map_err(|e| format!("the egress port: {e}"))?;
    let shared = Arc::new(Shared {
        port: Mutex::new(port),
        conns: Mutex::new(HashMap::new()),
    });
    let s = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("egress-port".into())
        .spawn(move || read_port(reader, &s))
        .map_err(|e| format!("starting the egress relay: {e}"))?;
    std::thread::Builder::new()
        .name("egress-accept".into())
        .spawn(move || accept(listener, &shared))
        .map_err(|e| format!("starting the egress relay: {e}"))?;
    Ok(())
}

fn accept(listener: TcpListener, shared: &Arc<Shared>) {
    let mut next_id: u32 = 0;
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let id = next_id;
        next_id = next_id.wrapping_add(1);
        let (tx, rx) = mpsc::channel();
        let (Ok(reading), Ok(writing)) = (stream.try_clone(), stream.try_clone()) else {
            continue;
        };
        let conn = Arc::new(Conn {
            stream,
            to_socket: Mutex::new(Some(tx)),
            credit: Mutex::new((WINDOW, false)),
            credit_changed: Condvar::new(),
            ended: AtomicU8::new(0),
        });
        {
            let mut conns = shared.conns.lock().unwrap_or_else(|e| e.into_inner());
            // Over the bound the connection is simply closed: the program sees its
            // proxy refuse, and nothing here grows.
            if conns.len() >= MAX_CONNECTIONS {
                continue;
            }
            conns.insert(id, Arc::clone(&conn));
        }
        if shared.send(&MuxFrame::Open(id)).is_err() {
            shared.forget(id);
            continue;
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
        }
    }
}

/// The program's bytes, to the host, within the host's window.
fn to_host(id: u32, mut stream: TcpStream, conn: &Conn, shared: &Shared) {
    let mut buf = vec![0u8; MUX_CHUNK];
    loop {
        let room = {
            let mut credit = conn.credit.lock().unwrap_or_else(|e| e.into_inner());
            while credit.0 == 0 && !credit.1 {
                credit = conn
                    .credit_changed
                    .wait(credit)
                    .unwrap_or_else(|e| e.into_inner());
            }
            if credit.1 {
                return;
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
        conn.credit.lock().unwrap_or_else(|e| e.into_inner()).0 -= n as u32;
        if shared.send(&MuxFrame::Data(id, buf[..n].to_vec())).is_err() {
            conn.reset();
            return;
        }
    }
}

/// The host's bytes, to the program; each chunk acknowledged once the socket took it.
fn to_socket(
    id: u32,
    mut stream: TcpStream,
    rx: &mpsc::Receiver<Option<Vec<u8>>>,
    conn: &Conn,
    shared: &Shared,
) {
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
fn read_port(port: File, shared: &Shared) {
    let mut reader = io::BufReader::with_capacity(64 * 1024, port);
    loop {
        let frame = match mux::read_frame(&mut reader) {
            Ok(Some(f)) => f,
            // No host on the other end (yet, or any more): look again shortly.
            Ok(None) => {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            Err(e) => {
                eprintln!("airlock-guest: egress port: {e}");
                return;
            }
        };
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
            // Only the guest opens connections.
            MuxFrame::Open(id) => {
                let _ = shared.send(&MuxFrame::Reset(id));
            }
        }
    }
}
