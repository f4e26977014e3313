//! Proxy mode in a micro-VM, the host's half: the VM's egress port carries the program's
//! connections to its proxy and its DNS queries ([`airlock_vmwire::mux`]); here each is
//! handed to an airlock-egress [`Proxy`] with the run's policy, as the namespace backend
//! serves the connections of its sandbox's loopback listeners: an explicit one
//! (`Open`) as a proxy client, a redirected one (`OpenTo`) with its original destination,
//! a query to the proxy's resolver. The guest has no network device: this relay is its
//! only way out. It runs on a thread of its own with its own small runtime, so one VM
//! flooding its proxy cannot slow another's.

use airlock_egress::Proxy;
use airlock_spec::EgressEntry;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};

use crate::VmError;
use airlock_vmwire::mux::{
    MAX_CONNECTIONS, MAX_DNS, MAX_DNS_QUERIES, MUX_CHUNK, MuxDecoder, MuxFrame, WINDOW,
};

/// The transparent path's two entry points into airlock-egress, and the only place that
/// calls them: a connection the sandbox's nf_tables redirected, with its original
/// destination, and a DNS query to airlock's resolver.
mod transparent {
    use super::*;

    /// Serves one redirected connection whose original destination is `dst`, judged by
    /// the proxy's policy and logged in its log; returns when it has ended (or, once
    /// `stop` resolves, after closing it).
    pub(super) async fn serve_redirected(
        proxy: Arc<Proxy>,
        stream: DuplexStream,
        dst: SocketAddr,
        stop: impl Future<Output = ()> + Send + 'static,
    ) {
        tracing::debug!(%dst, "egress relay: a redirected connection");
        proxy.serve_redirected(stream, dst, stop).await
    }

