#!/usr/bin/env python3
"""The egress proxy's cost: throughput of a large download and latency of small requests,
direct vs through `airlock run --net proxy`.

One run, inside a network namespace of its own (only loopback, with 10.9.9.9 on it: no
traffic ever leaves the machine):

  * a file server on 10.9.9.9:80 (this script, --serve) sends a 100 MB file from a tmpfs
    directory with sendfile, and a 100-byte body for small requests;
  * throughput: the same Python client downloads the file directly (host side, inside the
    namespace, no sandbox) and through the proxy (inside `airlock run --net proxy
    --allow-cidr 10.9.9.9/32`); best and median of --downloads runs each;
  * latency: the client times --requests small GETs (a new connection each, as the proxy
    forwards one plain-HTTP request per connection) directly and through the proxy, in one
    sandbox run; medians compared.

Targets (issue 4): proxy throughput >= 50% of direct; the proxy adds <= 1 ms median.

Then issue 15's three, in the same namespace:

  * HTTPS through an intercepting connection (a secret names the host, so the proxy ends
    TLS with the sandbox's CA and verifies the upstream itself): a TLS server on
    10.9.9.9:443 (this script, with a CA and certificate made by openssl); the client
    downloads the file over one connection and times --requests small GETs over one
    keep-alive connection, directly and from the sandbox through the proxy with
    `--secret BENCH_TOKEN@10.9.9.9`. Targets: throughput >= 50% of direct; added latency
    per request <= 2 ms at the median;
  * transparent redirection: --requests connections to an echo server on 10.9.9.9:7000,
    each sending a byte and reading it back, from the sandbox through the explicit proxy
    (CONNECT) and directly (redirected by the sandbox's rules). Target: redirection adds
    <= 0.2 ms per connection.

    sudo python3 bench/egress.py [--airlock target/release/airlock] [--size-mb 100]
                                 [--downloads 5] [--requests 500]

Python 3 standard library only; root is needed (network namespaces, cgroups). Build
first: cargo build --release. Exits 1 if a target is missed.
"""
import argparse
import http.server
import json
import os
import shutil
import socketserver
import statistics
import subprocess
import sys
import tempfile
import time

ADDR = "10.9.9.9"
SMALL = b"s" * 100
TARGET_RATIO = 0.5
TARGET_ADDED_MS = 1.0
TARGET_TLS_ADDED_MS = 2.0
TARGET_REDIRECT_ADDED_MS = 0.2

# The client: run as `python3 -c CLIENT MODE WHAT N` directly and inside the sandbox (the
# sandbox cannot see this file). MODE is direct or proxy; WHAT is big or small. Prints
# one JSON line: per-download MB/s and body bytes, or per-request milliseconds.
CLIENT = r'''
import json, socket, sys, time
mode, what, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ADDR = "10.9.9.9"
buf = bytearray(1 << 20)
view = memoryview(buf)

def fetch(path):
    """One GET on a new connection, read to EOF: (total bytes, seconds)."""
    t0 = time.perf_counter()
    if mode == "direct":
        s = socket.create_connection((ADDR, 80))
        head = f"GET {path} HTTP/1.1\r\nHost: {ADDR}\r\nConnection: close\r\n\r\n"
    else:
        s = socket.create_connection(("127.0.0.1", 3128))
        head = f"GET http://{ADDR}{path} HTTP/1.1\r\nHost: {ADDR}\r\nConnection: close\r\n\r\n"
    s.sendall(head.encode())
    total = 0
    first = b""
    while True:
        k = s.recv_into(view)
        if not k:
            break
        if len(first) < 512:
            first += bytes(view[:min(k, 512)])
        total += k
    s.close()
    took = time.perf_counter() - t0
    if not first.startswith(b"HTTP/1.") or b" 200 " not in first.split(b"\r\n")[0]:
        sys.exit(f"bad response: {first[:200]!r}")
    return total - (first.index(b"\r\n\r\n") + 4), took

if what == "big":
    runs = []
    for _ in range(n):
        body, took = fetch("/big")
        runs.append({"bytes": body, "mbps": body / took / 1e6})
    print(json.dumps(runs))
else:
    for _ in range(20):
        fetch("/small")
    ms = []
    for _ in range(n):
        body, took = fetch("/small")
        if body != 100:
            sys.exit(f"small body of {body} bytes")
        ms.append(took * 1000)
    print(json.dumps(ms))
'''


