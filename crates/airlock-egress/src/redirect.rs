//! Connections the program made directly (ignoring the proxy variables), redirected to
//! the proxy by the sandbox's own network namespace: the proxy learns where each was
//! going (`SO_ORIGINAL_DST`, or a relay that read it inside a VM), reads the name from
//! the first bytes (a TLS ClientHello's SNI, an HTTP request's `Host`), else from this
//! sandbox's resolver's answers, and judges it by the same policy as a proxy request.
//!
//! A name, once known, is what the proxy connects to (its own resolution, checked by the
//! SSRF guard), never the address the program chose: a ClientHello naming an allowed host
//! sent to some other address reaches the allowed host, or nothing.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, BufReader};
use tokio::time::{Instant, timeout, timeout_at};

use crate::addr::format_ip;
use crate::proxy::{Client, Conn, Proxy, respond};
use crate::relay::{Activity, Meter};
use crate::request::MAX_HEAD_BYTES;

/// How long the proxy waits for a redirected connection's first bytes before judging
/// it without a name from them (a protocol whose server speaks first).
const FIRST_BYTES: Duration = Duration::from_millis(300);

/// A TLS record is at most this long (plus its 5-byte header): a ClientHello bigger than
/// one record is judged without its SNI.
const MAX_HELLO: usize = 5 + (1 << 14);

/// What the first bytes of a redirected connection say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sniffed {
    /// A TLS ClientHello, with its server name if it gave one.
    Tls(Option<String>),
    /// An HTTP/1 request head, with its `Host` (without a port).
    Http(Option<String>),
    /// Anything else, or nothing in time.
    Other,
}

impl Sniffed {
    fn name(&self) -> Option<&str> {
        match self {
            Sniffed::Tls(n) | Sniffed::Http(n) => n.as_deref(),
            Sniffed::Other => None,
        }
    }
}

/// The destination a redirected connection had before the sandbox's rules sent it to
/// the proxy's transparent port.
pub fn original_destination<F: AsFd>(socket: &F) -> io::Result<SocketAddr> {
    use nix::sys::socket::{SockaddrLike, getsockopt, sockopt};
    if let Ok(v4) = getsockopt(socket, sockopt::OriginalDst) {
        let addr = nix::sys::socket::SockaddrIn::from(v4);
        return Ok(SocketAddr::V4(addr.into()));
    }
    let v6 = getsockopt(socket, sockopt::Ip6tOriginalDst).map_err(io::Error::from)?;
    // SAFETY: `v6` is a sockaddr_in6 the kernel filled in, of exactly that size.
    let addr = unsafe {
        nix::sys::socket::SockaddrIn6::from_raw(
            std::ptr::from_ref(&v6).cast(),
            Some(std::mem::size_of_val(&v6) as u32),
        )
    }
    .ok_or_else(|| io::Error::other("the original IPv6 destination is malformed"))?;
    Ok(SocketAddr::V6(addr.into()))
}

impl Proxy {
    /// Accepts redirected connections on `listener` (the transparent port the sandbox's
    /// rules send every outbound TCP connection to) until `stop` resolves, serving each
    /// by its original destination. Like [`Proxy::serve`] otherwise: the same limits,
    /// the same log, open connections closed on `stop`.
    pub async fn serve_transparent(
        self: Arc<Self>,
        listener: std::net::TcpListener,
        stop: impl Future<Output = ()> + Send,
    ) {
        if let Err(e) = self.accept_loop(listener, stop, true).await {
            tracing::error!(error = %e, "the egress proxy cannot serve its transparent listener");
        }
    }

    /// Serves one redirected connection whose original destination `dst` the caller
    /// read (a relay from a VM or a user-space kernel), as [`Proxy::serve_transparent`]
    /// serves each it accepts. Returns when it has ended and is logged.
    pub async fn serve_redirected<S>(
        self: Arc<Self>,
        stream: S,
        dst: SocketAddr,
        stop: impl Future<Output = ()> + Send,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.serve_one(Box::new(stream), Some(dst), stop).await;
    }

