//! `/mcp`: the MCP tools over streamable HTTP (rmcp's service, mounted here), behind the
//! same API-key layer as every route, plus the DNS-rebinding defence a loopback listener
//! needs: a web page's script can reach 127.0.0.1 under a name its own DNS points there,
//! so on loopback only a loopback `Host` (with our port) and a loopback `Origin` pass.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::mcp::AirlockMcp;
use crate::state::AppState;
use crate::stop::stopped;

/// After the last tool call returned, how long its answer gets to reach the client's
/// event stream (an in-process hop) before closing the sessions ends those streams.
const ANSWER_FLUSH: Duration = Duration::from_millis(250);

/// Host names a loopback listener answers to.
const LOOPBACK_NAMES: &[&str] = &["localhost", "127.0.0.1", "[::1]"];

/// The MCP service for `state`, listening on `addr`.
pub fn service(
    state: Arc<AppState>,
    addr: SocketAddr,
) -> StreamableHttpService<AirlockMcp, LocalSessionManager> {
    let server = AirlockMcp::new(Arc::clone(&state));
    let closing = CancellationToken::new();
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(closing.clone())
        .with_max_request_body_bytes(state.config.max_body);
    if !addr.ip().is_loopback() {
        // Reachable under names of the operator's choosing; API keys guard it instead.
        config = config.disable_allowed_hosts();
    }
    // At shutdown, MCP sessions (and their open event streams, which would hold the HTTP
    // server's graceful shutdown) end once running tool calls are done, or when the grace
    // period is over and those calls were killed anyway.
    let waiting = server.clone();
    tokio::spawn(async move {
        stopped(&mut state.stopping.subscribe()).await;
        let _ = tokio::time::timeout(state.config.grace, waiting.idle()).await;
        tokio::time::sleep(ANSWER_FLUSH).await;
        closing.cancel();
    });
    StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

/// The loopback listener's checks: 403 for a `Host` other than localhost, 127.0.0.1 or
/// [::1] with our port, or an `Origin` other than http(s) on one of those names.
pub async fn loopback_only(State(addr): State<SocketAddr>, req: Request, next: Next) -> Response {
    if addr.ip().is_loopback()
        && let Err(why) = check_loopback(req.headers(), req.uri().authority().map(|a| a.as_str()), addr)
    {
        tracing::warn!(reason = why, "refused an /mcp request (DNS rebinding defence)");
        return jsonrpc_error(
            StatusCode::FORBIDDEN,
            None,
            crate::mcp::jsonrpc::INVALID_REQUEST,
            why,
        );
    }
    next.run(req).await
}

/// A JSON-RPC error response with an HTTP status (MCP's streamable HTTP: a message the
/// server cannot accept gets an HTTP error whose body may be a JSON-RPC error without id).
fn jsonrpc_error(status: StatusCode, id: Option<serde_json::Value>, code: i64, message: &str) -> Response {
    let body = crate::mcp::jsonrpc::error(id, code, message);
    let mut resp = (status, body.to_string()).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// JSON-RPC errors for what rmcp would answer with a text body or not at all: a POST
/// whose body is not JSON (-32700), a batch, or not a JSON-RPC 2.0 message (-32600), or a
/// request whose params do not fit its method (-32602), each a 400; and every other error
/// status of `/mcp` (406, 415, 404 for an unknown session, 405, 413) gets a JSON-RPC error
/// body in place of rmcp's text. Valid messages reach rmcp untouched.
pub async fn jsonrpc_guard(State(max_body): State<usize>, req: Request, next: Next) -> Response {
    // MCP: a session id is visible ASCII (0x21-0x7E). rmcp reads any other value as no
    // session at all, which would let an `initialize` through with a header it ignored.
    if let Some(v) = req.headers().get("mcp-session-id")
        && (v.is_empty() || !v.as_bytes().iter().all(|b| (0x21..=0x7e).contains(b)))
    {
        return jsonrpc_error(
            StatusCode::BAD_REQUEST,
            None,
            crate::mcp::jsonrpc::INVALID_REQUEST,
            "Invalid Request: Mcp-Session-Id must be visible ASCII characters (0x21 to 0x7E)",
        );
    }
    let req = if req.method() == Method::POST && is_json(req.headers()) {
        let (parts, body) = req.into_parts();
        let bytes = match axum::body::to_bytes(body, max_body).await {
            Ok(b) => b,
            Err(_) => {
                let mut resp = jsonrpc_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    None,
                    crate::mcp::jsonrpc::INVALID_REQUEST,
                    &format!("the body exceeds {max_body} bytes (--max-body)"),
                );
                resp.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return resp;
            }
        };
        if let Err(e) = crate::mcp::jsonrpc::check(&bytes) {
            tracing::debug!(code = e.code, message = %e.message, "refused a malformed MCP message");
            return jsonrpc_error(StatusCode::BAD_REQUEST, e.id, e.code, &e.message);
        }
        Request::from_parts(parts, Body::from(bytes))
    } else {
        req
    };
    let resp = next.run(req).await;
    let status = resp.status();
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let said = axum::body::to_bytes(body, 64 << 10).await.unwrap_or_default();
    let said = String::from_utf8_lossy(&said).trim().to_owned();
    let code = if status.is_server_error() {
        crate::mcp::jsonrpc::INTERNAL_ERROR
    } else {
        crate::mcp::jsonrpc::INVALID_REQUEST
    };
    let mut out = jsonrpc_error(status, None, code, &said);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name, value.clone());
        }
    }
    out
}

