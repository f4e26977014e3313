"""Timings of the code-interpreter driver, on the host and in an airlock sandbox.

    /usr/bin/python3 tests/kernel/measure.py [--airlock target/debug/airlock]

Prints: driver start to "ready" (and the driver's own kernel_start_ms), the round trip of
`x = 1` on a warm kernel (p50/p90 of 50), and of a 640x480 matplotlib PNG (p50 of 10).
On the host, a round trip is request written -> "done" read. In the sandbox, `airlock run` hands
the program its stdin only at EOF, so all requests go in at once and a round trip is the interval
between consecutive "done" lines as they stream out (the driver's work per run, without the
host-to-sandbox stdin hop).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

DRIVER = Path(__file__).resolve().parents[2] / "crates" / "airlock-server" / "src" / "kernel" / "driver.py"
SOURCE = DRIVER.read_text()
PNG = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]);"
N = 50
N_PNG = 10


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100.0 * (len(values) - 1))))]


def host():
    started = time.monotonic()
    proc = subprocess.Popen(["/usr/bin/python3", "-u", "-c", SOURCE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, cwd="/tmp")
    ready = json.loads(proc.stdout.readline())
    ready_s = time.monotonic() - started

    def run(code, rid):
        t = time.monotonic()
        proc.stdin.write((json.dumps({"op": "run", "id": rid, "code": code}) + "\n").encode())
        proc.stdin.flush()
        while True:
            event = json.loads(proc.stdout.readline())
            if event["event"] == "done":
                return (time.monotonic() - t) * 1000.0

    run("x = 0", "warm")
    small = [run("x = 1", "s%d" % i) for i in range(N)]
    run(PNG, "warm-png")
    png = [run(PNG, "p%d" % i) for i in range(N_PNG)]
    proc.stdin.close()
    proc.wait()
    report("host", ready_s, ready, small, png)


def sandbox(airlock):
    requests = [{"op": "run", "id": "warm", "code": "x = 0"}]
    requests += [{"op": "run", "id": "s%d" % i, "code": "x = 1"} for i in range(N)]
    requests += [{"op": "run", "id": "warm-png", "code": PNG}]
    requests += [{"op": "run", "id": "p%d" % i, "code": PNG} for i in range(N_PNG)]
    started = time.monotonic()
    proc = subprocess.Popen(
        [airlock, "run", "--timeout", "120s", "--memory", "1g", "--cpus", "1", "--stdin", "-",
         "--", "python3", "-u", "-c", SOURCE],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdin.write("".join(json.dumps(r) + "\n" for r in requests).encode())
    proc.stdin.close()
    ready = json.loads(proc.stdout.readline())
    ready_s = time.monotonic() - started
    done_at = {}
    for line in proc.stdout:
        event = json.loads(line)
        if event["event"] == "done":
            done_at[event["id"]] = time.monotonic()
    proc.wait()
    order = ["warm"] + ["s%d" % i for i in range(N)] + ["warm-png"] + ["p%d" % i for i in range(N_PNG)]
    gaps = {order[i]: (done_at[order[i]] - done_at[order[i - 1]]) * 1000.0 for i in range(1, len(order))}
    small = [gaps["s%d" % i] for i in range(N)]
    png = [gaps["p%d" % i] for i in range(N_PNG)]
    report("sandbox", ready_s, ready, small, png)


def report(where, ready_s, ready, small, png):
    print("%-8s start->ready %.0f ms (kernel_start_ms %.0f) | x = 1 p50 %.2f ms p90 %.2f ms | "
          "PNG p50 %.1f ms" % (where, ready_s * 1000, ready["kernel_start_ms"], pct(small, 50),
                                pct(small, 90), statistics.median(png)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--airlock", default=os.environ.get("AIRLOCK_BIN", "/work/main/target/debug/airlock"))
    args = parser.parse_args()
    host()
    if os.access(args.airlock, os.X_OK):
        sandbox(args.airlock)
    else:
        print("sandbox: skipped (no airlock binary at %s)" % args.airlock, file=sys.stderr)
