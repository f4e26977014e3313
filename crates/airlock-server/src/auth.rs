//! API keys: `Authorization: Bearer KEY`, compared in constant time against every key.
//! Handlers see the key's *name* (logs and metrics never carry a key). Without keys
//! configured (only allowed on loopback) every request passes as anonymous.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

use crate::error::ApiError;
use crate::state::{AppState, KeyName};

/// Paths that answer without a key: liveness and readiness probes.
const OPEN: &[&str] = &["/healthz", "/readyz"];

pub async fn require_key(State(state): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    if state.config.api_keys.is_empty() || OPEN.contains(&req.uri().path()) {
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
    let token = token.as_deref();
    match token.and_then(|t| state.key_name(t)) {
        Some(name) => {
            req.extensions_mut().insert(KeyName(Some(name)));
            next.run(req).await
        }
        None => {
            state.metrics.reject("unauthorized");
            ApiError::unauthorized().into_response()
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
