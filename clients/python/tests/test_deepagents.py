"""The Deep Agents backend against a real daemon and the real ``deepagents`` package:
first the backend protocol methods Deep Agents' tools call, then a real agent loop
(``create_deep_agent``) driven by a scripted fake chat model, with no LLM and no network."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from deepagents import create_deep_agent
from deepagents.backends.protocol import (
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
    SandboxBackendProtocol,
)
from deepagents.backends.sandbox import BaseSandbox
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage

from airlock import Airlock, Limits, SandboxNotFound
from airlock.adapters.deepagents import AirlockBackend


@pytest.fixture
def backend(al: Airlock) -> Iterator[AirlockBackend]:
    with AirlockBackend.create(al, ttl_s=300, default_timeout=30) as b:
        yield b


class ScriptedModel(GenericFakeChatModel):
    """A chat model that answers from a script and accepts any tools."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:  # type: ignore[override]
        return self


def call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


def test_is_a_deepagents_sandbox(backend: AirlockBackend) -> None:
    assert isinstance(backend, BaseSandbox)
    assert isinstance(backend, SandboxBackendProtocol)
    assert backend.id == backend.sandbox.id


def test_execute(backend: AirlockBackend) -> None:
    r = backend.execute("echo out; echo err >&2; pwd; exit 3")
    assert isinstance(r, ExecuteResponse)
    assert r.exit_code == 3 and r.output == "out\n/workspace\nerr\n"
    r = backend.execute("sleep 10", timeout=1)
    assert r.exit_code == 124 and "timed out" in r.output
    r = backend.execute("python3 -c 'x = bytearray(10**9)'")
    assert r.exit_code == 137 or "MemoryError" in r.output
    assert backend.execute("").exit_code == 1


def test_upload_and_download(backend: AirlockBackend) -> None:
    ups = backend.upload_files(
        [
            ("/workspace/data/in.bin", b"\x00\x01\xff"),
            ("/tmp/scratch/t.txt", b"tmp text"),
            ("/etc/not-writable", b"x"),
            ("/workspace/../etc/x", b"x"),
        ]
    )
    assert all(isinstance(u, FileUploadResponse) for u in ups)
    assert [u.error for u in ups] == [None, None, "permission_denied", "invalid_path"]
    downs = backend.download_files(
        ["/workspace/data/in.bin", "/tmp/scratch/t.txt", "/workspace/missing", "/tmp/missing", "/workspace/data", "/tmp"]
    )
    assert all(isinstance(d, FileDownloadResponse) for d in downs)
    assert downs[0].content == b"\x00\x01\xff" and downs[0].error is None
    assert downs[1].content == b"tmp text"
    assert [d.error for d in downs[2:]] == ["file_not_found", "file_not_found", "is_directory", "is_directory"]
    # the sandbox's own view agrees
    assert backend.sandbox.files.read("data/in.bin") == b"\x00\x01\xff"


def test_file_protocol_methods(backend: AirlockBackend) -> None:
    assert backend.write("/workspace/src/app.py", "def add(a, b):\n    return a - b\n").error is None
    ls = backend.ls("/workspace/src")
    assert ls.error is None and [e["path"] for e in ls.entries] == ["/workspace/src/app.py"]
    read = backend.read("/workspace/src/app.py")
    assert read.error is None and "return a - b" in read.file_data["content"]
    edit = backend.edit("/workspace/src/app.py", "a - b", "a + b")
    assert edit.error is None and edit.occurrences == 1
    assert backend.edit("/workspace/src/app.py", "not there", "x").error
    grep = backend.grep("return a + b", "/workspace")
    assert grep.error is None and [(m["path"], m["line"]) for m in grep.matches] == [("/workspace/src/app.py", 2)]
    glob = backend.glob("*.py", "/workspace")
    assert [m["path"] for m in glob.matches] == ["/workspace/src/app.py"]
    r = backend.execute("cd src && python3 -c 'from app import add; print(add(2, 3))'")
    assert r.output.strip() == "5" and r.exit_code == 0
    # an edit larger than the inline limit goes through upload_files into /tmp
    big = "x" * 50_000 + "\nOLD\n" + "y" * 50_000
    assert backend.write("/workspace/big.txt", big).error is None
    assert backend.edit("/workspace/big.txt", "OLD\n" + "y" * 40_000, "NEW\n").error is None
    assert backend.sandbox.files.read_text("big.txt").count("NEW") == 1
    assert backend.delete("/workspace/big.txt").error is None
    assert backend.delete("/workspace/big.txt").error
    assert backend.write("/etc/x", "nope").error


