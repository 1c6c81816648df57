"""One evaluation outside an experiment (`Client.evaluate`), as the SDK's ``evaluate``.

A registered local evaluator is called with every ``evaluated_model_*`` keyword (and
``tags``, ``explain_strategy``); anything else is a Patronus evaluator, scored with
``POST /v1/evaluate``.
"""

from __future__ import annotations

import datetime as dt
import inspect
import time
from collections.abc import Callable
from typing import Any

from patronus_tasks.define.step_results import EvaluationResult, to_evaluation_result
from patronus_tasks.exceptions import InvalidResultError
from patronus_tasks.http import Endpoint
from patronus_tasks.patronus.evaluators import (
    context_list,
    evaluate_payload,
    parse_evaluation,
    post_evaluate,
)

#: What ``Client.evaluate`` passes on (the SDK's keywords).
FIELDS = ("evaluated_model_system_prompt", "evaluated_model_retrieved_context",
          "evaluated_model_input", "evaluated_model_output", "evaluated_model_gold_answer",
          "evaluated_model_attachments")
#: Request keywords sent to ``POST /v1/evaluate`` as they are.
REQUEST_EXTRAS = ("app", "experiment_id", "dataset_id", "dataset_sample_id", "capture")


async def evaluate_remote(endpoint: Endpoint, evaluator: str, criteria: str | None, *,
                          fields: dict[str, Any], tags: dict[str, str] | None,
                          explain_strategy: str, extras: dict[str, Any]) -> EvaluationResult:
    """One evaluation by a Patronus evaluator."""
    payload = evaluate_payload(evaluator, criteria, explain_strategy, tags=tags, **fields)
    payload.update({k: v for k, v in extras.items() if v is not None})
    body, attempts = await post_evaluate(endpoint, payload)
    return parse_evaluation(body, attempts)


async def evaluate_local(name: str, fn: Callable[..., Any], *, fields: dict[str, Any],
                         tags: dict[str, str] | None,
                         explain_strategy: str) -> EvaluationResult | None:
    """One evaluation by a registered local function; its duration measured unless given."""
    started = time.perf_counter()
    value = fn(**fields, tags=tags, explain_strategy=explain_strategy)
    if inspect.isawaitable(value):
        value = await value
    try:
        result = to_evaluation_result(value)
    except InvalidResultError as exc:
        raise InvalidResultError(f"local evaluator {name!r}: {exc}") from None
    if result is None or result.evaluation_duration is not None:
        return result
    elapsed = dt.timedelta(seconds=time.perf_counter() - started)
    return result.model_copy(update={"evaluation_duration": elapsed})


def export_body(name: str, result: EvaluationResult, fields: dict[str, Any],
                tags: dict[str, str] | None, extras: dict[str, Any]) -> dict[str, Any]:
    """A local evaluation as ``POST /v1/evaluation-results/batch`` takes it."""
    duration = result.evaluation_duration
    entry = {
        "evaluator_id": name, "criteria": None,
        **{k: v for k, v in fields.items() if k != "evaluated_model_attachments"},
        "evaluated_model_retrieved_context": context_list(
            fields.get("evaluated_model_retrieved_context")),
        "pass": result.pass_, "score_raw": result.score_raw,
        "text_output": result.text_output, "explanation": result.explanation,
        "evaluation_duration": None if duration is None else f"PT{duration.total_seconds():.6f}S",
        "evaluation_metadata": result.metadata,
        "tags": {**(tags or {}), **(result.tags or {})},
        **{k: extras.get(k) for k in ("app", "experiment_id", "dataset_id", "dataset_sample_id")},
    }
    return {"evaluation_results": [entry]}
