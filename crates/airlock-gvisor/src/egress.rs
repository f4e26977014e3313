//! Proxy mode, the host's half: airlock's egress proxy (airlock-egress, the same policy,
//! limits and log as the other tiers) served on Unix sockets in the sandbox's bundle,
//! which the bundle binds into the sandbox for the agent's relay (see the agent's
//! `relay` for what each carries): `proxy.sock` (the explicit proxy), `redirect.sock`
//! (every other TCP connection, with its original destination) and `dns.sock` (DNS
//! queries). The sandbox itself has no network (`--network=none`): these sockets are
//! its only way out. Served on a thread of its own with its own small runtime, so one
//! sandbox flooding its proxy cannot slow another's.

use airlock_egress::{Proxy, Served};
use airlock_spec::EgressEntry;
use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// How long the log may take to settle after a program ends: the relay's connections
/// close when the exec's end kills the relay, and each is logged when the proxy sees it.
const SETTLE: Duration = Duration::from_millis(500);

/// Where the socket's directory is bound inside the sandbox.
pub const SANDBOX_DIR: &str = "/.airlock/egress";

/// A running proxy; dropping it stops it.
#[derive(Debug)]
pub struct HostProxy(Served);

impl HostProxy {
    /// Serves `proxy` on the relay's sockets in `dir` (created, readable by root only).
    pub fn start(proxy: Arc<Proxy>, dir: &Path, id: &str) -> std::io::Result<HostProxy> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let mut listeners = Vec::new();
        for (name, kind) in [
            ("proxy.sock", Relayed::Explicit),
            ("redirect.sock", Relayed::Redirected),
            ("dns.sock", Relayed::Dns),
        ] {
            let listener = std::os::unix::net::UnixListener::bind(dir.join(name))?;
            listener.set_nonblocking(true)?;
            listeners.push((kind, listener));
        }
        Served::start(proxy, id, SETTLE, move |proxy, stop| {
            serve(listeners, proxy, stop.stopped())
        })
        .map(HostProxy)
    }

    /// The proxy served.
    pub fn proxy(&self) -> &Arc<Proxy> {
        self.0.proxy()
    }

    /// Log entries recorded since the last call (one exec's egress), waiting a bounded
    /// time for connections still closing.
    pub fn take_new(&mut self) -> Vec<EgressEntry> {
        self.0.take_new()
    }
}

/// What a relay connection carries, by the socket it came on.
#[derive(Debug, Clone, Copy)]
enum Relayed {
    /// The explicit proxy's protocol (127.0.0.1:3128 in the sandbox).
    Explicit,
    /// A redirected connection: a line naming its original destination, then its bytes.
    Redirected,
    /// One DNS query, framed as in DNS over TCP; the answer goes back the same way.
    Dns,
}

/// Accepts the relay's connections until `stop`, each served by [`serve_relayed`].
async fn serve(
    listeners: Vec<(Relayed, std::os::unix::net::UnixListener)>,
    proxy: Arc<Proxy>,
    stop: impl Future<Output = ()>,
) {
    let mut accepting = Vec::new();
    for (kind, listener) in listeners {
        match tokio::net::UnixListener::from_std(listener) {
            Ok(l) => accepting.push((kind, l)),
            Err(e) => {
                tracing::error!(error = %e, "the gVisor egress proxy cannot serve its socket");
                return;
            }
        }
    }
    let (stop_all, stopping) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    // One accept of each socket in flight at a time; `next` yields whichever is ready.
    let mut next = tokio::task::JoinSet::new();
    let accepting: Vec<Arc<(Relayed, tokio::net::UnixListener)>> =
        accepting.into_iter().map(Arc::new).collect();
    for l in &accepting {
        let l = Arc::clone(l);
        next.spawn(async move { (l.1.accept().await, l) });
    }
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            Some(Ok((accepted, l))) = next.join_next() => {
                match accepted {
                    Ok((stream, _)) => {
                        let proxy = Arc::clone(&proxy);
                        let mut stopping = stopping.clone();
                        let kind = l.0;
                        tasks.spawn(async move {
                            serve_relayed(proxy, kind, stream, async move {
                                let _ = stopping.wait_for(|s| *s).await;
                            })
                            .await;
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the gVisor egress proxy failed to accept");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                let again = Arc::clone(&l);
                next.spawn(async move { (again.1.accept().await, again) });
            }
        }
    }
    next.abort_all();
    let _ = stop_all.send(true);
    while tasks.join_next().await.is_some() {}
}

/// The longest first line of a redirected connection (`255.255.255.255:65535`, or an
/// IPv6 address in brackets, and its newline).
const MAX_HEADER: usize = 64;

/// Serves one relay connection by its kind: where the relayed traffic meets
/// airlock-egress (the explicit proxy's connections, redirected ones with their original
/// destination, and DNS queries).
async fn serve_relayed(
    proxy: Arc<Proxy>,
    kind: Relayed,
    mut stream: UnixStream,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    match kind {
        Relayed::Explicit => proxy.serve_stream(stream, stop).await,
        Relayed::Redirected => {
            let dst = match read_destination(&mut stream).await {
                Ok(dst) => dst,
                Err(e) => {
                    tracing::warn!(error = %e, "a redirected connection from the gVisor relay had no destination");
                    return;
                }
            };
            proxy.serve_redirected(stream, dst, stop).await;
        }
        Relayed::Dns => {
            let mut len = [0u8; 2];
            if stream.read_exact(&mut len).await.is_err() {
                return;
            }
            let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
            if stream.read_exact(&mut query).await.is_err() {
                return;
            }
            let answer = proxy.answer_dns(&query).await;
            if let Some(answer) = answer
                && let Ok(len) = u16::try_from(answer.len())
            {
                let _ = stream.write_all(&len.to_be_bytes()).await;
                let _ = stream.write_all(&answer).await;
            }
        }
    }
}

/// The first line of a redirected connection: its original destination.
async fn read_destination(stream: &mut UnixStream) -> std::io::Result<SocketAddr> {
    let mut line = Vec::with_capacity(MAX_HEADER);
    loop {
        let byte = stream.read_u8().await?;
        if byte == b'\n' {
            break;
        }
        if line.len() == MAX_HEADER {
            return Err(std::io::Error::other("the destination line is too long"));
        }
        line.push(byte);
    }
    std::str::from_utf8(&line)
        .ok()
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| {
            std::io::Error::other(format!("not a destination: {:?}", String::from_utf8_lossy(&line)))
        })
}
