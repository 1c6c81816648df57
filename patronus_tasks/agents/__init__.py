"""Agents: a tool-calling task on any OpenAI-compatible endpoint, and an offline model.

- `AgentTask`: the loop (model, tools, model...) as a task, every model and tool call a span
- `Tool`, `ToolError`: Python functions as tools (schemas from hints and docstrings)
- `local_endpoint`: a deterministic policy behind the OpenAI chat API, in-process
- `as_messages`: a row's input (a text or a conversation) as chat messages

May import: `define`, `http`, `openai`, `trace` and the ground modules; no Prefect.
"""

from patronus_tasks.agents.agent import AgentTask, BudgetExceeded
from patronus_tasks.agents.local import LOCAL_MODEL, Decision, Policy, local_endpoint
from patronus_tasks.agents.tools import Tool, ToolError, tools_of
from patronus_tasks.openai import as_messages

__all__ = ["LOCAL_MODEL", "AgentTask", "BudgetExceeded", "Decision", "Policy", "Tool", "ToolError",
           "as_messages", "local_endpoint", "tools_of"]
__all__.sort()
