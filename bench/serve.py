#!/usr/bin/env python3
"""`airlock serve` under load: client-observed latency and throughput of `POST /v1/exec`.

One run measures, side by side, up to four servers it starts itself on 127.0.0.1
(ephemeral ports; each ready when GET /readyz answers 200; each stopped with SIGTERM at
the end):

  (a) `airlock serve` with the warm pool (its default size, or --pool N),
  (b) `airlock serve --pool 0` (every request provisions a sandbox),
  (c) the reference: a minimal Python ThreadingHTTPServer that spawns bubblewrap per
      request (this script, run with --reference-server, in its own process),
  (d) the floor: the same Python server spawning the program bare, no sandbox at all
      (--reference-server --bare).

The request is `{"cmd":["/bin/true"]}`. Latency at concurrency 1 over one keep-alive
connection (p50/p90/p99/mean, default 500 requests after a warm-up), then throughput at
concurrency 4 with one keep-alive connection per worker thread (execs/s, default 1000
requests). The rows are interleaved in rounds (a b c, c b a, ...) so that a noisy
neighbour hits them alike, and before every chunk the warm pool is left to refill, so one
row's background work never runs during another's. Prints a table, the ratios against
the reference, the issues' targets, and a warning when the host was busy with other work.

Two CPU figures per exec, each at c=1 and at c=4, from the chunk's start until the server
has drained after it (the warm pool refilled, the sandboxes purged):
  cpu ms/exec   the server process and its descendants (from /proc: utime + stime of the
                living ones, cutime + cstime of the reaped ones);
  host ms/exec  every CPU's busy time from /proc/stat over the chunk, less this script's
                own CPU (the load generator, from os.times()). It includes what the first
                misses: kernel threads working for the server (network-namespace cleanup,
                cgroup release and RCU run in kworkers and ksoftirqd), and interrupts.
                It also includes any other work on the host: it is only meaningful on a
                quiet host (the script says how busy it was between chunks).

    sudo python3 bench/serve.py [--airlock PATH] [--pool N] [--requests 500]
                                [--throughput-requests 1000] [--rounds 5] [--only abcd]
                                [--json FILE]

Python 3 standard library only. Root is needed (airlock creates cgroups). The daemons
log at AIRLOCK_LOG=warn unless it is set (a log line per exec would be measured too).
"""
import argparse
import http.client
import http.server
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BODY = json.dumps({"cmd": ["/bin/true"]}).encode()
HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}

# Targets from the service issue (with the pool, on a 2-core host).
TARGET_P50_MS = 3.0
TARGET_P99_MS = 15.0
TARGET_EXECS_S = 250.0
# Targets from issue 19 (cost per sandbox), side by side with bwrap in one run.
TARGET_CPU_MS = 2.5       # host CPU per exec at c=4
TARGET_CPU_RATIO = 1.3    # ... and at most this times bwrap's
TARGET_RATE_RATIO = 1.3   # execs/s at c=4, at least this times bwrap's
TARGET_P50_19_MS = 2.0    # p50 at c=1

# The reference sandbox, spawned per request (the argv of the request is appended).
BWRAP = [
    "--unshare-all", "--die-with-parent", "--new-session",
    "--ro-bind", "/usr", "/usr",
    "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
    "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
    "--uid", "1000", "--gid", "1000", "--cap-drop", "ALL", "--clearenv",
]


# --- the reference server (runs in its own process) ------------------------------------

