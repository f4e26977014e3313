//! Request bodies: JSON with the API's errors (413 over the limit, 415 when not JSON,
//! 400 with the position when malformed), and raw bytes for file uploads.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use serde::de::DeserializeOwned;

use crate::api::parse_json;
use crate::error::ApiError;
use crate::state::AppState;
use std::sync::Arc;

/// A JSON body parsed into `T`.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

/// A raw body, bounded by `--max-body`.
#[derive(Debug)]
pub struct RawBody(pub Bytes);

async fn bytes(req: Request, state: &Arc<AppState>) -> Result<Bytes, ApiError> {
    let limit = state.config.max_body;
    axum::body::to_bytes(req.into_body(), limit)
        .await
        .map_err(|_| ApiError::too_large(limit))
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
