"""Fork search: prepare a session once (a buggy module and its test), fork it into one copy
per candidate fix, try every fix in its own copy at the same time, and keep the first that
passes; a snapshot of the prepared state lets the original go back to it afterwards.

Runs against $AIRLOCK_URL (default http://127.0.0.1:8710) with the SDK only (no LLM: the
candidate fixes are fixed strings here, where an agent would have a model write them).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

from airlock import Airlock, AirlockError, ExecResult, Sandbox

MODULE = "def mean(xs):\n    return sum(xs) / len(xs) + 1\n"
TEST = "from stats import mean\nassert mean([1, 2, 3]) == 2, mean([1, 2, 3])\nassert mean([]) == 0\nprint('tests pass')\n"
CANDIDATES = {
    "drop the +1": "def mean(xs):\n    return sum(xs) / len(xs)\n",
    "guard the empty list": "def mean(xs):\n    return sum(xs) / len(xs) + 1 if xs else 0\n",
    "both": "def mean(xs):\n    return sum(xs) / len(xs) if xs else 0\n",
}


def attempt(fork: Sandbox, code: str) -> ExecResult:
    fork.files.write("stats.py", code)
    return fork.exec(["python3", "-B", "test_stats.py"])


def main() -> int:
    with Airlock() as al, al.sandbox(ttl_s=300) as sb:
        sb.files.write("stats.py", MODULE)
        sb.files.write("test_stats.py", TEST)
        prepared = sb.snapshot()
        print(f"prepared: {prepared.files} files in {prepared.snapshot_id} ({prepared.kind})")

        forks = sb.fork(len(CANDIDATES))  # one independent copy per candidate
        try:
            with ThreadPoolExecutor(len(forks)) as pool:
                results = list(pool.map(attempt, forks, CANDIDATES.values()))
        finally:
            for f in forks:
                f.close()
        winner = None
        for name, r in zip(CANDIDATES, results):
            last = (r.stderr.strip().splitlines() or [""])[-1]
            print(f"{name}: {'pass' if r.ok else 'fail (' + last + ')'}")
            if r.ok and winner is None:
                winner = name
        if winner is None:
            print("no candidate passes")
            return 1

        # Apply the winner to the original; the exec's changeset says what the run wrote.
        sb.files.write("stats.py", CANDIDATES[winner])
        r = sb.exec(["sh", "-c", "python3 -B test_stats.py > log.txt"])
        print(f"applied {winner!r}:", sb.files.read_text("log.txt").strip())
        print("the run wrote:", ", ".join(f"{c.path} ({c.change})" for c in r.files_changed))

        sb.restore(prepared)  # and back to the prepared state
        print("restored:", "+ 1" in sb.files.read_text("stats.py"), sorted(e.path for e in sb.files.list()))
        al.delete_snapshot(prepared)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AirlockError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
