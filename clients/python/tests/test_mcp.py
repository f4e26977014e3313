"""airlock's MCP server, driven end to end by clients nobody here wrote.

- The official Python SDK (``pip install mcp==2.3.0``), as a ``ClientSession`` over stdio
  (``airlock mcp``) and over streamable HTTP (``/mcp`` of a daemon), each in both protocol
  eras the SDK speaks: the ``initialize`` handshake (2025-11-25) and ``server/discover``
  (2026-07-28, the current revision).
- The MCP Inspector CLI from npm (``npx @modelcontextprotocol/inspector@2.12.0 --cli``).
  Its 2.x line declares ``node >=22.19``; 2.12.0, the newest, runs its CLI on Node 20.20
  (checked here), so that is the version pinned.

Structured results are checked against each tool's output schema with ``jsonschema``
(``pip install jsonschema==4.26.0``). The binary is ``$AIRLOCK_BIN`` (default
``<repo>/target/debug/airlock``); daemons listen on ``127.0.0.1:0``. Fixtures are kept in
this file (the other suites' ``conftest.py`` is theirs).
"""

from __future__ import annotations

import base64
import glob
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import anyio
import jsonschema
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp import types as mcp_types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from conftest import snapshot_dir

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

REPO = Path(__file__).resolve().parents[3]
INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
KEYS = {"alice": "alice-key-0123456789abcdef", "bob": "bob-key-0123456789abcdef0"}

TOOLS = {
    "run_code", "create_sandbox", "exec", "write_file", "read_file", "close_sandbox", "update_network",
    "snapshot_sandbox", "restore_sandbox", "fork_sandbox",
}
# (readOnlyHint, destructiveHint, idempotentHint, openWorldHint) as each tool declares them.
ANNOTATIONS = {
    # With sandbox_id it changes that sandbox's kernel state: neither read-only nor idempotent.
    "run_code": (False, False, False, False),
    "create_sandbox": (False, False, False, False),
    "exec": (False, True, False, True),
    "write_file": (False, True, True, False),
    "read_file": (True, False, True, False),
    "close_sandbox": (False, True, True, False),
    "update_network": (False, False, True, True),
    "snapshot_sandbox": (False, False, False, False),
    # A restore throws away what was written since the snapshot; twice is the same as once.
    "restore_sandbox": (False, True, True, False),
    "fork_sandbox": (False, False, False, False),
}
REQUIRED = {
    "run_code": {"language", "code"},
    "create_sandbox": set(),
    "exec": {"sandbox_id"},
    "write_file": {"sandbox_id", "path", "content"},
    "read_file": {"sandbox_id", "path"},
    "close_sandbox": {"sandbox_id"},
    "update_network": {"sandbox_id"},
    "snapshot_sandbox": {"sandbox_id"},
    "restore_sandbox": {"sandbox_id", "snapshot_id"},
    "fork_sandbox": {"sandbox_id", "count"},
}
# JSON-RPC "invalid params": a call that does not fit the tool, or an unknown tool.
INVALID_PARAMS = -32602


def airlock_bin() -> str:
    path = Path(os.environ.get("AIRLOCK_BIN") or REPO / "target" / "debug" / "airlock")
    if not path.exists():
        pytest.fail(f"no airlock binary at {path}: run `cargo build` or set AIRLOCK_BIN", pytrace=False)
    return str(path)


# ---------------------------------------------------------------------------------------
# Daemons
# ---------------------------------------------------------------------------------------


