//! Secrets in the proxy: plain-HTTP heads rewritten, and the TLS interception of the
//! connections to hosts that carry a secret: TLS terminated with a leaf of the proxy's
//! CA, a verified TLS connection upstream, HTTP/1.1 requests relayed one head at a time
//! (each rewritten by [`crate::Secrets`]), responses relayed by their framing.

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};

use airlock_spec::EgressEntry;
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::timeout;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::{Conn, Proxy, RESPOND_TIMEOUT, UPSTREAM_BUFFER, status_text, upstream_head};
use crate::addr::format_ip;
use crate::mitm::server_name;
use crate::policy::{Target, parse_host};
use crate::relay::{Activity, HeadRead, Meter, forward_body, pump, read_head};
use crate::request::{
    Authority, Body, HttpRequest, MAX_HEAD_BYTES, MAX_HEADERS, MAX_RESPONSE_HEADERS, body_framing,
    parse_authority, same_place,
};

/// Requests sent upstream whose responses have not been relayed yet, at most.
const MAX_IN_FLIGHT: usize = 32;

/// The buffer under the upstream's TLS (the program's side has the CONNECT head's).
const TLS_READ_BUFFER: usize = 64 * 1024;

/// The most interim (1xx) responses before a final one.
const MAX_INTERIM: usize = 8;

/// A read half and a write half as one stream (the program's connection, with the bytes
/// already buffered after its CONNECT head read first).
pub(crate) struct Duplex<R, W> {
    pub r: R,
    pub w: W,
}

impl<R: AsyncRead + Unpin, W: Unpin> AsyncRead for Duplex<R, W> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.r).poll_read(cx, buf)
    }
}

impl<R: Unpin, W: AsyncWrite + Unpin> AsyncWrite for Duplex<R, W> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.w).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.w).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.w).poll_shutdown(cx)
    }
}

/// What the response side does next, in request order.
enum Pending {
    /// Relay the response to a request; `upgrade` hears whether it switched protocols.
    Response {
        head_request: bool,
        upgrade: Option<oneshot::Sender<bool>>,
    },
    /// Answer the program this refusal (after the responses before it) and close.
    Refuse { status: u16, reason: String },
}

/// A request head inside an intercepted connection, checked and rewritten.
struct Inspected {
    head: Vec<u8>,
    body: Body,
    head_request: bool,
    /// `Upgrade` or `CONNECT`: after a 101 (a 2xx to CONNECT) bytes are copied blindly.
    upgrade: bool,
}

/// A refused request inside an intercepted connection.
struct Refusal {
    status: u16,
    reason: String,
}

impl Proxy {
    /// The sandbox's environment for its secrets: `(NAME, placeholder)` each. Empty
    /// without secrets.
    pub fn secret_env(&self) -> Vec<(String, String)> {
        self.mitm.as_ref().map(|m| m.secrets.env()).unwrap_or_default()
    }

    /// The PEM certificate of this proxy's CA, which the sandbox must trust; `None`
    /// without secrets (then nothing is intercepted).
    pub fn ca_pem(&self) -> Option<String> {
        self.mitm.as_ref().map(|m| m.ca_pem().to_string())
    }

    /// The sandbox's CA bundle (PEM): the roots upstreams are verified against, then this
    /// proxy's CA. `None` without secrets.
    pub fn ca_bundle_pem(&self) -> Option<String> {
        self.mitm.as_ref().map(crate::mitm::Mitm::bundle_pem)
    }

    /// Whether a connection to `host:port` is intercepted (a secret names it).
    pub fn intercepts(&self, host: &str, port: u16) -> bool {
        self.mitm.as_ref().is_some_and(|m| m.secrets.carries(host, port))
    }

    /// The head sent upstream for a plain-HTTP request, with secrets put in; `Err` with
    /// the reason when it carries a placeholder its host may not get.
    pub(super) fn http_head(&self, req: &HttpRequest) -> Result<Vec<u8>, String> {
        let head = upstream_head(req);
        let Some(mitm) = &self.mitm else {
            return Ok(head);
        };
        match mitm
            .secrets
            .rewrite(&head, &req.authority.host, req.authority.port, true)
        {
            Ok(Some(rewritten)) => Ok(rewritten),
            Ok(None) => Ok(head),
            Err(blocked) => Err(blocked.reason),
        }
    }

