"""A scripted judge: a real HTTP server on 127.0.0.1 speaking the OpenAI chat API, whose
answers the test sets per marker found in the prompt (a row's output text, say): JSON
verdicts, garbage, refusals, out-of-scale scores, log-probabilities, 429s with
`Retry-After`, 500s; and endpoints that refuse structured output or logprobs."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .servers import FakeServer, Recorded, Reply, serve


def completion(content: str | None, *, refusal: str | None = None,
               logprobs: dict[str, Any] | None = None, model: str = "judge-model") -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": content, "refusal": refusal}}
    if logprobs is not None:
        choice["logprobs"] = logprobs
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": model, "choices": [choice],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}


def with_logprobs(data: dict[str, Any], key: str, weights: dict[str, float]) -> dict[str, Any]:
    """The logprobs of ``data``'s JSON text, the value of ``key`` one token whose top
    alternatives have the probabilities ``weights``."""
    text = json.dumps(data)
    start = text.index(f'"{key}": ') + len(f'"{key}": ')
    value = json.dumps(data[key])
    tokens = [text[:start - 1], " ", value, text[start + len(value):]]
    content = [{"token": t, "logprob": 0.0, "top_logprobs": []} for t in tokens]
    content[2] = {"token": value, "logprob": math.log(weights.get(value.strip('"'), 1e-9)),
                  "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in weights.items()]}
    return {"content": content}


@dataclass
class ScriptedJudge:
    """What the judge answers: ``script[marker]`` is a list of replies, one per call whose
    prompt holds the marker (the last one repeated): a dict (the verdict, as JSON), a
    ``str`` (the content as is), or a fault: ``"429"``, ``"500"``, ``("refusal", text)``,
    ``("logprobs", verdict, key, weights)``, ``("raw", body)``. Without a marker: ``default``."""

    script: dict[str, list[Any]] = field(default_factory=dict)
    default: Any = None
    no_structured: bool = False  # answer 400 to response_format, as some servers do
    no_logprobs: bool = False
    requests: list[Recorded] = field(default_factory=list)
    delay: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def prompt(self, req: Recorded) -> str:
        return "\n".join(m["content"] for m in req.body["messages"])

    def __call__(self, req: Recorded) -> Reply:
        body = req.body
        if self.no_structured and "response_format" in body:
            return 400, {}, {"error": {"message": "response_format json_schema is not supported"}}
        if self.no_logprobs and "logprobs" in body:
            return 400, {}, {"error": {"message": "logprobs are not supported by this model"}}
        with self._lock:
            self.requests.append(req)
            reply = self._next(self.prompt(req))
        if self.delay:
            import time

            time.sleep(self.delay)
        return self._reply(reply, body.get("model", "judge-model"))

    def _next(self, prompt: str) -> Any:
        for marker, replies in self.script.items():
            if marker in prompt:
                return replies.pop(0) if len(replies) > 1 else replies[0]
        return self.default

    def _reply(self, reply: Any, model: str) -> Reply:
        if reply in ("429", "500"):
            return int(reply), {"retry-after": "0.2"} if reply == "429" else {}, {"error": {"message": reply}}
        if isinstance(reply, tuple) and reply[0] == "raw":  # the whole body, as given
            return 200, {}, reply[1]
        if isinstance(reply, tuple) and reply[0] == "refusal":
            return 200, {}, completion(None, refusal=reply[1], model=model)
        if isinstance(reply, tuple) and reply[0] == "logprobs":
            _, verdict, key, weights = reply
            return 200, {}, completion(json.dumps(verdict), logprobs=with_logprobs(verdict, key, weights),
                                       model=model)
        content = reply if isinstance(reply, str) else json.dumps(reply)
        return 200, {}, completion(content, model=model)


@contextmanager
def judge_server(script: ScriptedJudge) -> Iterator[FakeServer]:
    with serve(script) as server:
        yield server
