#!/usr/bin/env python3
"""The gVisor tier, measured beside the namespace tier (and the micro-VM tier, cold, with
--microvm), in one run, ratios reported.

  1. Pooled: `/bin/true` through a sandbox built ahead of time (a pool's: booted,
     warmed, its agent holding a ready child), at concurrency 1, through each tier's
     library (`crates/airlock-gvisor/examples/bench.rs`: `airlock_backend::Backend` for
     gVisor, `airlock_sandbox::Engine` for namespaces). Targets for gVisor: p50 <= 15 ms,
     p99 <= 50 ms. (Through the service once `serve` takes `--isolation gvisor`.)
  2. Cold: build a sandbox, run `/bin/true`, purge it.
  3. `python3 -c pass`, cold and pooled.
  4. Host memory: PSS (/proc/PID/smaps_rollup) of every host process of an idle pooled
     gVisor sandbox (runsc, the Sentry, the Gofer, ptrace stubs: its cgroup's members),
     with K pooled at once. Target: <= 40 MB each.
  5. With --microvm: cold `airlock run --isolation microvm -- /bin/true` and
     `python3 -c pass` (needs the `airlock` binary; slow under software emulation).

    cargo build --release -p airlock-gvisor --example bench --bin airlock-gvisor-agent
    sudo python3 bench/gvisor.py [--bench PATH] [--pooled 200] [--cold 20] [--python 10] [--pss 8]
                                 [--microvm --airlock target/release/airlock --microvm-runs 3]

Python 3 standard library only. Root is needed (cgroups, runsc).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_P50_MS = 15.0
TARGET_P99_MS = 50.0
TARGET_PSS_MB = 40.0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def measure(bench, what, n):
    """Runs the bench binary; returns {(tier, what): samples}."""
    env = dict(os.environ)
    agent = os.path.join(os.path.dirname(os.path.dirname(bench)), "airlock-gvisor-agent")
    env.setdefault("AIRLOCK_GVISOR_AGENT", agent)
    out = subprocess.run([bench, what, str(n)], env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        sys.exit(f"{bench} {what} {n} failed:\n{out.stderr}")
    found = {}
    for line in out.stdout.splitlines():
        d = json.loads(line)
        found[(d["tier"], d["what"])] = d.get("ms") or d.get("mb")
    return found, out.stderr.strip()


def cold_cli(airlock, extra, argv, n):
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([airlock, "run", *extra, "--", *argv], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, check=True, timeout=600)
        xs.append((time.perf_counter() - t) * 1e3)
    return xs


def row(label, xs, unit="ms"):
    return f"{label:<52} p50 {statistics.median(xs):9.2f} {unit}  p99 {pct(xs, 99):9.2f} {unit}  (n={len(xs)})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=os.path.join(HERE, "..", "target", "release", "examples", "bench"))
    ap.add_argument("--pooled", type=int, default=200)
    ap.add_argument("--cold", type=int, default=20)
    ap.add_argument("--python", type=int, default=10)
    ap.add_argument("--pss", type=int, default=8)
    ap.add_argument("--microvm", action="store_true")
    ap.add_argument("--airlock", default=os.path.join(HERE, "..", "target", "release", "airlock"))
    ap.add_argument("--microvm-runs", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (cgroups, runsc)")
    print("load:", open("/proc/loadavg").read().strip(), "| cores:", os.cpu_count())
    results = {}
    for what, n in (("pooled", args.pooled), ("cold", args.cold), ("python", args.python), ("pss", args.pss)):
        found, info = measure(args.bench, what, n)
        results.update(found)
    print(info)
    if args.microvm:
        results[("microvm", "cold /bin/true")] = cold_cli(args.airlock, ["--isolation", "microvm"],
                                                          ["/bin/true"], args.microvm_runs)
        results[("microvm", "cold python3 -c pass")] = cold_cli(args.airlock, ["--isolation", "microvm"],
                                                                ["python3", "-c", "pass"], args.microvm_runs)
    print()
    for (tier, what), xs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        unit = "MB" if "PSS" in what else "ms"
        print(row(f"{tier}: {what}", xs, unit))
    print()
    for what in ("pooled /bin/true", "cold /bin/true", "cold python3 -c pass", "pooled python3 -c pass"):
        g, n = results.get(("gvisor", what)), results.get(("namespaces", what))
        if g and n:
            print(f"ratio gvisor/namespaces, {what}: {statistics.median(g) / statistics.median(n):.1f}x")
        m = results.get(("microvm", what))
        if g and m:
            print(f"ratio microvm/gvisor, {what}: {statistics.median(m) / statistics.median(g):.1f}x")
    pooled = results[("gvisor", "pooled /bin/true")]
    pss = results[("gvisor", "PSS per pooled sandbox (MB)")]
    print()
    print(f"target pooled p50 <= {TARGET_P50_MS} ms: {'met' if statistics.median(pooled) <= TARGET_P50_MS else 'MISSED'}"
          f" ({statistics.median(pooled):.2f})")
    print(f"target pooled p99 <= {TARGET_P99_MS} ms: {'met' if pct(pooled, 99) <= TARGET_P99_MS else 'MISSED'}"
          f" ({pct(pooled, 99):.2f})")
    print(f"target PSS <= {TARGET_PSS_MB} MB: {'met' if statistics.median(pss) <= TARGET_PSS_MB else 'MISSED'}"
          f" ({statistics.median(pss):.1f})")


if __name__ == "__main__":
    main()