    /// The answer of the proxy's resolver to one DNS query; `None`: no answer.
    pub(super) async fn answer_dns(proxy: &Proxy, query: &[u8]) -> Option<Vec<u8>> {
        tracing::debug!(query = %hex(query), "egress relay: a DNS query");
        proxy.answer_dns(query).await
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// How long the log may take to settle after a program ends: its connections are closed
/// in the guest, and the closes cross the port (emulated, under TCG) before the proxy
/// logs them.
const SETTLE: Duration = Duration::from_secs(2);
/// On stop, how long the proxy's connections get to end and be logged.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// A running relay; dropping it stops it.
#[derive(Debug)]
pub(crate) struct EgressRelay {
    proxy: Arc<Proxy>,
    /// The policy's source, to tell a request that asks for another one.
    network: airlock_spec::NetworkPolicy,
    /// Entries of the log already returned by [`EgressRelay::take_new`].
    seen: usize,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl EgressRelay {
    /// Serves the host's end of a VM's egress port with `policy`, on a new thread.
    pub(crate) fn start(
        proxy: Arc<Proxy>,
        network: airlock_spec::NetworkPolicy,
        port: UnixStream,
        vm: &str,
    ) -> Result<EgressRelay, VmError> {
        let host_err = |e: std::io::Error| VmError::Host(format!("egress relay: {e}"));
        port.set_nonblocking(true).map_err(host_err)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(host_err)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = Arc::clone(&proxy);
        let thread = std::thread::Builder::new()
            .name(format!("airlock-egress-{vm}"))
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::UnixStream::from_std(port) {
                        Ok(port) => relay(port, served, stopped).await,
                        Err(e) => tracing::error!(error = %e, "egress relay: the port"),
                    }
                });
            })
            .map_err(host_err)?;
        Ok(EgressRelay {
            proxy,
            network,
            seen: 0,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The network policy this relay serves.
    pub(crate) fn network(&self) -> &airlock_spec::NetworkPolicy {
        &self.network
    }

    /// Log entries recorded since the last call (one exec's egress), once the proxy's
    /// connections have ended (a bounded wait).
    pub(crate) fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    /// Log entries recorded since the last call.
    pub(crate) fn take_new(&mut self) -> Vec<EgressEntry> {
        self.proxy.log_since(&mut self.seen, SETTLE)
    }
}

impl Drop for EgressRelay {
    fn drop(&mut self) {
        // Held connections are refused now: nobody will answer for this VM any more.
        self.proxy.control().refuse_all();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One connection as the relay tracks it.
struct Conn {
    /// Bytes from the guest, to the proxy; `None` once the guest sent `Eof`.
    to_proxy: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// Bytes the guest sent and the proxy has not taken yet: at most a [`WINDOW`].
    pending: Arc<AtomicU32>,
    /// How much more the guest will take of the proxy's answer (its acknowledgements).
    credit: Arc<Semaphore>,
    /// The proxy's side has ended (its `Eof` or `Reset` was sent).
    up_done: bool,
    /// The connection's tasks, aborted on a reset.
    tasks: [AbortHandle; 2],
}

/// What a connection's tasks tell the relay.
enum Event {
    /// The proxy closed its side: `Eof` was sent.
    UpDone(u32),
    /// The connection failed: `Reset` was sent; forget it.
    Failed(u32),
}

/// Relays the port until `stop`, the port's end, or a framing error.
async fn relay(port: tokio::net::UnixStream, proxy: Arc<Proxy>, stop: tokio::sync::oneshot::Receiver<()>) {
    let (mut rd, mut wr) = port.into_split();
    // Frames to the guest: data within each connection's window, acknowledgements and
    // closes: bounded by the windows, so the queue needs no bound of its own.
    let (out, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(frame) = out_rx.recv().await {
            if wr.write_all(&frame).await.is_err() {
                break;
            }
        }
    });
    let (events, mut events_rx) = mpsc::unbounded_channel::<Event>();
    let (stop_proxy, proxy_stopped) = watch::channel(false);
    let mut served = JoinSet::new();
    let mut conn_tasks = JoinSet::new();
    let mut conns: HashMap<u32, Conn> = HashMap::new();
    let dns_slots = Arc::new(Semaphore::new(MAX_DNS_QUERIES));
    let mut decoder = MuxDecoder::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut stop = std::pin::pin!(stop);
    'relay: loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(_) = served.join_next(), if !served.is_empty() => {}
            Some(_) = conn_tasks.join_next(), if !conn_tasks.is_empty() => {}
            Some(event) = events_rx.recv() => match event {
                Event::UpDone(id) => {
                    if let Some(c) = conns.get_mut(&id) {
                        c.up_done = true;
                        if c.to_proxy.is_none() {
                            conns.remove(&id);
                        }
                    }
                }
                Event::Failed(id) => {
                    if let Some(c) = conns.remove(&id) {
                        c.tasks.iter().for_each(AbortHandle::abort);
                    }
                }
            },
            read = rd.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                decoder.push(&buf[..n]);
                loop {
                    let frame = match decoder.next_frame() {
                        Ok(Some(f)) => f,
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "egress relay: the guest sent a bad frame; closing");
                            break 'relay;
                        }
                    };
                    match frame {
                        MuxFrame::Open(id) => {
                            if conns.len() >= MAX_CONNECTIONS || conns.contains_key(&id) {
                                let _ = out.send(MuxFrame::Reset(id).encode());
                                continue;
                            }
                            let conn = open(id, None, &proxy, &proxy_stopped, &out, &events, &mut served, &mut conn_tasks);
                            conns.insert(id, conn);
                        }
                        MuxFrame::OpenTo(id, dst) => {
                            if conns.len() >= MAX_CONNECTIONS || conns.contains_key(&id) {
                                let _ = out.send(MuxFrame::Reset(id).encode());
                                continue;
                            }
                            let conn = open(id, Some(dst), &proxy, &proxy_stopped, &out, &events, &mut served, &mut conn_tasks);
                            conns.insert(id, conn);
                        }
                        MuxFrame::DnsQuery(id, query) => {
                            // Every query is answered once; over the bound, with no answer.
                            let Ok(permit) = Arc::clone(&dns_slots).try_acquire_owned() else {
                                let _ = out.send(MuxFrame::DnsNone(id).encode());
                                continue;
                            };
                            let (proxy, out) = (Arc::clone(&proxy), out.clone());
                            conn_tasks.spawn(async move {
                                let answer = transparent::answer_dns(&proxy, &query).await;
                                let frame = match answer {
                                    Some(a) if !a.is_empty() && a.len() <= MAX_DNS => MuxFrame::DnsAnswer(id, a),
                                    Some(a) => {
                                        tracing::warn!(bytes = a.len(), "egress relay: a DNS answer that cannot cross the port (1 to {MAX_DNS} bytes): none sent");
                                        MuxFrame::DnsNone(id)
                                    }
                                    None => MuxFrame::DnsNone(id),
                                };
                                let _ = out.send(frame.encode());
                                drop(permit);
                            });
                        }
                        // Only the host answers queries.
                        MuxFrame::DnsAnswer(..) | MuxFrame::DnsNone(_) => {}
                        MuxFrame::Data(id, data) => {
                            let Some(c) = conns.get_mut(&id) else { continue };
                            let len = data.len() as u32;
                            let over = c.pending.fetch_add(len, Ordering::Relaxed) + len > WINDOW;
                            let sent = !over && c.to_proxy.as_ref().is_some_and(|tx| tx.send(data).is_ok());
                            if !sent {
                                // Past its window, or after its Eof: the guest broke the rules.
                                let _ = out.send(MuxFrame::Reset(id).encode());
                                if let Some(c) = conns.remove(&id) {
                                    c.tasks.iter().for_each(AbortHandle::abort);
                                }
                            }
                        }
                        MuxFrame::Eof(id) => {
                            if let Some(c) = conns.get_mut(&id) {
                                c.to_proxy = None;
                                if c.up_done {
                                    conns.remove(&id);
                                }
                            }
                        }
                        MuxFrame::Reset(id) => {
                            if let Some(c) = conns.remove(&id) {
                                c.tasks.iter().for_each(AbortHandle::abort);
                            }
                        }
                        MuxFrame::Ack(id, n) => {
                            if let Some(c) = conns.get(&id) {
                                let room = (WINDOW as usize).saturating_sub(c.credit.available_permits());
                                c.credit.add_permits((n as usize).min(room));
                            }
                        }
                    }
                }
            }
        }
    }
    // The proxy closes what is still open and logs it; the relay's tasks go.
    let _ = stop_proxy.send(true);
    let _ = tokio::time::timeout(STOP_WAIT, async { while served.join_next().await.is_some() {} }).await;
    served.abort_all();
    conn_tasks.abort_all();
    writer.abort();
}

