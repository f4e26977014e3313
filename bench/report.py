#!/usr/bin/env python3
"""The README's performance table, regenerated from the benches.

Runs bench/serve.py (the service: airlock with its pool and without, bwrap per request,
bare fork+exec; --json) and bench/cold_start.py (cold `airlock run -- /bin/true` beside
bwrap and bare; --json), or reads their JSON output given with --serve-json and
--cold-json, then writes the table between the markers `<!-- perf-table:begin -->` and
`<!-- perf-table:end -->` of README.md and prints it. The table says when, at which
commit and how busy the host was; it never mixes figures of two runs of a bench.

    sudo python3 bench/report.py [--airlock PATH] [--rounds 5] [--cold-runs 300]
                                 [--serve-json FILE] [--cold-json FILE] [--dry-run]

Python 3 standard library only; root (the benches need it).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BEGIN, END = "<!-- perf-table:begin -->", "<!-- perf-table:end -->"


def run_bench(argv):
    """Runs one bench script, its output streamed to ours; exits if it fails."""
    print("+", " ".join(argv), flush=True)
    code = subprocess.call(argv)
    if code != 0:
        sys.exit(f"{argv[1]} failed with exit status {code}")


def commit():
    """The checkout's short commit, with "+changes" when its tree differs from it."""
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def table(serve, cold, rev):
    """The markdown between the markers."""
    rows = serve["rows"]
    cols = [("a", "airlock, pool"), ("b", "airlock, no pool"), ("c", "bwrap"), ("d", "bare")]
    cols = [(k, name) for k, name in cols if k in rows]
    cold_key = {"a": "airlock", "c": "bwrap", "d": "bare"}
    c4 = f"c={serve['concurrency']}"

    def cell(k, f):
        try:
            return f(rows[k])
        except (KeyError, TypeError, ZeroDivisionError):
            return "–"

    lines = [
        "| `/bin/true` | " + " | ".join(name for _, name in cols) + " |",
        "|---|" + "---|" * len(cols),
        "| service, c=1 p50 / p99 | " + " | ".join(
            cell(k, lambda r: f"{r['p50']:.2f} / {r['p99']:.1f} ms") for k, _ in cols) + " |",
        f"| service, {c4} execs/s | " + " | ".join(cell(k, lambda r: f"{r['rate']:.0f}") for k, _ in cols) + " |",
        f"| host CPU per exec ({c4}) | " + " | ".join(
            cell(k, lambda r: f"{r['host_ms_4']:.2f} ms") for k, _ in cols) + " |",
    ]
    if cold:
        crow = cold["rows"]
        lines.append("| cold `run`, median | " + " | ".join(
            f"{crow[cold_key[k]]['median']:.2f} ms" if cold_key.get(k) in crow else "–" for k, _ in cols) + " |")
    when = serve["time"] + (f"; cold start {cold['time']}" if cold and cold["time"] != serve["time"] else "")
    busy = f"host busy with other work {serve['busy_median']:.0%} (median between chunks)"
    if cold:
        busy += f", load average {cold['loadavg']:.1f} after the cold runs"
    note = (f"Measured {when}, commit {rev}, {serve['cpus']} CPUs, {busy}, by `bench/report.py`; "
            "host CPU is every CPU's busy time less the load generator's (kernel threads included). "
            "How, and where each millisecond goes: [docs/benchmarks.md](docs/benchmarks.md#where-the-cpu-goes).")
    return "\n".join(lines + [""] + textwrap.wrap(note, 90, break_on_hyphens=False, break_long_words=False))


def rewrite(path, text):
    with open(path) as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc or doc.index(BEGIN) > doc.index(END):
        sys.exit(f"{path}: no {BEGIN} ... {END} markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(path, "w") as f:
        f.write(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--airlock", default=os.path.join(ROOT, "target", "release", "airlock"))
    ap.add_argument("--rounds", type=int, default=5, help="bench/serve.py --rounds")
    ap.add_argument("--requests", type=int, default=500, help="bench/serve.py --requests")
    ap.add_argument("--throughput-requests", type=int, default=1000, help="bench/serve.py --throughput-requests")
    ap.add_argument("--cold-runs", type=int, default=300, help="bench/cold_start.py --runs")
    ap.add_argument("--serve-json", metavar="FILE", help="read bench/serve.py --json output instead of running it")
    ap.add_argument("--cold-json", metavar="FILE", help="read bench/cold_start.py --json output instead of running it")
    ap.add_argument("--no-cold", action="store_true", help="leave the cold-start row out")
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--dry-run", action="store_true", help="print the table, do not write README.md")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="airlock-report-")
    serve_json = args.serve_json or os.path.join(tmp, "serve.json")
    cold_json = args.cold_json or os.path.join(tmp, "cold.json")
    if not args.serve_json:
        run_bench([sys.executable, os.path.join(HERE, "serve.py"), "--airlock", args.airlock, "--only", "abcd",
                   "--rounds", str(args.rounds), "--requests", str(args.requests),
                   "--throughput-requests", str(args.throughput_requests), "--json", serve_json])
    if not args.cold_json and not args.no_cold:
        run_bench([sys.executable, os.path.join(HERE, "cold_start.py"), "--airlock", args.airlock,
                   "--runs", str(args.cold_runs), "--json", cold_json])
    with open(serve_json) as f:
        serve = json.load(f)
    cold = None
    if not args.no_cold:
        with open(cold_json) as f:
            cold = json.load(f)
    text = table(serve, cold, commit())
    print()
    print(text)
    if serve["busy_median"] > 0.05 or (cold and cold["loadavg"] > 1.5):
        print("\nWARNING: the host was not quiet: the table's figures are skewed (rerun on a quiet host)")
    if not args.dry_run:
        rewrite(args.readme, text)
        print(f"\n{args.readme}: table rewritten between {BEGIN} and {END}")
    for name in ("serve.json", "cold.json"):
        try:
            os.unlink(os.path.join(tmp, name))
        except OSError:
            pass
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
