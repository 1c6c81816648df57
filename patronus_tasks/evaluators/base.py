"""What every ready evaluator shares: option checks at construction, the step options it
passes on, and how it reads the output and the gold answer.

A ready evaluator is an ordinary `Evaluator`: its ``evaluate`` asks for the fields it
reads by their usual names, so an empty required field is the row's `DatasetError`
(the runner's), and it works in chains, with the cache, repeats and gates like any other.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import string
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

from patronus_tasks.define.step_results import EvaluationResult
from patronus_tasks.define.steps import Evaluator
from patronus_tasks.exceptions import ConfigError

#: The step options every ready evaluator takes besides its own (see `Evaluator`).
STEP_OPTIONS = ("name", "criteria", "retries", "retry_delay_seconds", "timeout_seconds",
                "inline", "cache", "version")


class Check(Evaluator):
    """A ready evaluator: ``options`` are its own settings (checked, part of the cache key),
    ``step`` the step options (``name``, ``cache``, ``retries``, ``timeout_seconds`` ...)."""

    #: The factory's name: the default evaluator (and task-run) name.
    factory: ClassVar[str] = "check"

    def __init__(self, options: dict[str, Any], criteria: str, step: dict[str, Any]) -> None:
        unknown = sorted(set(step) - set(STEP_OPTIONS))
        if unknown:
            raise ConfigError(
                f"{self.factory}: unknown option {unknown[0]!r}. Its options are "
                f"{', '.join(options) or 'none'}; every evaluator also takes "
                f"{', '.join(STEP_OPTIONS)}.")
        step.setdefault("criteria", criteria)
        super().__init__(step.pop("name", None) or self.factory, **step)
        self.options = options

    def cache_identity(self) -> dict[str, Any]:
        return {"check": type(self).__qualname__, **{k: _plain(v) for k, v in self.options.items()}}

    async def setup(self) -> None:
        # Libraries imported and their objects built before the first row: a first call
        # slower than 1 ms would send every call of this cheap step to a thread (see
        # `define.inline`): rouge's first call took ~40 ms, then all 2,000 ran in threads.
        self.warm()

    def warm(self) -> None:
        """Import what the check needs and build its library objects (once per process)."""


def _plain(value: Any) -> Any:
    """An option as the cache key's canonical JSON takes it."""
    if isinstance(value, re.Pattern):
        return value.pattern
    if isinstance(value, dict | list | tuple | str | int | float | bool) or value is None:
        return value
    return repr(value)


# Option checks: each raises a `ConfigError` naming the evaluator, the option and the fix.

def check_threshold(owner: str, value: Any, name: str = "threshold") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError(f"{owner}: {name} must be a number from 0 to 1 (scores are in "
                          f"[0, 1]), not {value!r}.")
    return float(value)


def check_choice(owner: str, name: str, value: Any, allowed: Sequence[Any]) -> Any:
    # By type too: True is not 1 here.
    if not any(type(value) is type(a) and value == a for a in allowed):
        shown = ", ".join(repr(a) for a in allowed)
        raise ConfigError(f"{owner}: {name} must be one of {shown}, not {value!r}.")
    return value


def check_bool(owner: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{owner}: {name} must be True or False, not {value!r}.")
    return value


def check_number(owner: str, name: str, value: Any, *, low: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value < low:
        raise ConfigError(f"{owner}: {name} must be a number >= {low:g}, not {value!r}.")
    return float(value)


def check_texts(owner: str, name: str, value: Any) -> list[str] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, Iterable) or not all(isinstance(v, str) and v for v in items) \
            or not items:
        raise ConfigError(f"{owner}: {name} must be a non-empty string or a list of them, "
                          f"not {value!r}.")
    return list(items)


# Reading the fields.

def golds(value: Any) -> list[str]:
    """The acceptable gold answers: a list (a JSON list in the dataset) or one value."""
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            try:
                parsed = json.loads(stripped)
            except ValueError:
                parsed = None
            if isinstance(parsed, list) and parsed and all(isinstance(v, str) for v in parsed):
                return parsed
        return [value]
    if isinstance(value, list | tuple) or hasattr(value, "tolist"):
        items = list(value.tolist() if hasattr(value, "tolist") else value)
        return [str(v) for v in items]
    return [str(value)]


def verdict(passed: bool, explanation: str | None = None, *, score: float | None = None,
            **metadata: Any) -> EvaluationResult:
    """A yes/no check's result: score 1 or 0 unless given."""
    # Built without validation: the values are this package's own (floats, text, JSON).
    return EvaluationResult.model_construct(
        pass_=passed, score_raw=float(passed) if score is None else score,
        explanation=explanation, metadata=metadata or None)


def scored(score: float, threshold: float, explanation: str | None = None,
           **metadata: Any) -> EvaluationResult:
    """A scoring check's result: passed when ``score >= threshold``."""
    return EvaluationResult.model_construct(pass_=score >= threshold, score_raw=score,
                                            explanation=explanation, metadata=metadata or None)


EMPTY_OUTPUT = "the output is empty (the task returned no text)"


def needs_output(method: Callable[..., EvaluationResult]) -> Callable[..., EvaluationResult]:
    """A check's ``evaluate`` that fails an empty output (None: the task gave no text)
    without a look; the method itself gets text."""
    position = list(inspect.signature(method).parameters).index("evaluated_model_output") - 1

    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> EvaluationResult:
        given = kwargs.get("evaluated_model_output") if "evaluated_model_output" in kwargs \
            else args[position] if len(args) > position else ""
        if given is None:
            return verdict(False, EMPTY_OUTPUT)
        return method(self, *args, **kwargs)

    return checked


def no_output(output: str | None) -> EvaluationResult | None:
    """A fail for a task that gave no output text, else None."""
    if output is None:
        return verdict(False, EMPTY_OUTPUT)
    return None


def best(output: str, answers: list[str], score: Callable[[str, str], float]) -> tuple[float, str]:
    """The best score of ``output`` against any gold answer, and that answer."""
    return max(((score(output, g), g) for g in answers), key=lambda p: p[0])


def cut(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


_PUNCT = str.maketrans("", "", string.punctuation)


def normalise(text: str, *, case: bool, whitespace: bool | str, unicode: bool,
              punctuation: bool) -> str:
    """``text`` as `exact_match` compares it (each flag: True ignores that difference)."""
    if unicode:
        text = unicodedata.normalize("NFKC", text)
    if case:
        text = text.casefold()
    if punctuation:
        text = "".join(c for c in text.translate(_PUNCT)
                       if not unicodedata.category(c).startswith("P"))
    if whitespace == "all":
        return "".join(text.split())
    if whitespace is True:
        return " ".join(text.split())
    return text.strip() if whitespace else text
