"""A loopback model for sweeps: an OpenAI-compatible chat endpoint on 127.0.0.1 whose
models answer a question right or wrong by rule, after a fixed latency, counting the
calls in flight and when each one ran."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from patronus_tasks import Evaluator, Task, TaskResult, evaluator, task
from patronus_tasks.openai import as_messages, chat_completion, openai_endpoint

from .servers import Recorded, Reply, serve
from .servers import chat_completion as completion_body

#: Which question numbers each model gets right (the others it answers "no idea").
RIGHT = {"good": set(range(100)), "meh": set(range(100)) - {0, 1, 2, 3},
         "bad": {0, 1}, "polite": set(range(100))}


def rows(n: int) -> list[dict[str, str]]:
    return [{"sid": f"s{i}", "evaluated_model_input": f"question {i}",
             "evaluated_model_gold_answer": f"answer {i}"} for i in range(n)]


@dataclass
class Model:
    """The server's side: calls made (model, question, start, end) and the most at once."""

    latency: float = 0.0
    calls: list[tuple[str, int, float, float]] = field(default_factory=list)
    in_flight: int = 0
    most: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, req: Recorded) -> Reply:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        start = time.monotonic()
        time.sleep(self.latency)
        model = req.body["model"]
        number = int(req.body["messages"][-1]["content"].split()[-1])
        right = number in RIGHT.get(model, set())
        with self.lock:
            self.in_flight -= 1
            self.calls.append((model, number, start, time.monotonic()))
        body = completion_body(f"answer {number}" if right else "no idea", model)
        return 200, {}, body

    def count(self, model: str | None = None) -> int:
        return sum(1 for c in self.calls if model is None or c[0] == model)


@contextmanager
def loopback(latency: float = 0.0) -> Iterator[tuple[Model, Task]]:
    """The model server, and a task asking it with the variant's ``model``."""
    model = Model(latency)
    with serve(model) as server:
        endpoint = openai_endpoint(base_url=f"{server.url}/v1", api_key="test", max_in_flight=256)

        @task
        async def answer(evaluated_model_input: str, variant: Mapping[str, Any]) -> TaskResult:
            return await chat_completion(endpoint, as_messages(evaluated_model_input),
                                         model=variant.get("model", "good"))

        yield model, answer


@evaluator
def right(evaluated_model_output: str, evaluated_model_gold_answer: str) -> bool:
    return evaluated_model_output == evaluated_model_gold_answer


@evaluator
def says_answer(evaluated_model_output: str) -> bool:
    return evaluated_model_output.startswith("answer")


@evaluator
def graded(evaluated_model_output: str, variant: Mapping[str, Any]) -> bool:
    """A rubric chosen by the variant: strict wants a number, lenient any answer at all."""
    if variant.get("rubric") == "lenient":
        return bool(evaluated_model_output)
    return evaluated_model_output.split()[-1].isdigit()


def evaluators() -> list[Evaluator]:
    return [right]
