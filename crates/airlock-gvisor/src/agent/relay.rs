//! Proxy mode, the sandbox's half: the proxy's ports on the sandbox's loopback (the
//! same as in the other tiers), relayed to airlock's egress proxy on the host through
//! Unix sockets bound into the sandbox (runsc `--host-uds=open`; the sandbox has no
//! network device, so these are the only way out):
//!
//! - 127.0.0.1:3128, the explicit proxy, to `proxy.sock` as it is;
//! - 127.0.0.1:3129, where every other TCP connection is redirected ([`super::transparent`]),
//!   to `redirect.sock`, after one line naming the connection's original destination
//!   (`203.0.113.7:443\n`);
//! - 127.0.0.1:53/udp, where every DNS datagram is redirected, to `dns.sock`: one
//!   connection per query, the query and then the answer each framed as in DNS over
//!   TCP (a 2-byte big-endian length); the host closing without an answer sends none.
//!
//! The relay is a process of its own, forked by the agent while it is single-threaded
//! (it may then use threads: one per direction of each connection). Every exec's end
//! kills it with the exec's other processes, so no connection of one exec outlives it,
//! and the agent forks a fresh one for the next exec.

use nix::unistd::{ForkResult, Pid, fork};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Where the host's proxy socket is inside the sandbox.
pub const SOCKET: &str = "/.airlock/egress/proxy.sock";
/// Where the host's socket for redirected connections is inside the sandbox.
pub const REDIRECT_SOCKET: &str = "/.airlock/egress/redirect.sock";
/// Where the host's DNS socket is inside the sandbox.
pub const DNS_SOCKET: &str = "/.airlock/egress/dns.sock";

/// Most DNS queries relayed at once (one thread each); more are dropped, as a busy
/// resolver's would be.
const MAX_QUERIES: usize = 32;
/// How long the host may take to answer a query before the relay gives up on it.
const DNS_TIMEOUT: Duration = Duration::from_secs(10);

/// What the relay serves: the sockets bound on the sandbox's loopback.
#[derive(Debug)]
pub struct Listeners {
    /// 127.0.0.1:3128, the explicit proxy.
    pub proxy: TcpListener,
    /// 127.0.0.1:3129, redirected connections.
    pub transparent: TcpListener,
    /// 127.0.0.1:53, redirected DNS.
    pub dns: UdpSocket,
}

/// Most connections relayed at once (each takes two threads); more wait in the backlog.
const MAX_CONNECTIONS: usize = 64;

/// Binds the proxy's ports on the sandbox's loopback.
pub fn bind() -> io::Result<Listeners> {
    let at = |port| ("127.0.0.1", port);
    let named = |what: &str, e: io::Error| io::Error::new(e.kind(), format!("binding {what}: {e}"));
    Ok(Listeners {
        proxy: TcpListener::bind(at(airlock_sandbox::PROXY_PORT)).map_err(|e| named("the proxy port", e))?,
        transparent: TcpListener::bind(at(super::transparent::TRANSPARENT_PORT))
            .map_err(|e| named("the transparent port", e))?,
        dns: UdpSocket::bind(at(super::transparent::DNS_PORT)).map_err(|e| named("the DNS port", e))?,
    })
}

/// Forks the relay serving `listeners`. The caller must be single-threaded.
pub fn fork_relay(listeners: &Listeners) -> io::Result<Pid> {
    // SAFETY: the agent is single-threaded whenever it forks (see the agent's docs), so
    // the child may allocate and start threads.
    match unsafe { fork() }? {
        ForkResult::Parent { child } => Ok(child),
        ForkResult::Child => {
            // Only the listener (and stderr) stays open: the agent's other fds include
            // the write ends of the ready child's request and stdin pipes, which must
            // reach EOF when the agent closes its copies.
            close_all_but(&[
                listeners.proxy.as_raw_fd(),
                listeners.transparent.as_raw_fd(),
                listeners.dns.as_raw_fd(),
                2,
            ]);
            serve(listeners);
            // SAFETY: ends this forked child without the agent's atexit handlers.
            unsafe { libc::_exit(0) }
        }
    }
}