def test_agent_loop_with_scripted_model(backend: AirlockBackend) -> None:
    """``create_deep_agent`` with the airlock backend: the framework's own tools write,
    run, read, fix, grep and list, all inside the sandbox."""
    buggy = "def mean(xs):\n    return sum(xs) / len(x)\n\nprint(mean([1, 2, 3]))\n"
    script = [
        call("write_file", {"file_path": "/workspace/stats.py", "content": buggy}, "w1"),
        call("execute", {"command": "python3 /workspace/stats.py"}, "x1"),
        call("read_file", {"file_path": "/workspace/stats.py"}, "r1"),
        call("edit_file", {"file_path": "/workspace/stats.py", "old_string": "len(x)", "new_string": "len(xs)"}, "e1"),
        call("execute", {"command": "python3 /workspace/stats.py"}, "x2"),
        call("grep", {"pattern": "len(xs)", "path": "/workspace", "output_mode": "content"}, "g1"),
        call("ls", {"path": "/workspace"}, "l1"),
        call("glob", {"pattern": "*.py", "path": "/workspace"}, "gl1"),
        AIMessage(content="mean is 2.0"),
    ]
    agent = create_deep_agent(model=ScriptedModel(messages=iter(script)), backend=backend)
    out = agent.invoke({"messages": [{"role": "user", "content": "compute the mean of 1, 2, 3"}]})
    tool = {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert set(tool) == {"w1", "x1", "r1", "e1", "x2", "g1", "l1", "gl1"}
    assert "NameError" in tool["x1"].content and "exit code 1" in tool["x1"].content
    assert "len(x)" in tool["r1"].content
    assert "2.0" in tool["x2"].content and "exit code 0" in tool["x2"].content
    assert "len(xs)" in tool["g1"].content
    assert "/workspace/stats.py" in tool["l1"].content and "/workspace/stats.py" in tool["gl1"].content
    assert out["messages"][-1].content == "mean is 2.0"
    # the work happened in the sandbox
    assert backend.sandbox.files.read_text("stats.py") == buggy.replace("len(x)", "len(xs)")
    assert backend.sandbox.exec(["python3", "stats.py"]).stdout == "2.0\n"


@pytest.mark.anyio
async def test_async_agent_loop(backend: AirlockBackend) -> None:
    """The async path (``ainvoke``: ``aexecute``/``aupload_files`` run the sync backend in
    worker threads)."""
    script = [
        call("write_file", {"file_path": "/workspace/hello.sh", "content": "echo hello from airlock\n"}, "w"),
        call("execute", {"command": "bash /workspace/hello.sh"}, "x"),
        AIMessage(content="ok"),
    ]
    agent = create_deep_agent(model=ScriptedModel(messages=iter(script)), backend=backend)
    out = await agent.ainvoke({"messages": [{"role": "user", "content": "say hello"}]})
    tool = {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert "hello from airlock" in tool["x"].content


def test_backend_owns_its_sandbox(al: Airlock) -> None:
    b = AirlockBackend.create(al, ttl_s=60, limits=Limits(memory_bytes=128 * 1024 * 1024))
    sid = b.id
    b.close()
    with pytest.raises(SandboxNotFound):
        al.get_sandbox(sid)
    # a backend on a sandbox it did not create leaves it alone
    with al.sandbox() as sb:
        AirlockBackend(sb).close()
        assert al.get_sandbox(sb.id).id == sb.id
