"""Adapters for agent frameworks. Each module imports its framework when imported itself:

- :mod:`airlock.adapters.deepagents`: ``AirlockBackend``, a LangChain Deep Agents
  ``BaseSandbox`` on an airlock session (``pip install 'airlock-sandbox[deepagents]'``);
- :mod:`airlock.adapters.openai_agents`: ``AirlockShellExecutor`` / ``airlock_shell_tool``
  for the OpenAI Agents SDK's ``ShellTool``, and ``airlock_mcp_server`` (an
  ``MCPServerStdio`` on ``airlock mcp``) (``pip install 'airlock-sandbox[openai-agents]'``).
"""
