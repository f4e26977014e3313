//! `GET /openapi.json`: the API's OpenAPI document (written by hand, kept beside the
//! routes it describes), served as this server is configured: without API keys no route
//! demands bearer auth (nor lists a 401), and the limits' maxima and defaults, and the
//! session TTL's, are this server's own (a value the document allows is one it accepts).

use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{Value, json};

use crate::config::ServerConfig;

const DOCUMENT: &str = include_str!("../openapi.json");

/// The document for a server configured with `config`.
pub fn document(config: &ServerConfig) -> Bytes {
    let mut doc: Value =
        serde_json::from_str(DOCUMENT).expect("openapi.json is JSON (a unit test checks it)");
    if config.api_keys.is_empty() {
        if let Some(root) = doc.as_object_mut() {
            root.remove("security");
        }
        if let Some(c) = doc["components"].as_object_mut() {
            c.remove("securitySchemes");
        }
        if let Some(paths) = doc["paths"].as_object_mut() {
            for item in paths.values_mut().filter_map(Value::as_object_mut) {
                for op in item.values_mut().filter_map(Value::as_object_mut) {
                    op.remove("security");
                    if let Some(r) = op.get_mut("responses").and_then(Value::as_object_mut) {
                        r.remove("401");
                    }
                }
            }
        }
        if let Some(d) = doc["info"]["description"].as_str() {
            doc["info"]["description"] = Value::String(format!(
                "{d} This server runs without API keys (loopback only): no route needs authorization."
            ));
        }
    }
    let (max, def) = (&config.max, &config.defaults);
    let limits = &mut doc["components"]["schemas"]["Limits"]["properties"];
    for (name, maximum, default) in [
        ("memory_bytes", json!(max.memory_bytes), json!(def.memory_bytes)),
        ("cpus", json!(max.cpus), json!(def.cpus)),
        ("pids", json!(max.pids), json!(def.pids)),
        ("timeout_ms", json!(max.timeout_ms), json!(def.timeout_ms)),
        ("disk_bytes", json!(max.disk_bytes), json!(def.disk_bytes)),
        ("output_bytes", json!(max.output_bytes), json!(def.output_bytes)),
    ] {
        limits[name]["maximum"] = maximum;
        limits[name]["default"] = default;
    }
    let ttl = &mut doc["components"]["schemas"]["CreateSandboxRequest"]["properties"]["ttl_s"];
    ttl["maximum"] = json!(config.max_ttl.as_secs());
    ttl["default"] = json!(config.default_ttl.as_secs());
    doc["components"]["schemas"]["ForkRequest"]["properties"]["count"]["maximum"] = json!(config.max_fork);
    let fork_ttl = &mut doc["components"]["schemas"]["ForkRequest"]["properties"]["ttl_s"];
    fork_ttl["maximum"] = json!(config.max_ttl.as_secs());
    fork_ttl["default"] = json!(config.default_ttl.as_secs());
    Bytes::from(serde_json::to_vec_pretty(&doc).expect("a Value serializes"))
}

pub async fn handle(document: Bytes) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], document)
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
            ("/v1/sandboxes/{id}/snapshots", &["post"]),
            ("/v1/sandboxes/{id}/fork", &["post"]),
            ("/v1/sandboxes/{id}/restore", &["post"]),
            ("/v1/sandboxes/{id}/pause", &["post"]),
            ("/v1/sandboxes/{id}/resume", &["post"]),
            ("/v1/snapshots", &["get"]),
            ("/v1/snapshots/{sid}", &["get", "delete"]),
        ] {
            let entry = paths.get(path).unwrap_or_else(|| panic!("{path} missing"));
            for m in methods {
                assert!(entry.get(*m).is_some(), "{m} {path} missing");
            }
        }
    }
}