def reference_server(prefix):
    """A keep-alive HTTP server answering POST /v1/exec by running `prefix + cmd` per
    request (`prefix` is bwrap and its flags, or nothing for the bare floor). Prints
    "listening on" like the airlock daemon; SIGTERM stops it. bench/breakdown.py runs it too."""
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like the airlock daemon
        disable_nagle_algorithm = True

        def log_message(self, *args):
            pass

        def answer(self, status, obj):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path in ("/healthz", "/readyz"):
                self.answer(200, {"status": "ok"})
            else:
                self.answer(404, {"error": {"code": "not_found", "message": "no such route"}})

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/exec":
                self.answer(404, {"error": {"code": "not_found", "message": "no such route"}})
                return
            try:
                cmd = json.loads(body)["cmd"]
            except (ValueError, KeyError, TypeError) as e:
                self.answer(400, {"error": {"code": "malformed_json", "message": str(e)}})
                return
            t0 = time.perf_counter()
            p = subprocess.run([*prefix, *cmd], stdin=subprocess.DEVNULL,
                               capture_output=True)
            wall = (time.perf_counter() - t0) * 1000
            self.answer(200, {"outcome": "exited" if p.returncode >= 0 else "signaled",
                              "exit_code": p.returncode,
                              "stdout": p.stdout.decode(errors="replace"),
                              "stderr": p.stderr.decode(errors="replace"),
                              "wall_ms": round(wall, 3)})

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128

    srv = Server(("127.0.0.1", 0), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown).start())
    print(f"reference: listening on http://127.0.0.1:{srv.server_address[1]}", flush=True)
    srv.serve_forever()


# --- daemons ---------------------------------------------------------------------------

