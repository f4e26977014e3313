//! `GET /openapi.json`: the API's OpenAPI document (written by hand, kept beside the
//! routes it describes).

use axum::http::header;
use axum::response::IntoResponse;

const DOCUMENT: &str = include_str!("../openapi.json");

pub async fn handle() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT)
}

#[cfg(test)]
mod tests {
    /// The document parses and describes every route the router serves.
    #[test]
    fn document_lists_every_route() {
        let doc: serde_json::Value = serde_json::from_str(super::DOCUMENT).expect("openapi.json is JSON");
        assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
        let paths = doc["paths"].as_object().expect("paths");
        for (path, methods) in [
            ("/v1/exec", &["post"][..]),
            ("/v1/sandboxes", &["post", "get"]),
            ("/v1/sandboxes/{id}", &["get", "delete"]),
            ("/v1/sandboxes/{id}/exec", &["post"]),
            ("/v1/sandboxes/{id}/files", &["get", "put"]),
            ("/healthz", &["get"]),
            ("/readyz", &["get"]),
            ("/metrics", &["get"]),
            ("/openapi.json", &["get"]),
            ("/mcp", &["post", "get", "delete"]),
        ] {
            let entry = paths.get(path).unwrap_or_else(|| panic!("{path} missing"));
            for m in methods {
                assert!(entry.get(*m).is_some(), "{m} {path} missing");
            }
        }
    }
}
