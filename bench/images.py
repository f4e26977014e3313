#!/usr/bin/env python3
"""What running an image costs, side by side in one run (issue 14's targets):

  1. Pull: a 3-layer image (~30 MB: static busybox; python3 with its shared libraries;
     Python's standard library) from a registry on loopback (Debian's docker-registry),
     by `airlock image pull` into an empty store, against `skopeo copy` of the same image
     into a local directory. Median of --pulls each; ratio airlock/skopeo.
  2. Cold CLI: `airlock run --image X -- /bin/true` with X in the store, against
     `airlock run -- /bin/true` on the host's root, interleaved; ratio.
  3. Pooled: one `airlock serve --pool 2 --pool X=2`, `POST /v1/exec` of /bin/true with
     and without the image, interleaved at concurrency 1 and paced so each request finds
     its pool refilled; p50 and p99 of each (the target: the same p50).
  4. Memory: 50 concurrent sessions of one image in one `airlock serve`, against 50
     sessions on the host root: host memory used (MemTotal - MemAvailable) before and
     after, per sandbox. An image's files are shared (page cache of one read-only tree),
     so the per-sandbox figure should match the host root's, not grow by the image.

    sudo python3 bench/images.py [--airlock target/release/airlock] [--pulls 5] [--cold 10]
                                 [--sessions 50]

Python 3 standard library only; root; needs docker-registry and skopeo (Debian). The
store is a temporary directory, removed at the end.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oci_layout  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def python_layers():
    """busybox; python3 and its libraries; the standard library. The image has a merged
    /usr, like Debian's: /lib and /lib64 are links into /usr."""
    libs = [("usr/bin/python3.11", "/usr/bin/python3.11", 0o755), ("symlink", "usr/bin/python3", "python3.11")]
    out = subprocess.run(["ldd", "/usr/bin/python3.11"], capture_output=True, text=True, check=True).stdout
    for path in re.findall(r"(/\S+\.so[.\d]*)", out):
        inside = path if path.startswith("/usr/") else "/usr" + path
        libs.append((inside.lstrip("/"), os.path.realpath(path), 0o755))
    stdlib = []
    for dirpath, dirnames, filenames in os.walk("/usr/lib/python3.11"):
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "test", "dist-packages", "site-packages")]
        for n in sorted(filenames):
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                stdlib.append(("symlink", p.lstrip("/"), os.readlink(p)))
            elif os.path.isfile(p):
                stdlib.append((p.lstrip("/"), p, 0o644))
    busybox = oci_layout.busybox_layer() + [("symlink", "lib64", "usr/lib64"), ("symlink", "lib", "usr/lib")]
    return [busybox, libs, stdlib]


class Registry:
    def __init__(self, work):
        self.port = free_port()
        cfg = os.path.join(work, "registry.yml")
        with open(cfg, "w") as f:
            f.write(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {work}/registry\n"
                    f"http:\n  addr: 127.0.0.1:{self.port}\n")
        self.proc = subprocess.Popen(["docker-registry", "serve", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        sys.exit("docker-registry did not start")

    def close(self):
        self.proc.kill()
        self.proc.wait()


def timed(argv, env=None):
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, timeout=600, env=env)
    ms = (time.perf_counter() - t0) * 1000
    if p.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.decode()[-2000:]}")
    return ms, p.stdout