    /// One redirected connection: sniff, decide, connect, relay.
    pub(crate) async fn serve_redirected_conn(
        &self,
        stream: &mut Client,
        dst: SocketAddr,
        conn: &mut Conn,
        activity: &Activity,
    ) {
        // Read straight from the stream (no buffer may hold bytes beyond `early`, which
        // go first to wherever the connection goes).
        let mut early = Vec::new();
        let sniffed = sniff(stream, &mut early, self.limits().idle_timeout).await;
        let known = self.names_for(dst.ip());
        let host = match (sniffed.name(), &known) {
            (Some(name), _) => name.to_owned(),
            (None, Some((name, _))) => name.clone(),
            (None, None) => format_ip(&dst.ip()),
        };
        conn.set_target(&host, dst.port());
        // The address the program dialled may be used as is only when this sandbox's
        // resolver gave it for this very name (and not as a stand-in for approval).
        let hint = match &known {
            Some((name, false)) if name.eq_ignore_ascii_case(&host) => Some(dst.ip()),
            _ => None,
        };
        let (r, mut w) = tokio::io::split(&mut *stream);
        let mut r = BufReader::with_capacity(crate::proxy::CLIENT_BUFFER, r);
        if self.budget_exhausted() {
            let reason = self.byte_limit_reason();
            self.deny(conn, reason.clone(), None);
            self.finish(conn);
            if matches!(sniffed, Sniffed::Http(_)) {
                respond(&mut r, &mut w, 403, &reason).await;
            }
            return;
        }
        let addrs = match self.decide_known(&host, dst.port(), hint).await {
            Ok((addrs, reason)) => {
                self.allow(conn, reason);
                addrs
            }
            Err(denied) => {
                self.deny(conn, denied.reason.clone(), denied.addr);
                self.finish(conn);
                if matches!(sniffed, Sniffed::Http(_)) {
                    respond(&mut r, &mut w, 403, &denied.reason).await;
                }
                return;
            }
        };
        let mut upstream = match self.connect(&addrs, dst.port()).await {
            Ok((upstream, addr)) => {
                conn.set_addr(addr);
                upstream
            }
            Err(failure) => {
                conn.set_failure(failure.addr, &failure.reason);
                self.finish(conn);
                if matches!(sniffed, Sniffed::Http(_)) {
                    respond(&mut r, &mut w, failure.status, &failure.reason).await;
                }
                return;
            }
        };
        let _ = upstream.set_nodelay(true);
        activity.touch();
        if matches!(sniffed, Sniffed::Tls(Some(_))) && self.intercepts(&host, dst.port()) {
            // A host a secret names: TLS ends here, with the ClientHello replayed.
            drop(r);
            let client = Replay {
                prefix: early,
                at: 0,
                inner: stream,
            };
            let note = self
                .intercept(client, &host, dst.port(), upstream, conn, activity)
                .await;
            if let Some(note) = note {
                conn.note(&note);
            }
            self.finish(conn);
            return;
        }
        // What the program sent while it was judged goes first.
        let sent = {
            let up = Meter {
                bytes: conn.up(),
                budget: self.budget(),
                activity,
            };
            up.write(&mut upstream, &early).await
        };
        let note = match sent {
            Ok(()) => self.tunnel(&mut r, &mut w, &mut upstream, conn, activity).await,
            Err(e) => Some(format!("closed: {e}")),
        };
        if let Some(note) = note {
            conn.note(&note);
        }
        self.finish(conn);
    }

    /// The name this sandbox's resolver answered with `addr`, and whether the address
    /// was a stand-in (a name held for approval).
    fn names_for(&self, addr: IpAddr) -> Option<(String, bool)> {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).lookup(addr)
    }
}

/// A client stream whose first bytes were read already: they are read again first.
struct Replay<'a> {
    prefix: Vec<u8>,
    at: usize,
    inner: &'a mut Client,
}

impl AsyncRead for Replay<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut *self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Replay<'_> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut *self.inner).poll_write(cx, data)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut *self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}

/// Reads the first bytes of a redirected connection into `early`, as far as needed to
/// tell its protocol and name.
pub(crate) async fn sniff<R: AsyncRead + Unpin>(r: &mut R, early: &mut Vec<u8>, limit: Duration) -> Sniffed {
    let mut buf = [0u8; 4096];
    match timeout(FIRST_BYTES, r.read(&mut buf)).await {
        Ok(Ok(n @ 1..)) => early.extend_from_slice(&buf[..n]),
        _ => return Sniffed::Other,
    }
    let deadline = Instant::now() + limit.min(Duration::from_secs(10));
    loop {
        match classify(early) {
            Some(s) => return s,
            None if early.len() >= MAX_HEAD_BYTES.max(MAX_HELLO) => return Sniffed::Other,
            None => {}
        }
        match timeout_at(deadline, r.read(&mut buf)).await {
            Ok(Ok(n @ 1..)) => early.extend_from_slice(&buf[..n]),
            // Ended or silent before the hello or head was whole: judge what there is.
            _ => {
                return match early.first() {
                    Some(0x16) => Sniffed::Tls(None),
                    _ if looks_like_http(early) => Sniffed::Http(None),
                    _ => Sniffed::Other,
                };
            }
        }
    }
}

