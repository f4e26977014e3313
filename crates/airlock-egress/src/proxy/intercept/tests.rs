//! Secrets and TLS interception, end to end on loopback: a fake HTTPS upstream with a
//! test CA the proxy trusts, programs that trust only the proxy's CA (or only the test
//! CA, for hosts that are not intercepted).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncBufRead, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::relay::{Activity, Budget, HeadRead, Meter, forward_body, read_head};
use crate::request::Body;
use crate::test_util::{WAIT, read_to_end, strings};
use crate::{Policy, Proxy, ProxyLimits, SecretConfig, Secrets, StaticResolver, TrustRoots};

const VALUE: &str = "ghp_the-real-value-0123456789";

/// A test PKI: a root and leaves for the fake hosts.
struct TestCa {
    root_pem: String,
    params: CertificateParams,
    key: KeyPair,
}

impl TestCa {
    fn new() -> TestCa {
        TestCa::named("airlock test root")
    }

    fn named(name: &str) -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let root = params.self_signed(&key).unwrap();
        TestCa {
            root_pem: root.pem(),
            params,
            key,
        }
    }

    fn server_config(&self, names: &[&str]) -> Arc<ServerConfig> {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(strings(names)).unwrap();
        let leaf = params
            .signed_by(&key, &Issuer::from_params(&self.params, &self.key))
            .unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)
            .unwrap();
        Arc::new(config)
    }
}

/// A client config trusting only `root_pem`'s certificates.
fn client_trusting(root_pem: &str) -> TlsConnector {
    let mut store = RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(root_pem.as_bytes()) {
        let c: CertificateDer<'static> = c.unwrap();
        store.add(c).unwrap();
    }
    let mut config = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    // As browsers and HTTP/2-capable clients do: the proxy must pick HTTP/1.1.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(config))
}

/// One request as the fake upstream got it.
#[derive(Debug, Clone)]
struct Got {
    head: String,
    body_len: u64,
    /// The body, when under 1 MiB.
    body: Vec<u8>,
}

/// An HTTPS server on 127.0.0.1 speaking HTTP/1.1 keep-alive: records each request and
/// answers `200` with `got N bytes`, or with N bytes for `GET /download/N`.
struct HttpsUpstream {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    handshakes: Arc<AtomicUsize>,
    got: Arc<Mutex<Vec<Got>>>,
}

impl HttpsUpstream {
    async fn start(config: Arc<ServerConfig>) -> HttpsUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let handshakes = Arc::new(AtomicUsize::new(0));
        let got = Arc::new(Mutex::new(Vec::new()));
        let (c, h, g) = (
            Arc::clone(&connections),
            Arc::clone(&handshakes),
            Arc::clone(&got),
        );
        tokio::spawn(async move {
            let acceptor = TlsAcceptor::from(config);
            while let Ok((stream, _)) = listener.accept().await {
                c.fetch_add(1, SeqCst);
                let _ = stream.set_nodelay(true);
                let (acceptor, h, g) = (acceptor.clone(), Arc::clone(&h), Arc::clone(&g));
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    h.fetch_add(1, SeqCst);
                    serve_http(tls, g).await;
                });
            }
        });
        HttpsUpstream {
            addr,
            connections,
            handshakes,
            got,
        }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }
}

fn meter_parts() -> (AtomicU64, Budget, Activity) {
    (AtomicU64::new(0), Budget::new(u64::MAX), Activity::new())
}

