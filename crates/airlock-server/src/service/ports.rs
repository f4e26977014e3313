//! A session's exposed ports: `POST …/ports` gives a port a token, and traffic for it
//! (`/v1/sandboxes/{id}/ports/{port}/{rest}`, or any path on the host
//! `{port}-{id}.<anything>`) is forwarded over HTTP/1.1 to what listens on the sandbox's
//! `127.0.0.1:{port}`, on a connection its tier's [`PortConnector`] opens. Responses
//! stream back unbuffered; WebSocket (any HTTP/1.1 upgrade) passes through both ways.
//!
//! What never reaches the sandbox: an `Authorization` header that carried one of the
//! service's API keys, the port token (`X-Airlock-Port-Token`, `?airlock_token=`), and
//! hop-by-hop headers; the program sees `Host: localhost:{port}`. A connection ends when
//! its port is unexposed or its session deleted or expired.

use airlock_backend::PortConnector;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, Version, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures_util::FutureExt as _;
use futures_util::future::{BoxFuture, Shared};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use std::future::Future;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::fdio::FdStream;
use crate::hop::strip_hop_by_hop;
use crate::state::{AppState, KeyName, Session};

/// The header a port's token may come in (lower case, as `HeaderMap` keys are).
pub const TOKEN_HEADER: &str = "x-airlock-port-token";
/// The same, as the API documents it.
pub const TOKEN_HEADER_NAME: &str = "X-Airlock-Port-Token";
/// The query parameter a port's token may come in (a browser cannot set headers).
pub const TOKEN_QUERY: &str = "airlock_token";
/// Random bytes in a token: 256 bits, as much as the API keys one would guess instead.
const TOKEN_BYTES: usize = 32;
/// How long the program in the sandbox may take to answer a request's head: a server that
/// accepted the connection and never answers must not hold the request forever (504).
/// Bodies and upgraded connections stream on without a bound, as long as the port stays
/// exposed and the session lives.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a live connection checks that its port is still exposed (unexposing cuts
/// it within this). A deleted or expired session cuts it at once (its cancel fd).
const REVOKE_POLL: Duration = Duration::from_millis(250);

/// One exposed port, as the API shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Port {
    /// The port in the sandbox.
    pub port: u16,
    /// Its token: alone it opens this port and nothing else.
    pub token: String,
    /// Where to send traffic for it on this service (ends with `/`).
    pub path: String,
    /// The host name that routes to it: `{port}-{id}.` and the service's own host.
    pub host: String,
}

/// Set by the auth layer on a request that carried the right token for a session's port
/// (and no API key of that session's owner): the forwarding handlers accept it for that
/// port of that session, and nothing else does.
#[derive(Debug, Clone)]
pub struct PortGrant {
    /// The session.
    pub id: String,
    /// The port the token opens.
    pub port: u16,
    /// The session's owner, for the session lookup.
    pub owner: KeyName,
}

/// Marks a response that came from a program in a sandbox: its statuses and bodies are
/// that program's, never rewritten into the API's error envelope.
#[derive(Debug, Clone, Copy)]
pub struct Forwarded;

/// Where a forwarded request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The session.
    pub id: String,
    /// The port as written (the path form may be anything: checked by [`parse_port`]).
    pub port: String,
    /// The path and query as the program in the sandbox gets them (the token not yet
    /// removed from the query).
    pub path_and_query: String,
}

/// The port of a path segment or a JSON number: an integer in 1..=65535, else a 400 on
/// `port`.
pub fn parse_port(text: &str) -> Result<u16, ApiError> {
    text.parse::<u16>()
        .ok()
        .filter(|p| *p != 0 && !text.starts_with('+'))
        .ok_or_else(bad_port)
}

/// The port of `POST …/ports`'s body.
pub fn port_of_json(value: &serde_json::Value) -> Result<u16, ApiError> {
    // An integral float (8000.0) is an integer, as elsewhere in the API.
    let n = value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0)
            .map(|f| f as u64)
    });
    n.and_then(|n| u16::try_from(n).ok())
        .filter(|p| *p != 0)
        .ok_or_else(bad_port)
}

fn bad_port() -> ApiError {
    ApiError::invalid("port", "a TCP port: an integer from 1 to 65535")
}

