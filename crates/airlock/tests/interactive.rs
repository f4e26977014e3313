//! INTERACTIVE SESSIONS (issue 16), end to end through the real `airlock serve` on the
//! real kernel: background processes (exec with `background: true`, their output, stdin,
//! signals, waits, timeouts), the code interpreter (a Jupyter kernel in the session: state
//! between calls, figures as PNG, DataFrames as HTML, exceptions, timeouts that keep the
//! state, restart, streaming, an image without a kernel), the terminal WebSocket, and
//! `airlock shell` through a real pseudo-terminal. Every session's processes are gone
//! after it ends.
//!
//! The kernel is Debian's python3-ipykernel from the host's /usr (installed by .ci/run),
//! which the namespace tier's sandboxes see.

mod common;
use common::ws::read_until;
mod serverutil;
mod tierutil;

use serde_json::{Value, json};
use serverutil::{Client, Daemon, poll};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// A daemon with a small pool and an API key (the WebSocket checks need one).
const KEY: &str = "interactive-test-key-0123456789";

fn daemon() -> Daemon {
    let d = Daemon::start_env(&["--pool", "1"], &[("AIRLOCK_API_KEYS", &format!("tests:{KEY}"))]);
    d.wait_ready();
    d
}

fn client(d: &Daemon) -> Client {
    d.client_with_key(KEY)
}

/// Starts `cmd` as a background process of `id`; its Process.
#[track_caller]
fn start(c: &Client, id: &str, body: Value) -> Value {
    let mut body = body;
    body["background"] = json!(true);
    c.session_exec(id, &body).expect(201).json()
}

#[track_caller]
fn wait(c: &Client, id: &str, proc: &str, ms: u64) -> Value {
    c.post_json(
        &format!("/v1/sandboxes/{id}/processes/{proc}/wait"),
        &json!({"timeout_ms": ms}),
    )
    .expect(200)
    .json()
}

#[test]
fn a_background_process_runs_alongside_execs_and_reads_its_stdin() {
    let d = daemon();
    let c = client(&d);
    let id = c.create_session(&json!({}));
    let p = start(
        &c,
        &id,
        json!({"cmd": ["sh", "-c", "echo start; cat; echo end >&2; exit 4"], "stdin": "a\n"}),
    );
    assert_eq!(p["state"], "running", "{p:#}");
    assert_eq!(p["process_id"], "proc-1", "{p:#}");
    assert_eq!(p["tty"], false, "{p:#}");
    let pid = p["process_id"].as_str().unwrap().to_owned();

    // Execs come and go; the background process stays, and each exec's own leftovers die.
    for _ in 0..3 {
        let r = c
            .session_exec(&id, &json!({"cmd": ["sh", "-c", "sleep 100 & echo ok"]}))
            .expect(200)
            .json();
        assert_eq!(r["stdout"], "ok\n", "{r:#}");
    }
    let listed = c.get(&format!("/v1/sandboxes/{id}/processes")).expect(200).json();
    let procs = listed["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{listed:#}");
    assert_eq!(procs[0]["state"], "running", "{listed:#}");
    let ps = c
        .session_exec(&id, &json!({"cmd": ["sh", "-c", "ps -eo args"]}))
        .expect(200)
        .json();
    let ps = ps["stdout"].as_str().unwrap();
    assert!(ps.contains("cat"), "the background process is gone:\n{ps}");
    assert!(!ps.contains("sleep 100"), "an exec's leftover lives on:\n{ps}");

    let shown = c
        .post_json(
            &format!("/v1/sandboxes/{id}/processes/{pid}/stdin"),
            &json!({"data": "Yg==", "encoding": "base64"}),
        )
        .expect(200)
        .json();
    assert_eq!(shown["state"], "running", "{shown:#}");
    c.post_json(
        &format!("/v1/sandboxes/{id}/processes/{pid}/stdin"),
        &json!({"data": "\n", "eof": true}),
    )
    .expect(200);
    let done = wait(&c, &id, &pid, 20_000);
    assert_eq!(done["state"], "exited", "{done:#}");
    assert_eq!(done["exit_code"], 4, "{done:#}");
    assert_eq!(done["signal"], Value::Null, "{done:#}");
    let out = c
        .get(&format!("/v1/sandboxes/{id}/processes/{pid}/output"))
        .expect(200)
        .json();
    assert_eq!(out["stdout"], "start\na\nb\n", "{out:#}");
    assert_eq!(out["stderr"], "end\n", "{out:#}");
    assert_eq!(out["process"]["stdout_bytes"], 10, "{out:#}");
    // Its stdin is closed now: a clear conflict.
    let e = c
        .post_json(
            &format!("/v1/sandboxes/{id}/processes/{pid}/stdin"),
            &json!({"data": "x"}),
        )
        .api_error(409);
    assert!(e["message"].as_str().unwrap().contains("stdin is closed"), "{e}");
}

