//! Issue 15, secrets: a value the program can use but never read. The real `airlock run
//! --secret` inside a network namespace of the test's own (tests/egressutil: fake hosts on
//! its loopback, nothing leaves it), with a fake HTTPS API whose certificate comes from a
//! test CA that airlock trusts through `SSL_CERT_FILE` in its own environment.
//!
//! The fake API never echoes what it receives: it records the `Authorization` header in
//! a file on the host side and answers `authorized` or `refused`, so the value cannot come
//! back into the sandbox through it. Each tier the host has runs the same checks.

mod common;
mod egressutil;

use egressutil::{ALLOWED, Net, PRELUDE, egress};
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The secret's value: distinctive, so any copy of it is found.
const VALUE: &str = "sk-test-0f1e2d3c4b5a69788796a5b4c3d2e1f0-airlock";

/// The API host the secret goes to, and a TLS host it does not (both 10.9.9.9 in the
/// test's hosts file, on port 443).
const API_HOST: &str = "intranet.allowed.test";
const OTHER_HOST: &str = "notlisted.test";

/// A public address for the README's hosts (api.github.com, example.com): on the test
/// namespace's loopback like every fake host, so the README's lines run as typed (a
/// private address would need an --allow-cidr they do not have).
const PUBLIC: &str = "93.184.215.14";

/// The fake HTTPS API: `python3 SCRIPT CERT KEY LOG EXPECTED READY ADDR`, on ADDR:443.
const TLS_SERVER: &str = r#"
import http.server, socketserver, ssl, sys, threading
cert, key, log, expected, ready, addr, port = sys.argv[1:8]
lock = threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        with lock, open(log, "a") as f:
            f.write(f"{self.headers.get('Host')} {self.path} {auth}\n")
        body = (b"authorized\n" if auth == "Bearer " + expected else b"refused\n")
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
if cert != "-":
    ctx.load_cert_chain(cert, key)
srv = S((addr, int(port)), H)
if cert != "-":
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
open(ready, "w").close()
srv.serve_forever()
"#;

/// A test CA and a certificate for both hosts, made with openssl.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::Builder::new().prefix("airlock-pki-").tempdir().unwrap();
        let d = dir.path();
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .expect("openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=airlock test CA",
        ]);
        std::fs::write(
            d.join("ext.cnf"),
            format!(
                "subjectAltName=DNS:{API_HOST},DNS:{OTHER_HOST},IP:10.9.9.9,DNS:api.github.com,DNS:example.com,IP:{PUBLIC}\n"
            ),
        )
        .unwrap();
        run(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "host.key",
            "-out",
            "host.csr",
            "-subj",
            "/CN=fake api",
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            "host.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "host.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ]);
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// The fake API, running in the test's namespace until dropped.
struct Api {
    child: Child,
    log: PathBuf,
}

impl Api {
    fn start(net: &Net, pki: &Pki) -> Api {
        Api::start_on(net, Some(pki), "10.9.9.9", 443)
    }

    /// On `addr:port`, with TLS when `pki` is given.
    fn start_on(net: &Net, pki: Option<&Pki>, addr: &str, port: u16) -> Api {
        let log = net.dir.path().join(format!("api-{addr}-{port}.log"));
        let ready = net.dir.path().join(format!("api-{addr}-{port}.ready"));
        let (cert, key) = match pki {
            Some(pki) => (pki.path("host.pem"), pki.path("host.key")),
            None => ("-".into(), "-".into()),
        };
        let child = net
            .nsenter(egressutil::python3())
            .args(["-c", TLS_SERVER])
            .arg(cert)
            .arg(key)
            .arg(&log)
            .arg(VALUE)
            .arg(&ready)
            .arg(addr)
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the fake API");
        egressutil::poll(Duration::from_secs(20), || ready.exists().then_some(()))
            .expect("the fake API did not start");
        Api { child, log }
    }