class Daemon:
    """A server process on 127.0.0.1 with an ephemeral port, ready when /readyz is 200."""

    LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")

    def __init__(self, label, argv, env=None):
        self.label = label
        self.argv = argv
        self.log = tempfile.NamedTemporaryFile(prefix="airlock-bench-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL,
                                     env=env)
        self.port = None
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise RuntimeError(f"{self.label}: no 'listening on' line ({self.tail()})")
            if select.select([self.proc.stdout], [], [], left)[0]:
                c = os.read(self.proc.stdout.fileno(), 1)  # unbuffered: select stays truthful
                if not c:
                    raise RuntimeError(f"{self.label}: exited before listening ({self.tail()})")
                line += c
        m = self.LISTENING.search(line.decode(errors="replace"))
        if not m:
            raise RuntimeError(f"{self.label}: unexpected first line {line!r}")
        self.port = int(m.group(1))
        while time.monotonic() < deadline:
            try:
                status, _ = self.get("/readyz")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"{self.label}: /readyz never answered 200 ({self.tail()})")

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def metric_labelled(self, name, label):
        """The value of one Prometheus sample of `name` whose labels contain `label`."""
        try:
            status, text = self.get("/metrics")
        except OSError:
            return None
        if status != 200:
            return None
        for line in text.decode().splitlines():
            if line.startswith(name + "{") and label in line.split("}")[0]:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def cpu_seconds(self):
        """CPU time of the daemon, its reaped children (sandboxes, bwrap) and its living
        descendants (a fork server, ready sandboxes), from /proc."""
        tick = os.sysconf("SC_CLK_TCK")
        try:
            total = process_cpu(self.proc.pid)
        except (OSError, ValueError):
            return None
        for pid in descendants(self.proc.pid):
            try:
                total += process_cpu(pid)
            except (OSError, ValueError):
                pass  # gone meanwhile: counted in its parent's cutime/cstime from now on
        return total / tick

    def tail(self, n=5):
        try:
            with open(self.log.name, errors="replace") as f:
                return " | ".join(f.read().splitlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()
        return self.proc.returncode


def process_cpu(pid):
    """utime + stime + cutime + cstime of one process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15])


def descendants(pid):
    """Living descendants of `pid` (children of every thread, recursively)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


# --- load ------------------------------------------------------------------------------

class Client:
    """One persistent keep-alive connection."""

    def __init__(self, port):
        self.port = port
        self.conn = None
        self.reconnects = -1

    def exec(self):
        """One POST /v1/exec; returns (ms, error or None)."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            self.reconnects += 1
        t0 = time.perf_counter()
        try:
            self.conn.request("POST", "/v1/exec", body=BODY, headers=HEADERS)
            r = self.conn.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException) as e:
            self.conn.close()
            self.conn = None
            return (time.perf_counter() - t0) * 1000, f"{type(e).__name__}: {e}"
        ms = (time.perf_counter() - t0) * 1000
        if r.status != 200:
            return ms, f"HTTP {r.status}: {data[:200].decode(errors='replace')}"
        try:
            res = json.loads(data)
        except ValueError:
            return ms, f"not JSON: {data[:200]!r}"
        if res.get("exit_code") != 0:
            return ms, f"exit_code {res.get('exit_code')}: {data[:200].decode(errors='replace')}"
        if r.getheader("Connection", "").lower() == "close":
            self.conn.close()
            self.conn = None
        return ms, None

    def close(self):
        if self.conn is not None:
            self.conn.close()


def host_cpu():
    """(busy, total) jiffies of the whole host, from /proc/stat: busy is user + nice +
    system + irq + softirq (guest time is already in user; steal is not this host's)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]] + [0] * 10
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    return busy, busy + v[3] + v[4] + v[7]  # + idle, iowait, steal


def host_cpu_seconds():
    """Seconds of CPU the host spent busy, every CPU, less this process's own (the load
    generator's): a figure that takes in kernel threads, which no process tree shows."""
    return host_cpu()[0] / os.sysconf("SC_CLK_TCK") - time.process_time()


def host_busy(seconds):
    """Fraction of the host's CPU in use over `seconds` (by anything: other load skews results)."""
    b0, t0 = host_cpu()
    time.sleep(seconds)
    b1, t1 = host_cpu()
    return (b1 - b0) / max(1, t1 - t0)


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def latency_chunk(client, n, warmup):
    for _ in range(warmup):
        client.exec()
    lat, errors = [], []
    for _ in range(n):
        ms, err = client.exec()
        lat.append(ms)
        if err:
            errors.append(err)
    return lat, errors


def throughput_chunk(clients, n):
    """`n` requests spread over one worker thread per client; returns (seconds, latencies, errors)."""
    lock = threading.Lock()
    left = [n]
    lat, errors = [], []
    start = threading.Barrier(len(clients) + 1)

    def worker(c):
        mine, errs = [], []
        start.wait()
        while True:
            with lock:
                if left[0] == 0:
                    break
                left[0] -= 1
            ms, err = c.exec()
            mine.append(ms)
            if err:
                errs.append(err)
        with lock:
            lat.extend(mine)
            errors.extend(errs)

    threads = [threading.Thread(target=worker, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, lat, errors


class Row:
    """One system under test and what was measured on it."""

    def __init__(self, key, label, daemon, is_airlock, concurrency):
        self.key, self.label, self.daemon, self.is_airlock = key, label, daemon, is_airlock
        self.c1 = Client(daemon.port)
        self.c4 = [Client(daemon.port) for _ in range(concurrency)]
        self.lat1, self.err1, self.lat4, self.err4 = [], [], [], []
        self.seconds4 = 0.0
        self.n4 = 0
        self.busy = []  # host CPU busy while idle, before each chunk
        self.cpu = {"c1": 0.0, "c4": 0.0}
        self.host = {"c1": 0.0, "c4": 0.0}
        self.cold = {"c1": 0.0, "c4": 0.0}
        self.pool = None
        if is_airlock:
            self.pool = json.loads(daemon.get("/readyz")[1]).get("pool_target")
            self.label = label.replace("(default pool)", f"--pool {self.pool} (default)")

    def drain(self, timeout=10.0):
        """Waits until the warm pool is full again and nothing runs, then a little more (the
        last sandboxes' purges; network namespaces and cgroups the kernel releases later)."""
        deadline = time.monotonic() + timeout
        while self.is_airlock and self.pool and time.monotonic() < deadline:
            ready = json.loads(self.daemon.get("/readyz")[1])
            if ready.get("pool_ready", 0) >= self.pool and ready.get("sandboxes_active", 0) == 0:
                break
            time.sleep(0.01)
        time.sleep(0.05)

    def settle(self, timeout=10.0):
        """Drains (so one row's refill never runs during another row's chunk), then samples
        how busy the host is."""
        self.drain(timeout)
        self.busy.append(host_busy(0.25))

    def cold_count(self):
        if not self.is_airlock:
            return 0.0
        return self.daemon.metric_labelled("airlock_provision_seconds_count", 'pool="cold"') or 0.0

    def run_chunk(self, phase, n, warmup):
        clients = [self.c1] if phase == "c1" else self.c4
        for c in clients:  # keep the connections open and warm; not timed
            for _ in range(warmup):
                c.exec()
        self.settle()
        cpu0, cold0 = self.daemon.cpu_seconds(), self.cold_count()
        host0 = host_cpu_seconds()
        if phase == "c1":
            lat, err = latency_chunk(self.c1, n, 0)
            self.lat1 += lat
            self.err1 += err
        else:
            secs, lat, err = throughput_chunk(self.c4, n)
            self.seconds4 += secs
            self.n4 += n
            self.lat4 += lat
            self.err4 += err
        self.drain()  # the CPU of an exec includes refilling the pool and purging its sandbox
        host1 = host_cpu_seconds()
        cpu1, cold1 = self.daemon.cpu_seconds(), self.cold_count()
        self.host[phase] += host1 - host0
        if cpu0 is not None and cpu1 is not None:
            self.cpu[phase] += cpu1 - cpu0
        self.cold[phase] += cold1 - cold0

    def close(self):
        self.c1.close()
        for c in self.c4:
            c.close()


# --- main ------------------------------------------------------------------------------

def daemon_env():
    """The servers' environment: AIRLOCK_LOG=warn unless set (a log line per exec would be
    measured too)."""
    env = dict(os.environ)
    env.setdefault("AIRLOCK_LOG", "warn")
    return env


def server_setups(airlock, bwrap, only, pool=None):
    """(key, label, argv, is_airlock) of each row named in `only` (a b c d, see above)."""
    me = os.path.abspath(__file__)
    pool_flag = [] if pool is None else ["--pool", str(pool)]
    rows = {
        "a": ("airlock serve " + (" ".join(pool_flag) or "(default pool)"),
              [airlock, "serve", "--listen", "127.0.0.1:0", *pool_flag], True),
        "b": ("airlock serve --pool 0", [airlock, "serve", "--listen", "127.0.0.1:0", "--pool", "0"], True),
        "c": ("bwrap per request (py)", [sys.executable, me, "--reference-server", "--bwrap", bwrap], False),
        "d": ("bare fork+exec (py)", [sys.executable, me, "--reference-server", "--bare"], False),
    }
    return [(k, *rows[k]) for k in "abcd" if k in only]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--airlock", default=os.path.join(here, "..", "target", "release", "airlock"),
                    help="the airlock binary (default: ../target/release/airlock beside this script)")
    ap.add_argument("--pool", type=int, default=None,
                    help="--pool for run (a) (default: the daemon's default, sized to the host)")
    ap.add_argument("--requests", type=int, default=500, help="timed requests at concurrency 1")
    ap.add_argument("--throughput-requests", type=int, default=1000, help="requests at concurrency --concurrency")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=50, help="untimed requests per row before the timed ones")
    ap.add_argument("--rounds", type=int, default=5, help="rows are interleaved in this many rounds per phase")
    ap.add_argument("--bwrap", default=shutil.which("bwrap") or "/usr/bin/bwrap")
    ap.add_argument("--only", default="abcd", help="which rows to run (default abcd)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures to FILE as JSON (bench/report.py reads it)")
    ap.add_argument("--reference-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.reference_server:
        reference_server([] if args.bare else [args.bwrap, *BWRAP])
        return
    if os.geteuid() != 0:
        sys.exit("run as root (airlock needs it for cgroups)")
    airlock = os.path.abspath(args.airlock)
    if not os.access(airlock, os.X_OK):
        sys.exit(f"{airlock}: not found; build it with `cargo build --release` or pass --airlock")

    if "c" in args.only and not os.access(args.bwrap, os.X_OK):
        sys.exit(f"{args.bwrap}: bwrap not found (apt-get install bubblewrap) or pass --bwrap")
    env = daemon_env()
    setups = server_setups(airlock, args.bwrap, args.only, args.pool)

    rounds = max(1, args.rounds)
    n1, n4 = max(1, args.requests // rounds), max(1, args.throughput_requests // rounds)
    print(f"POST /v1/exec {BODY.decode()}, client-observed over keep-alive connections, {os.cpu_count()} CPUs. "
          f"Rows interleaved in {rounds} rounds; c=1: {n1 * rounds} requests, c={args.concurrency}: {n4 * rounds} "
          f"requests; warm pools refilled before every chunk.", flush=True)
    daemons, rows = [], []
    try:
        for key, label, argv, is_airlock in setups:
            d = Daemon(label, argv, env)
            daemons.append(d)
            rows.append(Row(key, label, d, is_airlock, args.concurrency))
        for r in rows:  # warm-up: page cache, connections, the daemons' allocators
            latency_chunk(r.c1, 0, args.warmup)
        for phase, n in (("c1", n1), ("c4", n4)):
            for i in range(rounds):
                order = rows if i % 2 == 0 else rows[::-1]
                for r in order:
                    r.run_chunk(phase, n, 2)
                print(f"  {phase} round {i + 1}/{rounds} done", flush=True)
    finally:
        for r in rows:
            r.close()
        codes = [d.stop() for d in daemons]
    for r, code in zip(rows, codes):
        r.exit = code
        print(f"  ({r.key}) {r.label}: exit {code}, log {r.daemon.log.name}")

    c4 = f"c={args.concurrency}"
    stats = {}
    for r in rows:
        n1, n4 = max(1, len(r.lat1)), max(1, len(r.lat4))
        stats[r.key] = dict(label=r.label, p50=pct(r.lat1, 50), p90=pct(r.lat1, 90), p99=pct(r.lat1, 99),
                            mean=statistics.fmean(r.lat1), max=max(r.lat1), rate=r.n4 / r.seconds4,
                            p50_4=pct(r.lat4, 50), p99_4=pct(r.lat4, 99),
                            cpu_ms=r.cpu["c1"] * 1000 / n1, cpu_ms_4=r.cpu["c4"] * 1000 / n4,
                            host_ms=r.host["c1"] * 1000 / n1, host_ms_4=r.host["c4"] * 1000 / n4,
                            errors=len(r.err1) + len(r.err4))
    print()
    print(f"{'':36}{'---------- c=1, ms ----------':>40}   {'---------- ' + c4 + ' ----------':>28}")
    print(f"{'':36}{'p50':>8}{'p90':>8}{'p99':>8}{'mean':>8}{'max':>8}   {'execs/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'errors':>8}{'cpu ms/exec':>13}{'host ms/exec':>14}{'cold':>10}")
    for r in rows:
        st = stats[r.key]
        cpu = f"{st['cpu_ms']:.1f}/{st['cpu_ms_4']:.1f}"
        host = f"{st['host_ms']:.1f}/{st['host_ms_4']:.1f}"
        cold = f"{r.cold['c1']:.0f}/{r.cold['c4']:.0f}" if r.is_airlock else "-"
        print(f"({r.key}) {r.label:32}{st['p50']:8.2f}{st['p90']:8.2f}{st['p99']:8.2f}{st['mean']:8.2f}{st['max']:8.1f}   "
              f"{st['rate']:10.0f}{st['p50_4']:9.2f}{st['p99_4']:9.2f}{st['errors']:8d}{cpu:>13}{host:>14}{cold:>10}")
    print(f"  cpu ms/exec: CPU of the server and its descendants (sandboxes, bwrap, fork server) per request, c=1/{c4};"
          f"\n  host ms/exec: all CPUs' busy time (/proc/stat) less the load generator's, per request, c=1/{c4}"
          f" (kernel threads included; other work on the host too);\n  cold: requests the warm pool did not serve, c=1/{c4}")

    ref = next((r for r in rows if r.key == "c"), None)
    if ref is not None:
        rs = stats["c"]
        print()
        print(f"{'ratio vs reference (c)':40}{'p50':>6}{'p99':>8}{'execs/s':>9}{'cpu':>7}{'host':>7}"
              f"   (latency, CPU: < 1 is less; execs/s: > 1 is more; CPU at {c4})")
        for r in rows:
            if r is ref:
                continue
            st = stats[r.key]
            print(f"({r.key}) {r.label:36}{st['p50'] / rs['p50']:6.2f}{st['p99'] / rs['p99']:8.2f}{st['rate'] / rs['rate']:9.2f}"
                  f"{st['cpu_ms_4'] / max(1e-9, rs['cpu_ms_4']):7.2f}{st['host_ms_4'] / max(1e-9, rs['host_ms_4']):7.2f}")

    problems = False
    for r in rows:
        for phase, errs in (("c=1", r.err1), (c4, r.err4)):
            if errs:
                problems = True
                print(f"({r.key}) {len(errs)} failed requests at {phase}, e.g. {sorted(set(errs))[:3]}")
        reconnects = r.c1.reconnects + sum(c.reconnects for c in r.c4)
        if reconnects:
            print(f"({r.key}) {reconnects} reconnects (a keep-alive connection was closed)")
        if r.exit not in (0, None):
            problems = True
            print(f"({r.key}) exited with {r.exit}")
    busy = [b for r in rows for b in r.busy]
    print(f"\nhost CPU busy with other work between chunks: median {statistics.median(busy):.0%}, max {max(busy):.0%}")
    if statistics.median(busy) > 0.05 or max(busy) > 0.25:
        print("WARNING: the host was not quiet; the numbers are skewed (rerun on a quiet host)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "serve", "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "cpus": os.cpu_count(), "concurrency": args.concurrency, "rounds": rounds,
                       "requests": n1 * rounds, "throughput_requests": n4 * rounds,
                       "busy_median": statistics.median(busy), "busy_max": max(busy),
                       "rows": stats}, f, indent=1)
        print(f"figures written to {args.json}")

    a = next((r for r in rows if r.key == "a"), None)
    if a is not None:
        st = stats["a"]
        ok = lambda b: "PASS" if b else "FAIL"
        print()
        print(f"targets (airlock with the pool, 2-core host): p50 <= {TARGET_P50_MS:g} ms at c=1: "
              f"{ok(st['p50'] <= TARGET_P50_MS)} ({st['p50']:.2f}); p99 <= {TARGET_P99_MS:g} ms at c=1: "
              f"{ok(st['p99'] <= TARGET_P99_MS)} ({st['p99']:.2f}); >= {TARGET_EXECS_S:g} execs/s at {c4}: "
              f"{ok(st['rate'] >= TARGET_EXECS_S)} ({st['rate']:.0f})")
        if ref is not None:
            rs = stats["c"]
            print(f"issue 19 targets: host CPU/exec at {c4} <= {TARGET_CPU_MS:g} ms: {ok(st['host_ms_4'] <= TARGET_CPU_MS)} "
                  f"({st['host_ms_4']:.2f}) and <= {TARGET_CPU_RATIO:g}x bwrap's: "
                  f"{ok(st['host_ms_4'] <= TARGET_CPU_RATIO * rs['host_ms_4'])} ({st['host_ms_4'] / max(1e-9, rs['host_ms_4']):.2f}x); "
                  f"execs/s >= {TARGET_RATE_RATIO:g}x bwrap's: {ok(st['rate'] >= TARGET_RATE_RATIO * rs['rate'])} "
                  f"({st['rate'] / rs['rate']:.2f}x); p99 at c=1 <= bwrap's: {ok(st['p99'] <= rs['p99'])}; "
                  f"p50 at c=1 <= {TARGET_P50_19_MS:g} ms: {ok(st['p50'] <= TARGET_P50_19_MS)}")
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
