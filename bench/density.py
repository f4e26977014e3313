#!/usr/bin/env python3
"""Idle-session density of `airlock serve`: host memory per idle session, and exec latency
in one session while thousands of others are alive.

For each tier asked for (--tiers namespaces[,gvisor,microvm]) the script starts its own
`airlock serve` on 127.0.0.1:0 (ready when GET /readyz answers 200; stopped with SIGTERM
at the end), with the default memory budget and `--max-sessions-per-key` raised to let
one caller hold them all, then:

  1. creates one probe session and times `/bin/true` in it (p50 with 0 others alive),
  2. snapshots the host's accounting (below), creates N idle sessions
     (`POST /v1/sandboxes` with `limits.memory_bytes` 16 MiB and a long TTL), lets the
     kernel settle (deferred frees, RCU) and snapshots again,
  3. times `/bin/true` in the probe session again (p50 with N others alive),
  4. deletes the N sessions and snapshots once more (what did not come back is a leak or
     a cache the kernel keeps), then times the probe once more (0 others, after).

Host memory per idle session, each a delta over the N sessions divided by N:

  - THE FIGURE, `kernel + processes`: the kernel objects the host pins for them,
    /proc/meminfo SUnreclaim + KernelStack + PageTables + Percpu + Shmem (their netns,
    memcg, mounts, tmpfs and proc inodes, processes' stacks and page tables), plus the
    PSS of the sessions' own processes (from /proc/PID/smaps_rollup: what they hold of
    their own, and their share of what they share with the zygote), plus the daemon's RSS
    growth. Why not MemAvailable alone: on a shared build host, compilers allocate and
    free hundreds of MiB of anonymous memory and stream files through the page cache
    within seconds, which moves MemTotal - MemAvailable (and AnonPages) by more than
    2,000 sessions do; the kernel fields above move far less with them, and the
    processes' PSS is exact whatever else runs.
  - `host`: MemTotal - MemAvailable (the host's own bottom line, noise included),
  - `kernel+anon`: AnonPages + the kernel fields above (noise included),
  - `cgroup`: what the sandboxes' cgroups are charged (memory.current on v2;
    memory.usage_in_bytes on v1, kmem included where the kernel accounts it), immune
    to other processes but blind to what is not charged to a sandbox (the daemon's own
    growth, objects the kernel charges to the root).

Other processes on the host move `host` and `kernel+anon` most, the figure's kernel
fields a little: the script prints the host's load and the drift of both over a quiet
interval as long as the creation took, so a reader can tell signal from noise. Exec p50
with N others pools two chunks (before and after that interval). gVisor and micro-VM
sessions get a 64 and 128 MiB cap (what those tiers accept), not 16. The breakdown prints the sessions' processes (RSS, PSS, private
dirty pages, from /proc/PID/smaps_rollup), the daemon's RSS, threads and fds, and the slab
caches that grew most (/proc/slabinfo).

    sudo python3 bench/density.py [--airlock PATH] [--tiers namespaces,gvisor,microvm]
                                  [--sessions 2000] [--gvisor-sessions 100]
                                  [--microvm-sessions 8] [--execs 300]

Targets (issue 19, 2-core 24 GiB host): 2,000 idle namespace sessions, <= 1 MiB of host
memory per idle namespace session, exec p50 with N others alive <= 1.2x with 0.

Python 3 standard library only. Root is needed (airlock creates cgroups).
"""
import argparse
import glob
import http.client
import json
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

MIB = 1 << 20
SESSION_MEMORY = 16 * MIB
# gVisor counts its Sentry and Gofer against the cap (at least 40 MiB); micro-VMs their
# guest kernel: the other tiers' sessions get a cap they accept.
TIER_MEMORY = {"namespaces": SESSION_MEMORY, "gvisor": 64 * MIB, "microvm": 128 * MIB}
TARGET_MIB_PER_SESSION = 1.0
TARGET_SESSIONS = 2000
TARGET_EXEC_RATIO = 1.2
# The meminfo fields a session can pin (see the docstring).
PINNED = ["AnonPages", "Shmem", "SUnreclaim", "KernelStack", "PageTables", "Percpu"]
# The kernel's part of them (the figure adds the sessions' processes' PSS).
KERNEL = ["Shmem", "SUnreclaim", "KernelStack", "PageTables", "Percpu"]


# --- the daemon ------------------------------------------------------------------------

