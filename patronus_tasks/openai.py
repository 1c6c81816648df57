"""OpenAI-compatible chat endpoints (OpenAI, vLLM, Ollama, LM Studio): tasks and judges.

``OPENAI_BASE_URL`` (default the OpenAI API), ``OPENAI_API_KEY`` (optional: local
servers need none) and ``OPENAI_MODEL`` (default ``gpt-4o``) configure them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any
from urllib.parse import urlsplit

from patronus_tasks.define.step_results import EvaluationResult, TaskResult, Usage
from patronus_tasks.define.steps import Evaluator, Task
from patronus_tasks.exceptions import (
    ConfigError,
    DatasetError,
    JudgeError,
    RemoteAPIError,
    UnparseableResponseError,
)
from patronus_tasks.http import Endpoint
from patronus_tasks.trace.spans import span

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_RAW_KEPT = 2000


def openai_endpoint(base_url: str | None = None, api_key: str | None = None, *,
                    max_in_flight: int = 16, timeout: float = 60.0,
                    max_attempts: int = 3) -> Endpoint:
    """An OpenAI-compatible endpoint from arguments or ``OPENAI_BASE_URL``/``OPENAI_API_KEY``
    (api.openai.com with a key and no URL). Neither is a `ConfigError` here, before any
    row: nothing is asked of a server nobody named (a row's prompt holds its data)."""
    url = base_url or os.environ.get("OPENAI_BASE_URL")
    key = api_key or os.environ.get("OPENAI_API_KEY")
    if not url and not key:
        raise ConfigError(
            "no model endpoint: set OPENAI_BASE_URL to an OpenAI-compatible server (vLLM, "
            "Ollama: http://127.0.0.1:11434/v1) or OPENAI_API_KEY for api.openai.com, or "
            "pass endpoint=openai_endpoint(base_url=..., api_key=...).")
    url = (url or DEFAULT_BASE_URL).strip()
    if urlsplit(url).scheme.lower() not in ("http", "https"):
        raise ConfigError(f"model endpoint {url!r}: the base URL needs its scheme "
                          f"(http://{url} or https://{url}); it usually ends in /v1.")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return Endpoint(url, headers=headers, max_in_flight=max_in_flight, timeout=timeout,
                    max_attempts=max_attempts, hints=_OPENAI_HINTS)


_OPENAI_HINTS = {404: " (check the base URL: an OpenAI-compatible one usually ends in /v1; "
                      "and the model name)"}


def default_model() -> str:
    return os.environ.get("OPENAI_MODEL") or "gpt-4o"


def _said(answer: Any) -> Any:
    try:
        message = answer["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return None
    return message.get("tool_calls") or message.get("content")


async def chat_request(endpoint: Endpoint, body: dict[str, Any], provider: str = "openai",
                       name: str | None = None) -> tuple[Any, int]:
    """``POST /chat/completions`` with ``body`` inside an ``llm`` span (the messages as its
    arguments, the model, parameters and tokens, the answer as its output); return the
    answer's JSON and the attempts it took. What every model call of this package goes
    through (`ChatTask`, `chat_completion`, the judges, the agent). The span is named
    ``chat <model>``, as the GenAI conventions name a chat call's span."""
    name = name or f"chat {body.get('model')}"
    params = {k: v for k, v in body.items() if k not in ("model", "messages", "tools")}
    with span(name, kind="llm", model=body.get("model"), provider=provider,
              arguments=body.get("messages"), parameters=params) as s:
        if body.get("tools"):
            s.set(tools=[t.get("function", {}).get("name") for t in body["tools"]])
        answer, attempts = await endpoint.request("POST", "/chat/completions", json=body)
        usage = answer.get("usage") if isinstance(answer, dict) else None
        if isinstance(usage, dict):
            s.set(input_tokens=usage.get("prompt_tokens"), output_tokens=usage.get("completion_tokens"))
        s.set(output=_said(answer), response_model=(answer or {}).get("model"), http_attempts=attempts)
    return answer, attempts


async def chat_completion(endpoint: Endpoint, messages: list[dict[str, Any]], *,
                          model: str | None = None, provider: str = "openai",
                          **params: Any) -> TaskResult:
    """One chat completion as a `TaskResult` with model name, provider and parameters."""
    model = model or default_model()
    body, attempts = await chat_request(
        endpoint, {"model": model, "messages": messages, **params}, provider)
    content = body["choices"][0]["message"]["content"]
    system = next((m["content"] for m in messages if m.get("role") == "system"), None)
    return TaskResult(
        evaluated_model_output=content, evaluated_model_system_prompt=system,
        evaluated_model_name=model, evaluated_model_provider=provider,
        evaluated_model_params=params or None,
        evaluated_model_selected_model=body.get("model") or model,
        metadata={"http_attempts": attempts, "usage": body.get("usage")},
        usage=Usage.of(body.get("usage"), model),
    )


def as_messages(value: Any, system: str | None = None) -> list[dict[str, Any]]:
    """The row's input as chat messages: a text (one user message), a list of messages
    (a conversation), or that list as JSON text (a CSV's cell); the system prompt first
    unless the conversation has one."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        with contextlib.suppress(json.JSONDecodeError):  # else a text that starts with "["
            value = json.loads(value)
    if isinstance(value, str):
        messages: list[dict[str, Any]] = [{"role": "user", "content": value}]
    elif hasattr(value, "tolist") or isinstance(value, list | tuple):
        padded = hasattr(value, "tolist")  # from Parquet: every key of any message, null
        messages = [{k: v for k, v in m.items() if v is not None or not padded}
                    for m in (value.tolist() if padded else value)
                    if isinstance(m, dict) and "role" in m]
        if not messages or len(messages) != len(value):
            raise DatasetError(f"evaluated_model_input is a list but not of chat messages "
                               f"({{'role': ..., 'content': ...}}): {str(value)[:200]!r}. Give a "
                               "text, or a list of messages each with a role and content.")
    else:
        raise DatasetError(f"evaluated_model_input must be a text or a list of chat messages, "
                           f"not {type(value).__name__}.")
    if system and not any(m.get("role") == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system})
    return messages


class ChatTask(Task):
    """A task that sends the row's system prompt and input (a text, or a conversation: a
    list of chat messages) to a chat endpoint.

    Its result's ``usage`` holds the model asked for and the answer's tokens.
    ``cache=True`` answers a call from the experiment's cache when the same model, with
    the same parameters at the same endpoint, got the same messages before.
    """

    def __init__(self, model: str | None = None, *, name: str = "chat",
                 endpoint: Endpoint | None = None, provider: str = "openai",
                 timeout_seconds: float | None = None, cache: bool | None = None,
                 **params: Any) -> None:
        super().__init__(name, timeout_seconds=timeout_seconds, cache=cache)
        self.model, self.provider, self.params = model or default_model(), provider, params
        self.endpoint = endpoint or openai_endpoint()

    def cache_identity(self) -> dict[str, Any]:
        return {"model": self.model, "provider": self.provider, "params": self.params,
                "base_url": self.endpoint.base_url}

    async def execute(self, evaluated_model_input: Any,
                      evaluated_model_system_prompt: str | None = None) -> TaskResult:
        messages = as_messages(evaluated_model_input, evaluated_model_system_prompt)
        return await chat_completion(self.endpoint, messages, model=self.model,
                                     provider=self.provider, **self.params)

    async def aclose(self) -> None:
        await self.endpoint.aclose()


JUDGE_SYSTEM = (
    "You are an impartial evaluator. Judge the MODEL OUTPUT against the PASS CRITERIA. "
    'Answer with one JSON object and nothing else: {"pass": true or false, '
    '"score": a number from 0 to 1, "explanation": "one or two sentences"}.'
)


def _judge_prompt(criteria: str, fields: dict[str, Any]) -> str:
    parts = [f"PASS CRITERIA:\n{criteria.strip()}"]
    for label, value in fields.items():
        if value is not None:
            parts.append(f"{label}:\n{value}")
    return "\n\n".join(parts)


def message_text(answer: Any, model: str) -> str:
    """The text of a chat completion's first choice; an answer without one is a
    `JudgeError` (``choices: []`` was an ``IndexError``, counted as a fail)."""
    try:
        return str(answer["choices"][0]["message"].get("content") or "")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise JudgeError(f"judge {model!r} answered with no message: {str(answer)[:300]!r}",
                         raw=str(answer)[:_RAW_KEPT], reason="unparseable", status=200) from None


def parse_verdict(text: str, threshold: float = 0.5) -> EvaluationResult:
    """Read a judge's JSON verdict; raise `UnparseableResponseError` keeping the raw text."""
    match = re.search(r"\{.*\}", text or "", re.DOTALL)
    try:
        data = json.loads(match.group(0)) if match else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise UnparseableResponseError(
            f"judge answer is not a JSON object: {text[:_RAW_KEPT]!r}", raw=text)
    verdict, score = data.get("pass"), data.get("score")
    if not isinstance(verdict, bool | None) or not isinstance(score, int | float | None) \
            or isinstance(score, bool) or (verdict is None and score is None):
        raise UnparseableResponseError(
            f"judge answer lacks a boolean 'pass' or numeric 'score': {text[:_RAW_KEPT]!r}",
            raw=text)
    if verdict is None:
        verdict = float(score) >= threshold  # type: ignore[arg-type]
    explanation = data.get("explanation")
    return EvaluationResult(
        pass_=verdict, score_raw=float(score) if score is not None else float(verdict),
        explanation=str(explanation) if explanation is not None else None)


class LLMJudge(Evaluator):
    """An evaluator asking a chat model whether the output meets ``pass_criteria``.

    The answer must be JSON with ``pass`` and/or ``score`` (``pass`` is then
    ``score >= threshold``); anything else is this row's evaluator error, the raw text kept.
    Its result's ``usage`` holds the model and tokens; ``cache=True`` as `ChatTask`.
    """

    is_judge = True  # a timeout is no verdict

    def __init__(self, name: str, pass_criteria: str, *, model: str | None = None,
                 endpoint: Endpoint | None = None, threshold: float = 0.5,
                 timeout_seconds: float | None = None, cache: bool | None = None,
                 **params: Any) -> None:
        super().__init__(name, criteria=pass_criteria.strip(), timeout_seconds=timeout_seconds,
                         cache=cache)
        self.pass_criteria, self.threshold = pass_criteria, threshold
        self.model, self.params = model or default_model(), {"temperature": 0, **params}
        self.endpoint = endpoint or openai_endpoint()

    async def evaluate(self, evaluated_model_output: str | None = None,
                       evaluated_model_input: str | None = None,
                       evaluated_model_gold_answer: str | None = None,
                       evaluated_model_retrieved_context: Any = None) -> EvaluationResult:
        prompt = _judge_prompt(self.pass_criteria, {
            "USER INPUT": evaluated_model_input, "RETRIEVED CONTEXT": evaluated_model_retrieved_context,
            "GOLD ANSWER": evaluated_model_gold_answer, "MODEL OUTPUT": evaluated_model_output})
        messages = [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": prompt}]
        try:
            body, attempts = await chat_request(
                self.endpoint, {"model": self.model, "messages": messages, **self.params})
        except RemoteAPIError as exc:
            raise JudgeError.no_answer(exc, self.model) from None
        result = parse_verdict(message_text(body, self.model), self.threshold)
        return result.model_copy(update={"metadata": {"model": self.model, "http_attempts": attempts},
                                          "usage": Usage.of(body.get("usage"), self.model)})

    def cache_identity(self) -> dict[str, Any]:
        return {"model": self.model, "params": self.params, "criteria": self.pass_criteria,
                "threshold": self.threshold, "system": JUDGE_SYSTEM,
                "base_url": self.endpoint.base_url}

    async def aclose(self) -> None:
        await self.endpoint.aclose()


__all__ = ["ChatTask", "LLMJudge", "UnparseableResponseError", "as_messages", "chat_completion",
           "chat_request", "openai_endpoint"]
