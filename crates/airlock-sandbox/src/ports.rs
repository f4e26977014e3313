//! Connections from the host into a sandbox's own loopback: what its programs listen on
//! (see `airlock_backend::PortConnector`). The connector holds the sandbox's network
//! namespace (opened once from its init); each connection is made on a short-lived
//! thread that enters that namespace, so the socket belongs to it (a socket stays in
//! the namespace it was made in, whatever thread uses it later). Nothing else of the
//! host's is reachable this way: the address is always 127.0.0.1 of that namespace.

use airlock_backend::{Error, PortConnector};
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrIn, connect, getsockopt, setsockopt, socket, sockopt,
};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

/// How long a connection may take to be accepted by the listener's kernel queue.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A sandbox's port connector; closed (every later connect answers `Gone`) when the
/// sandbox is purged.
#[derive(Debug)]
pub(crate) struct Ports {
    /// The sandbox's network namespace; `None` once the sandbox is gone.
    netns: Mutex<Option<OwnedFd>>,
}

impl Ports {
    /// Opens the network namespace of host process `init`.
    pub(crate) fn open(init: libc::pid_t) -> io::Result<Ports> {
        let file = std::fs::File::open(format!("/proc/{init}/ns/net"))?;
        Ok(Ports {
            netns: Mutex::new(Some(OwnedFd::from(file))),
        })
    }

    /// Lets go of the namespace: the sandbox is being purged.
    pub(crate) fn close(&self) {
        self.netns.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

impl PortConnector for Ports {
    fn connect(&self, port: u16) -> Result<OwnedFd, Error> {
        if port == 0 {
            return Err(Error::invalid("port", "port 0 is no port to connect to"));
        }
        let netns = {
            let guard = self.netns.lock().unwrap_or_else(|e| e.into_inner());
            let Some(fd) = guard.as_ref() else {
                return Err(Error::Gone("the sandbox is gone".into()));
            };
            fd.try_clone()
                .map_err(|e| Error::host("holding the sandbox's network", e))?
        };
        // setns moves only the calling thread: a thread of its own, which ends here.
        let joined = std::thread::Builder::new()
            .name("airlock-port".into())
            .spawn(move || -> io::Result<OwnedFd> {
                nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
                connect_loopback(port)
            })
            .map_err(|e| Error::host("starting a connection thread", e))?
            .join()
            .map_err(|_| Error::host("connecting into the sandbox", "the thread panicked"))?;
        joined.map_err(|e| match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => {
                Error::NotFound(format!("nothing listens on port {port} in the sandbox"))
            }
            Some(libc::ETIMEDOUT) => Error::NotFound(format!(
                "port {port} in the sandbox did not accept a connection within {} s",
                CONNECT_TIMEOUT.as_secs()
            )),
            _ => Error::host(format!("connecting to port {port} in the sandbox"), e),
        })
    }
}

/// A TCP connection to 127.0.0.1:`port` of the calling thread's network namespace,
/// blocking once connected.
fn connect_loopback(port: u16) -> io::Result<OwnedFd> {
    let sock = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    match connect(sock.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, port)) {
        Ok(()) => {}
        Err(nix::errno::Errno::EINPROGRESS) => {
            use nix::poll::{PollFd, PollFlags, poll};
            let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLOUT)];
            let ms = CONNECT_TIMEOUT.as_millis() as u16;
            if poll(&mut fds, ms)? == 0 {
                return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
            }
            let err = getsockopt(&sock, sockopt::SocketError)?;
            if err != 0 {
                return Err(io::Error::from_raw_os_error(err));
            }
        }
        Err(e) => return Err(e.into()),
    }
    let flags = nix::fcntl::fcntl(&sock, nix::fcntl::FcntlArg::F_GETFL)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) & !nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&sock, nix::fcntl::FcntlArg::F_SETFL(flags))?;
    // A forwarded request goes out in pieces (head, then body): without this, Nagle's
    // wait for the peer's delayed ACK held one in ten for 40 ms.
    setsockopt(&sock, sockopt::TcpNoDelay, &true)?;
    Ok(sock)
}