#[test]
fn output_streams_as_it_comes_and_ends_with_the_exit() {
    let d = daemon();
    let c = client(&d);
    let id = c.create_session(&json!({}));
    let p = start(
        &c,
        &id,
        json!({"cmd": ["sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo oops >&2"]}),
    );
    let pid = p["process_id"].as_str().unwrap();
    let mut events = c.sse_get(&format!("/v1/sandboxes/{id}/processes/{pid}/output"));
    let all = events.collect_all();
    let names: Vec<&str> = all.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names.last(), Some(&"exit"), "{names:?}");
    let stdout: String = all
        .iter()
        .filter(|e| e.event == "stdout")
        .map(|e| e.json()["data"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(stdout, "line1\nline2\nline3\n");
    assert!(
        all.iter()
            .any(|e| e.event == "stderr" && e.json()["data"] == "oops\n")
    );
    let first = all.iter().find(|e| e.event == "stdout").unwrap().at;
    let last = all.last().unwrap().at;
    assert!(
        last.duration_since(first) >= Duration::from_millis(400),
        "the output came all at once, not as it was written"
    );
    assert_eq!(all.last().unwrap().json()["exit_code"], 0);

    // Not following: what is kept, then `end` at once, though it still runs.
    let p = start(&c, &id, json!({"cmd": ["sh", "-c", "echo hello; sleep 60"]}));
    let pid = p["process_id"].as_str().unwrap();
    poll(Duration::from_secs(10), || {
        let o = c
            .get(&format!("/v1/sandboxes/{id}/processes/{pid}/output"))
            .expect(200)
            .json();
        (o["stdout"] == "hello\n").then_some(())
    })
    .expect("the process's output");
    let t0 = Instant::now();
    let all = c
        .sse_get(&format!("/v1/sandboxes/{id}/processes/{pid}/output?follow=false"))
        .collect_all();
    assert!(t0.elapsed() < Duration::from_secs(10));
    let names: Vec<&str> = all.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names, ["stdout", "end"], "{names:?}");
    assert_eq!(all[1].json()["state"], "running");
}

