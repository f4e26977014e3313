//! Proxy mode: the egress proxy of one sandbox, served outside it. Init binds the
//! sockets on the sandbox's loopback, where the sandbox's nf_tables rules send every
//! connection and DNS query (so they are the program's only way out; see `netns`), and
//! hands them over ([`EgressSockets`]); here they are served by airlock-egress's
//! [`Served`], on a thread of its own with its own small runtime, so one sandbox flooding
//! its proxy cannot slow another's.

use airlock_egress::{Proxy, ProxyLimits, Served, SystemResolver};
use airlock_spec::{EgressEntry, NetworkPolicy, SpecError};
use std::net::{TcpListener, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

pub use airlock_egress::{DNS_PORT, PROXY_PORT, TRANSPARENT_PORT, proxy_env};

use crate::SandboxError;
use crate::protocol::EgressSetup;

/// How long the log may take to settle after a program ends.
const SETTLE: Duration = Duration::from_millis(500);

/// The proxy for `network`, built before the sandbox (its policy checked, its secrets'
/// placeholders and CA made, so the CA bundle can go into the sandbox): `None` without
/// a proxy.
pub fn proxy(network: &NetworkPolicy) -> Result<Option<Arc<Proxy>>, SandboxError> {
    match network {
        NetworkPolicy::None => Ok(None),
        NetworkPolicy::Proxy(p) => Proxy::for_sandbox(p, ProxyLimits::default(), Arc::new(SystemResolver))
            .map(Some)
            .map_err(|e| match e {
                airlock_egress::SetupError::Policy(e) => {
                    SandboxError::Spec(SpecError::new(e.field, e.message))
                }
                airlock_egress::SetupError::Mitm(e) => {
                    SandboxError::Setup(format!("preparing the interception of secrets: {e}"))
                }
            }),
    }
}

/// What init sets up for proxy mode: the three ports, and the CA bundle to install.
pub(crate) fn setup(ca_bundle: Option<&[u8]>) -> EgressSetup {
    EgressSetup {
        proxy_port: PROXY_PORT,
        transparent_port: TRANSPARENT_PORT,
        dns_port: DNS_PORT,
        ca_bundle_bytes: ca_bundle.map(|b| b.len() as u64),
    }
}

/// The sockets init bound on the sandbox's loopback (see `netns`), in the order of the
/// `Ready` reply's fds.
#[derive(Debug)]
pub struct EgressSockets {
    /// The explicit HTTP proxy's listener ([`PROXY_PORT`]).
    pub proxy: TcpListener,
    /// The transparent listener ([`TRANSPARENT_PORT`]): each accepted connection was
    /// redirected, its original destination is its `SO_ORIGINAL_DST`.
    pub transparent: TcpListener,
    /// The resolver's socket ([`DNS_PORT`], UDP).
    pub dns: UdpSocket,
}

impl EgressSockets {
    /// The sockets of init's `Ready` reply; anything but three is an error.
    pub(crate) fn from_fds(fds: Vec<OwnedFd>) -> Result<EgressSockets, SandboxError> {
        let n = fds.len();
        let Ok([proxy, transparent, dns]) = <[OwnedFd; 3]>::try_from(fds) else {
            return Err(SandboxError::Setup(format!("init sent {n} proxy sockets, not 3")));
        };
        Ok(EgressSockets {
            proxy: proxy.into(),
            transparent: transparent.into(),
            dns: dns.into(),
        })
    }
}

/// A running proxy; dropping it stops it.
#[derive(Debug)]
pub struct EgressProxy(Served);

impl EgressProxy {
    /// Serves `sockets` with `proxy` on a new thread: the explicit proxy, the redirected
    /// connections and the resolver.
    pub fn start(proxy: Arc<Proxy>, sockets: EgressSockets, id: &str) -> Result<EgressProxy, SandboxError> {
        let EgressSockets {
            proxy: listener,
            transparent,
            dns,
        } = sockets;
        Served::start(proxy, id, SETTLE, move |proxy, stop| async move {
            tokio::join!(
                Arc::clone(&proxy).serve(listener, stop.clone().stopped()),
                Arc::clone(&proxy).serve_transparent(transparent, stop.clone().stopped()),
                proxy.serve_dns(dns, stop.stopped()),
            );
        })
        .map(EgressProxy)
        .map_err(SandboxError::Spawn)
    }

    /// The proxy served.
    pub fn proxy(&self) -> &Arc<Proxy> {
        self.0.proxy()
    }

    /// Log entries recorded since the last call (one exec's egress). The program's
    /// processes are gone by now, but the proxy may still be closing their connections
    /// (each is logged when it ends): wait for that, a bounded time.
    pub fn take_new(&mut self) -> Vec<EgressEntry> {
        self.0.take_new()
    }
}
