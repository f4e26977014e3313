"""The fake "remote" hosts of the egress tests, run INSIDE the test's own network
namespace (on addresses the test put on that namespace's loopback).

    servers.py LOG READY NAME=KIND@HOST:PORT ...

KIND is `web` (a tiny HTTP/1.1 server, one request per connection) or `echo` (a raw TCP
echo). Every accepted connection appends `NAME` as one line to LOG (flushed at once), so
the test can count connections per server: the fake metadata server must see zero.
READY is written once every socket listens. HOST may be an IPv6 address in brackets.

web paths:
    /hello          200, body `hello from NAME\n`
    /bytes/N        200, N bytes of `x`
    /redirect?to=U  302 to U
    /simple/...     a PEP 503 simple index with one package, `airlock-probe` 1.0
    /packages/...   its wheel
    POST            200, body `NAME got N bytes\n`
    anything else   200, body `NAME: secret-credentials\n` (what a metadata server leaks)
"""

import os
import socket
import socketserver
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG_LOCK = threading.Lock()
WWW = ""
WHEEL = "airlock_probe-1.0-py3-none-any.whl"


def make_index(www):
    """A simple index with one tiny pure-Python wheel, for `pip download`."""
    import base64
    import hashlib
    import zipfile

    os.makedirs(os.path.join(www, "packages"), exist_ok=True)
    os.makedirs(os.path.join(www, "simple", "airlock-probe"), exist_ok=True)
    files = {
        "airlock_probe/__init__.py": "VALUE = 42\n",
        "airlock_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: airlock-probe\nVersion: 1.0\n",
        "airlock_probe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: airlock-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(text)}\n"
    record += "airlock_probe-1.0.dist-info/RECORD,,\n"
    files["airlock_probe-1.0.dist-info/RECORD"] = record
    with zipfile.ZipFile(os.path.join(www, "packages", WHEEL), "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    with open(os.path.join(www, "simple", "index.html"), "w") as f:
        f.write('<html><body><a href="/simple/airlock-probe/">airlock-probe</a></body></html>\n')
    with open(os.path.join(www, "simple", "airlock-probe", "index.html"), "w") as f:
        f.write(f'<html><body><a href="/packages/{WHEEL}">{WHEEL}</a></body></html>\n')


def log_connection(path, name):
    with LOG_LOCK:
        with open(path, "a", encoding="ascii") as f:
            f.write(name + "\n")
            f.flush()


def split_hostport(s):
    host, _, port = s.rpartition(":")
    if host.startswith("["):
        host = host[1:-1]
    return host, int(port)


def make_web(name, log_path):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send_body(self, status, body, headers=(), content_type="text/plain"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.close_connection = True

        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            path = url.path
            if path == "/hello":
                self.send_body(200, f"hello from {name}\n".encode())
            elif path.startswith("/bytes/"):
                self.send_body(200, b"x" * int(path[len("/bytes/"):]))
            elif path.startswith(("/simple/", "/packages/")):
                file = os.path.join(WWW, path.strip("/"))
                if os.path.isdir(file):
                    file = os.path.join(file, "index.html")
                if os.path.isfile(file):
                    with open(file, "rb") as f:
                        ctype = "text/html" if file.endswith(".html") else "application/octet-stream"
                        self.send_body(200, f.read(), content_type=ctype)
                else:
                    self.send_body(404, b"not found\n")
            elif path == "/redirect":
                to = urllib.parse.parse_qs(url.query).get("to", ["http://169.254.169.254/"])[0]
                self.send_body(302, b"moved\n", [("Location", to)])
            else:
                self.send_body(200, f"{name}: secret-credentials\n".encode())

        do_HEAD = do_GET

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            got = 0
            while got < length:
                chunk = self.rfile.read(min(65536, length - got))
                if not chunk:
                    break
                got += len(chunk)
            self.send_body(200, f"{name} got {got} bytes\n".encode())

    return Handler


class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            data = self.request.recv(65536)
            if not data:
                return
            self.request.sendall(data)


def serve(kind, name, host, port, log_path):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if kind == "web":
        base, handler = ThreadingHTTPServer, make_web(name, log_path)
    elif kind == "echo":
        base, handler = socketserver.ThreadingTCPServer, EchoHandler
    else:
        raise SystemExit(f"unknown kind {kind}")

    class Server(base):
        address_family = family
        allow_reuse_address = True
        daemon_threads = True

        def verify_request(self, request, client_address):
            log_connection(log_path, name)
            return True

    srv = Server((host, port), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main():
    log_path, ready_path, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
    open(log_path, "w").close()
    global WWW
    WWW = os.path.join(os.path.dirname(os.path.abspath(log_path)), "www")
    make_index(WWW)
    servers = []
    for spec in specs:
        name, _, rest = spec.partition("=")
        kind, _, hostport = rest.partition("@")
        host, port = split_hostport(hostport)
        servers.append(serve(kind, name, host, port, log_path))
    tmp = ready_path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, ready_path)
    # Exit with the test that started us, even if it died without cleaning up.
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.2)


if __name__ == "__main__":
    main()
