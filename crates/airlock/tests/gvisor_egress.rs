//! Issue 15 on the gVisor tier: no way around the proxy, DNS to airlock's resolver. The
//! real `airlock run --isolation gvisor` inside a network namespace of the test's own
//! (tests/egressutil: fake "remote" hosts on its loopback, nothing leaves it); the
//! sandbox itself has no network device at all, only the agent's relay to the host.

mod common;
mod egressutil;
mod tierutil;

use egressutil::{ALLOWED, API, Net, egress};
use serde_json::json;

/// A program that ignores the proxy variables (raw sockets, urllib with no proxy)
/// connects straight to addresses: each connection is redirected to the proxy inside the
/// sandbox, and the host side learns its original destination: the allowed address is
/// served by the fake host, the refused one is logged under its own address and the fake
/// host never sees it. DNS sent to any address reaches the host side and is answered
/// from the address asked; other UDP gets nothing back; IPv6 has no route.
#[test]
fn gvisor_redirects_direct_connections_to_the_proxy_with_their_original_destination() {
    redirects_with_original_destination(&[]);
}

/// The same in an image's root (the python image of tests/tierutil): the agent needs no
/// binary of the root to set the redirections up, and the image's /etc names airlock's
/// resolver.
#[test]
fn gvisor_redirects_direct_connections_in_an_image() {
    let img = tierutil::image::python_image();
    let store = img.store.to_str().expect("UTF-8 store path");
    redirects_with_original_destination(&["--image-store", store, "--image", img.name, "--pull", "never"]);
}

fn redirects_with_original_destination(image: &[&str]) {
    let net = Net::start();
    let mut args = image.to_vec();
    args.extend([
        "--isolation",
        "gvisor",
        "--net",
        "proxy",
        "--allow-cidr",
        "10.9.9.9/32",
        "--timeout",
        "120s",
    ]);
    let (v, out) = net.python(
        &args,
        r#"
def raw_get(host, port, path):
    """A GET on a plain socket to the address itself: [status line, body] or the errno."""
    try:
        s = socket.create_connection((host, port), timeout=30)
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        status, _, body = split(read_all(s))
        return [status, body]
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
    finally:
        s.close()

out["raw"] = raw_get("10.9.9.9", 80, "/hello")
no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with no_proxy.open("http://10.9.9.9/hello", timeout=30) as r:
    out["urllib"] = [r.status, r.read().decode()]
out["refused"] = raw_get("203.0.113.7", 80, "/hello")
out["v6"] = direct("fd00:ec2::254", 80)

# A DNS query (id 0xabcd, example.com A) to an address that is no resolver.
q = bytes.fromhex("abcd01000001000000000000") + b"\x07example\x03com\x00\x00\x01\x00\x01"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(20)
u.sendto(q, ("10.9.9.9", 53))
answer, sender = u.recvfrom(512)
out["dns"] = [answer[:4].hex(), answer[12:] == q[12:], list(sender)]
out["resolv"] = open("/etc/resolv.conf").read()

# Other UDP: sent, and nothing ever comes back.
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(2)
u.connect(("10.9.9.9", 7000))
try:
    u.send(b"x")
    u.send(b"y")
    out["udp"] = ["answered", u.recv(100).decode()]
except OSError as e:
    out["udp"] = errno.errorcode.get(e.errno, "timeout")
"#,
    );
    // Allowed: the fake host's own answer, over a connection the program made itself.
    let raw = &out["raw"];
    assert!(
        raw[0].as_str().unwrap_or_default().starts_with("HTTP/1.1 200"),
        "{v:#}"
    );
    assert_eq!(raw[1], "hello from allowed\n", "{v:#}");
    assert_eq!(out["urllib"], json!([200, "hello from allowed\n"]), "{v:#}");
    // Refused: no answer of the fake host's.
    let refused = out["refused"].to_string();
    assert!(!refused.contains("hello from"), "{v:#}");
    assert!(!refused.contains(" 200 "), "{v:#}");
    assert!(
        ["ENETUNREACH", "EHOSTUNREACH"].contains(&out["v6"].as_str().unwrap_or_default()),
        "{v:#}"
    );
    // The query reached airlock's resolver, which answered it by policy (example.com is
    // not allowed: NXDOMAIN, rcode 3), from the address the program asked.
    assert_eq!(out["dns"][0].as_str().unwrap_or_default(), "abcd8183", "{v:#}");
    assert_eq!(out["dns"][1], true, "{v:#}");
    assert_eq!(out["dns"][2], json!(["10.9.9.9", 53]), "{v:#}");
    assert_eq!(out["resolv"], "nameserver 127.0.0.1\n", "{v:#}");
    assert!(
        ["ECONNREFUSED", "timeout"].contains(&out["udp"].as_str().unwrap_or_default()),
        "{v:#}"
    );

    // The host side learnt each original destination: the log names them.
    let log = egress(&v);
    let of = |host: &str| log.iter().filter(|e| e["host"] == host).collect::<Vec<_>>();
    let allowed = of(ALLOWED);
    assert_eq!(allowed.len(), 2, "{log:#?}");
    for e in &allowed {
        assert_eq!(e["port"], 80, "{e:#}");
        assert_eq!(e["allowed"], true, "{e:#}");
    }
    let api = of(API);
    assert_eq!(api.len(), 1, "{log:#?}");
    assert_eq!(api[0]["port"], 80, "{log:#?}");
    assert_eq!(api[0]["allowed"], false, "{log:#?}");
    let dns = of("example.com");
    assert_eq!(dns.len(), 1, "{log:#?}");
    assert_eq!(
        (&dns[0]["kind"], &dns[0]["allowed"], &dns[0]["reason"]),
        (&json!("dns"), &json!(false), &json!("not in allowlist")),
        "{log:#?}"
    );
    assert!(
        log.iter()
            .all(|e| e["kind"] == "redirected" || e["kind"] == "dns"),
        "{log:#?}"
    );
    assert_eq!(log.len(), 4, "{log:#?}");
    // What the fake hosts saw: the allowed one both connections, nothing else anything.
    assert_eq!(net.connections_to("allowed"), 2, "{:?}", net.connections());
    assert_eq!(net.connections_to("api"), 0, "{:?}", net.connections());
    net.assert_no_forbidden_connections();
}
