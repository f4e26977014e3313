//! API keys: `Authorization: Bearer KEY`, compared in constant time against every key.
//! Handlers see the key's *name* (logs and metrics never carry a key). Without keys
//! configured (only allowed on loopback) every request passes as anonymous.
//!
//! Traffic for a session's exposed port (`service::ports`) also passes with that port's
//! token instead of a key: it gets a `PortGrant` for that port alone, and no key name, so
//! no other handler serves it. On a port's own host (`{port}-{id}.…`) no path is open:
//! every path there is the sandbox's.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

use crate::error::ApiError;
use crate::service::ports;
use crate::state::{AppState, KeyName};

/// Paths that answer without a key: liveness and readiness probes.
const OPEN: &[&str] = &["/healthz", "/readyz"];

pub async fn require_key(State(state): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let port_host = ports::target_by_host(req.headers(), req.uri()).is_some();
    if state.config.api_keys.is_empty() || (OPEN.contains(&req.uri().path()) && !port_host) {
        req.extensions_mut().insert(KeyName(None));
        return next.run(req).await;
    }
    let token = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .map(str::to_owned)
        .or_else(|| websocket_token(&req));
    let name = token.as_deref().and_then(|t| state.key_name(t));
    // A port's token opens that port whatever the Authorization header holds (it may be
    // the program's own, or another tenant's key).
    if let Some(grant) = ports::grant(&state, req.headers(), req.uri()) {
        req.extensions_mut().insert(grant);
        if name.is_none() {
            return next.run(req).await;
        }
    }
    match name {
        Some(name) => {
            req.extensions_mut().insert(KeyName(Some(name)));
            next.run(req).await
        }
        None => {
            state.metrics.reject("unauthorized");
            let mut e = ApiError::unauthorized();
            if ports::target(req.headers(), req.uri()).is_some() {
                e.message = format!(
                    "a valid API key (Authorization: Bearer KEY) or this port's token ({} header or ?{}=) is required",
                    ports::TOKEN_HEADER_NAME,
                    ports::TOKEN_QUERY
                );
            }
            e.into_response()
        }
    }
}

/// A WebSocket route's key from its `access_token` query parameter: browsers cannot set
/// headers on a WebSocket. Only the terminal route takes it there (a URL may be logged).
fn websocket_token(req: &Request) -> Option<String> {
    if !req.uri().path().ends_with("/pty") {
        return None;
    }
    let query = req.uri().query()?;
    serde_urlencoded::from_str::<Vec<(String, String)>>(query)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == "access_token")
        .map(|(_, v)| v)
}
