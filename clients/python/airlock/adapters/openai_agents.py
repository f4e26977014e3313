"""OpenAI Agents SDK adapters: a ``ShellTool`` executor that runs the model's shell commands
in an airlock session sandbox, and an ``MCPServerStdio`` on ``airlock mcp``.

    from agents import Agent
    from airlock import AsyncAirlock
    from airlock.adapters.openai_agents import AirlockShellExecutor, airlock_mcp_server

    executor = AirlockShellExecutor(AsyncAirlock())
    agent = Agent(name="coder", tools=[executor.tool()])          # ShellTool(executor=...)
    ...
    await executor.aclose()                                       # deletes the sandbox

    async with airlock_mcp_server() as server:                    # airlock's MCP tools
        agent = Agent(name="coder", mcp_servers=[server])

Tested with ``openai-agents==0.24.0``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Any, Mapping, Sequence

from agents import ShellTool
from agents.mcp import MCPServerStdio
from agents.tool import (
    ShellCallOutcome,
    ShellCommandOutput,
    ShellCommandRequest,
    ShellResult,
)

from .. import errors
from ..aio import AsyncAirlock, AsyncSandbox
from ..types import Limits, Network, Outcome

__all__ = ["AirlockShellExecutor", "airlock_mcp_server", "airlock_shell_tool"]


class AirlockShellExecutor:
    """A ``ShellExecutor`` (``agents.ShellTool(executor=...)``): each command of a shell
    call runs as ``bash -c COMMAND`` in one airlock session sandbox, created on the first
    call (or given as ``sandbox``), so files in /workspace and /tmp persist between
    commands and calls. The working directory is /workspace for every command.

    The call's ``timeout_ms`` (else ``default_timeout_ms``) bounds each command; a command
    past it is killed and reported with outcome ``timeout``. An OOM kill is exit code 137
    with the reason on stderr. ``max_output_length`` is passed back for the SDK to apply.
    Errors from the service (an expired sandbox, say) fail the tool call with their
    message, which the SDK reports to the model."""

    def __init__(
        self,
        client: AsyncAirlock,
        *,
        sandbox: AsyncSandbox | None = None,
        ttl_s: int = 3600,
        limits: Limits | Mapping[str, Any] | None = None,
        network: Network | Mapping[str, Any] | str | None = None,
        default_timeout_ms: int = 60_000,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._client = client
        self._sandbox = sandbox
        self._owns = sandbox is None
        self._ttl_s = ttl_s
        self._limits = Limits.coerce(limits)
        self._network = network
        self._default_timeout_ms = default_timeout_ms
        self._env = dict(env or {})
        self._lock = asyncio.Lock()

    @property
    def sandbox(self) -> AsyncSandbox | None:
        """The session sandbox, once created."""
        return self._sandbox

    async def ensure_sandbox(self) -> AsyncSandbox:
        async with self._lock:
            if self._sandbox is None:
                self._sandbox = await self._client.sandbox(
                    ttl_s=self._ttl_s, limits=self._limits, network=self._network
                )
            return self._sandbox

    async def run_command(self, command: str, timeout_ms: int | None = None) -> ShellCommandOutput:
        """Runs one command and describes it as the SDK's ``ShellCommandOutput``."""
        sb = await self.ensure_sandbox()
        ms = timeout_ms or self._default_timeout_ms
        r = await sb.exec(
            ["bash", "-c", command], env=self._env or None, limits=Limits(timeout_ms=ms)
        )
        stderr = r.stderr
        if r.outcome == Outcome.TIMEOUT:
            outcome = ShellCallOutcome(type="timeout", exit_code=None)
        else:
            outcome = ShellCallOutcome(type="exit", exit_code=r.shell_status)
            if r.outcome == Outcome.OOM:
                stderr += "killed: the command exceeded the sandbox's memory limit\n"
        return ShellCommandOutput(
            stdout=r.stdout,
            stderr=stderr,
            outcome=outcome,
            command=command,
            provider_data={
                "airlock": {
                    "sandbox_id": sb.id,
                    "outcome": str(r.outcome),
                    "wall_ms": r.wall_ms,
                    "memory_peak_bytes": r.memory_peak_bytes,
                    "stdout_truncated": r.stdout_truncated,
                    "stderr_truncated": r.stderr_truncated,
                }
            },
        )

    async def __call__(self, request: ShellCommandRequest) -> ShellResult:
        action = request.data.action
        outputs = [await self.run_command(cmd, action.timeout_ms) for cmd in action.commands]
        return ShellResult(output=outputs, max_output_length=action.max_output_length)

    def tool(self, **kwargs: Any) -> ShellTool:
        """A ``ShellTool`` using this executor (``kwargs`` go to ``ShellTool``, e.g.
        ``needs_approval=True``)."""
        return ShellTool(executor=self, **kwargs)

    async def aclose(self) -> None:
        """Deletes the sandbox if this executor created it."""
        if self._owns and self._sandbox is not None:
            try:
                await self._sandbox.aclose()
            except errors.AirlockConnectionError:
                pass
            self._sandbox = None

    async def __aenter__(self) -> AirlockShellExecutor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def airlock_shell_tool(client: AsyncAirlock, **kwargs: Any) -> ShellTool:
    """``ShellTool(executor=AirlockShellExecutor(client, **kwargs))``. Keep a reference to
    ``tool.executor`` to ``aclose()`` it (deleting its sandbox) when done."""
    return AirlockShellExecutor(client, **kwargs).tool()


def find_airlock_binary() -> str:
    """``$AIRLOCK_BIN``, else ``airlock`` on PATH, else the bare name ``airlock``."""
    return os.environ.get("AIRLOCK_BIN") or shutil.which("airlock") or "airlock"


def airlock_mcp_server(
    *,
    command: str | None = None,
    args: Sequence[str] = ("mcp",),
    env: Mapping[str, str] | None = None,
    name: str = "airlock",
    **kwargs: Any,
) -> MCPServerStdio:
    """An ``MCPServerStdio`` that starts ``airlock mcp`` (airlock's MCP server over stdio:
    ``run_code``, ``create_sandbox``, ``exec``, ``write_file``, ``read_file``,
    ``close_sandbox``). ``command`` defaults to :func:`find_airlock_binary`; ``kwargs``
    go to ``MCPServerStdio`` (e.g. ``cache_tools_list=True``,
    ``client_session_timeout_seconds=60``)."""
    params: dict[str, Any] = {"command": command or find_airlock_binary(), "args": list(args)}
    if env is not None:
        params["env"] = dict(env)
    kwargs.setdefault("client_session_timeout_seconds", 60)
    return MCPServerStdio(params=params, name=name, **kwargs)  # type: ignore[arg-type]