    /// Serves a connection to `host:port` (judged and allowed; `upstream` connected to
    /// the checked address) by TLS interception: the program's TLS is terminated with a
    /// leaf for `host`, the upstream's is verified as `host`, and requests are relayed
    /// with secrets put in. Bytes are counted in `conn` (plaintext both ways). Returns
    /// the note for the log entry: `TLS intercepted for secret NAME`, and how it ended
    /// when noteworthy. Requests refused inside get their own denied entries. Callable
    /// for any stream: a CONNECT's, or a transparently redirected connection's.
    pub(crate) async fn intercept<S>(
        &self,
        client: S,
        host: &str,
        port: u16,
        upstream: TcpStream,
        conn: &Conn,
        activity: &Activity,
    ) -> Option<String>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mitm = self.mitm.as_ref()?;
        let mut note = format!(
            "TLS intercepted for secret {}",
            mitm.secrets.carried_by(host, port).join(", ")
        );
        let target = match parse_host(host) {
            Ok(t) => t,
            Err(why) => return Some(format!("{note}; closed: bad host: {why}")),
        };
        let setup = mitm
            .server_config(&target)
            .and_then(|server| Ok((server, server_name(&target)?)));
        let (server, name) = match setup {
            Ok(setup) => setup,
            Err(e) => return Some(format!("{note}; closed: {e}")),
        };
        // Both handshakes at once: the program's with our leaf, ours with the upstream.
        let accept = timeout(self.limits.idle_timeout, TlsAcceptor::from(server).accept(client));
        let connect = timeout(
            self.limits.connect_timeout,
            // rustls reads 4 KiB at a time: buffered, that is not a syscall each.
            TlsConnector::from(mitm.client_config())
                .connect(name, BufReader::with_capacity(TLS_READ_BUFFER, upstream)),
        );
        let (accepted, connected) = tokio::join!(accept, connect);
        let mut client = match accepted {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                let hint = if e.to_string().contains("alert") {
                    " (does it trust the sandbox's CA?)"
                } else {
                    ""
                };
                return Some(format!(
                    "{note}; closed: TLS handshake with the program failed: {e}{hint}"
                ));
            }
            Err(_) => {
                return Some(format!(
                    "{note}; closed: no TLS handshake from the program in time"
                ));
            }
        };
        let upstream = match connected {
            Ok(Ok(u)) => u,
            failed => {
                let why = match failed {
                    Ok(Err(e)) => format!("TLS to {} failed: {e}", target_shown(&target, port)),
                    _ => format!(
                        "TLS to {} timed out after {:?}",
                        target_shown(&target, port),
                        self.limits.connect_timeout
                    ),
                };
                answer(&mut client, 502, &why).await;
                return Some(format!("{note}; closed: {why}"));
            }
        };
        activity.touch();
        let authority = Authority {
            host: host.to_string(),
            port,
            port_written: true,
        };
        if let Some(end) = self
            .relay_requests(client, upstream, &authority, conn, activity)
            .await
        {
            note = format!("{note}; {end}");
        }
        Some(note)
    }

    /// Relays HTTP/1.1 exchanges between the two TLS streams until either side is done.
    async fn relay_requests<C, U>(
        &self,
        client: C,
        upstream: U,
        authority: &Authority,
        conn: &Conn,
        activity: &Activity,
    ) -> Option<String>
    where
        C: AsyncRead + AsyncWrite + Unpin,
        U: AsyncRead + AsyncWrite + Unpin,
    {
        let (cr, mut cw) = tokio::io::split(client);
        let (ur, mut uw) = tokio::io::split(upstream);
        // Large on both sides: bodies move in big TLS writes (16 KiB ones halved uploads).
        let mut cr = BufReader::with_capacity(UPSTREAM_BUFFER, cr);
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
        let (tx, rx) = mpsc::channel(MAX_IN_FLIGHT);
        let requests = self.requests(&mut cr, &mut uw, tx, authority, conn, up);
        let responses = self.responses(&mut ur, &mut cw, rx, authority, down);
        let mut requests = std::pin::pin!(requests);
        let mut responses = std::pin::pin!(responses);
        let relay = async {
            tokio::select! {
                res = &mut responses => res,
                res = &mut requests => match res {
                    // The program is done sending: the responses still owed go out.
                    Ok(()) => responses.await,
                    Err(e) => Err(e),
                },
            }
        };
        tokio::select! {
            res = relay => match res {
                Ok(end) => end,
                Err(e) => Some(self.error_note(&e)),
            },
            () = activity.idle(self.limits.idle_timeout) => Some(self.idle_note()),
        }
    }

    /// The request direction: head by head, each checked and rewritten, bodies relayed
    /// by their framing. Ends when the program stops sending, after a refusal, or (after
    /// a protocol switch) when the blind copy ends.
    async fn requests<R, W>(
        &self,
        r: &mut R,
        w: &mut W,
        tx: mpsc::Sender<Pending>,
        authority: &Authority,
        conn: &Conn,
        m: Meter<'_>,
    ) -> io::Result<()>
    where
        R: AsyncBufRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut head = Vec::new();
        loop {
            let read = match read_head(r, &mut head, MAX_HEAD_BYTES).await {
                // Between requests, a program closing without TLS close_notify is done
                // (most do); inside a message it is an error.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && head.is_empty() => return Ok(()),
                read => read?,
            };
            let inspected = match read {
                HeadRead::Eof if head.is_empty() => return Ok(()),
                HeadRead::Eof => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "request head cut short",
                    ));
                }
                HeadRead::TooLarge => Err(Refusal {
                    status: 431,
                    reason: format!("request head larger than {} KiB", MAX_HEAD_BYTES / 1024),
                }),
                HeadRead::Complete => self.inspect(&head, authority),
            };
            let req = match inspected {
                Ok(req) => req,
                Err(refusal) => {
                    self.log_refusal(conn, authority, &refusal.reason);
                    let _ = tx
                        .send(Pending::Refuse {
                            status: refusal.status,
                            reason: refusal.reason,
                        })
                        .await;
                    return Ok(());
                }
            };
            m.activity.touch();
            let (upgrade_tx, upgrade_rx) = if req.upgrade {
                let (t, r) = oneshot::channel();
                (Some(t), Some(r))
            } else {
                (None, None)
            };
            // Queued before the head goes out: a response may come before the body ends.
            let pending = Pending::Response {
                head_request: req.head_request,
                upgrade: upgrade_tx,
            };
            if tx.send(pending).await.is_err() {
                return Ok(());
            }
            m.write(w, &req.head).await?;
            forward_body(r, w, req.body, m).await?;
            w.flush().await?;
            if let Some(switched) = upgrade_rx
                && switched.await == Ok(true)
            {
                drop(tx);
                return pump(r, w, m).await;
            }
        }
    }

    /// Checks one request head of an intercepted connection and puts secrets in.
    fn inspect(&self, head: &[u8], authority: &Authority) -> Result<Inspected, Refusal> {
        let bad = |reason: String| Refusal { status: 400, reason };
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(head) {
            Ok(httparse::Status::Complete(n)) if n == head.len() => {}
            Ok(_) => return Err(bad("malformed request: incomplete head".into())),
            Err(e) => return Err(bad(format!("malformed request: {e}"))),
        }
        let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
            return Err(bad("malformed request".into()));
        };
        if !(target.starts_with('/') || target == "*") {
            return Err(bad(format!(
                "request target {target:?} inside a TLS connection to {}: only origin-form (/path)",
                authority.host
            )));
        }
        // The Host must be the host the connection was judged, verified and intercepted
        // for: a value must not reach another virtual host behind the same server.
        let mut hosts = req.headers.iter().filter(|h| h.name.eq_ignore_ascii_case("host"));
        if let Some(h) = hosts.next() {
            if hosts.next().is_some() {
                return Err(bad("more than one Host header".into()));
            }
            let value = String::from_utf8_lossy(h.value);
            let same = parse_authority(&value, Some(authority.port))
                .ok()
                .is_some_and(|host| same_place(&host, authority, false));
            if !same {
                return Err(bad(format!(
                    "Host header {value:?} disagrees with the connection's host {}:{}",
                    authority.host, authority.port
                )));
            }
        }
        let body = body_framing(req.headers, minor).map_err(bad)?;
        let upgrade =
            method == "CONNECT" || req.headers.iter().any(|h| h.name.eq_ignore_ascii_case("upgrade"));
        let head_request = method == "HEAD";
        let mitm = self.mitm.as_ref().ok_or_else(|| bad("no secrets".into()))?;
        let head = match mitm.secrets.rewrite(head, &authority.host, authority.port, false) {
            Ok(Some(rewritten)) => rewritten,
            Ok(None) => head.to_vec(),
            Err(blocked) => {
                return Err(Refusal {
                    status: 403,
                    reason: blocked.reason,
                });
            }
        };
        Ok(Inspected {
            head,
            body,
            head_request,
            upgrade,
        })
    }

    /// A request refused inside an allowed connection: its own denied entry.
    fn log_refusal(&self, conn: &Conn, authority: &Authority, reason: &str) {
        self.denied.fetch_add(1, Relaxed);
        self.push(EgressEntry {
            kind: conn.kind,
            host: authority.host.clone(),
            port: authority.port,
            addr: conn.addr.map(|a| format_ip(&a)),
            allowed: false,
            reason: reason.to_string(),
            bytes_up: 0,
            bytes_down: 0,
            ms: conn.start.elapsed().as_secs_f64() * 1000.0,
        });
    }
}

