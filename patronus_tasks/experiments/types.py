"""The Patronus SDK 0.1.x's task result and chain parent (``patronus.experiments.types``):
`TaskResult`, `EvalParent`, `EvalsMap`, as views of this package's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from patronus_tasks.define import chain as _chain
from patronus_tasks.define import step_results as _ours
from patronus_tasks.evals.types import EvaluationResult


class TaskResult(BaseModel):
    """What a task returns in the SDK's terms: its ``output``, and optionally
    ``metadata``, ``tags`` (added to this link's evaluations) and ``context`` (what it
    retrieved: the structured evaluators after it read it as ``task_context``)."""

    model_config = ConfigDict(extra="forbid")

    output: str | None = None
    metadata: dict[str, Any] | None = None
    tags: dict[str, str] | None = None
    context: list[str] | str | None = None

    def to_engine(self) -> _ours.TaskResult:
        return _ours.TaskResult(evaluated_model_output=self.output, metadata=self.metadata,
                                tags=self.tags, evaluated_model_retrieved_context=self.context)

    @classmethod
    def of_engine(cls, result: _ours.TaskResult | None) -> TaskResult | None:
        if result is None:
            return None
        return cls(output=result.evaluated_model_output, metadata=result.metadata,
                   tags=result.tags, context=result.evaluated_model_retrieved_context)


def canonical_name(evaluator_id: str, criteria: str | None) -> str:
    """How the SDK keys an evaluator's results: ``"<evaluator_id>:<criteria or ''>"``."""
    return f"{evaluator_id}:{criteria or ''}"


def step_name(evaluator_id: str, criteria: str | None) -> str:
    """The name of an evaluator's step (its task runs ``<name>-<sid>``, its results'
    ``evaluator_name``): ``<evaluator_id>``, or ``<evaluator_id>:<criteria>``."""
    return f"{evaluator_id}:{criteria}" if criteria else evaluator_id


class EvalsMap(dict[str, EvaluationResult | None]):
    """A link's evaluation results by canonical name (``"judge:coherence"``,
    ``"iexact_match:"``); ``get`` also takes an evaluator or adapter."""

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(_key(key), default)

    def __contains__(self, key: object) -> bool:
        return super().__contains__(_key(key))

    def __getitem__(self, key: Any) -> EvaluationResult | None:
        return super().__getitem__(_key(key))


def _key(key: Any) -> Any:
    if isinstance(key, str):
        return key if ":" in key else f"{key}:"
    return getattr(key, "canonical_name", key)


@dataclass(frozen=True)
class EvalParent:
    """The previous chain link's results, as the SDK's tasks and evaluators get them:
    ``parent.task.output``, ``parent.evals["judge:coherence"]``, ``parent.parent``."""

    task: TaskResult | None
    evals: EvalsMap | None
    parent: EvalParent | None = None

    def find_eval_result(self, evaluator_or_name: Any) -> EvaluationResult | None:
        """The result of that evaluator in this link, or (while a link has none) further up."""
        node: EvalParent | None = self
        while node is not None:
            if node.evals:
                return node.evals.get(evaluator_or_name)
            node = node.parent
        return None

    @classmethod
    def of_engine(cls, parent: _chain.Parent | None) -> EvalParent | None:
        if parent is None:
            return None
        evals = EvalsMap({_key(name): None if r is None else EvaluationResult.of_engine(r)
                          for name, r in parent.evals.items()})
        return cls(TaskResult.of_engine(parent.task), evals, cls.of_engine(parent.parent))