/// Closes every open fd but `keep`.
pub fn close_all_but(keep: &[RawFd]) {
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default();
    for fd in fds.into_iter().filter(|fd| !keep.contains(fd)) {
        // SAFETY: this forked child owns no Rust object for these fds except `keep`'s
        // (the agent's `File`s and `OwnedFd`s are never used or dropped here: the child
        // ends with _exit); closing the directory's own fd, already closed, fails
        // harmlessly with EBADF.
        unsafe { libc::close(fd) };
    }
}

fn serve(listeners: &Listeners) {
    let live = Arc::new(AtomicUsize::new(0));
    let clones = (listeners.transparent.try_clone(), listeners.dns.try_clone());
    if let (Ok(transparent), Ok(dns)) = clones {
        let live_t = Arc::clone(&live);
        let _ = std::thread::Builder::new().spawn(move || {
            accept_loop(&transparent, &live_t, |conn| {
                let dst = super::transparent::original_destination(&conn)?;
                let mut host = UnixStream::connect(REDIRECT_SOCKET)?;
                host.write_all(format!("{dst}\n").as_bytes())?;
                relay(conn, host)
            })
        });
        let _ = std::thread::Builder::new().spawn(move || serve_dns(&dns));
    }
    accept_loop(&listeners.proxy, &live, |conn| {
        relay(conn, UnixStream::connect(SOCKET)?)
    });
}

/// Accepts on `listener` forever, each connection handed to `serve` on a thread of its
/// own, at most [`MAX_CONNECTIONS`] at once (counted in `live`, shared by the listeners).
fn accept_loop(
    listener: &TcpListener,
    live: &Arc<AtomicUsize>,
    serve: impl Fn(TcpStream) -> io::Result<()> + Send + Sync + Copy + 'static,
) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if live.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            continue; // dropped: the program sees a reset
        }
        live.fetch_add(1, Ordering::Relaxed);
        let live = Arc::clone(live);
        let _ = std::thread::Builder::new().spawn(move || {
            let _ = serve(conn);
            live.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Relays each DNS datagram to the host and its answer, if any, back to the sender.
fn serve_dns(socket: &UdpSocket) {
    let live = Arc::new(AtomicUsize::new(0));
    let mut buf = vec![0u8; 65535];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        if live.load(Ordering::Relaxed) >= MAX_QUERIES {
            continue;
        }
        let (Ok(reply), query) = (socket.try_clone(), buf[..n].to_vec()) else {
            continue;
        };
        live.fetch_add(1, Ordering::Relaxed);
        let live = Arc::clone(&live);
        let _ = std::thread::Builder::new().spawn(move || {
            if let Ok(Some(answer)) = ask_host(&query) {
                let _ = reply.send_to(&answer, from);
            }
            live.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// One query to the host's resolver: its answer, or `None` when it sends none.
fn ask_host(query: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let len = u16::try_from(query.len()).map_err(|_| io::Error::other("query too long"))?;
    let mut host = UnixStream::connect(DNS_SOCKET)?;
    host.set_read_timeout(Some(DNS_TIMEOUT))?;
    host.write_all(&len.to_be_bytes())?;
    host.write_all(query)?;
    let mut len = [0u8; 2];
    match host.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
    host.read_exact(&mut answer)?;
    Ok(Some(answer))
}

/// Copies both ways between the program's connection and `host`, one to the host's proxy.
fn relay(conn: TcpStream, host: UnixStream) -> io::Result<()> {
    let (mut conn_r, mut host_w) = (conn.try_clone()?, host.try_clone()?);
    let up = std::thread::Builder::new().spawn(move || {
        let _ = io::copy(&mut conn_r, &mut host_w);
        let _ = host_w.shutdown(Shutdown::Write);
    })?;
    let (mut host_r, mut conn_w) = (host, conn);
    let _ = io::copy(&mut host_r, &mut conn_w);
    let _ = conn_w.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}