impl Proxy {
    /// The response direction: per pending request, interim heads, then the final head and
    /// its body by its framing, verbatim but for secret values in heads (put back to their
    /// placeholders). Returns a note when it ended noteworthily.
    async fn responses<R, W>(
        &self,
        r: &mut R,
        w: &mut W,
        mut rx: mpsc::Receiver<Pending>,
        authority: &Authority,
        m: Meter<'_>,
    ) -> io::Result<Option<String>>
    where
        R: AsyncBufRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut head = Vec::new();
        while let Some(pending) = rx.recv().await {
            let (head_request, mut upgrade) = match pending {
                Pending::Refuse { status, reason } => {
                    answer(w, status, &reason).await;
                    return Ok(Some(format!("closed after a refused request: {reason}")));
                }
                Pending::Response {
                    head_request,
                    upgrade,
                } => (head_request, upgrade),
            };
            let mut interim = 0;
            loop {
                crate::relay::read_response_head(r, &mut head).await?;
                let (code, body) = response_framing(&head, head_request)?;
                let scrubbed = self
                    .mitm
                    .as_ref()
                    .and_then(|mitm| mitm.secrets.scrub(&head, &authority.host, authority.port));
                m.write(w, scrubbed.as_deref().unwrap_or(&head)).await?;
                if (100..200).contains(&code) && code != 101 {
                    interim += 1;
                    if interim > MAX_INTERIM {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "too many interim responses",
                        ));
                    }
                    w.flush().await?;
                    continue;
                }
                let switched =
                    code == 101 || (upgrade.is_some() && (200..300).contains(&code) && body == Body::None);
                if let Some(tell) = upgrade.take() {
                    let _ = tell.send(switched);
                }
                if switched {
                    w.flush().await?;
                    pump(r, w, m).await?;
                    return Ok(None);
                }
                match forward_body(r, w, body, m).await {
                    // A body delimited by the close: servers often skip TLS close_notify.
                    Err(e) if body == Body::UntilClose && e.kind() == io::ErrorKind::UnexpectedEof => {}
                    res => res?,
                }
                w.flush().await?;
                if body == Body::UntilClose {
                    let _ = w.shutdown().await;
                    return Ok(None);
                }
                break;
            }
        }
        let _ = w.shutdown().await;
        Ok(None)
    }
}

