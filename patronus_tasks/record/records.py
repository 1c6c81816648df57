"""The result record: one per (sample, chain link, evaluator), and its Arrow schema.

The fixed columns are defined once here, as the fields of `Record` (`COLUMNS` and
`FIXED_SCHEMA` follow from them); the dataset's own columns follow them in the file.
JSON-valued columns hold JSON text so any reader can load them.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import pyarrow as pa

from patronus_tasks.define.row import Sample
from patronus_tasks.define.step_results import EvaluationResult, TaskResult, Usage
from patronus_tasks.exceptions import UNSCORED_ERRORS, JudgeError
from patronus_tasks.trace.spans import SpanData

STATUS_OK, STATUS_SKIPPED, STATUS_ERROR = "ok", "skipped", "error"

def _column(typ: pa.DataType, meaning: str, name: str | None = None) -> dict[str, Any]:
    return {"type": typ, "meaning": meaning, "name": name}


@dataclass(slots=True)
class Record:
    """One record of the results: one per (sample, chain link, evaluator).

    Its fields are the file's fixed columns, in file order (`COLUMNS` and the schema are
    derived from them: the one definition); ``row`` holds the dataset's columns, keyed by
    their names in the file. Dicts only at the file boundary: `to_row` / `from_row`.
    """

    sid: str = field(metadata=_column(pa.string(),
        "sample id: the dataset's `sid` column, or the 1-based row position"))
    link_index: int | None = field(default=None, metadata=_column(
        pa.int32(), "0-based index of the chain link"))
    repeat: int | None = field(default=None, metadata=_column(
        pa.int32(), "which run of the row, 1 to N, with `repeats=N` (N > 1); null without repeats"))
    task_name: str | None = field(default=None, metadata=_column(
        pa.string(), "name of the link's task; null for a taskless link"))
    evaluator_name: str | None = field(default=None, metadata=_column(
        pa.string(), "evaluator name; null on a record with no evaluator run"))
    criteria: str | None = field(default=None, metadata=_column(
        pa.string(), "the evaluator's criteria, if any"))
    weight: float | None = field(default=None, metadata=_column(
        pa.float64(), "the evaluator's weight in the row's weighted score (`weight=`), if any"))
    status: str = field(default=STATUS_OK, metadata=_column(pa.string(),
        "`ok`, `skipped` (task or evaluator returned None) or `error`"))
    error_stage: str | None = field(default=None, metadata=_column(
        pa.string(), "`task` or `evaluator` when status is `error`, else null"))
    pass_: bool | None = field(default=None, metadata=_column(
        pa.bool_(), "the evaluator's pass/fail verdict", name="pass"))
    score: float | None = field(default=None, metadata=_column(
        pa.float64(), "the evaluator's raw score"))
    text_output: str | None = field(default=None, metadata=_column(
        pa.string(), "the evaluator's text output"))
    explanation: str | None = field(default=None, metadata=_column(
        pa.string(), "the evaluator's explanation"))
    evaluation_duration_s: float | None = field(default=None, metadata=_column(
        pa.float64(), "evaluator wall time in seconds (or as reported)"))
    task_duration_s: float | None = field(default=None, metadata=_column(
        pa.float64(), "task wall time in seconds, retries included"))
    task_output: str | None = field(default=None, metadata=_column(
        pa.string(), "the task's `evaluated_model_output`"))
    task_metadata: str | None = field(default=None, metadata=_column(
        pa.string(), "JSON: the task result's metadata and evaluated_model_* facts"))
    task_tags: str | None = field(default=None, metadata=_column(
        pa.string(), "JSON: the task result's tags"))
    evaluation_metadata: str | None = field(default=None, metadata=_column(
        pa.string(), "JSON: the evaluation result's metadata"))
    evaluation_tags: str | None = field(default=None, metadata=_column(
        pa.string(), "JSON: the evaluation result's tags"))
    task_attempts: int | None = field(default=None, metadata=_column(
        pa.int32(), "calls made of the link's task (1 + retries used)"))
    evaluation_attempts: int | None = field(default=None, metadata=_column(
        pa.int32(), "calls made of the evaluator (1 + retries used)"))
    host: str | None = field(default=None, metadata=_column(
        pa.string(), "the host the row ran on (its hostname): a Dask or Prefect worker's, or "
        "the experiment's own"))
    task_model: str | None = field(default=None, metadata=_column(
        pa.string(), "the model the task's call used, as its `usage` says"))
    task_input_tokens: int | None = field(default=None, metadata=_column(
        pa.int64(), "input (prompt) tokens of the task's call"))
    task_output_tokens: int | None = field(default=None, metadata=_column(
        pa.int64(), "output (completion) tokens of the task's call"))
    task_cost_usd: float | None = field(default=None, metadata=_column(
        pa.float64(), "what the task's call cost in USD: 0 when cached, null when its price is "
        "unknown"))
    task_cached: bool | None = field(default=None, metadata=_column(
        pa.bool_(), "the task's result came from the cache: no call made"))
    evaluation_model: str | None = field(default=None, metadata=_column(
        pa.string(), "the model the evaluator's call used, as its `usage` says"))
    evaluation_input_tokens: int | None = field(default=None, metadata=_column(
        pa.int64(), "input (prompt) tokens of the evaluator's call"))
    evaluation_output_tokens: int | None = field(default=None, metadata=_column(
        pa.int64(), "output (completion) tokens of the evaluator's call"))
    evaluation_cost_usd: float | None = field(default=None, metadata=_column(
        pa.float64(), "what the evaluator's call cost in USD: 0 when cached, null when its price "
        "is unknown"))
    evaluation_cached: bool | None = field(default=None, metadata=_column(
        pa.bool_(), "the evaluator's result came from the cache: no call made"))
    error_type: str | None = field(default=None, metadata=_column(
        pa.string(), "exception type of a failed step"))
    error_message: str | None = field(default=None, metadata=_column(
        pa.string(), "exception message of a failed step"))
    error_traceback: str | None = field(default=None, metadata=_column(
        pa.string(), "formatted traceback of a failed step"))
    task_spans: str | None = field(default=None, metadata=_column(
        pa.string(), "JSON: the spans recorded inside the task's call (model and tool calls: "
        "`spans.parquet` has them a row each); null when it opened none"))
    task_started_at: float | None = field(default=None, metadata=_column(
        pa.float64(), "when the task's call started, in seconds since the epoch (UTC); null when "
        "none was made (the cache answered); a row kept from the run it resumes keeps that "
        "run's time"))
    evaluation_started_at: float | None = field(default=None, metadata=_column(
        pa.float64(), "when the evaluator's call started, in seconds since the epoch (UTC); null "
        "when none was made"))
    evaluation_spans: str | None = field(default=None, metadata=_column(
        pa.string(), "JSON: the spans recorded inside the evaluator's call (a judge's model "
        "call); null when it opened none"))
    row: dict[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        """The record as one row of the file: fixed columns, then the dataset's."""
        values = {name: getattr(self, attr) for attr, name in _ATTRS}
        values.update(self.row)
        return values

    @classmethod
    def from_row(cls, values: dict[str, Any]) -> Record:
        """A row read back from the file (or a journal) as a record."""
        fixed: dict[str, Any] = {attr: values.get(name) for attr, name in _ATTRS}
        fixed["status"] = fixed["status"] or STATUS_OK
        row = {k: v for k, v in values.items() if k not in FIXED_NAMES}
        return cls(**fixed, row=row)


