//! Where a request goes, from its method, path and host alone (a create's body is looked
//! at later, for `from_snapshot`): pure functions, unit-tested below.

use airlock_server::node;

/// Where one request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// The router answers itself (`/healthz`, `/readyz`).
    Own(Own),
    /// The node named in an id (a session's or snapshot's route, a port's host).
    Node {
        /// The node's name.
        node: String,
        /// The whole id, for error messages.
        id: String,
    },
    /// An id that names no node: no node could own it (404, as a daemon answers).
    Unowned(String),
    /// New work: the node with the most free capacity (`POST /v1/exec`,
    /// `POST /v1/sandboxes`, whose `from_snapshot` may name a node instead).
    NewWork,
    /// A list every node holds part of: asked of each, merged.
    FanOut,
    /// MCP: by its session header once it has one (see `mcp_node`), else new work.
    Mcp,
    /// Anything else (`/openapi.json`, an unknown route): any node answers it the same.
    AnyNode,
}

/// The router's own routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Own {
    /// `GET /healthz`.
    Healthz,
    /// `GET /readyz`.
    Readyz,
    /// `/metrics`: each node has its own (the router answers where to scrape).
    Metrics,
}

/// The route of a request of `method` to `path`, sent to `host` (its `Host` header).
pub fn classify(method: &str, path: &str, host: Option<&str>) -> Route {
    // A port's own host (`{port}-{id}.<server>`) forwards every path, ahead of the API's
    // routes, as the daemon does.
    if let Some(id) = host.and_then(port_host_id) {
        return by_id(id);
    }
    match path {
        "/healthz" => return Route::Own(Own::Healthz),
        "/readyz" => return Route::Own(Own::Readyz),
        "/metrics" => return Route::Own(Own::Metrics),
        "/mcp" => return Route::Mcp,
        _ => {}
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method, segments.as_slice()) {
        ("POST", ["v1", "exec"]) | ("POST", ["v1", "sandboxes"]) => Route::NewWork,
        ("GET", ["v1", "sandboxes"]) | ("GET", ["v1", "snapshots"]) => Route::FanOut,
        (_, ["v1", "sandboxes", id, ..]) | (_, ["v1", "snapshots", id, ..]) if !id.is_empty() => by_id(id),
        _ => Route::AnyNode,
    }
}

/// The route of an id: its node's, or nobody's.
fn by_id(id: &str) -> Route {
    match node::split(id) {
        Some((n, _)) => Route::Node {
            node: n.to_owned(),
            id: id.to_owned(),
        },
        None => Route::Unowned(id.to_owned()),
    }
}

/// The id in a port's host name `{port}-{id}.<anything>` (a port: 1 to 5 digits), when
/// the id names a node; the daemon checks the rest.
pub fn port_host_id(host: &str) -> Option<&str> {
    let (label, rest) = host.split_once('.')?;
    if rest.is_empty() {
        return None;
    }
    let (port, id) = label.split_once('-')?;
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    node::split(id).map(|_| id)
}

/// The node an MCP session header names (`NAME--<the node's own session id>`, as the
/// router rewrote it when the session began), and the node's own id.
pub fn mcp_node(header: &str) -> Option<(&str, &str)> {
    node::split(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: &str, id: &str) -> Route {
        Route::Node {
            node: n.into(),
            id: id.into(),
        }
    }

    #[test]
    fn session_and_snapshot_routes_go_to_the_node_in_the_id() {
        let id = "n2--2ffefa68b8534ad2";
        for (method, path) in [
            ("GET", format!("/v1/sandboxes/{id}")),
            ("DELETE", format!("/v1/sandboxes/{id}")),
            ("POST", format!("/v1/sandboxes/{id}/exec")),
            ("PUT", format!("/v1/sandboxes/{id}/files")),
            ("GET", format!("/v1/sandboxes/{id}/pty")),
            ("GET", format!("/v1/sandboxes/{id}/ports/8000/index.html")),
            ("POST", format!("/v1/sandboxes/{id}/processes/p1/stdin")),
        ] {
            assert_eq!(
                classify(method, &path, Some("front:8080")),
                node("n2", id),
                "{method} {path}"
            );
        }
        let sid = "n3--snap-0123456789abcdef";
        assert_eq!(
            classify("GET", &format!("/v1/snapshots/{sid}"), None),
            node("n3", sid)
        );
        assert_eq!(
            classify("DELETE", &format!("/v1/snapshots/{sid}"), None),
            node("n3", sid)
        );
    }

    #[test]
    fn an_id_without_a_node_is_nobodys() {
        assert_eq!(
            classify("GET", "/v1/sandboxes/2ffefa68b8534ad2", None),
            Route::Unowned("2ffefa68b8534ad2".into())
        );
        assert_eq!(
            classify("GET", "/v1/snapshots/N1--x", None),
            Route::Unowned("N1--x".into())
        );
    }

    #[test]
    fn new_work_lists_and_the_routers_own_routes() {
        assert_eq!(classify("POST", "/v1/exec", None), Route::NewWork);
        assert_eq!(classify("POST", "/v1/sandboxes", None), Route::NewWork);
        assert_eq!(classify("GET", "/v1/sandboxes", None), Route::FanOut);
        assert_eq!(classify("GET", "/v1/snapshots", None), Route::FanOut);
        assert_eq!(classify("GET", "/healthz", None), Route::Own(Own::Healthz));
        assert_eq!(classify("GET", "/readyz", None), Route::Own(Own::Readyz));
        assert_eq!(classify("GET", "/metrics", None), Route::Own(Own::Metrics));
        assert_eq!(classify("POST", "/mcp", None), Route::Mcp);
        assert_eq!(classify("GET", "/openapi.json", None), Route::AnyNode);
        assert_eq!(classify("GET", "/v1/exec", None), Route::AnyNode);
    }

    #[test]
    fn a_ports_host_goes_to_its_node_whatever_the_path() {
        let id = "n1--gv-2ffefa68b8534ad2";
        assert_eq!(
            classify("GET", "/healthz", Some(&format!("8000-{id}.example:80"))),
            node("n1", id)
        );
        assert_eq!(
            classify("POST", "/v1/exec", Some(&format!("3000-{id}.localhost"))),
            node("n1", id)
        );
        // Not a port's host: the API's routes.
        for host in [
            "localhost:8080",
            "8000-2ffefa68b8534ad2.x",
            "x-n1--a.example",
            "8000-n1--a",
        ] {
            assert_eq!(classify("POST", "/v1/exec", Some(host)), Route::NewWork, "{host}");
        }
    }

    #[test]
    fn an_mcp_session_header_names_its_node() {
        assert_eq!(mcp_node("n1--0a1b-uuid"), Some(("n1", "0a1b-uuid")));
        assert_eq!(mcp_node("0a1b-uuid"), None);
    }
}
