//! A session's ports through airlock, end to end: the real `airlock serve` (with API
//! keys) on 127.0.0.1:0, a real HTTP and WebSocket server (Python's standard library)
//! started in the session as a background process, and real HTTP/1.1 over TCP from the
//! test. One behaviour per test, each with its own daemon.
//!
//! The server in the sandbox echoes what it got (method, path, headers, body) as JSON,
//! answers `/ws` as a WebSocket that echoes text frames, `/slow` with a first line and
//! then nothing for minutes, `/missing` with its own 404 page.

mod common;
mod serverutil;

use serde_json::{Value, json};
use serverutil::{Client, Daemon, keys_file, poll};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const KEY: &str = "ports-key-0123456789abcdef0123";
const OTHER_KEY: &str = "ports-other-key-fedcba9876543210";

/// The program in the sandbox (standard library only): `python3 -c SERVER PORT`.
const SERVER: &str = r#"
import base64, hashlib, json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def echo(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode("utf-8", "replace")
        out = json.dumps({"method": self.command, "path": self.path, "body": body,
                          "headers": [[k.lower(), v] for k, v in self.headers.items()]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self):
        if self.path == "/ws":
            return self.ws()
        if self.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            self.wfile.write(b"first\n")
            self.wfile.flush()
            time.sleep(300)
            return
        if self.path == "/missing":
            out = b"<html>not here</html>"
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        self.echo()

    do_POST = do_PUT = do_DELETE = do_PATCH = echo

    def ws(self):
        key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        accept = base64.b64encode(hashlib.sha1(key.encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            op, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = int.from_bytes(self.rfile.read(2), "big")
            elif n == 127:
                n = int.from_bytes(self.rfile.read(8), "big")
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if op == 8:
                return
            reply = b"echo:" + data
            self.wfile.write(bytes([0x81, len(reply)]) + reply)
            self.wfile.flush()

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

/// A daemon with two tenants' keys, and a client with the first.
fn daemon() -> (Daemon, Client, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(dir.path(), &[("t", KEY), ("other", OTHER_KEY)]);
    let d = Daemon::start(&["--pool", "1", "--api-keys", keys.to_str().unwrap()]);
    let c = d.client_with_key(KEY);
    (d, c, dir)
}

/// Starts the echo server on `port` in session `id` as a background process and waits
/// until it listens (its socket in the sandbox's /proc/net/tcp: a program there may
/// bind but not connect, landlock's TCP rules).
fn start_server(c: &Client, id: &str, port: u16) {
    let r = c.session_exec(
        id,
        &json!({"cmd": ["python3", "-c", SERVER, port.to_string()], "background": true}),
    );
    assert_eq!(r.status, 201, "a background process: {}", r.text());
    let listening = format!("0100007F:{port:04X} 00000000:0000 0A");
    let probe = json!({"cmd": ["grep", "-q", listening, "/proc/net/tcp"]});
    let up = poll(Duration::from_secs(60), || {
        let v = c.session_exec(id, &probe).expect(200).json();
        (v["exit_code"] == 0).then_some(())
    });
    assert!(up.is_some(), "the server in the sandbox never listened on {port}");
}

/// Exposes `port` of `id`, asserting 201; the Port.
fn expose(c: &Client, id: &str, port: u16) -> Value {
    c.post_json(&format!("/v1/sandboxes/{id}/ports"), &json!({"port": port}))
        .expect(201)
        .json()
}

/// One raw HTTP/1.1 exchange with the daemon (`Connection: close` is added): status,
/// lower-cased head, body. The request's `Host` is whatever `head` says.
fn raw(d: &Daemon, head: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let req = format!(
        "{}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        head.trim_end(),
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").expect("a head");
    let head = String::from_utf8_lossy(&out[..split]).to_ascii_lowercase();
    let status = head[9..12].parse().unwrap();
    let body = out[split + 4..].to_vec();
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(&body)
    } else {
        body
    };
    (status, head, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let end = b.windows(2).position(|w| w == b"\r\n").expect("a chunk size");
        let size = usize::from_str_radix(std::str::from_utf8(&b[..end]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[end + 2..end + 2 + size]);
        b = &b[end + 4 + size..];
    }
}

/// The headers the program got, as `(name, value)` pairs.
fn got_headers(echo: &Value) -> Vec<(String, String)> {
    echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p[0].as_str().unwrap().to_owned(),
                p[1].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn got_header(echo: &Value, name: &str) -> Option<String> {
    got_headers(echo)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
}

/// No header the program got carries the key, the token, or names them.
#[track_caller]
fn assert_clean(echo: &Value, token: &str) {
    for (n, v) in got_headers(echo) {
        assert!(
            !v.contains(KEY) && !v.contains(OTHER_KEY),
            "the key reached the program: {n}: {v}"
        );
        assert!(!v.contains(token), "the token reached the program: {n}: {v}");
        assert_ne!(n, "x-airlock-port-token");
    }
    let path = echo["path"].as_str().unwrap();
    assert!(!path.contains("airlock_token") && !path.contains(token), "{path}");
}

#[test]
fn a_port_is_reachable_only_once_exposed_only_through_airlock_and_only_with_its_token_or_the_key() {
    let (d, c, _dir) = daemon();
    // A port nothing on the host listens on (bound and released here): the program in
    // the sandbox listens on the same number, in its own network.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let id = c.create_session(&json!({}));
    start_server(&c, &id, port);
    assert!(
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).is_err(),
        "the sandbox's port {port} is reachable from the host directly"
    );
    let base = format!("/v1/sandboxes/{id}/ports/{port}");

    // Not exposed: 404, saying how to expose it.
    let e = c.get(&format!("{base}/")).api_error(404);
    let how = format!("POST /v1/sandboxes/{id}/ports");
    assert!(e["message"].as_str().unwrap().contains(&how), "{e}");
    assert_eq!(
        c.get(&format!("/v1/sandboxes/{id}/ports")).expect(200).json(),
        json!({"ports": []})
    );

    let p = expose(&c, &id, port);
    let token = p["token"].as_str().unwrap().to_owned();
    assert_eq!(token.len(), 43, "{p}");
    assert!(
        token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "{p}"
    );
    assert_eq!(p["port"], port);
    assert_eq!(p["path"], format!("{base}/"));
    assert_eq!(p["host"], format!("{port}-{id}.127.0.0.1:{}", d.port));
    // Exposing it again: 200, the same token; listed.
    let again = c
        .post_json(&format!("/v1/sandboxes/{id}/ports"), &json!({"port": port}))
        .expect(200)
        .json();
    assert_eq!(again, p);
    assert_eq!(
        c.get(&format!("/v1/sandboxes/{id}/ports")).expect(200).json(),
        json!({"ports": [p]})
    );

    // With the key: method, path, query and body arrive; the key does not.
    let r = c.request(
        "POST",
        &format!("{base}/a/b?x=1&y=two"),
        &[("Content-Type", "text/plain"), ("X-App", "kept")],
        Some(b"hello"),
    );
    let v = r.expect(200).json();
    assert_eq!(
        (v["method"].as_str(), v["path"].as_str()),
        (Some("POST"), Some("/a/b?x=1&y=two"))
    );
    assert_eq!(v["body"], "hello");
    assert_eq!(
        got_header(&v, "host").as_deref(),
        Some(format!("localhost:{port}").as_str())
    );
    assert_eq!(got_header(&v, "x-app").as_deref(), Some("kept"));
    assert_eq!(got_header(&v, "authorization"), None);
    assert_clean(&v, &token);

    // With the token alone, in the header or the query; the program's own Authorization
    // passes; the token does not.
    let anon = d.client();
    let v = anon
        .request(
            "GET",
            &format!("{base}/h"),
            &[
                ("X-Airlock-Port-Token", &token),
                ("Authorization", "Basic dXNlcjpwdw=="),
            ],
            None,
        )
        .expect(200)
        .json();
    assert_eq!(v["path"], "/h");
    assert_eq!(
        got_header(&v, "authorization").as_deref(),
        Some("Basic dXNlcjpwdw==")
    );
    assert_clean(&v, &token);
    let v = anon
        .get(&format!("{base}/q?a=1&airlock_token={token}&b=2"))
        .expect(200)
        .json();
    assert_eq!(v["path"], "/q?a=1&b=2");
    assert_clean(&v, &token);
    // The terminal route's `?access_token=KEY` is taken on the terminal route only: on a
    // forwarded path that ends in /pty it is no credential (401, nothing forwarded), and
    // with the port's token it is passed on stripped of the key.
    anon.get(&format!("{base}/pty?access_token={KEY}&k=v"))
        .expect(401);
    let v = anon
        .get(&format!(
            "{base}/pty?access_token={KEY}&k=v&airlock_token={token}"
        ))
        .expect(200)
        .json();
    assert_eq!(v["path"], "/pty?k=v");
    assert_clean(&v, &token);
    // Another tenant's key with this port's token: the token opens the port; the key is
    // not passed on either.
    let v = d
        .client_with_key(OTHER_KEY)
        .request(
            "GET",
            &format!("{base}/o"),
            &[("X-Airlock-Port-Token", &token)],
            None,
        )
        .expect(200)
        .json();
    assert_clean(&v, &token);
    // The program's own errors come back as they are, not in the API's envelope.
    let r = c.get(&format!("{base}/missing")).expect(404);
    assert_eq!(r.text(), "<html>not here</html>");

    // No key, a wrong token, another tenant's key alone, the token of another port: 401
    // (or 404 for the tenant: it cannot see the session).
    anon.get(&format!("{base}/")).api_error(401);
    let wrong = format!("{}A", &token[..42]);
    let wrong = if wrong == token {
        format!("{}B", &token[..42])
    } else {
        wrong
    };
    anon.request(
        "GET",
        &format!("{base}/"),
        &[("X-Airlock-Port-Token", &wrong)],
        None,
    )
    .api_error(401);
    anon.get(&format!("{base}/?airlock_token={wrong}")).api_error(401);
    d.client_with_key(OTHER_KEY)
        .get(&format!("{base}/"))
        .api_error(404);
    let p2 = expose(&c, &id, port.wrapping_add(1).max(1));
    let other_token = p2["token"].as_str().unwrap();
    anon.request(
        "GET",
        &format!("{base}/"),
        &[("X-Airlock-Port-Token", other_token)],
        None,
    )
    .api_error(401);
    // The token opens nothing but its port's traffic.
    anon.request(
        "GET",
        &format!("/v1/sandboxes/{id}/ports"),
        &[("X-Airlock-Port-Token", &token)],
        None,
    )
    .api_error(401);
    anon.request(
        "GET",
        &format!("/v1/sandboxes/{id}"),
        &[("X-Airlock-Port-Token", &token)],
        None,
    )
    .api_error(401);

    // By host: the whole path goes, with the token or the key; API paths on that host are
    // the program's too, and /healthz there is not an open probe.
    let host = p["host"].as_str().unwrap();
    let (status, _, body) = raw(
        &d,
        &format!("GET /v1/sandboxes?z=1&airlock_token={token} HTTP/1.1\r\nHost: {host}"),
        b"",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["path"], "/v1/sandboxes?z=1");
    assert_clean(&v, &token);
    let (status, _, body) = raw(
        &d,
        &format!("PUT /x HTTP/1.1\r\nHost: {port}-{id}.example.test\r\nAuthorization: Bearer {KEY}"),
        b"data",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (v["method"].as_str(), v["body"].as_str()),
        (Some("PUT"), Some("data"))
    );
    assert_clean(&v, &token);
    let (status, _, _) = raw(&d, &format!("GET /healthz HTTP/1.1\r\nHost: {host}"), b"");
    assert_eq!(status, 401);
    // Any other host is the API's.
    let (status, _, body) = raw(
        &d,
        &format!("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{}", d.port),
        b"",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
}

/// Sends a WebSocket handshake for `/ws` over `head` (request line and Host, plus auth);
/// the open connection once the 101 came.
fn websocket(d: &Daemon, head: &str) -> BufReader<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut c = BufReader::new(s);
    let req = format!(
        "{}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        head.trim_end()
    );
    c.get_mut().write_all(req.as_bytes()).unwrap();
    let mut head = String::new();
    while !head.ends_with("\r\n\r\n") {
        assert!(c.read_line(&mut head).unwrap() > 0, "ended in the head: {head}");
    }
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    // RFC 6455's example key and its accept value, computed by the program.
    assert!(head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "{head}");
    c
}

/// Sends one masked text frame and reads the echo.
fn ws_echo(c: &mut BufReader<TcpStream>, text: &str) -> String {
    let mask = [9u8, 8, 7, 6];
    let mut f = vec![0x81, 0x80 | text.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    c.get_mut().write_all(&f).unwrap();
    let mut h = [0u8; 2];
    c.read_exact(&mut h).unwrap();
    assert_eq!(h[0], 0x81);
    let mut payload = vec![0u8; usize::from(h[1])];
    c.read_exact(&mut payload).unwrap();
    String::from_utf8(payload).unwrap()
}

/// Reads until the connection ends; panics if it is still open after `within`.
#[track_caller]
fn assert_ends(c: &mut impl Read, within: Duration, what: &str) -> Vec<u8> {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) | Err(_) if t0.elapsed() < within => return seen,
            Ok(n) if t0.elapsed() < within => seen.extend_from_slice(&buf[..n]),
            _ => panic!("{what} still open after {within:?}"),
        }
    }
}

#[test]
fn a_websocket_passes_through_by_path_and_by_host_and_unexposing_cuts_it() {
    let (d, c, _dir) = daemon();
    let id = c.create_session(&json!({}));
    start_server(&c, &id, 8765);
    let p = expose(&c, &id, 8765);
    let token = p["token"].as_str().unwrap();

    let mut by_path = websocket(
        &d,
        &format!("GET /v1/sandboxes/{id}/ports/8765/ws?airlock_token={token} HTTP/1.1\r\nHost: 127.0.0.1"),
    );
    assert_eq!(ws_echo(&mut by_path, "hello"), "echo:hello");
    assert_eq!(ws_echo(&mut by_path, "again"), "echo:again");
    let mut by_host = websocket(
        &d,
        &format!("GET /ws HTTP/1.1\r\nHost: 8765-{id}.localhost\r\nAuthorization: Bearer {KEY}"),
    );
    assert_eq!(ws_echo(&mut by_host, "host"), "echo:host");

    // Unexposed: both connections end, new traffic is a 404, the token opens nothing.
    c.delete(&format!("/v1/sandboxes/{id}/ports/8765")).expect(204);
    assert_ends(
        &mut by_path,
        Duration::from_secs(10),
        "a WebSocket of an unexposed port",
    );
    assert_ends(
        &mut by_host,
        Duration::from_secs(10),
        "a WebSocket of an unexposed port",
    );
    c.get(&format!("/v1/sandboxes/{id}/ports/8765/")).api_error(404);
    d.client()
        .get(&format!("/v1/sandboxes/{id}/ports/8765/?airlock_token={token}"))
        .api_error(401);
    c.delete(&format!("/v1/sandboxes/{id}/ports/8765")).api_error(404);
    assert_eq!(
        c.get(&format!("/v1/sandboxes/{id}/ports")).expect(200).json(),
        json!({"ports": []})
    );
    // Exposed again: a new token.
    let p2 = expose(&c, &id, 8765);
    assert_ne!(p2["token"], p["token"]);
}

#[test]
fn an_exposed_port_nothing_listens_on_is_a_502_naming_it_and_bad_ports_are_400s() {
    let (_d, c, _dir) = daemon();
    let id = c.create_session(&json!({}));
    expose(&c, &id, 8001);
    let e = c.get(&format!("/v1/sandboxes/{id}/ports/8001/")).api_error(502);
    assert!(e["message"].as_str().unwrap().contains("8001"), "{e}");

    for bad in [
        json!(0),
        json!(65536),
        json!(-1),
        json!("8000"),
        json!(1.5),
        json!(null),
    ] {
        let e = c
            .post_json(&format!("/v1/sandboxes/{id}/ports"), &json!({"port": bad}))
            .api_error(400);
        assert_eq!(e["field"], "port", "{bad}: {e}");
    }
    let e = c
        .post_json(&format!("/v1/sandboxes/{id}/ports"), &json!({}))
        .api_error(400);
    assert_eq!(e["field"], "port", "{e}");
    for bad in ["0", "65536", "abc", "-1"] {
        let e = c
            .delete(&format!("/v1/sandboxes/{id}/ports/{bad}"))
            .api_error(400);
        assert_eq!(e["field"], "port", "{bad}: {e}");
        let e = c.get(&format!("/v1/sandboxes/{id}/ports/{bad}/x")).api_error(400);
        assert_eq!(e["field"], "port", "{bad}: {e}");
    }
    // An unknown session: 404 on every route.
    c.post_json("/v1/sandboxes/0123456789abcdef/ports", &json!({"port": 80}))
        .api_error(404);
    c.get("/v1/sandboxes/0123456789abcdef/ports").api_error(404);
    c.get("/v1/sandboxes/0123456789abcdef/ports/80/").api_error(404);
}

#[test]
fn deleting_the_session_ends_its_streams_and_leaves_no_route() {
    let (d, c, _dir) = daemon();
    let id = c.create_session(&json!({}));
    start_server(&c, &id, 8080);
    let p = expose(&c, &id, 8080);
    let token = p["token"].as_str().unwrap();

    // A response that streams its first line and then nothing for minutes.
    let mut s = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET /v1/sandboxes/{id}/ports/8080/slow HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut seen = String::new();
    while !seen.contains("first") {
        assert!(r.read_line(&mut seen).unwrap() > 0, "{seen}");
    }
    let mut ws = websocket(
        &d,
        &format!("GET /ws HTTP/1.1\r\nHost: 8080-{id}.localhost\r\nX-Airlock-Port-Token: {token}"),
    );
    assert_eq!(ws_echo(&mut ws, "x"), "echo:x");

    c.delete(&format!("/v1/sandboxes/{id}")).expect(204);
    let rest = assert_ends(&mut r, Duration::from_secs(10), "a stream of a deleted session");
    assert!(rest.len() < 1_000_000, "the stream completed");
    assert_ends(
        &mut ws,
        Duration::from_secs(10),
        "a WebSocket of a deleted session",
    );

    c.get(&format!("/v1/sandboxes/{id}/ports/8080/")).api_error(404);
    c.get(&format!("/v1/sandboxes/{id}/ports")).api_error(404);
    d.client()
        .get(&format!("/v1/sandboxes/{id}/ports/8080/?airlock_token={token}"))
        .api_error(401);
    let (status, _, _) = raw(
        &d,
        &format!("GET / HTTP/1.1\r\nHost: 8080-{id}.localhost\r\nX-Airlock-Port-Token: {token}"),
        b"",
    );
    assert_eq!(status, 401);
    let (status, _, _) = raw(
        &d,
        &format!("GET / HTTP/1.1\r\nHost: 8080-{id}.localhost\r\nAuthorization: Bearer {KEY}"),
        b"",
    );
    assert_eq!(status, 404);
}
