#!/usr/bin/env python3
"""An OpenAI Agents SDK agent whose ``ShellTool`` runs commands in an airlock sandbox.

    sudo airlock serve &
    pip install './clients/python[openai-agents]'
    python3 examples/openai_agents_shell.py               # scripted model: no LLM, no key
    python3 examples/openai_agents_shell.py --model gpt-5.5  # a real model (OPENAI_API_KEY)

``AIRLOCK_URL`` (default http://127.0.0.1:8710) and ``AIRLOCK_API_KEY`` select the daemon.
Without ``--model`` a scripted model emits the shell calls a model would, so the example
runs offline through the SDK's real Runner and tool layer (tracing off).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any, AsyncIterator

from agents import Agent, RunConfig, Runner
from agents.items import ModelResponse, ToolCallOutputItem
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionShellToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from airlock import AsyncAirlock
from airlock.adapters.openai_agents import AirlockShellExecutor


class ScriptedModel(Model):
    """Plays the LLM: one list of output items per turn."""

    def __init__(self, turns: list[list[Any]]) -> None:
        self.turns = turns

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:  # type: ignore[override]
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # pragma: no cover
        raise NotImplementedError


def shell(call_id: str, *commands: str) -> ResponseFunctionShellToolCall:
    return ResponseFunctionShellToolCall(
        id=f"sh_{call_id}", call_id=call_id, type="shell_call", status="completed",
        action={"commands": list(commands), "timeout_ms": 10_000},
    )


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg", type="message", role="assistant", status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def scripted() -> ScriptedModel:
    return ScriptedModel(
        [
            [shell("1", "printf 'import math\\nprint(math.factorial(20)' > fact.py", "python3 fact.py")],
            [shell("2", "printf 'import math\\nprint(math.factorial(20))\\n' > fact.py", "python3 fact.py")],
            [say("20! = 2432902008176640000")],
        ]
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="an OpenAI model name (default: a scripted model)")
    args = parser.parse_args()
    url = os.environ.get("AIRLOCK_URL", "http://127.0.0.1:8710")

    async with AsyncAirlock(url) as al, AirlockShellExecutor(al) as executor:
        agent = Agent(
            name="coder",
            instructions="Solve the task with the shell tool; files persist in /workspace.",
            model=args.model or scripted(),
            tools=[executor.tool()],
        )
        result = await Runner.run(
            agent, "Compute 20 factorial with Python.", run_config=RunConfig(tracing_disabled=args.model is None)
        )
        outputs = [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]
        for out in outputs:
            print("shell output:", out.strip().replace("\n", "\n              "))
        print("answer:", result.final_output)
        if executor.sandbox is not None:
            print("sandbox:", executor.sandbox.id)
    if args.model is None and not any("2432902008176640000" in out for out in outputs):
        return 1  # the scripted run must have fixed fact.py and printed 20!
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
