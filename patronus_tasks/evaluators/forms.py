"""What a judge is asked to answer, and how its answer is read: a `Form` gives the JSON
schema of the answer (for structured output), the instruction saying it in words (for
endpoints without it), and reads the parsed answer into a `Reading`.

The scales of `llm_judge` are forms: pass/fail, a 1-N scale, named choices each with a
score. Where the endpoint returns the log-probabilities of the tokens, the score of a
scale is the probability-weighted mean over its values (G-Eval), not the one value
written: a judge torn between 3 and 4 scores 3.5, not 4.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from patronus_tasks.exceptions import ConfigError, JudgeError

_RAW_KEPT = 2000


@dataclass(frozen=True)
class Reading:
    """One judge's verdict: a score in [0, 1], the pass it implies (None: by threshold),
    the raw value it answered, its explanation, and what else it said."""

    score: float
    passed: bool | None
    raw: Any
    explanation: str | None
    extra: dict[str, Any] = field(default_factory=dict)


class Form(Protocol):
    """An answer's shape: its schema, the words for it, and how to read it."""

    key: str  # the field holding the verdict (its logprobs are read there)

    def schema(self) -> dict[str, Any]: ...

    def instruction(self) -> str: ...

    def describe(self) -> str: ...

    def read(self, data: dict[str, Any], weights: dict[str, float] | None) -> Reading: ...

    def tokens(self) -> dict[str, float]:
        """The values' tokens and their scores, for log-probabilities ({} : none)."""
        ...


def _strict(properties: dict[str, Any]) -> dict[str, Any]:
    # OpenAI's strict structured output: every property required, no others.
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


_EXPLAIN = {"type": "string", "description": "the reasons for the verdict, in one to three sentences"}


def explanation_of(data: dict[str, Any]) -> str | None:
    found = data.get("explanation")
    return None if found is None else str(found)


class PassFail:
    key = "pass"

    def schema(self) -> dict[str, Any]:
        return _strict({"explanation": _EXPLAIN, "pass": {"type": "boolean"}})

    def instruction(self) -> str:
        return ('Answer with one JSON object and nothing else: {"explanation": "<your reasons>", '
                '"pass": true or false}.')

    def describe(self) -> str:
        return "pass or fail"

    def tokens(self) -> dict[str, float]:
        return {"true": 1.0, "false": 0.0}

    def read(self, data: dict[str, Any], weights: dict[str, float] | None) -> Reading:
        verdict = data.get("pass")
        if not isinstance(verdict, bool):
            raise out_of_scale(f"'pass' must be true or false, not {verdict!r}", data)
        score = weights.get("true", 0.0) if weights else float(verdict)
        return Reading(score, verdict, verdict, explanation_of(data))


class Numeric:
    """A 1-N scale (G-Eval's): the value maps to [0, 1] as (value - 1) / (N - 1)."""

    key = "score"

    def __init__(self, top: int) -> None:
        self.top = top

    def schema(self) -> dict[str, Any]:
        return _strict({"explanation": _EXPLAIN,
                        "score": {"type": "integer", "minimum": 1, "maximum": self.top}})

    def instruction(self) -> str:
        return ('Answer with one JSON object and nothing else: {"explanation": "<your reasons>", '
                f'"score": an integer from 1 (worst) to {self.top} (best)}}.')

    def describe(self) -> str:
        return f"an integer from 1 (worst) to {self.top} (best)"

    def tokens(self) -> dict[str, float]:
        return {str(v): (v - 1) / (self.top - 1) for v in range(1, self.top + 1)}

    def read(self, data: dict[str, Any], weights: dict[str, float] | None) -> Reading:
        value = data.get("score")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= self.top:
            raise out_of_scale(f"'score' must be an integer from 1 to {self.top}, not {value!r}", data)
        expected = _weighted(self.tokens(), weights)
        score = expected if expected is not None else (value - 1) / (self.top - 1)
        extra = {"raw_weighted": 1 + score * (self.top - 1)} if expected is not None else {}
        return Reading(score, None, value, explanation_of(data), extra)