/// A response head's status and body framing.
fn response_framing(head: &[u8], head_request: bool) -> io::Result<(u16, Body)> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let mut headers = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(head) {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        Ok(_) => return Err(invalid("malformed response head".into())),
        Err(e) => return Err(invalid(format!("malformed response head: {e}"))),
    }
    let code = resp
        .code
        .ok_or_else(|| invalid("malformed response head".into()))?;
    if (100..200).contains(&code) || code == 204 || code == 304 || head_request {
        return Ok((code, Body::None));
    }
    let mut length: Option<u64> = None;
    let mut coded = false;
    let mut chunked = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            coded = true;
            let value = String::from_utf8_lossy(h.value).to_ascii_lowercase();
            chunked = value.rsplit(',').next().is_some_and(|c| c.trim() == "chunked");
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let value = String::from_utf8_lossy(h.value);
            for part in value.split(',') {
                let n: u64 = part
                    .trim()
                    .parse()
                    .map_err(|_| invalid(format!("invalid Content-Length {value:?} in the response")))?;
                match length {
                    Some(m) if m != n => {
                        return Err(invalid("Content-Length values differ in the response".into()));
                    }
                    _ => length = Some(n),
                }
            }
        }
    }
    Ok((
        code,
        match (coded, chunked, length) {
            (true, true, _) => Body::Chunked,
            (true, false, _) => Body::UntilClose,
            (false, _, Some(n)) => Body::Length(n),
            (false, _, None) => Body::UntilClose,
        },
    ))
}

/// `host:port` as shown in reasons.
fn target_shown(target: &Target, port: u16) -> String {
    match target {
        Target::Name(n) => format!("{n}:{port}"),
        Target::Addr(a @ std::net::IpAddr::V6(_)) => format!("[{}]:{port}", format_ip(a)),
        Target::Addr(a) => format!("{}:{port}", format_ip(a)),
    }
}

/// Answers the program inside the intercepted connection, then closes it.
async fn answer<W: AsyncWrite + Unpin>(w: &mut W, status: u16, reason: &str) {
    let body = format!("{reason}\n");
    let response = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        status_text(status),
        body.len()
    );
    let _ = timeout(RESPOND_TIMEOUT, async {
        w.write_all(response.as_bytes()).await?;
        w.flush().await?;
        w.shutdown().await
    })
    .await;
}

#[cfg(test)]
mod tests;
