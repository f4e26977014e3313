"""The examples in <repo>/examples, run as a user would, against the test daemon."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, Daemon

EXAMPLES = REPO / "examples"


# The SDK under test (this tree's), ahead of any installed version.
SDK = str(Path(__file__).resolve().parents[1])


def run_example(name: str, daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (SDK, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "AIRLOCK_URL": daemon.url, "PYTHONPATH": path}
    env.pop("AIRLOCK_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def test_agent_loop(daemon: Daemon) -> None:
    out = run_example("agent_loop.py", daemon).stdout
    # it saw both errors, fixed them, and printed the final result
    assert "ValueError: invalid literal for int()" in out
    assert "NameError: name 'total' is not defined" in out
    assert "final answer:\nblue: 8.50\nred: 6.00\ngreen: 6.00" in out


def test_agent_loop_against_nothing_fails_cleanly(tmp_path: Path) -> None:
    env = {**os.environ, "AIRLOCK_URL": "http://127.0.0.1:9"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "agent_loop.py")], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert "AirlockConnectionError" in proc.stderr


def test_fork_search(daemon: Daemon) -> None:
    out = run_example("fork_search.py", daemon).stdout
    assert re.match(r"prepared: 2 files in snap-[0-9a-f]{16} \(filesystem\)\n", out), out
    assert "drop the +1: fail (ZeroDivisionError: division by zero)\n" in out
    assert "guard the empty list: fail (AssertionError: 3.0)\n" in out
    assert "both: pass\napplied 'both': tests pass\n" in out
    assert "the run wrote: /workspace/log.txt (created)\n" in out
    assert out.endswith("restored: True ['stats.py', 'test_stats.py']\n"), out


def test_deepagents_backend_example(daemon: Daemon) -> None:
    out = run_example("deepagents_backend.py", daemon).stdout
    assert "NameError" in out and "8 words" in out
    assert "workspace: count.py, poem.txt" in out


def test_openai_agents_example(daemon: Daemon) -> None:
    out = run_example("openai_agents_shell.py", daemon).stdout
    assert "SyntaxError" in out and "2432902008176640000" in out


def test_mcp_desktop_config() -> None:
    config = json.loads((EXAMPLES / "mcp_desktop_config.json").read_text())
    assert config == {"mcpServers": {"airlock": {"command": "airlock", "args": ["mcp"]}}}
