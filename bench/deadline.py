#!/usr/bin/env python3
"""How late a killed sandbox's result comes back under a kernel-heavy load.

Runs `airlock run --json --timeout T -- stress-ng --clone 8 --timeout 60s` (default CPU
quota, 0.5 cores) with each given airlock binary, interleaved, and prints per binary how
long after the deadline the CLI returned (its wall time less the reported set-up) and what
`wall_ms` said. Compare two builds side by side in one run:

    python3 bench/deadline.py --runs 11 old=/path/to/old/airlock new=target/release/airlock

With --service, each binary runs `airlock serve` (no pool) on a loopback port and the same
program goes through `POST /v1/exec`, one-shot and (--session) in one session.

Needs root and stress-ng (Debian: apt-get install stress-ng).
"""

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

STORM = ["stress-ng", "--clone", "8", "--timeout", "60s", "--quiet"]


def one(binary: str, timeout_s: float) -> tuple[float, float]:
    """Returns (ms from the deadline to the CLI's return, wall_ms reported)."""
    argv = [binary, "run", "--json", "--timeout", f"{timeout_s}s", "--", *STORM]
    t0 = time.monotonic()
    out = subprocess.run(argv, capture_output=True, check=True, timeout=120)
    elapsed_ms = (time.monotonic() - t0) * 1e3
    r = json.loads(out.stdout)
    if r["outcome"] != "timeout":
        sys.exit(f"{binary}: expected a timeout, got {r['outcome']}")
    return elapsed_ms - r["setup_ms"] - timeout_s * 1e3, r["wall_ms"]


class Service:
    """`airlock serve --pool 0` on a free loopback port, stopped with SIGTERM."""

    def __init__(self, binary: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--pool", "0"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        self.session = None
        self.lost = 0

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    def exec(self, timeout_s: float, session: bool) -> tuple[float, float]:
        path = "/v1/exec"
        if session:
            if self.session is None:
                self.session = self.post("/v1/sandboxes", {})["id"]
            path = f"/v1/sandboxes/{self.session}/exec"
        t0 = time.monotonic()
        try:
            r = self.post(path, {"cmd": STORM, "limits": {"timeout_ms": int(timeout_s * 1e3)}})
        except urllib.error.HTTPError as e:
            if not session or e.code != 409:
                raise
            # The last deadline killed the session whole (its init did not report in
            # time): counted, and this exec runs again in a new one.
            self.session = None
            self.lost += 1
            return self.exec(timeout_s, session)
        elapsed_ms = (time.monotonic() - t0) * 1e3
        if r["outcome"] != "timeout":
            sys.exit(f"expected a timeout, got {r['outcome']}")
        return elapsed_ms - r["setup_ms"] - timeout_s * 1e3, r["wall_ms"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=11)
    p.add_argument("--timeout", type=float, default=4.0, help="the deadline, seconds")
    p.add_argument("--service", action="store_true", help="through POST /v1/exec of airlock serve")
    p.add_argument("--session", action="store_true", help="with --service: in one session")
    p.add_argument("binaries", nargs="+", help="NAME=PATH of an airlock binary")
    a = p.parse_args()
    if not shutil.which("stress-ng"):
        sys.exit("stress-ng is needed (apt-get install stress-ng)")
    named = [b.split("=", 1) if "=" in b else (b, b) for b in a.binaries]
    late: dict[str, list[float]] = {n: [] for n, _ in named}
    walls: dict[str, list[float]] = {n: [] for n, _ in named}
    services = {n: Service(path) for n, path in named} if a.service else {}
    try:
        for _ in range(a.runs):
            for name, path in named:
                if a.service:
                    l, w = services[name].exec(a.timeout, a.session)
                else:
                    l, w = one(path, a.timeout)
                late[name].append(l)
                walls[name].append(w)
    finally:
        for svc in services.values():
            svc.stop()
    lost = {n: svc.lost for n, svc in services.items()}
    how = "airlock run" if not a.service else ("a session's exec" if a.session else "POST /v1/exec")
    print(f"{how}: {a.runs} runs each, deadline {a.timeout:.0f} s, stress-ng --clone 8 at the default 0.5 cores")
    print(f"{'':8} {'late p50':>10} {'late min':>10} {'late max':>10} {'wall_ms p50':>12} {'wall_ms max':>12}"
          + ("  sessions lost (409)" if a.session else ""))
    for name, _ in named:
        ls, ws = late[name], walls[name]
        print(f"{name:8} {statistics.median(ls):9.0f}ms {min(ls):9.0f}ms {max(ls):9.0f}ms "
              f"{statistics.median(ws):12.0f} {max(ws):12.0f}" + (f"  {lost[name]}" if a.session else ""))


if __name__ == "__main__":
    main()
