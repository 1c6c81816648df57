"""The Patronus SDK 0.1.x's evaluators (``patronus.evals``): the ``@evaluator`` decorator,
`Evaluator` and `StructuredEvaluator` classes (sync and async), `RemoteEvaluator`.

They are the SDK's objects, callable as in the SDK; an experiment of
`patronus_tasks.experiments` turns each (through its adapter) into an evaluator step of
this package: one Prefect task run per call, its verdict a record of the results.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, overload

from patronus_tasks.define.steps import check_weight
from patronus_tasks.evals.types import EvaluationResult

F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger("patronus_tasks.evals")


def _marked(fn: Callable[..., Any], evaluator_id: str | None, criteria: str | None) -> Any:
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run(*args: Any, **kwargs: Any) -> Any:
            return await fn(*args, **kwargs)
        wrapper: Any = run
    else:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)
        wrapper = call
    wrapper._pat_evaluator = True
    wrapper._pat_evaluator_id = evaluator_id or fn.__name__
    wrapper._pat_criteria = criteria
    return wrapper


@overload
def evaluator(fn: F, /) -> F: ...
@overload
def evaluator(*, evaluator_id: str | None = None, criteria: str | None = None,
              **options: Any) -> Callable[[F], F]: ...
def evaluator(fn: Callable[..., Any] | None = None, /, *, evaluator_id: str | None = None,
              criteria: str | None = None, **options: Any) -> Any:
    """Mark a function as an evaluator (``@evaluator`` or ``@evaluator(evaluator_id=...,
    criteria=...)``): it stays callable with its own signature; in an experiment it goes
    in ``FuncEvaluatorAdapter(fn)``. The SDK's tracing options (``metric_name``,
    ``span_name``, ``log_none_arguments``...) are accepted and change nothing here."""
    if fn is not None:
        return _marked(fn, evaluator_id, criteria)
    return lambda f: _marked(f, evaluator_id, criteria)


class Evaluator:
    """An evaluator class (``evaluate`` as you write it, any signature); in an experiment
    it goes in ``EvaluatorAdapter(MyEvaluator())``. ``evaluator_id`` and ``criteria``
    (class attributes) name it; ``weight=`` is its share in a row's weighted score."""

    evaluator_id: str | None = None
    criteria: str | None = None

    def __init__(self, weight: str | float | None = None) -> None:
        if weight is not None:  # checked now; kept as given, as the SDK keeps it
            check_weight(weight, self.get_evaluator_id())
        self.weight = weight

    def evaluate(self, *args: Any, **kwargs: Any) -> EvaluationResult | None:
        raise NotImplementedError(f"{type(self).__name__} must define evaluate()")

    def get_evaluator_id(self) -> str:
        return self.evaluator_id or type(self).__qualname__

    def get_criteria(self) -> str | None:
        return self.criteria

    @property
    def canonical_name(self) -> str:
        return f"{self.get_evaluator_id()}:{self.get_criteria() or ''}"


class AsyncEvaluator(Evaluator):
    """`Evaluator` whose ``evaluate`` is ``async``."""

    async def evaluate(self, *args: Any, **kwargs: Any) -> EvaluationResult | None:  # type: ignore[override]
        raise NotImplementedError(f"{type(self).__name__} must define evaluate()")


class StructuredEvaluator(Evaluator):
    """An evaluator given the row's fields by name: ``evaluate(self, *, system_prompt,
    task_context, task_attachments, task_input, task_output, gold_answer, task_metadata,
    **kwargs)`` returning an `EvaluationResult`. Goes straight into ``evaluators=``."""

    def evaluate(self, *, system_prompt: str | None = None, task_context: Any = None,
                 task_attachments: Any = None, task_input: str | None = None,
                 task_output: str | None = None, gold_answer: str | None = None,
                 task_metadata: dict[str, Any] | None = None,
                 **kwargs: Any) -> EvaluationResult:
        raise NotImplementedError(f"{type(self).__name__} must define evaluate()")