def mem_used():
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            info[k] = int(v.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"]


class Daemon:
    LISTENING = re.compile(rb"listening on http://127\.0\.0\.1:(\d+)")

    def __init__(self, argv):
        self.log = tempfile.NamedTemporaryFile(prefix="airlock-bench-images-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline()
        m = self.LISTENING.search(line)
        if not m:
            sys.exit(f"airlock serve did not start: {line!r}; log {self.log.name}")
        self.port = int(m.group(1))

    def post(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        c.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status >= 300:
            sys.exit(f"POST {path} {body}: {r.status} {data[:500]!r}")
        return json.loads(data)

    def delete(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("DELETE", path)
        c.getresponse().read()

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def sessions_memory(airlock, store, image, n):
    d = Daemon([airlock, "serve", "--listen", "127.0.0.1:0", "--image-store", store, "--pool", "0",
                "--max-sandboxes", str(n + 4), "--max-sessions-per-key", str(n + 4)])
    try:
        time.sleep(1)
        before = mem_used()
        ids = []
        body = {"ttl_s": 600, "limits": {"memory_bytes": 64 << 20}}
        if image:
            body["image"] = image
        for _ in range(n):
            ids.append(d.post("/v1/sandboxes", body)["id"])
        # Each session runs the interpreter once, so its files are mapped.
        for i in ids:
            r = d.post(f"/v1/sandboxes/{i}/exec", {"cmd": ["python3", "-c", "import json, email"]})
            if r.get("exit_code") != 0:
                sys.exit(f"exec in session failed: {r}")
        time.sleep(1)
        after = mem_used()
        for i in ids:
            d.delete(f"/v1/sandboxes/{i}")
        return (after - before) / n
    finally:
        d.close()


def pct(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def pooled(airlock, store, image, n):
    """Client-side latency of /bin/true from each pool, interleaved, paced."""
    d = Daemon([airlock, "serve", "--listen", "127.0.0.1:0", "--image-store", store, "--pool", "2",
                "--pool", f"{image}=2"])
    try:
        time.sleep(2)
        host, img = [], []
        for i in range(2 * n):
            body = {"cmd": ["/bin/true"]}
            if i % 2:
                body["image"] = image
            t0 = time.perf_counter()
            r = d.post("/v1/exec", body)
            ms = (time.perf_counter() - t0) * 1000
            if r.get("exit_code") != 0:
                sys.exit(f"pooled exec failed: {r}")
            (img if i % 2 else host).append(ms)
            time.sleep(0.03)
        return host, img
    finally:
        d.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--airlock", default="target/release/airlock")
    ap.add_argument("--pulls", type=int, default=5)
    ap.add_argument("--cold", type=int, default=10)
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--requests", type=int, default=100)
    a = ap.parse_args()
    airlock = os.path.abspath(a.airlock)
    work = tempfile.mkdtemp(prefix="airlock-bench-images-")
    os.chmod(work, 0o755)  # sandboxes reach the store by its path
    reg = None
    try:
        layout = os.path.join(work, "layout")
        oci_layout.write_layout(layout, python_layers(), {"Env": ["PATH=/usr/bin:/bin"]}, ref="py:bench")
        size = sum(os.path.getsize(os.path.join(layout, "blobs/sha256", b)) for b in os.listdir(os.path.join(layout, "blobs/sha256")))
        reg = Registry(work)
        ref = f"127.0.0.1:{reg.port}/bench/py:1"
        timed(["skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}:py:bench", f"docker://{ref}"])

        # Each pull into a fresh directory, none removed until the end: on ext4 without a
        # journal (this project's build machines), creating files soon after many were
        # deleted walks the recently freed inodes, which would charge one pull for the
        # last one's cleanup (airlock creates ~750 files, skopeo 5).
        pulls_airlock, pulls_skopeo = [], []
        for i in range(a.pulls):
            dest = os.path.join(work, f"skopeo-{i}")
            pulls_skopeo.append(timed(["skopeo", "copy", "--src-tls-verify=false", f"docker://{ref}", f"dir:{dest}"])[0])
            store = os.path.join(work, f"store-{i}")
            pulls_airlock.append(timed([airlock, "image", "pull", "--image-store", store,
                                        "--insecure-registry", f"127.0.0.1:{reg.port}", ref])[0])
        store = os.path.join(work, f"store-{a.pulls - 1}")

        host, image = [], []
        for _ in range(a.cold):
            host.append(timed([airlock, "run", "--", "/bin/true"])[0])
            image.append(timed([airlock, "run", "--image-store", store, "--image", ref, "--", "/bin/true"])[0])

        pool_host, pool_image = pooled(airlock, store, ref, a.requests)
        mem_host = sessions_memory(airlock, store, None, a.sessions)
        mem_image = sessions_memory(airlock, store, ref, a.sessions)

        med = statistics.median
        print(f"image: 3 layers, {size / 1e6:.1f} MB compressed")
        print(f"pull          airlock {med(pulls_airlock):8.1f} ms   skopeo {med(pulls_skopeo):8.1f} ms   ratio {med(pulls_airlock) / med(pulls_skopeo):.2f}")
        print(f"cold /bin/true image  {med(image):8.1f} ms   host   {med(host):8.1f} ms   ratio {med(image) / med(host):.2f}")
        print(f"pooled /bin/true p50 image {pct(pool_image, 50):6.2f} ms  host {pct(pool_host, 50):6.2f} ms  ratio {pct(pool_image, 50) / pct(pool_host, 50):.2f}"
              f"   p99 image {pct(pool_image, 99):6.2f} ms  host {pct(pool_host, 99):6.2f} ms")
        print(f"{a.sessions} sessions     image {mem_image / 2**20:8.2f} MiB/session   host {mem_host / 2**20:8.2f} MiB/session")
    finally:
        if reg:
            reg.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
