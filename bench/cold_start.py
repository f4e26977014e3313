#!/usr/bin/env python3
"""Cold start of one sandboxed `/bin/true`: airlock vs bubblewrap vs bare exec.

Each iteration runs the three commands back to back (interleaved, so a noisy neighbour
hits all three alike) and times each from spawn to exit. Prints medians, p90 and the
airlock/bwrap ratio.

    python3 bench/cold_start.py [--runs 300] [--airlock target/release/airlock]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
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
    if "bwrap" in samples:
        ratio = statistics.median(samples["airlock"]) / statistics.median(samples["bwrap"])
        print(f"airlock/bwrap median ratio: {ratio:.2f}")


if __name__ == "__main__":
    main()
