//! airlock's fleet front (`airlock serve --route PEERS`): one endpoint before many
//! `airlock serve --node NAME` daemons. Stateless: every session and snapshot id names
//! the node that made it (`NAME--<id>`), so a request about one goes to that node; new
//! work (`POST /v1/exec`, `POST /v1/sandboxes`, an MCP `initialize`) goes to the node
//! with the most free capacity, as each node's `/readyz` (polled every second) says;
//! lists (`GET /v1/sandboxes`, `GET /v1/snapshots`) are asked of every node and merged.
//! Bodies stream through both ways (Server-Sent Events, process output), as do upgrades
//! (a terminal's WebSocket) and a port's own host name (`8000-<id>.<server>`).
//!
//! The router checks no API key: `Authorization` goes to the node unchanged, and the
//! node checks it.
//!
//! ```no_run
//! # async fn f() -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8710").await?;
//! let peers = airlock_router::parse_peers("127.0.0.1:8711,dns:airlock-nodes:8080").unwrap();
//! let config = airlock_router::RouterConfig::new(peers);
//! let shutdown = async { let _ = tokio::signal::ctrl_c().await; };
//! airlock_router::run(listener, config, |addr| println!("routing on {addr}"), shutdown).await
//! # }
//! ```
#![deny(missing_docs)]

mod fleet;
mod route;

use airlock_server::ApiError;
use airlock_server::hop::strip_hop_by_hop;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version, header};
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet::{Fleet, Status};
pub use fleet::{Peer, parse_peers};
use route::{Own, Route};

/// The most of a request body the router holds to send it again to another node (new
/// work whose first node was gone); the daemon's own default `--max-body` is 16 MiB.
const MAX_BUFFERED_BODY: usize = 64 << 20;

/// The most of a node's `/readyz` or list answer read (a list of many sessions stays
/// well under it).
const MAX_NODE_ANSWER: usize = 32 << 20;

/// The header that carries an MCP session's id.
const MCP_SESSION: HeaderName = HeaderName::from_static("mcp-session-id");

/// The header a merged list names the nodes it lacks in (they did not answer).
const MISSING_NODES: HeaderName = HeaderName::from_static("airlock-missing-nodes");

/// How the router runs.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// The peers (`--route`).
    pub peers: Vec<Peer>,
    /// How often each node's `/readyz` is asked.
    pub poll_every: Duration,
    /// How long a poll may take before the node counts as down.
    pub poll_timeout: Duration,
    /// How often the peers' names are resolved again.
    pub resolve_every: Duration,
    /// How long a connection to a node may take (then: the next node, or an error).
    pub connect_timeout: Duration,
    /// At shutdown, how long requests under way get before the router exits.
    pub grace: Duration,
}

impl RouterConfig {
    /// The defaults around `peers`: poll every second (timeout 2 s), resolve every 5 s,
    /// connect within 3 s, 10 s of grace.
    pub fn new(peers: Vec<Peer>) -> RouterConfig {
        RouterConfig {
            peers,
            poll_every: Duration::from_secs(1),
            poll_timeout: Duration::from_secs(2),
            resolve_every: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            grace: Duration::from_secs(10),
        }
    }
}

/// The router's state, shared by every request and the poller.
#[derive(Debug)]
struct Router {
    config: RouterConfig,
    fleet: Fleet,
    /// Each peer's addresses at its last successful resolution (kept when one fails).
    resolved: Mutex<HashMap<String, Vec<SocketAddr>>>,
    /// Pooled HTTP/1 connections to the nodes.
    client: Client<HttpConnector, Body>,
}