class AsyncStructuredEvaluator(AsyncEvaluator):
    """`StructuredEvaluator` whose ``evaluate`` is ``async``."""

    async def evaluate(self, *, system_prompt: str | None = None,  # type: ignore[override]
                       task_context: Any = None, task_attachments: Any = None,
                       task_input: str | None = None, task_output: str | None = None,
                       gold_answer: str | None = None,
                       task_metadata: dict[str, Any] | None = None,
                       **kwargs: Any) -> EvaluationResult:
        raise NotImplementedError(f"{type(self).__name__} must define evaluate()")


class AsyncRemoteEvaluator(AsyncStructuredEvaluator):
    """A Patronus evaluator (``judge``, ``pii``, ``lynx``...) with a criteria, scored by the
    Patronus API (``PATRONUS_API_KEY``, ``PATRONUS_API_URL``, or `patronus_tasks.init`'s).
    In an experiment it is this package's `patronus.RemoteEvaluator`: looked up before the
    first row, then one ``POST /v1/evaluate`` per row."""

    def __init__(self, evaluator_id_or_alias: str, criteria: str | None = None, *,
                 tags: dict[str, str] | None = None, explain_strategy: str = "always",
                 criteria_config: dict[str, Any] | None = None, allow_update: bool = False,
                 max_attempts: int = 3, api_: Any = None, weight: str | float | None = None,
                 retry_max_attempts: int = 3, retry_initial_delay: float = 1,
                 retry_backoff_factor: float = 2) -> None:
        self.evaluator_id_or_alias, self.remote_criteria = evaluator_id_or_alias, criteria
        self.tags, self.explain_strategy = tags, explain_strategy
        self.criteria_config, self.allow_update = criteria_config, allow_update
        self.max_attempts = max(max_attempts, retry_max_attempts)
        super().__init__(weight=weight)

    def get_evaluator_id(self) -> str:
        return self.evaluator_id_or_alias

    def get_criteria(self) -> str | None:
        return self.remote_criteria

    def engine_evaluator(self, name: str, endpoint: Any = None) -> Any:
        """This package's remote evaluator, named ``name``, on ``endpoint`` (None: the
        one `init` or the environment configures)."""
        from patronus_tasks.patronus.evaluators import RemoteEvaluator as Remote
        from patronus_tasks.tracing import patronus_endpoint_of_init

        return Remote(self.evaluator_id_or_alias, self.remote_criteria,
                      criteria_config=self.criteria_config, allow_update=self.allow_update,
                      explain_strategy=self.explain_strategy, name=name,
                      endpoint=endpoint or patronus_endpoint_of_init(self.max_attempts))

    async def evaluate(self, *, system_prompt: str | None = None,  # type: ignore[override]
                       task_context: Any = None, task_attachments: Any = None,
                       task_input: str | None = None, task_output: str | None = None,
                       gold_answer: str | None = None,
                       task_metadata: dict[str, Any] | None = None,
                       **kwargs: Any) -> EvaluationResult:
        remote = self.engine_evaluator(self.get_evaluator_id())
        try:
            result = await remote.evaluate(
                tags=self.tags, evaluated_model_system_prompt=system_prompt,
                evaluated_model_retrieved_context=task_context, evaluated_model_input=task_input,
                evaluated_model_output=task_output, evaluated_model_gold_answer=gold_answer)
        finally:
            await remote.aclose()
        return EvaluationResult.of_engine(result)


class RemoteEvaluator(AsyncRemoteEvaluator):
    """`AsyncRemoteEvaluator` called without ``await`` (``.evaluate(...)`` blocks)."""

    def evaluate(self, **fields: Any) -> EvaluationResult:  # type: ignore[override]
        return asyncio.run(super().evaluate(**fields))


@contextlib.contextmanager
def bundled_eval(span_name: str = "Evaluation bundle", attributes: dict[str, str] | None = None
                 ) -> Iterator[None]:
    """Evaluations run together (the SDK opens one span for them): here the block is
    logged with how long it took, in the log of the task run it runs in."""
    start = time.perf_counter()
    try:
        yield
    finally:
        logger.info("%s took %.3f s%s", span_name, time.perf_counter() - start,
                    f" {attributes}" if attributes else "")
