#!/usr/bin/env python3
"""An agent loop without an LLM: a scripted "model" writes code, runs it in airlock, reads
the error, fixes the code and runs it again, until the program works.

The loop is the shape of a real coding agent (observe -> decide -> act through a tool);
only the model is replaced by a script, so the example runs anywhere a daemon runs:

    sudo airlock serve &                       # http://127.0.0.1:8710
    pip install ./clients/python
    python3 examples/agent_loop.py             # or AIRLOCK_URL=http://HOST:PORT (AIRLOCK_API_KEY)

Exits 0 when the task is solved, 1 otherwise.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field

from airlock import Airlock, ExecResult, Limits, Sandbox

TASK = "Write report.py: read scores.csv, print the average score per team, highest first."

SCORES = "team,score\nred,7\nblue,9\nred,5\nblue,8\ngreen,6\n"

# The model's first attempt has two bugs: a misspelled name and a header row parsed as data.
FIRST_DRAFT = '''\
import csv
from collections import defaultdict

totals = defaultdict(list)
with open("scores.csv") as f:
    for team, score in csv.reader(f):
        totals[team].append(int(score))

averages = {team: sum(s) / len(s) for team, s in total.items()}
for team, avg in sorted(averages.items(), key=lambda kv: -kv[1]):
    print(f"{team}: {avg:.2f}")
'''


@dataclass
class Action:
    """What the model asks for: a tool call or a final answer."""

    kind: str  # "write" | "run" | "final"
    path: str = ""
    content: str = ""
    cmd: list[str] = field(default_factory=list)
    answer: str = ""


class ScriptedModel:
    """Stands in for an LLM: looks at the last observation and decides the next action,
    fixing the code from the traceback the sandbox returned."""

    def __init__(self) -> None:
        self.code = ""

    def next_action(self, history: list[tuple[Action, str]]) -> Action:
        if not history:
            self.code = FIRST_DRAFT
            return Action("write", path="report.py", content=self.code)
        last, observation = history[-1]
        if last.kind == "write":
            return Action("run", cmd=["python3", "report.py"])
        # last was a run: read its result
        if "exit code 0" in observation:
            return Action("final", answer=observation.split("\n", 1)[1].strip())
        fixed = self.fix(observation)
        if fixed is None:
            return Action("final", answer="I could not fix it:\n" + observation)
        self.code = fixed
        return Action("write", path="report.py", content=self.code)

    def fix(self, error: str) -> str | None:
        """The 'reasoning': match the error and patch the code."""
        m = re.search(r"NameError: name '(\w+)' is not defined", error)
        if m and m.group(1) == "total":
            return self.code.replace("total.items()", "totals.items()")
        if "invalid literal for int() with base 10: 'score'" in error:
            return self.code.replace(
                "    for team, score in csv.reader(f):",
                "    rows = csv.reader(f)\n    next(rows)  # skip the header\n    for team, score in rows:",
            )
        return None


def observe(result: ExecResult) -> str:
    """What the model sees of a run: exit status first, then the output."""
    status = f"exit code {result.exit_code}" if result.exit_code is not None else f"killed ({result.outcome})"
    return f"{status}\n{result.stdout}{result.stderr}"


def act(sb: Sandbox, action: Action) -> str:
    if action.kind == "write":
        sb.files.write(action.path, action.content)
        return f"wrote {action.path} ({len(action.content)} bytes)"
    if action.kind == "run":
        return observe(sb.exec(action.cmd, limits=Limits(timeout_ms=10_000)))
    raise ValueError(action.kind)


def main() -> int:
    url = os.environ.get("AIRLOCK_URL", "http://127.0.0.1:8710")
    model = ScriptedModel()
    history: list[tuple[Action, str]] = []
    print(f"task: {TASK}\n")
    with Airlock(url) as al, al.sandbox(ttl_s=300) as sb:
        sb.files.write("scores.csv", SCORES)
        for step in range(1, 11):
            action = model.next_action(history)
            if action.kind == "final":
                print(f"[{step}] final answer:\n{action.answer}")
                ok = not action.answer.startswith("I could not")
                return 0 if ok else 1
            observation = act(sb, action)
            label = action.path if action.kind == "write" else " ".join(action.cmd)
            print(f"[{step}] {action.kind} {label}")
            print("    " + observation.strip().replace("\n", "\n    ") + "\n")
            history.append((action, observation))
    print("gave up after 10 steps")
    return 1


if __name__ == "__main__":
    sys.exit(main())
