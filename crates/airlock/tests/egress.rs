//! Egress through the filtering proxy, end to end: the real `airlock` binary run inside a
//! network namespace of the test's own, whose loopback carries the fake "remote" hosts
//! (an allowed web and echo server on 10.9.9.9, another on 203.0.113.7, a fake cloud
//! metadata server on 169.254.169.254 and fd00:ec2::254, servers on 127.0.0.1 and
//! 10.0.0.5). Names resolve through a hosts file bound over /etc/hosts in airlock's own
//! mount namespace. Nothing ever leaves the namespace: it has no other interface.
//!
//! Every server counts the connections it accepts; the forbidden ones must stay at zero.
//! The proxy's policy is the host's whatever the tier, so it is tested here on the default
//! one; `--net none`, proxy mode and the service's egress log on every tier are in
//! tests/contract.rs.

mod egressutil;

use egressutil::{ALLOWED, API, ECHO_PORT, METADATA, Net, egress};
use serde_json::{Value, json};

/// `--net proxy` with 10.9.9.9 allowed by address.
const PROXY_ALLOWED: &[&str] = &["--net", "proxy", "--allow-cidr", "10.9.9.9/32"];

/// Asserts the fields of one log entry.
#[track_caller]
fn assert_entry(e: &Value, host: &str, port: u16, addr: Option<&str>, allowed: bool, reason: &str) {
    assert_eq!(e["host"], host, "{e:#}");
    assert_eq!(e["port"], port, "{e:#}");
    match addr {
        Some(a) => assert_eq!(e["addr"], a, "{e:#}"),
        None => assert!(e["addr"].is_null(), "{e:#}"),
    }
    assert_eq!(e["allowed"], allowed, "{e:#}");
    assert_eq!(e["reason"], reason, "{e:#}");
    assert!(e["ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{e:#}");
}

/// A denied request's entry: the reason, no bytes moved.
#[track_caller]
fn assert_denied(e: &Value, host: &str, port: u16, addr: Option<&str>, reason: &str) {
    assert_entry(e, host, port, addr, false, reason);
    assert_eq!(e["bytes_up"], 0, "{e:#}");
    assert_eq!(e["bytes_down"], 0, "{e:#}");
}

/// The egress log of `v` as (allowed, denied) entries, each in log order. A denial is
/// logged before the program gets its answer, so denials keep the program's order; an
/// allowed connection is logged when it ends, which may be just after the program went
/// on to its next request: only its order among allowed entries is kept.
#[track_caller]
fn split_log(v: &Value, allowed: usize, denied: usize) -> (Vec<Value>, Vec<Value>) {
    let (ok, no): (Vec<Value>, Vec<Value>) = egress(v).into_iter().partition(|e| e["allowed"] == true);
    assert_eq!(
        (ok.len(), no.len()),
        (allowed, denied),
        "(allowed, denied) entries: {v:#}"
    );
    (ok, no)
}

/// What a 403 from the proxy looks like to the program: [status line, body].
fn forbidden(reason: &str) -> Value {
    json!(["HTTP/1.1 403 Forbidden", format!("{reason}\n")])
}

#[test]
fn allowed_cidr_host_is_reached_by_urllib_with_its_bytes_logged() {
    let net = Net::start();
    let (v, out) = net.python(
        PROXY_ALLOWED,
        r#"
out["hello"] = urlopen("http://10.9.9.9/hello")
status, body = urlopen("http://10.9.9.9/bytes/100000")
out["big"] = [status, len(body), body == "x" * 100000]
req = urllib.request.Request("http://10.9.9.9/upload", data=b"u" * 50000, method="POST")
with urllib.request.urlopen(req, timeout=30) as r:
    out["post"] = [r.status, r.read().decode()]
# The same GET by hand, to know the exact bytes the program received.
s = socket.create_connection(PROXY, timeout=30)
s.sendall(b"GET http://10.9.9.9/bytes/3000 HTTP/1.1\r\nHost: 10.9.9.9\r\nConnection: close\r\n\r\n")
raw = read_all(s)
out["raw"] = [split(raw)[0], len(raw), len(split(raw)[2])]
"#,
    );
    assert_eq!(out["hello"], json!([200, "hello from allowed\n"]), "{v:#}");
    assert_eq!(out["big"], json!([200, 100000, true]), "{v:#}");
    assert_eq!(out["post"], json!([200, "allowed got 50000 bytes\n"]), "{v:#}");
    assert_eq!(out["raw"][0], "HTTP/1.1 200 OK", "{v:#}");
    assert_eq!(out["raw"][2], 3000, "{v:#}");

    let (log, _) = split_log(&v, 4, 0);
    for e in &log {
        assert_entry(
            e,
            ALLOWED,
            80,
            Some(ALLOWED),
            true,
            "allowed by allow_cidrs 10.9.9.9/32",
        );
        let (up, down) = (e["bytes_up"].as_u64().unwrap(), e["bytes_down"].as_u64().unwrap());
        assert!(up > 0 && down > 0, "{e:#}");
    }
    let bytes = |i: usize, k: &str| log[i][k].as_u64().unwrap();
    // Bodies plus heads of at most a few hundred bytes.
    let within = |n: u64, body: u64| (body..body + 400).contains(&n);
    assert!(within(bytes(0, "bytes_down"), 19), "{:#}", log[0]);
    assert!(within(bytes(1, "bytes_down"), 100_000), "{:#}", log[1]);
    assert!(bytes(1, "bytes_up") < 400, "{:#}", log[1]);
    assert!(within(bytes(2, "bytes_up"), 50_000), "{:#}", log[2]);
    assert!(within(bytes(2, "bytes_down"), 24), "{:#}", log[2]);
    // Exactly what the program read.
    assert_eq!(
        bytes(3, "bytes_down"),
        out["raw"][1].as_u64().unwrap(),
        "{:#}",
        log[3]
    );

    assert_eq!(net.connections_to("allowed"), 4, "{:?}", net.connections());
    net.assert_no_forbidden_connections();
}

#[test]
fn curl_in_the_sandbox_reaches_the_allowed_host_by_plain_http_and_connect() {
    if !std::path::Path::new("/usr/bin/curl").exists() {
        eprintln!("NOTE: /usr/bin/curl is absent: the curl check is skipped");
        return;
    }
    let net = Net::start();
    let v = net.run(
        PROXY_ALLOWED,
        &[
            "sh",
            "-c",
            "curl -sS --fail http://10.9.9.9/hello \
             && curl -sS --fail --proxytunnel http://10.9.9.9/hello \
             && curl -sS -o /dev/null -w '%{http_code}\\n' http://169.254.169.254/latest/meta-data/",
        ],
    );
    assert_eq!(v["exit_code"], 0, "{v:#}");
    assert_eq!(
        v["stdout"], "hello from allowed\nhello from allowed\n403\n",
        "{v:#}"
    );
    let (ok, denied) = split_log(&v, 2, 1);
    for e in &ok {
        assert_entry(
            e,
            ALLOWED,
            80,
            Some(ALLOWED),
            true,
            "allowed by allow_cidrs 10.9.9.9/32",
        );
        assert!(e["bytes_down"].as_u64().unwrap() > 19, "{e:#}");
    }
    assert_denied(
        &denied[0],
        METADATA,
        80,
        Some(METADATA),
        "link-local address 169.254.169.254",
    );
    assert_eq!(net.connections_to("allowed"), 2, "{:?}", net.connections());
    net.assert_no_forbidden_connections();
}

#[test]
fn pip_downloads_from_an_allowed_index() {
    let pip = std::process::Command::new(egressutil::python3())
        .args(["-m", "pip", "--version"])
        .output();
    if !pip.is_ok_and(|o| o.status.success()) {
        eprintln!("NOTE: python3 -m pip is absent: the pip check is skipped");
        return;
    }
    let net = Net::start();
    let v = net.run(
        &[
            "--net",
            "proxy",
            "--allow-cidr",
            "10.9.9.9/32",
            "--timeout",
            "60s",
            "--cpus",
            "1",
        ],
        &[
            "sh",
            "-c",
            "python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
             --index-url http://10.9.9.9/simple/ --trusted-host 10.9.9.9 -d /tmp/dl airlock-probe \
             >/tmp/pip.log 2>&1 || { cat /tmp/pip.log; exit 1; }; ls /tmp/dl",
        ],
    );
    assert_eq!(v["exit_code"], 0, "{v:#}");
    assert_eq!(v["stdout"], "airlock_probe-1.0-py3-none-any.whl\n", "{v:#}");
    let log = egress(&v);
    assert!(
        log.len() >= 2 && log.iter().all(|e| e["allowed"] == true && e["addr"] == ALLOWED),
        "{v:#}"
    );
    net.assert_no_forbidden_connections();
}

#[test]
fn an_allowed_name_is_reached_and_an_unlisted_name_is_denied() {
    let net = Net::start();
    let (v, out) = net.python(
        &[
            "--net",
            "proxy",
            "--allow",
            "api.allowed.test",
            "--allow-cidr",
            "203.0.113.7/32",
            "--allow-cidr",
            "10.9.9.9/32",
        ],
        r#"
out["api"] = urlopen("http://api.allowed.test/hello")
# notlisted.test resolves to 10.9.9.9, whose range is allowed: the name must still be listed.
out["notlisted"] = urlopen("http://notlisted.test/hello")
out["lookalike"] = urlopen("http://api.allowed.test.evil.test/hello")
out["port"] = urlopen("http://api.allowed.test:8080/hello")
"#,
    );
    assert_eq!(out["api"], json!([200, "hello from api\n"]), "{v:#}");
    assert_eq!(out["notlisted"], json!([403, "not in allowlist\n"]), "{v:#}");
    assert_eq!(out["lookalike"], json!([403, "not in allowlist\n"]), "{v:#}");
    let port_reason = "port 8080 not in allowlist (allowed by api.allowed.test: 80 and 443)";
    assert_eq!(out["port"], json!([403, format!("{port_reason}\n")]), "{v:#}");

    let (ok, denied) = split_log(&v, 1, 3);
    assert_entry(
        &ok[0],
        "api.allowed.test",
        80,
        Some(API),
        true,
        "allowed by api.allowed.test",
    );
    assert!(ok[0]["bytes_down"].as_u64().unwrap() > 15, "{:#}", ok[0]);
    assert_denied(&denied[0], "notlisted.test", 80, None, "not in allowlist");
    assert_denied(
        &denied[1],
        "api.allowed.test.evil.test",
        80,
        None,
        "not in allowlist",
    );
    assert_denied(&denied[2], "api.allowed.test", 8080, None, port_reason);
    let c = net.connections();
    assert_eq!((c["api"], c["allowed"]), (1, 0), "{c:?}");
    net.assert_no_forbidden_connections();
}

#[test]
fn every_ssrf_form_is_denied_with_its_reason_and_reaches_no_server() {
    // `*.google.internal` is allowed on purpose: metadata names are denied whatever the
    // allowlist says.
    ssrf_forms_are_denied("*.google.internal");
}

/// `--allow '*'` (any public host) still denies every form (issue 15).
#[test]
fn every_ssrf_form_is_denied_under_allow_star() {
    ssrf_forms_are_denied("*");
}

fn ssrf_forms_are_denied(allow: &str) {
    let link_local = "link-local address 169.254.169.254";
    let mapped = "IPv4-mapped address ::ffff:a9fe:a9fe embeds link-local address 169.254.169.254";
    let forms: &[(&str, &str, Option<&str>)] = &[
        ("169.254.169.254", link_local, Some(METADATA)),
        ("2852039166", link_local, Some(METADATA)),
        ("0xa9fea9fe", link_local, Some(METADATA)),
        ("0251.0376.0251.0376", link_local, Some(METADATA)),
        ("169.254.43518", link_local, Some(METADATA)),
        ("0xA9.0xFE.0xA9.0xFE", link_local, Some(METADATA)),
        ("[::ffff:a9fe:a9fe]", mapped, Some("::ffff:a9fe:a9fe")),
        ("[::ffff:169.254.169.254]", mapped, Some("::ffff:a9fe:a9fe")),
        (
            "[fd00:ec2::254]",
            "unique-local address fd00:ec2::254",
            Some("fd00:ec2::254"),
        ),
        ("metadata.google.internal", "cloud metadata name", None),
        ("METADATA.GOOGLE.INTERNAL.", "cloud metadata name", None),
        ("metadata", "cloud metadata name", None),
        ("127.0.0.1", "loopback address 127.0.0.1", Some("127.0.0.1")),
        ("[::1]", "loopback address ::1", Some("::1")),
        ("10.0.0.5", "private address 10.0.0.5", Some("10.0.0.5")),
    ];
    let hosts: Vec<&str> = forms.iter().map(|f| f.0).collect();
    let net = Net::start();
    let (v, out) = net.python(
        &["--net", "proxy", "--allow-cidr", "10.9.9.9/32", "--allow", allow],
        &format!(
            r#"
for host in json.loads('{}'):
    status, _, body = proxy_get(host)
    cstatus, _, cbody = proxy_connect(host + ":80")
    out[host] = [[status, body], [cstatus, cbody]]
# As a program would: urllib through the environment's proxy; CONNECT to port 443.
out["urllib"] = urlopen("http://169.254.169.254/latest/meta-data/iam/security-credentials/")
out["connect443"] = list(proxy_connect("169.254.169.254:443")[::2])
"#,
            serde_json::to_string(&hosts).unwrap()
        ),
    );

    let mut wrong = Vec::new();
    for (host, reason, _) in forms {
        let want = json!([forbidden(reason), forbidden(reason)]);
        if out[host] != want {
            wrong.push(format!("{host}: want {want}, got {}", out[host]));
        }
    }
    assert!(wrong.is_empty(), "wrong answers:\n{}", wrong.join("\n"));
    assert_eq!(out["urllib"], json!([403, format!("{link_local}\n")]));
    assert_eq!(out["connect443"], forbidden(link_local));

    let log = egress(&v);
    assert_eq!(log.len(), 2 * forms.len() + 2, "{v:#}");
    for (i, (host, reason, addr)) in forms.iter().enumerate() {
        for e in &log[2 * i..2 * i + 2] {
            assert_eq!(e["port"], 80, "{host}: {e:#}");
            assert_eq!(e["allowed"], false, "{host}: {e:#}");
            assert_eq!(e["reason"], *reason, "{host}: {e:#}");
            assert_eq!(e["addr"], json!(addr), "{host}: {e:#}");
            assert_eq!(
                (e["bytes_up"].as_u64(), e["bytes_down"].as_u64()),
                (Some(0), Some(0)),
                "{e:#}"
            );
        }
    }
    let tail = &log[2 * forms.len()..];
    assert_denied(&tail[0], METADATA, 80, Some(METADATA), link_local);
    assert_denied(&tail[1], METADATA, 443, Some(METADATA), link_local);
    net.assert_no_forbidden_connections();
}

#[test]
fn metadata_names_are_denied_even_when_their_address_is_allowed_on_purpose() {
    let net = Net::start();
    let (v, out) = net.python(
        &[
            "--net",
            "proxy",
            "--allow-cidr",
            "169.254.169.254/32",
            "--allow",
            "*.google.internal",
        ],
        r#"
out["addr"] = proxy_get("169.254.169.254", "/hello")[::2]
for host in ["metadata.google.internal", "Metadata.Google.Internal.", "metadata"]:
    out[host] = [proxy_get(host, "/hello")[::2], proxy_connect(host + ":80")[::2]]
"#,
    );
    // Allowing the range on purpose does reach it: the one connection the server sees.
    assert_eq!(
        out["addr"],
        json!(["HTTP/1.1 200 OK", "hello from metadata\n"]),
        "{v:#}"
    );
    for host in [
        "metadata.google.internal",
        "Metadata.Google.Internal.",
        "metadata",
    ] {
        let want = forbidden("cloud metadata name");
        assert_eq!(out[host], json!([want, want]), "{host}: {v:#}");
    }
    let (ok, denied) = split_log(&v, 1, 6);
    assert_entry(
        &ok[0],
        METADATA,
        80,
        Some(METADATA),
        true,
        "allowed by allow_cidrs 169.254.169.254/32",
    );
    for e in &denied {
        assert_eq!(
            (&e["allowed"], &e["reason"]),
            (&json!(false), &json!("cloud metadata name")),
            "{e:#}"
        );
    }
    assert_eq!(net.connections_to("metadata"), 1, "{:?}", net.connections());
}

#[test]
fn dns_rebinding_to_a_denied_address_is_denied() {
    let net = Net::start();
    let (v, out) = net.python(
        &[
            "--net",
            "proxy",
            "--allow",
            "rebind.allowed.test",
            "--allow",
            "rebind6.allowed.test",
            "--allow-cidr",
            "10.9.9.9/32",
        ],
        r#"
out["get"] = proxy_get("rebind.allowed.test")[::2]
out["urllib"] = urlopen("http://rebind.allowed.test/latest/meta-data/")
out["connect"] = list(proxy_connect("rebind.allowed.test:443")[::2])
out["v6"] = proxy_get("rebind6.allowed.test")[::2]
"#,
    );
    let link_local = "link-local address 169.254.169.254";
    let ula = "unique-local address fd00:ec2::254";
    assert_eq!(out["get"], forbidden(link_local), "{v:#}");
    assert_eq!(out["urllib"], json!([403, format!("{link_local}\n")]), "{v:#}");
    assert_eq!(out["connect"], forbidden(link_local), "{v:#}");
    assert_eq!(out["v6"], forbidden(ula), "{v:#}");
    let log = egress(&v);
    assert_eq!(log.len(), 4, "{v:#}");
    assert_denied(&log[0], "rebind.allowed.test", 80, Some(METADATA), link_local);
    assert_denied(&log[1], "rebind.allowed.test", 80, Some(METADATA), link_local);
    assert_denied(&log[2], "rebind.allowed.test", 443, Some(METADATA), link_local);
    assert_denied(&log[3], "rebind6.allowed.test", 80, Some("fd00:ec2::254"), ula);
    net.assert_no_forbidden_connections();
}

#[test]
fn a_multi_address_answer_with_one_denied_address_is_denied() {
    let net = Net::start();
    // multi.allowed.test has two hosts-file entries: 10.9.9.9 (allowed) and 169.254.169.254.
    let (v, out) = net.python(
        &[
            "--net",
            "proxy",
            "--allow",
            "multi.allowed.test",
            "--allow",
            "intranet.allowed.test",
            "--allow-cidr",
            "10.9.9.9/32",
        ],
        r#"
out["control"] = proxy_get("intranet.allowed.test", "/hello")[::2]
out["get"] = proxy_get("multi.allowed.test", "/hello")[::2]
out["connect"] = list(proxy_connect("multi.allowed.test:80")[::2])
"#,
    );
    let link_local = "link-local address 169.254.169.254";
    assert_eq!(
        out["control"],
        json!(["HTTP/1.1 200 OK", "hello from allowed\n"]),
        "{v:#}"
    );
    assert_eq!(out["get"], forbidden(link_local), "{v:#}");
    assert_eq!(out["connect"], forbidden(link_local), "{v:#}");
    let (ok, denied) = split_log(&v, 1, 2);
    assert_entry(
        &ok[0],
        "intranet.allowed.test",
        80,
        Some(ALLOWED),
        true,
        "allowed by intranet.allowed.test",
    );
    assert_denied(&denied[0], "multi.allowed.test", 80, Some(METADATA), link_local);
    assert_denied(&denied[1], "multi.allowed.test", 80, Some(METADATA), link_local);
    // Only the control request connected anywhere: not even the allowed address of the
    // mixed answer was tried.
    assert_eq!(net.connections_to("allowed"), 1, "{:?}", net.connections());
    net.assert_no_forbidden_connections();
}

#[test]
fn a_redirect_to_the_metadata_address_is_not_followed_and_denied_on_follow() {
    let net = Net::start();
    let (v, out) = net.python(
        PROXY_ALLOWED,
        r#"
to = "http://169.254.169.254/latest/meta-data/"
status, headers, body = proxy_get("10.9.9.9", "/redirect?to=" + to)
out["raw"] = [status, [h for h in headers if h.lower().startswith("location:")], body]
# urllib follows the redirect itself: a new request, judged anew.
out["urllib"] = urlopen("http://10.9.9.9/redirect?to=" + to)
out["by_name"] = urlopen("http://10.9.9.9/redirect?to=http://metadata.google.internal/")
"#,
    );
    let link_local = "link-local address 169.254.169.254";
    assert_eq!(
        out["raw"],
        json!([
            "HTTP/1.1 302 Found",
            ["Location: http://169.254.169.254/latest/meta-data/"],
            "moved\n"
        ]),
        "the proxy relays the redirect, never follows it: {v:#}"
    );
    assert_eq!(out["urllib"], json!([403, format!("{link_local}\n")]), "{v:#}");
    assert_eq!(out["by_name"], json!([403, "cloud metadata name\n"]), "{v:#}");
    let (ok, denied) = split_log(&v, 3, 2);
    for e in &ok {
        assert_entry(
            e,
            ALLOWED,
            80,
            Some(ALLOWED),
            true,
            "allowed by allow_cidrs 10.9.9.9/32",
        );
    }
    assert_denied(&denied[0], METADATA, 80, Some(METADATA), link_local);
    assert_denied(
        &denied[1],
        "metadata.google.internal",
        80,
        None,
        "cloud metadata name",
    );
    assert_eq!(net.connections_to("allowed"), 3, "{:?}", net.connections());
    net.assert_no_forbidden_connections();
}

#[test]
fn connect_tunnels_raw_tcp_to_an_allowed_port_and_refuses_a_denied_address() {
    let net = Net::start();
    let (v, out) = net.python(
        &[
            "--net",
            "proxy",
            "--allow-cidr",
            "10.9.9.9/32",
            "--allow",
            "intranet.allowed.test:7000",
        ],
        r#"
def echo(authority, data):
    status, s, body = proxy_connect(authority)
    if s is None:
        return [status, body]
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    back = read_all(s)
    s.close()
    return [status, len(back), back == data]

out["addr"] = echo("10.9.9.9:7000", b"ping-" * 20000)
out["name"] = echo("intranet.allowed.test:7000", b"pong" * 10)
out["name_other_port"] = echo("intranet.allowed.test:80", b"x")
out["metadata"] = echo("169.254.169.254:443", b"x")
out["private"] = echo("10.0.0.5:80", b"x")
"#,
    );
    let established = "HTTP/1.1 200 Connection Established";
    assert_eq!(out["addr"], json!([established, 100_000, true]), "{v:#}");
    assert_eq!(out["name"], json!([established, 40, true]), "{v:#}");
    let port_reason = "port 80 not in allowlist (allowed by intranet.allowed.test:7000: 7000)";
    assert_eq!(out["name_other_port"], forbidden(port_reason), "{v:#}");
    assert_eq!(
        out["metadata"],
        forbidden("link-local address 169.254.169.254"),
        "{v:#}"
    );
    assert_eq!(out["private"], forbidden("private address 10.0.0.5"), "{v:#}");

    let (ok, denied) = split_log(&v, 2, 3);
    assert_entry(
        &ok[0],
        ALLOWED,
        7000,
        Some(ALLOWED),
        true,
        "allowed by allow_cidrs 10.9.9.9/32",
    );
    assert_eq!(
        (&ok[0]["bytes_up"], &ok[0]["bytes_down"]),
        (&json!(100_000), &json!(100_000)),
        "{v:#}"
    );
    assert_entry(
        &ok[1],
        "intranet.allowed.test",
        7000,
        Some(ALLOWED),
        true,
        "allowed by intranet.allowed.test:7000",
    );
    assert_eq!(
        (&ok[1]["bytes_up"], &ok[1]["bytes_down"]),
        (&json!(40), &json!(40)),
        "{v:#}"
    );
    assert_denied(&denied[0], "intranet.allowed.test", 80, None, port_reason);
    assert_denied(
        &denied[1],
        METADATA,
        443,
        Some(METADATA),
        "link-local address 169.254.169.254",
    );
    assert_denied(
        &denied[2],
        "10.0.0.5",
        80,
        Some("10.0.0.5"),
        "private address 10.0.0.5",
    );
    let c = net.connections();
    assert_eq!((c["echo"], c["allowed"]), (2, 0), "{c:?}");
    net.assert_no_forbidden_connections();
}

#[test]
fn a_tunnel_still_open_when_the_program_ends_is_logged() {
    let net = Net::start();
    // A background process holds a tunnel open; the program ends first, and the sandbox
    // kills the rest. The connection still belongs in this exec's egress log.
    let script = r#"python3 -c '
import socket, time
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT 10.9.9.9:7000 HTTP/1.1\r\n\r\nhello")
print(s.recv(39) + s.recv(5), flush=True)
time.sleep(30)
' &
sleep 0.3"#;
    let mut missing = Vec::new();
    for round in 0..8 {
        let v = net.run(PROXY_ALLOWED, &["sh", "-c", script]);
        assert_eq!(v["exit_code"], 0, "{v:#}");
        let log = egress(&v);
        if log.len() != 1 {
            missing.push(format!("round {round}: {v:#}"));
            continue;
        }
        let e = &log[0];
        assert_eq!(
            (&e["host"], &e["port"], &e["addr"]),
            (&json!(ALLOWED), &json!(ECHO_PORT), &json!(ALLOWED)),
            "{e:#}"
        );
        assert_eq!(e["allowed"], true, "{e:#}");
        // How it ended is noted after the decision ("; closed: …").
        let reason = e["reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with("allowed by allow_cidrs 10.9.9.9/32"), "{e:#}");
        assert_eq!(
            (&e["bytes_up"], &e["bytes_down"]),
            (&json!(5), &json!(5)),
            "{e:#}"
        );
    }
    assert!(
        missing.is_empty(),
        "{} of 8 results lack the tunnel's entry:\n{}",
        missing.len(),
        missing.join("\n")
    );
    assert_eq!(net.connections_to("echo"), 8, "{:?}", net.connections());
}

/// The landlock ABI version of the running kernel (0 without landlock).
fn landlock_abi() -> i64 {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attr and size 0 only queries.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    v.max(0)
}

/// Python helper: a direct TCP connection (no proxy) and where it landed in the sandbox's
/// network namespace: the peer the program sees, its source address, and the local port
/// of the accepted end (from /proc/net/tcp: the socket whose peer is the program's).
const REDIRECTED: &str = r#"
def redirected(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, port))
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
    me, peer = s.getsockname(), s.getpeername()
    landed = None
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, remote, state = line.split()[1:4]
            if int(remote.split(":")[1], 16) == me[1] and state == "01":
                landed = int(local.split(":")[1], 16)
    s.close()
    return {"peer": list(peer), "source": me[0], "landed_on": landed}
"#;

#[test]
fn in_proxy_mode_direct_tcp_is_redirected_to_the_transparent_port_and_other_udp_is_refused() {
    let net = Net::start();
    let (v, out) = net.python(
        PROXY_ALLOWED,
        &format!(
            "{REDIRECTED}\n{}",
            r#"
out["allowed"] = redirected("10.9.9.9", 80)
out["api443"] = redirected("203.0.113.7", 443)
out["metadata"] = redirected("169.254.169.254", 80)
out["metadata6"] = direct("fd00:ec2::254", 80)
out["udp"] = udp("198.51.100.1", 9)
out["udp_allowed"] = udp("10.9.9.9", 7000)
out["dns_anywhere"] = udp("198.51.100.1", 53)
out["interfaces"] = interfaces()
# Loopback is not redirected: landlock lets the program connect anywhere, and nothing
# listens there but the proxy's sockets.
out["loopback_other_port"] = direct("127.0.0.1", 8000)
out["proxy_port"] = direct("127.0.0.1", 3128)
"#
        ),
    );
    // The only listener that could complete these handshakes is the transparent one in
    // the sandbox's own namespace: the fake hosts are in the test's namespace, and without
    // the redirect the SYN would go to the TUN device, where nothing reads it.
    for (k, host, port) in [
        ("allowed", "10.9.9.9", 80),
        ("api443", "203.0.113.7", 443),
        ("metadata", "169.254.169.254", 80),
    ] {
        assert_eq!(
            out[k],
            json!({"peer": [host, port], "source": "192.0.0.8", "landed_on": 3129}),
            "{k}: {v:#}"
        );
    }
    assert_eq!(out["metadata6"], "ENETUNREACH", "{v:#}");
    assert_eq!(out["udp"], "EPERM", "{v:#}");
    assert_eq!(out["udp_allowed"], "EPERM", "{v:#}");
    assert_eq!(out["dns_anywhere"], "sent", "{v:#}");
    assert_eq!(out["interfaces"], json!(["lo", "airlock0"]), "{v:#}");
    assert_eq!(out["proxy_port"], "connected", "{v:#}");
    assert_eq!(out["loopback_other_port"], "ECONNREFUSED", "{v:#}");
    // The proxy served each by its original destination: the allowed host reached (its
    // one connection), the others refused and logged, never connected to.
    let c = net.connections();
    assert_eq!((c["allowed"], c["echo"], c["api"]), (1, 0, 0), "{c:?}");
    net.assert_no_forbidden_connections();
    let log = egress(&v);
    let redirected: Vec<(String, u64, bool)> = log
        .iter()
        .filter(|e| e["kind"] == "redirected")
        .map(|e| {
            (
                e["host"].as_str().unwrap().to_owned(),
                e["port"].as_u64().unwrap(),
                e["allowed"].as_bool().unwrap(),
            )
        })
        .collect();
    for want in [
        ("10.9.9.9".to_owned(), 80, true),
        ("203.0.113.7".to_owned(), 443, false),
        ("169.254.169.254".to_owned(), 80, false),
    ] {
        assert!(redirected.contains(&want), "{want:?} not in {log:#?}");
    }
}

#[test]
fn proxy_mode_resolv_conf_names_the_sandboxs_resolver() {
    let net = Net::start();
    let (v, out) = net.python(
        &["--net", "proxy"],
        r#"
out["resolv"] = open("/etc/resolv.conf").read()
out["hosts"] = [l for l in open("/etc/nsswitch.conf").read().splitlines() if l.startswith("hosts:")]
"#,
    );
    assert_eq!(out["resolv"], "nameserver 127.0.0.1\n", "{v:#}");
    assert_eq!(out["hosts"], json!(["hosts: files dns"]), "{v:#}");
}

#[test]
fn none_mode_has_no_route_no_tun_device_and_no_tcp_connect() {
    let net = Net::start();
    let (v, out) = net.python(
        &["--net", "none"],
        r#"
out["tcp"] = direct("203.0.113.7", 443)
out["loopback"] = direct("127.0.0.1", 3129)
out["udp"] = udp("198.51.100.1", 9)
out["dns"] = udp("198.51.100.1", 53)
out["interfaces"] = interfaces()
out["resolv"] = open("/etc/resolv.conf").read()
"#,
    );
    // UDP, which landlock does not cover, shows there is no route at all.
    assert_eq!(out["udp"], "ENETUNREACH", "{v:#}");
    assert_eq!(out["dns"], "ENETUNREACH", "{v:#}");
    assert_eq!(out["interfaces"], json!(["lo"]), "{v:#}");
    assert_eq!(out["resolv"], "", "{v:#}");
    if landlock_abi() >= 4 {
        // No TCP connect at all, not even on loopback.
        assert_eq!(out["tcp"], "EACCES", "{v:#}");
        assert_eq!(out["loopback"], "EACCES", "{v:#}");
    } else {
        eprintln!("NOTE: landlock has no TCP rules on this kernel: the connect checks are weaker");
        assert_eq!(out["tcp"], "ENETUNREACH", "{v:#}");
    }
}

#[test]
fn proxy_mode_sets_the_proxy_environment() {
    let net = Net::start();
    let (v, out) = net.python(
        &["--net", "proxy"],
        r#"
out = {k: v for k, v in os.environ.items() if "proxy" in k.lower()}
"#,
    );
    let proxy = "http://127.0.0.1:3128";
    for k in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
    ] {
        assert_eq!(out[k], proxy, "{k}: {v:#}");
    }
    let no_proxy = out["NO_PROXY"]
        .as_str()
        .unwrap_or_else(|| panic!("NO_PROXY unset: {v:#}"));
    let entries: Vec<&str> = no_proxy.split(',').collect();
    for e in ["localhost", "127.0.0.1"] {
        assert!(entries.contains(&e), "NO_PROXY {no_proxy:?} lacks {e}");
    }
}

/// `curl --noproxy '*'` ignores the proxy variables: its connections are redirected and
/// judged just the same (issue 15): the allowed host answers, a denied one gets the
/// proxy's 403 with the reason, and both are logged as redirected.
#[test]
fn curl_ignoring_the_proxy_variables_is_policed() {
    let net = Net::start();
    let v = net.run(
        PROXY_ALLOWED,
        &[
            "sh",
            "-c",
            "curl -s --noproxy '*' http://10.9.9.9/hello; curl -s --noproxy '*' http://203.0.113.7/",
        ],
    );
    assert_eq!(
        v["stdout"], "hello from allowed\ndocumentation address 203.0.113.7\n",
        "{v:#}"
    );
    let log = egress(&v);
    assert!(log.iter().all(|e| e["kind"] == "redirected"), "{log:#?}");
    assert_eq!(log.len(), 2, "{log:#?}");
    assert_eq!(net.connections_to("allowed"), 1);
    assert_eq!(net.connections_to("api"), 0);
}
