//! One file per route; `router` wires them with the auth layer.

mod exec;
pub(crate) mod files;
mod health;
mod mcp;
mod metrics;
mod openapi;
pub(crate) mod sandbox_exec;
pub(crate) mod sandboxes;

use axum::Router;
use axum::routing::{any_service, get, post};
use std::net::SocketAddr;
use std::sync::Arc;

use crate::auth;
use crate::state::AppState;

/// The API's routes, for a listener on `addr`.
pub fn router(state: Arc<AppState>, addr: SocketAddr) -> Router {
    let mcp = mcp::service(Arc::clone(&state), addr);
    Router::new()
        .route("/v1/exec", post(exec::handle))
        .route("/v1/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route(
            "/v1/sandboxes/{id}",
            axum::routing::delete(sandboxes::delete).get(sandboxes::show),
        )
        .route("/v1/sandboxes/{id}/exec", post(sandbox_exec::handle))
        .route("/v1/sandboxes/{id}/files", get(files::get).put(files::put))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(metrics::handle))
        .route("/openapi.json", get(openapi::handle))
        .route(
            "/mcp",
            any_service(mcp).layer(axum::middleware::from_fn_with_state(addr, mcp::loopback_only)),
        )
        .fallback(|| async { crate::error::ApiError::not_found("no such route") })
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            auth::require_key,
        ))
        .with_state(state)
}

/// Whether the client asked for a Server-Sent Events stream.
pub(crate) fn wants_stream(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}
