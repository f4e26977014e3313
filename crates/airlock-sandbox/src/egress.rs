//! Proxy mode: the egress proxy of one sandbox, served outside it. Init binds the
//! listening socket on the sandbox's loopback (so it is the program's only way out) and
//! hands it over; here it is served on a thread of its own, with its own small runtime, so
//! one sandbox flooding its proxy cannot slow another's.

use airlock_egress::{Proxy, ProxyLimits, SystemResolver};
use airlock_spec::{EgressEntry, NetworkPolicy, SpecError};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::SandboxError;

/// The port the proxy listens on inside every sandbox (squid's; the namespace is private).
pub const PROXY_PORT: u16 = 3128;

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

/// The proxy for `network`, built before the sandbox (its policy checked, its secrets'
/// placeholders and CA made): `None` without a proxy.
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

/// A running proxy; dropping it stops it.
#[derive(Debug)]
pub struct EgressProxy {
    proxy: Arc<Proxy>,
    /// Entries of the log already returned by [`EgressProxy::take_new`].
    seen: usize,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl EgressProxy {
    /// Serves `listener` with `policy` on a new thread.
    pub fn start(proxy: Arc<Proxy>, listener: OwnedFd, id: &str) -> Result<EgressProxy, SandboxError> {
        let listener = std::net::TcpListener::from(listener);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(SandboxError::Spawn)?;
        let served = Arc::clone(&proxy);
        let thread = std::thread::Builder::new()
            .name(format!("airlock-proxy-{id}"))
            .spawn(move || {
                runtime.block_on(served.serve(listener, async {
                    let _ = stopped.await;
                }));
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
