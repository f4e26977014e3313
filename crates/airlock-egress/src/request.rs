//! Strict parsing of what the program sends the proxy: a `CONNECT host:port` head or an
//! absolute-form plain-HTTP request head. Anything ambiguous is a 400: the decision must
//! rest on one unambiguous target, and the upstream must see the request we judged.

use crate::policy::{parse_host, parse_port};

/// The largest request head the proxy reads (a browser's is under 8 KiB).
pub(crate) const MAX_HEAD_BYTES: usize = 16 * 1024;

/// The most header fields in a request head.
pub(crate) const MAX_HEADERS: usize = 100;

/// The largest response head relayed (some servers send many cookies).
pub(crate) const MAX_RESPONSE_HEAD_BYTES: usize = 64 * 1024;

/// The most header fields in a response head.
pub(crate) const MAX_RESPONSE_HEADERS: usize = 200;

/// Headers that describe one hop, never forwarded (with those named in `Connection`).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "upgrade",
];

/// Where a request wants to go, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Authority {
    /// The host as the program wrote it (brackets kept for IPv6).
    pub host: String,
    pub port: u16,
    /// Whether the port was written (`http://a:80/` vs `http://a/`).
    pub port_written: bool,
}

/// How the body of a message is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    /// No body.
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the sender closes the connection (responses only).
    UntilClose,
}

/// A plain-HTTP request to forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpRequest {
    pub method: String,
    pub authority: Authority,
    /// The origin-form target sent upstream: `/path?query`.
    pub path: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// The end-to-end headers to forward, in order (no Host, no hop-by-hop ones).
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Body,
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// `CONNECT host:port`: a tunnel.
    Connect(Authority),
    /// An absolute-form `http://` request.
    Http(HttpRequest),
}

/// A request refused before any decision on its target: answered with `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadRequest {
    pub status: u16,
    pub reason: String,
    /// The target, when it got that far (for the log).
    pub authority: Option<Authority>,
}

impl BadRequest {
    fn new(reason: impl Into<String>) -> BadRequest {
        BadRequest {
            status: 400,
            reason: reason.into(),
            authority: None,
        }
    }

    fn at(reason: impl Into<String>, authority: &Authority) -> BadRequest {
        BadRequest {
            status: 400,
            reason: reason.into(),
            authority: Some(authority.clone()),
        }
    }
}

/// Parses a complete request head (through the blank line).
pub(crate) fn parse_request(head: &[u8]) -> Result<Request, BadRequest> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        Ok(_) => return Err(BadRequest::new("malformed request: incomplete head")),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(BadRequest::new(format!("more than {MAX_HEADERS} header fields")));
        }
        Err(e) => return Err(BadRequest::new(format!("malformed request: {e}"))),
    }
    let (Some(method), Some(target), Some(minor_version)) = (req.method, req.path, req.version) else {
        return Err(BadRequest::new("malformed request"));
    };
    let req_headers = req.headers;

    let (authority, path) = if method == "CONNECT" {
        (parse_authority(target, None)?, None)
    } else {
        let (authority, path) = parse_absolute(target)?;
        (authority, Some(path))
    };

    // The Host header, when sent, must name the same place; the decision never uses it.
    let mut hosts = req_headers.iter().filter(|h| h.name.eq_ignore_ascii_case("host"));
    if let Some(h) = hosts.next() {
        if hosts.next().is_some() {
            return Err(BadRequest::at("more than one Host header", &authority));
        }
        let value = std::str::from_utf8(h.value)
            .map_err(|_| BadRequest::at("Host header is not ASCII", &authority))?;
        // A Host without a port means 80 for http://; for CONNECT it is accepted as is.
        let default_port = if path.is_some() { 80 } else { authority.port };
        let same = parse_authority(value, Some(default_port))
            .ok()
            .is_some_and(|host| same_place(&host, &authority, path.is_none()));
        if !same {
            return Err(BadRequest::at(
                format!(
                    "Host header {value:?} disagrees with the request target {}:{}",
                    authority.host, authority.port
                ),
                &authority,
            ));
        }
    }

    let body = body_framing(req_headers, minor_version).map_err(|e| BadRequest::at(e, &authority))?;

    let Some(path) = path else {
        return Ok(Request::Connect(authority));
    };
    let mut connection_named: Vec<String> = Vec::new();
    for h in req_headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
    {
        for token in String::from_utf8_lossy(h.value).split(',') {
            connection_named.push(token.trim().to_ascii_lowercase());
        }
    }
    let headers = req_headers
        .iter()
        .filter(|h| {
            let name = h.name.to_ascii_lowercase();
            let framing = name == "content-length" || name == "transfer-encoding";
            name != "host"
                && !HOP_BY_HOP.contains(&name.as_str())
                && (framing || !connection_named.contains(&name))
        })
        .map(|h| (h.name.to_string(), h.value.to_vec()))
        .collect();
    Ok(Request::Http(HttpRequest {
        method: method.to_string(),
        authority,
        path,
        minor_version,
        headers,
        body,
    }))
}

