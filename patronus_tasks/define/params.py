"""Argument injection: which parameters a task or evaluator may ask for, and their values.

Tasks and evaluators declare what they need by parameter *name*; the framework passes
exactly those. Checking the names when the decorator runs turns a typo into an
immediate error rather than a failure on every row.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from patronus_tasks.exceptions import ConfigError

#: Parameters filled from the row's well-known columns.
ROW_FIELDS = (
    "evaluated_model_gold_answer",
    "evaluated_model_input",
    "evaluated_model_output",
    "evaluated_model_retrieved_context",
    "evaluated_model_system_prompt",
)
#: ``variant``: a sweep's cell, its parameter values (`define.variant`; empty outside one).
TASK_PARAMS = tuple(sorted((*ROW_FIELDS, "parent", "row", "tags", "variant")))
#: ``trace``: the task's spans (`trace.Trace`): its model and tool calls, for trajectory
#: evaluators.
EVALUATOR_PARAMS = tuple(sorted((*TASK_PARAMS, "task_result", "trace")))


@dataclass(frozen=True)
class Signature:
    """The injectable parameters of one callable."""

    names: tuple[str, ...]
    required: frozenset[str]


def inspect_params(fn: Callable[..., Any], allowed: tuple[str, ...], owner: str) -> Signature:
    """Check ``fn``'s parameters against ``allowed``; raise `ConfigError` naming any other."""
    params = inspect.signature(fn).parameters.values()
    names: list[str] = []
    required: set[str] = set()
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            return Signature(allowed, frozenset(required))
        if p.kind is p.VAR_POSITIONAL:
            continue
        if p.name not in allowed:
            raise ConfigError(
                f"{owner} has a parameter {p.name!r} that cannot be injected. "
                f"Parameters are passed by name; allowed names are: {', '.join(allowed)}. "
                f"Rename it, give it a default and read it from `row`, or use **kwargs."
            )
        names.append(p.name)
        if p.default is p.empty:
            required.add(p.name)
    return Signature(tuple(names), frozenset(required))


def build_kwargs(sig: Signature, available: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments for one call: each declared name from ``available``."""
    return {name: available.get(name) for name in sig.names}