#[test]
fn signals_timeouts_and_bad_requests() {
    let d = daemon();
    let c = client(&d);
    let id = c.create_session(&json!({}));
    let p = start(&c, &id, json!({"cmd": ["sleep", "300"]}));
    let pid = p["process_id"].as_str().unwrap();
    let still = wait(&c, &id, pid, 300);
    assert_eq!(still["state"], "running", "{still:#}");
    let after = c
        .post_json(
            &format!("/v1/sandboxes/{id}/processes/{pid}/signal"),
            &json!({"signal": "SIGTERM"}),
        )
        .expect(200)
        .json();
    assert_eq!(after["process_id"], pid, "{after:#}");
    let done = wait(&c, &id, pid, 10_000);
    assert_eq!(
        (done["state"].clone(), done["signal"].clone()),
        (json!("exited"), json!(15)),
        "{done:#}"
    );
    // Signalling an ended process is answered as it is.
    c.post_json(
        &format!("/v1/sandboxes/{id}/processes/{pid}/signal"),
        &json!({"signal": 9}),
    )
    .expect(200);

    // Its own timeout: SIGKILL, timed_out.
    let p = start(
        &c,
        &id,
        json!({"cmd": ["sleep", "300"], "limits": {"timeout_ms": 500}}),
    );
    let done = wait(&c, &id, p["process_id"].as_str().unwrap(), 20_000);
    assert_eq!(done["timed_out"], true, "{done:#}");
    assert_eq!(done["signal"], 9, "{done:#}");

    // Bad input: each a clear error naming what is wrong.
    let e = c
        .get(&format!("/v1/sandboxes/{id}/processes/proc-99"))
        .api_error(404);
    assert!(e["message"].as_str().unwrap().contains("proc-99"), "{e}");
    let e = c
        .get(&format!("/v1/sandboxes/{id}/processes/nonsense/output"))
        .api_error(404);
    assert!(e["message"].as_str().unwrap().contains("nonsense"), "{e}");
    let e = c
        .post_json(
            &format!("/v1/sandboxes/{id}/processes/{pid}/signal"),
            &json!({"signal": "SIGSEGV"}),
        )
        .api_error(400);
    assert_eq!(e["field"], "signal", "{e}");
    let e = c
        .post_json(
            &format!("/v1/sandboxes/{id}/processes/{pid}/wait"),
            &json!({"timeout_ms": 0}),
        )
        .api_error(400);
    assert_eq!(e["field"], "timeout_ms", "{e}");
    let e = c
        .exec(&json!({"cmd": ["true"], "background": true}))
        .api_error(400);
    assert_eq!(e["field"], "background", "{e}");
    let e = c.get(&format!("/v1/sandboxes/{id}/pty")).api_error(400);
    assert_eq!(e["field"], "upgrade", "{e}");
    let e = c.get("/v1/sandboxes/0000000000000000/processes").api_error(404);
    assert!(e["message"].as_str().unwrap().contains("0000000000000000"), "{e}");
}

#[test]
fn a_deleted_session_leaves_no_process_behind() {
    let d = daemon();
    let c = client(&d);
    let id = c.create_session(&json!({}));
    start(&c, &id, json!({"cmd": ["sleep", "300"]}));
    start(
        &c,
        &id,
        json!({"cmd": ["sh", "-c", "sleep 300 & sleep 300 & wait"]}),
    );
    let r = c
        .post_json(&format!("/v1/sandboxes/{id}/code"), &json!({"code": "1 + 1"}))
        .expect(200)
        .json();
    assert_eq!(r["results"][0]["data"]["text/plain"], "2", "{r:#}");
    // Scoped to this session's cgroup (the pool refills meanwhile).
    let session_procs = || -> Vec<serverutil::ProcInfo> {
        d.sandbox_processes()
            .into_iter()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{}/cgroup", p.pid)).is_ok_and(|c| c.contains(&id))
            })
            .collect()
    };
    assert!(session_procs().len() >= 5, "{:?}", session_procs());
    c.delete(&format!("/v1/sandboxes/{id}")).expect(204);
    let gone = poll(Duration::from_secs(20), || {
        session_procs().is_empty().then_some(())
    });
    assert!(gone.is_some(), "left behind by {id}: {:?}", session_procs());
    c.get(&format!("/v1/sandboxes/{id}/processes")).api_error(404);
    c.post_json(&format!("/v1/sandboxes/{id}/code"), &json!({"code": "1"}))
        .api_error(404);
}

/// The size of the PNG `b64` (its IHDR's width and height).
fn png_size(b64: &str) -> (u32, u32) {
    use base64::Engine;
    let png = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&png[16..20]), be(&png[20..24]))
}