/// `Some` once `early` says enough; `None` when more bytes are needed.
fn classify(early: &[u8]) -> Option<Sniffed> {
    if early.first() == Some(&0x16) {
        return client_hello_sni(early).map(Sniffed::Tls);
    }
    if looks_like_http(early) {
        let end = crate::relay::find(early, b"\r\n\r\n")?;
        return Some(Sniffed::Http(http_host(&early[..end + 4])));
    }
    Some(Sniffed::Other)
}

/// An HTTP/1 request line starts with an upper-case method and a space.
fn looks_like_http(early: &[u8]) -> bool {
    let method_len = early.iter().take_while(|b| b.is_ascii_uppercase()).count();
    (1..=10).contains(&method_len) && early.get(method_len).is_none_or(|&b| b == b' ')
}

/// The `Host` of a complete request head, without its port.
fn http_host(head: &[u8]) -> Option<String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    req.parse(head).ok()?;
    let host = req.headers.iter().find(|h| h.name.eq_ignore_ascii_case("host"))?;
    let host = std::str::from_utf8(host.value).ok()?.trim();
    let host = if let Some(v6) = host.strip_prefix('[') {
        &host[..=v6.find(']')? + 1]
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    (!host.is_empty()).then(|| host.to_owned())
}

/// The server name of a ClientHello at the start of `buf`: `None` when more bytes are
/// needed, `Some(None)` when it is whole (or malformed) but names no server.
fn client_hello_sni(buf: &[u8]) -> Option<Option<String>> {
    if buf.len() < 5 {
        return None;
    }
    let record_len = u16::from_be_bytes([buf[3], buf[4]]) as usize;
    if buf.len() < 5 + record_len {
        return if 5 + record_len > MAX_HELLO {
            Some(None)
        } else {
            None
        };
    }
    Some(parse_sni(&buf[5..5 + record_len]))
}

/// Reads the SNI extension of a handshake message holding a ClientHello; `None` on
/// anything unexpected (it is then judged by its address).
fn parse_sni(msg: &[u8]) -> Option<String> {
    let mut c = Cursor(msg);
    if c.u8()? != 1 {
        return None; // not a ClientHello
    }
    let len = c.u24()?;
    let mut c = Cursor(c.take(len)?);
    c.take(2 + 32)?; // version, random
    let sid = c.u8()? as usize;
    c.take(sid)?;
    let suites = c.u16()? as usize;
    c.take(suites)?;
    let comp = c.u8()? as usize;
    c.take(comp)?;
    let ext_len = c.u16()? as usize;
    let mut exts = Cursor(c.take(ext_len)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let len = exts.u16()? as usize;
        let body = exts.take(len)?;
        if kind != 0 {
            continue;
        }
        let mut list = Cursor(body);
        let list_len = list.u16()? as usize;
        let mut list = Cursor(list.take(list_len)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let len = list.u16()? as usize;
            let name = list.take(len)?;
            if name_type == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return (!name.is_empty()).then(|| name.to_owned());
            }
        }
        return None;
    }
    None
}

