#!/usr/bin/env python3
"""Cold start of one sandboxed `/bin/true`: airlock vs bubblewrap vs bare exec.

Each iteration runs the three commands back to back (interleaved, so a noisy neighbour
hits all three alike) and times each from spawn to exit. Prints medians, p90 and the
airlock/bwrap ratio.

With --breakdown, then records each command's host CPU per run with perf (every CPU,
kernel threads included: --breakdown-runs runs of each, one command at a time) and prints
it phase by phase, side by side, with bench/breakdown.py's rules (its docstring says what
each phase holds). No log of airlock's is read: the figures are CPU, not wall time.

    sudo python3 bench/cold_start.py [--runs 300] [--airlock target/release/airlock]
                                     [--breakdown] [--json FILE]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# bwrap set up as close to airlock's sandbox as its flags allow: every namespace, new
# session, read-only system dirs, fresh /proc and minimal /dev, tmpfs /tmp and work dir,
# non-root uid, no capabilities, empty environment. (airlock additionally applies a
# cgroup with memory/pids/cpu limits, seccomp, landlock and a synthesized /etc.)
BWRAP = [
    "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
    "--ro-bind", "/usr", "/usr",
    "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
    "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
    "--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache",
    "--proc", "/proc", "--dev", "/dev",
    "--tmpfs", "/tmp", "--tmpfs", "/workspace", "--chdir", "/workspace",
    "--uid", "1000", "--gid", "1000", "--cap-drop", "ALL", "--clearenv",
    "/bin/true",
]


def timed(argv):
    t = time.perf_counter()
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - t) * 1000


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--airlock", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "airlock"))
    ap.add_argument("--breakdown", action="store_true",
                    help="also record host CPU per run with perf, phase by phase (bench/breakdown.py's rules)")
    ap.add_argument("--breakdown-runs", type=int, default=100, help="recorded runs of each command")
    ap.add_argument("--json", metavar="FILE", help="also write the figures to FILE as JSON (bench/report.py reads it)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (airlock needs it for cgroups)")
    cases = {"bare": ["/bin/true"], "airlock": [args.airlock, "run", "--", "/bin/true"]}
    if shutil.which("bwrap"):
        cases["bwrap"] = BWRAP
    else:
        print("bwrap not found (apt-get install bubblewrap): skipping it", file=sys.stderr)
    for argv in cases.values():  # warm the page cache
        for _ in range(5):
            timed(argv)
    samples = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, argv in cases.items():
            samples[name].append(timed(argv))
    print(f"cold start of /bin/true, {args.runs} interleaved runs each, wall ms from spawn to exit")
    print(f"{'':10}{'median':>10}{'p90':>10}{'min':>10}")
    for name, xs in samples.items():
        print(f"{name:10}{statistics.median(xs):10.2f}{pct(xs, 90):10.2f}{min(xs):10.2f}")
    ratio = None
    if "bwrap" in samples:
        ratio = statistics.median(samples["airlock"]) / statistics.median(samples["bwrap"])
        print(f"airlock/bwrap median ratio: {ratio:.2f}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    breakdown = breakdown_cpu(cases, args.breakdown_runs) if args.breakdown else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "cold_start", "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "runs": args.runs, "loadavg": os.getloadavg()[0], "ratio": ratio,
                       "rows": {name: {"median": statistics.median(xs), "p90": pct(xs, 90), "min": min(xs)}
                                for name, xs in samples.items()},
                       "breakdown": breakdown}, f, indent=1)
        print(f"figures written to {args.json}")


def breakdown_cpu(cases, runs):
    """Host CPU per run of each command, phase by phase (bench/breakdown.py), printed;
    returns {name: {phase: µs per run}}."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import breakdown

    workdir = tempfile.mkdtemp(prefix="airlock-cold-")
    tallies = []
    try:
        for name, argv in cases.items():
            t = breakdown.Tally(name, " ".join(os.path.basename(a) for a in argv[:2]))

            def work(argv=argv):
                t0 = time.perf_counter()
                for _ in range(runs):
                    timed(argv)
                t.seconds += time.perf_counter() - t0
                time.sleep(breakdown.TAIL[0])  # netns and cgroup release by kworkers, RCU callbacks

            t.record(4000, workdir, work, os.getpid())
            t.n += runs
            tallies.append(t)
    finally:
        os.rmdir(workdir)
    breakdown.print_table(tallies, 0, floor="bare", ref="bwrap", what="run")
    return {t.key: {k: t.per_exec_us(k) for k, _ in breakdown.PHASES + breakdown.EXCLUDED} for t in tallies}


if __name__ == "__main__":
    main()