@dataclass
class Daemon:
    """A running ``airlock serve --listen 127.0.0.1:0``."""

    proc: subprocess.Popen[bytes]
    url: str
    port: int
    log: Path

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class _deadline:
    """Fails the test if the block takes longer than `seconds` (SIGALRM; main thread)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds

    def __enter__(self) -> None:
        def expired(*_: Any) -> None:
            raise TimeoutError(f"no answer within {self.seconds} s")

        self.previous = signal.signal(signal.SIGALRM, expired)
        signal.alarm(self.seconds)

    def __exit__(self, *_: Any) -> None:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)


def start_daemon(tmp: Path, *args: str) -> Daemon:
    """Starts the daemon and reads its address from the first stdout line."""
    log = tmp / "stderr"
    argv = [
        airlock_bin(), "serve", "--listen", "127.0.0.1:0", "--snapshot-dir", str(tmp / "snapshots"),
        "--pool", "1", *args,
    ]
    env = {k: v for k, v in os.environ.items() if k != "AIRLOCK_API_KEYS"}
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    with _deadline(60):
        line = proc.stdout.readline().decode()
    m = re.fullmatch(r"airlock: listening on (http://127\.0\.0\.1:(\d+))\n", line)
    if not m:
        proc.kill()
        pytest.fail(f"{argv}: unexpected first line {line!r}:\n{log.read_text(errors='replace')}", pytrace=False)
    return Daemon(proc=proc, url=m.group(1), port=int(m.group(2)), log=log)


@pytest.fixture(scope="module")
def mcp_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon on loopback without API keys."""
    d = start_daemon(tmp_path_factory.mktemp("mcp-daemon"))
    yield d
    assert d.stop() == 0, d.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def keyed_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon that requires API keys (alice and bob)."""
    tmp = tmp_path_factory.mktemp("mcp-keyed")
    keys = tmp / "keys"
    keys.write_text("".join(f"{name}:{key}\n" for name, key in KEYS.items()))
    keys.chmod(0o600)
    d = start_daemon(tmp, "--api-keys", str(keys))
    yield d
    assert d.stop() == 0, d.log.read_text(errors="replace")


# ---------------------------------------------------------------------------------------
# Client sessions (the `mcp` package)
# ---------------------------------------------------------------------------------------


async def negotiate(session: ClientSession, era: str) -> None:
    if era == "handshake":
        await session.initialize()
        assert session.protocol_version == "2025-11-25"
    else:
        await session.discover()
        assert session.protocol_version == "2026-07-28"


@asynccontextmanager
async def stdio_session(era: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=airlock_bin(), args=["mcp", "--pool", "1", "--snapshot-dir", snapshot_dir()])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await negotiate(session, era)
            yield session


@asynccontextmanager
async def http_session(url: str, era: str, api_key: str | None = None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url + "/mcp", http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await negotiate(session, era)
                yield session


# Every transport in both eras.
TRANSPORTS = [
    pytest.param(("stdio", "handshake"), id="stdio-2025-11-25"),
    pytest.param(("stdio", "modern"), id="stdio-2026-07-28"),
    pytest.param(("http", "handshake"), id="http-2025-11-25"),
    pytest.param(("http", "modern"), id="http-2026-07-28"),
]


@pytest.fixture(params=TRANSPORTS)
def connect(request: pytest.FixtureRequest) -> Callable[[], Any]:
    """A factory of client sessions over the parametrized transport and era."""
    kind, era = request.param
    if kind == "stdio":
        return lambda: stdio_session(era)
    daemon = request.getfixturevalue("mcp_daemon")
    return lambda: http_session(daemon.url, era)


def run(test: Callable[[], Awaitable[None]]) -> None:
    anyio.run(test)


# ---------------------------------------------------------------------------------------
# Result checks
# ---------------------------------------------------------------------------------------


def texts(result: Any) -> list[str]:
    return [c.text for c in result.content]


async def output_schemas(session: ClientSession) -> dict[str, dict[str, Any]]:
    listed = await session.list_tools()
    schemas = {t.name: t.output_schema for t in listed.tools}
    assert all(schemas.values()), "a tool without an output schema"
    return {name: schema for name, schema in schemas.items() if schema}


def check_structured(schemas: dict[str, dict[str, Any]], tool: str, result: Any) -> dict[str, Any]:
    """The structured content conforms to the tool's output schema and the last text
    block is the same JSON; returns it."""
    structured = result.structured_content
    assert structured is not None, texts(result)
    jsonschema.Draft202012Validator(schemas[tool]).validate(structured)
    assert json.loads(result.content[-1].text) == structured
    return structured


def check_failed(schemas: dict[str, dict[str, Any]], tool: str, result: Any, message: str) -> dict[str, Any]:
    """A program that did not succeed: isError, the reason first, the result still there."""
    assert result.is_error is True, texts(result)
    structured = check_structured(schemas, tool, result)
    assert re.search(message, result.content[0].text), texts(result)
    assert structured["error"] == result.content[0].text
    return structured


def check_refused(result: Any, message: str) -> None:
    assert result.is_error is True, texts(result)
    assert re.search(message, " ".join(texts(result))), texts(result)


# ---------------------------------------------------------------------------------------
# Listing
# ---------------------------------------------------------------------------------------


def test_tools_are_listed_with_schemas_and_annotations(connect: Callable[[], Any]) -> None:
    async def go() -> None:
        async with connect() as s:
            listed = await s.list_tools()
            tools = {t.name: t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools}
            assert set(tools) == TOOLS
            for name, t in tools.items():
                assert t["description"], name
                schema = t["inputSchema"]
                jsonschema.Draft202012Validator.check_schema(schema)
                assert schema["type"] == "object" and schema["additionalProperties"] is False, name
                assert set(schema.get("required", [])) == REQUIRED[name], name
                out = t["outputSchema"]
                jsonschema.Draft202012Validator.check_schema(out)
                assert out["type"] == "object", name
                a = t["annotations"]
                hints = (a["readOnlyHint"], a["destructiveHint"], a["idempotentHint"], a["openWorldHint"])
                assert hints == ANNOTATIONS[name], (name, a)
            run_code = tools["run_code"]["inputSchema"]
            assert {"language", "code", "stdin", "files", "timeout_s", "isolation", "image", "sandbox_id"} == set(
                run_code["properties"]
            )
            assert {"python", "javascript", "bash"} <= set(re.findall(r'"const": "(\w+)"', json.dumps(run_code)))
            ec = tools["run_code"]["outputSchema"]["properties"]
            for field in ["outcome", "exit_code", "signal", "stdout", "stderr", "stdout_truncated",
                          "stdout_bytes", "wall_ms", "cpu_ms", "memory_peak_bytes", "error", "execution"]:
                assert field in ec, field
            lifetime = tools["create_sandbox"]["description"]
            assert "default 600" in lifetime and "at most 86400" in lifetime, lifetime
            assert set(tools["create_sandbox"]["outputSchema"]["required"]) >= {"sandbox_id", "expires_at"}
            assert set(tools["read_file"]["outputSchema"]["required"]) == {"path", "content"}

    run(go)


# ---------------------------------------------------------------------------------------
# run_code
# ---------------------------------------------------------------------------------------


def test_run_code_runs_each_language(connect: Callable[[], Any]) -> None:
    async def go() -> None:
        async with connect() as s:
            schemas = await output_schemas(s)
            for language, code in [
                ("python", "print(6*7)"),
                ("javascript", "console.log(6*7)"),
                ("bash", "echo $((6*7))"),
            ]:
                r = await s.call_tool("run_code", {"language": language, "code": code})
                assert r.is_error is False, texts(r)
                out = check_structured(schemas, "run_code", r)
                assert out["stdout"] == "42\n", (language, out)
                assert out["outcome"] == "exited" and out["exit_code"] == 0 and out["error"] is None
                assert len(r.content) == 1

    run(go)


def test_run_code_in_a_microvm_runs_under_the_guest_kernel(connect: Callable[[], Any]) -> None:
    # A micro-VM is booted for the call (seconds under software emulation).
    with open("/proc/sys/kernel/osrelease") as f:
        host_kernel = f.read().strip()

    async def go() -> None:
        async with connect() as s:
            schemas = await output_schemas(s)
            r = await s.call_tool("run_code", {
                "language": "bash", "code": "cat /proc/sys/kernel/osrelease",
                "isolation": "microvm", "timeout_s": 60,
            })
            assert r.is_error is False, texts(r)
            out = check_structured(schemas, "run_code", r)
            assert out["stdout"].strip() and out["stdout"].strip() != host_kernel, out

    run(go)


def test_run_code_and_a_session_under_gvisor(connect: Callable[[], Any]) -> None:
    # gVisor's Sentry answers uname with its own kernel version, not the host's.
    with open("/proc/sys/kernel/osrelease") as f:
        host_kernel = f.read().strip()

    async def go() -> None:
        async with connect() as s:
            schemas = await output_schemas(s)
            r = await s.call_tool("run_code", {
                "language": "python", "code": "import os; print(os.uname().release)",
                "isolation": "gvisor",
            })
            assert r.is_error is False, texts(r)
            out = check_structured(schemas, "run_code", r)
            assert out["stdout"].strip() and out["stdout"].strip() != host_kernel, out
            assert out["id"].startswith("gv-"), out
            created = await s.call_tool("create_sandbox", {"isolation": "gvisor"})
            assert created.is_error is False, texts(created)
            sid = created.structured_content["sandbox_id"]
            w = await s.call_tool("exec", {"sandbox_id": sid, "cmd": ["sh", "-c", "echo kept > f"]})
            assert w.is_error is False, texts(w)
            r = await s.call_tool("exec", {"sandbox_id": sid, "cmd": ["cat", "f"]})
            assert check_structured(schemas, "exec", r)["stdout"] == "kept\n", texts(r)
            closed = await s.call_tool("close_sandbox", {"sandbox_id": sid})
            assert closed.is_error is False, texts(closed)

    run(go)


def test_run_code_in_a_sandbox_keeps_state_and_returns_figures_as_images(connect: Callable[[], Any]) -> None:
    """run_code with sandbox_id: Python in that session's Jupyter kernel; state persists,
    a figure comes back as MCP image content beside the structured execution (whose text
    copy leaves the image out), an exception is a tool error naming it."""

    async def go() -> None:
        async with connect() as s:
            schemas = await output_schemas(s)
            created = await s.call_tool("create_sandbox", {})
            assert created.is_error is False, texts(created)
            sid = created.structured_content["sandbox_id"]
            r = await s.call_tool("run_code", {"language": "python", "code": "x = 41\nprint('hi')", "sandbox_id": sid})
            assert r.is_error is False, texts(r)
            jsonschema.Draft202012Validator(schemas["run_code"]).validate(r.structured_content)
            ex = r.structured_content["execution"]
            assert ex["logs"]["stdout"] == ["hi\n"] and ex["kernel_start_ms"] > 0, ex
            r = await s.call_tool("run_code", {"language": "python", "code": "x + 1", "sandbox_id": sid})
            ex = r.structured_content["execution"]
            assert ex["results"][0]["data"]["text/plain"] == "42", ex
            plot = (
                "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
                "import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 1), dpi=50)\nplt.plot([1, 2])\nplt.show()"
            )
            r = await s.call_tool("run_code", {"language": "python", "code": plot, "sandbox_id": sid, "timeout_s": 60})
            assert r.is_error is False, texts(r)
            jsonschema.Draft202012Validator(schemas["run_code"]).validate(r.structured_content)
            images = [c for c in r.content if c.type == "image"]
            assert len(images) == 1 and images[0].mime_type == "image/png", r.content
            png = base64.b64decode(images[0].data)
            assert png[:8] == b"\x89PNG\r\n\x1a\n"
            assert struct.unpack(">II", png[16:24]) == (100, 50)
            text = [c.text for c in r.content if c.type == "text"][-1]
            assert "sent as image content" in text and images[0].data not in text
            r = await s.call_tool("run_code", {"language": "python", "code": "1 / 0", "sandbox_id": sid})
            assert r.is_error is True, texts(r)
            assert r.content[0].text == "ZeroDivisionError: division by zero", texts(r)
            assert r.structured_content["execution"]["error"]["name"] == "ZeroDivisionError"
            # Only python there, and nothing the sandbox's own settings decide.
            r = await s.call_tool("run_code", {"language": "bash", "code": "echo", "sandbox_id": sid})
            check_refused(r, r"^language: ")
            r = await s.call_tool("run_code", {"language": "python", "code": "1", "sandbox_id": sid, "stdin": "x"})
            check_refused(r, r"^stdin: ")
            closed = await s.call_tool("close_sandbox", {"sandbox_id": sid})
            assert closed.is_error is False, texts(closed)
            r = await s.call_tool("run_code", {"language": "python", "code": "1", "sandbox_id": sid})
            check_refused(r, r"create_sandbox")

    run(go)


def test_run_code_with_files_and_stdin_and_no_network(connect: Callable[[], Any]) -> None:
    async def go() -> None:
        async with connect() as s:
            schemas = await output_schemas(s)
            code = (
                "import sys, socket\n"
                "print(open('data/in.txt').read().strip(), sys.stdin.read().strip())\n"
                "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); print('online')\n"
                "except OSError: print('offline')\n"
            )
            r = await s.call_tool(
                "run_code",
                {"language": "python", "code": code, "stdin": "from stdin",
                 "files": [{"path": "data/in.txt", "content": "from a file\n"}], "timeout_s": 20},
            )
            out = check_structured(schemas, "run_code", r)
            assert r.is_error is False, texts(r)
            assert out["stdout"] == "from a file from stdin\noffline\n", out

    run(go)


def test_failing_program_is_a_tool_error(connect: Callable[[], Any]) -> None:
    async def go() -> None:
        async with connect() as s:
            schemas = await output_schemas(s)
            r = await s.call_tool("run_code", {"language": "python", "code": "print(undefined_name)"})
            out = check_failed(schemas, "run_code", r, r"^exited with code 1: NameError: name 'undefined_name'")
            assert out["exit_code"] == 1 and "Traceback" in out["stderr"]
            r = await s.call_tool("run_code", {"language": "bash", "code": "exit 3"})
            check_failed(schemas, "run_code", r, r"^exited with code 3$")

    run(go)


def test_timeout_is_a_tool_error(connect: Callable[[], Any]) -> None:
    async def go() -> None:
        async with connect() as s:
            schemas = await output_schemas(s)
            r = await s.call_tool(
                "run_code", {"language": "python", "code": "import time; time.sleep(30)", "timeout_s": 1}
            )
            out = check_failed(schemas, "run_code", r, r"^timed out after 1 s\b")
            assert out["outcome"] == "timeout" and out["timed_out"] is True

    run(go)


def test_oom_is_a_tool_error(connect: Callable[[], Any]) -> None:
    async def go() -> None:
        async with connect() as s:
            schemas = await output_schemas(s)
            # 1 GiB written (not just reserved) against the default 256 MiB cap.
            r = await s.call_tool("run_code", {"language": "python", "code": "x = b'x' * (1 << 30)\nprint(len(x))"})
            out = check_failed(schemas, "run_code", r, r"^killed: exceeded 256 MiB memory limit$")
            assert out["outcome"] == "oom" and out["oom_killed"] is True

    run(go)


def test_limits_above_the_maximum_are_tool_errors(connect: Callable[[], Any]) -> None:
    async def go() -> None:
        async with connect() as s:
            r = await s.call_tool("run_code", {"language": "bash", "code": "true", "timeout_s": 10**6})
            check_refused(r, r"^timeout_s: .*600")
            r = await s.call_tool("create_sandbox", {"ttl_s": 10**7})
            check_refused(r, r"^ttl_s: must be between 1 and 86400")

    run(go)


# ---------------------------------------------------------------------------------------
# Malformed calls: JSON-RPC errors, not tool results
# ---------------------------------------------------------------------------------------


def test_malformed_calls_are_json_rpc_errors(connect: Callable[[], Any]) -> None:
    async def go() -> None:
        async with connect() as s:
            await s.list_tools()
            for name, args in [
                ("no_such_tool", {}),
                ("run_code", {"language": "ruby", "code": "puts 1"}),
                ("run_code", {"language": "python"}),
                ("run_code", {"language": "python", "code": "1", "bogus": True}),
                ("run_code", {"language": "python", "code": "1", "timeout_s": -1}),
                ("run_code", {"language": "python", "code": "1", "timeout_s": 0}),
                ("create_sandbox", {"ttl_s": 0}),
                ("exec", {"cmd": ["true"]}),
                ("write_file", {"sandbox_id": "x", "path": "a", "content": 7}),
            ]:
                with pytest.raises(MCPError) as e:
                    await s.call_tool(name, args)
                assert e.value.code == INVALID_PARAMS, (name, args, e.value)

    run(go)


# ---------------------------------------------------------------------------------------
# Sessions
# ---------------------------------------------------------------------------------------


def test_session_flow(connect: Callable[[], Any]) -> None:
    async def go() -> None:
        async with connect() as s:
            schemas = await output_schemas(s)
            r = await s.call_tool("create_sandbox", {"ttl_s": 120})
            assert r.is_error is False, texts(r)
            created = check_structured(schemas, "create_sandbox", r)
            sid = created["sandbox_id"]
            assert created["expires_at"] > time.time() + 100

            r = await s.call_tool("write_file", {"sandbox_id": sid, "path": "notes/in.txt", "content": "héllo\n"})
            assert r.is_error is False, texts(r)
            check_structured(schemas, "write_file", r)

            r = await s.call_tool("exec", {"sandbox_id": sid, "cmd": ["cat", "notes/in.txt"]})
            assert r.is_error is False, texts(r)
            assert check_structured(schemas, "exec", r)["stdout"] == "héllo\n"

            code = "s = open('notes/in.txt').read(); open('out.txt', 'w').write(s.upper()); print(len(s))"
            r = await s.call_tool("exec", {"sandbox_id": sid, "language": "python", "code": code})
            assert check_structured(schemas, "exec", r)["stdout"] == "6\n", texts(r)

            r = await s.call_tool("exec", {"sandbox_id": sid, "cmd": ["sh", "-c", "exit 4"]})
            check_failed(schemas, "exec", r, r"^exited with code 4$")

            r = await s.call_tool("read_file", {"sandbox_id": sid, "path": "out.txt"})
            assert r.is_error is False, texts(r)
            assert check_structured(schemas, "read_file", r) == {"path": "out.txt", "content": "HÉLLO\n"}

            r = await s.call_tool("read_file", {"sandbox_id": sid, "path": "missing.txt"})
            check_refused(r, r"No such file")

            r = await s.call_tool("close_sandbox", {"sandbox_id": sid})
            assert r.is_error is False, texts(r)
            assert check_structured(schemas, "close_sandbox", r)["closed"] is True

            r = await s.call_tool("exec", {"sandbox_id": sid, "cmd": ["true"]})
            check_refused(r, rf"no sandbox {sid}.*create_sandbox")
            r = await s.call_tool("read_file", {"sandbox_id": sid, "path": "out.txt"})
            check_refused(r, rf"no sandbox {sid}")

    run(go)


def test_snapshot_restore_fork_and_from_snapshot(connect: Callable[[], Any]) -> None:
    async def go() -> None:
        async with connect() as s:
            schemas = await output_schemas(s)
            sid = check_structured(schemas, "create_sandbox", await s.call_tool("create_sandbox", {"ttl_s": 120}))["sandbox_id"]
            made: list[str] = [sid]
            try:
                r = await s.call_tool("exec", {"sandbox_id": sid, "cmd": ["sh", "-c", "echo v1 > state.txt"]})
                changed = check_structured(schemas, "exec", r)["files_changed"]
                assert changed == [{"path": "/workspace/state.txt", "change": "created", "kind": "file", "bytes": 3}]

                r = await s.call_tool("snapshot_sandbox", {"sandbox_id": sid})
                assert r.is_error is False, texts(r)
                snap = check_structured(schemas, "snapshot_sandbox", r)
                assert re.fullmatch(r"snap-[0-9a-f]{16}", snap["snapshot_id"]) and snap["kind"] == "filesystem"

                await s.call_tool("write_file", {"sandbox_id": sid, "path": "state.txt", "content": "v2\n"})
                await s.call_tool("write_file", {"sandbox_id": sid, "path": "later.txt", "content": "x"})
                r = await s.call_tool("restore_sandbox", {"sandbox_id": sid, "snapshot_id": snap["snapshot_id"]})
                assert r.is_error is False, texts(r)
                assert check_structured(schemas, "restore_sandbox", r) == {"sandbox_id": sid, "snapshot_id": snap["snapshot_id"]}
                r = await s.call_tool("exec", {"sandbox_id": sid, "cmd": ["sh", "-c", "cat state.txt; ls"]})
                assert check_structured(schemas, "exec", r)["stdout"] == "v1\nstate.txt\n"

                r = await s.call_tool("fork_sandbox", {"sandbox_id": sid, "count": 2})
                assert r.is_error is False, texts(r)
                forks = [f["sandbox_id"] for f in check_structured(schemas, "fork_sandbox", r)["sandboxes"]]
                made += forks
                assert len(set(forks + [sid])) == 3
                await s.call_tool("write_file", {"sandbox_id": forks[0], "path": "state.txt", "content": "fork\n"})
                for f, want in [(forks[0], "fork\n"), (forks[1], "v1\n"), (sid, "v1\n")]:
                    r = await s.call_tool("read_file", {"sandbox_id": f, "path": "state.txt"})
                    assert check_structured(schemas, "read_file", r)["content"] == want

                r = await s.call_tool("create_sandbox", {"from_snapshot": snap["snapshot_id"]})
                assert r.is_error is False, texts(r)
                child = check_structured(schemas, "create_sandbox", r)["sandbox_id"]
                made.append(child)
                r = await s.call_tool("read_file", {"sandbox_id": child, "path": "state.txt"})
                assert check_structured(schemas, "read_file", r)["content"] == "v1\n"

                r = await s.call_tool("restore_sandbox", {"sandbox_id": sid, "snapshot_id": "snap-0123456789abcdef"})
                check_refused(r, r"no snapshot snap-0123456789abcdef")
            finally:
                for m in made:
                    await s.call_tool("close_sandbox", {"sandbox_id": m})

    run(go)


def test_unknown_sandbox_is_a_tool_error(connect: Callable[[], Any]) -> None:
    async def go() -> None:
        async with connect() as s:
            calls: list[tuple[str, dict[str, Any]]] = [
                ("exec", {"cmd": ["true"]}),
                ("exec", {"language": "python", "code": "1"}),
                ("write_file", {"path": "a", "content": "b"}),
                ("read_file", {"path": "a"}),
                ("close_sandbox", {}),
            ]
            for name, args in calls:
                r = await s.call_tool(name, {"sandbox_id": "0123456789abcdef", **args})
                check_refused(r, r"no sandbox 0123456789abcdef: create a new sandbox with create_sandbox")
                assert r.structured_content is None

    run(go)


def test_expired_sandbox_is_a_tool_error(mcp_daemon: Daemon) -> None:
    async def go() -> None:
        async with http_session(mcp_daemon.url, "handshake") as s:
            r = await s.call_tool("create_sandbox", {"ttl_s": 1})
            sid = r.structured_content["sandbox_id"]
            await anyio.sleep(2)
            r = await s.call_tool("exec", {"sandbox_id": sid, "cmd": ["true"]})
            check_refused(r, rf"sandbox {sid} expired.*create_sandbox")

    run(go)


# ---------------------------------------------------------------------------------------
# HTTP: API keys, Host and Origin
# ---------------------------------------------------------------------------------------


INITIALIZE = json.dumps({
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "raw", "version": "0"}},
}).encode()


def post_mcp(url: str, headers: dict[str, str]) -> int:
    """POSTs an initialize to /mcp with `headers`; the HTTP status."""
    req = urllib.request.Request(url + "/mcp", data=INITIALIZE, method="POST", headers={
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **headers,
    })
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_loopback_host_and_origin_checks(mcp_daemon: Daemon) -> None:
    url, port = mcp_daemon.url, mcp_daemon.port
    assert post_mcp(url, {}) == 200
    for origin in ["http://localhost:6274", "http://127.0.0.1", "https://[::1]:3000"]:
        assert post_mcp(url, {"Origin": origin}) == 200, origin
    for host in [f"localhost:{port}", f"[::1]:{port}"]:
        assert post_mcp(url, {"Host": host}) == 200, host
    for origin in ["http://evil.example", "null", "http://localhost.evil.example:6274", "file://localhost"]:
        assert post_mcp(url, {"Origin": origin}) == 403, origin
    for host in [f"evil.example:{port}", f"127.0.0.1:{port + 1}", "localhost", f"127.0.0.1.nip.io:{port}"]:
        assert post_mcp(url, {"Host": host}) == 403, host
    # The REST API is not behind these checks.
    req = urllib.request.Request(url + "/healthz", headers={"Origin": "http://evil.example"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def test_api_keys_are_required_and_sandboxes_are_per_key(keyed_daemon: Daemon) -> None:
    url = keyed_daemon.url
    assert post_mcp(url, {}) == 401
    assert post_mcp(url, {"Authorization": "Bearer wrong-key-0123456789abcdef"}) == 401
    assert post_mcp(url, {"Authorization": f"Bearer {KEYS['alice']}"}) == 200

    async def go() -> None:
        async with http_session(url, "modern", KEYS["alice"]) as alice, \
                http_session(url, "handshake", KEYS["bob"]) as bob:
            r = await alice.call_tool("run_code", {"language": "python", "code": "print('hi')"})
            assert r.is_error is False and r.structured_content["stdout"] == "hi\n", texts(r)
            r = await alice.call_tool("create_sandbox", {})
            sid = r.structured_content["sandbox_id"]
            r = await alice.call_tool("exec", {"sandbox_id": sid, "cmd": ["true"]})
            assert r.is_error is False, texts(r)
            # Bob cannot see or close alice's sandbox.
            r = await bob.call_tool("exec", {"sandbox_id": sid, "cmd": ["true"]})
            check_refused(r, rf"no sandbox {sid}")
            r = await bob.call_tool("close_sandbox", {"sandbox_id": sid})
            check_refused(r, rf"no sandbox {sid}")
            r = await alice.call_tool("close_sandbox", {"sandbox_id": sid})
            assert r.is_error is False, texts(r)

    run(go)
    # The REST API sees MCP's sandboxes as the key's own.
    req = urllib.request.Request(url + "/v1/sandboxes", headers={"Authorization": f"Bearer {KEYS['alice']}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert json.load(resp) == []


def test_sigterm_lets_a_running_call_answer_and_then_stops(tmp_path: Path) -> None:
    """SIGTERM with a tool call running and the session's event stream open: the call
    finishes within the grace period and its answer arrives, then the daemon exits 0
    without waiting out the grace period for the open stream."""
    daemon = start_daemon(tmp_path, "--grace", "20s")

    answered: list[float] = []

    async def go() -> None:
        async with http_session(daemon.url, "handshake") as s:
            # Listed first: the client validates the answer against the output schema, and
            # would otherwise ask for the list after the daemon stopped taking requests.
            await s.list_tools()

            async def stop_soon() -> None:
                await anyio.sleep(0.5)
                daemon.proc.send_signal(signal.SIGTERM)

            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_soon)
                r = await s.call_tool("run_code", {"language": "bash", "code": "sleep 2; echo done"})
            assert r.is_error is False, texts(r)
            assert r.structured_content["stdout"] == "done\n"
            answered.append(time.monotonic())

    try:
        anyio.run(go)
    except BaseExceptionGroup as e:
        # Leaving the session after the daemon is gone: the client's reconnect of its
        # event stream, or its DELETE of the session, finds nobody listening.
        if not answered or not e.subgroup(lambda x: "connect" in type(x).__name__.lower()):
            raise
    assert answered, "no answer"
    rc = daemon.proc.wait(30)
    assert rc == 0, daemon.log.read_text(errors="replace")
    assert time.monotonic() - answered[0] < 10, "the open MCP session held the shutdown"


# ---------------------------------------------------------------------------------------
# `airlock mcp`: lifecycle
# ---------------------------------------------------------------------------------------


class RawStdio:
    """`airlock mcp` as a child, spoken to line by line (to watch its exit)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [airlock_bin(), "mcp", "--pool", "1", "--snapshot-dir", snapshot_dir()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        self.owner = f"{self.proc.pid}-{stat.rsplit(')', 1)[1].split()[19]}"
        self.next_id = 0

    def send(self, method: str, params: dict[str, Any] | None = None, notify: bool = False) -> Any:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        if not notify:
            self.next_id += 1
            msg["id"] = self.next_id
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        if notify:
            return None
        with _deadline(60):
            reply = json.loads(self.proc.stdout.readline())
        assert reply["id"] == self.next_id, reply
        return reply

    def cgroups(self) -> list[str]:
        return glob.glob(f"/sys/fs/cgroup/*/airlock/{self.owner}") + glob.glob(
            f"/sys/fs/cgroup/*/airlock/{self.owner}/*/"
        )

    def start_with_a_sandbox(self, version: str) -> str:
        reply = self.send("initialize", {"protocolVersion": version, "capabilities": {},
                                         "clientInfo": {"name": "raw", "version": "0"}})
        # An older revision is negotiated as asked.
        assert reply["result"]["protocolVersion"] == version, reply
        assert reply["result"]["serverInfo"]["name"] == "airlock"
        self.send("notifications/initialized", notify=True)
        reply = self.send("tools/call", {"name": "create_sandbox", "arguments": {}})
        sid = reply["result"]["structuredContent"]["sandbox_id"]
        assert any(d.rstrip("/").endswith("/" + sid) for d in self.cgroups()), self.cgroups()
        return sid

    def wait(self) -> tuple[int, str]:
        rc = self.proc.wait(30)
        assert self.proc.stderr is not None
        return rc, self.proc.stderr.read()


def test_stdio_exits_cleanly_when_stdin_closes() -> None:
    child = RawStdio()
    child.start_with_a_sandbox("2025-03-26")
    assert child.proc.stdin is not None
    child.proc.stdin.close()
    rc, log = child.wait()
    assert rc == 0, log
    assert "every sandbox purged" in log
    assert child.cgroups() == [], child.cgroups()
    assert child.proc.stdout is not None and child.proc.stdout.read() == ""


def test_stdio_exits_cleanly_when_stdin_closes_before_any_message() -> None:
    done = subprocess.run([airlock_bin(), "mcp", "--snapshot-dir", snapshot_dir()], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "every sandbox purged" in done.stderr


def test_stdio_exits_cleanly_on_sigterm() -> None:
    child = RawStdio()
    child.start_with_a_sandbox("2024-11-05")
    child.proc.send_signal(signal.SIGTERM)
    rc, log = child.wait()
    assert rc == 0, log
    assert "every sandbox purged" in log
    assert child.cgroups() == [], child.cgroups()


def test_stdio_stdout_carries_only_json_rpc() -> None:
    child = RawStdio()
    child.start_with_a_sandbox("2025-06-18")
    reply = child.send("tools/call", {"name": "run_code",
                                      "arguments": {"language": "bash", "code": "echo out; echo err >&2"}})
    assert reply["result"]["structuredContent"]["stdout"] == "out\n"
    assert child.proc.stdin is not None
    child.proc.stdin.close()
    rc, log = child.wait()
    assert rc == 0, log
    # Whatever was left on stdout is JSON-RPC too (nothing here: every reply was read).
    assert child.proc.stdout is not None
    for line in child.proc.stdout.read().splitlines():
        assert json.loads(line)["jsonrpc"] == "2.0"
    assert "serving MCP on stdio" in log


# ---------------------------------------------------------------------------------------
# MCP Inspector CLI
# ---------------------------------------------------------------------------------------


def inspector(*args: str, status: int = 0) -> dict[str, Any]:
    """Runs the Inspector CLI, expecting exit `status` (it exits 5 when a tool result has
    isError), and parses the JSON it prints."""
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("npx not found: install Node.js (20 or later) to run the MCP Inspector CLI test")
    argv = [npx, "-y", INSPECTOR, "--cli", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == status, f"{argv}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    start = done.stdout.index("{")
    value, _ = json.JSONDecoder().raw_decode(done.stdout[start:])
    return value


def test_inspector_cli_over_stdio() -> None:
    listed = inspector(airlock_bin(), "mcp", "--pool", "1", "--snapshot-dir", snapshot_dir(), "--method", "tools/list")
    assert {t["name"] for t in listed["tools"]} == TOOLS
    run_code = next(t for t in listed["tools"] if t["name"] == "run_code")
    assert run_code["annotations"]["readOnlyHint"] is False  # with sandbox_id it changes a kernel's state
    result = inspector(
        airlock_bin(), "mcp", "--pool", "1", "--snapshot-dir", snapshot_dir(),
        "--method", "tools/call", "--tool-name", "run_code",
        "--tool-arg", "language=python", "--tool-arg", "code=print(6*7)",
    )
    assert result["isError"] is False, result
    assert result["structuredContent"]["stdout"] == "42\n"
    jsonschema.Draft202012Validator(run_code["outputSchema"]).validate(result["structuredContent"])
    assert json.loads(result["content"][-1]["text"]) == result["structuredContent"]


def test_inspector_cli_over_http(mcp_daemon: Daemon) -> None:
    url = mcp_daemon.url + "/mcp"
    listed = inspector(url, "--transport", "http", "--method", "tools/list")
    assert {t["name"] for t in listed["tools"]} == TOOLS
    result = inspector(
        url, "--transport", "http",
        "--method", "tools/call", "--tool-name", "run_code",
        "--tool-arg", "language=bash", "--tool-arg", "code=echo hi; exit 2",
        status=5,
    )
    assert result["isError"] is True, result
    assert result["content"][0]["text"] == "exited with code 2"
    assert result["structuredContent"]["stdout"] == "hi\n"


# ---------------------------------------------------------------------------------------
# Approvals: a sandbox created with on_denied "ask" puts each connection its policy denies
# to the user through the client's elicitation request.
# ---------------------------------------------------------------------------------------


def local_web_server() -> tuple[Any, int]:
    """A web server on the host's loopback (the only place these tests send traffic)."""
    import http.server
    import threading

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            body = b"hello from the host\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def test_a_denied_connection_is_put_to_the_user_by_elicitation() -> None:
    server, port = local_web_server()
    answers = ["allow_once", "deny"]
    asked: list[str] = []

    async def on_elicit(context: Any, params: Any) -> Any:
        asked.append(params.message)
        return mcp_types.ElicitResult(action="accept", content={"decision": answers[len(asked) - 1]})

    # `localhost` is not in the allowlist: each connection to it is held and asked about;
    # once allowed, the proxy resolves it on the host to 127.0.0.1, which allow_cidrs lets
    # through (the host's loopback: the test server).
    # (NO_PROXY names localhost: dropped, so the request goes through the proxy.)
    code = (
        "import os, urllib.request, urllib.error\n"
        "os.environ.pop('NO_PROXY', None); os.environ.pop('no_proxy', None)\n"
        "try:\n"
        f"    print(urllib.request.urlopen('http://localhost:{port}/x', timeout=60).read().decode(), end='')\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code, e.read().decode(), end='')\n"
    )

    async def main() -> None:
        params = StdioServerParameters(command=airlock_bin(), args=["mcp", "--pool", "1", "--snapshot-dir", snapshot_dir()])
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write, elicitation_callback=on_elicit) as s:
                await s.initialize()
                schemas = await output_schemas(s)
                r = await s.call_tool(
                    "create_sandbox",
                    {"network": {"mode": "proxy", "allow_cidrs": ["127.0.0.1/32"], "on_denied": "ask"}},
                )
                sid = check_structured(schemas, "create_sandbox", r)["sandbox_id"]
                first = await s.call_tool("exec", {"sandbox_id": sid, "language": "python", "code": code})
                out = check_structured(schemas, "exec", first)
                assert out["stdout"] == "hello from the host\n", out
                assert any(e["reason"] == "allowed once by approval" for e in out["egress"]), out["egress"]
                second = await s.call_tool("exec", {"sandbox_id": sid, "language": "python", "code": code})
                out = check_structured(schemas, "exec", second)
                assert out["stdout"].startswith("403 "), out
                assert "denied by approval" in out["stdout"], out
                # A change of policy for the next connections, over MCP: no question asked.
                r = await s.call_tool("update_network", {"sandbox_id": sid, "allow": [f"localhost:{port}"]})
                assert check_structured(schemas, "update_network", r)["allow"] == [f"localhost:{port}"]
                third = await s.call_tool("exec", {"sandbox_id": sid, "language": "python", "code": code})
                out = check_structured(schemas, "exec", third)
                assert out["stdout"] == "hello from the host\n", out
                assert out["egress"][0]["kind"] == "policy", out["egress"]
                await s.call_tool("close_sandbox", {"sandbox_id": sid})

    try:
        run(main)
    finally:
        server.shutdown()
    assert len(asked) == 2, asked
    assert f"localhost:{port}" in asked[0], asked


def test_create_sandbox_names_a_secret_the_service_holds() -> None:
    """`airlock mcp --secret NAME@HOST`: the model names the secret, never sees its value."""
    import http.server
    import threading

    value = "sk-mcp-test-5e1f2a9b7c3d"
    seen: list[str] = []

    class Api(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            seen.append(self.headers.get("Authorization", ""))
            body = b"authorized\n" if self.headers.get("Authorization") == f"Bearer {value}" else b"refused\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    code = (
        "import os, urllib.request\n"
        "os.environ.pop('NO_PROXY', None); os.environ.pop('no_proxy', None)\n"
        "token = os.environ['API_TOKEN']\n"
        f"req = urllib.request.Request('http://localhost:{port}/', headers={{'Authorization': 'Bearer ' + token}})\n"
        "print(token[:11], urllib.request.urlopen(req, timeout=30).read().decode(), end='')\n"
    )

    async def main() -> None:
        env = dict(os.environ, API_TOKEN=value)
        params = StdioServerParameters(
            command=airlock_bin(), args=["mcp", "--pool", "1", "--snapshot-dir", snapshot_dir(), "--secret", f"API_TOKEN@localhost:{port}"],
            env=env,
        )
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                schemas = await output_schemas(s)
                network = {
                    "mode": "proxy",
                    "allow": [f"localhost:{port}"],
                    "allow_cidrs": ["127.0.0.1/32"],
                    "secrets": ["API_TOKEN"],
                }
                r = await s.call_tool("create_sandbox", {"network": network})
                sid = check_structured(schemas, "create_sandbox", r)["sandbox_id"]
                r = await s.call_tool("exec", {"sandbox_id": sid, "language": "python", "code": code})
                out = check_structured(schemas, "exec", r)
                assert out["stdout"] == "airlock-ph- authorized\n", out
                assert value not in json.dumps(out)
                # A secret the service does not hold is refused, naming the field.
                r = await s.call_tool("create_sandbox", {"network": {**network, "secrets": ["NOPE"]}})
                check_refused(r, r"network\.secrets\[0\].*no secret \"NOPE\".*API_TOKEN")

    try:
        run(main)
    finally:
        server.shutdown()
    assert seen == [f"Bearer {value}"], seen