class Daemon:
    """`airlock serve` on 127.0.0.1 with an ephemeral port, ready when /readyz is 200."""

    LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")

    def __init__(self, argv, env):
        self.log = tempfile.NamedTemporaryFile(prefix="airlock-density-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log,
                                     stdin=subprocess.DEVNULL, env=env)
        self.port = None
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout=120.0):
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise RuntimeError(f"no 'listening on' line ({self.tail()})")
            if select.select([self.proc.stdout], [], [], left)[0]:
                c = os.read(self.proc.stdout.fileno(), 1)
                if not c:
                    raise RuntimeError(f"exited before listening ({self.tail()})")
                line += c
        m = self.LISTENING.search(line.decode(errors="replace"))
        if not m:
            raise RuntimeError(f"unexpected first line {line!r}")
        self.port = int(m.group(1))
        while time.monotonic() < deadline:
            try:
                if self.request("GET", "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"/readyz never answered 200 ({self.tail()})")

    def request(self, method, path, body=None, conn=None, timeout=120):
        own = conn is None
        c = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            c.request(method, path, body=data, headers=headers)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            if own:
                c.close()

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
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()
        return self.proc.returncode


# --- the host's accounting -------------------------------------------------------------

def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0]) * 1024
    return out


def pinned(m, fields=PINNED):
    return sum(m.get(k, 0) for k in fields)


def slabinfo():
    """{cache: bytes} from /proc/slabinfo (active objects x object size)."""
    out = {}
    try:
        with open("/proc/slabinfo") as f:
            for line in f.readlines()[2:]:
                v = line.split()
                out[v[0]] = int(v[1]) * int(v[3])
    except OSError:
        pass
    return out


def sandbox_cgroups_bytes():
    """Bytes charged to every `airlock` cgroup subtree (v2 memory.current, or v1
    memory.usage_in_bytes, which is hierarchical and counts kmem where it is accounted)."""
    total = 0
    seen = set()
    for pattern in ("/sys/fs/cgroup/airlock", "/sys/fs/cgroup/*/airlock", "/sys/fs/cgroup/*/*/airlock",
                    "/sys/fs/cgroup/memory/airlock", "/sys/fs/cgroup/memory/*/airlock",
                    "/sys/fs/cgroup/memory/*/*/airlock"):
        for d in glob.glob(pattern):
            real = os.path.realpath(d)
            if real in seen:
                continue
            for name in ("memory.current", "memory.usage_in_bytes"):
                try:
                    with open(os.path.join(d, name)) as f:
                        total += int(f.read())
                    seen.add(real)
                    break
                except (OSError, ValueError):
                    continue
    return total if seen else None


def host_cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)


def descendants(pid):
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


def rollup(pid):
    """{Rss, Pss, Private_Dirty, ...} in bytes from /proc/PID/smaps_rollup."""
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "kB":
                    out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    except OSError:
        pass
    return out


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def processes(daemon_pid):
    """Per-process memory of the daemon's descendants: {pid: (comm, rollup)}."""
    return {p: (comm(p), rollup(p)) for p in descendants(daemon_pid)}


def proc_status(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


class Snapshot:
    def __init__(self, daemon):
        self.t = time.monotonic()
        self.meminfo = meminfo()
        self.slab = slabinfo()
        self.cgroup = sandbox_cgroups_bytes()
        self.procs = processes(daemon.proc.pid)
        self.daemon_rss = (proc_status(daemon.proc.pid, "VmRSS") or 0) * 1024
        self.daemon_threads = proc_status(daemon.proc.pid, "Threads")
        self.daemon_fds = fds(daemon.proc.pid)

    def used(self):
        return self.meminfo["MemTotal"] - self.meminfo["MemAvailable"]

    def procs_sum(self, field):
        return sum(r.get(field, 0) for _, r in self.procs.values())


def settle(seconds):
    """Lets deferred frees (RCU, kworkers' netns and cgroup cleanup) run."""
    time.sleep(seconds)


# --- load ------------------------------------------------------------------------------

def create_sessions(daemon, n, isolation, workers, errors):
    ids = []
    lock = threading.Lock()
    todo = iter(range(n))
    body = {"limits": {"memory_bytes": TIER_MEMORY[isolation]}, "ttl_s": 6 * 3600}
    if isolation != "namespaces":
        body["isolation"] = isolation

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=600)
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                break
            try:
                status, data = daemon.request("POST", "/v1/sandboxes", body, conn=conn)
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=600)
                with lock:
                    errors.append(f"create: {type(e).__name__}: {e}")
                continue
            with lock:
                if status in (200, 201):
                    ids.append(json.loads(data)["id"])
                else:
                    errors.append(f"create: HTTP {status}: {data[:300].decode(errors='replace')}")
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    last = time.monotonic()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=0.5)
        if time.monotonic() - last > 10:
            last = time.monotonic()
            with lock:
                print(f"  ... {len(ids)} sessions, {len(errors)} errors", flush=True)
    return ids


