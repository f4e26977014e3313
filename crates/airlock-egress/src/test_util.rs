//! Loopback fixtures for the proxy tests: a proxy on 127.0.0.1:0, upstream servers that
//! count their connections, clients. Nothing here leaves the machine.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_spec::EgressEntry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::{Policy, Proxy, ProxyLimits, Resolver};

/// Every wait in a test is bounded by this.
pub(crate) const WAIT: Duration = Duration::from_secs(5);

pub(crate) fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// A proxy served on 127.0.0.1:0.
pub(crate) struct TestProxy {
    pub proxy: Arc<Proxy>,
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

impl TestProxy {
    pub(crate) fn start(
        allow: &[&str],
        cidrs: &[&str],
        limits: ProxyLimits,
        resolver: Arc<dyn Resolver>,
    ) -> TestProxy {
        let policy = Policy::new(&strings(allow), &strings(cidrs)).unwrap();
        let proxy = Proxy::new(policy, limits, resolver);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(Arc::clone(&proxy).serve(listener, async {
            let _ = stopped.await;
        }));
        TestProxy {
            proxy,
            addr,
            stop: Some(stop),
            server: Some(server),
        }
    }

    /// Stops the proxy and waits until every connection has ended.
    pub(crate) async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            tokio::time::timeout(WAIT, server)
                .await
                .expect("serve returns after stop")
                .unwrap();
        }
    }

    /// Sends `raw` on a new connection and reads the answer to its end.
    pub(crate) async fn request(&self, raw: &[u8]) -> String {
        let mut c = TcpStream::connect(self.addr).await.unwrap();
        c.write_all(raw).await.unwrap();
        read_to_end(&mut c).await
    }

    /// A CONNECT to `target`: the stream and the answer's head.
    pub(crate) async fn connect(&self, target: &str) -> (TcpStream, String) {
        let mut c = TcpStream::connect(self.addr).await.unwrap();
        c.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let head = read_head(&mut c).await;
        (c, head)
    }

    /// The log once it has at least `n` entries.
    pub(crate) async fn log(&self, n: usize) -> Vec<EgressEntry> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let log = self.proxy.log();
            if log.len() >= n {
                return log;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "log has {} entries, want {n}: {log:?}",
                log.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Reads up to the end of a head (`\r\n\r\n`), byte by byte so nothing after it is taken.
pub(crate) async fn read_head(c: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(WAIT, async {
        while !head.ends_with(b"\r\n\r\n") {
            match c.read(&mut byte).await {
                Ok(1) => head.push(byte[0]),
                _ => break,
            }
        }
    })
    .await
    .expect("a head in time");
    String::from_utf8_lossy(&head).into_owned()
}

/// Reads to EOF (a reset ends it too).
pub(crate) async fn read_to_end(c: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    tokio::time::timeout(WAIT, async {
        while let Ok(n @ 1..) = c.read(&mut buf).await {
            out.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the connection ends in time");
    String::from_utf8_lossy(&out).into_owned()
}

/// An upstream on 127.0.0.1 that counts connections and records what it received.
pub(crate) struct Upstream {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    /// What each finished connection sent, in order.
    pub received: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Upstream {
    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }

    pub(crate) fn connections(&self) -> usize {
        self.connections.load(SeqCst)
    }

    /// What the `i`th connection sent, once it has ended.
    pub(crate) async fn received(&self, i: usize) -> Vec<u8> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(r) = self.received.lock().unwrap().get(i) {
                return r.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "connection {i} never ended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn upstream<F, Fut>(serve: F) -> Upstream
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Vec<u8>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let received = Arc::new(Mutex::new(Vec::new()));
    let (count, log) = (Arc::clone(&connections), Arc::clone(&received));
    let serve = Arc::new(serve);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, SeqCst);
            let (serve, log) = (Arc::clone(&serve), Arc::clone(&log));
            tokio::spawn(async move {
                let got = serve(stream).await;
                log.lock().unwrap().push(got);
            });
        }
    });
    Upstream {
        addr,
        connections,
        received,
    }
}

/// Echoes every byte back; closes when the client does.
pub(crate) async fn echo_server() -> Upstream {
    upstream(|mut s: TcpStream| async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 16384];
        while let Ok(n @ 1..) = s.read(&mut buf).await {
            got.extend_from_slice(&buf[..n]);
            if s.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        got
    })
    .await
}

/// Reads one request (head and a Content-Length or chunked body), answers `response`,
/// then records everything the connection sent until it ends.
pub(crate) async fn http_server(response: &'static [u8]) -> Upstream {
    upstream(move |mut s: TcpStream| async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 16384];
        let complete = |got: &[u8]| {
            let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                return false;
            };
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let body = &got[end + 4..];
            if head.contains("transfer-encoding: chunked") {
                let text = String::from_utf8_lossy(body);
                return text.ends_with("\r\n\r\n")
                    && (text.starts_with("0\r\n") || text.contains("\r\n0\r\n"));
            }
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |n| n.trim().parse::<usize>().unwrap());
            body.len() >= len
        };
        let answered = tokio::time::timeout(WAIT, async {
            while !complete(&got) {
                match s.read(&mut buf).await {
                    Ok(n @ 1..) => got.extend_from_slice(&buf[..n]),
                    _ => return false,
                }
            }
            s.write_all(response).await.is_ok()
        })
        .await;
        if matches!(answered, Ok(true)) {
            let _ = tokio::time::timeout(WAIT, async {
                while let Ok(n @ 1..) = s.read(&mut buf).await {
                    got.extend_from_slice(&buf[..n]);
                }
            })
            .await;
        }
        got
    })
    .await
}

/// A port on 127.0.0.1 where nothing listens.
pub(crate) fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}
