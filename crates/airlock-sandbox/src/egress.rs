//! Proxy mode: the egress proxy of one sandbox, served outside it. Init binds the
//! sockets on the sandbox's loopback, where the sandbox's nf_tables rules send every
//! connection and DNS query (so they are the program's only way out; see `netns`), and
//! hands them over ([`EgressSockets`]); here they are served on a thread of its own, with
//! its own small runtime, so one sandbox flooding its proxy cannot slow another's.

use airlock_egress::{Policy, Proxy, ProxyLimits, SystemResolver};
use airlock_spec::{EgressEntry, NetworkPolicy, SpecError};
use std::net::{TcpListener, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::protocol::EgressSetup;

use crate::SandboxError;

/// The port the proxy listens on inside every sandbox (squid's; the namespace is private).
pub const PROXY_PORT: u16 = 3128;

/// The transparent port inside every sandbox in proxy mode: the sandbox's nf_tables rules
/// redirect every TCP connection to a non-loopback address here (see `nftables`); its
/// original destination is the accepted socket's `SO_ORIGINAL_DST`.
pub const TRANSPARENT_PORT: u16 = 3129;

/// The port of airlock's resolver inside every sandbox in proxy mode (UDP): the
/// sandbox's /etc/resolv.conf names 127.0.0.1, and its nf_tables rules redirect every
/// datagram to port 53 of any other address here.
pub const DNS_PORT: u16 = 53;

/// The variables that point a program at the proxy on `port` of its loopback (the usual
/// names, upper and lower case), loopback itself excepted.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let proxied = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .map(|k| (k.to_owned(), url.clone()));
    let direct = ["NO_PROXY", "no_proxy"].map(|k| (k.to_owned(), "localhost,127.0.0.1,::1".to_owned()));
    proxied.into_iter().chain(direct).collect()
}

/// How long the log may take to settle after a program ends.
const SETTLE: Duration = Duration::from_millis(500);

/// Parses the policy of `network`, before anything is built: `None` without a proxy.
pub fn policy(network: &NetworkPolicy) -> Result<Option<Policy>, SandboxError> {
    match network {
        NetworkPolicy::None => Ok(None),
        NetworkPolicy::Proxy(p) => Policy::from_proxy(p)
            .map(Some)
            .map_err(|e| SandboxError::Spec(SpecError::new(e.field, e.message))),
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

/// Serves the redirected traffic of one sandbox with `proxy` until `stop`: the
/// connections `transparent` accepts (each one's original destination is its
/// `SO_ORIGINAL_DST`) and the DNS queries `dns` receives.
///
/// MERGE: the host side of this is airlock-egress's `Proxy::serve_transparent` and
/// `Proxy::serve_dns` (the lead's part of issue 15); this is the one place that calls
/// them:
///
/// ```text
/// tokio::join!(
///     Arc::clone(&proxy).serve_transparent(transparent, stopped(stop.clone())),
///     proxy.serve_dns(dns, stopped(stop)),
/// );
/// ```
///
/// Until they exist, the two sockets are held open, unserved, for as long as the proxy
/// runs: a redirected connection completes its handshake and waits in the listen queue
/// (the program's own timeout ends it), and a query waits in the socket's queue; none of
/// it reaches any network.
async fn serve_redirected(
    proxy: Arc<Proxy>,
    transparent: TcpListener,
    dns: UdpSocket,
    stop: tokio::sync::watch::Receiver<()>,
) {
    let _held = (proxy, transparent, dns);
    stopped(stop).await;
}

/// Resolves once the proxy is told to stop (or its owner is gone).
async fn stopped(mut stop: tokio::sync::watch::Receiver<()>) {
    let _ = stop.changed().await;
}

/// A running proxy; dropping it stops it.
#[derive(Debug)]
pub struct EgressProxy {
    proxy: Arc<Proxy>,
    /// Entries of the log already returned by [`EgressProxy::take_new`].
    seen: usize,
    /// Dropped (or sent to) to stop every task serving the sandbox's sockets.
    stop: Option<tokio::sync::watch::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl EgressProxy {
    /// Serves `sockets` with `policy` on a new thread.
    pub fn start(policy: Policy, sockets: EgressSockets, id: &str) -> Result<EgressProxy, SandboxError> {
        let proxy = Proxy::new(policy, ProxyLimits::default(), Arc::new(SystemResolver));
        let (stop, stop_rx) = tokio::sync::watch::channel(());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(SandboxError::Spawn)?;
        let served = Arc::clone(&proxy);
        let EgressSockets {
            proxy: listener,
            transparent,
            dns,
        } = sockets;
        let thread = std::thread::Builder::new()
            .name(format!("airlock-proxy-{id}"))
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::join!(
                        Arc::clone(&served).serve(listener, stopped(stop_rx.clone())),
                        serve_redirected(served, transparent, dns, stop_rx),
                    );
                });
            })
            .map_err(SandboxError::Spawn)?;
        Ok(EgressProxy {
            proxy,
            seen: 0,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The proxy served.
    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    /// Log entries recorded since the last call (one exec's egress). The program's
    /// processes are gone by now, but the proxy may still be closing their connections
    /// (each is logged when it ends): wait for that, a bounded time.
    pub fn take_new(&mut self) -> Vec<EgressEntry> {
        self.proxy.log_since(&mut self.seen, SETTLE)
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
