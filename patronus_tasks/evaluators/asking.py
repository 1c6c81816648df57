"""Asking a judge model on an OpenAI-compatible endpoint, and reading what it answered.

The answer is asked for through structured output (``response_format`` with the form's
JSON schema) where the endpoint takes it, else as JSON the prompt describes; with the
log-probabilities of the tokens where the endpoint gives them. An endpoint that refuses
either option (HTTP 400 naming it) is asked again without it, and not offered it again.
Anything short of a readable verdict is a `JudgeError` keeping what the judge said:
never a pass, never a 0.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from patronus_tasks.define.step_results import Usage
from patronus_tasks.evaluators.forms import Form, Reading, value_weights
from patronus_tasks.exceptions import JudgeError, RemoteAPIError
from patronus_tasks.http import Endpoint
from patronus_tasks.openai import chat_request

_RAW_KEPT = 2000
_REFUSING = re.compile(r"\b(?:I(?:'m| am) sorry|I can(?:no|')t|I cannot|I'm unable|I am unable|"
                       r"I won't|I will not|as an AI)\b", re.I)


@dataclass
class Capabilities:
    """What an endpoint was found to take (learnt from its 400s, kept per judge)."""

    structured: bool = True
    logprobs: bool = True


@dataclass
class Answer:
    """One judge call: its reading, the model and usage, the HTTP attempts."""

    reading: Reading
    model: str
    usage: Usage | None
    attempts: int
    logprobs_used: bool = False
    raw: str = field(default="", repr=False)


@dataclass
class Judgement:
    """A request to one judge model: the messages, the answer's form, the options."""

    model: str
    endpoint: Endpoint
    params: dict[str, Any]
    structured: bool | None  # None: as the endpoint takes it
    logprobs: bool | None


def _body(j: Judgement, messages: list[dict[str, str]], form: Form, caps: Capabilities) -> dict[str, Any]:
    body: dict[str, Any] = {"model": j.model, "messages": messages, **j.params}
    if j.structured is not False and caps.structured:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "judgment", "strict": True, "schema": form.schema()}}
    if j.logprobs is not False and caps.logprobs and form.tokens():
        body.update(logprobs=True, top_logprobs=20)
    return body


def _refused_option(exc: RemoteAPIError, body: dict[str, Any], j: Judgement,
                    caps: Capabilities) -> bool:
    """Whether a 400 names an option this judge may go without; if so, drop it."""
    text = str(exc).lower()
    if exc.status not in (400, 422):
        return False
    named = re.search(r"response_format|json_schema|structured", text)
    if "response_format" in body and j.structured is None and named:
        caps.structured = False
        return True
    if "logprobs" in body and j.logprobs is None and "logprob" in text:
        caps.logprobs = False
        return True
    return False


async def ask(j: Judgement, messages: list[dict[str, str]], form: Form, caps: Capabilities) -> Answer:
    """Ask ``j``'s model once (the endpoint retrying 429s and 5xx); read its verdict."""
    while True:
        body = _body(j, messages, form, caps)
        try:
            answer, attempts = await chat_request(j.endpoint, body)
            break
        except JudgeError:
            raise
        except RemoteAPIError as exc:
            if _refused_option(exc, body, j, caps):
                continue
            raise JudgeError.no_answer(exc, j.model) from None
    return read_answer(answer, j.model, form, attempts)


def read_answer(answer: Any, model: str, form: Form, attempts: int) -> Answer:
    """The verdict in an OpenAI chat completion, or a `JudgeError` saying why there is none."""
    try:
        choice = answer["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise JudgeError(f"judge {model!r} answered with no message: {str(answer)[:300]!r}",
                         raw=str(answer)[:_RAW_KEPT], reason="unparseable", status=200) from None
    if message.get("refusal"):
        raise JudgeError(f"judge {model!r} refused: {str(message['refusal'])[:300]!r}",
                         raw=str(message["refusal"])[:_RAW_KEPT], reason="refusal", status=200)
    text = message.get("content") or _tool_arguments(message) or ""
    data = parse_object(text, model)
    weights = value_weights(choice.get("logprobs"), form.key) if form.tokens() else None
    reading = form.read(data, weights)
    usage = Usage.of(answer.get("usage") if isinstance(answer, dict) else None, model)
    return Answer(reading, model, usage, attempts, logprobs_used=weights is not None and bool(
        set(weights) & set(form.tokens())), raw=text)


def _tool_arguments(message: dict[str, Any]) -> str | None:
    calls = message.get("tool_calls") or []
    if calls and isinstance(calls, list):
        return str((calls[0].get("function") or {}).get("arguments") or "") or None
    return None


def parse_object(text: str, model: str) -> dict[str, Any]:
    """The JSON object in a judge's text (in a code fence or among words), else `JudgeError`."""
    stripped = text.strip()
    data: Any = None
    for candidate in (stripped, *re.findall(r"\{.*\}", stripped, re.DOTALL)):
        try:
            data = json.loads(candidate)
            break
        except json.JSONDecodeError:
            continue
    if isinstance(data, dict):
        return data
    reason = "refusal" if _REFUSING.search(stripped) else "unparseable"
    what = "refused" if reason == "refusal" else "answered with no JSON object"
    raise JudgeError(f"judge {model!r} {what}: {stripped[:300]!r}", raw=stripped[:_RAW_KEPT],
                     reason=reason, status=200)


def total_usage(answers: list[Answer]) -> Usage | None:
    """The tokens of several calls: one model's, or their sum under the models' names."""
    usages = [a.usage for a in answers if a.usage is not None]
    if not usages:
        return None
    models = sorted({u.model for u in usages if u.model})

    def total(name: str) -> int | None:
        counts = [getattr(u, name) for u in usages]
        return None if any(c is None for c in counts) else sum(counts)

    parts = tuple(usages) if len(models) > 1 else None  # each priced at its own model's price
    return Usage(model="+".join(models) or None, input_tokens=total("input_tokens"),
                 output_tokens=total("output_tokens"), parts=parts)