/// Starts serving connection `id` (explicit, or redirected from `dst`): the proxy on one
/// end of an in-memory stream, and two tasks moving bytes between the other end and the
/// port.
#[allow(clippy::too_many_arguments)]
fn open(
    id: u32,
    dst: Option<SocketAddr>,
    proxy: &Arc<Proxy>,
    stopped: &watch::Receiver<bool>,
    out: &mpsc::UnboundedSender<Vec<u8>>,
    events: &mpsc::UnboundedSender<Event>,
    served: &mut JoinSet<()>,
    conn_tasks: &mut JoinSet<()>,
) -> Conn {
    let (proxy_end, relay_end) = tokio::io::duplex(WINDOW as usize);
    let mut stopped = stopped.clone();
    let stop = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    match dst {
        None => served.spawn(Arc::clone(proxy).serve_stream(proxy_end, stop)),
        Some(dst) => served.spawn(transparent::serve_redirected(
            Arc::clone(proxy),
            proxy_end,
            dst,
            stop,
        )),
    };
    let (mut from_proxy, mut to_proxy) = tokio::io::split(relay_end);
    let credit = Arc::new(Semaphore::new(WINDOW as usize));
    let pending = Arc::new(AtomicU32::new(0));

    // The proxy's answer, to the guest, within the guest's window.
    let up = {
        let (out, events, credit) = (out.clone(), events.clone(), Arc::clone(&credit));
        conn_tasks.spawn(async move {
            let mut buf = vec![0u8; MUX_CHUNK];
            loop {
                match from_proxy.read(&mut buf).await {
                    Ok(0) => {
                        let _ = out.send(MuxFrame::Eof(id).encode());
                        let _ = events.send(Event::UpDone(id));
                        return;
                    }
                    Ok(n) => {
                        match credit.acquire_many(n as u32).await {
                            Ok(p) => p.forget(),
                            Err(_) => return,
                        }
                        let _ = out.send(MuxFrame::Data(id, buf[..n].to_vec()).encode());
                    }
                    Err(_) => {
                        let _ = out.send(MuxFrame::Reset(id).encode());
                        let _ = events.send(Event::Failed(id));
                        return;
                    }
                }
            }
        })
    };
    // The guest's bytes, to the proxy; each chunk acknowledged once the proxy took it.
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let down = {
        let (out, events, pending) = (out.clone(), events.clone(), Arc::clone(&pending));
        conn_tasks.spawn(async move {
            while let Some(data) = rx.recv().await {
                if to_proxy.write_all(&data).await.is_err() {
                    let _ = out.send(MuxFrame::Reset(id).encode());
                    let _ = events.send(Event::Failed(id));
                    return;
                }
                let n = data.len() as u32;
                pending.fetch_sub(n, Ordering::Relaxed);
                let _ = out.send(MuxFrame::Ack(id, n).encode());
            }
            // The guest's Eof: the proxy reads the end of the request.
            let _ = to_proxy.shutdown().await;
        })
    };
    Conn {
        to_proxy: Some(tx),
        pending,
        credit,
        up_done: false,
        tasks: [up, down],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_egress::{Policy, ProxyLimits, SystemResolver};
    use airlock_vmwire::mux::read_frame;
    use std::io::Write;

    /// The host's end of the egress port, version 2: every DNS query is answered exactly
    /// once (an answer or `DnsNone`), also past [`MAX_DNS_QUERIES`] at once, and a
    /// redirected connection reaches the proxy's policy with its original destination
    /// (a private address: refused before any connection, and logged with it).
    #[test]
    fn every_dns_query_is_answered_once_and_a_redirected_connection_meets_the_policy() {
        let (host, mut guest) = UnixStream::pair().unwrap();
        host.set_nonblocking(true).unwrap();
        let proxy = Proxy::new(
            Policy::new(&[], &[]).unwrap(),
            ProxyLimits::default(),
            Arc::new(SystemResolver),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = Arc::clone(&proxy);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                relay(tokio::net::UnixStream::from_std(host).unwrap(), served, stopped).await;
            });
        });
        let queries = 2 * MAX_DNS_QUERIES as u32;
        let mut wire = Vec::new();
        for id in 0..queries {
            wire.extend(MuxFrame::DnsQuery(id, vec![0x12, 0x34, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]).encode());
        }
        let private: SocketAddr = "10.0.0.5:80".parse().unwrap();
        wire.extend(MuxFrame::OpenTo(7, private).encode());
        guest.write_all(&wire).unwrap();

        let mut answered = std::collections::BTreeMap::new();
        let mut closed = false;
        while answered.len() < queries as usize || !closed {
            match read_frame(&mut guest).unwrap().expect("the relay ended") {
                MuxFrame::DnsAnswer(id, _) | MuxFrame::DnsNone(id) => {
                    *answered.entry(id).or_insert(0) += 1;
                }
                MuxFrame::Eof(7) | MuxFrame::Reset(7) => closed = true,
                MuxFrame::Data(7, _) | MuxFrame::Ack(..) => {}
                other => panic!("unexpected frame {other:?}"),
            }
        }
        assert!(answered.values().all(|n| *n == 1), "{answered:?}");
        assert_eq!(
            answered.keys().copied().collect::<Vec<_>>(),
            (0..queries).collect::<Vec<_>>()
        );
        let _ = stop.send(());
        thread.join().unwrap();
        let log = proxy.log();
        let entry = log
            .iter()
            .find(|e| e.port == 80 && (e.host == "10.0.0.5" || e.addr.as_deref() == Some("10.0.0.5")))
            .unwrap_or_else(|| panic!("no entry for {private}: {log:?}"));
        assert!(!entry.allowed, "{entry:?}");
    }
}
