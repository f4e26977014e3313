//! `/mcp`: the MCP tools over streamable HTTP (rmcp's service, mounted here), behind the
//! same API-key layer as every route, plus the DNS-rebinding defence a loopback listener
//! needs: a web page's script can reach 127.0.0.1 under a name its own DNS points there,
//! so on loopback only a loopback `Host` (with our port) and a loopback `Origin` pass.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::mcp::AirlockMcp;
use crate::state::{AppState, stopped};

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
        return (StatusCode::FORBIDDEN, why).into_response();
    }
    next.run(req).await
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
