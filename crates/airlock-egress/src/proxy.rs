//! The proxy server of one sandbox: accepts the program's connections, judges each
//! request by the [`Policy`], resolves names itself, connects to the checked address,
//! relays bytes within the [`ProxyLimits`], and logs every decision.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_spec::{EgressEntry, EgressKind};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout, timeout_at};

use crate::addr::format_ip;
use crate::control::{Answer, Control};
use crate::policy::{Denied, Policy, Target};
use crate::relay::{
    Activity, Budget, HeadRead, Meter, forward_body, is_byte_limit, pump, read_head, relay_response,
};
use crate::request::{BadRequest, HttpRequest, MAX_HEAD_BYTES, Request, parse_request, upstream_head};
use crate::resolver::Resolver;

mod intercept;

/// After an accept error other than an aborted connection (out of fds, of memory), wait
/// this long instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How long a refusal may take to write before the connection is dropped anyway.
const RESPOND_TIMEOUT: Duration = Duration::from_secs(2);

/// After a refusal, what the program still sends is read and discarded for this long (and
/// at most [`DRAIN_BYTES`]), so that closing does not reset the connection before the
/// program has read the answer.
const DRAIN_TIME: Duration = Duration::from_millis(500);
const DRAIN_BYTES: usize = 64 * 1024;

/// The client side's read buffer: holds a whole request head.
pub(crate) const CLIENT_BUFFER: usize = 16 * 1024;

/// The upstream side's read buffer: holds a large response head and moves bodies fast.
const UPSTREAM_BUFFER: usize = 256 * 1024;

/// A log entry's host and reason are cut to this many bytes (a host can be 16 KiB of
/// garbage; the log keeps up to `max_log_entries` of them).
const MAX_LOG_TEXT: usize = 512;

/// The bounds of one proxy (one sandbox).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyLimits {
    /// Connections open at once; more are refused at once (and logged denied).
    pub max_connections: usize,
    /// Bytes moved in all (both ways, all connections); past it connections are closed
    /// and new requests denied.
    pub max_bytes: u64,
    /// To resolve a name, and then to connect to its addresses.
    pub connect_timeout: Duration,
    /// A connection with no traffic either way for this long is closed (also the time a
    /// program has to send a request head).
    pub idle_timeout: Duration,
    /// Log entries kept; later ones are counted (see [`Proxy::dropped_log_entries`]).
    pub max_log_entries: usize,
}

impl Default for ProxyLimits {
    /// 64 connections, 1 GiB, 10 s to connect, 60 s idle, 1000 log entries.
    fn default() -> Self {
        ProxyLimits {
            max_connections: 64,
            max_bytes: 1 << 30,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_log_entries: 1000,
        }
    }
}

/// The egress log, bounded.
#[derive(Debug)]
struct Log {
    entries: Vec<EgressEntry>,
    cap: usize,
    /// Entries not kept because the log was full.
    dropped: u64,
}

/// The filtering egress proxy of one sandbox. Everything it counts is its own: several
/// proxies in one process share nothing.
pub struct Proxy {
    control: Arc<Control>,
    limits: ProxyLimits,
    pub(crate) resolver: Arc<dyn Resolver>,
    /// The names this sandbox's resolver answered, by the address it gave: how a
    /// redirected connection without SNI or Host is known by its name.
    pub(crate) names: Mutex<crate::dns::Names>,
    /// One permit per open connection.
    slots: Arc<Semaphore>,
    /// The permits `slots` started with.
    slot_count: usize,
    /// Bytes moved by all connections, both ways.
    budget: Budget,
    /// Decisions, for metrics.
    allowed: AtomicU64,
    denied: AtomicU64,
    log: Mutex<Log>,
    /// Secrets and TLS interception, when the sandbox has secrets.
    mitm: Option<crate::mitm::Mitm>,
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("control", &self.control)
            .field("limits", &self.limits)
            .field("active_connections", &self.active_connections())
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

/// One connection's log entry in the making.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) kind: EgressKind,
    start: Instant,
    host: String,
    port: u16,
    addr: Option<IpAddr>,
    /// `None` until decided: a connection that never sent a request leaves no entry.
    allowed: Option<bool>,
    reason: String,
    up: AtomicU64,
    down: AtomicU64,
    /// Whether the entry was written already (a refusal is logged before it is sent).
    logged: bool,
}

impl Conn {
    pub(crate) fn new(kind: EgressKind) -> Conn {
        Conn {
            kind,
            start: Instant::now(),
            host: String::new(),
            port: 0,
            addr: None,
            allowed: None,
            reason: String::new(),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            logged: false,
        }
    }

    /// The host and port asked for.
    pub(crate) fn set_target(&mut self, host: &str, port: u16) {
        self.host = host.to_owned();
        self.port = port;
    }

    /// The address connected to.
    pub(crate) fn set_addr(&mut self, addr: IpAddr) {
        self.addr = Some(addr);
    }

    /// Connecting failed.
    pub(crate) fn set_failure(&mut self, addr: Option<IpAddr>, reason: &str) {
        self.addr = addr;
        self.note(reason);
    }

    /// The program-to-remote byte counter.
    pub(crate) fn up(&self) -> &AtomicU64 {
        &self.up
    }

    /// Appends what happened after the decision: `allowed by x; closed: idle for 60s`.
    pub(crate) fn note(&mut self, what: &str) {
        if self.reason.is_empty() {
            self.reason = what.to_string();
        } else {
            self.reason = format!("{}; {what}", self.reason);
        }
    }
}

/// Why connecting upstream failed.
#[derive(Debug)]
pub(crate) struct ConnectFailure {
    /// 502, or 504 on a timeout.
    pub(crate) status: u16,
    pub(crate) reason: String,
    pub(crate) addr: Option<IpAddr>,
}

/// How the relaying of a connection ended.
struct Ended {
    /// Appended to the log entry's reason.
    note: Option<String>,
    /// A status and reason to answer the program with (nothing was relayed to it yet).
    answer: Option<(u16, String)>,
}

/// How a plain-HTTP exchange ended.
enum Exchange {
    Done,
    Idle,
    Request(io::Error),
    Response(io::Error),
}

/// A program's connection to the proxy: a TCP stream [`Proxy::serve`] accepted, or any
/// byte stream handed to [`Proxy::serve_stream`] (a micro-VM's relayed connection).
pub trait ClientStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> ClientStream for T {}

/// A client connection, whatever carries it.
pub(crate) type Client = Box<dyn ClientStream>;
pub(crate) type ClientReader<'a> = BufReader<ReadHalf<&'a mut Client>>;
pub(crate) type ClientWriter<'a> = WriteHalf<&'a mut Client>;

impl Proxy {
    /// A proxy deciding by `policy` within `limits`, resolving names with `resolver`.
    pub fn new(policy: Policy, limits: ProxyLimits, resolver: Arc<dyn Resolver>) -> Arc<Proxy> {
        Proxy::build(Control::fixed(policy), limits, resolver, None)
    }

    /// A proxy deciding by what `control` holds now (a session's policy, which may
    /// change, and its approvals), without secrets.
    pub fn with_control(
        control: Arc<Control>,
        limits: ProxyLimits,
        resolver: Arc<dyn Resolver>,
    ) -> Arc<Proxy> {
        Proxy::build(control, limits, resolver, None)
    }

    /// The proxy of a sandbox whose proxy-mode policy is `policy`: its allow and deny
    /// rules (changeable while it runs, see [`Proxy::control`]), its approvals, and its
    /// secrets (placeholders in [`Proxy::secret_env`]; connections to their hosts
    /// TLS-intercepted with a CA of its own, [`Proxy::ca_bundle_pem`], their upstreams
    /// verified against [`crate::TrustRoots::system`]).
    pub fn for_sandbox(
        policy: &airlock_spec::ProxyPolicy,
        limits: ProxyLimits,
        resolver: Arc<dyn Resolver>,
    ) -> Result<Arc<Proxy>, crate::SetupError> {
        let control = Control::new(policy)?;
        let configs: Vec<crate::SecretConfig> = policy
            .secrets
            .iter()
            .map(|s| crate::SecretConfig {
                name: s.name.clone(),
                value: s.value.clone(),
                hosts: s.hosts.clone(),
                query: s.query,
            })
            .collect();
        let secrets = crate::Secrets::new(&configs)?;
        let mitm = if secrets.is_empty() {
            None
        } else {
            Some(crate::mitm::Mitm::new(secrets, &crate::TrustRoots::system()?)?)
        };
        Ok(Proxy::build(control, limits, resolver, mitm))
    }

