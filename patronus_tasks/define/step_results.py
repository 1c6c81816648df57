"""What tasks and evaluators return, and how other return values are converted."""

from __future__ import annotations

import datetime as dt
import json
import math
import numbers
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from patronus_tasks.exceptions import InvalidResultError


def _check_json(value: dict[str, Any] | None, field: str) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{field} must be JSON-serialisable (dicts, lists, str, numbers, bool, None): {exc}"
        ) from None
    return value


def _check_tags(value: dict[str, Any] | None) -> dict[str, str] | None:
    if value is None:
        return None
    bad = {k: type(v).__name__ for k, v in value.items() if not isinstance(v, str)}
    if bad or not all(isinstance(k, str) for k in value):
        raise ValueError(f"tags must map str to str; non-str values: {bad}. Convert with str().")
    return dict(value)


class Usage(BaseModel):
    """What one model call used: its model and tokens, and its cost when the caller knows it.

    A task or evaluator that calls a model reports it on its result (``usage=``); this
    package's clients (`ChatTask`, `LLMJudge`, Patronus evaluators) do so themselves.
    ``cost_usd`` given here wins over the price table (`define.prices`); without it the
    cost is the tokens at the model's price, or unknown (never guessed).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    input_tokens: int | None = Field(default=None, ge=0)
    output_tokens: int | None = Field(default=None, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)
    #: Several models' calls summed (a judge panel, ``model`` "a+b"): each model's own,
    #: so each is priced at its price. Not stored: the files keep the sum.
    parts: tuple[Usage, ...] | None = Field(default=None, exclude=True, repr=False)

    @classmethod
    def of(cls, usage: dict[str, Any] | None, model: str | None) -> Usage | None:
        """An API answer's ``usage`` (OpenAI's ``prompt_tokens``/``completion_tokens``, or
        ``input_tokens``/``output_tokens`` as Anthropic and OpenAI's Responses API say)."""
        if not isinstance(usage, dict):
            return cls(model=model) if model else None
        def count(*names: str) -> int | None:
            found = next((usage[n] for n in names if isinstance(usage.get(n), int)), None)
            return None if isinstance(found, bool) else found
        return cls(model=model, input_tokens=count("prompt_tokens", "input_tokens"),
                   output_tokens=count("completion_tokens", "output_tokens"))