/// Serves HTTP/1.1 requests on one stream until it ends.
async fn serve_http<S: AsyncRead + AsyncWrite + Unpin>(stream: S, got: Arc<Mutex<Vec<Got>>>) {
    let (r, mut w) = tokio::io::split(stream);
    let mut r = BufReader::with_capacity(256 * 1024, r);
    let (bytes, budget, activity) = meter_parts();
    let m = Meter {
        bytes: &bytes,
        budget: &budget,
        activity: &activity,
    };
    let mut head = Vec::new();
    while let Ok(HeadRead::Complete) = read_head(&mut r, &mut head, 64 * 1024).await {
        let text = String::from_utf8_lossy(&head).into_owned();
        let lower = text.to_ascii_lowercase();
        let framing = if lower.contains("transfer-encoding: chunked") {
            Body::Chunked
        } else {
            lower
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(Body::None, |n| Body::Length(n.trim().parse().unwrap()))
        };
        let mut sink = Sink::default();
        if forward_body(&mut r, &mut sink, framing, m).await.is_err() {
            return;
        }
        let path = text.split(' ').nth(1).unwrap_or("").to_string();
        got.lock().unwrap().push(Got {
            head: text.clone(),
            body_len: sink.len,
            body: sink.kept,
        });
        if lower.contains("\r\nupgrade: echo\r\n") {
            // Switch protocols, then echo every byte.
            let switched =
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n";
            if w.write_all(switched).await.is_err() || w.flush().await.is_err() {
                return;
            }
            let mut buf = vec![0u8; 16384];
            while let Ok(n @ 1..) = r.read(&mut buf).await {
                if w.write_all(&buf[..n]).await.is_err() || w.flush().await.is_err() {
                    return;
                }
            }
            return;
        }
        let echo = text
            .lines()
            .find_map(|l| l.strip_prefix("Authorization: "))
            .unwrap_or("")
            .to_string();
        let ok = if path == "/echo-auth" {
            w.write_all(format!("HTTP/1.1 200 OK\r\nX-Echo: {echo}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                .await
        } else if let Some(n) = path.strip_prefix("/download/") {
            let n: usize = n.parse().unwrap();
            let block = vec![b'd'; 256 * 1024];
            let mut left = n;
            let mut res = w
                .write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n").as_bytes())
                .await;
            while left > 0 && res.is_ok() {
                let k = left.min(block.len());
                res = w.write_all(&block[..k]).await;
                left -= k;
            }
            res
        } else {
            let body = format!("got {} bytes", sink.len);
            w.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len()).as_bytes())
                .await
        };
        if ok.is_err() || w.flush().await.is_err() {
            return;
        }
    }
}

/// Counts what is written, keeping the first MiB.
#[derive(Default)]
struct Sink {
    len: u64,
    kept: Vec<u8>,
}

