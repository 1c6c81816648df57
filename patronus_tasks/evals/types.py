"""The Patronus SDK 0.1.x's `EvaluationResult` (``patronus.evals.types``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from patronus_tasks.define import step_results as _ours
from patronus_tasks.exceptions import InvalidResultError


class EvaluationResult(BaseModel):
    """An evaluator's verdict on one row, in the SDK's terms: ``score``, ``pass_``,
    ``text_output``, ``metadata``, ``explanation``, ``tags``...

    Unknown fields are ignored, as in the SDK, except ``score_raw`` (this package's and
    the Patronus API's name), read as ``score`` where the SDK silently dropped it. A
    numpy number, or an array holding one number (a cosine similarity of two
    embeddings), is that number.
    """

    model_config = ConfigDict(extra="ignore", arbitrary_types_allowed=True)

    score: float | None = None
    pass_: bool | None = None
    text_output: str | None = None
    metadata: dict[str, Any] | None = None
    explanation: str | None = None
    tags: dict[str, str] | None = None
    dataset_id: str | None = None
    dataset_sample_id: str | None = None
    evaluation_duration: dt.timedelta | None = None
    explanation_duration: dt.timedelta | None = None

    @model_validator(mode="before")
    @classmethod
    def _score_raw(cls, data: Any) -> Any:
        if isinstance(data, dict) and "score_raw" in data and data.get("score") is None:
            data = {**data, "score": data["score_raw"]}
        return data

    @field_validator("score", mode="before")
    @classmethod
    def _one_number(cls, v: Any) -> Any:
        return _unwrapped(v, float)

    @field_validator("pass_", mode="before")
    @classmethod
    def _one_bool(cls, v: Any) -> Any:
        return _unwrapped(v, bool)

    def format(self) -> str:
        """The result as a few lines of text."""
        fields = self.model_dump(exclude_none=True)
        return "\n".join(f"{k}: {v}" for k, v in fields.items())

    def pretty_print(self) -> None:
        print(self.format())

    def to_engine(self) -> _ours.EvaluationResult:
        """This package's `EvaluationResult` of the same verdict."""
        return _ours.EvaluationResult(
            pass_=self.pass_, score_raw=self.score, text_output=self.text_output,
            explanation=self.explanation, metadata=self.metadata, tags=self.tags,
            evaluation_duration=self.evaluation_duration)

    @classmethod
    def of_engine(cls, result: _ours.EvaluationResult) -> EvaluationResult:
        return cls(score=result.score_raw, pass_=result.pass_, text_output=result.text_output,
                   metadata=result.metadata, explanation=result.explanation, tags=result.tags,
                   evaluation_duration=result.evaluation_duration)


def _unwrapped(value: Any, kind: type) -> Any:
    """A numpy number, or an array of one, as the plain ``kind`` it holds."""
    if isinstance(value, np.ndarray) and value.size == 1:
        return kind(value.reshape(-1)[0])
    return kind(value) if isinstance(value, np.generic) else value


def coerce(value: Any, evaluator_id: str) -> EvaluationResult | None:
    """What an ``@evaluator`` function returned, as the SDK reads it: an
    `EvaluationResult` as is, a bool a verdict (score 1 or 0), a number a score, a str a
    text output; ``None`` skips the row (as the SDK's docs say: "Skip the evaluation";
    the SDK itself raised a TypeError), recorded as skipped, out of the pass rates."""
    if value is None or isinstance(value, EvaluationResult):
        return value
    if isinstance(value, np.ndarray) and value.size == 1:  # an embedding's cosine
        value = value.reshape(-1)[0]
    if isinstance(value, bool | np.bool_):
        return EvaluationResult(pass_=bool(value), score=float(value))
    if isinstance(value, int | float | np.number):
        return EvaluationResult(score=float(value))
    if isinstance(value, str):
        return EvaluationResult(text_output=value)
    raise InvalidResultError(
        f"evaluator {evaluator_id!r} returned {type(value).__name__}: return a bool, a number, "
        "a str, an EvaluationResult, or None to skip the row")