/// A bounds-checked reader over a byte slice.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as rustls writes it, for `name`.
    fn hello(name: &str) -> Vec<u8> {
        let mut ext = Vec::new();
        let entry_len = 3 + name.len();
        ext.extend_from_slice(&0u16.to_be_bytes());
        ext.extend_from_slice(&((entry_len + 2) as u16).to_be_bytes());
        ext.extend_from_slice(&(entry_len as u16).to_be_bytes());
        ext.push(0);
        ext.extend_from_slice(&(name.len() as u16).to_be_bytes());
        ext.extend_from_slice(name.as_bytes());
        // another extension after it
        ext.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[7u8; 32]);
        body.push(0);
        body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]);
        body.extend_from_slice(&[0x01, 0x00]);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut msg = vec![1];
        msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend_from_slice(&body);
        let mut rec = vec![0x16, 0x03, 0x01];
        rec.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        rec.extend_from_slice(&msg);
        rec
    }

    #[test]
    fn the_server_name_is_read_from_a_whole_client_hello_only() {
        let h = hello("api.example.com");
        assert_eq!(classify(&h), Some(Sniffed::Tls(Some("api.example.com".into()))));
        for cut in [1, 5, 20, h.len() - 1] {
            assert_eq!(classify(&h[..cut]), None, "{cut} bytes");
        }
        let mut broken = h.clone();
        broken[5] = 2; // not a ClientHello
        assert_eq!(classify(&broken), Some(Sniffed::Tls(None)));
    }

    #[test]
    fn an_http_head_gives_its_host_without_the_port() {
        assert_eq!(
            classify(b"GET / HTTP/1.1\r\nHost: Example.com:8080\r\n\r\n"),
            Some(Sniffed::Http(Some("Example.com".into())))
        );
        assert_eq!(
            classify(b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n"),
            Some(Sniffed::Http(Some("[2001:db8::1]".into())))
        );
        assert_eq!(classify(b"GET / HTTP/1.1\r\nHost: a"), None);
        assert_eq!(classify(b"SSH-2.0-OpenSSH\r\n"), Some(Sniffed::Other));
        assert_eq!(classify(b"\x00\x01"), Some(Sniffed::Other));
    }

    mod served {
        use super::super::*;
        use super::hello;
        use crate::test_util::{WAIT, echo_server, strings};
        use crate::{Policy, ProxyLimits, StaticResolver};
        use airlock_spec::EgressKind;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        fn proxy(allow: &[&str], names: &[(&str, &str)]) -> Arc<Proxy> {
            let mut r = StaticResolver::new();
            for (n, a) in names {
                r = r.with(n, &[a.parse().unwrap()]);
            }
            let policy = Policy::new(&strings(allow), &strings(&["127.0.0.1/32"])).unwrap();
            Proxy::new(policy, ProxyLimits::default(), Arc::new(r))
        }

        /// Sends `first` on a redirected connection to `dst` and reads what comes back.
        async fn exchange(p: &Arc<Proxy>, dst: &str, first: &[u8], read: usize) -> Vec<u8> {
            let (mut ours, theirs) = tokio::io::duplex(1 << 16);
            let served = tokio::spawn(Arc::clone(p).serve_redirected(
                theirs,
                dst.parse().unwrap(),
                std::future::pending(),
            ));
            ours.write_all(first).await.unwrap();
            let mut back = vec![0u8; read];
            let got = tokio::time::timeout(WAIT, async {
                let mut n = 0;
                while n < read {
                    match ours.read(&mut back[n..]).await.unwrap() {
                        0 => break,
                        k => n += k,
                    }
                }
                n
            })
            .await
            .unwrap();
            back.truncate(got);
            drop(ours);
            tokio::time::timeout(WAIT, served).await.unwrap().unwrap();
            back
        }

        #[tokio::test]
        async fn a_direct_connection_is_known_by_its_host_header_and_sent_to_that_name() {
            let echo = echo_server().await;
            let allow = format!("echo.test:{}", echo.port());
            let p = proxy(&[&allow], &[("echo.test", "127.0.0.1")]);
            let req = b"GET / HTTP/1.1\r\nHost: echo.test\r\n\r\n";
            // The program dialled some other address: the name decides where it goes.
            let back = exchange(&p, &format!("198.51.100.1:{}", echo.port()), req, req.len()).await;
            assert_eq!(back, req);
            let log = p.log();
            assert_eq!(log.len(), 1);
            let e = &log[0];
            assert_eq!(
                (e.kind, e.host.as_str(), e.port),
                (EgressKind::Redirected, "echo.test", echo.port())
            );
            assert_eq!(e.addr.as_deref(), Some("127.0.0.1"));
            assert!(e.allowed, "{}", e.reason);
            assert_eq!(echo.connections(), 1);
        }

        #[tokio::test]
        async fn a_denied_direct_request_gets_a_403_and_a_silent_one_is_judged_by_its_address() {
            let echo = echo_server().await;
            let p = proxy(&["allowed.test"], &[]);
            let back = exchange(
                &p,
                &format!("127.0.0.1:{}", echo.port()),
                b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
                1 << 12,
            )
            .await;
            let back = String::from_utf8_lossy(&back);
            assert!(back.starts_with("HTTP/1.1 403"), "{back}");
            assert!(back.ends_with("not in allowlist\n"), "{back}");
            // No name at all: the address is the host (and 203.0.113.0/24 is special).
            let back = exchange(&p, "203.0.113.7:22", b"\x00\x01binary", 16).await;
            assert!(back.is_empty());
            let log = p.log();
            assert_eq!(log[1].host, "203.0.113.7");
            assert_eq!(log[1].reason, "documentation address 203.0.113.7");
            assert!(log.iter().all(|e| !e.allowed && e.kind == EgressKind::Redirected));
            assert_eq!(echo.connections(), 0);
        }

        #[tokio::test]
        async fn a_client_hello_naming_an_allowed_host_goes_to_that_host_only() {
            let echo = echo_server().await;
            let allow = format!("echo.test:{}", echo.port());
            let p = proxy(&[&allow], &[("echo.test", "127.0.0.1")]);
            let h = hello("echo.test");
            let back = exchange(&p, &format!("192.0.2.1:{}", echo.port()), &h, h.len()).await;
            assert_eq!(back, h, "relayed to echo.test's address, not the one dialled");
            let h = hello("other.test");
            let back = exchange(&p, &format!("127.0.0.1:{}", echo.port()), &h, 1).await;
            assert!(back.is_empty());
            let log = p.log();
            assert_eq!((log[1].host.as_str(), log[1].allowed), ("other.test", false));
            assert_eq!(echo.connections(), 1);
        }
    }
}