_FIELDS = [f for f in fields(Record) if f.metadata]
#: (attribute, column name) of every fixed column, in file order.
_ATTRS: tuple[tuple[str, str], ...] = tuple((f.name, f.metadata["name"] or f.name) for f in _FIELDS)
#: Column name, type and meaning of every fixed column, in file order (from `Record`).
COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = tuple(
    (name, f.metadata["type"], f.metadata["meaning"]) for (_, name), f in zip(_ATTRS, _FIELDS, strict=True))
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
        name, message = type(exc).__name__, str(exc) or repr(exc)
        if isinstance(exc, JudgeError) and name not in UNSCORED_ERRORS:
            # The files know an unscored row by its error's type name: a subclass of the
            # user's own is filed as a JudgeError, its own name first in the message.
            name, message = "JudgeError", f"{name}: {message}"
        return cls(name, message, tb)


def _json(value: object) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, default=str)


def dataset_column_name(column: str) -> str:
    """Where a dataset column goes in the file: its own name unless a fixed column has it."""
    return f"row_{column}" if column in FIXED_NAMES else column


def row_values(sample: Sample) -> dict[str, Any]:
    """The row's dataset columns, keyed by their column names in the file."""
    return {dataset_column_name(k): v for k, v in sample.values.items() if k != "sid"}


