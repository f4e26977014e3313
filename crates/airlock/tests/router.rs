//! A fleet on one host: three `airlock serve --node nX` daemons on loopback ports and one
//! `airlock serve --route` in front, all the real binary. Through the router: sessions
//! (execs, files, snapshots, a terminal's WebSocket, a streamed exec), one-shot execs,
//! lists; then 200 mixed requests while one node is killed with SIGKILL, one drained with
//! SIGTERM, and the killed one comes back.
//!
//! What must hold: every request a live node could serve is served (no 5xx); a dead
//! node's sessions answer 503 `node_unavailable` naming it; one-shot execs stop going to
//! it at once (the router tries the next node when a connection is refused); a draining
//! node takes no new session while its own keep working, and it exits when its last
//! session is gone.

mod common;
use common::ws::read_until;
mod serverutil;

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use serverutil::{Client, Daemon, Resp, poll};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A node of the fleet: small pool, room for a dozen sandboxes, long grace (a drained
/// node must exit because its last session went, not because the grace ran out).
fn node(name: &str, extra: &[&str]) -> Daemon {
    let mut args = vec![
        "--node",
        name,
        "--pool",
        "1",
        "--max-sandboxes",
        "24",
        "--grace",
        "40s",
    ];
    args.extend_from_slice(extra);
    Daemon::start(&args)
}

/// The router in front of `nodes`: the first by a DNS name (`dns:localhost:PORT`, every
/// address it resolves to), the others by address.
fn router(nodes: &[&Daemon]) -> Daemon {
    let peers: Vec<String> = nodes
        .iter()
        .enumerate()
        .map(|(i, d)| match i {
            0 => format!("dns:localhost:{}", d.port),
            _ => format!("127.0.0.1:{}", d.port),
        })
        .collect();
    Daemon::start(&["--route", &peers.join(",")])
}

/// The node an id names.
fn node_of(id: &str) -> &str {
    id.split_once("--").map_or("", |(n, _)| n)
}

/// The router's view of node `name` on its `/readyz`.
fn seen(front: &Client, name: &str) -> Value {
    let v = front.get("/readyz").json();
    v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

fn sh(script: &str) -> Value {
    json!({"cmd": ["sh", "-c", script]})
}

/// A WebSocket to `path` on the router at `port`.
fn websocket(port: u16, path: &str) -> tungstenite::WebSocket<TcpStream> {
    let url = format!("ws://127.0.0.1:{port}{path}");
    let req = tungstenite::client::IntoClientRequest::into_client_request(url.as_str()).unwrap();
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    match tungstenite::client(req, stream) {
        Ok((ws, _)) => ws,
        Err(e) => panic!("websocket through the router: {e:?}"),
    }
}

/// One request of the mixed run: what it was, and how it ended.
#[derive(Debug, Clone)]
struct Outcome {
    /// Its number in the run.
    i: usize,
    /// `exec` (one-shot), `session`, `files`, `show`, `list`.
    kind: &'static str,
    /// The node of the session it used (`""`: none).
    node: String,
    /// When it started and ended.
    started: Instant,
    ended: Instant,
    /// Its HTTP status (0: no answer at all) and error body.
    status: u16,
    body: String,
}

/// Runs request `i` of the mix through `front`.
fn one(front: &Client, sessions: &[String], i: usize) -> Outcome {
    let started = Instant::now();
    let id = &sessions[i % sessions.len()];
    let (kind, node, r): (&'static str, &str, Result<Resp, String>) = match i % 5 {
        0 => (
            "exec",
            "",
            front
                .try_request(
                    "POST",
                    "/v1/exec",
                    &[("Content-Type", "application/json")],
                    Some(
                        json!({"cmd": ["echo", format!("one-{i}")]})
                            .to_string()
                            .as_bytes(),
                    ),
                )
                .and_then(|r| {
                    if r.status == 200 && r.json()["stdout"] != format!("one-{i}\n") {
                        return Err(format!("wrong output: {}", r.text()));
                    }
                    Ok(r)
                }),
        ),
        1 => (
            "session",
            node_of(id),
            front
                .try_request(
                    "POST",
                    &format!("/v1/sandboxes/{id}/exec"),
                    &[("Content-Type", "application/json")],
                    Some(sh(&format!("echo s-{i}")).to_string().as_bytes()),
                )
                .and_then(|r| {
                    if r.status == 200 && r.json()["stdout"] != format!("s-{i}\n") {
                        return Err(format!("wrong output: {}", r.text()));
                    }
                    Ok(r)
                }),
        ),
        2 => {
            let path = format!("/v1/sandboxes/{id}/files?path=/workspace/f{i}");
            let content = format!("file {i} on {id}");
            let r = front
                .try_request(
                    "PUT",
                    &path,
                    &[("Content-Type", "application/octet-stream")],
                    Some(content.as_bytes()),
                )
                .and_then(|put| {
                    if !(200..300).contains(&put.status) {
                        return Ok(put);
                    }
                    let got = front.try_request("GET", &path, &[], None)?;
                    if got.status == 200 && got.text() != content {
                        return Err(format!("read back {:?}, wrote {content:?}", got.text()));
                    }
                    Ok(got)
                });
            ("files", node_of(id), r)
        }
        3 => (
            "show",
            node_of(id),
            front.try_request("GET", &format!("/v1/sandboxes/{id}"), &[], None),
        ),
        _ => ("list", "", front.try_request("GET", "/v1/sandboxes", &[], None)),
    };
    let (status, body) = match r {
        Ok(r) => (r.status, r.text()),
        Err(e) => (0, e),
    };
    Outcome {
        i,
        kind,
        node: node.to_owned(),
        started,
        ended: Instant::now(),
        status,
        body,
    }
}

#[test]
fn a_fleet_behind_one_router_survives_a_killed_node_and_a_drained_one() {
    let n1 = node("n1", &[]);
    let n2 = node("n2", &[]);
    let mut n3 = node("n3", &[]);
    for d in [&n1, &n2, &n3] {
        d.wait_ready();
    }
    let r = router(&[&n1, &n2, &n3]);
    let front = r.client();
    r.wait_ready();
    for name in ["n1", "n2", "n3"] {
        let v = seen(&front, name);
        assert_eq!(v["up"], true, "{name}: {v}");
    }
    // Each node reports its name and capacity itself.
    let ready = n1.client().get("/readyz").expect(200).json();
    assert_eq!(ready["node"], "n1", "{ready}");
    assert!(ready["sandboxes_free"].as_u64().unwrap() > 0, "{ready}");

    // Sessions spread over the nodes (each is placed on the one with the most room).
    let sessions: Vec<String> = (0..9).map(|_| front.create_session(&json!({}))).collect();
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for id in &sessions {
        *per_node.entry(node_of(id)).or_default() += 1;
    }
    assert_eq!(
        per_node.keys().copied().collect::<Vec<_>>(),
        ["n1", "n2", "n3"],
        "{sessions:?}"
    );
    // A node's own list has its own sessions; the router's has everyone's, oldest first.
    let all = front.get("/v1/sandboxes").expect(200).json();
    let mut listed: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    let created: Vec<f64> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["created_at"].as_f64().unwrap())
        .collect();
    assert!(created.windows(2).all(|w| w[0] <= w[1]), "{all}");
    listed.sort();
    let mut want: Vec<&str> = sessions.iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(listed, want);
    let own = n2.client().get("/v1/sandboxes").expect(200).json();
    assert!(
        own.as_array()
            .unwrap()
            .iter()
            .all(|s| node_of(s["id"].as_str().unwrap()) == "n2"),
        "{own}"
    );

    // Ids that name no node of the fleet, or none at all.
    let e = front.get("/v1/sandboxes/n9--0123456789abcdef").api_error(503);
    assert_eq!(e["code"], "node_unavailable", "{e}");
    assert!(e["message"].as_str().unwrap().contains("n9"), "{e}");
    let e = front.get("/metrics").api_error(404);
    assert!(e["message"].as_str().unwrap().contains("n1, n2, n3"), "{e}");
    let e = front.get("/v1/sandboxes/0123456789abcdef").api_error(404);
    assert_eq!(e["code"], "not_found", "{e}");
    // A node refuses an id of another node (or none) as unknown.
    n1.client()
        .get(&format!(
            "/v1/sandboxes/{}",
            sessions.iter().find(|s| node_of(s) == "n2").unwrap()
        ))
        .api_error(404);

    // A session's exec result names the session as the API does.
    let on_n1 = sessions.iter().find(|s| node_of(s) == "n1").unwrap().clone();
    let v = front.session_exec(&on_n1, &sh("true")).expect(200).json();
    assert_eq!(v["id"], on_n1.as_str(), "{v}");
    // A streamed exec passes through event by event.
    let events = front
        .sse(
            &format!("/v1/sandboxes/{on_n1}/exec"),
            &sh("echo first; sleep 0.3; echo second"),
        )
        .collect_all();
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names, ["stdout", "stdout", "result"], "{events:?}");
    // A client that goes away ends its exec on the node (the router's connection to the
    // node closes with the client's): the session is free again long before the
    // program's 60 s.
    {
        let body = json!({"cmd": ["sleep", "60"], "limits": {"timeout_ms": 60000}}).to_string();
        let mut s = TcpStream::connect(("127.0.0.1", r.port)).unwrap();
        write!(
            s,
            "POST /v1/sandboxes/{on_n1}/exec HTTP/1.1\r\nHost: front\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        std::thread::sleep(Duration::from_secs(1));
    }
    let t0 = Instant::now();
    front.session_exec(&on_n1, &sh("echo free")).expect(200);
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "the session stayed busy {:?} after its client left",
        t0.elapsed()
    );

    // A terminal's WebSocket passes through.
    let mut ws = websocket(
        r.port,
        &format!("/v1/sandboxes/{on_n1}/pty?rows=24&cols=80&cmd=sh"),
    );
    let started: Value = serde_json::from_str(ws.read().unwrap().to_text().unwrap()).unwrap();
    assert_eq!(started["type"], "started", "{started}");
    ws.send(tungstenite::Message::Binary(
        b"echo pty-$((6*7))\n".to_vec().into(),
    ))
    .unwrap();
    read_until(&mut ws, "pty-42");
    drop(ws);

    // A program's port, by path and by its own host name (`8000-<id>.<server>`).
    let r_bg = front.session_exec(
        &on_n1,
        &json!({"cmd": ["sh", "-c", "cd /tmp && echo hello-port > index.html && exec python3 -m http.server 8000"], "background": true}),
    );
    assert_eq!(r_bg.status, 201, "{}", r_bg.text());
    let port = front
        .post_json(&format!("/v1/sandboxes/{on_n1}/ports"), &json!({"port": 8000}))
        .expect(201)
        .json();
    let by_path = poll(Duration::from_secs(30), || {
        let r = front.get(&format!("/v1/sandboxes/{on_n1}/ports/8000/index.html"));
        (r.status == 200).then_some(r)
    });
    assert_eq!(
        by_path
            .expect("the port never answered through the router")
            .text(),
        "hello-port\n"
    );
    let host = format!("8000-{on_n1}.localhost");
    // The host a client is told is the router's (the one it asked), with the id's node.
    assert_eq!(
        port["host"],
        format!("8000-{on_n1}.127.0.0.1:{}", r.port),
        "{port}"
    );
    let by_host = front.request("GET", "/index.html", &[("Host", &host)], None);
    assert_eq!((by_host.status, by_host.text()), (200, "hello-port\n".to_owned()));

    // Snapshots name their node too; a session from one is made on that node.
    let snap = front
        .post_json(&format!("/v1/sandboxes/{on_n1}/snapshots"), &json!({}))
        .expect(201)
        .json();
    let sid = snap["snapshot_id"].as_str().unwrap().to_owned();
    assert_eq!(node_of(&sid), "n1", "{snap}");
    front.get(&format!("/v1/snapshots/{sid}")).expect(200);
    let snaps = front.get("/v1/snapshots").expect(200).json();
    assert!(
        snaps["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["snapshot_id"] == sid),
        "{snaps}"
    );
    let restored = front.create_session(&json!({"from_snapshot": sid}));
    assert_eq!(node_of(&restored), "n1");
    front.delete(&format!("/v1/sandboxes/{restored}")).expect(204);
    front.delete(&format!("/v1/snapshots/{sid}")).expect(204);

    // MCP: a session begins on a node, its id names that node, and it goes on there.
    let mcp = |headers: &[(&str, &str)], body: &str| {
        let mut h = vec![
            ("Accept", "application/json, text/event-stream"),
            ("Content-Type", "application/json"),
        ];
        h.extend_from_slice(headers);
        front.request("POST", "/mcp", &h, Some(body.as_bytes()))
    };
    let init = mcp(
        &[],
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    assert_eq!(init.status, 200, "{}", init.text());
    let mcp_id = init.header("mcp-session-id").expect("a session id").to_owned();
    assert!(["n1", "n2", "n3"].contains(&node_of(&mcp_id)), "{mcp_id}");
    let ack = mcp(
        &[("Mcp-Session-Id", &mcp_id)],
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(ack.status, 202, "{}", ack.text());
    let tools = mcp(
        &[("Mcp-Session-Id", &mcp_id)],
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    );
    assert_eq!(tools.status, 200, "{}", tools.text());
    assert!(tools.text().contains("create_sandbox"), "{}", tools.text());

    // 200 mixed requests from four clients; n3 is killed partway.
    let done = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (front, sessions) = (r.client(), sessions.clone());
            let (done, next, outcomes) = (Arc::clone(&done), Arc::clone(&next), Arc::clone(&outcomes));
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= 200 {
                        return;
                    }
                    let o = one(&front, &sessions, i);
                    outcomes.lock().unwrap().push(o);
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    assert!(
        poll(Duration::from_secs(60), || (done.load(Ordering::SeqCst) >= 70)
            .then_some(()))
        .is_some()
    );
    let signalled = Instant::now();
    n3.signal(Signal::SIGKILL);
    let status = n3
        .wait_exit(Duration::from_secs(10))
        .expect("n3 exits on SIGKILL");
    let killed = Instant::now();
    assert_eq!(status.code(), None, "{status:?}");
    for w in workers {
        w.join().unwrap();
    }
    let outcomes = outcomes.lock().unwrap().clone();
    assert_eq!(outcomes.len(), 200);
    assert!(
        outcomes.iter().filter(|o| o.started > killed).count() >= 30,
        "too few requests after the kill to judge"
    );
    let mut on_dead = 0;
    for o in &outcomes {
        let ok = (200..300).contains(&o.status);
        let in_flight_at_kill = o.started < killed && o.ended > signalled;
        let names_n3 = o.status == 503 && o.body.contains("node_unavailable") && o.body.contains("n3");
        if o.node == "n3" && o.started > killed {
            // The dead node's sessions: a clear error naming it.
            assert!(
                names_n3,
                "request {} ({}) on n3 after its death: {} {}",
                o.i, o.kind, o.status, o.body
            );
            on_dead += 1;
        } else if o.node == "n3" || (o.kind == "exec" && in_flight_at_kill) {
            // Under way when it died: it may have failed, only with that error.
            assert!(
                ok || names_n3,
                "request {} ({}) at n3's death: {} {}",
                o.i,
                o.kind,
                o.status,
                o.body
            );
        } else {
            // Everything a live node could serve was served (one-shot execs included: a
            // refused connection sends them to the next node).
            assert!(
                ok,
                "request {} ({}, node {:?}) failed: {} {}",
                o.i, o.kind, o.node, o.status, o.body
            );
        }
    }
    assert!(on_dead > 0, "no request used n3's sessions after its death");
    // The router saw it go.
    let v = seen(&front, "n3");
    assert_eq!(v["up"], false, "{v}");
    // The list names what it lacks.
    let listed = front.get("/v1/sandboxes").expect(200);
    assert_eq!(
        listed.header("airlock-missing-nodes"),
        Some("n3"),
        "{:?}",
        listed.headers
    );

    // Drain n2: SIGTERM. It takes no new session (the router places them on n1 at once,
    // even before its next poll), its sessions keep working, and it exits when the last
    // one is deleted, long before its 40 s grace.
    let mut n2 = n2;
    n2.signal(Signal::SIGTERM);
    let draining = poll(Duration::from_secs(10), || {
        let r = n2.client().try_request("GET", "/readyz", &[], None).ok()?;
        (r.status == 503 && r.json()["stopping"] == true).then_some(r)
    });
    assert!(
        draining.is_some(),
        "n2's /readyz never said it drains; log:\n{}",
        n2.log()
    );
    let e = n2.client().exec(&sh("echo new")).api_error(503);
    assert_eq!(e["code"], "shutting_down", "{e}");
    let e = n2.client().post_json("/v1/sandboxes", &json!({})).api_error(503);
    assert_eq!(e["code"], "shutting_down", "{e}");
    let fresh: Vec<String> = (0..4).map(|_| front.create_session(&json!({}))).collect();
    assert!(fresh.iter().all(|id| node_of(id) == "n1"), "{fresh:?}");
    for _ in 0..4 {
        front.exec_ok(&sh("true"));
    }
    let on_n2: Vec<&String> = sessions.iter().filter(|s| node_of(s) == "n2").collect();
    for id in &on_n2 {
        let v = front
            .session_exec(id, &sh("cat /workspace/f* | wc -l; echo draining"))
            .expect(200)
            .json();
        assert!(v["stdout"].as_str().unwrap().ends_with("draining\n"), "{v}");
    }
    assert!(
        poll(Duration::from_secs(5), || (seen(&front, "n2")["stopping"]
            == true)
            .then_some(()))
        .is_some(),
        "the router never saw n2 drain"
    );
    let t0 = Instant::now();
    for id in &on_n2 {
        front.delete(&format!("/v1/sandboxes/{id}")).expect(204);
    }
    let status = n2.wait_exit(Duration::from_secs(20)).unwrap_or_else(|| {
        panic!(
            "n2 still runs 20 s after its last session went; log:\n{}",
            n2.log()
        )
    });
    assert_eq!(status.code(), Some(0), "log:\n{}", n2.log());
    assert!(t0.elapsed() < Duration::from_secs(20));

    // n3 comes back on its address: the sessions it held died with it (404 from the new
    // n3), and new work goes there again (it has the most room).
    let port = n3.port.to_string();
    let listen = format!("127.0.0.1:{port}");
    drop(n3);
    let n3 = node("n3", &["--listen", &listen]);
    n3.wait_ready();
    assert!(
        poll(Duration::from_secs(10), || (seen(&front, "n3")["up"] == true)
            .then_some(()))
        .is_some(),
        "the router never saw n3 again"
    );
    let old = sessions.iter().find(|s| node_of(s) == "n3").unwrap();
    front.get(&format!("/v1/sandboxes/{old}")).api_error(404);
    let again = front.create_session(&json!({}));
    assert_eq!(
        node_of(&again),
        "n3",
        "n1 holds sessions, n3 none: the new one goes to n3"
    );
    front.session_exec(&again, &sh("echo back")).expect(200);
}

#[test]
fn a_node_name_is_checked_and_the_router_needs_peers() {
    for bad in ["N1", "n--1", "n1-", "n_1", "012345678901234567890"] {
        let f = serverutil::serve_refuses(&["--node", bad]);
        assert_eq!(f.status.code(), Some(2), "--node {bad}: {f:?}");
        assert!(f.stderr.contains("--node"), "--node {bad}: {}", f.stderr);
    }
    for bad in ["", "localhost", "dns:x", "host:0"] {
        let f = serverutil::serve_refuses(&["--route", bad]);
        assert_eq!(f.status.code(), Some(2), "--route {bad:?}: {f:?}");
        assert!(f.stderr.contains("--route"), "--route {bad:?}: {}", f.stderr);
    }
    let f = serverutil::serve_refuses(&["--route", "127.0.0.1:1", "--node", "n1"]);
    assert_ne!(f.status.code(), Some(0), "{f:?}");
    assert!(f.stderr.contains("--node"), "{}", f.stderr);
}

#[test]
fn the_fleet_example_in_the_docs_runs_as_typed() {
    let script = common::docs::doc_shell_block("docs/fleet.md", "## Try it on one host");
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_airlock"))
        .parent()
        .unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let _g = serverutil::start_lock();
    let out = std::process::Command::new("timeout")
        .args(["120", "sh", "-ec", &script])
        .env("PATH", path)
        .env_remove("AIRLOCK_API_KEYS")
        .env_remove("AIRLOCK_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("\"stdout\":\"hello from the fleet\\n\""),
        "stdout:\n{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| ["n1--", "n2--", "n3--"].iter().any(|n| l.starts_with(n))),
        "no session id naming its node; stdout:\n{stdout}"
    );
}
