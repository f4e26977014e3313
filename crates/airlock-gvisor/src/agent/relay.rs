//! Proxy mode, the sandbox's half: the proxy's port on the sandbox's loopback
//! (127.0.0.1:3128, the same port as in the other tiers), relayed to airlock's egress
//! proxy on the host through a Unix socket bound into the sandbox (runsc
//! `--host-uds=open`; the sandbox has no network device, so this is the only way out).
//!
//! The relay is a process of its own, forked by the agent while it is single-threaded
//! (it may then use threads: one per direction of each connection). Every exec's end
//! kills it with the exec's other processes, so no connection of one exec outlives it,
//! and the agent forks a fresh one for the next exec.

use nix::unistd::{ForkResult, Pid, fork};
use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

/// Where the host's proxy socket is inside the sandbox.
pub const SOCKET: &str = "/.airlock/egress/proxy.sock";

/// Most connections relayed at once (each takes two threads); more wait in the backlog.
const MAX_CONNECTIONS: usize = 64;

/// Binds the proxy's port on the sandbox's loopback.
pub fn bind() -> io::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", airlock_sandbox::PROXY_PORT))
}

/// Forks the relay serving `listener`. The caller must be single-threaded.
pub fn fork_relay(listener: &TcpListener) -> io::Result<Pid> {
    // SAFETY: the agent is single-threaded whenever it forks (see the agent's docs), so
    // the child may allocate and start threads.
    match unsafe { fork() }? {
        ForkResult::Parent { child } => Ok(child),
        ForkResult::Child => {
            // Only the listener (and stderr) stays open: the agent's other fds include
            // the write ends of the ready child's request and stdin pipes, which must
            // reach EOF when the agent closes its copies.
            close_all_but(&[listener.as_raw_fd(), 2]);
            serve(listener);
            // SAFETY: ends this forked child without the agent's atexit handlers.
            unsafe { libc::_exit(0) }
        }
    }
}

/// Closes every open fd but `keep`.
fn close_all_but(keep: &[RawFd]) {
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

fn serve(listener: &TcpListener) {
    let live = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if live.load(std::sync::atomic::Ordering::Relaxed) >= MAX_CONNECTIONS {
            continue; // dropped: the program sees a reset
        }
        live.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let live = std::sync::Arc::clone(&live);
        let _ = std::thread::Builder::new().spawn(move || {
            let _ = relay(conn);
            live.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        });
    }
}

/// Copies both ways between the program's connection and a new one to the host's proxy.
fn relay(conn: TcpStream) -> io::Result<()> {
    let host = UnixStream::connect(SOCKET)?;
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
