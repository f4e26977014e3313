//! One file per route; `router` wires them with the auth layer.

mod code;
mod exec;
pub(crate) mod files;
mod health;
mod mcp;
mod metrics;
mod network;
mod openapi;
mod ports;
mod processes;
mod pty;
pub(crate) mod sandbox_exec;
pub(crate) mod sandboxes;
mod snapshots;

use axum::Router;
use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any_service, get, post};
use std::net::SocketAddr;
use std::sync::Arc;

use crate::auth;
use crate::state::AppState;

/// The API's routes, for a listener on `addr`.
pub fn router(state: Arc<AppState>, addr: SocketAddr) -> Router {
    let mcp = mcp::service(Arc::clone(&state), addr);
    let document = openapi::document(&state.config);
    Router::new()
        .route("/v1/exec", post(exec::handle))
        .route("/v1/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route(
            "/v1/sandboxes/{id}",
            axum::routing::delete(sandboxes::delete).get(sandboxes::show),
        )
        .route("/v1/sandboxes/{id}/exec", post(sandbox_exec::handle))
        .route("/v1/sandboxes/{id}/files", get(files::get).put(files::put))
        .route(
            "/v1/sandboxes/{id}/network",
            get(network::show).patch(network::update),
        )
        .route("/v1/sandboxes/{id}/code", post(code::run))
        .route("/v1/sandboxes/{id}/code/restart", post(code::restart))
        .route("/v1/sandboxes/{id}/pty", get(pty::handle))
        .route("/v1/sandboxes/{id}/processes", get(processes::list))
        .route("/v1/sandboxes/{id}/processes/{process}", get(processes::show))
        .route(
            "/v1/sandboxes/{id}/processes/{process}/output",
            get(processes::output),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{process}/stdin",
            post(processes::stdin),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{process}/signal",
            post(processes::signal),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{process}/wait",
            post(processes::wait),
        )
        .route("/v1/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/v1/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/v1/sandboxes/{id}/restore", post(snapshots::restore))
        .route("/v1/sandboxes/{id}/pause", post(snapshots::pause))
        .route("/v1/sandboxes/{id}/resume", post(snapshots::resume))
        .route("/v1/snapshots", get(snapshots::list))
        .route(
            "/v1/snapshots/{sid}",
            get(snapshots::show).delete(snapshots::delete),
        )
        .route("/v1/sandboxes/{id}/approvals", get(network::approvals))
        .route("/v1/sandboxes/{id}/approvals/{approval}", post(network::decide))
        .route("/v1/sandboxes/{id}/ports", post(ports::expose).get(ports::list))
        .route(
            "/v1/sandboxes/{id}/ports/{port}",
            axum::routing::delete(ports::unexpose),
        )
        .route(
            "/v1/sandboxes/{id}/ports/{port}/",
            axum::routing::any(ports::forward),
        )
        .route(
            "/v1/sandboxes/{id}/ports/{port}/{*rest}",
            axum::routing::any(ports::forward),
        )
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(metrics::handle))
        .route("/openapi.json", get(move || openapi::handle(document.clone())))
        .route(
            "/mcp",
            any_service(mcp)
                .layer(axum::middleware::from_fn_with_state(
                    state.config.max_body,
                    mcp::jsonrpc_guard,
                ))
                .layer(axum::middleware::from_fn_with_state(addr, mcp::loopback_only)),
        )
        .fallback(|| async { crate::error::ApiError::not_found("no such route") })
        // A port's own host ({port}-{id}.…) is forwarded whole, ahead of every route.
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            ports::by_host,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            auth::require_key,
        ))
        .layer(axum::middleware::from_fn(envelope))
        .with_state(state)
}

/// Every error status answers the API's error envelope: what the framework answers by
/// itself (405 with an empty body, a path that does not decode) is rewritten here, its
/// headers (`Allow`) kept. `/mcp` answers JSON-RPC errors of its own (see `mcp.rs`).
async fn envelope(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let resp = next.run(req).await;
    // A program's own answer, forwarded from a session's port, is left as it is.
    if resp
        .extensions()
        .get::<crate::service::ports::Forwarded>()
        .is_some()
    {
        return resp;
    }
    let status = resp.status();
    if path == "/mcp" || !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let said = axum::body::to_bytes(body, 64 << 10).await.unwrap_or_default();
    let said = String::from_utf8_lossy(&said).trim().to_owned();
    let message = if status == axum::http::StatusCode::METHOD_NOT_ALLOWED {
        // The router adds the Allow header after this layer.
        format!("{method} is not allowed on {path} (the Allow header lists the methods that are)")
    } else if said.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        said
    };
    let mut out = crate::error::ApiError::from_status(status, message).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name, value.clone());
        }
    }
    out
}

/// Whether the client asked for a Server-Sent Events stream.
pub(crate) fn wants_stream(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}