/// Serves the router on `listener` until `shutdown` resolves (calling `started` once the
/// first poll of the peers is done); then stops accepting and gives requests under way
/// the grace period.
pub async fn run(
    listener: tokio::net::TcpListener,
    config: RouterConfig,
    started: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(config.connect_timeout));
    http.set_nodelay(true);
    // A node that vanishes mid-request (its host gone, no RST) is noticed within ~11 s.
    http.set_keepalive(Some(Duration::from_secs(5)));
    http.set_keepalive_interval(Some(Duration::from_secs(2)));
    http.set_keepalive_retries(Some(3));
    let client = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(http);
    let router = Arc::new(Router {
        config,
        fleet: Fleet::default(),
        resolved: Mutex::new(HashMap::new()),
        client,
    });
    router.resolve().await;
    router.poll_all().await;
    let poller = tokio::spawn(Arc::clone(&router).keep_fresh());
    let peers: Vec<String> = router.config.peers.iter().map(ToString::to_string).collect();
    tracing::info!(%addr, peers = peers.join(","), nodes = router.fleet.names().join(","), "routing");
    started(addr);
    let grace = router.config.grace;
    let app = axum::Router::new().fallback(handle).with_state(router);
    let (closing, mut closed) = tokio::sync::watch::channel(false);
    let served = axum::serve(
        axum::serve::ListenerExt::tap_io(listener, |tcp: &mut tokio::net::TcpStream| {
            let _ = tcp.set_nodelay(true);
        }),
        app,
    )
    .with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutting down: no new requests; those under way get {grace:?}");
        let _ = closing.send(true);
    });
    let result = tokio::select! {
        r = served => r,
        // A stream that never ends does not hold the exit past the grace period.
        () = async {
            let _ = closed.wait_for(|c| *c).await;
            tokio::time::sleep(grace).await;
        } => Ok(()),
    };
    poller.abort();
    result
}

/// Marks an answer the router made itself (not a node's).
#[derive(Debug, Clone, Copy)]
struct Made;

/// An error the router answers itself.
trait Answer {
    /// The error as a response marked [`Made`].
    fn made(self) -> Response;
}

impl Answer for ApiError {
    fn made(self) -> Response {
        let mut resp = self.into_response();
        resp.extensions_mut().insert(Made);
        resp
    }
}

/// Every request: the router's own routes, or a node's.
async fn handle(State(router): State<Arc<Router>>, req: Request) -> Response {
    // A body the router answers without reading: the connection cannot carry another
    // request (its rest would be read as one), and the client is told so.
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    let mut resp = route_request(router, req).await;
    if has_body && resp.extensions().get::<Made>().is_some() {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// Answers `req` by its route.
async fn route_request(router: Arc<Router>, req: Request) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned);
    let route = route::classify(req.method().as_str(), req.uri().path(), host.as_deref());
    match route {
        Route::Own(Own::Healthz) => axum::Json(json!({"status": "ok"})).into_response(),
        Route::Own(Own::Readyz) => router.readyz(),
        Route::Own(Own::Metrics) => ApiError::not_found(format!(
            "the router has no metrics of its own: scrape each node's /metrics ({})",
            router.fleet.names().join(", ")
        ))
        .made(),
        Route::Node { node, id } => router.to_node(&node, &id, req).await,
        Route::Unowned(id) => ApiError::not_found(format!(
            "no sandbox or snapshot {id}: ids through a router name their node (NAME--…)"
        ))
        .made(),
        Route::NewWork => router.new_work(req).await,
        Route::FanOut => router.fan_out(req).await,
        Route::Mcp => router.mcp(req).await,
        Route::AnyNode => router.any_node(req).await,
    }
}

/// A 503 naming the node that cannot answer.
fn node_unavailable(message: String) -> Response {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        code: "node_unavailable",
        message,
        field: None,
        retry_after: Some(1),
    }
    .made()
}

/// A 503: no node takes new work now.
fn no_node(message: String) -> Response {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        code: "no_node_available",
        message,
        field: None,
        retry_after: Some(1),
    }
    .made()
}

/// Why a forwarded request got no answer.
#[derive(Debug)]
struct Failure {
    /// The connection to the node failed: nothing was sent, another node may be tried.
    connect: bool,
    /// What happened.
    message: String,
}

/// The error and its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// Whether the request asks to switch protocols (a WebSocket).
fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")))
}

/// What adjusts a request for the node it goes to (MCP's `Host`).
type Rewrite = dyn Fn(SocketAddr, &mut Request) + Sync;

