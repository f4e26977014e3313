//! Proxy mode, the host's half: airlock's egress proxy (airlock-egress, the same policy,
//! limits and log as the other tiers) served on a Unix socket in the sandbox's bundle,
//! which the bundle binds into the sandbox for the agent's relay. The sandbox itself has
//! no network (`--network=none`): this socket is its only way out. Served on a thread
//! of its own with its own small runtime, so one sandbox flooding its proxy cannot slow
//! another's.

use airlock_egress::{Policy, Proxy, ProxyLimits, SystemResolver};
use airlock_spec::EgressEntry;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the log may take to settle after a program ends: the relay's connections
/// close when the exec's end kills the relay, and each is logged when the proxy sees it.
const SETTLE: Duration = Duration::from_millis(500);

/// Where the socket's directory is bound inside the sandbox.
pub const SANDBOX_DIR: &str = "/.airlock/egress";

/// A running proxy; dropping it stops it.
#[derive(Debug)]
pub struct HostProxy {
    proxy: Arc<Proxy>,
    /// Entries of the log already returned by [`HostProxy::take_new`].
    seen: usize,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl HostProxy {
    /// Serves `policy` on `dir/proxy.sock` (`dir` is created, readable by root only).
    pub fn start(policy: Policy, dir: &Path, id: &str) -> std::io::Result<HostProxy> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let listener = std::os::unix::net::UnixListener::bind(dir.join("proxy.sock"))?;
        listener.set_nonblocking(true)?;
        let proxy = Proxy::new(policy, ProxyLimits::default(), Arc::new(SystemResolver));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = Arc::clone(&proxy);
        let thread = std::thread::Builder::new()
            .name(format!("airlock-proxy-{id}"))
            .spawn(move || runtime.block_on(serve(listener, served, stopped)))?;
        Ok(HostProxy {
            proxy,
            seen: 0,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Log entries recorded since the last call (one exec's egress), waiting a bounded
    /// time for connections still closing.
    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    /// Log entries recorded since the last call.
    pub fn take_new(&mut self) -> Vec<EgressEntry> {
        self.proxy.log_since(&mut self.seen, SETTLE)
    }
}

/// Accepts the relay's connections until `stop`, each served by the proxy.
async fn serve(
    listener: std::os::unix::net::UnixListener,
    proxy: Arc<Proxy>,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "the gVisor egress proxy cannot serve its socket");
            return;
        }
    };
    let (stop_all, stopping) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let proxy = Arc::clone(&proxy);
                    let mut stopping = stopping.clone();
                    tasks.spawn(async move {
                        proxy
                            .serve_stream(stream, async move {
                                let _ = stopping.wait_for(|s| *s).await;
                            })
                            .await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the gVisor egress proxy failed to accept");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
    let _ = stop_all.send(true);
    while tasks.join_next().await.is_some() {}
}

impl Drop for HostProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
