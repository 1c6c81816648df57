"""`simple_task` and `simple_evaluator`: the Patronus SDK's one-line steps.

Code written for the SDK wraps plain functions with them (``simple_task(lambda q: ...)``,
``simple_evaluator(lambda output, gold: output == gold)``); they build the same
`FunctionTask` / `FunctionEvaluator` as ``@task`` and ``@evaluator``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from patronus_tasks.define.steps import FunctionEvaluator, FunctionTask


def _name(fn: Callable[..., Any], name: str | None, fallback: str) -> str:
    # A lambda has no name worth showing: the SDK calls it after the wrapper instead.
    found = name or getattr(fn, "__name__", None) or fallback
    return fallback if found == "<lambda>" else found


def simple_task(fn: Callable[[Any], Any], name: str | None = None) -> FunctionTask:
    """A task from a function of the row's ``evaluated_model_input`` (returning a str,
    a `TaskResult` or None), as the SDK's ``simple_task``."""

    def call(evaluated_model_input: Any) -> Any:
        return fn(evaluated_model_input)

    return FunctionTask(call, name=_name(fn, name, "simple_task"))


def simple_evaluator(fn: Callable[[Any, Any], Any], name: str | None = None) -> FunctionEvaluator:
    """An evaluator from a function of ``(output, gold_answer)``, as the SDK's
    ``simple_evaluator``: a bool is the verdict (score 1.0 or 0.0); any other value an
    evaluator may return (a number, str, `EvaluationResult`, None) is taken as such.

    ``output`` is the task's output, or the row's ``evaluated_model_output`` without a task.
    """

    def call(evaluated_model_output: Any, evaluated_model_gold_answer: Any) -> Any:
        return fn(evaluated_model_output, evaluated_model_gold_answer)

    return FunctionEvaluator(call, name=_name(fn, name, "simple_evaluator"))