/// A request's head, kept to send it again.
#[derive(Debug, Clone)]
struct Head {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
}

impl Head {
    fn of(req: &Request) -> Head {
        Head {
            method: req.method().clone(),
            uri: req.uri().clone(),
            headers: req.headers().clone(),
        }
    }

    fn request(&self, body: Bytes) -> Request {
        let mut req = Request::new(Body::from(body));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.headers_mut() = self.headers.clone();
        req
    }
}

/// The error code of a JSON error body, if it is one.
fn error_code(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<Value>(body)
        .ok()?
        .pointer("/error/code")?
        .as_str()
        .map(str::to_owned)
}

impl Router {
    /// Re-resolves the peers and polls the nodes, for as long as the router runs.
    async fn keep_fresh(self: Arc<Self>) {
        let mut resolved_at = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.config.poll_every).await;
            if resolved_at.elapsed() >= self.config.resolve_every {
                self.resolve().await;
                resolved_at = tokio::time::Instant::now();
            }
            self.poll_all().await;
        }
    }

    /// Resolves every peer (all its A/AAAA records); a peer that fails to resolve keeps
    /// its last addresses.
    async fn resolve(&self) {
        let lookups = self.config.peers.iter().map(|peer| async move {
            let name = peer.lookup();
            let found =
                tokio::time::timeout(self.config.poll_timeout, tokio::net::lookup_host(name.clone())).await;
            (name, found)
        });
        let results = futures_util::future::join_all(lookups).await;
        let mut resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        for (name, found) in results {
            match found {
                Ok(Ok(addrs)) => {
                    let mut addrs: Vec<SocketAddr> = addrs.collect();
                    addrs.sort();
                    addrs.dedup();
                    resolved.insert(name, addrs);
                }
                Ok(Err(e)) => {
                    tracing::warn!(peer = %name, error = %e, "cannot resolve peer; keeping its last addresses")
                }
                Err(_) => {
                    tracing::warn!(peer = %name, "resolving peer timed out; keeping its last addresses")
                }
            }
        }
        let mut all: Vec<SocketAddr> = resolved.values().flatten().copied().collect();
        all.sort();
        all.dedup();
        drop(resolved);
        self.fleet.set_addresses(&all);
    }

    /// Asks every node's `/readyz` at once.
    async fn poll_all(&self) {
        let addrs = self.fleet.addresses();
        let polls = addrs
            .iter()
            .map(|addr| async move { (*addr, self.poll(*addr).await) });
        for (addr, polled) in futures_util::future::join_all(polls).await {
            self.fleet.record(addr, polled);
        }
    }

    /// One node's `/readyz` (200 or 503: either says what the node is).
    async fn poll(&self, addr: SocketAddr) -> Result<Status, String> {
        let ask = async {
            let mut req = Request::new(Body::empty());
            *req.uri_mut() = format!("http://{addr}/readyz")
                .parse()
                .map_err(|e| format!("{e}"))?;
            let resp = self.client.request(req).await.map_err(|e| chain(&e))?;
            let status = resp.status();
            let body = axum::body::to_bytes(Body::new(resp.into_body()), MAX_NODE_ANSWER)
                .await
                .map_err(|e| chain(&e))?;
            let v: Value = serde_json::from_slice(&body)
                .map_err(|_| format!("/readyz answered {status} without JSON (is it an airlock daemon?)"))?;
            Ok(Status::from_readyz(&v))
        };
        match tokio::time::timeout(self.config.poll_timeout, ask).await {
            Ok(r) => r,
            Err(_) => Err(format!("/readyz took more than {:?}", self.config.poll_timeout)),
        }
    }

    /// The router's `/readyz`: ready when a node takes new work.
    fn readyz(&self) -> Response {
        let nodes: Vec<Value> = self
            .fleet
            .snapshot()
            .into_iter()
            .map(|(addr, s)| {
                json!({
                    "address": addr.to_string(),
                    "node": s.node,
                    "up": s.up,
                    "ready": s.ready,
                    "stopping": s.stopping,
                    "sandboxes_free": s.sandboxes_free,
                    "memory_free_bytes": s.memory_free_bytes,
                    "error": s.error,
                    "last_seen_ms": s.seen.map(|t| t.elapsed().as_millis() as u64),
                })
            })
            .collect();
        let ready = !self.fleet.candidates().is_empty();
        let status = if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        (
            status,
            axum::Json(json!({"ready": ready, "router": true, "nodes": nodes})),
        )
            .into_response()
    }

    /// Sends `req` to the node at `addr`, its body streamed, and streams the answer back;
    /// an upgrade (101) joins the two connections once both sides switched.
    async fn forward(&self, addr: SocketAddr, mut req: Request) -> Result<Response, Failure> {
        let upgrade = is_upgrade(req.headers());
        let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = format!("http://{addr}{path}").parse().map_err(|e| Failure {
            connect: true,
            message: format!("bad request target: {e}"),
        })?;
        parts.version = Version::HTTP_11;
        if !upgrade {
            strip_hop_by_hop(&mut parts.headers);
        }
        let mut resp = self
            .client
            .request(Request::from_parts(parts, body))
            .await
            .map_err(|e| Failure {
                connect: e.is_connect(),
                message: chain(&e),
            })?;
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            if let Some(client_side) = client_side {
                let node_side = hyper::upgrade::on(&mut resp);
                tokio::spawn(async move {
                    match futures_util::future::try_join(client_side, node_side).await {
                        Ok((client, node)) => {
                            let _ = tokio::io::copy_bidirectional(
                                &mut TokioIo::new(client),
                                &mut TokioIo::new(node),
                            )
                            .await;
                        }
                        Err(e) => tracing::debug!(error = %e, "an upgrade did not complete"),
                    }
                });
            }
        } else {
            // A node that closes (its answer came before the whole body, a 413) says so;
            // the client must hear it too, or it would send its next request into a
            // connection that drops it.
            let close = resp
                .headers()
                .get_all(header::CONNECTION)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")));
            strip_hop_by_hop(resp.headers_mut());
            if close {
                resp.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
        }
        Ok(resp.map(Body::new))
    }

    /// A session's, snapshot's or port's request: to the node its id names.
    async fn to_node(&self, node: &str, id: &str, req: Request) -> Response {
        let Some((addr, _)) = self.fleet.find(node) else {
            return node_unavailable(format!(
                "node {node} (of {id}) is not in this fleet now (nodes: {}); its sandboxes are unreachable",
                self.fleet.names().join(", ")
            ));
        };
        match self.forward(addr, req).await {
            Ok(resp) => resp,
            Err(f) => {
                if f.connect {
                    self.fleet.mark_down(addr, &f.message);
                }
                tracing::warn!(node, %addr, id, error = %f.message, "node did not answer");
                node_unavailable(format!(
                    "node {node} (which holds {id}) did not answer at {addr}: {}",
                    f.message
                ))
            }
        }
    }

    /// New work: the create's `from_snapshot` names its node; otherwise the nodes in
    /// order of free capacity, the next one tried when one cannot be reached or has
    /// begun draining (in both cases the work did not start).
    async fn new_work(&self, req: Request) -> Response {
        let head = Head::of(&req);
        let body = match axum::body::to_bytes(req.into_body(), MAX_BUFFERED_BODY).await {
            Ok(b) => b,
            Err(_) => {
                return ApiError::from_status(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the body exceeds {MAX_BUFFERED_BODY} bytes (what a router forwards)"),
                )
                .made();
            }
        };
        if head.method == Method::POST
            && head.uri.path().trim_end_matches('/') == "/v1/sandboxes"
            && let Some(snapshot) = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v["from_snapshot"].as_str().map(str::to_owned))
        {
            return match route::classify("GET", &format!("/v1/snapshots/{snapshot}"), None) {
                Route::Node { node, id } => self.to_node(&node, &id, head.request(body)).await,
                _ => ApiError::not_found(format!(
                    "no snapshot {snapshot}: ids through a router name their node (NAME--…)"
                ))
                .made(),
            };
        }
        self.place(&head, body, None).await.0
    }

    /// Sends new work to the best node that takes it (`rewrite` adjusts the request for
    /// the chosen node: MCP's); the answer, and the name of the node that gave it.
    async fn place(&self, head: &Head, body: Bytes, rewrite: Option<&Rewrite>) -> (Response, Option<String>) {
        let mut tried = Vec::new();
        for addr in self.fleet.candidates() {
            let name = self
                .fleet
                .snapshot()
                .into_iter()
                .find(|(a, _)| *a == addr)
                .and_then(|(_, s)| s.node)
                .unwrap_or_default();
            self.fleet.assign(addr);
            let mut req = head.request(body.clone());
            if let Some(rewrite) = rewrite {
                rewrite(addr, &mut req);
            }
            match self.forward(addr, req).await {
                Err(f) if f.connect => {
                    tracing::warn!(node = %name, %addr, error = %f.message, "node unreachable; trying the next");
                    self.fleet.mark_down(addr, &f.message);
                    tried.push(format!("{name} did not answer ({})", f.message));
                }
                Err(f) => {
                    // The request may have run: never sent again.
                    tracing::warn!(node = %name, %addr, error = %f.message, "node failed during a request");
                    return (
                        node_unavailable(format!("node {name} failed during the request: {}", f.message)),
                        None,
                    );
                }
                Ok(resp) if resp.status() == StatusCode::SERVICE_UNAVAILABLE => {
                    let (parts, b) = resp.into_parts();
                    let said = axum::body::to_bytes(b, MAX_NODE_ANSWER).await.unwrap_or_default();
                    if error_code(&said).as_deref() == Some("shutting_down") {
                        // It began draining since the last poll; it refused before running.
                        self.fleet.mark_stopping(addr);
                        tried.push(format!("{name} is draining"));
                        continue;
                    }
                    return (Response::from_parts(parts, Body::from(said)), Some(name));
                }
                Ok(resp) => return (resp, Some(name)),
            }
        }
        let mut why = tried;
        for (addr, s) in self.fleet.snapshot() {
            let name = s.node.clone().unwrap_or_else(|| format!("{addr} (no --node)"));
            if why.iter().any(|w| w.starts_with(&format!("{name} "))) {
                continue;
            }
            if !s.up {
                why.push(format!("{name} is down"));
            } else if s.stopping {
                why.push(format!("{name} is draining"));
            } else if s.node.is_none() {
                why.push(format!("{name} has no node name"));
            }
        }
        if why.is_empty() {
            why.push("no peer resolved".into());
        }
        (
            no_node(format!("no node takes new work now: {}", why.join("; "))),
            None,
        )
    }

    /// A list every node holds part of: asked of every node that answers polls, the
    /// answers merged (arrays joined, counts added). A node that does not answer is named
    /// in the `airlock-missing-nodes` header; an error every node gives (401) is answered.
    async fn fan_out(&self, req: Request) -> Response {
        let head = Head::of(&req);
        let all = self.fleet.snapshot();
        let nodes: Vec<(SocketAddr, String)> = all
            .iter()
            .filter(|(_, s)| s.up)
            .filter_map(|(a, s)| Some((*a, s.node.clone()?)))
            .collect();
        if nodes.is_empty() {
            return no_node("no node answers now".into());
        }
        // Down nodes hold their part of the list too: named as missing.
        let mut missing: Vec<String> = all
            .into_iter()
            .filter(|(_, s)| !s.up)
            .filter_map(|(_, s)| s.node)
            .collect();
        let asks = nodes.iter().map(|(addr, name)| {
            let req = head.request(Bytes::new());
            async move {
                let answer = match self.forward(*addr, req).await {
                    Ok(resp) => {
                        let status = resp.status();
                        let (parts, b) = resp.into_parts();
                        match axum::body::to_bytes(b, MAX_NODE_ANSWER).await {
                            Ok(bytes) => Ok((status, parts.headers, bytes)),
                            Err(e) => Err(chain(&e)),
                        }
                    }
                    Err(f) => Err(f.message),
                };
                (name.clone(), answer)
            }
        });
        let answers = futures_util::future::join_all(asks).await;
        let mut merged: Option<Value> = None;
        let mut first_error = None;
        for (name, answer) in answers {
            match answer {
                Ok((status, _, bytes)) if status.is_success() => {
                    match serde_json::from_slice::<Value>(&bytes) {
                        Ok(v) => merged = Some(merge(merged.take(), v)),
                        Err(_) => missing.push(name),
                    }
                }
                Ok((status, headers, bytes)) => {
                    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                        let mut resp = Response::new(Body::from(bytes));
                        *resp.status_mut() = status;
                        *resp.headers_mut() = headers;
                        strip_hop_by_hop(resp.headers_mut());
                        return resp;
                    }
                    first_error.get_or_insert((status, headers, bytes));
                    missing.push(name);
                }
                Err(_) => missing.push(name),
            }
        }
        let Some(merged) = merged else {
            if let Some((status, headers, bytes)) = first_error {
                let mut resp = Response::new(Body::from(bytes));
                *resp.status_mut() = status;
                *resp.headers_mut() = headers;
                strip_hop_by_hop(resp.headers_mut());
                return resp;
            }
            return no_node(format!("no node answered ({})", missing.join(", ")));
        };
        let mut merged = merged;
        sort_by_creation(&mut merged);
        let mut resp = axum::Json(merged).into_response();
        missing.sort();
        missing.dedup();
        if !missing.is_empty()
            && let Ok(v) = HeaderValue::from_str(&missing.join(","))
        {
            resp.headers_mut().insert(MISSING_NODES, v);
        }
        resp
    }

    /// MCP over streamable HTTP: a session begins (`initialize`, no session header) on
    /// the node with the most free capacity, and its `Mcp-Session-Id` is handed out as
    /// `NAME--<the node's id>`; every later message goes to that node with the node's own
    /// id. The node's `Host` check (a loopback daemon's DNS-rebinding defence) sees the
    /// node's own address.
    async fn mcp(&self, req: Request) -> Response {
        let session = req
            .headers()
            .get(MCP_SESSION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let set_host = |addr: SocketAddr, req: &mut Request| {
            if let Ok(v) = HeaderValue::from_str(&addr.to_string()) {
                req.headers_mut().insert(header::HOST, v);
            }
            req.headers_mut().remove(header::ORIGIN);
        };
        let resp = match session {
            Some(session) => {
                let Some((node, local)) = route::mcp_node(&session) else {
                    return ApiError::not_found(format!(
                        "MCP session {session} was not begun through this router (its ids name their node)"
                    ))
                    .made();
                };
                let Some((addr, _)) = self.fleet.find(node) else {
                    return node_unavailable(format!(
                        "node {node} (of MCP session {session}) is not in this fleet now"
                    ));
                };
                let mut req = req;
                set_host(addr, &mut req);
                if let Ok(v) = HeaderValue::from_str(local) {
                    req.headers_mut().insert(MCP_SESSION, v);
                }
                match self.forward(addr, req).await {
                    Ok(resp) => (node.to_owned(), resp),
                    Err(f) => {
                        return node_unavailable(format!(
                            "node {node} (of MCP session {session}) did not answer: {}",
                            f.message
                        ));
                    }
                }
            }
            None => {
                let head = Head::of(&req);
                let body = match axum::body::to_bytes(req.into_body(), MAX_BUFFERED_BODY).await {
                    Ok(b) => b,
                    Err(_) => {
                        return ApiError::from_status(StatusCode::PAYLOAD_TOO_LARGE, "body too large").made();
                    }
                };
                let rewrite = move |addr: SocketAddr, req: &mut Request| set_host(addr, req);
                // The node that answered: the one whose id the session gets.
                match self.place(&head, body, Some(&rewrite)).await {
                    (resp, Some(node)) => (node, resp),
                    (resp, None) => return resp,
                }
            }
        };
        let (node, mut resp) = resp;
        if let Some(id) = resp.headers().get(MCP_SESSION).and_then(|v| v.to_str().ok())
            && let Ok(v) = HeaderValue::from_str(&airlock_server::node::qualify(Some(&node), id))
        {
            resp.headers_mut().insert(MCP_SESSION, v);
        }
        resp
    }

    /// A route any node answers alike (`/openapi.json`, an unknown route): the best node
    /// that takes work, else any that answers.
    async fn any_node(&self, req: Request) -> Response {
        let addr = self.fleet.candidates().into_iter().next().or_else(|| {
            self.fleet
                .snapshot()
                .into_iter()
                .find(|(_, s)| s.up)
                .map(|(a, _)| a)
        });
        let Some(addr) = addr else {
            return no_node("no node answers now".into());
        };
        match self.forward(addr, req).await {
            Ok(resp) => resp,
            Err(f) => node_unavailable(format!("the node at {addr} did not answer: {}", f.message)),
        }
    }
}

