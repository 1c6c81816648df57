"""Chains: the ordered links of an experiment, and what a link sees of the links before it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from patronus_tasks.define.step_results import EvaluationResult, TaskResult
from patronus_tasks.define.steps import Evaluator, Task
from patronus_tasks.exceptions import ConfigError


@dataclass(frozen=True)
class Link:
    """One chain link: an optional task, then evaluators on its result."""

    task: Task | None
    evaluators: tuple[Evaluator, ...]


@dataclass(frozen=True)
class Parent:
    """The results of the previous chain link, passed to the next as ``parent``.

    ``task`` is that link's `TaskResult` (None if it had no task), ``evals`` maps each
    of its evaluators' names to its `EvaluationResult` (None when skipped or failed),
    and ``parent`` goes one link further up.
    """

    task: TaskResult | None
    evals: dict[str, EvaluationResult | None] = field(default_factory=dict)
    parent: Parent | None = None

    def find_eval_result(self, evaluator_or_name: Evaluator | str) -> EvaluationResult | None:
        """The result of the named evaluator in this link, or in the nearest earlier one."""
        name = evaluator_or_name if isinstance(evaluator_or_name, str) else evaluator_or_name.name
        node: Parent | None = self
        while node is not None:
            if name in node.evals:
                return node.evals[name]
            node = node.parent
        return None


class ChainLink(TypedDict, total=False):
    """One link of ``chain=`` (as the Patronus SDK takes it): its task, its evaluators."""

    task: Task | None
    evaluators: Sequence[Evaluator] | Evaluator | None


def _check_task(value: Any, where: str) -> Task | None:
    if value is None or isinstance(value, Task):
        return value
    raise ConfigError(f"{where}: task must be a @task function or a Task, not {type(value).__name__}.")


def _check_evaluators(values: Any, where: str) -> tuple[Evaluator, ...]:
    # One evaluator given where a list is expected is a list of one (as the Patronus SDK takes).
    values = [values] if isinstance(values, Evaluator) else list(values or [])
    for ev in values:
        if not isinstance(ev, Evaluator):
            raise ConfigError(
                f"{where}: {ev!r} is not an evaluator; decorate it with @evaluator "
                "or subclass Evaluator."
            )
    names = [ev.name for ev in values]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ConfigError(
            f"{where}: evaluator names {dups} appear more than once; give each a unique name= ."
        )
    return tuple(values)


def _link(spec: ChainLink, index: int) -> Link:
    where = f"chain link {index}"
    unknown = set(spec) - {"task", "evaluators"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; a link has 'task' and 'evaluators'.")
    link = Link(_check_task(spec.get("task"), where), _check_evaluators(spec.get("evaluators"), where))
    if link.task is None and not link.evaluators:
        raise ConfigError(f"{where} has neither a task nor evaluators; remove it or add one.")
    return link


def build_chain(task: Task | None, evaluators: Sequence[Evaluator] | Evaluator | None,
                chain: Sequence[ChainLink] | ChainLink | None) -> tuple[Link, ...]:
    """The experiment's links from either ``task``/``evaluators`` or ``chain``, never both."""
    if isinstance(chain, Mapping):  # one link given where a list is expected
        chain = [chain]
    if chain is not None:
        if task is not None or evaluators:
            raise ConfigError(
                "pass either task=/evaluators= or chain=, not both: put the task and "
                "evaluators in the chain's first link."
            )
        if not chain:
            raise ConfigError("chain is empty; give at least one {'task': ..., 'evaluators': [...]}.")
        return tuple(_link(spec, i) for i, spec in enumerate(chain))
    return (_link({"task": task, "evaluators": evaluators}, 0),)
