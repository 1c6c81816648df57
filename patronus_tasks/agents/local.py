"""A deterministic local model behind the OpenAI chat API: an agent runs offline.

`local_endpoint(policy)` is an `Endpoint` whose requests never leave the process: an
``httpx.MockTransport`` answers each ``POST /chat/completions`` by calling ``policy`` with
the conversation and the tools' names, and writes what it decided as the API would (a
message with ``tool_calls``, or with ``content``), tokens counted as words. The agent, its
spans and the evaluators see exactly what a real endpoint gives; only the decisions are
scripted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from patronus_tasks.http import Endpoint

#: What a policy decides: a final answer (text), or the tool calls to make, each a
#: ``(name, arguments)`` pair (arguments a dict, or a text sent as it is: malformed JSON).
Decision = str | list[tuple[str, dict[str, Any] | str]]
Policy = Callable[[list[dict[str, Any]], list[str]], Decision]
LOCAL_MODEL = "local-policy"


def _words(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content") or "").split()) for m in messages)


def _message(decision: Decision, step: int) -> dict[str, Any]:
    if isinstance(decision, str):
        return {"role": "assistant", "content": decision}
    calls = [{"id": f"call_{step}_{i}", "type": "function", "function": {
        "name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
        for i, (name, args) in enumerate(decision)]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def answer(body: dict[str, Any], policy: Policy, model: str) -> dict[str, Any]:
    """The chat completion ``policy`` gives for a request's ``body``."""
    messages = body.get("messages") or []
    tools = [t["function"]["name"] for t in body.get("tools") or ()]
    step = sum(1 for m in messages if m.get("role") == "assistant")
    message = _message(policy(messages, tools), step)
    said = len(str(message.get("content") or json.dumps(message.get("tool_calls"))).split())
    return {"id": f"local-{step}", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": _words(messages), "completion_tokens": said,
                      "total_tokens": _words(messages) + said}}


def local_endpoint(policy: Policy, model: str = LOCAL_MODEL) -> Endpoint:
    """An OpenAI-compatible endpoint answered in-process by ``policy``."""
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.rstrip("/").endswith("/chat/completions"):
            return httpx.Response(200, json=answer(json.loads(request.content), policy, model))
        return httpx.Response(404, json={"error": {"message": f"no route {request.url.path}"}})

    return Endpoint("http://local-policy/v1", transport=httpx.MockTransport(handle))