    /// [`Proxy::new`] with secrets: the sandbox gets [`Proxy::secret_env`] (placeholders)
    /// and trusts [`Proxy::ca_pem`]; connections to the hosts the secrets name are
    /// TLS-intercepted to put the values in, their upstreams verified against `roots`.
    /// Without secrets this is [`Proxy::new`] (no CA is made).
    pub fn with_secrets(
        policy: Policy,
        limits: ProxyLimits,
        resolver: Arc<dyn Resolver>,
        secrets: crate::Secrets,
        roots: &crate::TrustRoots,
    ) -> Result<Arc<Proxy>, crate::MitmError> {
        let mitm = if secrets.is_empty() {
            None
        } else {
            Some(crate::mitm::Mitm::new(secrets, roots)?)
        };
        Ok(Proxy::build(Control::fixed(policy), limits, resolver, mitm))
    }

    fn build(
        control: Arc<Control>,
        limits: ProxyLimits,
        resolver: Arc<dyn Resolver>,
        mitm: Option<crate::mitm::Mitm>,
    ) -> Arc<Proxy> {
        let slot_count = limits.max_connections.min(Semaphore::MAX_PERMITS);
        Arc::new(Proxy {
            control,
            limits,
            resolver,
            names: Mutex::new(crate::dns::Names::default()),
            slots: Arc::new(Semaphore::new(slot_count)),
            slot_count,
            budget: Budget::new(limits.max_bytes),
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            log: Mutex::new(Log {
                entries: Vec::new(),
                cap: limits.max_log_entries,
                dropped: 0,
            }),
            mitm,
        })
    }

    /// Accepts connections on `listener` until `stop` resolves, serving each on its own
    /// task. `listener` is a std socket the caller created (possibly in another network
    /// namespace: its connections come from there); outbound connections are made from
    /// the namespace of the thread running this future. On `stop`, open connections are
    /// closed (logged with "closed: proxy stopped") and this returns once all have ended,
    /// so [`Proxy::log`] is complete then. A listener that cannot be used is reported with
    /// `tracing` (see [`Proxy::try_serve`] to get the error).
    pub async fn serve(
        self: Arc<Self>,
        listener: std::net::TcpListener,
        stop: impl Future<Output = ()> + Send,
    ) {
        if let Err(e) = self.try_serve(listener, stop).await {
            tracing::error!(error = %e, "the egress proxy cannot serve its listener");
        }
    }

    /// [`Proxy::serve`], with an error when the listener cannot be made non-blocking or
    /// registered with the runtime.
    pub async fn try_serve(
        self: Arc<Self>,
        listener: std::net::TcpListener,
        stop: impl Future<Output = ()> + Send,
    ) -> io::Result<()> {
        self.accept_loop(listener, stop, false).await
    }

