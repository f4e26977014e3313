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
