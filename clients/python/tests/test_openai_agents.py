"""The OpenAI Agents SDK adapters against a real daemon and the real ``openai-agents``
package, with no LLM and no network: the shell executor called with the SDK's own request
types, then a real ``Runner.run`` whose model is a scripted fake; and the MCP server entry
on ``airlock mcp``."""

from __future__ import annotations

import json
import subprocess
from typing import Any, AsyncIterator

import pytest
from agents import Agent, RunConfig, RunContextWrapper, Runner, ShellTool
from agents.items import ModelResponse, ToolCallOutputItem
from agents.mcp import MCPServerStdio
from agents.models.interface import Model
from agents.tool import (
    ShellActionRequest,
    ShellCallData,
    ShellCommandOutput,
    ShellCommandRequest,
    ShellResult,
)
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionShellToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from airlock import AsyncAirlock, SandboxNotFound
from airlock.adapters.openai_agents import (
    AirlockShellExecutor,
    airlock_mcp_server,
    airlock_shell_tool,
)

from conftest import Daemon, airlock_bin, snapshot_dir

pytestmark = pytest.mark.anyio


def request(*commands: str, timeout_ms: int | None = None, max_output_length: int | None = None) -> ShellCommandRequest:
    return ShellCommandRequest(
        ctx_wrapper=RunContextWrapper(context=None),
        data=ShellCallData(
            call_id="call_test",
            action=ShellActionRequest(
                commands=list(commands), timeout_ms=timeout_ms, max_output_length=max_output_length
            ),
        ),
    )


async def test_executor_runs_commands_in_one_sandbox(url: str) -> None:
    async with AsyncAirlock(url) as al:
        async with AirlockShellExecutor(al, default_timeout_ms=10_000) as executor:
            result = await executor(request("echo hi > note.txt", "cat note.txt; pwd", "echo oops >&2; exit 5"))
            assert isinstance(result, ShellResult)
            outs = result.output
            assert all(isinstance(o, ShellCommandOutput) for o in outs)
            assert [o.exit_code for o in outs] == [0, 0, 5]
            assert outs[1].stdout == "hi\n/workspace\n" and outs[1].status == "completed"
            assert outs[2].stderr == "oops\n" and outs[2].command == "echo oops >&2; exit 5"
            sandbox = executor.sandbox
            assert sandbox is not None
            assert outs[0].provider_data["airlock"]["sandbox_id"] == sandbox.id

            # a second call sees the first one's files
            again = await executor(request("cat note.txt", max_output_length=100))
            assert again.output[0].stdout == "hi\n" and again.max_output_length == 100

            timed = await executor(request("sleep 10", timeout_ms=300))
            assert timed.output[0].status == "timeout" and timed.output[0].exit_code is None

            oom = await executor(request("python3 -c 'x = bytearray(2 * 1024**3)'"))
            assert oom.output[0].exit_code in (1, 137)
        # closing the executor deleted the sandbox it created
        with pytest.raises(SandboxNotFound):
            await al.get_sandbox(sandbox.id)


async def test_shell_tool_helper(url: str) -> None:
    async with AsyncAirlock(url) as al:
        tool = airlock_shell_tool(al)
        assert isinstance(tool, ShellTool) and tool.name == "shell"
        assert isinstance(tool.executor, AirlockShellExecutor)
        out = await tool.executor(request("echo $((6*7))"))  # type: ignore[misc]
        assert out.output[0].stdout == "42\n"
        await tool.executor.aclose()  # type: ignore[union-attr]


class ScriptedModel(Model):
    """A model that emits a scripted list of output items per turn and records what it
    was given."""

    def __init__(self, turns: list[list[Any]]) -> None:
        self.turns = turns
        self.inputs: list[Any] = []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, *, previous_response_id=None, conversation_id=None, prompt=None, **kwargs):  # type: ignore[no-untyped-def, override]
        self.inputs.append(input)
        self.tools = tools
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # pragma: no cover
        raise NotImplementedError


def shell_call(call_id: str, *commands: str) -> ResponseFunctionShellToolCall:
    return ResponseFunctionShellToolCall(
        id=f"sh_{call_id}",
        call_id=call_id,
        type="shell_call",
        status="completed",
        action={"commands": list(commands), "timeout_ms": 10_000},
    )


def message(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_1",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


async def test_agent_run_with_scripted_model(url: str) -> None:
    """``Runner.run`` drives the shell tool through the SDK's own tool layer: the model
    writes buggy code, sees the error, fixes it, and runs it again."""
    model = ScriptedModel(
        [
            [shell_call("c1", "printf 'print(1/0)\\n' > calc.py", "python3 calc.py")],
            [shell_call("c2", "printf 'print(1/2)\\n' > calc.py && python3 calc.py")],
            [message("the answer is 0.5")],
        ]
    )
    async with AsyncAirlock(url) as al:
        async with AirlockShellExecutor(al) as executor:
            agent = Agent(name="coder", instructions="use the shell", model=model, tools=[executor.tool()])
            result = await Runner.run(agent, "compute 1/2", run_config=RunConfig(tracing_disabled=True))
            assert result.final_output == "the answer is 0.5"
            outputs = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
            assert len(outputs) == 2
            first, second = (str(o.output) for o in outputs)
            assert "ZeroDivisionError" in first
            assert "0.5" in second
            # the model's next turn was given the shell output
            assert "ZeroDivisionError" in json.dumps(model.inputs[1], default=str)
            assert executor.sandbox is not None
            assert (await executor.sandbox.files.read_text("calc.py")) == "print(1/2)\n"


def mcp_available() -> bool:
    binary = airlock_bin()
    if not binary.exists():
        return False
    probe = subprocess.run([str(binary), "mcp", "--help"], capture_output=True, timeout=30)
    return probe.returncode == 0


def test_mcp_server_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRLOCK_BIN", "/opt/airlock/bin/airlock")
    server = airlock_mcp_server()
    assert isinstance(server, MCPServerStdio)
    assert server.params.command == "/opt/airlock/bin/airlock"
    assert server.params.args == ["mcp"]
    server = airlock_mcp_server(command="airlock", env={"AIRLOCK_LOG": "warn"}, cache_tools_list=True)
    assert server.params.command == "airlock" and server.params.env == {"AIRLOCK_LOG": "warn"}
    assert server.name == "airlock"


async def test_mcp_server_runs_code(daemon: Daemon) -> None:
    """``airlock mcp`` through the SDK's MCPServerStdio: list the tools, run code."""
    if not mcp_available():
        pytest.skip("`airlock mcp` is not in this build yet")
    args = ("mcp", "--snapshot-dir", snapshot_dir())  # a store of its own
    async with airlock_mcp_server(command=str(airlock_bin()), args=args) as server:
        tools = {t.name for t in await server.list_tools()}
        assert {"run_code", "create_sandbox", "exec", "write_file", "read_file", "close_sandbox"} <= tools
        result = await server.call_tool("run_code", {"language": "python", "code": "print(6*7)"})
        dumped = result.model_dump()
        is_error = dumped.get("is_error", dumped.get("isError"))  # mcp 2.x / 1.x spelling
        assert not is_error, dumped
        assert "42" in json.dumps(dumped, default=str)
