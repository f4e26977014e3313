//! Request bodies: JSON with the API's errors (413 over the limit, 415 when not JSON,
//! 400 with the position when malformed), and raw bytes for file uploads.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::api::parse_json;
use crate::error::ApiError;
use crate::state::AppState;
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;

/// A JSON body parsed into `T`.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

/// A raw body, bounded by `--max-body`.
#[derive(Debug)]
pub struct RawBody(pub Bytes);

/// How much of an over-size body is read and dropped before the 413, and for how long:
/// a client that is still writing when the server closes gets a reset instead of the
/// answer, so the rest is drained, within bounds a client cannot stretch.
const DRAIN_BYTES: usize = 64 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(10);

async fn bytes(req: Request, state: &Arc<AppState>) -> Result<Bytes, ApiError> {
    let limit = state.config.max_body;
    let mut stream = req.into_body().into_data_stream();
    let mut body = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::malformed(format!("reading the body: {e}")))?;
        if body.len() + chunk.len() > limit {
            let mut drained = body.len() + chunk.len();
            drop(body);
            let _ = tokio::time::timeout(DRAIN_TIME, async {
                while drained <= DRAIN_BYTES
                    && let Some(Ok(chunk)) = stream.next().await
                {
                    drained += chunk.len();
                }
            })
            .await;
            return Err(ApiError::too_large(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(body))
}

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let ct = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = bytes(req, state).await?;
        if body.is_empty() && ct.is_none() {
            // An empty POST (create a sandbox with defaults) needs no content type.
            return parse_json(Some("application/json"), b"{}").map(JsonBody);
        }
        parse_json(ct.as_deref(), &body).map(JsonBody)
    }
}

impl FromRequest<Arc<AppState>> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        bytes(req, state).await.map(RawBody)
    }
}

/// Query parameters parsed into `T`; a query that does not parse (a repeated or
/// malformed parameter) is a 400 in the API's error envelope naming the parameter.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        serde_urlencoded::from_str(query).map(ApiQuery).map_err(|e| {
            let text = e.to_string();
            // serde names the parameter in backquotes (duplicate field `mode`).
            let field = text.split('`').nth(1).unwrap_or("query").to_owned();
            ApiError::invalid(field, format!("the query string does not parse: {text}"))
        })
    }
}