    /// The requests it saw: (host, path, authorization).
    fn seen(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the program does: uses the secret through the proxy and directly, sends its
/// placeholder where it may not go, talks TLS to a host without secrets, and looks for
/// the value everywhere it can read.
const PROGRAM: &str = r#"
import ssl, glob
token = os.environ["API_TOKEN"]
out["placeholder"] = token
def get(url, proxy=True, headers=None):
    h = urllib.request.ProxyHandler() if proxy else urllib.request.ProxyHandler({})
    o = urllib.request.build_opener(h, urllib.request.HTTPSHandler(context=ssl.create_default_context()))
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with o.open(req, timeout=30) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()]
    except Exception as e:
        return ["error", repr(e)]
auth = {"Authorization": "Bearer " + token}
out["via_proxy"] = get("https://API_HOST/v1/models", True, auth)
out["direct"] = get("https://API_HOST/v1/direct", False, auth)
out["leak_plain"] = get("http://10.9.9.9/hello", True, {"X-Key": token})
# TLS to a host without secrets: the fake host's own certificate, not airlock's.
s = socket.create_connection(("OTHER_HOST", 443), timeout=30)
t = ssl.create_default_context().wrap_socket(s, server_hostname="OTHER_HOST")
out["other_issuer"] = dict(x[0] for x in t.getpeercert()["issuer"])["commonName"]
t.close()
# The value anywhere the program can read: its environment, files, its own memory. The
# program holds only a pattern matching it (the value's last character in brackets), so
# nothing it brought along is a copy of the value.
import re
needle = re.compile(rb"VALUE_RE")
found = []
if needle.search(open("/proc/self/environ", "rb").read()):
    found.append("environ")
for root in ["/workspace", "/tmp", "/etc"]:
    for p in glob.glob(root + "/**", recursive=True):
        try:
            if os.path.isfile(p) and needle.search(open(p, "rb").read()):
                found.append(p)
        except OSError:
            pass
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    for line in maps:
        addr, perms = line.split()[:2]
        if "r" not in perms:
            continue
        lo, hi = (int(x, 16) for x in addr.split("-"))
        try:
            mem.seek(lo)
            if needle.search(mem.read(hi - lo)):
                found.append("memory " + line.split()[-1] if len(line.split()) > 5 else "memory")
        except (OSError, ValueError, OverflowError):
            pass
out["found"] = found
"#;

fn run(net: &Net, pki: &Pki, tier: &[&str]) -> (Value, String) {
    let program = format!(
        "{PRELUDE}\n{}\nprint(json.dumps(out))\n",
        PROGRAM
            .replace("API_HOST", API_HOST)
            .replace("OTHER_HOST", OTHER_HOST)
            .replace(
                "VALUE_RE",
                &format!("{}[{}]", &VALUE[..VALUE.len() - 1], &VALUE[VALUE.len() - 1..])
            )
    );
    let mut cmd = net.airlock();
    cmd.env("SSL_CERT_FILE", pki.path("ca.pem"))
        .env("API_TOKEN", VALUE)
        .env("RUST_LOG", "debug")
        .arg("run")
        .args(tier)
        .args(["--net", "proxy", "--allow-cidr", "10.9.9.9/32"])
        .args(["--allow", API_HOST, "--allow", OTHER_HOST, "--allow", ALLOWED])
        .args(["--secret", &format!("API_TOKEN@{API_HOST}")])
        .args(["--timeout", "60s", "--json", "--", "python3", "-c", &program])
        .stdin(Stdio::null());
    let out = cmd.output().expect("run airlock");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "airlock failed: {stderr}\n{stdout}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    (v, format!("{stdout}\n{stderr}"))
}

fn secrets_never_enter_the_sandbox(tier: &[&str], direct_works: bool) {
    let net = Net::start();
    let pki = Pki::new();
    let api = Api::start(&net, &pki);
    let (v, everything) = run(&net, &pki, tier);
    assert_eq!(v["exit_code"], 0, "{v:#}");
    let out: Value = serde_json::from_str(v["stdout"].as_str().unwrap().lines().last().unwrap()).unwrap();

    // The program saw a placeholder, and the API got the value, through the proxy and
    // (where connections are redirected) directly.
    let placeholder = out["placeholder"].as_str().unwrap();
    assert!(placeholder.starts_with("airlock-ph-"), "{out:#}");
    assert_eq!(
        out["via_proxy"],
        serde_json::json!([200, "authorized\n"]),
        "{out:#}"
    );
    if direct_works {
        assert_eq!(out["direct"], serde_json::json!([200, "authorized\n"]), "{out:#}");
    }
    let seen = api.seen();
    assert!(
        seen.iter()
            .any(|l| l == &format!("{API_HOST} /v1/models Bearer {VALUE}")),
        "{seen:?}"
    );
    // The value is nowhere the program can read, nor in the result or airlock's output.
    assert_eq!(out["found"], serde_json::json!([]), "{out:#}");
    assert!(
        !everything.contains(VALUE),
        "the value leaked into airlock's output"
    );
    // A placeholder sent to a host the secret does not name is refused, never sent.
    assert_eq!(out["leak_plain"][0], 403, "{out:#}");
    let reason = out["leak_plain"][1].as_str().unwrap();
    assert!(
        reason.contains("placeholder of secret API_TOKEN sent to 10.9.9.9"),
        "{reason}"
    );
    assert_eq!(net.connections_to("allowed"), 0, "{:?}", net.connections());
    // TLS to a host without secrets is end to end: the fake host's own certificate.
    assert_eq!(out["other_issuer"], "airlock test CA", "{out:#}");
    let log = egress(&v);
    let intercepted: Vec<&Value> = log
        .iter()
        .filter(|e| {
            e["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("TLS intercepted for secret API_TOKEN")
        })
        .collect();
    assert!(!intercepted.is_empty(), "{log:#?}");
    assert!(
        log.iter().any(|e| e["allowed"] == false
            && e["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("placeholder of secret API_TOKEN")),
        "{log:#?}"
    );
    net.assert_no_forbidden_connections();
}

#[test]
fn namespaces_secrets_never_enter_the_sandbox() {
    secrets_never_enter_the_sandbox(&[], true);
}

#[test]
fn gvisor_secrets_never_enter_the_sandbox() {
    secrets_never_enter_the_sandbox(&["--isolation", "gvisor"], true);
}

#[test]
fn microvm_secrets_never_enter_the_sandbox() {
    secrets_never_enter_the_sandbox(&["--isolation", "microvm"], true);
}

/// `airlock ARGS` as a line of the README writes them (split as sh does), run in `net`.
fn run_line(net: &Net, pki: &Pki, line: &str, env: &[(&str, &str)]) -> std::process::Output {
    let split = Command::new(egressutil::python3())
        .args([
            "-c",
            "import json, shlex, sys; print(json.dumps(shlex.split(sys.argv[1])))",
        ])
        .arg(line)
        .output()
        .unwrap();
    let args: Vec<String> = serde_json::from_slice(&split.stdout).unwrap();
    let mut cmd = net.airlock();
    cmd.env("SSL_CERT_FILE", pki.path("ca.pem"))
        .args(&args)
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The test namespace with the README's hosts (api.github.com, example.com) on a public
/// address, served by the fake API (HTTPS), and a plain-HTTP one on port 80 of it.
fn readme_net() -> (Net, Pki, Api, Api) {
    let net = Net::start();
    let st = Command::new("ip")
        .args([
            "-n",
            &net.name,
            "addr",
            "add",
            &format!("{PUBLIC}/32"),
            "dev",
            "lo",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let mut hosts = std::fs::read_to_string(net.hosts_file()).unwrap();
    hosts.push_str(&format!("{PUBLIC} api.github.com example.com\n"));
    std::fs::write(net.hosts_file(), hosts).unwrap();
    let pki = Pki::new();
    let api = Api::start_on(&net, Some(&pki), PUBLIC, 443);
    let plain = Api::start_on(&net, None, PUBLIC, 80);
    (net, pki, api, plain)
}

/// docs/network.md's first example with `*` and a deny rule ("Network: none, or out
/// through the filtering proxy"), as typed: example.com is any public host.
#[test]
fn readme_star_and_deny_example_runs_as_typed() {
    let block = common::docs::doc_shell_block(
        "docs/network.md",
        "# Network: none, or out through the filtering proxy",
    );
    let line = block
        .lines()
        .find(|l| l.starts_with("airlock run --net proxy --allow '*' --deny"))
        .expect("the README's line");
    let (net, pki, _api, api) = readme_net();
    let out = run_line(&net, &pki, line.strip_prefix("airlock ").unwrap(), &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout, "refused\n",
        "the fake API's answer to a request without a token"
    );
    assert_eq!(api.seen(), ["example.com / "]);
    // The same line's deny rule, with a host it covers: refused before any lookup.
    let denied = line.replace("http://example.com/", "http://db.internal.example/");
    let out = run_line(&net, &pki, denied.strip_prefix("airlock ").unwrap(), &[]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "denied by *.internal.example\n"
    );
    assert_eq!(api.seen().len(), 1);
}

/// docs/network.md's secret example ("Secrets the sandbox can use but never read"), as typed
/// but for the value: `api.github.com` is the fake API on a public address of the test's
/// namespace, whose certificate airlock trusts through `SSL_CERT_FILE`.
#[test]
fn readme_secret_example_runs_as_typed() {
    let block =
        common::docs::doc_shell_block("docs/network.md", "## Secrets the sandbox can use but never read");
    let line = block.replace("\\\n", " ");
    let line = line.trim();
    let args = line
        .strip_prefix("GITHUB_TOKEN=ghp_... airlock ")
        .unwrap_or_else(|| panic!("the README's line changed: {line}"));
    let (net, pki, api, _plain) = readme_net();
    let out = run_line(&net, &pki, args, &[("GITHUB_TOKEN", VALUE)]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout, "authorized\n", "{stderr}");
    assert!(!stdout.contains(VALUE) && !stderr.contains(VALUE));
    let seen = api.seen();
    assert_eq!(seen, [format!("api.github.com /user Bearer {VALUE}")], "{seen:?}");
}

/// docs/network.md's two `--allow-cidr` examples ("Reaching an internal service on
/// purpose"), as typed: 10.1.2.3 is the fake API (plain HTTP, on ports 8080 and 80) on a
/// private address of the test namespace's loopback, and `build-cache.internal` names it
/// there. Without the allowed range the same private address is refused.
#[test]
fn docs_allow_cidr_examples_run_as_typed() {
    let block = common::docs::doc_shell_block("docs/network.md", "## The policy");
    let lines: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 2, "docs/network.md's block changed: {block}");
    let net = Net::start();
    let st = Command::new("ip")
        .args(["-n", &net.name, "addr", "add", "10.1.2.3/32", "dev", "lo"])
        .status()
        .unwrap();
    assert!(st.success());
    let mut hosts = std::fs::read_to_string(net.hosts_file()).unwrap();
    hosts.push_str("10.1.2.3 build-cache.internal\n");
    std::fs::write(net.hosts_file(), hosts).unwrap();
    let pki = Pki::new();
    let health = Api::start_on(&net, None, "10.1.2.3", 8080);
    let cache = Api::start_on(&net, None, "10.1.2.3", 80);
    for (line, api, seen) in [
        (lines[0], &health, "10.1.2.3:8080 /health "),
        (lines[1], &cache, "build-cache.internal / "),
    ] {
        let args = line
            .strip_prefix("airlock ")
            .unwrap_or_else(|| panic!("docs/network.md's line changed: {line}"));
        let out = run_line(&net, &pki, args, &[]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{line}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(stdout, "refused\n", "{line}: the fake API's answer");
        assert_eq!(api.seen(), [seen], "{line}");
        // The range is what lets it through: without it, a private address is refused.
        let without = args.replace("--allow-cidr ", "--env X=");
        let out = run_line(&net, &pki, &without, &[]);
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("refused"),
            "{without}: reached the private address without --allow-cidr"
        );
        assert_eq!(api.seen().len(), 1, "{without}");
    }
}