/// Whether a Host header names the target's place: the same host, as written up to case
/// and a trailing dot, and the same port (for CONNECT a Host without a port is accepted).
pub(crate) fn same_place(host: &Authority, target: &Authority, connect: bool) -> bool {
    let norm = |h: &str| h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase();
    norm(&host.host) == norm(&target.host) && (host.port == target.port || (connect && !host.port_written))
}

/// `host:port`, `[v6]:port`, or (with `default_port`) `host` alone. No userinfo; the
/// host must be a valid name or IP literal.
pub(crate) fn parse_authority(s: &str, default_port: Option<u16>) -> Result<Authority, BadRequest> {
    if s.contains('@') {
        return Err(BadRequest::new(format!(
            "userinfo in the target {s:?} (credentials in a URL are refused)"
        )));
    }
    if s.contains('/') {
        return Err(BadRequest::new(format!("{s:?} is not host:port")));
    }
    let (host, port) = if s.starts_with('[') {
        let end = s
            .find(']')
            .ok_or_else(|| BadRequest::new(format!("unclosed [ in {s:?}")))?;
        match &s[end + 1..] {
            "" => (&s[..=end], None),
            rest => match rest.strip_prefix(':') {
                Some(p) => (&s[..=end], Some(p)),
                None => return Err(BadRequest::new(format!("text after ] in {s:?}"))),
            },
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => {
                return Err(BadRequest::new(format!(
                    "IPv6 address without brackets in {s:?} (write [addr]:port)"
                )));
            }
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let (port, port_written) = match (port, default_port) {
        (Some(""), Some(d)) => (d, false),
        (Some(p), _) => (parse_port(p).map_err(BadRequest::new)?, true),
        (None, Some(d)) => (d, false),
        (None, None) => return Err(BadRequest::new(format!("no port in {s:?} (CONNECT host:port)"))),
    };
    parse_host(host).map_err(|why| BadRequest::new(format!("bad host: {why}")))?;
    Ok(Authority {
        host: host.to_string(),
        port,
        port_written,
    })
}

/// An absolute-form target: `http://host[:port][/path][?query]` → the authority and the
/// origin-form target to send upstream.
fn parse_absolute(target: &str) -> Result<(Authority, String), BadRequest> {
    let Some((scheme, rest)) = target.split_once("://") else {
        return Err(BadRequest::new(if target.starts_with('/') || target == "*" {
            format!("{target:?} is not a proxy request: send an absolute http:// URL, or CONNECT host:port")
        } else {
            format!("{target:?} is not an absolute http:// URL (only CONNECT takes host:port)")
        }));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "http" => {}
        "https" => {
            return Err(BadRequest::new(
                "https:// in a plain request: use CONNECT (set HTTPS_PROXY)",
            ));
        }
        other => {
            return Err(BadRequest::new(format!(
                "unsupported scheme {other:?}: only http:// requests and CONNECT"
            )));
        }
    }
    if target.contains('#') {
        return Err(BadRequest::new("fragment in the request target"));
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() {
        return Err(BadRequest::new("no host in the URL"));
    }
    let authority = parse_authority(authority, Some(80))?;
    let path = match path {
        "" => "/".to_string(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_string(),
    };
    Ok((authority, path))
}

/// How a request's body is delimited; both `Content-Length` and `Transfer-Encoding`, or
/// `Content-Length` values that disagree, are refused (request smuggling).
pub(crate) fn body_framing(headers: &[httparse::Header<'_>], minor_version: u8) -> Result<Body, String> {
    let mut length: Option<u64> = None;
    let mut codings: Vec<String> = Vec::new();
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            let value = std::str::from_utf8(h.value).map_err(|_| "invalid Content-Length")?;
            for part in value.split(',') {
                let part = part.trim();
                if part.is_empty() || part.len() > 19 || !part.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(format!("invalid Content-Length {value:?}"));
                }
                let n: u64 = part
                    .parse()
                    .map_err(|_| format!("invalid Content-Length {value:?}"))?;
                match length {
                    Some(m) if m != n => return Err("Content-Length values differ".into()),
                    _ => length = Some(n),
                }
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let value = String::from_utf8_lossy(h.value);
            codings.extend(value.split(',').map(|c| c.trim().to_ascii_lowercase()));
        }
    }
    match (length, codings.is_empty()) {
        (Some(_), false) => Err("both Content-Length and Transfer-Encoding".into()),
        (Some(n), true) => Ok(Body::Length(n)),
        (None, true) => Ok(Body::None),
        (None, false) => {
            if minor_version == 0 {
                return Err("Transfer-Encoding in an HTTP/1.0 request".into());
            }
            let chunked_last = codings.last().is_some_and(|c| c == "chunked");
            let chunked_once = codings.iter().filter(|c| *c == "chunked").count() == 1;
            if chunked_last && chunked_once && codings.iter().all(|c| !c.is_empty()) {
                Ok(Body::Chunked)
            } else {
                Err(format!(
                    "unsupported Transfer-Encoding {:?} (chunked must be last)",
                    codings.join(", ")
                ))
            }
        }
    }
}

/// The head sent upstream: origin-form request line, `Host` from the judged target,
/// the end-to-end headers, `Connection: close`.
pub(crate) fn upstream_head(req: &HttpRequest) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(format!("{} {} HTTP/1.{}\r\n", req.method, req.path, req.minor_version).as_bytes());
    let a = &req.authority;
    if a.port_written && a.port != 80 {
        out.extend_from_slice(format!("Host: {}:{}\r\n", a.host, a.port).as_bytes());
    } else {
        out.extend_from_slice(format!("Host: {}\r\n", a.host).as_bytes());
    }
    for (name, value) in &req.headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// A parsed response head, rewritten for the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Response {
    pub code: u16,
    /// The head to send the program: hop-by-hop headers dropped, `Connection: close`
    /// added to a final response.
    pub head: Vec<u8>,
    pub body: Body,
}

/// Parses a complete response head; `request_method` decides whether a body follows.
pub(crate) fn parse_response(head: &[u8], request_method: &str) -> Result<Response, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(head) {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        Ok(_) => return Err("malformed response head".into()),
        Err(e) => return Err(format!("malformed response head: {e}")),
    }
    let (Some(code), Some(minor)) = (resp.code, resp.version) else {
        return Err("malformed response head".into());
    };
    let informational = (100..200).contains(&code) && code != 101;
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut connection_named: Vec<String> = Vec::new();
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let value = String::from_utf8_lossy(h.value);
            for part in value.split(',') {
                let n: u64 = part
                    .trim()
                    .parse()
                    .map_err(|_| format!("invalid Content-Length {value:?} in the response"))?;
                match length {
                    Some(m) if m != n => return Err("Content-Length values differ in the response".into()),
                    _ => length = Some(n),
                }
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let value = String::from_utf8_lossy(h.value).to_ascii_lowercase();
            chunked = value.rsplit(',').next().is_some_and(|c| c.trim() == "chunked");
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in String::from_utf8_lossy(h.value).split(',') {
                connection_named.push(token.trim().to_ascii_lowercase());
            }
        }
    }
    let no_body = informational || code == 204 || code == 304 || request_method == "HEAD";
    let body = if no_body {
        Body::None
    } else if chunked {
        Body::Chunked
    } else if let Some(n) = length {
        Body::Length(n)
    } else {
        Body::UntilClose
    };
    let mut out = Vec::with_capacity(head.len() + 32);
    out.extend_from_slice(format!("HTTP/1.{minor} {code} ").as_bytes());
    out.extend_from_slice(resp.reason.unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for h in resp.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        let framing = name == "content-length" || name == "transfer-encoding";
        // With chunked framing a Content-Length is meaningless and only confuses.
        if HOP_BY_HOP.contains(&name.as_str())
            || (!framing && connection_named.contains(&name))
            || (chunked && name == "content-length")
        {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    if !informational {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(Response {
        code,
        head: out,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Request, BadRequest> {
        parse_request(s.as_bytes())
    }

    fn bad(s: &str) -> String {
        let e = parse(s).unwrap_err();
        assert_eq!(e.status, 400, "{s:?}");
        e.reason
    }

    fn http(s: &str) -> HttpRequest {
        match parse(s).unwrap() {
            Request::Http(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn connect_heads() {
        let a = |host: &str, port| {
            Request::Connect(Authority {
                host: host.into(),
                port,
                port_written: true,
            })
        };
        assert_eq!(
            parse("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n"),
            Ok(a("pypi.org", 443))
        );
        assert_eq!(
            parse("CONNECT pypi.org:443 HTTP/1.1\r\n\r\n"),
            Ok(a("pypi.org", 443))
        );
        assert_eq!(
            parse("CONNECT pypi.org:443 HTTP/1.0\r\nHost: PyPI.org\r\n\r\n"),
            Ok(a("pypi.org", 443))
        );
        assert_eq!(parse("CONNECT [::1]:443 HTTP/1.1\r\n\r\n"), Ok(a("[::1]", 443)));
        assert_eq!(
            parse("CONNECT 169.254.43518:80 HTTP/1.1\r\n\r\n"),
            Ok(a("169.254.43518", 80))
        );
        assert_eq!(
            parse("CONNECT [::ffff:169.254.169.254]:80 HTTP/1.1\r\n\r\n"),
            Ok(a("[::ffff:169.254.169.254]", 80))
        );
    }

    #[test]
    fn connect_heads_refused() {
        assert!(bad("CONNECT pypi.org:443 HTTP/1.1\r\nHost: evil.com:443\r\n\r\n").contains("disagrees"));
        assert!(bad("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:8443\r\n\r\n").contains("disagrees"));
        assert!(
            bad("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\nHost: pypi.org:443\r\n\r\n")
                .contains("more than one Host")
        );
        assert!(bad("CONNECT pypi.org HTTP/1.1\r\n\r\n").contains("no port"));
        assert!(bad("CONNECT ::1:443 HTTP/1.1\r\n\r\n").contains("without brackets"));
        assert!(bad("CONNECT user@pypi.org:443 HTTP/1.1\r\n\r\n").contains("userinfo"));
        assert!(bad("CONNECT pypi.org:0 HTTP/1.1\r\n\r\n").contains("port"));
        assert!(bad("CONNECT pypi.org:99999 HTTP/1.1\r\n\r\n").contains("port"));
        assert!(bad("CONNECT pypi.org:-1 HTTP/1.1\r\n\r\n").contains("port"));
        assert!(bad("CONNECT http://pypi.org:443 HTTP/1.1\r\n\r\n").contains("is not host:port"));
        assert!(bad("CONNECT pypi%2eorg:443 HTTP/1.1\r\n\r\n").contains("bad host"));
        assert!(bad("CONNECT [::1:443 HTTP/1.1\r\n\r\n").contains("unclosed"));
        assert!(
            bad("CONNECT a.b:443 HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n")
                .contains("both")
        );
    }

    #[test]
    fn absolute_form_requests() {
        let r = http(
            "GET http://Example.com/a/b?c=d HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eDp5\r\nKeep-Alive: 5\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nUser-Agent: t\r\n\r\n",
        );
        assert_eq!(r.method, "GET");
        assert_eq!(
            r.authority,
            Authority {
                host: "Example.com".into(),
                port: 80,
                port_written: false
            }
        );
        assert_eq!(r.path, "/a/b?c=d");
        assert_eq!(r.body, Body::None);
        let names: Vec<_> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["Accept", "User-Agent"]);
        let head = String::from_utf8(upstream_head(&r)).unwrap();
        assert_eq!(
            head,
            "GET /a/b?c=d HTTP/1.1\r\nHost: Example.com\r\nAccept: */*\r\nUser-Agent: t\r\nConnection: close\r\n\r\n"
        );

        let r = http("GET http://example.com:8080 HTTP/1.1\r\nHost: example.com:8080\r\n\r\n");
        assert_eq!((r.authority.port, r.path.as_str()), (8080, "/"));
        assert!(
            String::from_utf8(upstream_head(&r))
                .unwrap()
                .contains("Host: example.com:8080\r\n")
        );
        let r = http("GET http://example.com?x=1 HTTP/1.0\r\n\r\n");
        assert_eq!((r.path.as_str(), r.minor_version), ("/?x=1", 0));
        let r = http("GET HTTP://example.com:/ HTTP/1.1\r\nHost: example.com:80\r\n\r\n");
        assert_eq!(r.authority.port, 80);
        let r = http("GET http://[::ffff:a9fe:a9fe]/latest HTTP/1.1\r\n\r\n");
        assert_eq!(r.authority.host, "[::ffff:a9fe:a9fe]");
        let r =
            http("POST http://example.com/ HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5, 5\r\n\r\n");
        assert_eq!(r.body, Body::Length(5));
        let r = http(
            "POST http://example.com/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\nConnection: transfer-encoding\r\n\r\n",
        );
        assert_eq!(r.body, Body::Chunked);
        assert!(
            r.headers.iter().any(|(n, _)| n == "Transfer-Encoding"),
            "framing headers always kept"
        );
    }

    #[test]
    fn host_header_must_agree_with_the_target() {
        assert!(bad("GET http://pypi.org/ HTTP/1.1\r\nHost: evil.com\r\n\r\n").contains("disagrees"));
        assert!(bad("GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org:8080\r\n\r\n").contains("disagrees"));
        assert!(bad("GET http://pypi.org:8080/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n").contains("disagrees"));
        assert!(
            bad("GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org.evil.com\r\n\r\n").contains("disagrees")
        );
        assert!(
            bad("GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org evil.com\r\n\r\n").contains("disagrees")
        );
        assert!(bad("GET http://pypi.org/ HTTP/1.1\r\nHost: \r\n\r\n").contains("disagrees"));
        let e = parse("GET http://pypi.org/ HTTP/1.1\r\nHost: evil.com\r\n\r\n").unwrap_err();
        assert_eq!(
            e.authority.map(|a| a.host),
            Some("pypi.org".into()),
            "the log gets the target"
        );
        // Agreeing spellings.
        http("GET http://pypi.org/ HTTP/1.1\r\nHost: PYPI.ORG.\r\n\r\n");
        http("GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org:80\r\n\r\n");
    }

    #[test]
    fn strict_parsing_refuses_the_ambiguous() {
        let cases = [
            ("GET http://user@pypi.org/ HTTP/1.1\r\n\r\n", "userinfo"),
            ("GET http://user:pw@pypi.org/ HTTP/1.1\r\n\r\n", "userinfo"),
            ("GET http://evil.com\\@pypi.org/ HTTP/1.1\r\n\r\n", "userinfo"),
            ("GET http://pypi.org\\.evil.com/ HTTP/1.1\r\n\r\n", "bad host"),
            ("GET http://pypi.org%00.evil.com/ HTTP/1.1\r\n\r\n", "bad host"),
            (
                "POST http://a.example/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                "both Content-Length and Transfer-Encoding",
            ),
            (
                "POST http://a.example/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                "both Content-Length and Transfer-Encoding",
            ),
            (
                "POST http://a.example/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                "differ",
            ),
            (
                "POST http://a.example/ HTTP/1.1\r\nContent-Length: 3, 4\r\n\r\n",
                "differ",
            ),
            (
                "POST http://a.example/ HTTP/1.1\r\nContent-Length: +3\r\n\r\n",
                "invalid Content-Length",
            ),
            (
                "POST http://a.example/ HTTP/1.1\r\nContent-Length: 0x3\r\n\r\n",
                "invalid Content-Length",
            ),
            (
                "POST http://a.example/ HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
                "unsupported Transfer-Encoding",
            ),
            (
                "POST http://a.example/ HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
                "unsupported Transfer-Encoding",
            ),
            (
                "POST http://a.example/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                "HTTP/1.0",
            ),
            ("GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "not a proxy request"),
            (
                "OPTIONS * HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
                "not a proxy request",
            ),
            ("GET pypi.org:80 HTTP/1.1\r\n\r\n", "only CONNECT takes host:port"),
            (
                "connect pypi.org:443 HTTP/1.1\r\n\r\n",
                "only CONNECT takes host:port",
            ),
            ("GET https://pypi.org/ HTTP/1.1\r\n\r\n", "use CONNECT"),
            ("GET ftp://pypi.org/ HTTP/1.1\r\n\r\n", "unsupported scheme"),
            ("GET gopher://pypi.org/ HTTP/1.1\r\n\r\n", "unsupported scheme"),
            ("GET http://pypi.org/#x HTTP/1.1\r\n\r\n", "fragment"),
            ("GET http:///path HTTP/1.1\r\n\r\n", "no host"),
            ("GET http://1.2.3.4.5/ HTTP/1.1\r\n\r\n", "bad host"),
            ("GET http://é.example/ HTTP/1.1\r\n\r\n", "bad host"),
            (
                "GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nHost: a.example\r\n\r\n",
                "more than one Host",
            ),
        ];
        for (head, want) in cases {
            let reason = bad(head);
            assert!(reason.contains(want), "{head:?}: {reason}");
        }
    }

    #[test]
    fn control_characters_and_spaces_never_reach_the_decision() {
        // Raw CR, LF, NUL or spaces in the target break the request line: malformed.
        for head in [
            &b"GET http://a.example\0.evil/ HTTP/1.1\r\n\r\n"[..],
            b"GET http://a.example\r.evil/ HTTP/1.1\r\n\r\n",
            b"GET http://a b/ HTTP/1.1\r\n\r\n",
            b"CONNECT a\0b:443 HTTP/1.1\r\n\r\n",
            b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\0\r\n\r\n",
            b"GET http://a.example/ HTTP/1.1\r\nX: a\rb\r\n\r\n",
            b"GET http://a.example/ HTTP/1.1\r\nBad Name: 1\r\n\r\n",
            b"GET http://a.example/ HTTP/1.1\r\nX: 1\r\n folded\r\n\r\n",
        ] {
            let e = parse_request(head).unwrap_err();
            assert_eq!(e.status, 400, "{:?}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn too_many_headers() {
        let mut head = String::from("GET http://a.example/ HTTP/1.1\r\n");
        for i in 0..=MAX_HEADERS {
            head.push_str(&format!("X-{i}: 1\r\n"));
        }
        head.push_str("\r\n");
        assert!(bad(&head).contains("more than 100 header fields"));
    }

    #[test]
    fn response_heads_are_rewritten() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\nX-Hop: 1\r\nX-Other: 2\r\n\r\n", "GET").unwrap();
        assert_eq!((r.code, r.body), (200, Body::Length(5)));
        assert_eq!(
            String::from_utf8(r.head).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Other: 2\r\nConnection: close\r\n\r\n"
        );
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            "GET",
        )
        .unwrap();
        assert_eq!(r.body, Body::Chunked);
        assert!(!String::from_utf8_lossy(&r.head).contains("Content-Length"));
        let r = parse_response(b"HTTP/1.0 200 OK\r\n\r\n", "GET").unwrap();
        assert_eq!(r.body, Body::UntilClose);
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "HEAD").unwrap();
        assert_eq!(r.body, Body::None);
        for code in [204, 304] {
            let r = parse_response(format!("HTTP/1.1 {code} X\r\n\r\n").as_bytes(), "GET").unwrap();
            assert_eq!(r.body, Body::None);
        }
        let r = parse_response(b"HTTP/1.1 100 Continue\r\n\r\n", "POST").unwrap();
        assert_eq!(r.head, b"HTTP/1.1 100 Continue\r\n\r\n");
        let r = parse_response(
            b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/\r\nContent-Length: 0\r\n\r\n",
            "GET",
        )
        .unwrap();
        assert!(String::from_utf8_lossy(&r.head).contains("Location: http://169.254.169.254/\r\n"));
        assert!(
            parse_response(
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                "GET"
            )
            .is_err()
        );
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "GET").is_err());
        assert!(parse_response(b"garbage\r\n\r\n", "GET").is_err());
    }
}
