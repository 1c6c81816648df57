"""The Patronus SDK 0.1.x's evaluator adapters (``patronus.experiments.adapters``): how an
experiment calls each kind of evaluator, and each adapter as an evaluator step of this
package (`to_step`): one Prefect task run per call, its verdict a record."""

from __future__ import annotations

import inspect
from typing import Any

from patronus_tasks.datasets.datasets import Row
from patronus_tasks.define import steps as _steps
from patronus_tasks.define.row import Row as EngineRow
from patronus_tasks.evals.evaluators import (
    AsyncEvaluator,
    AsyncRemoteEvaluator,
    AsyncStructuredEvaluator,
    Evaluator,
    StructuredEvaluator,
)
from patronus_tasks.evals.types import EvaluationResult, coerce
from patronus_tasks.experiments.types import EvalParent, TaskResult, canonical_name, step_name


class BaseEvaluatorAdapter:
    """How an experiment calls one evaluator: ``transform`` the row, the link's task
    result and the parent into the evaluator's arguments, call it, read its verdict."""

    evaluator: Any

    @property
    def evaluator_id(self) -> str:
        raise NotImplementedError

    @property
    def criteria(self) -> str | None:
        raise NotImplementedError

    @property
    def weight(self) -> str | float | None:
        return getattr(self.evaluator, "weight", None)

    @property
    def canonical_name(self) -> str:
        return canonical_name(self.evaluator_id, self.criteria)

    @property
    def is_async(self) -> bool:
        return False

    def transform(self, row: Row, task_result: TaskResult | None, parent: EvalParent | None,
                  **kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
        return [], {"row": row, "task_result": task_result, "parent": parent, **kwargs}

    def call(self, row: Row, task_result: TaskResult | None, parent: EvalParent | None) -> Any:
        args, kwargs = self.transform(row, task_result, parent)
        return self._target()(*args, **kwargs)

    def _target(self) -> Any:
        raise NotImplementedError

    def evaluate(self, row: Row, task_result: TaskResult | None, parent: EvalParent | None,
                 **kwargs: Any) -> EvaluationResult | None:
        """One verdict, as the SDK's adapters give it (sync evaluators)."""
        return coerce(self.call(row, task_result, parent), self.evaluator_id)

    def source(self) -> Any:
        """What the cache versions this evaluator by (its code)."""
        return type(self.evaluator)


class EvaluatorAdapter(BaseEvaluatorAdapter):
    """An `Evaluator` (class) in an experiment: ``evaluate(row=, task_result=, parent=)``,
    or what your ``transform`` returns."""

    def __init__(self, evaluator: Evaluator) -> None:
        if not isinstance(evaluator, Evaluator):
            raise TypeError(f"EvaluatorAdapter takes an Evaluator, not {type(evaluator).__name__}")
        self.evaluator = evaluator

    @property
    def evaluator_id(self) -> str:
        return self.evaluator.get_evaluator_id()

    @property
    def criteria(self) -> str | None:
        return self.evaluator.get_criteria()

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.evaluator.evaluate)

    def _target(self) -> Any:
        return self.evaluator.evaluate


class StructuredEvaluatorAdapter(EvaluatorAdapter):
    """A `StructuredEvaluator` in an experiment: the row's fields by name, the task's
    output, metadata and context where the link's task ran (else the row's)."""

    def __init__(self, evaluator: StructuredEvaluator | AsyncStructuredEvaluator) -> None:
        if not isinstance(evaluator, StructuredEvaluator | AsyncStructuredEvaluator):
            raise TypeError("StructuredEvaluatorAdapter takes a StructuredEvaluator or an "
                            f"AsyncStructuredEvaluator, not {type(evaluator).__name__}")
        self.evaluator = evaluator

    def transform(self, row: Row, task_result: TaskResult | None, parent: EvalParent | None,
                  **kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
        return [], {
            "system_prompt": row.system_prompt,
            "task_context": task_result.context if task_result is not None else row.task_context,
            "task_attachments": row.task_attachments,
            "task_input": row.task_input,
            "task_output": task_result.output if task_result is not None else row.task_output,
            "gold_answer": row.gold_answer,
            "task_metadata": task_result.metadata if task_result is not None else row.task_metadata,
            **kwargs,
        }


class FuncEvaluatorAdapter(BaseEvaluatorAdapter):
    """An ``@evaluator`` function in an experiment (``weight=`` its share in a row's
    weighted score): called ``fn(row=, task_result=, parent=)``, or as your ``transform``
    says."""

    def __init__(self, fn: Any, weight: str | float | None = None) -> None:
        if isinstance(fn, _steps.Evaluator):  # `import patronus_tasks as patronus` code
            raise ValueError(
                f"{fn.name!r} is decorated with patronus_tasks.evaluator, the SDK 0.0.x "
                "decorator; FuncEvaluatorAdapter takes the SDK 0.1.x one: "
                "`from patronus_tasks.evals import evaluator` (or pass it, unadapted, to the "
                "0.0.x patronus_tasks.run_experiment / Client.experiment).")
        if not getattr(fn, "_pat_evaluator", False):
            raise ValueError(f"{getattr(fn, '__name__', fn)!r} is not an evaluator. Hint: add "
                             "@evaluator (from patronus_tasks.evals) to the function.")
        self.evaluator = fn
        self._weight = weight if weight is None else _steps.check_weight(
            weight, fn._pat_evaluator_id)
        self._given_weight = weight

    @property
    def evaluator_id(self) -> str:
        return str(self.evaluator._pat_evaluator_id)

    @property
    def criteria(self) -> str | None:
        criteria = self.evaluator._pat_criteria
        return None if criteria is None else str(criteria)

    @property
    def weight(self) -> str | float | None:
        return self._given_weight

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.evaluator)

    def _target(self) -> Any:
        return self.evaluator

    def source(self) -> Any:
        return inspect.unwrap(self.evaluator)