# The HTTPS client: `python3 -c TLS_CLIENT MODE WHAT N CAFILE`. MODE direct connects to
# 10.9.9.9:443; proxy tunnels through 127.0.0.1:3128 (intercepted: a secret names the
# host). big: one download per run; small: N GETs over one keep-alive connection.
TLS_CLIENT = r'''
import http.client, json, socket, ssl, sys, time
mode, what, n, cafile = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ctx = ssl.create_default_context(cafile=cafile if cafile != "-" else None)
def conn():
    if mode == "direct":
        c = http.client.HTTPSConnection("10.9.9.9", 443, context=ctx, timeout=120)
    else:
        c = http.client.HTTPSConnection("127.0.0.1", 3128, context=ctx, timeout=120)
        c.set_tunnel("10.9.9.9", 443)
    c.connect()
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c
if what == "big":
    runs = []
    for _ in range(n):
        c = conn()
        t0 = time.perf_counter()
        c.request("GET", "/big", headers={"Authorization": "Bearer " + sys.argv[5]})
        r = c.getresponse()
        total = 0
        while True:
            b = r.read(1 << 20)
            if not b:
                break
            total += len(b)
        took = time.perf_counter() - t0
        c.close()
        runs.append({"bytes": total, "mbps": total / took / 1e6, "status": r.status})
    print(json.dumps(runs))
else:
    c = conn()
    ms = []
    for i in range(n + 20):
        t0 = time.perf_counter()
        c.request("GET", "/small", headers={"Authorization": "Bearer " + sys.argv[5]})
        r = c.getresponse()
        body = r.read()
        took = time.perf_counter() - t0
        if r.status != 200 or len(body) != 100:
            sys.exit(f"bad answer {r.status} {body[:100]!r}")
        if i >= 20:
            ms.append(took * 1000)
    print(json.dumps(ms))
'''

# Connections: `python3 -c CONN_CLIENT MODE N`: each connects to the echo server on
# 10.9.9.9:7000 (explicit: through a CONNECT to the proxy; direct: straight to it,
# redirected), sends one byte, reads it back, closes. Prints per-connection ms.
CONN_CLIENT = r'''
import json, socket, sys, time
mode, n = sys.argv[1], int(sys.argv[2])
def once():
    t0 = time.perf_counter()
    if mode == "explicit":
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(b"CONNECT 10.9.9.9:7000 HTTP/1.1\r\nHost: 10.9.9.9:7000\r\n\r\n")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += s.recv(1)
        if b" 200 " not in head:
            sys.exit(f"refused: {head!r}")
    else:
        s = socket.create_connection(("10.9.9.9", 7000))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"x")
    if s.recv(1) != b"x":
        sys.exit("no echo")
    s.close()
    return (time.perf_counter() - t0) * 1000
for _ in range(20):
    once()
print(json.dumps([once() for _ in range(n)]))
'''