class Paid(NamedTuple):
    """What a call cost (None: unknown) and whether the cache answered it (then: nothing).
    A tuple: one is made per call."""

    cost_usd: float | None = None
    cached: bool = False
    #: What its own model spans used, when its result says no usage (a task that failed
    #: after model calls: an agent out of budget; a user's ``span(kind="llm", ...)``).
    spent: Usage | None = None


def spent_by(spans: list[SpanData] | None) -> Usage | None:
    """The usage of a call's model (``llm``) spans, summed: their models joined with
    ``+``, their cost the sum of theirs (unknown if one's is). None without one."""
    calls = [s for s in spans or () if s.kind == "llm" and s.input_tokens is not None]
    if not calls:
        return None
    costs = [s.cost for s in calls]
    return Usage(model="+".join(sorted({s.model for s in calls if s.model})) or None,
                 input_tokens=sum(s.input_tokens or 0 for s in calls),
                 output_tokens=sum(s.output_tokens or 0 for s in calls),
                 cost_usd=None if any(c is None for c in costs) else sum(c or 0.0 for c in costs))


def usage_fields(stage: str, usage: Usage | None, paid: Paid | None) -> dict[str, Any]:
    """The ``<stage>_model``, tokens, cost and cached columns of a call (``paid``: None
    when no call was made or answered)."""
    if paid is None:
        return {}
    fields: dict[str, Any] = {f"{stage}_cached": paid.cached, f"{stage}_cost_usd": paid.cost_usd}
    usage = usage if usage is not None else paid.spent
    if usage is not None:
        fields.update({f"{stage}_model": usage.model, f"{stage}_input_tokens": usage.input_tokens,
                       f"{stage}_output_tokens": usage.output_tokens})
    return fields


def task_fields(result: TaskResult | None, duration: float | None,
                attempts: int | None, paid: Paid | None = None) -> dict[str, Any]:
    """The task columns of a record."""
    if result is None:
        return {"task_duration_s": duration, "task_attempts": attempts,
                **usage_fields("task", None, paid)}
    metadata = {**result.model_info(), **(result.metadata or {})} or None
    return {
        "task_output": result.evaluated_model_output,
        "task_metadata": _json(metadata),
        "task_tags": _json(result.tags),
        "task_duration_s": duration,
        "task_attempts": attempts,
        **usage_fields("task", result.usage, paid),
    }


def evaluation_fields(result: EvaluationResult | None, duration: float | None,
                      paid: Paid | None = None) -> dict[str, Any]:
    """The evaluator columns of a record."""
    if result is None:
        return {"evaluation_duration_s": duration, **usage_fields("evaluation", None, paid)}
    reported = result.evaluation_duration
    return {
        **usage_fields("evaluation", result.usage, paid),
        "pass_": result.pass_,
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
