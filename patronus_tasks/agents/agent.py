"""`AgentTask`: a tool-calling agent on any OpenAI-compatible chat endpoint, as a task.

The loop: ask the model with the conversation and the tools' schemas; run each tool call it
makes (its arguments checked against the tool's schema) and feed the results back; stop at
an answer without tool calls, or at the step or token budget (then the row's task error,
`BudgetExceeded`, its spans kept; or, with ``on_budget="stop"``, what it has goes to the
evaluators, as Inspect AI scores a sample that hit its limit). Every model call is an
``llm`` span and every tool call a ``tool`` span named after the tool, both under one
``agent`` span (``invoke_agent <name>``); a tool that is itself ``@traced(kind="tool")``
records into its call's span, not a second one.
A tool that raises, a tool that does not exist and malformed arguments are told to the
model as the tool's result (``error: ...``), recorded as that tool span's error: never the
row's crash.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Literal

from patronus_tasks.agents.tools import Tool, ToolError, tools_of
from patronus_tasks.define.step_results import TaskResult, Usage
from patronus_tasks.define.steps import Task
from patronus_tasks.exceptions import ConfigError, PatronusTasksError
from patronus_tasks.http import Endpoint
from patronus_tasks.openai import as_messages, chat_request, default_model, openai_endpoint
from patronus_tasks.trace.decorate import tool_call
from patronus_tasks.trace.spans import span
from patronus_tasks.trace.tree import json_or_text


class BudgetExceeded(PatronusTasksError):
    """The agent used its steps or tokens without giving a final answer."""


class _Run:
    """One conversation of the agent: its messages, its tool calls and what it used."""

    def __init__(self, agent: AgentTask, messages: list[dict[str, Any]]) -> None:
        self.agent, self.messages = agent, messages
        self.trajectory: list[dict[str, Any]] = []
        self.steps = self.input_tokens = self.output_tokens = 0

    async def ask(self) -> dict[str, Any]:
        a = self.agent
        body = {"model": a.model, "messages": self.messages, **a.params}
        if a.tools:
            body["tools"] = [t.schema() for t in a.tools.values()]
        answer, _ = await chat_request(a.endpoint, body, a.provider)
        self.steps += 1
        usage = answer.get("usage") or {}
        self.input_tokens += usage.get("prompt_tokens") or 0
        self.output_tokens += usage.get("completion_tokens") or 0
        message = dict(answer["choices"][0]["message"])
        self.messages.append({k: v for k, v in message.items() if v is not None})
        return message

    async def use(self, request: dict[str, Any]) -> None:
        """Make one tool call the model asked for; its result (or error) goes back to it."""
        function = request.get("function") or {}
        name, raw = str(function.get("name")), function.get("arguments")
        # The arguments as the model sent them (a trajectory compares those), not as checked.
        with span(name, kind="tool", arguments=json_or_text(raw), tool_call_id=request.get("id")) as s, \
                tool_call(s):  # a @traced tool records into this span: one span per call
            try:
                result, error = await self._call(name, raw, s), None
            except Exception as exc:  # the tool's failure is the model's to handle
                result, error = None, f"{type(exc).__name__}: {exc}"
                s.set(error=error)
        self.trajectory.append({"name": name, "arguments": json_or_text(raw), "output": result,
                                "error": error})
        content = f"error: {error}" if error else result if isinstance(result, str) else \
            json.dumps(result, default=str)
        self.messages.append({"role": "tool", "tool_call_id": request.get("id"), "content": content})

    async def _call(self, name: str, raw: Any, s: Any) -> Any:
        tool = self.agent.tools.get(name)
        if tool is None:
            raise ToolError(f"no tool named {name!r}; the tools are "
                            f"{', '.join(self.agent.tools) or 'none'}")
        result = await tool.call(tool.check(raw))
        s.set(output=result)
        return result

    def over_budget(self) -> str | None:
        a = self.agent
        if a.max_steps is not None and self.steps >= a.max_steps:
            return f"max_steps={a.max_steps}"
        used = self.input_tokens + self.output_tokens
        if a.max_tokens is not None and used >= a.max_tokens:
            return f"max_tokens={a.max_tokens} ({used} used)"
        return None


class AgentTask(Task):
    """A tool-calling agent as a task: ``AgentTask(tools=[fn, ...], model=..., system=...)``.

    ``tools``: Python functions (their schemas from type hints and docstrings) or `Tool`s;
    ``max_steps``: model calls at most (default 10); ``max_tokens``: input and output tokens
    at most over the conversation; ``on_budget``: ``"error"`` (the row's `BudgetExceeded`)
    or ``"stop"`` (the run ends there and the evaluators judge it: its output the last
    message's text, ``metadata["stopped"]`` the limit it hit, so trajectory evaluators
    see the loop); ``endpoint``: any OpenAI-compatible endpoint (default
    ``OPENAI_BASE_URL``), or `local_endpoint(policy)`; other keywords are the chat
    parameters. The row's input is a text or a conversation (a list of messages). The result's
    output is the final answer; its metadata holds the ``trajectory`` (each tool call's name,
    arguments, output or error), ``steps`` and the ``messages``; its usage the tokens.
    """

    def __init__(self, tools: Sequence[Callable[..., Any] | Tool] = (), *,
                 model: str | None = None, system: str | None = None, name: str = "agent",
                 endpoint: Endpoint | None = None, provider: str = "openai",
                 max_steps: int | None = 10, max_tokens: int | None = None,
                 on_budget: Literal["error", "stop"] = "error",
                 timeout_seconds: float | None = None, cache: bool | None = None,
                 **params: Any) -> None:
        super().__init__(name, timeout_seconds=timeout_seconds, cache=cache)
        for limit, value in (("max_steps", max_steps), ("max_tokens", max_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ConfigError(f"AgentTask: {limit} must be a whole number >= 1 or None "
                                  f"(no limit), not {value!r}.")
        if on_budget not in ("error", "stop"):
            raise ConfigError(f'AgentTask: on_budget must be "error" or "stop", not {on_budget!r}.')
        self.on_budget = on_budget
        self.tools = tools_of(tools)
        self.model, self.system, self.provider = model or default_model(), system, provider
        self.endpoint = endpoint or openai_endpoint()
        self.max_steps, self.max_tokens, self.params = max_steps, max_tokens, params

    def cache_identity(self) -> dict[str, Any]:
        return {"model": self.model, "system": self.system, "params": self.params,
                "tools": [t.schema() for t in self.tools.values()], "base_url": self.endpoint.base_url,
                "max_steps": self.max_steps, "max_tokens": self.max_tokens,
                "on_budget": self.on_budget}

    async def execute(self, evaluated_model_input: Any,
                      evaluated_model_system_prompt: str | None = None) -> TaskResult:
        run = _Run(self, as_messages(evaluated_model_input, evaluated_model_system_prompt or self.system))
        # Named as the GenAI conventions name an agent's span (not the task's own name:
        # its task run sits right above this one).
        with span(f"invoke_agent {self.name}", kind="agent", model=self.model,
                  tools=list(self.tools)) as s:
            answer, stopped = await self._loop(run)
            # Its tokens are its model calls' (their spans): not set here, or a sum over
            # spans.parquet would count them twice.
            s.set(output=answer, steps=run.steps, tool_calls=len(run.trajectory),
                  **({"stopped": stopped} if stopped else {}))
        return TaskResult(
            evaluated_model_output=answer, evaluated_model_name=self.model,
            evaluated_model_provider=self.provider, evaluated_model_params=self.params or None,
            metadata={"trajectory": run.trajectory, "steps": run.steps, "messages": run.messages,
                      **({"stopped": stopped} if stopped else {})},
            usage=Usage(model=self.model, input_tokens=run.input_tokens,
                        output_tokens=run.output_tokens))

    async def _loop(self, run: _Run) -> tuple[str, str | None]:
        """The final answer; or, stopped by the budget (``on_budget="stop"``), the last
        message's text and the limit it hit."""
        while True:
            message = await run.ask()
            calls = message.get("tool_calls") or []
            if not calls:
                return str(message.get("content") or ""), None
            for request in calls:
                await run.use(request)
            over = run.over_budget()
            if over is not None and self.on_budget == "stop":
                return str(message.get("content") or ""), over
            if over is not None:
                raise BudgetExceeded(
                    f"agent {self.name!r} gave no final answer within its budget ({over}): "
                    f"{run.steps} model calls, {len(run.trajectory)} tool calls, "
                    f"{run.input_tokens + run.output_tokens} tokens. Raise the budget, or "
                    "look at its spans for the loop.")

    async def aclose(self) -> None:
        await self.endpoint.aclose()