impl AsyncWrite for Sink {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.len += buf.len() as u64;
        if self.kept.len() < 1 << 20 {
            self.kept.extend_from_slice(buf);
        }
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// A proxy with secrets on 127.0.0.1:0 whose upstream roots are the test CA's.
struct SecretProxy {
    proxy: Arc<Proxy>,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl SecretProxy {
    fn start(allow: &[&str], secrets: &[SecretConfig], ca: &TestCa) -> SecretProxy {
        let names = StaticResolver::new()
            .with("api.test", &["127.0.0.1".parse().unwrap()])
            .with("other.test", &["127.0.0.1".parse().unwrap()])
            .with("plain.test", &["127.0.0.1".parse().unwrap()]);
        let policy = Policy::new(&strings(allow), &strings(&["127.0.0.1/32"])).unwrap();
        let roots = TrustRoots::from_pem(ca.root_pem.as_bytes()).unwrap();
        let proxy = Proxy::with_secrets(
            policy,
            ProxyLimits::default(),
            Arc::new(names),
            Secrets::new(secrets).unwrap(),
            &roots,
        )
        .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(Arc::clone(&proxy).serve(listener, async {
            let _ = stopped.await;
        }));
        SecretProxy {
            proxy,
            addr,
            stop: Some(stop),
        }
    }

    fn placeholder(&self, name: &str) -> String {
        self.proxy
            .secret_env()
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
    }

    /// CONNECT `host:port`, then TLS with `connector` (SNI `host`).
    async fn tls(
        &self,
        host: &str,
        port: u16,
        connector: &TlsConnector,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let mut c = TcpStream::connect(self.addr).await?;
        c.set_nodelay(true)?;
        c.write_all(format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").as_bytes())
            .await?;
        let head = crate::test_util::read_head(&mut c).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        connector
            .connect(ServerName::try_from(host.to_string()).unwrap(), c)
            .await
    }

    async fn log(&self, n: usize) -> Vec<airlock_spec::EgressEntry> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let log = self.proxy.log();
            if log.len() >= n {
                return log;
            }
            assert!(tokio::time::Instant::now() < deadline, "log: {log:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for SecretProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Sends one request and reads its response (head and Content-Length body).
async fn roundtrip<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut BufReader<S>,
    request: &[u8],
) -> (String, Vec<u8>) {
    s.get_mut().write_all(request).await.unwrap();
    s.get_mut().flush().await.unwrap();
    read_response(s).await
}

async fn read_response<S: AsyncBufRead + Unpin>(s: &mut S) -> (String, Vec<u8>) {
    let mut head = Vec::new();
    let read = tokio::time::timeout(WAIT, read_head(s, &mut head, 64 * 1024)).await;
    assert!(matches!(read, Ok(Ok(HeadRead::Complete))), "{read:?} {head:?}");
    let head = String::from_utf8(head).unwrap();
    let len: usize = head
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| {
            l.strip_prefix("content-length: ")
                .map(|n| n.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    tokio::time::timeout(WAIT, s.read_exact(&mut body))
        .await
        .unwrap()
        .unwrap();
    (head, body)
}

fn secret(name: &str, value: &str, hosts: &[&str], query: bool) -> SecretConfig {
    SecretConfig {
        name: name.into(),
        value: value.into(),
        hosts: strings(hosts),
        query,
    }
}

#[tokio::test]
async fn a_secret_reaches_the_named_host_and_never_the_program_or_the_log() {
    let ca = TestCa::new();
    let up = HttpsUpstream::start(ca.server_config(&["api.test"])).await;
    let api = format!("api.test:{}", up.port());
    let p = SecretProxy::start(&[&api], &[secret("GITHUB_TOKEN", VALUE, &[&api], false)], &ca);
    let ph = p.placeholder("GITHUB_TOKEN");
    assert!(ph.starts_with("airlock-ph-") && !ph.contains(VALUE));
    let ca_pem = p.proxy.ca_pem().unwrap();
    assert!(p.proxy.ca_bundle_pem().unwrap().ends_with(&ca_pem));

    // The program trusts only the proxy's CA: the leaf it sees is the proxy's.
    let tls = p
        .tls("api.test", up.port(), &client_trusting(&ca_pem))
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let mut s = BufReader::new(tls);
    // Three requests on one keep-alive connection: no body, Content-Length, chunked.
    let mut seen = String::new();
    for request in [
        format!(
            "GET /user HTTP/1.1\r\nHost: api.test:{}\r\nAuthorization: Bearer {ph}\r\n\r\n",
            up.port()
        ),
        format!(
            "POST /a HTTP/1.1\r\nHost: api.test\r\nAuthorization: token {ph}\r\nContent-Length: 11\r\n\r\nhello world"
        ),
        format!(
            "POST /b HTTP/1.1\r\nHost: api.test\r\nX-Token: {ph}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n"
        ),
    ] {
        let (head, body) = roundtrip(&mut s, request.as_bytes()).await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        seen.push_str(&head);
        seen.push_str(&String::from_utf8_lossy(&body));
    }
    assert!(
        seen.contains("got 0 bytesHTTP") && seen.contains("got 11 bytesHTTP"),
        "{seen}"
    );
    assert!(!seen.contains(VALUE));
    drop(s);

    let got = up.got();
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(
        up.connections.load(SeqCst),
        1,
        "one upstream connection for all three"
    );
    assert!(
        got[0]
            .head
            .contains(&format!("\r\nAuthorization: Bearer {VALUE}\r\n")),
        "{}",
        got[0].head
    );
    assert!(
        got[1]
            .head
            .contains(&format!("\r\nAuthorization: token {VALUE}\r\n"))
    );
    assert!(got[2].head.contains(&format!("\r\nX-Token: {VALUE}\r\n")));
    assert!(got.iter().all(|g| !g.head.contains(&ph)));
    assert_eq!((got[1].body_len, &got[1].body[..]), (11, &b"hello world"[..]));
    assert_eq!(got[2].body, b"5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n");

    let log = p.log(1).await;
    assert_eq!(log.len(), 1, "{log:?}");
    let e = &log[0];
    assert!(e.allowed);
    assert_eq!(
        (e.host.as_str(), e.port, e.addr.as_deref()),
        ("api.test", up.port(), Some("127.0.0.1"))
    );
    assert_eq!(
        e.reason,
        format!("allowed by {api}; TLS intercepted for secret GITHUB_TOKEN")
    );
    assert!(e.bytes_up > 0 && e.bytes_down > 0);
    let everything = format!("{log:?} {:?}", p.proxy);
    assert!(!everything.contains(VALUE), "{everything}");
}

#[tokio::test]
async fn a_placeholder_to_an_unlisted_host_is_blocked_and_never_sent() {
    let ca = TestCa::new();
    let up = HttpsUpstream::start(ca.server_config(&["api.test", "other.test"])).await;
    let plain = crate::test_util::http_server(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
    let api = format!("api.test:{}", up.port());
    let other = format!("other.test:{}", up.port());
    let plain_host = format!("plain.test:{}", plain.port());
    let p = SecretProxy::start(
        &[&api, &other, &plain_host],
        &[
            secret("GITHUB_TOKEN", VALUE, &[&api], false),
            secret("OTHER_KEY", "other-value", &[&other], false),
        ],
        &ca,
    );
    let ph = p.placeholder("GITHUB_TOKEN");

    // Plain HTTP: refused before anything is resolved or connected.
    let mut c = TcpStream::connect(p.addr).await.unwrap();
    c.write_all(
        format!("GET http://{plain_host}/x HTTP/1.1\r\nAuthorization: Bearer {ph}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let answer = read_to_end(&mut c).await;
    let reason = format!("placeholder of secret GITHUB_TOKEN sent to {plain_host} (it may go only to {api})");
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert!(answer.ends_with(&format!("\r\n\r\n{reason}\n")), "{answer}");
    assert_eq!(plain.connections(), 0);
    let log = p.log(1).await;
    assert_eq!((log[0].allowed, log[0].reason.as_str()), (false, reason.as_str()));

    // Inside a connection intercepted for another secret: a 403 from the proxy, nothing
    // sent upstream, a denied entry with the reason.
    let tls = p
        .tls(
            "other.test",
            up.port(),
            &client_trusting(&p.proxy.ca_pem().unwrap()),
        )
        .await
        .unwrap();
    let mut s = BufReader::new(tls);
    let (head, body) = roundtrip(
        &mut s,
        format!("GET / HTTP/1.1\r\nHost: other.test\r\nAuthorization: Bearer {ph}\r\n\r\n").as_bytes(),
    )
    .await;
    let reason = format!("placeholder of secret GITHUB_TOKEN sent to {other} (it may go only to {api})");
    assert!(head.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{head}");
    assert_eq!(String::from_utf8(body).unwrap(), format!("{reason}\n"));
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut rest))
        .await
        .unwrap();
    assert!(rest.is_empty(), "closed after the refusal");
    let log = p.log(3).await;
    assert_eq!((log[1].allowed, log[1].reason.as_str()), (false, reason.as_str()));
    assert!(log[2].allowed);
    assert!(
        log[2].reason.ends_with(&format!(
            "TLS intercepted for secret OTHER_KEY; closed after a refused request: {reason}"
        )),
        "{}",
        log[2].reason
    );
    assert!(up.got().is_empty(), "{:?}", up.got());
    assert_eq!(p.proxy.counts(), (1, 2));
    assert!(!format!("{log:?}").contains(VALUE));
}

#[tokio::test]
async fn a_host_without_secrets_keeps_end_to_end_tls() {
    let ca = TestCa::new();
    let up = HttpsUpstream::start(ca.server_config(&["api.test", "other.test"])).await;
    let api = format!("api.test:{}", up.port());
    let other = format!("other.test:{}", up.port());
    let p = SecretProxy::start(
        &[&api, &other],
        &[secret("GITHUB_TOKEN", VALUE, &[&api], false)],
        &ca,
    );
    assert!(!p.proxy.intercepts("other.test", up.port()));
    // Trusting only the test CA, the program completes the handshake with the upstream
    // itself: the proxy's CA is not involved.
    let tls = p
        .tls("other.test", up.port(), &client_trusting(&ca.root_pem))
        .await
        .unwrap();
    let mut s = BufReader::new(tls);
    let ph = p.placeholder("GITHUB_TOKEN");
    let (head, _) = roundtrip(
        &mut s,
        format!("GET / HTTP/1.1\r\nHost: other.test\r\nAuthorization: Bearer {ph}\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // Untouched: the placeholder arrives as the program sent it.
    assert!(up.got()[0].head.contains(&ph));
    let proxy_only = client_trusting(&p.proxy.ca_pem().unwrap());
    assert!(
        p.tls("other.test", up.port(), &proxy_only).await.is_err(),
        "the program sees the upstream's own certificate, which the proxy CA did not sign"
    );
    drop(s);
    let log = p.log(2).await;
    assert!(
        log.iter().all(|e| e.reason == format!("allowed by {other}")),
        "{log:?}"
    );
}

#[tokio::test]
async fn query_secrets_are_replaced_in_the_query_string() {
    let ca = TestCa::new();
    let up = HttpsUpstream::start(ca.server_config(&["api.test"])).await;
    let api = format!("api.test:{}", up.port());
    let p = SecretProxy::start(&[&api], &[secret("MAPS_KEY", "k&v=1", &[&api], true)], &ca);
    let ph = p.placeholder("MAPS_KEY");
    let tls = p
        .tls(
            "api.test",
            up.port(),
            &client_trusting(&p.proxy.ca_pem().unwrap()),
        )
        .await
        .unwrap();
    let mut s = BufReader::new(tls);
    let (head, _) = roundtrip(
        &mut s,
        format!("GET /geo?key={ph}&q=x HTTP/1.1\r\nHost: api.test\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        up.got()[0]
            .head
            .starts_with("GET /geo?key=k%26v%3D1&q=x HTTP/1.1\r\n"),
        "{}",
        up.got()[0].head
    );
}

#[tokio::test]
async fn inside_an_intercepted_connection_the_host_header_must_match() {
    let ca = TestCa::new();
    let up = HttpsUpstream::start(ca.server_config(&["api.test"])).await;
    let api = format!("api.test:{}", up.port());
    let p = SecretProxy::start(&[&api], &[secret("GITHUB_TOKEN", VALUE, &[&api], false)], &ca);
    let ph = p.placeholder("GITHUB_TOKEN");
    let tls = p
        .tls(
            "api.test",
            up.port(),
            &client_trusting(&p.proxy.ca_pem().unwrap()),
        )
        .await
        .unwrap();
    let mut s = BufReader::new(tls);
    let (head, body) = roundtrip(
        &mut s,
        format!("GET / HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer {ph}\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    assert!(String::from_utf8_lossy(&body).contains("disagrees with the connection's host"));
    assert!(up.got().is_empty());
}

#[tokio::test]
async fn an_upstream_that_fails_verification_is_a_502_inside_the_tls() {
    let ca = TestCa::new();
    let stranger = TestCa::named("a root nobody trusts");
    let up = HttpsUpstream::start(stranger.server_config(&["api.test"])).await;
    let api = format!("api.test:{}", up.port());
    let p = SecretProxy::start(&[&api], &[secret("GITHUB_TOKEN", VALUE, &[&api], false)], &ca);
    let tls = p
        .tls(
            "api.test",
            up.port(),
            &client_trusting(&p.proxy.ca_pem().unwrap()),
        )
        .await
        .unwrap();
    let mut s = BufReader::new(tls);
    let (head, body) = read_response(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    let body = String::from_utf8(body).unwrap();
    assert!(
        body.contains(&format!("TLS to {api} failed")) && body.contains("UnknownIssuer"),
        "{body}"
    );
    assert_eq!(up.handshakes.load(SeqCst), 0);
    let log = p.log(1).await;
    assert!(log[0].reason.contains("UnknownIssuer"), "{}", log[0].reason);
}

/// Latency and throughput through an intercepting connection vs direct TLS to the same
/// loopback upstream. `cargo test -p airlock-egress --release -- --ignored --nocapture
/// bench_interception`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test"]
async fn bench_interception() {
    let ca = TestCa::new();
    let up = HttpsUpstream::start(ca.server_config(&["api.test"])).await;
    let api = format!("api.test:{}", up.port());
    let p = SecretProxy::start(&[&api], &[secret("GITHUB_TOKEN", VALUE, &[&api], false)], &ca);
    let ph = p.placeholder("GITHUB_TOKEN");
    let direct = client_trusting(&ca.root_pem);
    let via = client_trusting(&p.proxy.ca_pem().unwrap());
    const N: usize = 2000;
    const BIG: usize = 64 << 20;

    async fn latencies<S: AsyncRead + AsyncWrite + Unpin>(s: S, request: &[u8]) -> Vec<f64> {
        let mut s = BufReader::new(s);
        for _ in 0..100 {
            roundtrip(&mut s, request).await;
        }
        let mut out = Vec::with_capacity(N);
        for _ in 0..N {
            let t = std::time::Instant::now();
            roundtrip(&mut s, request).await;
            out.push(t.elapsed().as_secs_f64() * 1e6);
        }
        out.sort_by(f64::total_cmp);
        out
    }
    async fn transfer<S: AsyncRead + AsyncWrite + Unpin>(s: S) -> (f64, f64) {
        let mut s = BufReader::with_capacity(256 * 1024, s);
        let t = std::time::Instant::now();
        let (head, body) = roundtrip(
            &mut s,
            format!("GET /download/{BIG} HTTP/1.1\r\nHost: api.test\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 200") && body.len() == BIG);
        let down = BIG as f64 / t.elapsed().as_secs_f64() / (1 << 20) as f64;
        let t = std::time::Instant::now();
        s.get_mut()
            .write_all(
                format!("POST /up HTTP/1.1\r\nHost: api.test\r\nContent-Length: {BIG}\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        let block = vec![b'u'; 256 * 1024];
        for _ in 0..BIG / block.len() {
            s.get_mut().write_all(&block).await.unwrap();
        }
        s.get_mut().flush().await.unwrap();
        let (head, body) = read_response(&mut s).await;
        assert!(head.starts_with("HTTP/1.1 200"));
        assert_eq!(body, format!("got {BIG} bytes").as_bytes());
        let upload = BIG as f64 / t.elapsed().as_secs_f64() / (1 << 20) as f64;
        (down, upload)
    }
    let request = format!("GET /x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer {ph}\r\n\r\n");
    let name = ServerName::try_from("api.test").unwrap();
    let connect_direct = || async {
        let c = TcpStream::connect(up.addr).await.unwrap();
        c.set_nodelay(true).unwrap();
        direct.connect(name.clone(), c).await.unwrap()
    };
    let d = latencies(connect_direct().await, request.as_bytes()).await;
    let v = latencies(
        p.tls("api.test", up.port(), &via).await.unwrap(),
        request.as_bytes(),
    )
    .await;
    let med = |x: &[f64]| x[x.len() / 2];
    let p90 = |x: &[f64]| x[x.len() * 9 / 10];
    println!(
        "latency per request (us): direct median {:.0} p90 {:.0}; intercepted median {:.0} p90 {:.0}; added median {:.0}",
        med(&d),
        p90(&d),
        med(&v),
        p90(&v),
        med(&v) - med(&d)
    );
    // The best of 5 each: the machine is shared, and noise only ever slows a run.
    let (mut dd, mut du, mut vd, mut vu) = (0f64, 0f64, 0f64, 0f64);
    for _ in 0..5 {
        let (d, u) = transfer(connect_direct().await).await;
        (dd, du) = (dd.max(d), du.max(u));
        let (d, u) = transfer(p.tls("api.test", up.port(), &via).await.unwrap()).await;
        (vd, vu) = (vd.max(d), vu.max(u));
    }
    println!(
        "64 MiB, best of 5: direct down {dd:.0} MiB/s up {du:.0} MiB/s; intercepted down {vd:.0} MiB/s ({:.0}%) up {vu:.0} MiB/s ({:.0}%)",
        vd / dd * 100.0,
        vu / du * 100.0
    );
}

#[tokio::test]
async fn plain_http_to_a_named_host_gets_the_value_in_its_head() {
    let ca = TestCa::new();
    let plain = crate::test_util::http_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let host = format!("plain.test:{}", plain.port());
    let p = SecretProxy::start(&[&host], &[secret("API_KEY", VALUE, &[&host], true)], &ca);
    let ph = p.placeholder("API_KEY");
    let mut c = TcpStream::connect(p.addr).await.unwrap();
    c.write_all(format!("GET http://{host}/x?k={ph} HTTP/1.1\r\nX-Api-Key: {ph}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let answer = read_to_end(&mut c).await;
    assert!(
        answer.starts_with("HTTP/1.1 200 OK\r\n") && answer.ends_with("ok"),
        "{answer}"
    );
    let got = String::from_utf8(plain.received(0).await).unwrap();
    assert!(
        got.starts_with(&format!("GET /x?k={VALUE} HTTP/1.1\r\n")),
        "{got}"
    );
    assert!(got.contains(&format!("\r\nX-Api-Key: {VALUE}\r\n")), "{got}");
    let log = p.log(1).await;
    assert_eq!(
        (log[0].allowed, log[0].reason.clone()),
        (true, format!("allowed by {host}"))
    );
    assert!(!format!("{log:?}").contains(VALUE));
}

#[tokio::test]
async fn an_echoed_value_reaches_the_program_as_its_placeholder() {
    let ca = TestCa::new();
    let up = HttpsUpstream::start(ca.server_config(&["api.test"])).await;
    let api = format!("api.test:{}", up.port());
    let p = SecretProxy::start(&[&api], &[secret("GITHUB_TOKEN", VALUE, &[&api], false)], &ca);
    let ph = p.placeholder("GITHUB_TOKEN");
    let tls = p
        .tls(
            "api.test",
            up.port(),
            &client_trusting(&p.proxy.ca_pem().unwrap()),
        )
        .await
        .unwrap();
    let mut s = BufReader::new(tls);
    let (head, _) = roundtrip(
        &mut s,
        format!("GET /echo-auth HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer {ph}\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(up.got()[0].head.contains(VALUE));
    assert!(head.contains(&format!("\r\nX-Echo: Bearer {ph}\r\n")), "{head}");
    assert!(!head.contains(VALUE));
}

#[tokio::test]
async fn after_a_protocol_switch_bytes_are_copied_both_ways() {
    let ca = TestCa::new();
    let up = HttpsUpstream::start(ca.server_config(&["api.test"])).await;
    let api = format!("api.test:{}", up.port());
    let p = SecretProxy::start(&[&api], &[secret("GITHUB_TOKEN", VALUE, &[&api], false)], &ca);
    let ph = p.placeholder("GITHUB_TOKEN");
    let tls = p
        .tls(
            "api.test",
            up.port(),
            &client_trusting(&p.proxy.ca_pem().unwrap()),
        )
        .await
        .unwrap();
    let mut s = BufReader::new(tls);
    let (head, _) = roundtrip(
        &mut s,
        format!("GET /ws HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer {ph}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
            .as_bytes(),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(up.got()[0].head.contains(VALUE));
    // Not HTTP any more: "GET" and a head-like text go through as they are.
    let frame = b"GET not-a-request\r\n\r\nframe";
    s.get_mut().write_all(frame).await.unwrap();
    s.get_mut().flush().await.unwrap();
    let mut back = vec![0u8; frame.len()];
    tokio::time::timeout(WAIT, s.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, frame);
    assert_eq!(up.got().len(), 1);
}

#[tokio::test]
async fn a_secret_for_an_ip_literal_is_intercepted_with_an_ip_certificate() {
    let ca = TestCa::new();
    let up = HttpsUpstream::start(ca.server_config(&["127.0.0.1"])).await;
    let literal = format!("127.0.0.1:{}", up.port());
    let p = SecretProxy::start(&[], &[secret("TOKEN", VALUE, &[&literal], false)], &ca);
    let ph = p.placeholder("TOKEN");
    let tls = p
        .tls(
            "127.0.0.1",
            up.port(),
            &client_trusting(&p.proxy.ca_pem().unwrap()),
        )
        .await
        .unwrap();
    let mut s = BufReader::new(tls);
    let (head, _) = roundtrip(
        &mut s,
        format!("GET / HTTP/1.1\r\nHost: {literal}\r\nAuthorization: Bearer {ph}\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(up.got()[0].head.contains(VALUE));
    drop(s);
    let log = p.log(1).await;
    assert_eq!(
        log[0].reason,
        "allowed by allow_cidrs 127.0.0.1/32; TLS intercepted for secret TOKEN"
    );
}

#[tokio::test]
async fn a_program_that_does_not_trust_the_sandbox_ca_is_told_so_in_the_log() {
    let ca = TestCa::new();
    let up = HttpsUpstream::start(ca.server_config(&["api.test"])).await;
    let api = format!("api.test:{}", up.port());
    let p = SecretProxy::start(&[&api], &[secret("GITHUB_TOKEN", VALUE, &[&api], false)], &ca);
    // Trusting the upstream's real root only: the proxy's leaf is refused.
    assert!(
        p.tls("api.test", up.port(), &client_trusting(&ca.root_pem))
            .await
            .is_err()
    );
    let log = p.log(1).await;
    assert!(
        log[0].reason.contains("TLS handshake with the program failed")
            && log[0].reason.ends_with("(does it trust the sandbox's CA?)"),
        "{}",
        log[0].reason
    );
    assert!(up.got().is_empty());
}