class Choices:
    """Named choices each with a score in [0, 1] (as autoevals' choice scores)."""

    key = "choice"

    def __init__(self, choices: dict[str, float], meanings: dict[str, str] | None = None) -> None:
        self.choices, self.meanings = choices, meanings or {}

    def schema(self) -> dict[str, Any]:
        return _strict({"explanation": _EXPLAIN, "choice": {"type": "string", "enum": list(self.choices)}})

    def instruction(self) -> str:
        names = ", ".join(f'"{c}"' for c in self.choices)
        return ('Answer with one JSON object and nothing else: {"explanation": "<your reasons>", '
                f'"choice": one of {names}}}.')

    def describe(self) -> str:
        return "\n".join(f"{c}: {self.meanings[c]}" if c in self.meanings else c for c in self.choices)

    def tokens(self) -> dict[str, float]:
        return dict(self.choices)

    def read(self, data: dict[str, Any], weights: dict[str, float] | None) -> Reading:
        value = data.get("choice")
        if isinstance(value, str) and value not in self.choices:
            value = next((c for c in self.choices if c.lower() == value.strip().lower()), value)
        if value not in self.choices:
            raise out_of_scale(f"'choice' must be one of {list(self.choices)}, not {value!r}", data)
        expected = _weighted(self.tokens(), weights)
        score = expected if expected is not None else self.choices[value]
        return Reading(score, None, value, explanation_of(data))


def _weighted(values: dict[str, float], weights: dict[str, float] | None) -> float | None:
    """The probability-weighted mean of the values (None: no weight on any of them)."""
    if not weights:
        return None
    mass = sum(weights.get(t, 0.0) for t in values)
    if mass <= 0:
        return None
    return sum(weights.get(t, 0.0) * v for t, v in values.items()) / mass


def out_of_scale(message: str, data: Any) -> JudgeError:
    return JudgeError(f"judge answered out of its scale: {message}", raw=str(data)[:_RAW_KEPT],
                      reason="out_of_scale", status=200)


def scale_form(owner: str, scale: Any) -> Form:
    """``scale=None``: pass/fail; an int N >= 2: a 1-N scale; a dict: named choices to scores."""
    if scale is None:
        return PassFail()
    if isinstance(scale, int) and not isinstance(scale, bool):
        if not 2 <= scale <= 10:
            raise ConfigError(f"{owner}: scale must be an int from 2 to 10 (a 1-N scale), "
                              f"None (pass/fail) or a dict of choices to scores, not {scale}.")
        return Numeric(scale)
    if isinstance(scale, dict) and len(scale) >= 2 and all(
            isinstance(k, str) and k.strip() and isinstance(v, int | float) and not isinstance(v, bool)
            and 0 <= v <= 1 for k, v in scale.items()):
        return Choices({k: float(v) for k, v in scale.items()})
    raise ConfigError(f"{owner}: scale must be None (pass/fail), an int N (a 1-N scale) or a dict "
                      f"of at least two named choices to scores in [0, 1], not {scale!r}.")


def scale_labels(form: Form) -> list[str]:
    """What a person may answer in a judge's place (`review`): the choices, 1 to N, else
    pass or fail (the verdict of a pass/fail judge and of a judge of items alike)."""
    if isinstance(form, Numeric):
        return [str(v) for v in range(1, form.top + 1)]
    if isinstance(form, Choices):
        return list(form.choices)
    return ["pass", "fail"]


def value_weights(logprobs: Any, key: str) -> dict[str, float] | None:
    """The probabilities of the tokens that could stand as the value of ``key`` in the
    answer's JSON, from an OpenAI-style ``choices[0].logprobs`` (None when absent)."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return None
    text = ""
    opener = re.compile(r'"' + re.escape(key) + r'"\s*:\s*"?$')
    for item in content:
        token = str(item.get("token", ""))
        if opener.search(text) and token.strip().strip('"'):
            return _top(item)
        text += token
    return None


def _top(item: dict[str, Any]) -> dict[str, float]:
    weights: dict[str, float] = {}
    for alt in item.get("top_logprobs") or [{"token": item.get("token"), "logprob": item.get("logprob")}]:
        token, logprob = str(alt.get("token", "")).strip().strip('"').strip(), alt.get("logprob")
        if isinstance(logprob, int | float) and token:
            weights[token] = weights.get(token, 0.0) + math.exp(logprob)
    return weights