/// The session id and port of a host name `{port}-{id}.<anything>` (a port's own host),
/// where `port` is 1..=65535 without leading zeros and `id` is a session's id: 16
/// lowercase hex digits, after `gv-` or `vm-` for the gVisor and micro-VM tiers, the
/// whole after `NAME--` on a daemon with a node name (`--node`).
pub fn port_host(host: &str) -> Option<(String, u16)> {
    let (label, rest) = host.split_once('.')?;
    if rest.is_empty() {
        return None;
    }
    let (port, id) = label.split_once('-')?;
    let port_ok = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && !port.starts_with('0');
    let minted = crate::node::split(id).map_or(id, |(_, local)| local);
    let hex = minted
        .strip_prefix("gv-")
        .or_else(|| minted.strip_prefix("vm-"))
        .unwrap_or(minted);
    let id_ok = hex.len() == 16 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !port_ok || !id_ok {
        return None;
    }
    let port = port.parse::<u16>().ok()?;
    Some((id.to_owned(), port))
}

/// The host a request came to: its `Host` header, or an HTTP/2 request's authority.
pub fn request_host(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| uri.authority().map(|a| a.as_str().to_owned()))
}

/// A request forwarded by its host (`{port}-{id}.<anything>`): its whole path and query go.
pub fn target_by_host(headers: &HeaderMap, uri: &Uri) -> Option<Target> {
    let (id, port) = port_host(&request_host(headers, uri)?)?;
    let path_and_query = uri.path_and_query().map_or("/", |pq| pq.as_str()).to_owned();
    Some(Target {
        id,
        port: port.to_string(),
        path_and_query,
    })
}

/// A request forwarded by its path, `/v1/sandboxes/{id}/ports/{port}/{rest}`: `/{rest}`
/// and the query go, `rest` as written (still percent-encoded).
pub fn target_by_path(uri: &Uri) -> Option<Target> {
    let rest = uri.path().strip_prefix("/v1/sandboxes/")?;
    let (id, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("ports/")?;
    let (port, rest) = rest.split_once('/')?;
    if id.is_empty() || port.is_empty() {
        return None;
    }
    let path_and_query = match uri.query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    Some(Target {
        id: id.to_owned(),
        port: port.to_owned(),
        path_and_query,
    })
}

/// Where `req` is forwarded, if it is forwarding traffic: by host first (a port's host
/// forwards every path), then by path.
pub fn target(headers: &HeaderMap, uri: &Uri) -> Option<Target> {
    target_by_host(headers, uri).or_else(|| target_by_path(uri))
}

/// `%XX` and `+` decoded (a query's key or value); invalid escapes stay as written.
fn query_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() && hex(b[i + 1]).is_some() && hex(b[i + 2]).is_some() => {
                let (hi, lo) = (hex(b[i + 1]).unwrap_or(0), hex(b[i + 2]).unwrap_or(0));
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// The token in `query` (its first `airlock_token=`) and the query without any
/// `airlock_token` parameter (`None` when nothing is left); other parameters are kept
/// byte for byte, in order.
pub fn split_token(query: &str) -> (Option<String>, Option<String>) {
    let mut token = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if query_decode(key) == TOKEN_QUERY.as_bytes() {
            if token.is_none() {
                token = Some(String::from_utf8_lossy(&query_decode(value)).into_owned());
            }
        } else {
            kept.push(pair);
        }
    }
    let kept = (!kept.is_empty()).then(|| kept.join("&"));
    (token, kept)
}

/// `path_and_query` without the token parameter nor any parameter whose value is an API
/// key (`is_key`: a key given as `?access_token=`, which the terminal route accepts, must
/// not reach the program either).
pub fn strip_secrets(path_and_query: &str, is_key: impl Fn(&str) -> bool) -> String {
    let Some((path, query)) = path_and_query.split_once('?') else {
        return path_and_query.to_owned();
    };
    let rest = split_token(query).1;
    let kept: Vec<&str> = rest
        .iter()
        .flat_map(|q| q.split('&'))
        .filter(|pair| {
            let value = pair.split_once('=').map_or("", |(_, v)| v);
            value.is_empty() || !is_key(&String::from_utf8_lossy(&query_decode(value)))
        })
        .collect();
    if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    }
}

/// The port token a request carries: the header, else the query parameter.
pub fn request_token(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    if let Some(v) = headers.get(TOKEN_HEADER) {
        return v.to_str().ok().map(|s| s.trim().to_owned());
    }
    split_token(uri.query()?).0
}

/// Whether `given` is `expected`, in constant time (for equal lengths; a token's length
/// is public: 43 characters).
pub fn token_eq(expected: &str, given: &str) -> bool {
    bool::from(expected.as_bytes().ct_eq(given.as_bytes()))
}

