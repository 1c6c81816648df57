"""The result record: one per (sample, chain link, evaluator), and its Arrow schema.

The fixed columns are defined once here (`FIXED_SCHEMA`); the dataset's own columns
follow them. JSON-valued columns hold JSON text so any reader can load them.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from patronus_tasks.define.row import Sample
from patronus_tasks.define.step_results import EvaluationResult, TaskResult

STATUS_OK, STATUS_SKIPPED, STATUS_ERROR = "ok", "skipped", "error"

#: Column name, type and meaning of every fixed column, in file order.
COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("sid", pa.string(), "sample id: the dataset's `sid` column, or the 1-based row position"),
    ("link_index", pa.int32(), "0-based index of the chain link"),
    ("task_name", pa.string(), "name of the link's task; null for a taskless link"),
    ("evaluator_name", pa.string(), "evaluator name; null on a record with no evaluator run"),
    ("criteria", pa.string(), "the evaluator's criteria, if any"),
    ("status", pa.string(), "`ok`, `skipped` (task or evaluator returned None) or `error`"),
    ("error_stage", pa.string(), "`task` or `evaluator` when status is `error`, else null"),
    ("pass", pa.bool_(), "the evaluator's pass/fail verdict"),
    ("score", pa.float64(), "the evaluator's raw score"),
    ("text_output", pa.string(), "the evaluator's text output"),
    ("explanation", pa.string(), "the evaluator's explanation"),
    ("evaluation_duration_s", pa.float64(), "evaluator wall time in seconds (or as reported)"),
    ("task_duration_s", pa.float64(), "task wall time in seconds, retries included"),
    ("task_output", pa.string(), "the task's `evaluated_model_output`"),
    ("task_metadata", pa.string(), "JSON: the task result's metadata and evaluated_model_* facts"),
    ("task_tags", pa.string(), "JSON: the task result's tags"),
    ("evaluation_metadata", pa.string(), "JSON: the evaluation result's metadata"),
    ("evaluation_tags", pa.string(), "JSON: the evaluation result's tags"),
    ("task_attempts", pa.int32(), "calls made of the link's task (1 + retries used)"),
    ("evaluation_attempts", pa.int32(), "calls made of the evaluator (1 + retries used)"),
    ("error_type", pa.string(), "exception type of a failed step"),
    ("error_message", pa.string(), "exception message of a failed step"),
    ("error_traceback", pa.string(), "formatted traceback of a failed step"),
)
FIXED_SCHEMA = pa.schema([pa.field(name, typ) for name, typ, _ in COLUMNS])
FIXED_NAMES = frozenset(FIXED_SCHEMA.names)


@dataclass(frozen=True)
class ErrorInfo:
    """A failure recorded as data: exception type, message and traceback."""

    type: str
    message: str
    traceback: str = ""

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(type(exc).__name__, str(exc) or repr(exc), tb)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, default=str)


def dataset_column_name(column: str) -> str:
    """Where a dataset column goes in the file: its own name unless a fixed column has it."""
    return f"row_{column}" if column in FIXED_NAMES else column


def row_values(sample: Sample) -> dict[str, Any]:
    """The row's dataset columns, keyed by their column names in the file."""
    return {dataset_column_name(k): v for k, v in sample.values.items() if k != "sid"}


def task_fields(result: TaskResult | None, duration: float | None,
                attempts: int | None) -> dict[str, Any]:
    """The task columns of a record."""
    if result is None:
        return {"task_duration_s": duration, "task_attempts": attempts}
    metadata = {**result.model_info(), **(result.metadata or {})} or None
    return {
        "task_output": result.evaluated_model_output,
        "task_metadata": _json(metadata),
        "task_tags": _json(result.tags),
        "task_duration_s": duration,
        "task_attempts": attempts,
    }


def evaluation_fields(result: EvaluationResult | None, duration: float | None) -> dict[str, Any]:
    """The evaluator columns of a record."""
    if result is None:
        return {"evaluation_duration_s": duration}
    reported = result.evaluation_duration
    return {
        "pass": result.pass_,
        "score": result.score_raw,
        "text_output": result.text_output,
        "explanation": result.explanation,
        "evaluation_metadata": _json(result.metadata),
        "evaluation_tags": _json(result.tags),
        "evaluation_duration_s": reported.total_seconds() if reported is not None else duration,
    }


def error_fields(error: ErrorInfo | None, stage: str) -> dict[str, Any]:
    """The status and error columns of a record."""
    if error is None:
        return {}
    return {
        "status": STATUS_ERROR,
        "error_stage": stage,
        "error_type": error.type,
        "error_message": error.message,
        "error_traceback": error.traceback,
    }
