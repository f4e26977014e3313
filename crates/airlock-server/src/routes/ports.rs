//! `POST /v1/sandboxes/{id}/ports` (expose a port: 201, or 200 when it already was),
//! `GET /v1/sandboxes/{id}/ports`, `DELETE /v1/sandboxes/{id}/ports/{port}`, and the
//! traffic: any method on `/v1/sandboxes/{id}/ports/{port}/{rest}`, or any request whose
//! `Host` is `{port}-{id}.<anything>` ([`by_host`], ahead of every route). The work is in
//! `service::ports`.

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::body::JsonBody;
use crate::error::ApiError;
use crate::service::ports::{self, Port, PortGrant};
use crate::state::{AppState, KeyName};

/// The body of `POST …/ports`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExposeRequest {
    /// Checked by `ports::port_of_json` (a 400 on `port` for anything but 1..=65535,
    /// and when missing).
    #[serde(default)]
    port: serde_json::Value,
}

/// What `GET …/ports` answers.
#[derive(Serialize)]
pub struct Ports {
    ports: Vec<Port>,
}

/// The host the request came to, for each port's `host`.
fn host_of(req_headers: &axum::http::HeaderMap, uri: &axum::http::Uri) -> String {
    ports::request_host(req_headers, uri).unwrap_or_else(|| "localhost".to_owned())
}

pub async fn expose(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
    uri: axum::http::Uri,
    JsonBody(body): JsonBody<ExposeRequest>,
) -> Result<(StatusCode, Json<Port>), ApiError> {
    let port = ports::port_of_json(&body.port)?;
    let session = state.session(&id, &key)?;
    let (shown, new) = ports::expose(&session, port, &host_of(&headers, &uri))?;
    let status = if new { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(shown)))
}

pub async fn list(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
    uri: axum::http::Uri,
) -> Result<Json<Ports>, ApiError> {
    let session = state.session(&id, &key)?;
    let ports = ports::list(&session, &host_of(&headers, &uri))?;
    Ok(Json(Ports { ports }))
}

pub async fn unexpose(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path((id, port)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let port = ports::parse_port(&port)?;
    let session = state.session(&id, &key)?;
    ports::unexpose(&session, port)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Forwards a request for `target`: a key's request for its own session, or a request
/// with the token of exactly this port ([`PortGrant`], set by the auth layer).
async fn forward_to(
    state: &AppState,
    key: Option<KeyName>,
    grant: Option<PortGrant>,
    target: ports::Target,
    req: Request,
) -> Response {
    let port = match ports::parse_port(&target.port) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let owner = match (grant, key) {
        (Some(g), _) if g.id == target.id && g.port == port => g.owner,
        (_, Some(key)) => key,
        // Neither: the auth layer let nothing else through; refuse, never guess.
        (_, None) => return ApiError::unauthorized().into_response(),
    };
    let session = match state.session(&target.id, &owner) {
        Ok(session) => session,
        Err(e) => return e.into_response(),
    };
    // An idle-paused session wakes for its port's traffic; one paused by request answers 409.
    if let Err(e) = session.wake().await {
        return e.into_response();
    }
    ports::forward(state, session, port, req, &target.path_and_query).await
}

/// Any method on `/v1/sandboxes/{id}/ports/{port}/` and below.
pub async fn forward(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let Some(target) = ports::target_by_path(req.uri()) else {
        return ApiError::not_found("no such route").into_response();
    };
    let key = req.extensions().get::<KeyName>().cloned();
    let grant = req.extensions().get::<PortGrant>().cloned();
    forward_to(&state, key, grant, target, req).await
}

/// Ahead of every route: a request whose `Host` is a port's own host
/// (`{port}-{id}.<anything>`) is forwarded whole; any other goes on to the API.
pub async fn by_host(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(target) = ports::target_by_host(req.headers(), req.uri()) else {
        return next.run(req).await;
    };
    let key = req.extensions().get::<KeyName>().cloned();
    let grant = req.extensions().get::<PortGrant>().cloned();
    forward_to(&state, key, grant, target, req).await
}

#[cfg(test)]
mod tests {
    /// The document describes the ports routes and their schemas.
    #[test]
    fn the_document_describes_the_ports_routes() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../openapi.json")).expect("openapi.json is JSON");
        let paths = &doc["paths"];
        for (path, methods) in [
            ("/v1/sandboxes/{id}/ports", &["post", "get"][..]),
            ("/v1/sandboxes/{id}/ports/{port}", &["delete"]),
            (
                "/v1/sandboxes/{id}/ports/{port}/{path}",
                &[
                    "get", "post", "put", "patch", "delete", "head", "options", "trace",
                ],
            ),
        ] {
            for m in methods {
                assert!(paths[path][*m]["responses"].is_object(), "{m} {path} missing");
            }
        }
        let port = &doc["components"]["schemas"]["Port"]["properties"];
        for field in ["port", "token", "path", "host"] {
            assert!(port[field].is_object(), "Port.{field} missing");
        }
        assert!(doc["components"]["schemas"]["Ports"].is_object());
        let schemes = &doc["components"]["securitySchemes"];
        assert_eq!(schemes["portToken"]["name"], super::ports::TOKEN_HEADER_NAME);
        assert_eq!(schemes["portTokenQuery"]["name"], super::ports::TOKEN_QUERY);
    }
}
