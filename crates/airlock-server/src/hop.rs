//! The headers of one HTTP hop, which a proxy must not pass on: used where airlock relays
//! HTTP, the daemon's port previews (service/ports.rs) and the fleet router
//! (airlock-router).

use axum::http::{HeaderMap, HeaderName, header};

/// Hop-by-hop headers (RFC 9110 7.6.1): they describe one connection, not the message.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes hop-by-hop headers and those the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(*name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_go() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("connection", "keep-alive, x-secret-hop"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("x-secret-hop", "1"),
            ("te", "trailers"),
            ("x-kept", "yes"),
        ] {
            h.insert(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h.get("x-kept").unwrap(), "yes");
    }
}
