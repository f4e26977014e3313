//! The sandbox's network namespace in proxy mode, set up by init (root of the sandbox's
//! user namespace, so CAP_NET_ADMIN over this namespace and nothing else) before any
//! program runs. Without it the namespace has loopback only, so a program's `connect()`
//! to any other address fails with `ENETUNREACH` before a packet exists, and nothing
//! could redirect it. So, in this order:
//!
//! 1. a TUN device ([`DEVICE`]), made persistent so that no fd need stay open (it dies
//!    with the namespace), up, with one address, [`ADDRESS`], and the IPv4 default route
//!    through it. No packet ever reaches it: TCP is redirected to loopback before it is
//!    sent and everything else is rejected (step 2), and nothing reads the device;
//! 2. the nf_tables rules of `nftables`: TCP to the transparent port, UDP to port 53 to
//!    the resolver's port, the rest rejected;
//! 3. the three sockets the supervisor serves the proxy on, bound on 127.0.0.1.
//!
//! The address does not matter beyond being one: it is the source address of the
//! redirected connections as the proxy's sockets see them, and nothing else ever sees it
//! (no packet leaves the namespace, and nothing outside can reach into it). It is
//! 192.0.0.8, the "IPv4 dummy address" of RFC 7600, meant for exactly such an
//! interface, so it cannot stand for a real host the program might want to reach (and a
//! connection to it is redirected like any other).
//!
//! IPv6 gets no route: a program's IPv6 connection to anything but ::1 fails with
//! `ENETUNREACH`.

use std::io;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};

use crate::nftables::{self, Redirect};
use crate::protocol::EgressSetup;
use crate::sys;

/// The TUN device's name.
pub const DEVICE: &str = "airlock0";

/// The TUN device's one address (a /32); see the module docs.
pub const ADDRESS: Ipv4Addr = Ipv4Addr::new(192, 0, 0, 8);

/// Routes every IPv4 address through a TUN device made from `tun` (an open
/// /dev/net/tun of this namespace) and installs the redirecting rules.
pub fn route_to_proxy(tun: OwnedFd, egress: &EgressSetup) -> Result<(), String> {
    sys::tun_create_persistent(tun.as_fd(), DEVICE).map_err(|e| format!("creating the TUN device: {e}"))?;
    // Persistent: the device stays without the fd.
    drop(tun);
    sys::interface_up_with_address(DEVICE, ADDRESS)
        .map_err(|e| format!("configuring {DEVICE} ({ADDRESS}/32): {e}"))?;
    sys::add_default_route(c"airlock0").map_err(|e| format!("adding the default route via {DEVICE}: {e}"))?;
    nftables::install(Redirect {
        transparent_port: egress.transparent_port,
        dns_port: egress.dns_port,
    })
    .map_err(|e| format!("installing the redirect rules: {e}"))
}

/// Proxy mode for a sandbox whose egress sockets its caller binds and serves itself (the
/// micro-VM guest agent, which relays them to the host over its egress port): in the
/// network namespace of the CALLING THREAD (the sandbox's, joined with `setns`), what
/// init does in proxy mode: the TUN device, its address, the default route, the
/// redirecting rules to [`crate::TRANSPARENT_PORT`] and [`crate::DNS_PORT`]. Needs
/// CAP_NET_ADMIN over that namespace; binds nothing.
pub fn route_to_proxy_here() -> Result<(), String> {
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| format!("/dev/net/tun: {e}"))?;
    route_to_proxy(tun.into(), &crate::egress::setup(None))
}

/// The sockets the supervisor serves the egress proxy on, bound on this namespace's
/// loopback.
#[derive(Debug)]
pub struct Sockets {
    /// The explicit HTTP proxy (TCP).
    pub proxy: TcpListener,
    /// The transparent port (TCP).
    pub transparent: TcpListener,
    /// The resolver (UDP).
    pub dns: UdpSocket,
}

/// Binds the three sockets on 127.0.0.1 (port 53 is below 1024: init holds
/// CAP_NET_BIND_SERVICE in the namespace's user namespace).
pub fn bind(egress: &EgressSetup) -> io::Result<Sockets> {
    let at = |port| (Ipv4Addr::LOCALHOST, port);
    Ok(Sockets {
        proxy: TcpListener::bind(at(egress.proxy_port))?,
        transparent: TcpListener::bind(at(egress.transparent_port))?,
        dns: UdpSocket::bind(at(egress.dns_port))?,
    })
}

/// The plumbing on the real kernel, in a network namespace of the test's own (a thread's:
/// nothing of the host's is touched; needs root): what the proxy's sockets receive.
#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{SocketAddr, SocketAddrV4, TcpStream};

    /// Sets proxy mode's network up on a thread in a fresh network namespace and runs `f`
    /// there with the sockets; `None` when the test cannot make one (not root).
    fn in_proxy_netns<T: Send + 'static>(f: impl FnOnce(Sockets) -> T + Send + 'static) -> Option<T> {
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
            sys::loopback_up().unwrap();
            let egress = crate::egress::setup(None);
            let tun = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/net/tun")
                .unwrap();
            route_to_proxy(tun.into(), &egress).unwrap();
            Some(f(bind(&egress).unwrap()))
        })
        .join()
        .expect("the namespace thread panicked")
    }

    #[test]
    fn a_redirected_connection_carries_its_original_destination() {
        let Some((original, peer, got)) = in_proxy_netns(|s| {
            let dst: SocketAddr = "203.0.113.7:443".parse().unwrap();
            let mut client = TcpStream::connect_timeout(&dst, std::time::Duration::from_secs(5)).unwrap();
            std::io::Write::write_all(&mut client, b"hello").unwrap();
            let (mut accepted, peer) = s.transparent.accept().unwrap();
            let original =
                nix::sys::socket::getsockopt(&accepted, nix::sys::socket::sockopt::OriginalDst).unwrap();
            let mut got = [0u8; 5];
            accepted.read_exact(&mut got).unwrap();
            (original, peer, got)
        }) else {
            eprintln!("NOTE: no network namespace (not root?): skipped");
            return;
        };
        let original = SocketAddrV4::new(
            u32::from_be(original.sin_addr.s_addr).into(),
            u16::from_be(original.sin_port),
        );
        assert_eq!(original.to_string(), "203.0.113.7:443");
        assert_eq!(peer.ip().to_string(), ADDRESS.to_string());
        assert_eq!(&got, b"hello");
    }

    #[test]
    fn dns_to_any_address_reaches_the_resolver_and_other_udp_is_refused() {
        let Some((query, from, other, v6)) = in_proxy_netns(|s| {
            let client = UdpSocket::bind("0.0.0.0:0").unwrap();
            client.send_to(b"query", "198.51.100.1:53").unwrap();
            let mut buf = [0u8; 16];
            let (n, from) = s.dns.recv_from(&mut buf).unwrap();
            let other = client.send_to(b"x", "198.51.100.1:9").unwrap_err().raw_os_error();
            let v6 = std::net::TcpStream::connect("[2001:db8::1]:443")
                .unwrap_err()
                .raw_os_error();
            (buf[..n].to_vec(), from, other, v6)
        }) else {
            return;
        };
        assert_eq!(query, b"query");
        assert_eq!(from.ip().to_string(), ADDRESS.to_string());
        assert_eq!(other, Some(libc::EPERM));
        assert_eq!(v6, Some(libc::ENETUNREACH));
    }
}
