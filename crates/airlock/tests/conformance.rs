//! The API conforms to its own OpenAPI document, and MCP answers malformed messages with
//! JSON-RPC errors (issue 12, items 5, 6 and 8). End to end: the real `airlock serve` on
//! 127.0.0.1:0 over real HTTP, and the real `airlock mcp` over real pipes. One behaviour
//! per test, named after it. (schemathesis runs against the daemon too: tests/schemathesis.)

mod common;
mod serverutil;

use serde_json::{Value, json};
use serverutil::{Daemon, Resp, keys_file};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

const KEY: &str = "conformance-key-0123456789abcdef";

/// One raw HTTP/1.1 request (for what an HTTP library would not send, such as a PUT
/// without any body); returns the status and the body.
fn raw(d: &Daemon, request: &str) -> (u16, Value) {
    let mut s = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(request.replace("PORT", &d.port.to_string()).as_bytes())
        .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"));
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {text}"));
    (status, body)
}

fn post(d: &Daemon, path: &str, body: &str) -> Resp {
    d.client().request(
        "POST",
        path,
        &[("Content-Type", "application/json")],
        Some(body.as_bytes()),
    )
}

#[test]
fn a_405_answers_the_error_envelope_with_its_allow_header() {
    let d = Daemon::start(&["--pool", "0"]);
    let r = d.client().get("/v1/exec");
    let e = r.api_error(405);
    assert_eq!(e["code"], "method_not_allowed", "{e}");
    assert_eq!(r.header("allow"), Some("POST"));
    let r = d.client().request("PATCH", "/v1/sandboxes", &[], None);
    assert_eq!(r.api_error(405)["code"], "method_not_allowed");
    assert!(
        r.header("allow")
            .is_some_and(|a| a.contains("GET") && a.contains("POST"))
    );
}

#[test]
fn a_query_that_does_not_parse_answers_the_error_envelope_naming_the_parameter() {
    let d = Daemon::start(&["--pool", "0"]);
    let c = d.client();
    let id = c.create_session(&json!({}));
    for method in ["GET", "PUT"] {
        let r = c.request(
            method,
            &format!("/v1/sandboxes/{id}/files?mode=null&mode=null"),
            &[("Content-Type", "application/octet-stream")],
            Some(b"x"),
        );
        let e = r.api_error(400);
        assert_eq!(e["code"], "invalid_request", "{method}: {e}");
        assert_eq!(e["field"], "mode", "{method}: {e}");
    }
    // A path segment that does not decode is the envelope too.
    let e = c.get("/v1/sandboxes/%FF%FE").api_error(400);
    assert_eq!(e["code"], "invalid_request", "{e}");
}