#[test]
fn the_code_interpreter_keeps_state_and_returns_rich_results() {
    let d = daemon();
    let c = client(&d);
    let id = c.create_session(&json!({"limits": {"memory_bytes": 1 << 30, "cpus": 1.0}}));
    let code = |code: &str, timeout_ms: Option<u64>| -> Value {
        let mut body = json!({"code": code});
        if let Some(t) = timeout_ms {
            body["timeout_ms"] = json!(t);
        }
        c.post_json(&format!("/v1/sandboxes/{id}/code"), &body)
            .expect(200)
            .json()
    };
    let r = code("import math\nx = 41\nprint('hi')\nx + 1", None);
    assert_eq!(r["error"], Value::Null, "{r:#}");
    assert_eq!(r["logs"]["stdout"], json!(["hi\n"]), "{r:#}");
    assert_eq!(r["results"][0]["kind"], "execute_result", "{r:#}");
    assert_eq!(r["results"][0]["data"]["text/plain"], "42", "{r:#}");
    assert!(r["kernel_start_ms"].as_f64().unwrap() > 0.0, "{r:#}");
    let r = code("x * 2, math.pi > 3", None);
    assert_eq!(r["results"][0]["data"]["text/plain"], "(82, True)", "{r:#}");
    assert_eq!(r["kernel_start_ms"], 0.0, "{r:#}");
    assert_eq!(r["execution_count"], 2, "{r:#}");

    // A figure: a PNG of the figure's size (no tight cropping).
    let r = code(
        "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n\
         import matplotlib.pyplot as plt\n\
         fig = plt.figure(figsize=(4, 3), dpi=50)\nplt.plot([1, 3, 2])\nplt.show()",
        Some(60_000),
    );
    assert_eq!(r["error"], Value::Null, "{r:#}");
    let png = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|x| x["data"]["image/png"].as_str())
        .unwrap_or_else(|| panic!("no PNG: {r:#}"));
    assert_eq!(png_size(png), (200, 150));

    // A DataFrame: HTML and text.
    let r = code(
        "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})",
        Some(60_000),
    );
    let data = &r["results"][0]["data"];
    assert!(
        data["text/html"].as_str().unwrap_or_default().contains("<table"),
        "{r:#}"
    );
    assert!(
        data["text/plain"].as_str().unwrap_or_default().contains('a'),
        "{r:#}"
    );

    // An exception: name, value, traceback without colours.
    let r = code("1 / 0", None);
    let e = &r["error"];
    assert_eq!(e["name"], "ZeroDivisionError", "{r:#}");
    assert_eq!(e["value"], "division by zero", "{r:#}");
    let tb = e["traceback"].to_string();
    assert!(
        tb.contains("ZeroDivisionError") && !tb.contains("\\u001b["),
        "{tb}"
    );

    // A timeout interrupts and keeps the state.
    let t0 = Instant::now();
    let r = code("import time\ny = 7\ntime.sleep(60)", Some(1000));
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert_eq!(r["timed_out"], true, "{r:#}");
    assert_eq!(r["error"]["name"], "KeyboardInterrupt", "{r:#}");
    let r = code("x + y", None);
    assert_eq!(r["results"][0]["data"]["text/plain"], "48", "{r:#}");

    // Streaming: output as it comes, then the whole execution.
    let all = c
        .sse(
            &format!("/v1/sandboxes/{id}/code"),
            &json!({"code": "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)\n'end'"}),
        )
        .collect_all();
    let names: Vec<&str> = all.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        names,
        ["stdout", "stdout", "stdout", "result", "done"],
        "{names:?}"
    );
    assert!(all[2].at.duration_since(all[0].at) >= Duration::from_millis(400));
    assert_eq!(all[4].json()["results"][0]["data"]["text/plain"], "'end'");

    // Restart clears the state (files stay).
    code("open('/workspace/kept.txt', 'w').write('kept')", None);
    c.post_json(&format!("/v1/sandboxes/{id}/code/restart"), &json!({}))
        .expect(200);
    let r = code("x", None);
    assert_eq!(r["error"]["name"], "NameError", "{r:#}");
    let r = code("open('/workspace/kept.txt').read()", None);
    assert_eq!(r["results"][0]["data"]["text/plain"], "'kept'", "{r:#}");

    // A kernel that dies: said, and the next call has a new one.
    let r = code("import os\nos._exit(1)", None);
    assert!(
        r["error"]["name"]
            .as_str()
            .unwrap_or_default()
            .contains("KernelDied"),
        "{r:#}"
    );
    let r = code("2 + 2", None);
    assert_eq!(r["results"][0]["data"]["text/plain"], "4", "{r:#}");

    // Bad input.
    let e = c
        .post_json(
            &format!("/v1/sandboxes/{id}/code"),
            &json!({"code": "1", "language": "ruby"}),
        )
        .api_error(400);
    assert_eq!(e["field"], "language", "{e}");
    let e = c
        .post_json(
            &format!("/v1/sandboxes/{id}/code"),
            &json!({"code": "1", "timeout_ms": 0}),
        )
        .api_error(400);
    assert_eq!(e["field"], "timeout_ms", "{e}");
}

