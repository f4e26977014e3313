#!/usr/bin/env python3
"""The micro-VM backend, measured: cold runs, the service with a pool of booted VMs, and
host memory per pooled VM. Side by side with the namespace backend in the same run.

  1. Cold: `airlock run --isolation microvm -- /bin/true` (boot, run, destroy), N times;
     and `airlock run -- /bin/true` (namespaces) as the reference.
  2. Service: one `airlock serve --vm-pool P --pool 2` on 127.0.0.1:0. Client-observed
     latency of `POST /v1/exec` running /bin/true at concurrency 1:
       - microvm, paced: each request is sent once the VM pool is full again (what a
         request sees when the pool keeps up with the arrival rate);
       - microvm, back to back: requests sent as fast as they complete (the pool drains
         and requests boot their own VMs: what a burst beyond the pool sees);
       - namespaces, back to back, on the same daemon.
  3. Memory: PSS (/proc/PID/smaps_rollup) of each pooled VMM process, once the pool is full
     and idle. Pooled VMs are clones of a template VM, sharing its RAM copy-on-write. The
     first one's PSS is split (from /proc/PID/smaps) into the template's RAM it maps
     (shared between the clones), guest RAM it copied (its guest's own writes), QEMU's
     translated-code cache (TCG), QEMU's heap and other anonymous memory, and files
     (QEMU's binary and libraries, the kernel and initramfs it maps).
  4. Clones, from the library (`examples/clones`, built with
     `cargo build --release -p airlock-microvm --example clones`): the template's build (a
     boot and a save), each clone's restore to a ready agent, PSS per clone with N alive
     and ready like pooled VMs, split into the template's RAM (shared), RAM the clone copied, and the
     rest (QEMU, its translated-code cache).

    make        # release build; the guest agent linked static, as shipped
    sudo python3 bench/microvm.py [--airlock PATH] [--clones PATH] [--cold 5] [--requests 40] [--vm-pool 2]

(`make` is `cargo build --release -p airlock -p airlock-guest ...` then `cargo rustc
--release -p airlock-guest --bin airlock-guest -- -C target-feature=+crt-static`; a
dynamically linked agent works too, but is not what is measured: the bench says which it
found.) Python 3 standard library only. Root is needed (airlock creates cgroups). Figures
are medians over the runs; the machine's other load is printed (uptime) since VMs emulated
in software are CPU-bound. PSS divides shared pages between the processes that map them:
QEMU's binary and libraries count less per VM when other QEMUs run on the host, so the
number of QEMU processes alive at the measurement is printed too.
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

TARGET_P50_MS = 50.0
TARGET_P99_MS = 150.0
TARGET_PSS_MB = 40.0


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def cold(airlock, extra, n):
    walls = []
    for _ in range(n):
        t0 = time.perf_counter()
        p = subprocess.run([airlock, "run", *extra, "--json", "--", "/bin/true"],
                           capture_output=True, timeout=300)
        wall = (time.perf_counter() - t0) * 1000
        if p.returncode != 0:
            sys.exit(f"airlock run {' '.join(extra)} failed: {p.stderr.decode()[-2000:]}")
        r = json.loads(p.stdout)
        if r.get("exit_code") != 0:
            sys.exit(f"/bin/true did not exit 0: {r}")
        walls.append(wall)
    return walls


class Daemon:
    LISTENING = re.compile(rb"listening on http://127\.0\.0\.1:(\d+)")

    def __init__(self, argv, env):
        self.log = tempfile.NamedTemporaryFile(prefix="airlock-bench-vm-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log,
                                     stdin=subprocess.DEVNULL, env=env)
        line = self.proc.stdout.readline()
        m = self.LISTENING.search(line)
        if not m:
            self.stop()
            sys.exit(f"no 'listening on' line from airlock serve: {line!r}; log {self.log.name}")
        self.port = int(m.group(1))
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)

    def request(self, method, path, body=None):
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.conn.request(method, path, body=body, headers=headers)
        r = self.conn.getresponse()
        return r.status, r.read()

    def metric(self, name):
        _, text = self.request("GET", "/metrics")
        for line in text.decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def wait_vm_pool(self, target, timeout=600):
        deadline = time.monotonic() + timeout
        while self.metric('airlock_pool_ready{isolation="microvm"}') < target:
            if time.monotonic() > deadline:
                sys.exit(f"the VM pool did not fill to {target} in {timeout} s; log {self.log.name}")
            time.sleep(0.05)

    def exec(self, isolation):
        body = json.dumps({"cmd": ["/bin/true"], "isolation": isolation}).encode()
        t0 = time.perf_counter()
        status, data = self.request("POST", "/v1/exec", body)
        ms = (time.perf_counter() - t0) * 1000
        if status != 200:
            sys.exit(f"POST /v1/exec ({isolation}): {status} {data[:500]!r}")
        r = json.loads(data)
        if r.get("exit_code") != 0:
            sys.exit(f"/bin/true did not exit 0: {r}")
        return ms, r

    def vmm_pss_mb(self):
        """PSS of every QEMU process below the daemon, in MB."""
        out = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv0 = f.read().split(b"\0", 1)[0]
                if b"qemu-system" not in argv0:
                    continue
                if not self._descends(int(pid)):
                    continue
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    pss = next(int(l.split()[1]) for l in f if l.startswith("Pss:"))
                out.append(pss / 1024)
            except (OSError, StopIteration):
                continue
        return out

    def vmm_pids(self):
        pids = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv0 = f.read().split(b"\0", 1)[0]
            except OSError:
                continue
            if b"qemu-system" in argv0 and self._descends(int(pid)):
                pids.append(int(pid))
        return pids

    def _descends(self, pid):
        while pid > 1:
            if pid == self.proc.pid:
                return True
            try:
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                return False
        return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def clones(binary, airlock, n, prepared=True):
    """Runs examples/clones with `n` clones (made ready like pooled VMs: cloned from the
    template saved with its guest sandbox built, then warmed up; or clones of the plain
    template, just restored);
    its JSON, or None when it is not built."""
    if not os.path.exists(binary):
        print(f"(no {binary}: clone figures skipped)")
        return None
    guest = os.path.join(os.path.dirname(airlock), "airlock-guest")
    env = dict(os.environ, AIRLOCK_GUEST=os.environ.get("AIRLOCK_GUEST", guest))
    if not prepared:
        env["CLONES_UNPREPARED"] = "1"
    p = subprocess.run([binary, str(n)], capture_output=True, timeout=600, env=env)
    if p.returncode != 0:
        sys.exit(f"{binary} failed: {p.stderr.decode()[-2000:]}")
    return json.loads(p.stdout)


def _is_qemu(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"qemu-system" in f.read().split(b"\0", 1)[0]
    except OSError:
        return False


def pss_split(pid):
    """A VMM process's PSS in MB by what it is: the template's guest RAM it maps (shared,
    its part), guest RAM it copied (private), TCG's translated-code cache, QEMU's heap and
    other anonymous memory, files (QEMU, its libraries, the kernel and initramfs)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
        with open(f"/proc/{pid}/smaps") as f:
            text = f.read()
    except OSError:
        return None
    tb = next((re.search(r"tb-size=(\d+)", a) for a in argv if "tb-size=" in a), None)
    tb_kb = int(tb.group(1)) * 1024 if tb else None
    out = {"guest RAM, shared": 0, "guest RAM, copied": 0, "TCG code cache": 0,
           "QEMU heap and anon": 0, "files": 0}
    kind, size = None, 0
    for line in text.splitlines():
        first = line.split(" ", 1)[0]
        if "-" in first and not first.endswith(":"):
            fields = line.split()
            path = fields[5] if len(fields) > 5 else ""
            lo, hi = (int(x, 16) for x in first.split("-"))
            size = (hi - lo) // 1024
            if "memfd:airlock-vm-ram" in line:
                kind = "ram"
            elif path.startswith("/") and "memfd:" not in line:
                kind = "files"
            elif tb_kb and tb_kb - 64 <= size <= tb_kb and not path:
                kind = "TCG code cache"
            else:
                kind = "QEMU heap and anon"
            continue
        if first == "Pss:":
            kb = int(line.split()[1])
            if kind == "ram":
                out["guest RAM, shared"] += kb
            else:
                out[kind] += kb
        elif first == "Anonymous:" and kind == "ram":
            kb = int(line.split()[1])
            out["guest RAM, copied"] += kb
            out["guest RAM, shared"] -= kb
    return {k: round(v / 1024, 1) for k, v in out.items()}