def adapted(value: Any) -> BaseEvaluatorAdapter:
    """An item of ``evaluators=`` as an adapter: adapters as they are, structured
    evaluators (remote ones too) wrapped; anything else is a `TypeError` saying the fix."""
    if isinstance(value, BaseEvaluatorAdapter):
        return value
    if isinstance(value, StructuredEvaluator | AsyncStructuredEvaluator):
        return StructuredEvaluatorAdapter(value)
    if getattr(value, "_pat_evaluator", False):
        raise TypeError(f"evaluator {value._pat_evaluator_id!r} is an @evaluator function: pass "
                        f"it as FuncEvaluatorAdapter({value.__name__}) in evaluators=[...]")
    if isinstance(value, Evaluator | AsyncEvaluator):
        raise TypeError(f"{type(value).__name__} is an Evaluator class: pass it as "
                        f"EvaluatorAdapter({type(value).__name__}(...)), or make it a "
                        "StructuredEvaluator")
    raise TypeError(f"{value!r} is not an evaluator: evaluators=[...] takes StructuredEvaluator "
                    "and RemoteEvaluator instances and adapters (FuncEvaluatorAdapter(fn), "
                    "EvaluatorAdapter(ev))")


#: Told after an evaluator id that one link has already: ``MatchEvaluator#2``.
SUFFIX = "#"


def told_apart(adapters: list[BaseEvaluatorAdapter]) -> list[str]:
    """The evaluator id of each of one link's adapters in the experiment: its own, the
    second and later with one step name (id and criteria) ``<id>#2``, ``<id>#3``... The
    SDK runs two evaluators of one class (an exact and a fuzzy ``MatchEvaluator``); here
    a step's name keys its records, verdict and series, so each needs its own."""
    ids, seen = [], set()
    for adapter in adapters:
        given = evaluator_id = adapter.evaluator_id
        n = 1
        while step_name(evaluator_id, adapter.criteria) in seen:
            n += 1
            evaluator_id = f"{given}{SUFFIX}{n}"
        seen.add(step_name(evaluator_id, adapter.criteria))
        ids.append(evaluator_id)
    return ids


def to_step(adapter: BaseEvaluatorAdapter, endpoint: Any = None,
            evaluator_id: str | None = None) -> _steps.Evaluator:
    """The adapter as this package's evaluator step, named `step_name` of its id (or
    ``evaluator_id``: `told_apart`'s) and criteria; a remote evaluator is this package's
    remote evaluator (on ``endpoint``: the experiment's ``api_key=``/``api_url=``, else
    `init`'s or the environment's)."""
    evaluator_id = evaluator_id or adapter.evaluator_id
    name = step_name(evaluator_id, adapter.criteria)
    weight = adapter.weight
    if isinstance(adapter.evaluator, AsyncRemoteEvaluator):
        remote = adapter.evaluator.engine_evaluator(name, endpoint)
        remote.weight = None if weight is None else _steps.check_weight(weight, name)
        return remote
    options = {"name": name, "criteria": adapter.criteria, "weight": weight,
               "version": _steps.source_hash(adapter.source(), adapter.canonical_name)}
    if adapter.is_async:
        async def judge_async(row: EngineRow, task_result: Any, parent: Any) -> Any:
            views = _views(row, task_result, parent)
            return _engine(coerce(await adapter.call(*views), evaluator_id))
        return _steps.FunctionEvaluator(judge_async, **options)

    def judge(row: EngineRow, task_result: Any, parent: Any) -> Any:
        return _engine(coerce(adapter.call(*_views(row, task_result, parent)), evaluator_id))
    return _steps.FunctionEvaluator(judge, **options)


def _engine(result: EvaluationResult | None) -> Any:
    return None if result is None else result.to_engine()


def _views(row: EngineRow, task_result: Any, parent: Any
           ) -> tuple[Row, TaskResult | None, EvalParent | None]:
    return Row(row), TaskResult.of_engine(task_result), EvalParent.of_engine(parent)