def delete_sessions(daemon, ids, workers, errors):
    lock = threading.Lock()
    todo = iter(list(ids))

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=600)
        while True:
            with lock:
                sid = next(todo, None)
            if sid is None:
                break
            try:
                status, data = daemon.request("DELETE", f"/v1/sandboxes/{sid}", conn=conn)
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=600)
                errors.append(f"delete: {type(e).__name__}: {e}")
                continue
            if status not in (200, 204, 404, 410):
                errors.append(f"delete {sid}: HTTP {status}: {data[:200].decode(errors='replace')}")
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def exec_p50(daemon, sid, n):
    """p50 and p90 (ms, client-observed) of `/bin/true` in session `sid` over one
    keep-alive connection, after 10 untimed."""
    times = exec_times(daemon, sid, n)
    return statistics.median(times), times[int(len(times) * 0.9)]


def exec_times(daemon, sid, n):
    """Sorted times (ms) of n execs of `/bin/true` in `sid`, after 10 untimed."""
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=120)
    times = []
    try:
        for i in range(n + 10):
            t0 = time.perf_counter()
            status, data = daemon.request("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": ["/bin/true"]}, conn=conn)
            ms = (time.perf_counter() - t0) * 1000
            if status != 200 or json.loads(data).get("exit_code") != 0:
                raise RuntimeError(f"exec in {sid}: HTTP {status}: {data[:300].decode(errors='replace')}")
            if i >= 10:
                times.append(ms)
    finally:
        conn.close()
    times.sort()
    return times


# --- one tier --------------------------------------------------------------------------

def mib(b):
    return b / MIB