#[test]
fn the_code_interpreter_says_when_the_image_has_no_kernel() {
    let img = tierutil::image::python_image();
    let store = img.store.to_str().unwrap().to_owned();
    let d = Daemon::start(&["--pool", "0", "--image-store", &store]);
    d.wait_ready();
    let c = d.client();
    let id = c.create_session(&json!({"image": img.name}));
    let e = c
        .post_json(&format!("/v1/sandboxes/{id}/code"), &json!({"code": "1"}))
        .api_error(400);
    assert_eq!(e["field"], "image", "{e}");
    assert!(e["message"].as_str().unwrap().contains("ipykernel"), "{e}");
    // The session is still usable.
    let r = c
        .session_exec(&id, &json!({"cmd": ["python3", "-c", "print(6 * 7)"]}))
        .expect(200)
        .json();
    assert_eq!(r["stdout"], "42\n", "{r:#}");
}

/// A WebSocket to `path` on `d` with `headers`.
fn websocket(
    d: &Daemon,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<tungstenite::WebSocket<TcpStream>, (u16, String)> {
    let url = format!("ws://127.0.0.1:{}{path}", d.port);
    let mut req = tungstenite::client::IntoClientRequest::into_client_request(url.as_str()).unwrap();
    for (k, v) in headers {
        let name = tungstenite::http::HeaderName::from_bytes(k.as_bytes()).unwrap();
        req.headers_mut().insert(name, v.parse().unwrap());
    }
    let stream = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    match tungstenite::client(req, stream) {
        Ok((ws, _)) => Ok(ws),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(resp))) => Err((
            resp.status().as_u16(),
            String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        Err(e) => panic!("websocket: {e}"),
    }
}

#[test]
fn a_terminal_over_a_websocket() {
    let d = daemon();
    let c = client(&d);
    let id = c.create_session(&json!({}));
    let auth = format!("Bearer {KEY}");
    let mut ws = websocket(
        &d,
        &format!("/v1/sandboxes/{id}/pty?rows=30&cols=90&cmd=sh"),
        &[("Authorization", &auth)],
    )
    .expect("the terminal opens");
    let started = ws.read().unwrap();
    let started: Value = serde_json::from_str(started.to_text().unwrap()).unwrap();
    assert_eq!(started["type"], "started", "{started}");
    let send = |ws: &mut tungstenite::WebSocket<TcpStream>, s: &str| {
        ws.send(tungstenite::Message::Binary(s.as_bytes().to_vec().into()))
            .unwrap()
    };
    send(&mut ws, "stty size; tty\n");
    let seen = read_until(&mut ws, "/dev/pts/");
    assert!(seen.contains("30 90"), "{seen:?}");
    // An interactive program: reads a line, prints it back.
    send(&mut ws, "read l; echo got:$l\n");
    send(&mut ws, "hello\n");
    read_until(&mut ws, "got:hello");
    ws.send(tungstenite::Message::Text(
        json!({"type": "resize", "rows": 40, "cols": 100})
            .to_string()
            .into(),
    ))
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    send(&mut ws, "stty size\n");
    read_until(&mut ws, "40 100");
    // A bad control message is answered, and the terminal goes on.
    ws.send(tungstenite::Message::Text("{\"type\": \"jump\"}".into()))
        .unwrap();
    // It is one of the session's processes.
    let listed = c.get(&format!("/v1/sandboxes/{id}/processes")).expect(200).json();
    assert_eq!(listed["processes"][0]["tty"], true, "{listed:#}");
    send(&mut ws, "exit 3\n");
    let mut exit = None;
    let mut error_seen = false;
    while exit.is_none() {
        match ws.read() {
            Ok(tungstenite::Message::Text(t)) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                match v["type"].as_str() {
                    Some("exit") => exit = Some(v),
                    Some("error") => error_seen = true,
                    _ => {}
                }
            }
            Ok(_) => {}
            Err(e) => panic!("no exit message: {e}"),
        }
    }
    assert!(error_seen, "a bad control frame was not answered");
    assert_eq!(exit.unwrap()["exit_code"], 3);

    // Without the key: refused before the upgrade; with it in the query: opens.
    let (status, body) = websocket(&d, &format!("/v1/sandboxes/{id}/pty"), &[]).unwrap_err();
    assert_eq!(status, 401, "{body}");
    let mut ws = websocket(&d, &format!("/v1/sandboxes/{id}/pty?access_token={KEY}"), &[]).expect("opens");
    assert!(ws.read().unwrap().to_text().unwrap().contains("started"));
    // Closing the WebSocket hangs the terminal up: its process ends.
    ws.close(None).unwrap();
    let _ = ws.flush();
    let ended = poll(Duration::from_secs(15), || {
        let l = c.get(&format!("/v1/sandboxes/{id}/processes")).expect(200).json();
        l["processes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["state"] == "exited")
            .then_some(())
    });
    assert!(ended.is_some(), "the hung-up terminal lives on");
    // Bad sizes and a deleted session: clear errors.
    let (status, body) = websocket(
        &d,
        &format!("/v1/sandboxes/{id}/pty?rows=0"),
        &[("Authorization", &auth)],
    )
    .unwrap_err();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("rows"), "{body}");
    c.delete(&format!("/v1/sandboxes/{id}")).expect(204);
    let (status, body) = websocket(
        &d,
        &format!("/v1/sandboxes/{id}/pty"),
        &[("Authorization", &auth)],
    )
    .unwrap_err();
    assert_eq!(status, 404, "{body}");
}

