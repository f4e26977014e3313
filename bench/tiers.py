#!/usr/bin/env python3
"""The three isolation tiers side by side, in one run: what each costs.

  1. Cold CLI: `airlock run --isolation T -- /bin/true` and `-- python3 -c pass` (build,
     run, purge), interleaved across tiers, with bubblewrap and a bare exec as the
     floor for /bin/true.
  2. Service: one `airlock serve` with a warm pool for every tier, `POST /v1/exec` of
     /bin/true at concurrency 1, paced so each request finds its tier's pool refilled
     (what a request sees when the pool keeps up with the arrival rate); p50 and p99
     per tier, and `python3 -c pass` from the pool.
  3. Host memory: PSS (/proc/PID/smaps_rollup) of the processes each pooled sandbox
     adds to the host, once the pools are full and idle: the daemon's descendants
     grouped by tier (namespaces: the zygote and the inits it cloned, ready children
     included; gvisor: runsc, its Gofer and Sentry; microvm: the VMM), divided by the
     pool's size. Kernel memory (page tables, a sandbox's cgroup and namespaces) is
     not in PSS.

    sudo python3 bench/tiers.py [--airlock PATH] [--tiers namespaces,gvisor,microvm]
                                [--cold 5] [--requests 100] [--vm-requests 20]

Python 3 standard library only. Root is needed. Figures are medians (p99 where named);
absolute times drift by a fifth between minutes on small machines, so the ratios between
tiers measured in the same run are the figures to compare.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TRUE = ["/bin/true"]
PYTHON = ["python3", "-c", "pass"]


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def timed(argv):
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, timeout=600)
    ms = (time.perf_counter() - t0) * 1000
    if p.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.decode()[-2000:]}")
    return ms, p.stdout


def cold_run(airlock, tier, command):
    ms, out = timed([airlock, "run", "--isolation", tier, "--json", "--", *command])
    r = json.loads(out)
    if r.get("exit_code") != 0:
        sys.exit(f"{tier}: {command} did not exit 0: {r}")
    return ms


def bwrap_true():
    return timed(["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
                  "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
                  "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
                  "--tmpfs", "/tmp", "/bin/true"])[0]


class Daemon:
    LISTENING = re.compile(rb"listening on http://127\.0\.0\.1:(\d+)")

    def __init__(self, argv):
        self.log = tempfile.NamedTemporaryFile(prefix="airlock-bench-tiers-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline()
        m = self.LISTENING.search(line)
        if not m:
            self.stop()
            sys.exit(f"no 'listening on' line from airlock serve: {line!r}; log {self.log.name}")
        self.conn = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=600)

    def request(self, method, path, body=None):
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.conn.request(method, path, body=body, headers=headers)
        r = self.conn.getresponse()
        return r.status, r.read()

    def metric(self, name):
        _, text = self.request("GET", "/metrics")
        for line in text.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def ready(self, tier):
        return self.metric(f'airlock_pool_ready{{isolation="{tier}"}}')

    def wait_pool(self, tier, target, timeout=900):
        deadline = time.monotonic() + timeout
        while self.ready(tier) < target:
            if time.monotonic() > deadline:
                self.stop()
                sys.exit(f"the {tier} pool did not fill to {target} in {timeout} s; log {self.log.name}")
            time.sleep(0.05)

    def exec(self, tier, cmd):
        body = json.dumps({"cmd": cmd, "isolation": tier})
        t0 = time.perf_counter()
        status, data = self.request("POST", "/v1/exec", body)
        ms = (time.perf_counter() - t0) * 1000
        if status != 200:
            self.stop()
            sys.exit(f"{tier}: /v1/exec {status}: {data[:500]!r}; log {self.log.name}")
        r = json.loads(data)
        if r.get("exit_code") != 0:
            sys.exit(f"{tier}: {cmd} did not exit 0: {r}")
        return ms

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def descendants(root):
    """pid -> (ppid, comm, cmdline) for `root` and everything under it."""
    procs = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        procs[int(d)] = (ppid, comm, cmd)
    keep, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        if pid in procs and pid not in keep:
            keep[pid] = procs[pid]
            frontier.extend(p for p, v in procs.items() if v[0] == pid)
    return keep


def pss_kb(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tier_of(procs, root, pid):
    """Which tier a descendant of the daemon `root` belongs to, by its ancestors below
    the daemon: runsc (and its Gofer and Sentry) for gvisor, the VMM for microvm, the
    zygote whose clones are the namespace sandboxes' inits for namespaces."""
    chain = []
    while pid in procs and pid != root:
        chain.append(procs[pid])
        pid = procs[pid][0]
    for _, comm, cmd in reversed(chain):
        if comm.startswith("runsc") or cmd.startswith("/usr/bin/runsc") or cmd.startswith("runsc"):
            return "gvisor"
        if comm.startswith("qemu"):
            return "microvm"
        if "zygote" in cmd:
            return "namespaces"
    return None


