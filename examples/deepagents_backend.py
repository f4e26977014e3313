#!/usr/bin/env python3
"""A LangChain Deep Agents agent whose file and shell tools run inside an airlock sandbox.

    sudo airlock serve &
    pip install './clients/python[deepagents]'
    python3 examples/deepagents_backend.py                   # scripted model: no LLM, no key
    python3 examples/deepagents_backend.py --model anthropic:claude-sonnet-4-6   # a real model

``AIRLOCK_URL`` (default http://127.0.0.1:8710) and ``AIRLOCK_API_KEY`` select the daemon.
Without ``--model`` a scripted chat model plays the LLM, emitting the tool calls a model
would (write a file, run it, read the error, edit, run again), so the example runs
offline; everything it does still goes through Deep Agents' real tools and agent loop.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage

from airlock import Airlock, Limits
from airlock.adapters.deepagents import AirlockBackend

SYSTEM_PROMPT = (
    "You work in a sandbox. Your working directory is /workspace: keep every file under "
    "/workspace (use absolute paths such as /workspace/main.py); /tmp is scratch space; "
    "the rest of the filesystem is read-only. The network is off."
)


class ScriptedModel(GenericFakeChatModel):
    """Plays the LLM from a script; accepts whatever tools the agent binds."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:  # type: ignore[override]
        return self


def tool_call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


def scripted_model() -> ScriptedModel:
    buggy = "import sys\n\nwords = open(sys.argv[1]).read().split()\nprint(len(word), 'words')\n"
    return ScriptedModel(
        messages=iter(
            [
                tool_call("write_file", {"file_path": "/workspace/poem.txt", "content": "so much depends\nupon\na red wheel\nbarrow\n"}, "1"),
                tool_call("write_file", {"file_path": "/workspace/count.py", "content": buggy}, "2"),
                tool_call("execute", {"command": "python3 /workspace/count.py /workspace/poem.txt"}, "3"),
                tool_call("edit_file", {"file_path": "/workspace/count.py", "old_string": "len(word)", "new_string": "len(words)"}, "4"),
                tool_call("execute", {"command": "python3 /workspace/count.py /workspace/poem.txt"}, "5"),
                tool_call("grep", {"pattern": "red", "path": "/workspace", "output_mode": "content"}, "6"),
                tool_call("ls", {"path": "/workspace"}, "7"),
                AIMessage(content="The poem has 8 words."),
            ]
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a provider:model string for a real LLM (default: a scripted model)")
    parser.add_argument("--task", default="Count the words of a short poem with a Python script.")
    args = parser.parse_args()

    url = os.environ.get("AIRLOCK_URL", "http://127.0.0.1:8710")
    with Airlock(url) as al, AirlockBackend.create(
        al, ttl_s=900, limits=Limits(memory_bytes=256 * 1024 * 1024, cpus=1), default_timeout=60
    ) as backend:
        print(f"airlock sandbox {backend.id} at {url}")
        model: Any = args.model or scripted_model()
        agent = create_deep_agent(model=model, backend=backend, system_prompt=SYSTEM_PROMPT)
        result = agent.invoke({"messages": [{"role": "user", "content": args.task}]})
        for m in result["messages"]:
            if isinstance(m, AIMessage):
                for call in m.tool_calls:
                    print(f"-> {call['name']}({', '.join(f'{k}={v!r}' for k, v in call['args'].items())[:120]})")
            elif isinstance(m, ToolMessage):
                print("   " + str(m.content).strip().replace("\n", "\n   ")[:600])
        final = result["messages"][-1].content
        print(f"\nanswer: {final}")
        if not args.model:
            # the scripted run must have fixed the script: its second run printed the count
            if not any(isinstance(m, ToolMessage) and "8 words" in str(m.content) for m in result["messages"]):
                print("the scripted run did not reach a working script", file=sys.stderr)
                return 1
        # The files the agent made are in the sandbox, readable with the SDK too:
        print("workspace:", ", ".join(e.path for e in backend.sandbox.files.list()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