/// Whether the request says its body is JSON (rmcp answers 415 otherwise).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("application/json")
        })
}

/// Why a request to a loopback listener on `addr` is refused, if it is.
fn check_loopback(
    headers: &HeaderMap,
    authority: Option<&str>,
    addr: SocketAddr,
) -> Result<(), &'static str> {
    let port = addr.port();
    // The listener's own address is a loopback name too (127.0.0.2, say).
    let own = match addr {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => format!("[{}]", a.ip()),
    };
    let allowed = |name: &str| name.eq_ignore_ascii_case(&own) || is_loopback_name(name);
    // HTTP/1.1 sends Host; HTTP/2 the :authority, which hyper puts in the URI.
    let host = match headers.get(header::HOST) {
        Some(v) => v.to_str().ok(),
        None => authority,
    };
    let host_ok = host.is_some_and(|h| {
        let (name, p) = split_port(h);
        allowed(name) && p.map_or(port == 80, |p| p == Some(port))
    });
    if !host_ok {
        return Err(
            "forbidden: the Host header must be localhost, 127.0.0.1 or [::1] with this server's port",
        );
    }
    for origin in headers.get_all(header::ORIGIN) {
        if !origin.to_str().is_ok_and(|o| origin_is_loopback(o, &allowed)) {
            return Err("forbidden: the Origin must be http(s)://localhost, 127.0.0.1 or [::1]");
        }
    }
    Ok(())
}

/// `name[:port]` → (name, port): `None` without a port, `Some(None)` for a bad one.
fn split_port(authority: &str) -> (&str, Option<Option<u16>>) {
    let cut = match authority.rfind(':') {
        // A bare IPv6 literal keeps its colons inside the brackets.
        Some(i) if !authority[i..].contains(']') => i,
        _ => return (authority, None),
    };
    (&authority[..cut], Some(authority[cut + 1..].parse().ok()))
}

fn is_loopback_name(name: &str) -> bool {
    LOOPBACK_NAMES.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// `http(s)://NAME[:port]`, nothing after, for a NAME `loopback` accepts.
fn origin_is_loopback(origin: &str, loopback: &dyn Fn(&str) -> bool) -> bool {
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let (name, port) = split_port(rest);
    loopback(name) && !matches!(port, Some(None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn at(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn headers(host: Option<&str>, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = host {
            h.insert(header::HOST, HeaderValue::from_str(v).unwrap());
        }
        if let Some(v) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn loopback_hosts_with_our_port_pass() {
        for host in ["127.0.0.1:8710", "localhost:8710", "LOCALHOST:8710", "[::1]:8710"] {
            assert_eq!(
                check_loopback(&headers(Some(host), None), None, at(8710)),
                Ok(()),
                "{host}"
            );
        }
        assert_eq!(
            check_loopback(&headers(Some("localhost"), None), None, at(80)),
            Ok(())
        );
        assert_eq!(
            check_loopback(&headers(None, None), Some("127.0.0.1:8710"), at(8710)),
            Ok(())
        );
        // The listener's own loopback address.
        let other: SocketAddr = "127.0.0.2:8710".parse().unwrap();
        assert_eq!(
            check_loopback(&headers(Some("127.0.0.2:8710"), None), None, other),
            Ok(())
        );
        assert!(check_loopback(&headers(Some("127.0.0.2:8710"), None), None, at(8710)).is_err());
    }

    #[test]
    fn other_hosts_and_ports_are_refused() {
        for host in [
            "evil.example:8710",
            "127.0.0.1:8711",
            "localhost",
            "127.0.0.1.nip.io:8710",
            "[::1]",
            "::1:8710",
            "localhost:x",
        ] {
            assert!(
                check_loopback(&headers(Some(host), None), None, at(8710)).is_err(),
                "{host}"
            );
        }
        assert!(check_loopback(&headers(None, None), None, at(8710)).is_err());
    }

    #[test]
    fn only_loopback_origins_pass() {
        let ok = |o: &str| check_loopback(&headers(Some("127.0.0.1:8710"), Some(o)), None, at(8710));
        for origin in [
            "http://localhost:6274",
            "http://127.0.0.1",
            "https://[::1]:3000",
            "http://127.0.0.1:8710",
        ] {
            assert_eq!(ok(origin), Ok(()), "{origin}");
        }
        for origin in [
            "http://evil.example",
            "null",
            "http://localhost.evil.example:80",
            "file://localhost",
            "http://localhost:80/path",
            "http://127.0.0.1:99999",
        ] {
            assert!(ok(origin).is_err(), "{origin}");
        }
    }
}