def row(name, xs, p99=False):
    tail = f"  p99 {pct(xs, 99):8.1f}" if p99 else ""
    return f"  {name:<34} p50 {pct(xs, 50):8.1f} ms{tail}  (n={len(xs)})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--airlock", default="target/release/airlock")
    ap.add_argument("--tiers", default="namespaces,gvisor,microvm")
    ap.add_argument("--cold", type=int, default=5, help="cold CLI runs per tier and command")
    ap.add_argument("--requests", type=int, default=100, help="service requests per tier (namespaces, gvisor)")
    ap.add_argument("--vm-requests", type=int, default=20, help="service requests for microvm (emulated boots are slow)")
    ap.add_argument("--pool", type=int, default=2, help="pool size per tier")
    args = ap.parse_args()
    tiers = [t for t in args.tiers.split(",") if t]
    airlock = os.path.abspath(args.airlock)
    if not os.path.exists(airlock):
        sys.exit(f"{airlock} missing: cargo build --release first")
    with open("/proc/loadavg") as f:
        print(f"airlock {airlock}; load average {f.read().split()[0]}; cores {os.cpu_count()}")

    print("\n1. cold CLI, build + run + purge (interleaved)")
    cold = {(t, c): [] for t in tiers for c in ("true", "python")}
    base = {"bare": [], "bwrap": []}
    for _ in range(args.cold):
        for t in tiers:
            cold[(t, "true")].append(cold_run(airlock, t, TRUE))
            cold[(t, "python")].append(cold_run(airlock, t, PYTHON))
        base["bare"].append(timed(TRUE)[0])
        if shutil.which("bwrap"):
            base["bwrap"].append(bwrap_true())
    for name, xs in base.items():
        if xs:
            print(row(f"{name} /bin/true", xs))
    for t in tiers:
        print(row(f"{t} /bin/true", cold[(t, "true")]))
        print(row(f"{t} python3 -c pass", cold[(t, "python")]))
    ref = pct(base["bwrap"], 50) if base["bwrap"] else None
    if ref:
        print("  ratio to bwrap (/bin/true): " + ", ".join(
            f"{t} {pct(cold[(t, 'true')], 50) / ref:.1f}x" for t in tiers))

    print("\n2. service, /bin/true at c=1 from each tier's warm pool (paced: pool refilled)")
    pools = {"namespaces": "--pool", "gvisor": "--gvisor-pool", "microvm": "--vm-pool"}
    argv = [airlock, "serve", "--listen", "127.0.0.1:0"]
    for t in ("namespaces", "gvisor", "microvm"):
        argv += [pools[t], str(args.pool if t in tiers else 0)]
    d = Daemon(argv)
    try:
        for t in tiers:
            d.wait_pool(t, args.pool)
        lat = {t: [] for t in tiers}
        py = {t: [] for t in tiers}
        n = max(args.requests, args.vm_requests)
        for i in range(n):
            for t in tiers:
                if t == "microvm" and i >= args.vm_requests:
                    continue
                d.wait_pool(t, args.pool)
                lat[t].append(d.exec(t, TRUE))
        for i in range(max(3, args.cold)):
            for t in tiers:
                d.wait_pool(t, args.pool)
                py[t].append(d.exec(t, PYTHON))
        for t in tiers:
            print(row(f"{t} /bin/true", lat[t], p99=True))
        for t in tiers:
            print(row(f"{t} python3 -c pass", py[t]))
        if "namespaces" in tiers:
            ns = pct(lat["namespaces"], 50)
            print("  ratio to namespaces (p50): " + ", ".join(f"{t} {pct(lat[t], 50) / ns:.1f}x" for t in tiers))

        print(f"\n3. host memory per pooled sandbox (PSS, pools full and idle, {args.pool} each)")
        for t in tiers:
            d.wait_pool(t, args.pool)
        time.sleep(1)
        procs = descendants(d.proc.pid)
        per = {t: 0 for t in tiers}
        count = {t: 0 for t in tiers}
        for pid in procs:
            t = tier_of(procs, d.proc.pid, pid)
            if t in per:
                per[t] += pss_kb(pid)
                count[t] += 1
        for t in tiers:
            print(f"  {t:<34} {per[t] / 1024 / args.pool:8.1f} MB per sandbox ({count[t]} processes in all)")
    finally:
        d.stop()


if __name__ == "__main__":
    main()