/// What a request carrying a port token may reach: the grant for the port of the session
/// it is traffic for, when the token is that port's. `None` for anything else (no token,
/// not forwarding traffic, unknown session or port, a wrong token).
pub fn grant(state: &AppState, headers: &HeaderMap, uri: &Uri) -> Option<PortGrant> {
    let given = request_token(headers, uri)?;
    let target = target(headers, uri)?;
    let port = parse_port(&target.port).ok()?;
    let session = state.sessions.lock().ok()?.get(&target.id).cloned()?;
    let exposed = session.exposed.lock().ok()?;
    let expected = exposed.get(&port)?;
    token_eq(expected, &given).then(|| PortGrant {
        id: target.id,
        port,
        owner: KeyName(session.key.clone()),
    })
}

/// A new token: 32 bytes from the OS's random source, base64url without padding (43
/// characters).
pub fn new_token() -> Result<String, ApiError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    let mut done = 0;
    while done < bytes.len() {
        let rest = &mut bytes[done..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes that outlives
        // the call; getrandom writes at most that many bytes into it and returns how many.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(ApiError::internal(format!("no randomness for a port token: {e}")));
        }
        done += n as usize;
    }
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

fn shown(session: &Session, port: u16, token: &str, host: &str) -> Port {
    Port {
        port,
        token: token.to_owned(),
        path: format!("/v1/sandboxes/{}/ports/{port}/", session.id),
        host: format!("{port}-{}.{host}", session.id),
    }
}

fn tier_cannot(session: &Session) -> ApiError {
    ApiError::tier_unavailable(
        session.isolation,
        format!(
            "isolation {} cannot open connections to a session's ports on this service",
            session.isolation.as_str()
        ),
    )
}

fn exposed(
    session: &Session,
) -> Result<std::sync::MutexGuard<'_, std::collections::BTreeMap<u16, String>>, ApiError> {
    session
        .exposed
        .lock()
        .map_err(|_| ApiError::internal("the exposed ports' lock is poisoned"))
}

/// Exposes `port` of `session` (answers what the API shows for it, `host` being the host
/// the request came to) and whether it is new; an exposed port keeps its token.
pub fn expose(session: &Session, port: u16, host: &str) -> Result<(Port, bool), ApiError> {
    if session.ports.is_none() {
        return Err(tier_cannot(session));
    }
    let mut map = exposed(session)?;
    if let Some(token) = map.get(&port) {
        return Ok((shown(session, port, token, host), false));
    }
    let token = new_token()?;
    let port_shown = shown(session, port, &token, host);
    map.insert(port, token);
    Ok((port_shown, true))
}

/// The exposed ports of `session`, by port.
pub fn list(session: &Session, host: &str) -> Result<Vec<Port>, ApiError> {
    Ok(exposed(session)?
        .iter()
        .map(|(port, token)| shown(session, *port, token, host))
        .collect())
}

/// Unexposes `port`: its token stops working and its live connections end. 404 when it
/// was not exposed.
pub fn unexpose(session: &Session, port: u16) -> Result<(), ApiError> {
    match exposed(session)?.remove(&port) {
        Some(_) => Ok(()),
        None => Err(not_exposed(&session.id, port)),
    }
}

fn not_exposed(id: &str, port: u16) -> ApiError {
    ApiError::not_found(format!(
        "port {port} of sandbox {id} is not exposed: expose it with POST /v1/sandboxes/{id}/ports {{\"port\": {port}}}"
    ))
}

/// Forwards `req` to `port` of `session` as `path_and_query` (the token still in it, and
/// removed here), or answers why not: 404 when the port is not exposed, 502 when nothing
/// listens on it or the connection fails, 504 when no answer's head comes within
/// [`HEAD_TIMEOUT`].
pub async fn forward(
    state: &AppState,
    session: Arc<Session>,
    port: u16,
    mut req: Request,
    path_and_query: &str,
) -> Response {
    let token = match exposed(&session).map(|m| m.get(&port).cloned()) {
        Ok(Some(token)) => token,
        Ok(None) => return not_exposed(&session.id, port).into_response(),
        Err(e) => return e.into_response(),
    };
    let Some(connector) = session.ports.clone() else {
        return tier_cannot(&session).into_response();
    };
    scrub(req.headers_mut(), |k| state.key_name(k).is_some());
    let revoked = revoked(Arc::clone(&session), port, token);
    let path_and_query = strip_secrets(path_and_query, |k| state.key_name(k).is_some());
    match proxy(connector, port, req, &path_and_query, HEAD_TIMEOUT, revoked).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

/// Removes what airlock's own: the port token's header, and `Authorization` when it
/// carries an API key (`is_key`); an `Authorization` of the program's own passes.
pub fn scrub(headers: &mut HeaderMap, is_key: impl Fn(&str) -> bool) {
    let carries_key = headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.strip_prefix("Bearer "))
        .any(|k| is_key(k.trim()));
    if carries_key {
        headers.remove(header::AUTHORIZATION);
    }
    headers.remove(TOKEN_HEADER);
}