#[test]
fn command_errors_name_the_requests_own_fields_cmd_cmd_0_and_code() {
    let d = Daemon::start(&["--pool", "0"]);
    for (body, field) in [
        (r#"{"cmd": []}"#, "cmd"),
        // Even with an image: its own command is asked for by leaving `cmd` out.
        (r#"{"cmd": [], "image": "tools:1"}"#, "cmd"),
        (r#"{"cmd": [""]}"#, "cmd[0]"),
        (r#"{"cmd": ["echo", "a\u0000b"]}"#, "cmd[1]"),
        (r#"{"language": "bash", "code": "echo \u0000"}"#, "code"),
    ] {
        for path in ["/v1/exec".to_owned(), {
            let id = d.client().create_session(&json!({}));
            format!("/v1/sandboxes/{id}/exec")
        }] {
            let e = post(&d, &path, body).api_error(400);
            assert_eq!(e["field"], field, "{path} {body}: {e}");
        }
    }
}

#[test]
fn integral_floats_are_accepted_where_the_schema_says_integer() {
    let d = Daemon::start(&["--pool", "0"]);
    let r = post(
        &d,
        "/v1/sandboxes",
        r#"{"ttl_s": 2998.0, "limits": {"pids": 32.0}}"#,
    )
    .expect(201);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let v = post(
        &d,
        &format!("/v1/sandboxes/{id}/exec"),
        r#"{"cmd": ["stat", "-c", "%a", "f"], "files": [{"path": "f", "content": "x", "mode": 493.0}],
            "limits": {"timeout_ms": 5000.0, "memory_bytes": 134217728.0, "output_bytes": 1024.0}}"#,
    )
    .expect(200)
    .json();
    assert_eq!(v["stdout"], "755\n", "{v}");
    // Not integral, negative, or beyond the field's range: 400 on the field.
    for (body, field) in [
        (r#"{"ttl_s": 2998.5}"#, "ttl_s"),
        (r#"{"ttl_s": -1.0}"#, "ttl_s"),
        (r#"{"limits": {"pids": 1e12}}"#, "limits.pids"),
        (r#"{"limits": {"pids": "1"}}"#, "limits.pids"),
    ] {
        let e = post(&d, "/v1/sandboxes", body).api_error(400);
        assert_eq!(e["field"], field, "{body}: {e}");
    }
}

#[test]
fn null_optional_fields_are_absent_as_documented_and_structs_come_only_from_objects() {
    let d = Daemon::start(&["--pool", "0"]);
    // `"isolation": null` and friends: absent, and the document says so.
    post(
        &d,
        "/v1/sandboxes",
        r#"{"isolation": null, "network": null, "ttl_s": null}"#,
    )
    .expect(201);
    let v = post(
        &d,
        "/v1/exec",
        r#"{"cmd": ["true"], "isolation": null, "language": null, "code": null, "stdin": null}"#,
    )
    .expect(200)
    .json();
    assert_eq!(v["exit_code"], 0, "{v}");
    let doc = d.client().get("/openapi.json").expect(200).json();
    let schemas = &doc["components"]["schemas"];
    for schema in ["ExecRequest", "CreateSandboxRequest"] {
        let types = &schemas[schema]["properties"]["isolation"]["type"];
        assert!(
            types.as_array().is_some_and(|t| t.contains(&json!("null"))),
            "{schema}.isolation: {types}"
        );
    }
    // What no schema allows is refused, naming the field.
    for (path, body, field) in [
        (
            "/v1/exec",
            r#"{"cmd": ["true"], "limits": [null, null]}"#,
            "limits",
        ),
        (
            "/v1/exec",
            r#"{"cmd": ["true"], "files": [["a", "b"]]}"#,
            "files[0]",
        ),
        ("/v1/exec", r#"[["true"]]"#, "body"),
        (
            "/v1/exec",
            r#"{"cmd": ["true"], "network": {"mode": "none", "x": 1}}"#,
            "network",
        ),
        ("/v1/sandboxes", r#"{"limits": null}"#, "limits"),
    ] {
        let e = post(&d, path, body).api_error(400);
        assert_eq!(e["field"], field, "{body}: {e}");
    }
}

#[test]
fn a_put_without_a_body_is_refused_and_an_empty_body_writes_an_empty_file() {
    let d = Daemon::start(&["--pool", "0"]);
    let c = d.client();
    let id = c.create_session(&json!({}));
    let (status, body) = raw(
        &d,
        &format!(
            "PUT /v1/sandboxes/{id}/files?path=a.txt HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\nConnection: close\r\n\r\n"
        ),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "body", "{body}");
    // Nothing was written.
    c.get(&format!("/v1/sandboxes/{id}/files?path=a.txt"))
        .api_error(404);
    // An explicit empty body writes an empty file.
    c.put(&format!("/v1/sandboxes/{id}/files?path=a.txt"), b"")
        .expect(204);
    let r = c.get(&format!("/v1/sandboxes/{id}/files?path=a.txt")).expect(200);
    assert!(r.body.is_empty());
}

#[test]
fn file_paths_with_empty_dot_or_dotdot_segments_or_overlong_names_are_a_400_on_path() {
    let d = Daemon::start(&["--pool", "0"]);
    let c = d.client();
    let id = c.create_session(&json!({}));
    let long = format!("d/{}", "é".repeat(128));
    for bad in [
        "a//b",
        "./a",
        "a/./b",
        "a/../b",
        "/etc/x",
        "",
        "/workspace/",
        &long,
    ] {
        let q: String = bad.bytes().map(|b| format!("%{b:02X}")).collect();
        let e = c
            .put(&format!("/v1/sandboxes/{id}/files?path={q}"), b"x")
            .api_error(400);
        assert_eq!(e["field"], "path", "{bad:?}: {e}");
    }
    let e = post(
        &d,
        "/v1/exec",
        r#"{"cmd": ["true"], "files": [{"path": "a//b", "content": ""}]}"#,
    )
    .api_error(400);
    assert_eq!(e["field"], "files[0].path", "{e}");
    // One file may not be the directory of another in the same request.
    let e = post(
        &d,
        "/v1/exec",
        r#"{"cmd": ["true"], "files": [{"path": "d/f", "content": ""}, {"path": "d", "content": ""}]}"#,
    )
    .api_error(400);
    assert_eq!(e["field"], "files[1].path", "{e}");
    c.put(
        &format!("/v1/sandboxes/{id}/files?path=/workspace/d/.x/..y"),
        b"x",
    )
    .expect(204);
}

#[test]
fn the_document_is_served_per_the_servers_keys_and_limits() {
    // Key-less (loopback only): no route demands bearer auth or lists a 401.
    let d = Daemon::start(&["--pool", "0", "--max-memory", "512M", "--max-ttl", "2m"]);
    let doc = d.client().get("/openapi.json").expect(200).json();
    assert!(doc.get("security").is_none(), "security: {}", doc["security"]);
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if let Some(responses) = op.get("responses") {
                assert!(responses.get("401").is_none(), "{method} {path} lists a 401");
            }
        }
    }
    let limits = &doc["components"]["schemas"]["Limits"]["properties"];
    assert_eq!(limits["memory_bytes"]["maximum"], 512 << 20);
    assert_eq!(
        doc["components"]["schemas"]["CreateSandboxRequest"]["properties"]["ttl_s"]["maximum"],
        120
    );
    // With keys: bearer auth everywhere but the probes, and the 401s.
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(dir.path(), &[("t", KEY)]);
    let d = Daemon::start(&["--pool", "0", "--api-keys", keys.to_str().unwrap()]);
    let doc = d.client_with_key(KEY).get("/openapi.json").expect(200).json();
    assert_eq!(doc["security"], json!([{"bearerAuth": []}]));
    assert!(doc["paths"]["/v1/exec"]["post"]["responses"]["401"].is_object());
    assert_eq!(doc["paths"]["/healthz"]["get"]["security"], json!([]));
}

#[test]
fn a_host_that_cannot_run_microvms_answers_503_microvm_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    // The VM state directory would be under a regular file: preparing micro-VMs fails.
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, "").unwrap();
    let state = file.join("vm");
    let d = Daemon::start_env(&["--pool", "0"], &[("AIRLOCK_VM_STATE", state.to_str().unwrap())]);
    for (path, body) in [
        ("/v1/exec", r#"{"cmd": ["true"], "isolation": "microvm"}"#),
        ("/v1/sandboxes", r#"{"isolation": "microvm"}"#),
    ] {
        let e = post(&d, path, body).api_error(503);
        assert_eq!(e["code"], "microvm_unavailable", "{path}: {e}");
    }
    // The namespaces tier still serves.
    post(&d, "/v1/exec", r#"{"cmd": ["true"]}"#).expect(200);
    let doc = d.client().get("/openapi.json").expect(200).json();
    let codes =
        doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["description"]
            .as_str()
            .unwrap();
    assert!(codes.contains("microvm_unavailable"), "{codes}");
}

fn mcp_post(d: &Daemon, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut h = vec![("Accept", "application/json, text/event-stream")];
    h.extend_from_slice(headers);
    if !headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("content-type"))
    {
        h.push(("Content-Type", "application/json"));
    }
    d.client().request("POST", "/mcp", &h, Some(body.as_bytes()))
}

/// Asserts a JSON-RPC error body with `code` (and `id`).
#[track_caller]
fn jsonrpc_error(r: &Resp, status: u16, code: i64, id: Value) {
    assert_eq!(r.status, status, "{}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("application/json")),
        "{:?}",
        r.headers
    );
    let v = r.json();
    assert_eq!(v["jsonrpc"], "2.0", "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
    assert_eq!(v["id"], id, "{v}");
}

#[test]
fn malformed_mcp_messages_over_http_get_jsonrpc_errors() {
    let d = Daemon::start(&["--pool", "0"]);
    jsonrpc_error(&mcp_post(&d, &[], "{not json"), 400, -32700, Value::Null);
    jsonrpc_error(
        &mcp_post(&d, &[], r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#),
        400,
        -32600,
        Value::Null,
    );
    jsonrpc_error(
        &mcp_post(&d, &[], r#"{"jsonrpc":"2.0","id":7}"#),
        400,
        -32600,
        json!(7),
    );
    jsonrpc_error(
        &mcp_post(&d, &[], r#"{"jsonrpc":"1.0","id":"a","method":"ping"}"#),
        400,
        -32600,
        json!("a"),
    );
    jsonrpc_error(
        &mcp_post(
            &d,
            &[],
            r#"{"jsonrpc":"2.0","id":3,"method":"initialize","params":"x"}"#,
        ),
        400,
        -32602,
        json!(3),
    );
    // The HTTP-level refusals carry a JSON-RPC body too.
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    jsonrpc_error(
        &mcp_post(&d, &[("Content-Type", "text/plain")], ping),
        415,
        -32600,
        Value::Null,
    );
    let r = d.client().request(
        "POST",
        "/mcp",
        &[("Content-Type", "application/json")],
        Some(ping.as_bytes()),
    );
    jsonrpc_error(&r, 406, -32600, Value::Null);
    jsonrpc_error(&mcp_post(&d, &[], ping), 400, -32600, Value::Null);
    jsonrpc_error(
        &mcp_post(&d, &[("Mcp-Session-Id", "no-such-session")], ping),
        404,
        -32600,
        Value::Null,
    );
    jsonrpc_error(
        &mcp_post(&d, &[("Mcp-Session-Id", "a b")], ping),
        400,
        -32600,
        Value::Null,
    );
    // Valid traffic is untouched: initialize answers, with a session.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let r = mcp_post(&d, &[], init).expect(200);
    assert!(r.header("mcp-session-id").is_some(), "{:?}", r.headers);
    assert!(r.text().contains("\"protocolVersion\""), "{}", r.text());
}

#[test]
fn malformed_mcp_lines_over_stdio_get_jsonrpc_errors() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(["mcp", "--pool", "0"])
        .env_remove("AIRLOCK_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = move |line: &str| {
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    };
    let mut ask = |send: &mut dyn FnMut(&str), line: &str| -> Value {
        send(line);
        let reply = lines.next().expect("a reply line").unwrap();
        serde_json::from_str(&reply).unwrap_or_else(|e| panic!("not JSON ({e}): {reply}"))
    };
    let v = ask(&mut send, "this is not json");
    assert_eq!(
        (v["error"]["code"].clone(), v["id"].clone()),
        (json!(-32700), Value::Null),
        "{v}"
    );
    let v = ask(&mut send, r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#);
    assert_eq!(v["error"]["code"], -32600, "{v}");
    let v = ask(&mut send, r#"{"jsonrpc":"1.0","id":9,"method":"ping"}"#);
    assert_eq!(
        (v["error"]["code"].clone(), v["id"].clone()),
        (json!(-32600), json!(9)),
        "{v}"
    );
    let v = ask(&mut send, r#"{"jsonrpc":"2.0","id":10}"#);
    assert_eq!(
        (v["error"]["code"].clone(), v["id"].clone()),
        (json!(-32600), json!(10)),
        "{v}"
    );
    // The session goes on: initialize and a tool listing answer as usual.
    let v = ask(
        &mut send,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    assert_eq!(v["id"], 1, "{v}");
    assert!(v["result"]["protocolVersion"].is_string(), "{v}");
    send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let v = ask(
        &mut send,
        "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}",
    );
    assert_eq!(v["id"], 2, "{v}");
    assert!(
        v["result"]["tools"].as_array().is_some_and(|t| !t.is_empty()),
        "{v}"
    );
    let v = ask(
        &mut send,
        "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}\u{0}",
    );
    assert_eq!(v["error"]["code"], -32700, "{v}");
    drop(send);
    let status = serverutil::poll(Duration::from_secs(30), || child.try_wait().unwrap());
    if status.is_none() {
        let _ = child.kill();
    }
    assert!(status.is_some_and(|s| s.success()), "airlock mcp: {status:?}");
}

#[test]
fn network_entries_follow_the_documents_grammar() {
    let d = Daemon::start(&["--pool", "0"]);
    let proxy = |allow: Value, cidrs: Value| {
        json!({"ttl_s": 60, "network": {"mode": "proxy", "allow": allow, "allow_cidrs": cidrs}}).to_string()
    };
    let r = post(
        &d,
        "/v1/sandboxes",
        &proxy(
            json!([
                "pypi.org",
                "*.pythonhosted.org",
                "api.example.com:8443",
                "10.1.2.3",
                "[fd00::1]:8080",
                "fd00::2",
                "a_b.example"
            ]),
            json!(["10.0.0.0/8", "fd00::/8", "127.0.0.1"]),
        ),
    );
    r.expect(201);
    for (allow, cidrs, field) in [
        // inet_aton would read `0` as 0.0.0.0: not in the documented grammar.
        (json!(["0"]), json!([]), "network.allow[0]"),
        (json!(["ok.example", "a..b"]), json!([]), "network.allow[1]"),
        (json!(["example.com:0"]), json!([]), "network.allow[0]"),
        (json!(["example.123"]), json!([]), "network.allow[0]"),
        (json!([]), json!(["10.0.0.0/08"]), "network.allow_cidrs[0]"),
        (json!([]), json!(["10.0.0.0/33"]), "network.allow_cidrs[0]"),
        (json!([]), json!(["::ffff:1.2.3.4"]), "network.allow_cidrs[0]"),
    ] {
        let body = proxy(allow, cidrs);
        for path in ["/v1/sandboxes", "/v1/exec"] {
            let body = if path == "/v1/exec" {
                let mut v: Value = serde_json::from_str(&body).unwrap();
                v.as_object_mut().unwrap().remove("ttl_s");
                v["cmd"] = json!(["true"]);
                v.to_string()
            } else {
                body.clone()
            };
            let e = post(&d, path, &body).api_error(400);
            assert_eq!(e["field"], field, "{path} {body}: {e}");
        }
    }
}

#[test]
fn the_sse_response_is_described_as_its_events_and_mcp_statuses_are_documented() {
    let d = Daemon::start(&["--pool", "0"]);
    let doc = d.client().get("/openapi.json").expect(200).json();
    let event = &doc["components"]["schemas"]["ExecEvent"];
    let names: Vec<&str> = event["properties"]["event"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for path in ["/v1/exec", "/v1/sandboxes/{id}/exec"] {
        let sse = &doc["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"];
        assert_eq!(sse["$ref"], "#/components/schemas/ExecEvent", "{path}: {sse}");
    }
    // A real stream's events are the documented ones, each `data` JSON of the documented
    // shape (the closing `result` an ExecResult with every required field).
    let mut s = d.client().sse(
        "/v1/exec",
        &json!({"cmd": ["sh", "-c", "echo out; echo err >&2"]}),
    );
    let mut seen = Vec::new();
    while let Some(ev) = s.next_event() {
        assert!(
            names.contains(&ev.event.as_str()),
            "undocumented event {:?}",
            ev.event
        );
        let data: Value = serde_json::from_str(&ev.data).unwrap_or_else(|e| panic!("{e}: {}", ev.data));
        if ev.event == "result" {
            for field in doc["components"]["schemas"]["ExecResult"]["required"]
                .as_array()
                .unwrap()
            {
                assert!(
                    data.get(field.as_str().unwrap()).is_some(),
                    "{field} missing: {data}"
                );
            }
        } else {
            assert!(data["data"].is_string(), "{data}");
        }
        seen.push(ev.event);
    }
    assert_eq!(seen.last().map(String::as_str), Some("result"), "{seen:?}");
    // /mcp lists the statuses it answers, each with a JSON-RPC error body.
    let post = &doc["paths"]["/mcp"]["post"]["responses"];
    for status in ["400", "403", "404", "406", "413", "415"] {
        assert_eq!(
            post[status]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/JsonRpcError",
            "POST /mcp {status}: {}",
            post[status]
        );
    }
    for (method, status) in [
        ("get", "406"),
        ("get", "404"),
        ("delete", "404"),
        ("delete", "400"),
    ] {
        assert!(
            doc["paths"]["/mcp"][method]["responses"][status].is_object(),
            "{method} /mcp {status}"
        );
    }
}

#[test]
fn base64_file_content_is_checked_as_the_document_says() {
    let d = Daemon::start(&["--pool", "0"]);
    let file = |content: &str| {
        json!({"cmd": ["cat", "f"], "files": [{"path": "f", "content": content, "encoding": "base64"}]})
            .to_string()
    };
    let v = post(&d, "/v1/exec", &file("QUI=")).expect(200).json();
    assert_eq!(v["stdout"], "AB", "{v}");
    // Unused bits set, no padding, whitespace, a symbol outside the alphabet.
    for bad in ["QUJ=", "QUI", "QUI=\n", "QU}="] {
        let e = post(&d, "/v1/exec", &file(bad)).api_error(400);
        assert_eq!(e["field"], "files[0].content", "{bad:?}: {e}");
    }
    let doc = d.client().get("/openapi.json").expect(200).json();
    let then = &doc["components"]["schemas"]["FileInput"]["then"]["properties"]["content"]["pattern"];
    assert!(then.is_string(), "{then}");
}

/// No body at all is `{}` (a session of the defaults); a body of only whitespace is not
/// JSON, and is refused as malformed like any other.
#[test]
fn an_empty_body_is_an_empty_object_and_whitespace_is_malformed() {
    let d = Daemon::start(&["--pool", "0"]);
    let r = post(&d, "/v1/sandboxes", "").expect(201);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    d.client().delete(&format!("/v1/sandboxes/{id}")).expect(204);
    for body in ["\r", " ", "\n\t "] {
        let e = post(&d, "/v1/sandboxes", body).api_error(400);
        assert_eq!(e["code"], "malformed_json", "{body:?}: {e}");
    }
}