    /// Accepts on `listener` until `stop`: requests to the proxy, or, with `redirected`,
    /// connections the sandbox's rules redirected (each served by its original
    /// destination; one without any is not a redirected connection and is closed).
    pub(crate) async fn accept_loop(
        self: Arc<Self>,
        listener: std::net::TcpListener,
        stop: impl Future<Output = ()> + Send,
        redirected: bool,
    ) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                biased;
                () = &mut stop => break,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let dst = match redirected.then(|| crate::redirect::original_destination(&stream)) {
                            None => None,
                            Some(Ok(dst)) => Some(dst),
                            Some(Err(e)) => {
                                // Not redirected (a program dialling the port itself):
                                // there is nowhere it was going.
                                tracing::debug!(error = %e, "a connection to the transparent port has no original destination");
                                continue;
                            }
                        };
                        match (Arc::clone(&self.slots).try_acquire_owned(), dst) {
                            (Ok(permit), dst) => {
                                let proxy = Arc::clone(&self);
                                let stop = stop_rx.clone();
                                let _ = stream.set_nodelay(true);
                                tasks.spawn(async move {
                                    proxy.handle(Box::new(stream), dst, stop).await;
                                    drop(permit);
                                });
                            }
                            (Err(_), Some(dst)) => self.refuse_redirected(dst),
                            (Err(_), None) => self.refuse(stream),
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the egress proxy failed to accept a connection");
                        if !matches!(
                            e.kind(),
                            io::ErrorKind::ConnectionAborted
                                | io::ErrorKind::ConnectionReset
                                | io::ErrorKind::Interrupted
                        ) {
                            tokio::time::sleep(ACCEPT_BACKOFF).await;
                        }
                    }
                },
            }
        }
        drop(listener);
        let _ = stop_tx.send(true);
        while tasks.join_next().await.is_some() {}
        Ok(())
    }

    /// The log so far: one entry per connection (CONNECT) or request (plain HTTP), denied
    /// ones included, in the order they ended. When entries were dropped for the bound, a
    /// last entry (host `""`, port 0, not allowed) says how many.
    pub fn log(&self) -> Vec<EgressEntry> {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let mut entries = log.entries.clone();
        if log.dropped > 0 {
            entries.push(EgressEntry {
                kind: EgressKind::Proxy,
                host: String::new(),
                port: 0,
                addr: None,
                allowed: false,
                reason: format!(
                    "{} more entries not logged (the log keeps {})",
                    log.dropped, log.cap
                ),
                bytes_up: 0,
                bytes_down: 0,
                ms: 0.0,
            });
        }
        entries
    }

    /// The entries after the first `*seen` (one exec's, when `*seen` counts what earlier
    /// calls returned), and `*seen` moved past them. Connections still open are logged when
    /// they end, so this waits up to `settle` for them first (a program's processes are
    /// gone, but the proxy may still be closing their connections).
    pub fn log_since(&self, seen: &mut usize, settle: std::time::Duration) -> Vec<EgressEntry> {
        let deadline = std::time::Instant::now() + settle;
        while self.active_connections() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let log = self.log();
        let new = log.get(*seen..).map(<[EgressEntry]>::to_vec).unwrap_or_default();
        *seen = log.len();
        new
    }

    /// Entries not kept because the log was full.
    pub fn dropped_log_entries(&self) -> u64 {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).dropped
    }

    /// Decision counts for metrics: (allowed, denied). Refused connections (too many)
    /// and malformed requests count as denied.
    pub fn counts(&self) -> (u64, u64) {
        (self.allowed.load(Relaxed), self.denied.load(Relaxed))
    }

    /// Connections open now. Their log entries are written when they end.
    pub fn active_connections(&self) -> usize {
        self.slot_count - self.slots.available_permits()
    }

    /// The policy this proxy decides by now.
    pub fn policy(&self) -> Arc<Policy> {
        self.control.policy()
    }

    /// What may change while it runs: the policy and the approvals.
    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// Applies a policy change for the next connections and records it in the log.
    pub fn update_policy(
        &self,
        patch: &airlock_spec::NetworkPatch,
    ) -> Result<airlock_spec::ProxyPolicy, crate::PolicyError> {
        let (shown, what) = self.control.update(patch)?;
        self.push(EgressEntry {
            kind: EgressKind::Policy,
            host: String::new(),
            port: 0,
            addr: None,
            allowed: true,
            reason: what,
            bytes_up: 0,
            bytes_down: 0,
            ms: 0.0,
        });
        Ok(shown)
    }

    /// The bytes all connections may still move.
    pub(crate) fn budget(&self) -> &Budget {
        &self.budget
    }

    pub(crate) fn budget_exhausted(&self) -> bool {
        self.budget.exhausted()
    }

    pub(crate) fn byte_limit_reason(&self) -> String {
        format!("byte limit reached ({} bytes per sandbox)", self.budget.max())
    }

    /// A redirected connection over the cap: logged and closed.
    pub(crate) fn refuse_redirected(&self, dst: SocketAddr) {
        let (reason, _) = self.over_cap();
        self.push(EgressEntry {
            kind: EgressKind::Redirected,
            host: format_ip(&dst.ip()),
            port: dst.port(),
            addr: None,
            allowed: false,
            reason,
            bytes_up: 0,
            bytes_down: 0,
            ms: 0.0,
        });
    }

    /// The limits this proxy enforces.
    pub fn limits(&self) -> &ProxyLimits {
        &self.limits
    }

    /// Serves one connection that is already open (the other end of a socketpair, or of
    /// a relay), as [`Proxy::serve`] serves each connection it accepts: within the same
    /// limits (over `max_connections` open at once it is answered 503), judged by the
    /// same policy, logged in the same log. Returns when the connection has ended and is
    /// logged, or, once `stop` resolves, after closing it (logged with "closed: proxy
    /// stopped").
    pub async fn serve_stream<S>(self: Arc<Self>, stream: S, stop: impl Future<Output = ()> + Send)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.serve_one(Box::new(stream), None, stop).await;
    }

    /// One connection handed over (a request to the proxy, or with `redirected` its
    /// original destination), within the connection limit, until it ends or `stop`.
    pub(crate) async fn serve_one(
        self: Arc<Self>,
        stream: Client,
        redirected: Option<SocketAddr>,
        stop: impl Future<Output = ()> + Send,
    ) {
        let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() else {
            match redirected {
                Some(dst) => self.refuse_redirected(dst),
                None => self.refuse_stream(stream).await,
            }
            return;
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let work = Arc::clone(&self).handle(stream, redirected, stop_rx);
        let mut work = std::pin::pin!(work);
        tokio::select! {
            () = &mut work => {}
            () = stop => {
                let _ = stop_tx.send(true);
                work.await;
            }
        }
        drop(permit);
    }

    /// One connection, from accept to its log entry: a request to the proxy, or (with
    /// its original destination) a connection redirected to it.
    pub(crate) async fn handle(
        self: Arc<Self>,
        mut stream: Client,
        redirected: Option<SocketAddr>,
        mut stop: watch::Receiver<bool>,
    ) {
        let kind = match redirected {
            Some(_) => EgressKind::Redirected,
            None => EgressKind::Proxy,
        };
        let mut conn = Conn::new(kind);
        let activity = Activity::new();
        let stopped = {
            let work = async {
                match redirected {
                    Some(dst) => {
                        self.serve_redirected_conn(&mut stream, dst, &mut conn, &activity)
                            .await
                    }
                    None => self.serve_conn(&mut stream, &mut conn, &activity).await,
                }
            };
            tokio::select! {
                () = work => false,
                // A dropped sender means the server is gone: stop too.
                _ = stop.wait_for(|stopped| *stopped) => true,
            }
        };
        if stopped && conn.allowed == Some(true) {
            conn.note("closed: proxy stopped");
        }
        self.finish(&mut conn);
    }

    /// Serves one connection. Every refusal is logged before it is sent, so the log has
    /// the entry by the time the program reads the answer.
    async fn serve_conn(&self, stream: &mut Client, conn: &mut Conn, activity: &Activity) {
        let (r, mut w) = tokio::io::split(stream);
        let mut r = BufReader::with_capacity(CLIENT_BUFFER, r);

        let mut head = Vec::new();
        let read = timeout(
            self.limits.idle_timeout,
            read_head(&mut r, &mut head, MAX_HEAD_BYTES),
        )
        .await;
        let request = match read {
            Ok(Ok(HeadRead::Complete)) => parse_request(&head),
            Ok(Ok(HeadRead::TooLarge)) => Err(BadRequest {
                status: 431,
                reason: format!("request head larger than {} KiB", MAX_HEAD_BYTES / 1024),
                authority: None,
            }),
            Ok(Ok(HeadRead::Eof) | Err(_)) => {
                if !head.is_empty() {
                    self.deny(conn, "connection closed within the request head".into(), None);
                }
                return;
            }
            Err(_elapsed) => {
                if head.is_empty() {
                    return;
                }
                Err(BadRequest {
                    status: 408,
                    reason: format!("no complete request head within {:?}", self.limits.idle_timeout),
                    authority: None,
                })
            }
        };
        let request = match request {
            Ok(request) => request,
            Err(bad) => {
                if let Some(a) = &bad.authority {
                    conn.host = a.host.clone();
                    conn.port = a.port;
                }
                self.deny(conn, bad.reason.clone(), None);
                self.finish(conn);
                respond(&mut r, &mut w, bad.status, &bad.reason).await;
                return;
            }
        };
        let authority = match &request {
            Request::Connect(a) => a,
            Request::Http(h) => &h.authority,
        };
        conn.host = authority.host.clone();
        conn.port = authority.port;

        if self.budget.exhausted() {
            let reason = format!("byte limit reached ({} bytes per sandbox)", self.budget.max());
            self.deny(conn, reason.clone(), None);
            self.finish(conn);
            respond(&mut r, &mut w, 403, &reason).await;
            return;
        }
        // A misplaced placeholder is refused before anything is resolved or connected.
        if let Request::Http(req) = &request
            && let Err(reason) = self.http_head(req)
        {
            self.deny(conn, reason.clone(), None);
            self.finish(conn);
            respond(&mut r, &mut w, 403, &reason).await;
            return;
        }
        let addrs = match self.decide(&authority.host, authority.port).await {
            Ok((addrs, reason)) => {
                self.allow(conn, reason);
                addrs
            }
            Err(denied) => {
                self.deny(conn, denied.reason.clone(), denied.addr);
                self.finish(conn);
                respond(&mut r, &mut w, 403, &denied.reason).await;
                return;
            }
        };
        let mut upstream = match self.connect(&addrs, authority.port).await {
            Ok((upstream, addr)) => {
                conn.addr = Some(addr);
                upstream
            }
            Err(failure) => {
                conn.addr = failure.addr;
                conn.note(&failure.reason);
                self.finish(conn);
                respond(&mut r, &mut w, failure.status, &failure.reason).await;
                return;
            }
        };
        let _ = upstream.set_nodelay(true);
        // Idle time counts from here: reading the head and connecting had their own bounds.
        activity.touch();

        let end = match &request {
            Request::Connect(a) => {
                // The program's bytes after the head (a TLS hello sent eagerly) are still
                // in `r` and go first into the tunnel.
                if w.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                    .await
                    .is_err()
                {
                    return;
                }
                let note = if self.intercepts(&a.host, a.port) {
                    let client = intercept::Duplex { r: &mut r, w: &mut w };
                    self.intercept(client, &a.host, a.port, upstream, conn, activity)
                        .await
                } else {
                    self.tunnel(&mut r, &mut w, &mut upstream, conn, activity).await
                };
                Ended { note, answer: None }
            }
            Request::Http(req) => {
                self.exchange(&mut r, &mut w, &mut upstream, req, conn, activity)
                    .await
            }
        };
        if let Some(note) = end.note {
            conn.note(&note);
        }
        self.finish(conn);
        match end.answer {
            Some((status, reason)) => respond(&mut r, &mut w, status, &reason).await,
            // The response went out whole; what the program sent after its request
            // (pipelined requests are never forwarded) must not reset it.
            None if matches!(request, Request::Http(_)) => linger(&mut r).await,
            None => {}
        }
    }

    /// Judges `host:port`: the name (or literal) by the policy, then every address the
    /// name resolves to. Returns the addresses to connect to, all of them checked.
    pub(crate) async fn decide(&self, host: &str, port: u16) -> Result<(Vec<IpAddr>, String), Denied> {
        self.decide_known(host, port, None).await
    }

    /// [`Proxy::decide`], where `known` is an address this sandbox's resolver gave for
    /// the name already (checked again, not resolved again).
    pub(crate) async fn decide_known(
        &self,
        host: &str,
        port: u16,
        known: Option<IpAddr>,
    ) -> Result<(Vec<IpAddr>, String), Denied> {
        let policy = self.control.policy();
        let allowed = match policy.decide_name(host, port) {
            Ok(allowed) => allowed,
            Err(denied) => match self.control.asks() {
                Some(wait) if Policy::askable(&denied.reason) => {
                    match self.control.ask(host, port, &denied.reason, wait).await {
                        Answer::Refused(reason) => return Err(Denied { reason, ..denied }),
                        Answer::Allowed(reason) => crate::policy::Allowed {
                            target: crate::parse_host(host)
                                .map_err(|reason| Denied { reason, addr: None })?,
                            reason,
                        },
                    }
                }
                _ => return Err(denied),
            },
        };
        let policy = self.control.policy();
        let name = match allowed.target {
            Target::Addr(a) => return Ok((vec![a], allowed.reason)),
            Target::Name(name) => name,
        };
        let deny = |reason| Denied { reason, addr: None };
        if let Some(a) = known {
            policy.check_addr(a).map_err(|reason| Denied {
                reason,
                addr: Some(a),
            })?;
            return Ok((vec![a], allowed.reason));
        }
        let resolved = timeout(self.limits.connect_timeout, self.resolver.resolve(&name, port)).await;
        let mut addrs = match resolved {
            Err(_) => return Err(deny(format!("resolving {name} timed out"))),
            Ok(Err(e)) => return Err(deny(format!("cannot resolve {name}: {e}"))),
            Ok(Ok(addrs)) => addrs,
        };
        let mut seen = Vec::with_capacity(addrs.len());
        addrs.retain(|a| {
            let new = !seen.contains(a);
            seen.push(*a);
            new
        });
        if addrs.is_empty() {
            return Err(deny(format!("no address for {name}")));
        }
        // Any denied address denies the request: a rebinding answer mixing a public and
        // a metadata address must not get through by the order it is tried in.
        for &a in &addrs {
            policy.check_addr(a).map_err(|reason| Denied {
                reason,
                addr: Some(a),
            })?;
        }
        Ok((addrs, allowed.reason))
    }

    /// Connects to the checked addresses in order (never resolving again), all within
    /// the connect timeout.
    pub(crate) async fn connect(
        &self,
        addrs: &[IpAddr],
        port: u16,
    ) -> Result<(TcpStream, IpAddr), ConnectFailure> {
        let deadline = Instant::now() + self.limits.connect_timeout;
        let mut failure = ConnectFailure {
            status: 502,
            reason: "no address to connect to".into(),
            addr: None,
        };
        for &addr in addrs {
            let to = SocketAddr::new(addr, port);
            let shown = match addr {
                IpAddr::V4(_) => format!("{}:{port}", format_ip(&addr)),
                IpAddr::V6(_) => format!("[{}]:{port}", format_ip(&addr)),
            };
            match timeout_at(deadline, TcpStream::connect(to)).await {
                Ok(Ok(stream)) => return Ok((stream, addr)),
                Ok(Err(e)) => {
                    failure = ConnectFailure {
                        status: 502,
                        reason: format!("connect to {shown} failed: {e}"),
                        addr: Some(addr),
                    }
                }
                Err(_) => {
                    return Err(ConnectFailure {
                        status: 504,
                        reason: format!(
                            "connect to {shown} timed out after {:?}",
                            self.limits.connect_timeout
                        ),
                        addr: Some(addr),
                    });
                }
            }
        }
        Err(failure)
    }

    /// A CONNECT tunnel: bytes both ways until both sides are done, the idle timeout, or
    /// the byte limit. Returns a note on how it ended, if noteworthy.
    pub(crate) async fn tunnel(
        &self,
        r: &mut ClientReader<'_>,
        w: &mut ClientWriter<'_>,
        upstream: &mut TcpStream,
        conn: &Conn,
        activity: &Activity,
    ) -> Option<String> {
        let (mut ur, mut uw) = upstream.split();
        let up = Meter {
            bytes: &conn.up,
            budget: &self.budget,
            activity,
        };
        let down = Meter {
            bytes: &conn.down,
            ..up
        };
        let ended = tokio::select! {
            res = async { tokio::try_join!(pump(r, &mut uw, up), pump(&mut ur, w, down)) } => res.err(),
            () = activity.idle(self.limits.idle_timeout) => return Some(self.idle_note()),
        };
        ended.map(|e| self.error_note(&e))
    }

    /// One plain-HTTP request: the rewritten head and the body upstream, the response
    /// back, concurrently (a server may answer before the body is done, or send
    /// `100 Continue` first). Returns a note on how it ended, if noteworthy, and an
    /// answer for the program when it failed before the response began.
    async fn exchange(
        &self,
        r: &mut ClientReader<'_>,
        w: &mut ClientWriter<'_>,
        upstream: &mut TcpStream,
        req: &HttpRequest,
        conn: &Conn,
        activity: &Activity,
    ) -> Ended {
        let (ur, mut uw) = upstream.split();
        let mut ur = BufReader::with_capacity(UPSTREAM_BUFFER, ur);
        let up = Meter {
            bytes: &conn.up,
            budget: &self.budget,
            activity,
        };
        let down = Meter {
            bytes: &conn.down,
            ..up
        };
        // The head with secrets put in (checked before connecting: this cannot fail now).
        let head = match self.http_head(req) {
            Ok(head) => head,
            Err(reason) => {
                return Ended {
                    note: Some(reason.clone()),
                    answer: Some((403, reason)),
                };
            }
        };
        let outcome = {
            let send = async {
                up.write(&mut uw, &head).await?;
                forward_body(r, &mut uw, req.body, up).await?;
                // Sent; nothing more is read from the program (one request per connection).
                std::future::pending::<io::Result<()>>().await
            };
            let receive = relay_response(&mut ur, w, &req.method, down);
            tokio::select! {
                res = send => Exchange::Request(res.err().unwrap_or_else(|| io::Error::other("request ended"))),
                res = receive => match res {
                    Ok(_) => Exchange::Done,
                    Err(e) => Exchange::Response(e),
                },
                () = activity.idle(self.limits.idle_timeout) => Exchange::Idle,
            }
        };
        let nothing_sent = conn.down.load(Relaxed) == 0;
        let (note, answer) = match outcome {
            Exchange::Done => (None, None),
            Exchange::Idle => (Some(self.idle_note()), None),
            Exchange::Request(e) | Exchange::Response(e) if is_byte_limit(&e) => {
                (Some(self.error_note(&e)), None)
            }
            Exchange::Request(e) => (
                Some(format!("closed: request body: {e}")),
                Some((400, format!("bad request body: {e}"))),
            ),
            Exchange::Response(e) => (
                Some(format!("closed: response: {e}")),
                Some((502, format!("bad response from the upstream: {e}"))),
            ),
        };
        Ended {
            note,
            answer: answer.filter(|_| nothing_sent),
        }
    }

    fn idle_note(&self) -> String {
        format!("closed: idle for {:?}", self.limits.idle_timeout)
    }

    fn error_note(&self, e: &io::Error) -> String {
        if is_byte_limit(e) {
            format!(
                "closed: byte limit reached ({} bytes per sandbox)",
                self.budget.max()
            )
        } else {
            format!("closed: {e}")
        }
    }

    /// Counts a decision made outside a connection (a DNS query).
    pub(crate) fn count_decision(&self, allowed: bool) {
        if allowed {
            self.allowed.fetch_add(1, Relaxed);
        } else {
            self.denied.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn allow(&self, conn: &mut Conn, reason: String) {
        self.allowed.fetch_add(1, Relaxed);
        conn.allowed = Some(true);
        conn.reason = reason;
    }

    pub(crate) fn deny(&self, conn: &mut Conn, reason: String, addr: Option<IpAddr>) {
        self.denied.fetch_add(1, Relaxed);
        conn.allowed = Some(false);
        conn.reason = reason;
        conn.addr = addr;
    }

    /// A connection over the cap: logged, told so if its socket takes a few bytes at
    /// once, and closed, without a task or a read.
    fn refuse(&self, stream: TcpStream) {
        let (reason, response) = self.over_cap();
        // Out of the runtime, the socket takes these few bytes into its empty send
        // buffer at once, or they are lost: nothing here waits for the program.
        if let Ok(mut stream) = stream.into_std() {
            let _ = std::io::Write::write(&mut stream, response.as_bytes());
        }
        self.log_over_cap(reason);
    }

    /// [`Proxy::refuse`] for a stream handed over: the answer is written within
    /// [`RESPOND_TIMEOUT`].
    async fn refuse_stream(&self, mut stream: Client) {
        let (reason, response) = self.over_cap();
        self.log_over_cap(reason);
        let _ = timeout(RESPOND_TIMEOUT, async {
            stream.write_all(response.as_bytes()).await?;
            stream.shutdown().await
        })
        .await;
    }

    /// The reason and the 503 for a connection over the cap; counted as denied.
    fn over_cap(&self) -> (String, String) {
        self.denied.fetch_add(1, Relaxed);
        let reason = format!(
            "too many connections (at most {} at once)",
            self.limits.max_connections
        );
        let body = format!("{reason}\n");
        let response = format!(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        (reason, response)
    }

    fn log_over_cap(&self, reason: String) {
        self.push(EgressEntry {
            kind: EgressKind::Proxy,
            host: String::new(),
            port: 0,
            addr: None,
            allowed: false,
            reason,
            bytes_up: 0,
            bytes_down: 0,
            ms: 0.0,
        });
    }

    /// Writes the connection's entry (once; not for a connection that sent no request).
    pub(crate) fn finish(&self, conn: &mut Conn) {
        let Some(allowed) = conn.allowed else {
            return;
        };
        if std::mem::replace(&mut conn.logged, true) {
            return;
        }
        self.push(EgressEntry {
            kind: conn.kind,
            host: conn.host.clone(),
            port: conn.port,
            addr: conn.addr.map(|a| format_ip(&a)),
            allowed,
            reason: conn.reason.clone(),
            bytes_up: conn.up.load(Relaxed),
            bytes_down: conn.down.load(Relaxed),
            ms: conn.start.elapsed().as_secs_f64() * 1000.0,
        });
    }

    pub(crate) fn push(&self, mut entry: EgressEntry) {
        clip(&mut entry.host);
        clip(&mut entry.reason);
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.entries.len() < log.cap {
            log.entries.push(entry);
        } else {
            log.dropped += 1;
        }
    }
}

/// Cuts `s` to [`MAX_LOG_TEXT`] bytes, on a character boundary.
fn clip(s: &mut String) {
    if s.len() > MAX_LOG_TEXT {
        let mut end = MAX_LOG_TEXT;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
}

fn status_text(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// Answers the program with `status` and `reason` as a plain-text body, then closes:
/// how every refusal reaches the program (a CONNECT refusal included).
pub(crate) async fn respond(r: &mut ClientReader<'_>, w: &mut ClientWriter<'_>, status: u16, reason: &str) {
    let body = format!("{reason}\n");
    let response = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        status_text(status),
        body.len()
    );
    let written = timeout(RESPOND_TIMEOUT, async {
        w.write_all(response.as_bytes()).await?;
        w.shutdown().await
    })
    .await;
    if matches!(written, Ok(Ok(()))) {
        linger(r).await;
    }
}

/// After the answer is sent (and the write side shut), reads and discards what the
/// program still sends, briefly and boundedly: closing a socket with unread data resets
/// the connection, and a reset can destroy the answer before the program reads it.
async fn linger(r: &mut ClientReader<'_>) {
    let _ = timeout(DRAIN_TIME, async {
        let mut sink = [0u8; 4096];
        let mut total = 0;
        while let Ok(n @ 1..) = r.read(&mut sink).await {
            total += n;
            if total > DRAIN_BYTES {
                break;
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StaticResolver;
    use crate::test_util::{self, *};
    use tokio::io::AsyncReadExt;

    fn resolver(table: &[(&str, &[&str])]) -> Arc<StaticResolver> {
        let mut r = StaticResolver::new();
        for (name, addrs) in table {
            let addrs: Vec<IpAddr> = addrs.iter().map(|a| a.parse().unwrap()).collect();
            r = r.with(name, &addrs);
        }
        Arc::new(r)
    }

    fn no_names() -> Arc<StaticResolver> {
        resolver(&[])
    }

    fn limits() -> ProxyLimits {
        ProxyLimits::default()
    }

    fn body(response: &str) -> &str {
        response.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }

    #[tokio::test]
    async fn connect_tunnel_moves_bytes_both_ways_and_logs_them() {
        let echo = echo_server().await;
        let mut p = TestProxy::start(&[], &["127.0.0.1/32"], limits(), no_names());
        let target = format!("127.0.0.1:{}", echo.port());
        // Bytes sent right behind the head (an eager TLS hello) go first into the tunnel.
        let mut c = TcpStream::connect(p.addr).await.unwrap();
        c.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\nearly").as_bytes())
            .await
            .unwrap();
        assert_eq!(
            test_util::read_head(&mut c).await,
            "HTTP/1.1 200 Connection Established\r\n\r\n"
        );
        let mut early = [0u8; 5];
        c.read_exact(&mut early).await.unwrap();
        assert_eq!(&early, b"early");

        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let (mut r, mut w) = c.into_split();
        let writer = tokio::spawn(async move {
            w.write_all(&data).await.unwrap();
            w.shutdown().await.unwrap();
            data
        });
        let mut back = Vec::new();
        tokio::time::timeout(WAIT, r.read_to_end(&mut back))
            .await
            .unwrap()
            .unwrap();
        let data = writer.await.unwrap();
        assert_eq!(back, data);

        let log = p.log(1).await;
        let e = &log[0];
        assert_eq!((e.host.as_str(), e.port), ("127.0.0.1", echo.port()));
        assert_eq!(e.addr.as_deref(), Some("127.0.0.1"));
        assert!(e.allowed);
        assert_eq!(e.reason, "allowed by allow_cidrs 127.0.0.1/32");
        assert_eq!((e.bytes_up, e.bytes_down), (200_005, 200_005));
        assert!(e.ms > 0.0);
        assert_eq!(p.proxy.counts(), (1, 0));
        assert_eq!(echo.connections(), 1);
        p.stop().await;
    }

    #[tokio::test]
    async fn a_name_is_resolved_once_and_the_checked_address_is_connected_to() {
        let echo = echo_server().await;
        let names = resolver(&[("echo.test", &["127.0.0.1"])]);
        let allow = format!("echo.test:{}", echo.port());
        let p = TestProxy::start(&[&allow], &["127.0.0.1/32"], limits(), names.clone());
        let (mut c, head) = p.connect(&format!("Echo.Test.:{}", echo.port())).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        c.write_all(b"ping").await.unwrap();
        let mut pong = [0u8; 4];
        c.read_exact(&mut pong).await.unwrap();
        drop(c);
        let log = p.log(1).await;
        assert_eq!(log[0].reason, format!("allowed by {allow}"));
        assert_eq!(log[0].addr.as_deref(), Some("127.0.0.1"));
        assert_eq!(log[0].host, "Echo.Test.");
        assert_eq!(names.queries(), ["echo.test"]);
        assert_eq!(echo.connections(), 1);
    }

    #[tokio::test]
    async fn a_denied_connect_is_refused_with_the_reason_and_never_resolved() {
        let names = resolver(&[("example.com", &["93.184.215.14"])]);
        let p = TestProxy::start(&["pypi.org"], &[], limits(), names.clone());
        let (mut c, head) = p.connect("example.com:443").await;
        assert!(head.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{head}");
        assert!(head.contains("Connection: close\r\n"), "{head}");
        let rest = read_to_end(&mut c).await;
        assert_eq!(rest, "not in allowlist\n");
        let answer = p.request(b"CONNECT pypi.org:22 HTTP/1.1\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        assert_eq!(
            body(&answer),
            "port 22 not in allowlist (allowed by pypi.org: 80 and 443)\n"
        );
        assert!(names.queries().is_empty(), "a denied name is not even resolved");
        let log = p.log(2).await;
        assert_eq!(
            (log[0].host.as_str(), log[0].port, log[0].allowed),
            ("example.com", 443, false)
        );
        assert_eq!(log[0].reason, "not in allowlist");
        assert_eq!(log[0].addr, None);
        assert_eq!(p.proxy.counts(), (0, 2));
    }

    #[tokio::test]
    async fn every_literal_spelling_is_denied_by_its_address_without_a_lookup() {
        let names = no_names();
        let p = TestProxy::start(&["*.example.com"], &[], limits(), names.clone());
        let link_local = "link-local address 169.254.169.254";
        let mapped = "IPv4-mapped address ::ffff:a9fe:a9fe embeds link-local address 169.254.169.254";
        let cases = [
            ("169.254.169.254", link_local, "169.254.169.254"),
            ("2852039166", link_local, "169.254.169.254"),
            ("0xa9fea9fe", link_local, "169.254.169.254"),
            ("0251.0376.0251.0376", link_local, "169.254.169.254"),
            ("169.254.43518", link_local, "169.254.169.254"),
            ("0xA9.0xFE.0xA9.0xFE", link_local, "169.254.169.254"),
            ("[::ffff:a9fe:a9fe]", mapped, "::ffff:a9fe:a9fe"),
            ("[::ffff:169.254.169.254]", mapped, "::ffff:a9fe:a9fe"),
            ("[::1]", "loopback address ::1", "::1"),
            (
                "[fd00:ec2::254]",
                "unique-local address fd00:ec2::254",
                "fd00:ec2::254",
            ),
        ];
        let mut n = 0;
        for (host, reason, addr) in cases {
            for raw in [
                format!("CONNECT {host}:443 HTTP/1.1\r\n\r\n"),
                format!("GET http://{host}/latest/meta-data/ HTTP/1.1\r\nHost: {host}\r\n\r\n"),
            ] {
                let answer = p.request(raw.as_bytes()).await;
                assert!(answer.starts_with("HTTP/1.1 403"), "{raw}: {answer}");
                assert_eq!(body(&answer), format!("{reason}\n"), "{raw}");
                n += 1;
                let log = p.log(n).await;
                let e = &log[n - 1];
                assert_eq!(
                    (e.host.as_str(), e.allowed, e.addr.as_deref()),
                    (host, false, Some(addr))
                );
            }
        }
        assert!(
            names.queries().is_empty(),
            "literals are never resolved: {:?}",
            names.queries()
        );
    }

    #[tokio::test]
    async fn loopback_literals_never_reach_a_loopback_server() {
        let server = echo_server().await;
        let port = server.port();
        let p = TestProxy::start(&["*.example.com"], &[], limits(), no_names());
        for host in [
            "127.0.0.1",
            "2130706433",
            "0x7f000001",
            "0x7f.1",
            "127.1",
            "0177.0.0.1",
            "[::ffff:127.0.0.1]",
            "[::ffff:7f00:1]",
            "0",
            "0.0.0.0",
            "[::]",
        ] {
            let answer = p
                .request(format!("CONNECT {host}:{port} HTTP/1.1\r\n\r\n").as_bytes())
                .await;
            assert!(answer.starts_with("HTTP/1.1 403"), "{host}: {answer}");
            let answer = p
                .request(format!("GET http://{host}:{port}/ HTTP/1.1\r\n\r\n").as_bytes())
                .await;
            assert!(answer.starts_with("HTTP/1.1 403"), "{host}: {answer}");
        }
        assert_eq!(server.connections(), 0);
    }

    #[tokio::test]
    async fn dns_rebinding_a_mixed_answer_is_denied_and_never_connected() {
        let server = echo_server().await;
        let port = server.port();
        let names = resolver(&[
            ("rebind.test", &["127.0.0.1", "169.254.169.254"]),
            ("private.test", &["10.0.0.5"]),
            ("mapped.test", &["::ffff:169.254.169.254"]),
        ]);
        let allow =
            ["rebind.test:*", "private.test:*", "mapped.test:*"].map(|a| a.replace('*', &port.to_string()));
        let allow: Vec<&str> = allow.iter().map(String::as_str).collect();
        let p = TestProxy::start(&allow, &["127.0.0.1/32"], limits(), names.clone());
        let cases = [
            (
                "rebind.test",
                "link-local address 169.254.169.254",
                "169.254.169.254",
            ),
            ("private.test", "private address 10.0.0.5", "10.0.0.5"),
            (
                "mapped.test",
                "IPv4-mapped address ::ffff:a9fe:a9fe embeds link-local address 169.254.169.254",
                "::ffff:a9fe:a9fe",
            ),
        ];
        let mut n = 0;
        for (host, reason, addr) in cases {
            for raw in [
                format!("CONNECT {host}:{port} HTTP/1.1\r\n\r\n"),
                format!("GET http://{host}:{port}/ HTTP/1.1\r\n\r\n"),
            ] {
                let answer = p.request(raw.as_bytes()).await;
                assert!(answer.starts_with("HTTP/1.1 403"), "{raw}: {answer}");
                assert_eq!(body(&answer), format!("{reason}\n"));
                n += 1;
                let e = &p.log(n).await[n - 1];
                assert_eq!((e.allowed, e.addr.as_deref()), (false, Some(addr)));
            }
        }
        assert_eq!(
            server.connections(),
            0,
            "the allowed address of the mixed answer was never tried"
        );
    }

    #[tokio::test]
    async fn metadata_names_are_denied_before_resolution() {
        let names = resolver(&[("metadata.google.internal", &["8.8.8.8"])]);
        let p = TestProxy::start(&["*.google.internal", "*.internal"], &[], limits(), names.clone());
        for host in [
            "metadata.google.internal",
            "METADATA.google.internal.",
            "instance-data.ec2.internal",
        ] {
            let answer = p
                .request(
                    format!(
                        "GET http://{host}/computeMetadata/v1/ HTTP/1.1\r\nMetadata-Flavor: Google\r\n\r\n"
                    )
                    .as_bytes(),
                )
                .await;
            assert_eq!(body(&answer), "cloud metadata name\n", "{host}");
        }
        assert!(names.queries().is_empty());
    }

    #[tokio::test]
    async fn plain_http_is_forwarded_in_origin_form_with_connection_close() {
        let server = http_server(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nX-Server: t\r\n\r\nhello").await;
        let port = server.port();
        let names = resolver(&[("web.test", &["127.0.0.1"])]);
        let allow = format!("web.test:{port}");
        let p = TestProxy::start(&[&allow], &["127.0.0.1/32"], limits(), names);
        let raw = format!(
            "GET http://web.test:{port}/path?q=1 HTTP/1.1\r\nHost: web.test:{port}\r\nUser-Agent: t\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic dTpw\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n"
        );
        let answer = p.request(raw.as_bytes()).await;
        assert_eq!(
            answer,
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Server: t\r\nConnection: close\r\n\r\nhello"
        );
        let seen = String::from_utf8(server.received(0).await).unwrap();
        assert_eq!(
            seen,
            format!(
                "GET /path?q=1 HTTP/1.1\r\nHost: web.test:{port}\r\nUser-Agent: t\r\nAccept: */*\r\nConnection: close\r\n\r\n"
            )
        );
        let e = &p.log(1).await[0];
        assert!(e.allowed);
        assert_eq!(e.reason, format!("allowed by {allow}"));
        assert_eq!(
            (e.bytes_up, e.bytes_down),
            (seen.len() as u64, answer.len() as u64)
        );
        assert_eq!(server.connections(), 1);
    }

    #[tokio::test]
    async fn request_bodies_are_forwarded_by_their_framing_and_nothing_after() {
        let server = http_server(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n").await;
        let port = server.port();
        let p = TestProxy::start(&[], &["127.0.0.1/32"], limits(), no_names());
        let url = format!("http://127.0.0.1:{port}/up");
        // Content-Length, with a pipelined second request that must not be forwarded.
        let answer = p
            .request(format!("POST {url} HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET http://127.0.0.1:{port}/smuggled HTTP/1.1\r\n\r\n").as_bytes())
            .await;
        assert!(answer.starts_with("HTTP/1.1 201 Created\r\n"), "{answer}");
        let seen = String::from_utf8(server.received(0).await).unwrap();
        assert_eq!(
            seen,
            "POST /up HTTP/1.1\r\nHost: 127.0.0.1:".to_string()
                + &port.to_string()
                + "\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
        );
        // Chunked, forwarded verbatim, and again nothing after the last chunk.
        let chunks = "4\r\nwiki\r\n5;ext=1\r\npedia\r\n0\r\nTrailer: x\r\n\r\n";
        let answer = p
            .request(format!("POST {url} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{chunks}GET /smuggled HTTP/1.1\r\n\r\n").as_bytes())
            .await;
        assert!(answer.starts_with("HTTP/1.1 201 Created\r\n"), "{answer}");
        let seen = String::from_utf8(server.received(1).await).unwrap();
        assert!(
            seen.ends_with(&format!(
                "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n{chunks}"
            )),
            "{seen}"
        );
        assert!(!seen.contains("smuggled"));
    }

    #[tokio::test]
    async fn a_redirect_is_relayed_not_followed_and_its_target_is_judged_anew() {
        let server = http_server(b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/latest/meta-data/\r\nContent-Length: 0\r\n\r\n").await;
        let port = server.port();
        let names = resolver(&[("web.test", &["127.0.0.1"])]);
        let allow = format!("web.test:{port}");
        let p = TestProxy::start(&[&allow], &["127.0.0.1/32"], limits(), names);
        let answer = p
            .request(format!("GET http://web.test:{port}/ HTTP/1.1\r\n\r\n").as_bytes())
            .await;
        assert!(answer.starts_with("HTTP/1.1 302 Found\r\n"), "{answer}");
        assert!(answer.contains("Location: http://169.254.169.254/latest/meta-data/\r\n"));
        // The program follows it: a new request, judged on its own.
        let answer = p
            .request(
                b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n",
            )
            .await;
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
        assert_eq!(body(&answer), "link-local address 169.254.169.254\n");
        assert_eq!(server.connections(), 1, "only the first request reached anything");
        let log = p.log(2).await;
        assert!(log[0].allowed);
        assert!(!log[1].allowed);
        assert_eq!(p.proxy.counts(), (1, 1));
    }

    #[tokio::test]
    async fn malformed_requests_are_400_and_logged_denied() {
        let server = http_server(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
        let port = server.port();
        let names = resolver(&[("web.test", &["127.0.0.1"])]);
        let allow = format!("web.test:{port}");
        let p = TestProxy::start(&[&allow], &["127.0.0.1/32"], limits(), names);
        let cases = [
            (
                format!("GET http://web.test:{port}/ HTTP/1.1\r\nHost: evil.test\r\n\r\n"),
                "disagrees with the request target",
            ),
            (
                format!("CONNECT web.test:{port} HTTP/1.1\r\nHost: evil.test:{port}\r\n\r\n"),
                "disagrees with the request target",
            ),
            (
                format!("GET http://user:pw@web.test:{port}/ HTTP/1.1\r\n\r\n"),
                "userinfo",
            ),
            (
                format!(
                    "POST http://web.test:{port}/ HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                ),
                "both Content-Length and Transfer-Encoding",
            ),
            (
                format!(
                    "POST http://web.test:{port}/ HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n"
                ),
                "differ",
            ),
            (
                "GET /latest/meta-data/ HTTP/1.1\r\nHost: web.test\r\n\r\n".to_string(),
                "not a proxy request",
            ),
            (
                format!("GET https://web.test:{port}/ HTTP/1.1\r\n\r\n"),
                "use CONNECT",
            ),
            (
                format!("GET http://web.test:{port}\0/ HTTP/1.1\r\n\r\n"),
                "malformed request",
            ),
        ];
        for (i, (raw, want)) in cases.iter().enumerate() {
            let answer = p.request(raw.as_bytes()).await;
            assert!(
                answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
                "{raw:?}: {answer}"
            );
            assert!(body(&answer).contains(want), "{raw:?}: {answer}");
            let e = &p.log(i + 1).await[i];
            assert!(!e.allowed);
            assert!(e.reason.contains(want), "{e:?}");
        }
        // The log names the target when parsing got that far.
        assert_eq!(
            (p.proxy.log()[0].host.as_str(), p.proxy.log()[0].port),
            ("web.test", port)
        );
        assert_eq!(server.connections(), 0);
        assert_eq!(p.proxy.counts(), (0, cases.len() as u64));
    }

    #[tokio::test]
    async fn an_oversized_head_is_refused() {
        let p = TestProxy::start(&["*.example.com"], &[], limits(), no_names());
        let raw = format!(
            "GET http://a.example.com/ HTTP/1.1\r\nX-Big: {}\r\n\r\n",
            "a".repeat(MAX_HEAD_BYTES)
        );
        let answer = p.request(raw.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
        assert!(!p.log(1).await[0].allowed);
    }

    #[tokio::test]
    async fn connections_over_the_cap_are_refused_at_once_and_logged() {
        let echo = echo_server().await;
        let lim = ProxyLimits {
            max_connections: 2,
            ..limits()
        };
        let p = TestProxy::start(&[], &["127.0.0.1/32"], lim, no_names());
        let target = format!("127.0.0.1:{}", echo.port());
        let (first, head) = p.connect(&target).await;
        assert!(head.starts_with("HTTP/1.1 200"));
        let (_second, head) = p.connect(&target).await;
        assert!(head.starts_with("HTTP/1.1 200"));
        assert_eq!(p.proxy.active_connections(), 2);
        // The third is answered without reading anything, then closed.
        let mut third = TcpStream::connect(p.addr).await.unwrap();
        let answer = read_to_end(&mut third).await;
        assert!(
            answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{answer}"
        );
        assert!(
            answer.ends_with("\r\n\r\ntoo many connections (at most 2 at once)\n"),
            "{answer}"
        );
        let e = &p.log(1).await[0];
        assert_eq!(
            (e.allowed, e.reason.as_str()),
            (false, "too many connections (at most 2 at once)")
        );
        // A slot freed is a slot usable.
        drop(first);
        let deadline = tokio::time::Instant::now() + WAIT;
        while p.proxy.active_connections() > 1 {
            assert!(tokio::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (_fourth, head) = p.connect(&target).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(p.proxy.counts(), (3, 1));
    }

    #[tokio::test]
    async fn a_flooded_proxy_does_not_slow_another() {
        let echo = echo_server().await;
        let lim = ProxyLimits {
            max_connections: 4,
            ..limits()
        };
        let flooded = TestProxy::start(&[], &["127.0.0.1/32"], lim, no_names());
        let calm = TestProxy::start(&[], &["127.0.0.1/32"], lim, no_names());
        // Silent connections hold every slot of the first proxy; many more are refused.
        let mut hogs = Vec::new();
        for _ in 0..200 {
            hogs.push(TcpStream::connect(flooded.addr).await.unwrap());
        }
        let started = tokio::time::Instant::now();
        let (mut c, head) = calm.connect(&format!("127.0.0.1:{}", echo.port())).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        c.write_all(b"x").await.unwrap();
        let mut x = [0u8; 1];
        c.read_exact(&mut x).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(flooded.proxy.active_connections(), 4);
        assert_eq!(calm.proxy.counts(), (1, 0));
        // Every connection past the 4 held ones is refused and logged.
        let log = flooded.log(196).await;
        assert_eq!(log.len(), 196);
        assert!(
            log.iter()
                .all(|e| e.reason == "too many connections (at most 4 at once)")
        );
        assert_eq!(flooded.proxy.counts(), (0, 196));
    }

    #[tokio::test]
    async fn a_silent_tunnel_is_closed_after_the_idle_timeout() {
        let echo = echo_server().await;
        let lim = ProxyLimits {
            idle_timeout: Duration::from_millis(300),
            ..limits()
        };
        let p = TestProxy::start(&[], &["127.0.0.1/32"], lim, no_names());
        let target = format!("127.0.0.1:{}", echo.port());
        // Traffic keeps a tunnel open past the timeout...
        let (mut busy, _) = p.connect(&target).await;
        for _ in 0..6 {
            busy.write_all(b"k").await.unwrap();
            let mut k = [0u8; 1];
            busy.read_exact(&mut k).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // ...silence closes it.
        let (mut silent, _) = p.connect(&target).await;
        let started = tokio::time::Instant::now();
        assert_eq!(read_to_end(&mut silent).await, "");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
        assert_eq!(
            read_to_end(&mut busy).await,
            "",
            "the busy one idles out too once quiet"
        );
        let log = p.log(2).await;
        assert!(
            log.iter().all(|e| e.reason.ends_with("closed: idle for 300ms")),
            "{log:?}"
        );
        assert!(log.iter().any(|e| e.bytes_up == 6 && e.bytes_down == 6));
    }

    #[tokio::test]
    async fn a_request_head_not_sent_in_time_is_408() {
        let lim = ProxyLimits {
            idle_timeout: Duration::from_millis(200),
            ..limits()
        };
        let p = TestProxy::start(&["*.example.com"], &[], lim, no_names());
        let answer = p.request(b"GET http://a.example.com/ HTTP/1.1\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        // A connection that never says anything leaves no entry.
        let mut mute = TcpStream::connect(p.addr).await.unwrap();
        assert_eq!(read_to_end(&mut mute).await, "");
        assert_eq!(p.proxy.log().len(), 1);
    }

    #[tokio::test]
    async fn the_byte_limit_closes_the_tunnel_and_denies_new_requests() {
        let echo = echo_server().await;
        let lim = ProxyLimits {
            max_bytes: 10_000,
            ..limits()
        };
        let p = TestProxy::start(&[], &["127.0.0.1/32"], lim, no_names());
        let target = format!("127.0.0.1:{}", echo.port());
        let (mut c, _) = p.connect(&target).await;
        let chunk = [7u8; 4000];
        c.write_all(&chunk).await.unwrap();
        let mut back = [0u8; 4000];
        c.read_exact(&mut back).await.unwrap();
        // 8000 used; 4000 more would pass the limit: the tunnel closes instead.
        c.write_all(&chunk).await.unwrap();
        assert_eq!(read_to_end(&mut c).await, "");
        let e = &p.log(1).await[0];
        assert!(
            e.reason
                .ends_with("closed: byte limit reached (10000 bytes per sandbox)"),
            "{e:?}"
        );
        assert_eq!((e.bytes_up, e.bytes_down), (4000, 4000));
        let (_, head) = p.connect(&target).await;
        assert!(head.starts_with("HTTP/1.1 403"), "{head}");
        let e = &p.log(2).await[1];
        assert_eq!(
            (e.allowed, e.reason.as_str()),
            (false, "byte limit reached (10000 bytes per sandbox)")
        );
    }

    #[tokio::test]
    async fn an_upstream_that_refuses_is_a_502() {
        let port = closed_port();
        let p = TestProxy::start(&[], &["127.0.0.1/32"], limits(), no_names());
        let answer = p
            .request(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .await;
        assert!(answer.starts_with("HTTP/1.1 502 Bad Gateway"), "{answer}");
        assert!(
            body(&answer).starts_with(&format!("connect to 127.0.0.1:{port} failed")),
            "{answer}"
        );
        let e = &p.log(1).await[0];
        assert!(e.allowed, "the policy allowed it; the upstream failed");
        assert_eq!(e.addr.as_deref(), Some("127.0.0.1"));
        assert!(
            e.reason
                .starts_with("allowed by allow_cidrs 127.0.0.1/32; connect to"),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn an_upstream_that_never_answers_is_a_504_after_the_connect_timeout() {
        // A listener whose accept queue is full drops further SYNs: connects hang.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(1).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut fillers = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await {
                Ok(Ok(s)) => fillers.push(s),
                Ok(Err(e)) => panic!("{e}"),
                Err(_) => break,
            }
            assert!(fillers.len() < 64, "the accept queue never filled");
        }
        let lim = ProxyLimits {
            connect_timeout: Duration::from_millis(300),
            ..limits()
        };
        let p = TestProxy::start(&[], &["127.0.0.1/32"], lim, no_names());
        let answer = p
            .request(format!("CONNECT {addr} HTTP/1.1\r\n\r\n").as_bytes())
            .await;
        assert!(answer.starts_with("HTTP/1.1 504 Gateway Timeout"), "{answer}");
        assert_eq!(
            body(&answer),
            format!("connect to {addr} timed out after 300ms\n")
        );
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_denied() {
        let p = TestProxy::start(&["*.test"], &[], limits(), no_names());
        let answer = p.request(b"GET http://nowhere.test/ HTTP/1.1\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        assert_eq!(
            body(&answer),
            "cannot resolve nowhere.test: no such host nowhere.test\n"
        );
    }

    #[tokio::test]
    async fn the_log_is_capped_and_says_how_much_it_dropped() {
        let lim = ProxyLimits {
            max_log_entries: 3,
            ..limits()
        };
        let p = TestProxy::start(&[], &[], lim, no_names());
        for _ in 0..5 {
            p.request(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n").await;
        }
        let log = p.log(4).await;
        assert_eq!(log.len(), 4);
        assert_eq!(log[3].reason, "2 more entries not logged (the log keeps 3)");
        assert_eq!(p.proxy.dropped_log_entries(), 2);
        assert_eq!(p.proxy.counts(), (0, 5));
    }

    #[tokio::test]
    async fn stopping_closes_open_tunnels_and_logs_them() {
        let echo = echo_server().await;
        let mut p = TestProxy::start(&[], &["127.0.0.1/32"], limits(), no_names());
        let (mut c, head) = p.connect(&format!("127.0.0.1:{}", echo.port())).await;
        assert!(head.starts_with("HTTP/1.1 200"));
        c.write_all(b"abc").await.unwrap();
        let mut abc = [0u8; 3];
        c.read_exact(&mut abc).await.unwrap();
        p.stop().await;
        let log = p.proxy.log();
        assert_eq!(log.len(), 1, "complete as soon as serve returns");
        assert_eq!(
            log[0].reason,
            "allowed by allow_cidrs 127.0.0.1/32; closed: proxy stopped"
        );
        assert_eq!((log[0].bytes_up, log[0].bytes_down), (3, 3));
        assert_eq!(read_to_end(&mut c).await, "");
        assert!(
            TcpStream::connect(p.addr).await.is_err(),
            "the listener is closed"
        );
    }

    #[tokio::test]
    async fn try_serve_returns_ok_once_stopped() {
        let proxy = Proxy::new(Policy::default(), limits(), no_names());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(Arc::clone(&proxy).try_serve(listener, async {
            let _ = stopped.await;
        }));
        stop.send(()).unwrap();
        tokio::time::timeout(WAIT, server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_handed_over_stream_is_served_and_logged_like_an_accepted_one() {
        let echo = echo_server().await;
        let policy = Policy::new(&[], &strings(&["127.0.0.1/32"])).unwrap();
        let proxy = Proxy::new(policy, limits(), no_names());
        // Allowed: a tunnel to the echo server through an in-memory stream.
        let (mut c, s) = tokio::io::duplex(4096);
        let served = tokio::spawn(Arc::clone(&proxy).serve_stream(s, std::future::pending()));
        let target = format!("127.0.0.1:{}", echo.port());
        c.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut head = [0u8; 12];
        c.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        drop(c);
        tokio::time::timeout(WAIT, served).await.unwrap().unwrap();
        // Denied: the metadata address, answered 403 with the reason.
        let (mut c, s) = tokio::io::duplex(4096);
        let served = tokio::spawn(Arc::clone(&proxy).serve_stream(s, std::future::pending()));
        c.write_all(b"CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        assert!(
            answer.ends_with("link-local address 169.254.169.254\n"),
            "{answer}"
        );
        tokio::time::timeout(WAIT, served).await.unwrap().unwrap();
        let log = proxy.log();
        assert_eq!(log.len(), 2);
        assert!(log[0].allowed && !log[1].allowed);
        assert_eq!(proxy.active_connections(), 0);
    }
}