class TaskResult(BaseModel):
    """The output of a task for one row, with optional metadata and tags.

    A task may return a plain ``str``; it becomes ``TaskResult(evaluated_model_output=...)``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    evaluated_model_output: str | None = None
    metadata: dict[str, Any] | None = None
    tags: dict[str, str] | None = None
    evaluated_model_system_prompt: str | None = None
    evaluated_model_name: str | None = None
    evaluated_model_provider: str | None = None
    evaluated_model_params: dict[str, Any] | None = None
    evaluated_model_selected_model: str | None = None
    #: The context the task retrieved (a RAG task's passages), for the evaluators after it.
    evaluated_model_retrieved_context: list[str] | str | None = None
    #: Model and tokens of the call(s) this task made, if it reports them.
    usage: Usage | None = None

    @model_validator(mode="before")
    @classmethod
    def _named_output(cls, data: Any) -> Any:
        # Other tools call it `output`; pydantic alone would only say "extra inputs".
        if isinstance(data, dict) and "output" in data:
            raise ValueError("TaskResult takes the model's answer as evaluated_model_output=..., "
                             "not output=... (the Patronus SDK's name)")
        return data

    @field_validator("metadata", "evaluated_model_params", mode="before")
    @classmethod
    def _json_metadata(cls, v: Any, info: Any) -> Any:
        return _check_json(v, info.field_name)

    @field_validator("tags", mode="before")
    @classmethod
    def _str_tags(cls, v: Any) -> Any:
        return _check_tags(v)

    def model_info(self) -> dict[str, Any]:
        """The ``evaluated_model_*`` facts set on this result, for the metadata column."""
        keys = ("name", "provider", "params", "selected_model")
        return {
            f"evaluated_model_{k}": getattr(self, f"evaluated_model_{k}")
            for k in keys
            if getattr(self, f"evaluated_model_{k}") is not None
        }


class EvaluationResult(BaseModel):
    """The verdict of one evaluator on one row.

    ``pass_`` is written as ``pass`` when serialised. An evaluator may also return a
    ``bool`` (pass), a number (score), a ``str`` (text output) or ``None`` (skipped).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    pass_: bool | None = Field(default=None, alias="pass")
    score_raw: float | None = None
    text_output: str | None = None
    explanation: str | None = None
    metadata: dict[str, Any] | None = None
    tags: dict[str, str] | None = None
    evaluation_duration: dt.timedelta | None = None
    #: Model and tokens of the call(s) this evaluator made, if it reports them.
    usage: Usage | None = None

    @field_validator("metadata", mode="before")
    @classmethod
    def _json_metadata(cls, v: Any) -> Any:
        return _check_json(v, "metadata")

    @field_validator("tags", mode="before")
    @classmethod
    def _str_tags(cls, v: Any) -> Any:
        return _check_tags(v)

    @model_validator(mode="before")
    @classmethod
    def _sdk_names(cls, data: Any) -> Any:
        """``score=`` (the SDK 0.1.x's name) is ``score_raw``; an unknown name is said with
        the fields there are (pydantic's "Extra inputs are not permitted" named no fix)."""
        if not isinstance(data, dict):
            return data
        if "score" in data and data["score"] is None:  # SDK code passing every field
            data = {k: v for k, v in data.items() if k != "score"}
        if "score" in data:
            if data.get("score_raw") is not None:
                raise ValueError("give score_raw= or score= (the SDK 0.1.x's name), not both")
            data = {**{k: v for k, v in data.items() if k != "score"}, "score_raw": data["score"]}
        if not data.keys() <= _EVALUATION_NAMES:
            unknown = sorted(data.keys() - _EVALUATION_NAMES)
            raise ValueError(f"EvaluationResult has no field {', '.join(map(repr, unknown))}; "
                             f"its fields: pass_, {', '.join(f for f in cls.model_fields if f != 'pass_')}")
        return data

    @field_validator("score_raw", mode="before")
    @classmethod
    def _finite_score(cls, v: Any) -> Any:
        if isinstance(v, np.ndarray) and v.size == 1:  # an embedding's cosine
            v = float(v.reshape(-1)[0])
        if v is not None and isinstance(v, float) and math.isnan(v):
            raise ValueError("score_raw is NaN; return None for 'no score'")
        return v


_EVALUATION_NAMES = frozenset(EvaluationResult.model_fields) | {"pass"}


def to_task_result(value: Any) -> TaskResult | None:
    """Convert a task's return value; raise `InvalidResultError` for unsupported types."""
    if value is None or isinstance(value, TaskResult):
        return value
    if isinstance(value, str):
        return TaskResult(evaluated_model_output=value)
    raise InvalidResultError(
        f"a task must return str, TaskResult or None, not {type(value).__name__}"
    )


def to_evaluation_result(value: Any) -> EvaluationResult | None:
    """Convert an evaluator's return value; raise `InvalidResultError` for unsupported types."""
    if value is None or isinstance(value, EvaluationResult):
        return value
    if isinstance(value, np.ndarray) and value.size == 1:  # an embedding's cosine
        value = value.reshape(-1)[0]
    if isinstance(value, (bool, np.bool_)):
        return EvaluationResult(pass_=bool(value), score_raw=float(value))
    if isinstance(value, numbers.Real):
        return EvaluationResult(score_raw=float(value))
    if isinstance(value, str):
        return EvaluationResult(text_output=value)
    raise InvalidResultError(
        "an evaluator must return bool, a number, str, EvaluationResult or None, "
        f"not {type(value).__name__}"
    )


_MODEL_FACTS = ("name", "provider", "params", "selected_model")


def with_model_facts(result: TaskResult, values: dict[str, Any]) -> TaskResult:
    """``result`` with the row's ``meta_evaluated_model_*`` values (a Patronus dataset's
    columns) as the model facts it does not set itself."""
    update = {}
    for fact in _MODEL_FACTS:
        value = values.get(f"meta_evaluated_model_{fact}")
        if value is not None and getattr(result, f"evaluated_model_{fact}") is None:
            update[f"evaluated_model_{fact}"] = value
    return result.model_copy(update=update) if update else result