def serve_tls(directory, size, cert, key):
    """The HTTPS server (inside the namespace): keep-alive, /big streams the file."""
    import ssl
    path = os.path.join(directory, "big")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # The head and the body are two writes: without this, Nagle and the client's
        # delayed ACK add 40 ms to every keep-alive request, direct or not.
        disable_nagle_algorithm = True

        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == "/big":
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                with open(path, "rb") as f:
                    while True:
                        b = f.read(1 << 20)
                        if not b:
                            break
                        self.wfile.write(b)
            else:
                self.send_response(200)
                self.send_header("Content-Length", str(len(SMALL)))
                self.end_headers()
                self.wfile.write(SMALL)

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 128

    srv = Server((ADDR, 443), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()


def serve_echo():
    """A TCP echo server on 10.9.9.9:7000 (inside the namespace)."""

    class Echo(socketserver.BaseRequestHandler):
        def handle(self):
            while True:
                b = self.request.recv(65536)
                if not b:
                    return
                self.request.sendall(b)

    class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 128

    Server((ADDR, 7000), Echo).serve_forever()


def serve(directory, size):
    """The file server (run inside the namespace): /big sends the file with sendfile."""
    path = os.path.join(directory, "big")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == "/big":
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(size))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.flush()
                with open(path, "rb") as f:
                    self.connection.sendfile(f)
            else:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(SMALL)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(SMALL)
            self.close_connection = True

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 128

    srv = Server((ADDR, 80), Handler)
    import threading
    threading.Thread(target=serve_echo, daemon=True).start()
    threading.Thread(
        target=serve_tls,
        args=(directory, size, os.path.join(directory, "host.pem"), os.path.join(directory, "host.key")),
        daemon=True,
    ).start()
    time.sleep(0.5)
    print("ready", flush=True)
    srv.serve_forever()


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--airlock", default=os.path.join(repo, "target/release/airlock"))
    ap.add_argument("--size-mb", type=int, default=100)
    ap.add_argument("--downloads", type=int, default=5)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--serve", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    size = args.size_mb * 1_000_000
    if args.serve:
        serve(args.serve, size)
        return 0
    if os.geteuid() != 0:
        sys.exit("run as root (network namespaces, cgroups)")
    if not os.access(args.airlock, os.X_OK):
        sys.exit(f"{args.airlock} not found: cargo build --release first")
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    ns = f"airlock-bench-{os.getpid()}"
    nsenter = ["nsenter", f"--net=/var/run/netns/{ns}", "--"]
    tmp = tempfile.mkdtemp(prefix="airlock-egress-bench-", dir=shm)
    server = None
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "addr", "add", f"{ADDR}/32", "dev", "lo")
        with open(os.path.join(tmp, "big"), "wb") as f:
            chunk = os.urandom(1 << 20)
            left = size
            while left > 0:
                f.write(chunk[:left])
                left -= len(chunk)
        openssl = lambda *a: sh("openssl", *a, cwd=tmp)
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=airlock bench CA")
        with open(os.path.join(tmp, "ext.cnf"), "w") as f:
            f.write(f"subjectAltName=IP:{ADDR}\n")
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", "host.key", "-out", "host.csr", "-subj", "/CN=bench")
        openssl("x509", "-req", "-in", "host.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", "host.pem", "-days", "2", "-extfile", "ext.cnf")
        cafile = os.path.join(tmp, "ca.pem")
        server = subprocess.Popen(
            nsenter + [python, os.path.abspath(__file__), "--serve", tmp, "--size-mb", str(args.size_mb)],
            stdout=subprocess.PIPE, text=True)
        if server.stdout.readline().strip() != "ready":
            sys.exit("the file server did not start")

        def direct(what, n):
            out = sh(*nsenter, python, "-c", CLIENT, "direct", what, str(n))
            return json.loads(out.stdout)

        def proxied(what, n):
            out = sh(*nsenter, args.airlock, "run", "--net", "proxy", "--allow-cidr", f"{ADDR}/32",
                     "--cpus", "2", "--memory", "512M", "--timeout", "300s", "--json", "--",
                     "python3", "-c", CLIENT, "proxy", what, str(n))
            v = json.loads(out.stdout)
            if v.get("exit_code") != 0:
                sys.exit(f"the sandboxed client failed: {json.dumps(v, indent=1)[:3000]}")
            denied = [e for e in v["egress"] if not e["allowed"]]
            if denied:
                sys.exit(f"the proxy denied requests: {denied[:3]}")
            return json.loads(v["stdout"].strip().splitlines()[-1]), v["egress"]

        print(f"egress proxy benchmark: netns {ns}, {ADDR} on its loopback, "
              f"{args.size_mb} MB file on {'tmpfs' if shm else tmp}; airlock {args.airlock}", flush=True)
        d_big = direct("big", args.downloads)
        p_big, p_log = proxied("big", args.downloads)
        for r in p_big:
            if r["bytes"] != size:
                sys.exit(f"proxied download got {r['bytes']} bytes, not {size}")
        logged = [e["bytes_down"] for e in p_log]
        d_small = direct("small", args.requests)
        p_small, _ = proxied("small", args.requests)

        # Issue 15: HTTPS through an intercepting connection, and redirection.
        token = "bench-token-value"

        def tls_direct(what, n):
            out = sh(*nsenter, python, "-c", TLS_CLIENT, "direct", what, str(n), cafile, token)
            return json.loads(out.stdout)

        def in_sandbox(argv, secret):
            flags = ["--net", "proxy", "--allow-cidr", f"{ADDR}/32", "--allow", f"{ADDR}:443",
                     "--cpus", "2", "--memory", "512M", "--timeout", "300s", "--json"]
            if secret:
                flags += ["--secret", f"BENCH_TOKEN@{ADDR}"]
            env = dict(os.environ, SSL_CERT_FILE=cafile, BENCH_TOKEN=token)
            out = subprocess.run([*nsenter, args.airlock, "run", *flags, "--", *argv],
                                 check=True, capture_output=True, text=True, env=env)
            v = json.loads(out.stdout)
            if v.get("exit_code") != 0:
                sys.exit(f"the sandboxed client failed: {json.dumps(v, indent=1)[:3000]}")
            return json.loads(v["stdout"].strip().splitlines()[-1]), v["egress"]

        # In the sandbox the client trusts the sandbox's bundle (SSL_CERT_FILE there) and
        # sends the placeholder, which the proxy replaces.
        tls_argv = lambda what, n: ["sh", "-c", f'exec python3 -c "$0" proxy {what} {n} - "$BENCH_TOKEN"', TLS_CLIENT]
        dt_big = tls_direct("big", args.downloads)
        pt_big, pt_log = in_sandbox(tls_argv("big", args.downloads), True)
        if not any("TLS intercepted for secret BENCH_TOKEN" in e["reason"] for e in pt_log):
            sys.exit(f"the HTTPS connections were not intercepted: {pt_log[:2]}")
        for r in pt_big:
            if r["bytes"] != size or r["status"] != 200:
                sys.exit(f"intercepted download: {r}")
        dt_small = tls_direct("small", args.requests)
        pt_small, _ = in_sandbox(tls_argv("small", args.requests), True)
        c_explicit, _ = in_sandbox(["python3", "-c", CONN_CLIENT, "explicit", str(args.requests)], False)
        c_redirected, c_log = in_sandbox(["python3", "-c", CONN_CLIENT, "direct", str(args.requests)], False)
        if not any(e["kind"] == "redirected" for e in c_log):
            sys.exit("the direct connections were not redirected")
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    d_best = max(r["mbps"] for r in d_big)
    p_best = max(r["mbps"] for r in p_big)
    d_med = statistics.median(r["mbps"] for r in d_big)
    p_med = statistics.median(r["mbps"] for r in p_big)
    ratio = p_med / d_med
    d_lat = statistics.median(d_small)
    p_lat = statistics.median(p_small)
    added = p_lat - d_lat
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(len(xs) * p))]

    ok_tp = ratio >= TARGET_RATIO
    ok_lat = added <= TARGET_ADDED_MS
    print()
    print(f"{'':34} {'direct':>10} {'proxy':>10} {'ratio/added':>12}   target")
    print(f"{f'download {args.size_mb} MB, median MB/s':34} {d_med:10.1f} {p_med:10.1f} "
          f"{ratio:12.2f}   >= {TARGET_RATIO}  {'PASS' if ok_tp else 'FAIL'}")
    print(f"{f'download {args.size_mb} MB, best MB/s':34} {d_best:10.1f} {p_best:10.1f} "
          f"{p_best / d_best:12.2f}")
    print(f"{f'small GET median ms (n={args.requests})':34} {d_lat:10.3f} {p_lat:10.3f} "
          f"{added:+12.3f}   <= {TARGET_ADDED_MS} ms  {'PASS' if ok_lat else 'FAIL'}")
    print(f"{'small GET p90 ms':34} {q(d_small, 0.9):10.3f} {q(p_small, 0.9):10.3f} "
          f"{q(p_small, 0.9) - q(d_small, 0.9):+12.3f}")
    print()
    print(f"runs (MB/s): direct {[round(r['mbps'], 1) for r in d_big]}, "
          f"proxy {[round(r['mbps'], 1) for r in p_big]}; proxy log bytes_down per download: {logged}")

    td_med = statistics.median(r["mbps"] for r in dt_big)
    tp_med = statistics.median(r["mbps"] for r in pt_big)
    t_ratio = tp_med / td_med
    t_added = statistics.median(pt_small) - statistics.median(dt_small)
    r_added = statistics.median(c_redirected) - statistics.median(c_explicit)
    ok_ttp = t_ratio >= TARGET_RATIO
    ok_tlat = t_added <= TARGET_TLS_ADDED_MS
    ok_redir = r_added <= TARGET_REDIRECT_ADDED_MS
    print()
    print(f"{'issue 15':34} {'direct':>10} {'airlock':>10} {'ratio/added':>12}   target")
    print(f"{f'HTTPS intercepted, median MB/s':34} {td_med:10.1f} {tp_med:10.1f} "
          f"{t_ratio:12.2f}   >= {TARGET_RATIO}  {'PASS' if ok_ttp else 'FAIL'}")
    print(f"{f'HTTPS keep-alive GET median ms':34} {statistics.median(dt_small):10.3f} "
          f"{statistics.median(pt_small):10.3f} {t_added:+12.3f}   <= {TARGET_TLS_ADDED_MS} ms  "
          f"{'PASS' if ok_tlat else 'FAIL'}")
    print(f"{'connection: CONNECT vs redirected':34} {statistics.median(c_explicit):10.3f} "
          f"{statistics.median(c_redirected):10.3f} {r_added:+12.3f}   <= {TARGET_REDIRECT_ADDED_MS} ms  "
          f"{'PASS' if ok_redir else 'FAIL'}")
    print(f"  (connection row: the first column is through the explicit proxy, the second "
          f"redirected; each connects, echoes a byte, closes; n={args.requests})")
    print(f"runs (MB/s): HTTPS direct {[round(r['mbps'], 1) for r in dt_big]}, "
          f"intercepted {[round(r['mbps'], 1) for r in pt_big]}")
    return 0 if ok_tp and ok_lat and ok_ttp and ok_tlat and ok_redir else 1


if __name__ == "__main__":
    sys.exit(main())