/// `airlock shell` on a real pseudo-terminal: raw mode, a window size change, the exit
/// status.
#[test]
fn airlock_shell_attaches_a_real_terminal() {
    let d = daemon();
    let pty = nix::pty::openpty(
        Some(&nix::pty::Winsize {
            ws_row: 20,
            ws_col: 70,
            ws_xpixel: 0,
            ws_ypixel: 0,
        }),
        None,
    )
    .unwrap();
    let slave: OwnedFd = pty.slave;
    let master: OwnedFd = pty.master;
    let mut cmd = std::process::Command::new(common::airlock_bin());
    cmd.args(["shell", "--url", &d.base, "--cmd", "sh"])
        .env("AIRLOCK_API_KEY", KEY)
        .stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave.try_clone().unwrap());
    let fd = slave.as_raw_fd();
    // SAFETY: between fork and exec only async-signal-safe calls (setsid, ioctl).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            libc::setsid();
            if libc::ioctl(fd, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(slave);
    let mut term = std::fs::File::from(master);
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let mut reader = term.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = reader.read(&mut buf) {
            if tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut seen = String::new();
    let mut expect = |want: &str| {
        let t0 = Instant::now();
        while !seen.contains(want) {
            let left = Duration::from_secs(60).saturating_sub(t0.elapsed());
            match rx.recv_timeout(left) {
                Ok(b) => seen.push_str(&String::from_utf8_lossy(&b)),
                Err(_) => panic!("no {want:?} from airlock shell; saw {seen:?}"),
            }
        }
        seen.clear();
    };
    term.write_all(b"stty size\n").unwrap();
    expect("20 70");
    let size = libc::winsize {
        ws_row: 33,
        ws_col: 101,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize, which lives through the call.
    let resized = unsafe { libc::ioctl(term.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    assert_eq!(resized, 0);
    std::thread::sleep(Duration::from_millis(800));
    term.write_all(b"stty size\n").unwrap();
    expect("33 101");
    term.write_all(b"exit 5\n").unwrap();
    let status = poll(Duration::from_secs(30), || child.try_wait().unwrap()).expect("airlock shell ended");
    assert_eq!(status.code(), Some(5));
    // The session it made is gone.
    let all = client(&d).get("/v1/sandboxes").expect(200).json();
    assert_eq!(all.as_array().map(Vec::len), Some(0), "{all:#}");
}

/// docs/interactive.md's example, run as typed (against a daemon on its own port, `airlock` being the
/// binary under test, the shell given two lines on stdin): the sum, a PNG chart, the
/// preview through the exposed port, the shell, and the session gone at the end.
#[test]
fn readme_interactive_block_runs_as_typed() {
    let d = Daemon::start(&["--pool", "0"]);
    d.wait_ready();
    let work = tempfile::tempdir().unwrap();
    let script = common::docs::doc_shell_block("docs/interactive.md", "# Interactive sessions")
        .replace("localhost:8710", &format!("127.0.0.1:{}", d.port))
        .replace(
            "airlock shell",
            &format!("{} shell", common::airlock_bin().display()),
        );
    let mut child = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(work.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"echo from-the-shell $((6 * 7))\nexit\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the docs/interactive.md block failed: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "15", "{stdout}");
    assert_eq!(lines[1], "proc-1", "{stdout}");
    assert!(
        stdout.contains("<title>Directory listing for /</title>"),
        "{stdout}"
    );
    assert!(stdout.contains("from-the-shell 42"), "{stdout}");
    let png = std::fs::read(work.path().join("chart.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let all = d.client().get("/v1/sandboxes").expect(200).json();
    assert_eq!(all.as_array().map(Vec::len), Some(0), "{all:#}");
}

/// Every tier serves the same session surface: the code interpreter keeps state, a
/// background process outlives an exec, an exposed port reaches a server inside, and the
/// session's end leaves nothing of it on the host.
fn tier_serves_interactive_sessions(tier: &str) {
    let Some(t) = tierutil::Tier::selected(
        match tier {
            "gvisor" => "gvisor",
            _ => "microvm",
        },
        &["namespaces", "gvisor", "microvm"],
    ) else {
        return;
    };
    let d = Daemon::start_env(t.serve_args(), &[("AIRLOCK_API_KEYS", &format!("tests:{KEY}"))]);
    d.wait_ready();
    let c = client(&d);
    let id = c.create_session(&json!({"isolation": tier, "limits": {"memory_bytes": 1 << 30, "cpus": 1.0}}));
    let code = |code: &str| -> Value {
        c.post_json(
            &format!("/v1/sandboxes/{id}/code"),
            &json!({"code": code, "timeout_ms": 300_000}),
        )
        .expect(200)
        .json()
    };
    let r = code("x = 41");
    assert_eq!(r["error"], Value::Null, "{tier}: {r:#}");
    let r = code("x + 1");
    assert_eq!(r["results"][0]["data"]["text/plain"], "42", "{tier}: {r:#}");

    let p = start(&c, &id, json!({"cmd": ["sh", "-c", "echo hi; sleep 300"]}));
    let r = c.session_exec(&id, &json!({"cmd": ["true"]})).expect(200).json();
    assert_eq!(r["exit_code"], 0, "{tier}: {r:#}");
    let pid = p["process_id"].as_str().unwrap();
    // Its output arrives as the tier delivers it (an emulated VM: late).
    let shown = poll(Duration::from_secs(60), || {
        let o = c
            .get(&format!("/v1/sandboxes/{id}/processes/{pid}/output"))
            .expect(200)
            .json();
        (o["stdout"] == "hi\n").then_some(o)
    })
    .unwrap_or_else(|| panic!("{tier}: no output from the background process"));
    assert_eq!(shown["process"]["state"], "running", "{tier}: {shown:#}");

    start(
        &c,
        &id,
        json!({"cmd": ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"]}),
    );
    let port = c
        .post_json(&format!("/v1/sandboxes/{id}/ports"), &json!({"port": 8000}))
        .expect(201)
        .json();
    let path = port["path"].as_str().unwrap().to_owned();
    let listing = poll(Duration::from_secs(120), || {
        let r = c.get(&path);
        (r.status == 200).then(|| r.text())
    })
    .unwrap_or_else(|| panic!("{tier}: the server in the sandbox never answered through {path}"));
    assert!(listing.contains("Directory listing"), "{tier}: {listing}");

    c.delete(&format!("/v1/sandboxes/{id}")).expect(204);
    let clean = poll(Duration::from_secs(60), || {
        tierutil::sandbox_leftovers(&d.owner, &id)
            .is_empty()
            .then_some(())
    });
    assert!(
        clean.is_some(),
        "{tier}: left behind: {:?}",
        tierutil::sandbox_leftovers(&d.owner, &id)
    );
}

#[test]
fn gvisor_serves_interactive_sessions() {
    tier_serves_interactive_sessions("gvisor");
}

#[test]
fn microvm_serves_interactive_sessions() {
    tier_serves_interactive_sessions("microvm");
}