def row(label, xs):
    return (f"| {label} | {len(xs)} | {statistics.median(xs):.1f} | {pct(xs, 90):.1f} | "
            f"{pct(xs, 99):.1f} | {min(xs):.1f} | {max(xs):.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--airlock", default=shutil.which("airlock") or "target/release/airlock")
    ap.add_argument("--cold", type=int, default=5, help="cold runs of each backend")
    ap.add_argument("--requests", type=int, default=40, help="requests per service row")
    ap.add_argument("--vm-pool", type=int, default=2, help="VMs the daemon keeps booted")
    ap.add_argument("--clones", help="examples/clones (default: beside --airlock)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: airlock creates cgroups")
    airlock = os.path.abspath(args.airlock)
    clones_bin = os.path.abspath(args.clones or os.path.join(os.path.dirname(airlock), "examples", "clones"))
    print(f"airlock: {airlock}; load: {os.getloadavg()}")
    guest = os.environ.get("AIRLOCK_GUEST") or os.path.join(os.path.dirname(airlock), "airlock-guest")
    try:
        with open(guest, "rb") as f:
            head = f.read(1 << 20)
        linkage = "dynamically linked" if b"/ld-linux" in head else "static"
    except OSError:
        linkage = "not found"
    print(f"guest agent: {guest} ({linkage})")

    # Prepares the guest image once (cached), so it is not in the first cold figure.
    cold(airlock, ["--isolation", "microvm"], 1)
    vm_cold = cold(airlock, ["--isolation", "microvm"], args.cold)
    ns_cold = cold(airlock, [], args.cold)
    cl = clones(clones_bin, airlock, max(2, args.vm_pool))
    cl_bare = clones(clones_bin, airlock, max(2, args.vm_pool), prepared=False) if cl else None

    env = dict(os.environ, AIRLOCK_LOG=os.environ.get("AIRLOCK_LOG", "warn"))
    d = Daemon([airlock, "serve", "--listen", "127.0.0.1:0", "--pool", "2",
                "--vm-pool", str(args.vm_pool)], env)
    try:
        d.wait_vm_pool(args.vm_pool)
        time.sleep(1.0)  # let the just-booted guests settle to idle
        pss = d.vmm_pss_mb()
        qemus = sum(1 for p in os.listdir("/proc") if p.isdigit() and _is_qemu(p))
        pids = d.vmm_pids()
        split = pss_split(pids[0]) if pids else None
        paced, setup = [], []
        for _ in range(args.requests):
            d.wait_vm_pool(args.vm_pool)
            ms, r = d.exec("microvm")
            paced.append(ms)
            setup.append(r["setup_ms"])
        d.wait_vm_pool(args.vm_pool)
        burst = [d.exec("microvm")[0] for _ in range(args.requests)]
        ns = [d.exec("namespaces")[0] for _ in range(args.requests)]
        boots = d.metric('airlock_provision_seconds_sum{isolation="microvm",pool="warm"}') / max(1.0, d.metric('airlock_provision_seconds_count{isolation="microvm",pool="warm"}'))
    finally:
        d.stop()

    print()
    print("| ms | n | median | p90 | p99 | min | max |")
    print("|---|---|---|---|---|---|---|")
    print(row("cold `airlock run --isolation microvm -- /bin/true`", vm_cold))
    print(row("cold `airlock run -- /bin/true` (namespaces)", ns_cold))
    print(row("service, microvm, warm pool (paced)", paced))
    print(row("service, microvm, back to back (pool drains)", burst))
    print(row("service, namespaces, back to back", ns))
    print()
    print(f"mean VM provision (pool: clone restore + warm-up; cold: boot), from /metrics: {boots * 1000:.0f} ms")
    print(f"setup_ms reported for warm microvm execs: median {statistics.median(setup):.1f}")
    if pss:
        print(f"PSS per pooled VMM process (MB): {', '.join(f'{x:.1f}' for x in pss)}; "
              f"median {statistics.median(pss):.1f} (target <= {TARGET_PSS_MB:.0f}: "
              f"{'met' if statistics.median(pss) <= TARGET_PSS_MB else 'MISSED'})")
        print(f"  ({qemus} QEMU processes on the host at the measurement)")
    if split:
        print("  one pooled VMM's PSS (MB): " + "; ".join(f"{k} {v}" for k, v in split.items()))
    if cl:
        split = cl.get("first_clone_pss_split_mb") or {}
        print(f"template VM ({cl['ram_mib']} MiB RAM, {cl['accel']}): built (boot + save) in "
              f"{cl['template_build_ms']:.0f} ms; its RAM file holds {cl['template_ram_file_mb']} MB")
        print(f"clone restore to ready (ms): {', '.join(f'{x:.0f}' for x in cl['clone_restore_ms'])}; "
              f"median {statistics.median(cl['clone_restore_ms']):.0f}; warm-up median "
              f"{statistics.median(cl['clone_prepare_ms']):.0f}")
        print(f"PSS per clone with {len(cl['clone_pss_mb'])} alive, ready like pooled VMs (MB): "
              f"{', '.join(f'{x:.1f}' for x in cl['clone_pss_mb'])} (target <= {TARGET_PSS_MB:.0f}); first clone: "
              f"template RAM {split.get('ram_mapping')} (of which copied {split.get('ram_copied')}), "
              f"rest {split.get('other')}")
        print(f"/bin/true in a clone (wall ms): median {statistics.median(cl['true_wall_ms']):.1f}")
    if cl_bare:
        split = cl_bare.get("first_clone_pss_split_mb") or {}
        print(f"PSS per clone of the plain template, just restored (MB): "
              f"{', '.join(f'{x:.1f}' for x in cl_bare['clone_pss_mb'])}; first clone: template RAM "
              f"{split.get('ram_mapping')} (copied {split.get('ram_copied')}), rest {split.get('other')}")
    print(f"ratio microvm cold / namespaces cold (median): "
          f"{statistics.median(vm_cold) / statistics.median(ns_cold):.0f}x")
    print(f"targets (warm pool, c=1): p50 <= {TARGET_P50_MS:.0f} ms: "
          f"{'met' if statistics.median(paced) <= TARGET_P50_MS else 'MISSED'}; "
          f"p99 <= {TARGET_P99_MS:.0f} ms: {'met' if pct(paced, 99) <= TARGET_P99_MS else 'MISSED'}")
    print(f"load at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