/// Resolves once `port` of `session` is no longer exposed with `token`, or the session is
/// deleted or expired.
async fn revoked(session: Arc<Session>, port: u16, token: String) {
    // The session's cancel fd turns readable when it is purged: watched through a
    // duplicate of our own (never read).
    let cancel = session.cancel.try_clone().ok().and_then(|fd| {
        // SAFETY: `fd` is a freshly duplicated OwnedFd moved into the AsyncFd, which owns
        // it until dropped; an OwnedFd's as_raw_fd always returns the same fd.
        unsafe { tokio::io::unix::AsyncFd::register(fd) }.ok()
    });
    let still = || {
        !session.deleted()
            && Instant::now() < session.deadline
            && session
                .exposed
                .lock()
                .is_ok_and(|m| m.get(&port).is_some_and(|t| token_eq(t, &token)))
    };
    while still() {
        match &cancel {
            Some(fd) => {
                tokio::select! {
                    _ = fd.readable() => return,
                    () = tokio::time::sleep(REVOKE_POLL) => {}
                }
            }
            None => tokio::time::sleep(REVOKE_POLL).await,
        }
    }
}

/// The protocol a request asks to upgrade to (`Connection: upgrade` plus `Upgrade`).
fn upgrade_of(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(header::UPGRADE).cloned()).flatten()
}

fn bad_gateway(port: u16, what: impl std::fmt::Display) -> ApiError {
    ApiError::bad_gateway(format!("port {port} in the sandbox: {what}"))
}

