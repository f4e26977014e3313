#!/usr/bin/env python3
"""Snapshots (issue 17) through `airlock serve`, side by side with the same copy done bare.

One run builds, in a session of each tier asked (default: namespaces), a workspace of
--files files totalling --mb MB (in directories of 50), then measures:

  snapshot      `POST /v1/sandboxes/{id}/snapshots` (filesystem): the round trip the
                client sees, p50 of --repeat (each after one file changed, so each stores
                one new file; the first, which stores everything, is reported apart).
  restore       `POST /v1/sandboxes/{id}/restore` of the first snapshot: p50.
  from snapshot `POST /v1/sandboxes {"from_snapshot"}` (a pooled sandbox plus the import):
                p50, each session deleted after.
  fork x8       `POST /v1/sandboxes/{id}/fork {"count": 8}`: the whole call, p50.
  changeset     an exec of /bin/true with the default changeset (/workspace) against the
                same exec with `"files_changed_in": []`, interleaved: the p50 difference is
                what the changeset costs an exec that changed nothing; and an exec writing
                1,000 files, tracked against untracked.

Bare, for scale: `cp -a` of the same tree from one tmpfs directory to another on the host
and `tar -c | tar -x` of it (what a snapshot and a restore must at least do), p50.

Rows alternate between airlock and bare in rounds so a noisy neighbour hits both alike;
the issue's targets (namespaces): snapshot and restore of a 10 MB, 1,000-file workspace
<= 30 ms each, fork x8 <= 150 ms, changeset <= 0.3 ms on an exec that changed nothing and
<= 5 ms on one that wrote 1,000 files.

    sudo python3 bench/snapshots.py [--airlock target/release/airlock] [--repeat 15]
                                    [--rounds 2] [--tiers namespaces] [--files 1000] [--mb 10]

Python 3 standard library only; root is needed (airlock creates cgroups).
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def ms(t0):
    return (time.perf_counter() - t0) * 1e3


class Daemon:
    """`airlock serve` on a free loopback port with a snapshot store of its own."""

    def __init__(self, airlock, store):
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, AIRLOCK_LOG=os.environ.get("AIRLOCK_LOG", "warn"))
        self.proc = subprocess.Popen(
            [airlock, "serve", "--listen", "127.0.0.1:0", "--pool", "2", "--gvisor-pool", "1",
             "--snapshot-dir", store, "--max-fork", "8", "--max-sessions-per-key", "64"],
            stdout=subprocess.PIPE, stderr=self.log, env=env,
        )
        line = self.proc.stdout.readline().decode()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not m:
            sys.exit(f"airlock serve did not say where it listens: {line!r}")
        self.conn = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=600)
        for _ in range(600):
            if self.request("GET", "/readyz")[0] == 200:
                break
            time.sleep(0.1)

    def request(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        self.conn.request(method, path, body=data, headers=headers)
        r = self.conn.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw) if raw else None
        except ValueError:
            return r.status, raw

    def ok(self, method, path, body=None, want=(200, 201, 204)):
        status, v = self.request(method, path, body)
        if status not in want:
            sys.exit(f"{method} {path}: {status} {v}")
        return v

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def make_tree_script(files, mb):
    size = mb * 1_000_000 // files
    return (
        "import os\n"
        f"n, size = {files}, {size}\n"
        "for i in range(n):\n"
        "    d = 'tree/d%03d' % (i // 50)\n"
        "    os.makedirs(d, exist_ok=True)\n"
        "    with open('%s/f%04d' % (d, i), 'wb') as f: f.write(os.urandom(size))\n"
    )


def bare(files, mb, repeat):
    """cp -a and tar|tar of the same tree, tmpfs to tmpfs, on the host."""
    root = tempfile.mkdtemp(prefix="airlock-bench-snap-")
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", root], check=True)
        src = os.path.join(root, "src")
        os.makedirs(src)
        subprocess.run([sys.executable, "-c", make_tree_script(files, mb)], cwd=src, check=True)
        cp, tar = [], []
        for i in range(repeat):
            dst = os.path.join(root, f"cp{i}")
            t0 = time.perf_counter()
            subprocess.run(["cp", "-a", src, dst], check=True)
            cp.append(ms(t0))
            shutil.rmtree(dst)
            dst = os.path.join(root, f"tar{i}")
            os.makedirs(dst)
            t0 = time.perf_counter()
            subprocess.run(f"tar -C {src} -cf - . | tar -C {dst} -xf -", shell=True, check=True)
            tar.append(ms(t0))
            shutil.rmtree(dst)
        return cp, tar
    finally:
        subprocess.run(["umount", root], check=False)
        os.rmdir(root)


def bench_tier(d, tier, files, mb, repeat):
    out = {}
    sid = d.ok("POST", "/v1/sandboxes", {"isolation": tier, "limits": {"disk_bytes": 256 << 20}})["id"]
    r = d.ok("POST", f"/v1/sandboxes/{sid}/exec",
             {"cmd": ["python3", "-c", make_tree_script(files, mb)], "files_changed_in": []})
    assert r["exit_code"] == 0, r
    t0 = time.perf_counter()
    first = d.ok("POST", f"/v1/sandboxes/{sid}/snapshots", {"kind": "filesystem"})
    out["snapshot first"] = [ms(t0)]
    snaps = []
    for i in range(repeat):
        d.ok("POST", f"/v1/sandboxes/{sid}/exec",
             {"cmd": ["sh", "-c", f"echo {i} > tree/d000/f0000"], "files_changed_in": []})
        t0 = time.perf_counter()
        s = d.ok("POST", f"/v1/sandboxes/{sid}/snapshots", {"kind": "filesystem"})
        out.setdefault("snapshot", []).append(ms(t0))
        snaps.append(s["snapshot_id"])
    for _ in range(repeat):
        t0 = time.perf_counter()
        d.ok("POST", f"/v1/sandboxes/{sid}/restore", {"snapshot_id": first["snapshot_id"]})
        out.setdefault("restore", []).append(ms(t0))
    for _ in range(max(3, repeat // 3)):
        t0 = time.perf_counter()
        made = d.ok("POST", "/v1/sandboxes", {"from_snapshot": first["snapshot_id"]})
        out.setdefault("from snapshot", []).append(ms(t0))
        d.ok("DELETE", f"/v1/sandboxes/{made['id']}")
    for _ in range(max(3, repeat // 5)):
        t0 = time.perf_counter()
        kids = d.ok("POST", f"/v1/sandboxes/{sid}/fork", {"count": 8})["sandboxes"]
        out.setdefault("fork x8", []).append(ms(t0))
        for k in kids:
            d.ok("DELETE", f"/v1/sandboxes/{k['id']}")
    # The changeset: /bin/true tracked vs untracked, interleaved; then 1,000 files written.
    for _ in range(repeat * 4):
        for tracked in (True, False):
            body = {"cmd": ["true"]}
            if not tracked:
                body["files_changed_in"] = []
            t0 = time.perf_counter()
            d.ok("POST", f"/v1/sandboxes/{sid}/exec", body)
            out.setdefault("true tracked" if tracked else "true untracked", []).append(ms(t0))
    write = "mkdir -p w && cd w && i=0; while [ $i -lt 1000 ]; do : > f$i; i=$((i+1)); done"
    for _ in range(repeat):
        for tracked in (True, False):
            body = {"cmd": ["sh", "-c", "rm -rf w"], "files_changed_in": []}
            d.ok("POST", f"/v1/sandboxes/{sid}/exec", body)
            body = {"cmd": ["sh", "-c", write]}
            if not tracked:
                body["files_changed_in"] = []
            t0 = time.perf_counter()
            r = d.ok("POST", f"/v1/sandboxes/{sid}/exec", body)
            out.setdefault("write 1000 tracked" if tracked else "write 1000 untracked", []).append(ms(t0))
    out["stored first MB"] = [first["stored_bytes"] / 1e6]
    for s in snaps + [first["snapshot_id"]]:
        d.ok("DELETE", f"/v1/snapshots/{s}")
    d.ok("DELETE", f"/v1/sandboxes/{sid}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--airlock", default=os.path.join(REPO, "target", "release", "airlock"))
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tiers", default="namespaces")
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--mb", type=int, default=10)
    args = ap.parse_args()
    store = tempfile.mkdtemp(prefix="airlock-bench-snapstore-")
    d = Daemon(args.airlock, store)
    results = {}
    try:
        for _ in range(args.rounds):
            for tier in args.tiers.split(","):
                for k, v in bench_tier(d, tier, args.files, args.mb, args.repeat).items():
                    results.setdefault(tier, {}).setdefault(k, []).extend(v)
            cp, tar = bare(args.files, args.mb, args.repeat)
            results.setdefault("bare", {}).setdefault("cp -a", []).extend(cp)
            results["bare"].setdefault("tar | tar", []).extend(tar)
    finally:
        d.stop()
        shutil.rmtree(store, ignore_errors=True)
    print(f"workspace: {args.files} files, {args.mb} MB; {args.rounds} rounds of {args.repeat}")
    print(f"{'':14} {'row':24} {'p50 ms':>9} {'p90 ms':>9}")
    for tier, rows in results.items():
        for name, xs in rows.items():
            print(f"{tier:14} {name:24} {statistics.median(xs):9.2f} {pct(xs, 90):9.2f}")
    for tier, rows in results.items():
        if tier == "bare":
            continue
        cost = statistics.median(rows["true tracked"]) - statistics.median(rows["true untracked"])
        cost_w = statistics.median(rows["write 1000 tracked"]) - statistics.median(rows["write 1000 untracked"])
        cp = statistics.median(results["bare"]["cp -a"])
        print(f"{tier}: changeset on an unchanged exec {cost:+.2f} ms (target <= 0.3), on 1,000 files written {cost_w:+.2f} ms (target <= 5); "
              f"snapshot / bare cp -a = {statistics.median(rows['snapshot first']) / cp:.2f}x, "
              f"restore / bare cp -a = {statistics.median(rows['restore']) / cp:.2f}x")


if __name__ == "__main__":
    main()