/// A merged list in the order a node gives its own: oldest first (`created_at`), the
/// list itself or the arrays of an object.
fn sort_by_creation(v: &mut Value) {
    let created = |x: &Value| x["created_at"].as_f64().unwrap_or(0.0);
    match v {
        Value::Array(a) => a.sort_by(|x, y| created(x).total_cmp(&created(y))),
        Value::Object(o) => {
            for a in o.values_mut().filter_map(Value::as_array_mut) {
                a.sort_by(|x, y| created(x).total_cmp(&created(y)));
            }
        }
        _ => {}
    }
}

/// Two nodes' answers to a list as one: arrays joined; objects key by key (arrays joined,
/// numbers added, the rest the first's).
fn merge(into: Option<Value>, v: Value) -> Value {
    match (into, v) {
        (None, v) => v,
        (Some(Value::Array(mut a)), Value::Array(b)) => {
            a.extend(b);
            Value::Array(a)
        }
        (Some(Value::Object(mut a)), Value::Object(b)) => {
            for (k, bv) in b {
                let merged = match a.remove(&k) {
                    None => bv,
                    Some(Value::Array(mut x)) => match bv {
                        Value::Array(y) => {
                            x.extend(y);
                            Value::Array(x)
                        }
                        _ => Value::Array(x),
                    },
                    Some(Value::Number(x)) => match (x.as_u64(), bv.as_u64()) {
                        (Some(x), Some(y)) => json!(x.saturating_add(y)),
                        _ => Value::Number(x),
                    },
                    Some(other) => other,
                };
                a.insert(k, merged);
            }
            Value::Object(a)
        }
        (Some(a), _) => a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_merge_arrays_and_add_counts() {
        let a = json!({"snapshots": [{"snapshot_id": "n1--snap-1"}], "used_bytes": 10, "budget_bytes": 100});
        let b = json!({"snapshots": [{"snapshot_id": "n2--snap-2"}], "used_bytes": 5, "budget_bytes": 100});
        assert_eq!(
            merge(Some(a), b),
            json!({"snapshots": [{"snapshot_id": "n1--snap-1"}, {"snapshot_id": "n2--snap-2"}], "used_bytes": 15, "budget_bytes": 200})
        );
        assert_eq!(merge(Some(json!([1, 2])), json!([3])), json!([1, 2, 3]));
        assert_eq!(merge(None, json!([3])), json!([3]));
        let mut v = json!([{"id": "b", "created_at": 2.0}, {"id": "a", "created_at": 1.0}]);
        sort_by_creation(&mut v);
        assert_eq!(v[0]["id"], "a");
    }

    #[test]
    fn hop_by_hop_headers_go_and_the_rest_stay() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        h.insert(header::HOST, HeaderValue::from_static("8000-n1--x.example"));
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["authorization", "host"]);
    }

    #[test]
    fn an_upgrade_is_connection_upgrade_with_an_upgrade_header() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(!is_upgrade(&h));
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        assert!(is_upgrade(&h));
    }
}
