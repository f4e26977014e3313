//! `GET /openapi.json`: the API's OpenAPI document (written by hand, kept beside the
//! routes it describes).

use axum::http::header;
use axum::response::IntoResponse;

const DOCUMENT: &str = include_str!("../openapi.json");

pub async fn handle() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT)
}