def run_tier(args, airlock, isolation, n):
    env = dict(os.environ)
    env.setdefault("AIRLOCK_LOG", "warn")
    argv = [airlock, "serve", "--listen", "127.0.0.1:0", "--max-sessions-per-key", str(n + 1)]
    argv += args.serve_arg
    print(f"\n== {isolation}: {n} idle sessions of {TIER_MEMORY[isolation] // MIB} MiB; {' '.join(argv[1:])}", flush=True)
    daemon = Daemon(argv, env)
    errors = []
    ids, probe = [], None
    res = {"tier": isolation, "asked": n}
    try:
        status, data = daemon.request("GET", "/readyz")
        ready = json.loads(data)
        res["budget"] = ready.get("memory_budget_bytes")
        res["max"] = ready.get("sandboxes_max")
        body = {"limits": {"memory_bytes": TIER_MEMORY[isolation]}, "ttl_s": 6 * 3600}
        if isolation != "namespaces":
            body["isolation"] = isolation
        status, data = daemon.request("POST", "/v1/sandboxes", body)
        if status not in (200, 201):
            raise RuntimeError(f"probe session: HTTP {status}: {data[:300].decode(errors='replace')}")
        probe = json.loads(data)["id"]
        res["p50_0"], res["p90_0"] = exec_p50(daemon, probe, args.execs)
        settle(args.settle)
        before = Snapshot(daemon)
        b0 = host_cpu()
        t0 = time.monotonic()
        ids = create_sessions(daemon, n, isolation, args.workers, errors)
        res["create_s"] = time.monotonic() - t0
        res["created"] = len(ids)
        settle(args.settle)
        during = Snapshot(daemon)
        b1 = host_cpu()
        res["load"] = (b1[0] - b0[0]) / max(1, b1[1] - b0[1])
        # With N alive: half now, half after the quiet interval below, pooled (a burst
        # of a neighbour's work then weighs on half the samples, not all).
        n_times = exec_times(daemon, probe, args.execs // 2)
        # Drift of the pinned figure over a quiet interval (nothing created or deleted).
        quiet = min(res["create_s"] + args.settle, 30.0)
        q0 = meminfo()
        time.sleep(quiet)
        q1 = meminfo()
        res["drift"] = abs(pinned(q1) - pinned(q0))
        res["drift_kernel"] = abs(pinned(q1, KERNEL) - pinned(q0, KERNEL))
        n_times = sorted(n_times + exec_times(daemon, probe, args.execs - args.execs // 2))
        res["p50_n"], res["p90_n"] = statistics.median(n_times), n_times[int(len(n_times) * 0.9)]
        res["drift_s"] = quiet
        t0 = time.monotonic()
        delete_sessions(daemon, ids, args.workers, errors)
        res["delete_s"] = time.monotonic() - t0
        ids = []
        settle(args.settle)
        after = Snapshot(daemon)
        res["p50_after"], _ = exec_p50(daemon, probe, args.execs)
        k = max(1, res["created"])
        res["host"] = (during.used() - before.used()) / k
        res["pinned"] = (pinned(during.meminfo) - pinned(before.meminfo)) / k
        res["fields"] = {f: (during.meminfo.get(f, 0) - before.meminfo.get(f, 0)) / k for f in PINNED}
        res["kernel"] = (pinned(during.meminfo, KERNEL) - pinned(before.meminfo, KERNEL)) / k
        res["cgroup"] = None if during.cgroup is None or before.cgroup is None else (during.cgroup - before.cgroup) / k
        res["left_pinned"] = (pinned(after.meminfo) - pinned(before.meminfo)) / k
        res["procs"] = {f: (during.procs_sum(f) - before.procs_sum(f)) / k for f in ("Rss", "Pss", "Private_Dirty", "Anonymous")}
        res["nprocs"] = (len(during.procs) - len(before.procs)) / k
        res["daemon"] = {
            "rss": (during.daemon_rss - before.daemon_rss) / k,
            "threads": (before.daemon_threads, during.daemon_threads, after.daemon_threads),
            "fds": (before.daemon_fds, during.daemon_fds, after.daemon_fds),
        }
        comms = {}
        for pid, (c, r) in during.procs.items():
            if pid in before.procs:
                continue
            e = comms.setdefault(c, [0, 0, 0, 0])
            e[0] += 1
            e[1] += r.get("Rss", 0)
            e[2] += r.get("Pss", 0)
            e[3] += r.get("Private_Dirty", 0)
        res["comms"] = comms
        res["figure"] = res["kernel"] + res["procs"]["Pss"] + max(0.0, res["daemon"]["rss"])
        slab = sorted(((during.slab.get(c, 0) - before.slab.get(c, 0), c) for c in during.slab), reverse=True)
        res["slab"] = [(c, d / k) for d, c in slab[:10] if d > 0]
    finally:
        if ids:
            delete_sessions(daemon, ids, args.workers, errors)
        if probe:
            try:
                daemon.request("DELETE", f"/v1/sandboxes/{probe}")
            except OSError:
                pass
        rc = daemon.stop()
        if rc not in (0, None):
            errors.append(f"daemon exited {rc}: {daemon.tail()}")
    res["errors"] = errors
    return res


def report(res):
    print(f"\n-- {res['tier']}: {res['created']}/{res['asked']} sessions in {res['create_s']:.1f} s "
          f"(deleted in {res['delete_s']:.1f} s), host CPU {res['load']:.0%} busy while creating; "
          f"budget {mib(res['budget'] or 0):.0f} MiB, max sandboxes {res['max']}")
    print(f"   host memory per idle session (delta / N):")
    print(f"     kernel + processes (the figure) {mib(res['figure']):8.3f} MiB = kernel objects "
          f"{mib(res['kernel']) * 1024:.0f} KiB + processes' PSS {mib(res['procs']['Pss']) * 1024:.0f} KiB "
          f"+ daemon RSS {max(0.0, mib(res['daemon']['rss'])) * 1024:.0f} KiB")
    print(f"     kernel+anon              {mib(res['pinned']):8.3f} MiB   "
          f"[{', '.join(f'{f} {mib(v) * 1024:.0f}' for f, v in res['fields'].items())} KiB]")
    print(f"     MemTotal-MemAvailable    {mib(res['host']):8.3f} MiB")
    if res["cgroup"] is not None:
        print(f"     charged to the cgroups   {mib(res['cgroup']):8.3f} MiB")
    n = max(1, res["created"])
    print(f"     noise over a quiet {res['drift_s']:.0f} s: kernel objects drifted {mib(res['drift_kernel']) / n * 1024:.0f} "
          f"KiB per session, kernel+anon {mib(res['drift']) / n * 1024:.0f} KiB per session")
    print(f"     not back after deleting  {mib(res['left_pinned']) * 1024:8.1f} KiB per session")
    p = res["procs"]
    print(f"   processes per session {res['nprocs']:.2f}: RSS {mib(p['Rss']) * 1024:.0f} KiB, "
          f"PSS {mib(p['Pss']) * 1024:.0f} KiB, private dirty {mib(p['Private_Dirty']) * 1024:.0f} KiB, "
          f"anonymous {mib(p['Anonymous']) * 1024:.0f} KiB")
    for c, (cnt, rss, pss, dirty) in sorted(res["comms"].items(), key=lambda kv: -kv[1][2]):
        print(f"     {c:16} x{cnt:<6} PSS {pss / cnt / 1024:7.0f} KiB  RSS {rss / cnt / 1024:7.0f} KiB  "
              f"private dirty {dirty / cnt / 1024:6.0f} KiB each")
    d = res["daemon"]
    print(f"   daemon: RSS +{mib(d['rss']) * 1024:.1f} KiB per session; threads {d['threads'][0]} -> "
          f"{d['threads'][1]} -> {d['threads'][2]}; fds {d['fds'][0]} -> {d['fds'][1]} -> {d['fds'][2]}")
    if res["slab"]:
        print("   slab caches that grew most, KiB per session: "
              + ", ".join(f"{c} {v / 1024:.1f}" for c, v in res["slab"]))
    ratio = res["p50_n"] / max(1e-9, (res["p50_0"] + res["p50_after"]) / 2)
    res["ratio"] = ratio
    print(f"   exec /bin/true in one session: p50 {res['p50_0']:.2f} ms with 0 others, "
          f"{res['p50_n']:.2f} ms with {res['created']} others (p90 {res['p90_0']:.2f} / {res['p90_n']:.2f}), "
          f"{res['p50_after']:.2f} ms after deleting them: {ratio:.2f}x")
    for e in res["errors"][:5]:
        print(f"   error: {e}")
    if len(res["errors"]) > 5:
        print(f"   ... {len(res['errors']) - 5} more errors")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--airlock", default=os.path.join(here, "..", "target", "release", "airlock"))
    ap.add_argument("--tiers", default="namespaces", help="comma-separated: namespaces,gvisor,microvm")
    ap.add_argument("--sessions", type=int, default=TARGET_SESSIONS, help="idle namespace sessions")
    ap.add_argument("--gvisor-sessions", type=int, default=100)
    ap.add_argument("--microvm-sessions", type=int, default=8)
    ap.add_argument("--execs", type=int, default=300, help="timed execs per p50")
    ap.add_argument("--workers", type=int, default=4, help="concurrent creations")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds left to the kernel before a snapshot")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="one more argument for `airlock serve` (repeat)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (airlock needs it for cgroups)")
    airlock = os.path.abspath(args.airlock)
    if not os.access(airlock, os.X_OK):
        sys.exit(f"{airlock}: not found; build it with `cargo build --release` or pass --airlock")
    counts = {"namespaces": args.sessions, "gvisor": args.gvisor_sessions, "microvm": args.microvm_sessions}
    results = []
    for tier in [t.strip() for t in args.tiers.split(",") if t.strip()]:
        if tier not in counts:
            sys.exit(f"unknown tier {tier!r}")
        try:
            res = run_tier(args, airlock, tier, counts[tier])
        except Exception as e:  # one tier failing should not hide the others' figures
            print(f"   {tier}: failed: {e}", flush=True)
            continue
        report(res)
        results.append(res)
    if not results:
        sys.exit(1)
    print(f"\n{'tier':11} {'sessions':>9} {'MiB/session':>12} {'(host)':>8} {'(cgroup)':>9} "
          f"{'p50 0':>7} {'p50 N':>7} {'ratio':>6}")
    for r in results:
        cg = "-" if r["cgroup"] is None else f"{mib(r['cgroup']):.3f}"
        print(f"{r['tier']:11} {r['created']:>9} {mib(r['figure']):>12.3f} {mib(r['host']):>8.3f} {cg:>9} "
              f"{r['p50_0']:>7.2f} {r['p50_n']:>7.2f} {r['ratio']:>6.2f}")
    print(f"targets (namespaces, 2-core 24 GiB host): {TARGET_SESSIONS} sessions, "
          f"<= {TARGET_MIB_PER_SESSION:g} MiB per idle session, exec p50 ratio <= {TARGET_EXEC_RATIO:g}")
    failed = any(r["errors"] for r in results)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
