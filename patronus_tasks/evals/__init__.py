"""The Patronus SDK 0.1.x's ``patronus.evals`` (and the evaluator names it has at the top
of ``patronus``), here: ``from patronus_tasks.evals import evaluator, StructuredEvaluator,
RemoteEvaluator, EvaluationResult``.

May import: `define`, `patronus` (remote evaluators), `tracing` and the ground modules.
"""

from patronus_tasks.evals.evaluators import (
    AsyncEvaluator,
    AsyncRemoteEvaluator,
    AsyncStructuredEvaluator,
    Evaluator,
    RemoteEvaluator,
    StructuredEvaluator,
    bundled_eval,
    evaluator,
)
from patronus_tasks.evals.types import EvaluationResult

__all__ = ["AsyncEvaluator", "AsyncRemoteEvaluator", "AsyncStructuredEvaluator",
           "EvaluationResult", "Evaluator", "RemoteEvaluator", "StructuredEvaluator",
           "bundled_eval", "evaluator"]