/// Forwards `req` as `path_and_query` over a new connection to `port` from `connector`,
/// the connection (and an upgraded one) ending when `revoked` resolves; an answer's head
/// must come within `head_timeout` (else 504). Headers are forwarded as they are but for
/// hop-by-hop ones, and `Host` becomes `localhost:{port}`.
pub async fn proxy(
    connector: Arc<dyn PortConnector>,
    port: u16,
    mut req: Request,
    path_and_query: &str,
    head_timeout: Duration,
    revoked: impl Future<Output = ()> + Send + 'static,
) -> Result<Response, ApiError> {
    let revoked: Shared<BoxFuture<'static, ()>> = revoked.boxed().shared();
    let uri: Uri = path_and_query
        .parse()
        .map_err(|e| ApiError::invalid("path", format!("not a path to forward: {e}")))?;

    let fd = tokio::task::spawn_blocking(move || connector.connect(port))
        .await
        .map_err(|e| ApiError::internal(format!("connect task: {e}")))?
        .map_err(|e| match e {
            airlock_backend::Error::NotFound(_) => bad_gateway(port, "nothing listens on it"),
            e @ airlock_backend::Error::Unavailable { .. } => ApiError::from(e),
            e => bad_gateway(port, format_args!("cannot connect: {e}")),
        })?;
    tracing::debug!(port, fd = fd.as_raw_fd(), "forwarding");
    let io = TokioIo::new(FdStream::new(fd).map_err(|e| bad_gateway(port, e))?);
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Body>(io)
        .await
        .map_err(|e| bad_gateway(port, e))?;
    let conn_revoked = revoked.clone();
    tokio::spawn(async move {
        tokio::select! {
            r = conn.with_upgrades() => {
                if let Err(e) = r {
                    tracing::debug!(port, error = %e, "forwarded connection failed");
                }
            }
            () = conn_revoked => {}
        }
    });

    let upgrade = upgrade_of(req.headers());
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    // The answer goes back in the client's version, whatever the program speaks.
    let version = parts.version;
    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    if let Some(protocol) = &upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol.clone());
    }
    let host = HeaderValue::try_from(format!("localhost:{port}")).expect("a valid header value");
    headers.insert(header::HOST, host);
    let mut upstream = axum::http::Request::new(body);
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() = uri;
    *upstream.version_mut() = Version::HTTP_11;
    *upstream.headers_mut() = headers;

    let mut resp = match tokio::time::timeout(head_timeout, sender.send_request(upstream)).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => return Err(bad_gateway(port, format_args!("the connection failed: {e}"))),
        Err(_) => {
            return Err(ApiError::gateway_timeout(format!(
                "port {port} in the sandbox sent no answer within {:?}",
                head_timeout
            )));
        }
    };
    drop(sender);

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(bad_gateway(port, "it switched protocols unasked"));
        };
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            let (client, upstream) = match tokio::join!(client_upgrade, upstream_upgrade) {
                (Ok(c), Ok(u)) => (c, u),
                (c, u) => {
                    tracing::debug!(port, client = c.is_ok(), upstream = u.is_ok(), "upgrade failed");
                    return;
                }
            };
            let mut client = TokioIo::new(client);
            let mut upstream = TokioIo::new(upstream);
            tokio::select! {
                r = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
                    tracing::debug!(port, result = ?r, "upgraded connection ended");
                }
                () = revoked => {}
            }
        });
        let (mut parts, _) = resp.into_parts();
        parts.version = version;
        let mut out = Response::from_parts(parts, Body::empty());
        out.extensions_mut().insert(Forwarded);
        return Ok(out);
    }

    let (mut parts, body) = resp.into_parts();
    parts.version = version;
    strip_hop_by_hop(&mut parts.headers);
    let mut out = Response::from_parts(parts, Body::new(body));
    out.extensions_mut().insert(Forwarded);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::ws::{Message, WebSocketUpgrade};
    use axum::routing::{any, get};
    use std::collections::BTreeMap;
    use std::net::SocketAddr;
    use std::os::fd::OwnedFd;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpStream;
    use tokio::sync::{Notify, watch};

    #[test]
    fn a_ports_host_is_port_dash_id_dot_anything() {
        let id = "0123456789abcdef";
        assert_eq!(
            port_host(&format!("8000-{id}.localhost:8080")),
            Some((id.into(), 8000))
        );
        assert_eq!(port_host(&format!("1-{id}.a.b.example")), Some((id.into(), 1)));
        assert_eq!(port_host(&format!("65535-{id}.x")), Some((id.into(), 65535)));
        for tier in ["gv", "vm"] {
            let tiered = format!("{tier}-{id}");
            assert_eq!(port_host(&format!("8000-{tiered}.x")), Some((tiered, 8000)));
        }
        // A fleet's ids name their node first (`--node`).
        for named in [format!("n1--{id}"), format!("node-7--gv-{id}")] {
            assert_eq!(port_host(&format!("8000-{named}.x")), Some((named, 8000)));
        }
        for bad in [
            format!("80-N1--{id}.x"),
            format!("80-n1---{id}.x"),
            format!("80---{id}.x"),
        ] {
            assert_eq!(port_host(&bad), None, "{bad}");
        }
        for bad in [
            format!("80-xx-{id}.x"),
            format!("80-gv-{}.x", &id[..15]),
            format!("0-{id}.x"),
            format!("08000-{id}.x"),
            format!("65536-{id}.x"),
            format!("80-{}.x", id.to_uppercase()),
            format!("80-{}.x", &id[..15]),
            format!("80-{id}0.x"),
            format!("80-{id}"),
            format!("80-{id}."),
            format!("-{id}.x"),
            format!("x80-{id}.x"),
            "localhost:8080".into(),
            "127.0.0.1:8080".into(),
        ] {
            assert_eq!(port_host(&bad), None, "{bad}");
        }
    }

    #[test]
    fn a_forwarding_path_keeps_its_rest_as_written_and_its_query() {
        let t = |u: &str| target_by_path(&u.parse().unwrap());
        let got = t("/v1/sandboxes/abc/ports/8000/a/b%2Fc?x=1&y").unwrap();
        assert_eq!((got.id.as_str(), got.port.as_str()), ("abc", "8000"));
        assert_eq!(got.path_and_query, "/a/b%2Fc?x=1&y");
        assert_eq!(t("/v1/sandboxes/abc/ports/8000/").unwrap().path_and_query, "/");
        assert_eq!(t("/v1/sandboxes/abc/ports/nope/").unwrap().port, "nope");
        assert_eq!(t("/v1/sandboxes/abc/ports/8000"), None);
        assert_eq!(t("/v1/sandboxes/abc/ports"), None);
        assert_eq!(t("/v1/sandboxes/abc/files"), None);
        assert_eq!(t("/v1/sandboxes//ports/8000/"), None);
    }

    #[test]
    fn by_host_forwards_the_whole_path_and_normal_hosts_are_the_apis() {
        let mut h = HeaderMap::new();
        h.insert(
            header::HOST,
            HeaderValue::from_static("8000-0123456789abcdef.localhost:1"),
        );
        let uri: Uri = "/v1/sandboxes?x=1".parse().unwrap();
        let got = target(&h, &uri).unwrap();
        assert_eq!(got.path_and_query, "/v1/sandboxes?x=1");
        assert_eq!(got.port, "8000");
        h.insert(header::HOST, HeaderValue::from_static("localhost:1"));
        assert_eq!(target(&h, &uri), None);
        assert!(target(&h, &"/v1/sandboxes/0123456789abcdef/ports/80/".parse().unwrap()).is_some());
    }

    fn strip_token(path_and_query: &str) -> String {
        strip_secrets(path_and_query, |_| false)
    }

    #[test]
    fn the_token_parameter_is_taken_out_of_the_query_and_the_rest_kept() {
        assert_eq!(
            split_token("a=1&airlock_token=T0k-_&b=%20"),
            (Some("T0k-_".into()), Some("a=1&b=%20".into()))
        );
        assert_eq!(split_token("airlock%5Ftoken=T"), (Some("T".into()), None));
        assert_eq!(
            split_token("airlock_token=A&airlock_token=B"),
            (Some("A".into()), None)
        );
        assert_eq!(
            split_token("xairlock_token=1&q"),
            (None, Some("xairlock_token=1&q".into()))
        );
        assert_eq!(strip_token("/p?airlock_token=x"), "/p");
        assert_eq!(strip_token("/p?a&airlock_token=x"), "/p?a");
        assert_eq!(strip_token("/p"), "/p");
        assert_eq!(strip_token("/p?%zz=1&airlock_token"), "/p?%zz=1");
        let is_key = |k: &str| k == "the key";
        assert_eq!(
            strip_secrets("/pty?access_token=the+key&a=the%20key&b=1", is_key),
            "/pty?b=1"
        );
        assert_eq!(strip_secrets("/p?airlock_token=t&x=the", is_key), "/p?x=the");
        let mut h = HeaderMap::new();
        let uri: Uri = "/x?airlock_token=fromquery".parse().unwrap();
        assert_eq!(request_token(&h, &uri).as_deref(), Some("fromquery"));
        h.insert(TOKEN_HEADER, HeaderValue::from_static("fromheader"));
        assert_eq!(request_token(&h, &uri).as_deref(), Some("fromheader"));
    }

    #[test]
    fn ports_are_integers_from_1_to_65535() {
        assert_eq!(parse_port("8000").unwrap(), 8000);
        assert_eq!(parse_port("65535").unwrap(), 65535);
        for bad in ["0", "65536", "+80", "-1", "80a", "", "8000.0"] {
            let e = parse_port(bad).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.field.as_deref()),
                (400, Some("port")),
                "{bad}"
            );
        }
        use serde_json::json;
        assert_eq!(port_of_json(&json!(8000)).unwrap(), 8000);
        assert_eq!(port_of_json(&json!(8000.0)).unwrap(), 8000);
        for bad in [
            json!(0),
            json!(-1),
            json!(65536),
            json!(1.5),
            json!("8000"),
            json!(null),
            json!([80]),
        ] {
            let e = port_of_json(&bad).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.field.as_deref()),
                (400, Some("port")),
                "{bad}"
            );
        }
    }

    #[test]
    fn tokens_are_43_url_safe_characters_and_differ() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_eq!(a.len(), 43);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'),
            "{a}"
        );
        assert_ne!(a, b);
        assert!(token_eq(&a, &a.clone()));
        assert!(!token_eq(&a, &b));
        assert!(!token_eq(&a, &a[..42]));
    }

    #[test]
    fn the_api_key_and_the_port_token_are_scrubbed_and_the_programs_own_authorization_kept() {
        let is_key = |k: &str| k == "the-key";
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer the-key"));
        h.insert(TOKEN_HEADER, HeaderValue::from_static("tok"));
        scrub(&mut h, is_key);
        assert!(h.is_empty(), "{h:?}");
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic dXNlcjpwdw=="),
        );
        scrub(&mut h, is_key);
        assert_eq!(h.get(header::AUTHORIZATION).unwrap(), "Basic dXNlcjpwdw==");
        // Two Authorization headers, one the key: both go.
        h.append(header::AUTHORIZATION, HeaderValue::from_static("Bearer the-key"));
        scrub(&mut h, is_key);
        assert!(h.get(header::AUTHORIZATION).is_none());
    }

    // -----------------------------------------------------------------------------------
    // Forwarding for real: a real HTTP server on loopback stands for the program in the
    // sandbox; the connector opens real TCP connections to it (what a tier does inside
    // the sandbox's network); the forwarding runs behind a real axum server; the client
    // speaks raw HTTP/1.1 over TCP.
    // -----------------------------------------------------------------------------------

    /// Connects port N to a loopback address; a port it does not know has nothing
    /// listening (as a tier answers).
    #[derive(Debug)]
    struct Loopback(BTreeMap<u16, SocketAddr>);

    impl PortConnector for Loopback {
        fn connect(&self, port: u16) -> Result<OwnedFd, airlock_backend::Error> {
            let nothing = || airlock_backend::Error::NotFound(format!("nothing listens on port {port}"));
            let addr = self.0.get(&port).ok_or_else(nothing)?;
            let s = std::net::TcpStream::connect(addr).map_err(|_| nothing())?;
            Ok(OwnedFd::from(s))
        }
    }

    /// The program in the sandbox: echoes what it got, streams on cue, upgrades to an
    /// echoing WebSocket, answers its own errors, or never answers.
    async fn upstream(release: Arc<Notify>) -> SocketAddr {
        let echo = |req: Request| async move {
            let (parts, body) = req.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            let headers: BTreeMap<String, Vec<String>> = parts
                .headers
                .keys()
                .map(|k| {
                    let all = parts
                        .headers
                        .get_all(k)
                        .iter()
                        .map(|v| v.to_str().unwrap().to_owned());
                    (k.as_str().to_owned(), all.collect())
                })
                .collect();
            Json(serde_json::json!({
                "method": parts.method.as_str(),
                "uri": parts.uri.to_string(),
                "headers": headers,
                "body": String::from_utf8_lossy(&body),
            }))
        };
        use axum::Json;
        let stream = move || {
            let release = Arc::clone(&release);
            async move {
                let chunks = futures_util::stream::unfold(0, move |i| {
                    let release = Arc::clone(&release);
                    async move {
                        match i {
                            0 => Some((Ok::<_, std::io::Error>("first;".to_owned()), 1)),
                            1 => {
                                release.notified().await;
                                Some((Ok("second;".to_owned()), 2))
                            }
                            _ => None,
                        }
                    }
                });
                Body::from_stream(chunks)
            }
        };
        let ws = |up: WebSocketUpgrade| async move {
            up.on_upgrade(|mut socket| async move {
                while let Some(Ok(msg)) = socket.recv().await {
                    if let Message::Text(t) = msg
                        && socket
                            .send(Message::Text(format!("echo:{}", t.as_str()).into()))
                            .await
                            .is_err()
                    {
                        break;
                    }
                }
            })
        };
        let app = axum::Router::new()
            .route("/stream", get(stream))
            .route("/ws", get(ws))
            .route(
                "/teapot",
                get(|| async { (StatusCode::IM_A_TEAPOT, "short and stout") }),
            )
            .route("/silent", get(std::future::pending::<()>))
            .fallback(any(echo));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }

    /// The forwarding side: every request goes to `port` as its own path and query, cut
    /// when `revoke` is set.
    async fn front(connector: Arc<Loopback>, port: u16, revoke: watch::Receiver<bool>) -> SocketAddr {
        let app = axum::Router::new().fallback(any(move |req: Request| {
            let connector: Arc<dyn PortConnector> = connector.clone();
            let mut revoke = revoke.clone();
            async move {
                let pq = req.uri().path_and_query().map(|p| p.as_str().to_owned()).unwrap();
                let revoked = async move {
                    let _ = revoke.wait_for(|r| *r).await;
                };
                match proxy(connector, port, req, &pq, Duration::from_millis(500), revoked).await {
                    Ok(r) => r,
                    Err(e) => e.into_response(),
                }
            }
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }

    struct Setup {
        front: SocketAddr,
        release: Arc<Notify>,
        revoke: watch::Sender<bool>,
    }

    /// Port 8000 reaches the upstream; port 8001 has nothing listening.
    async fn setup(port: u16) -> Setup {
        let release = Arc::new(Notify::new());
        let up = upstream(Arc::clone(&release)).await;
        let connector = Arc::new(Loopback(BTreeMap::from([(8000, up)])));
        let (revoke, rx) = watch::channel(false);
        let front = front(connector, port, rx).await;
        Setup {
            front,
            release,
            revoke,
        }
    }

    /// Sends `request` (`Connection: close`), returns the status line, headers and body.
    async fn exchange(addr: SocketAddr, request: &str) -> (String, String) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
            .await
            .expect("the answer ends")
            .unwrap();
        let text = String::from_utf8_lossy(&out).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("a head");
        (head.to_owned(), body.to_owned())
    }

    fn json_body(head: &str, body: &str) -> serde_json::Value {
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            // One chunk: its size line, the data.
            body.split_once("\r\n")
                .unwrap()
                .1
                .rsplit_once("\r\n0\r\n")
                .unwrap()
                .0
                .trim_end()
        } else {
            body
        };
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    #[tokio::test]
    async fn a_request_reaches_the_program_with_its_method_path_body_and_a_local_host() {
        let s = setup(8000).await;
        let (head, body) = exchange(
            s.front,
            "PUT /a/b%2Fc?x=1&y HTTP/1.1\r\nHost: 8000-0123456789abcdef.example:9\r\nConnection: close, x-hop\r\n\
             x-hop: gone\r\nx-app: kept\r\nContent-Length: 5\r\n\r\nhello",
        )
        .await;
        let v = json_body(&head, &body);
        assert_eq!(v["method"], "PUT");
        assert_eq!(v["uri"], "/a/b%2Fc?x=1&y");
        assert_eq!(v["body"], "hello");
        assert_eq!(v["headers"]["host"], serde_json::json!(["localhost:8000"]));
        assert_eq!(v["headers"]["x-app"], serde_json::json!(["kept"]));
        assert!(v["headers"].get("x-hop").is_none(), "{v}");
        assert!(v["headers"].get("connection").is_none(), "{v}");
    }

    #[tokio::test]
    async fn a_chunked_upload_is_forwarded_whole() {
        let s = setup(8000).await;
        let (head, body) = exchange(
            s.front,
            "POST /up HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n\
             3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .await;
        assert_eq!(json_body(&head, &body)["body"], "abcde");
    }

    #[tokio::test]
    async fn the_programs_own_errors_come_back_as_they_are_and_marked_forwarded() {
        let s = setup(8000).await;
        let (head, body) = exchange(
            s.front,
            "GET /teapot HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 418"), "{head}");
        assert_eq!(body, "short and stout");
    }

    #[tokio::test]
    async fn nothing_listening_is_a_502_naming_the_port() {
        let s = setup(8001).await;
        let (head, body) = exchange(s.front, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 502"), "{head}");
        assert!(
            body.contains("bad_gateway") && body.contains("port 8001"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn a_program_that_never_answers_is_a_504_after_the_head_timeout() {
        let s = setup(8000).await;
        let t0 = Instant::now();
        let (head, body) = exchange(
            s.front,
            "GET /silent HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 504"), "{head}");
        assert!(body.contains("gateway_timeout"), "{body}");
        assert!(t0.elapsed() < Duration::from_secs(10));
    }

    async fn read_until(r: &mut (impl AsyncBufReadExt + Unpin), needle: &str) -> String {
        let mut seen = String::new();
        while !seen.contains(needle) {
            let mut line = String::new();
            let n = tokio::time::timeout(Duration::from_secs(30), r.read_line(&mut line))
                .await
                .unwrap_or_else(|_| panic!("no {needle:?} in {seen:?}"))
                .unwrap();
            assert!(n > 0, "ended before {needle:?}: {seen:?}");
            seen.push_str(&line);
        }
        seen
    }

    #[tokio::test]
    async fn a_response_streams_before_it_ends_and_revoking_cuts_it() {
        let s = setup(8000).await;
        let mut c = BufReader::new(TcpStream::connect(s.front).await.unwrap());
        c.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        // The first chunk arrives while the program still holds the second.
        read_until(&mut c, "first;").await;
        s.release.notify_one();
        read_until(&mut c, "second;").await;
        read_until(&mut c, "0\r\n").await;

        // A second stream on the same kept-alive connection, cut by the revocation: the
        // client sees its connection end without the last chunk.
        c.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        read_until(&mut c, "first;").await;
        s.revoke.send_replace(true);
        let mut rest = Vec::new();
        let ended = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest)).await;
        assert!(ended.is_ok(), "the cut stream still hangs");
        assert!(!String::from_utf8_lossy(&rest).contains("second;"), "{rest:?}");
    }

    /// One masked client text frame (RFC 6455 5.2), payload under 126 bytes.
    fn ws_text(payload: &str) -> Vec<u8> {
        let mask = [1u8, 2, 3, 4];
        let mut f = vec![0x81, 0x80 | payload.len() as u8];
        f.extend_from_slice(&mask);
        f.extend(payload.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    }

    #[tokio::test]
    async fn a_websocket_passes_both_ways_and_revoking_cuts_it() {
        let s = setup(8000).await;
        let mut c = BufReader::new(TcpStream::connect(s.front).await.unwrap());
        c.write_all(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
              Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        )
        .await
        .unwrap();
        let head = read_until(&mut c, "\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        // RFC 6455's own example key and its accept value.
        assert!(head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "{head}");
        for word in ["one", "two"] {
            c.write_all(&ws_text(word)).await.unwrap();
            let mut frame = [0u8; 2];
            c.read_exact(&mut frame).await.unwrap();
            assert_eq!(frame[0], 0x81, "a final text frame");
            let mut payload = vec![0u8; frame[1] as usize];
            c.read_exact(&mut payload).await.unwrap();
            assert_eq!(String::from_utf8(payload).unwrap(), format!("echo:{word}"));
        }
        s.revoke.send_replace(true);
        let mut rest = Vec::new();
        let ended = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest)).await;
        assert!(
            ended.is_ok(),
            "the upgraded connection still hangs after the revocation"
        );
    }
}
