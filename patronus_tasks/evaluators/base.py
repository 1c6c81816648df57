"""What every ready evaluator shares: option checks at construction, the step options it
passes on, and how it reads the output and the gold answer.

A ready evaluator is an ordinary `Evaluator`: its ``evaluate`` asks for the fields it
reads by their usual names, and it works in chains, with the cache, repeats and gates like
any other. What counts as an empty field, and how a parsed value is read, is `reads`'s
rule, the same for every check.
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

from patronus_tasks.define.row import clean
from patronus_tasks.define.step_results import EvaluationResult
from patronus_tasks.define.steps import Evaluator
from patronus_tasks.exceptions import ConfigError, DatasetError

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


# Reading the fields: the one input rule of every ready check (README "Ready evaluators").
# None, NaN, "" and whitespace-only text are empty, whatever the source: a CSV's empty
# cell is None, a JSON Lines file and a list of dicts keep "", and a row must not pass
# from one and fail from the other. A parsed value (a number, a dict, a list: a DataFrame
# column of ints, a JSON dataset's objects) is accepted: text checks read its JSON text,
# the JSON checks the value itself.

OUTPUT, GOLD = "evaluated_model_output", "evaluated_model_gold_answer"
EMPTY_OUTPUT = "the output is empty (the task returned no text)"


def blank(value: Any) -> bool:
    """Whether a field's value is empty: None, NaN (pandas' missing value) or blank text."""
    return clean(value) is None or (isinstance(value, str) and not value.strip())


def as_value(value: Any) -> Any:
    """A numpy value (a DataFrame's int64, an array) as the Python value it holds."""
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, str) else value


def as_text(value: Any) -> str:
    """A field's value as text: text as it is; a number, dict or list as its JSON text
    (``json.dumps``), a whole float as an integer (pandas makes a column of ints with a gap
    floats: its 42 is 42.0)."""
    if isinstance(value, str):
        return value
    value = as_value(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        value = int(value)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def empty_gold(owner: str) -> DatasetError:
    # The same words whatever the source (a CSV's None, a JSON Lines file's ""): the
    # summary counts the rows as one kind of error.
    return DatasetError(
        f"{owner}: the gold answer is empty; fill in evaluated_model_gold_answer for this row "
        "(None, \"\" and blank text are empty in every file format).")


def gold_texts(value: Any, owner: str) -> list[str]:
    """The acceptable gold answers as texts (a list, a JSON list of texts or numbers, or one
    value), blank ones left out; none left is the row's `DatasetError`."""
    value = as_value(value)
    if isinstance(value, str):
        items = _listed(value) or [value]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        items = [value]
    texts = [as_text(v) for v in items if not blank(v)]
    if not texts:
        raise empty_gold(owner)
    return texts


def _listed(text: str) -> list[Any] | None:
    """A JSON list of texts or numbers written in ``text`` (a CSV cell), else None."""
    stripped = text.strip()
    if not (stripped.startswith("[") and stripped.endswith("]")):
        return None
    try:
        parsed = json.loads(stripped)
    except ValueError:
        return None
    scalars = isinstance(parsed, list) and all(
        isinstance(v, str | int | float) and not isinstance(v, bool) for v in parsed)
    return parsed if scalars and parsed else None


def golds(value: Any) -> list[str]:
    """The acceptable gold answers: a list (a JSON list of texts in the dataset) or one
    value; as they are, blank ones too (the judges' prompts, `sql`)."""
    if isinstance(value, str):
        listed = _listed(value)
        return listed if listed and all(isinstance(v, str) for v in listed) else [value]
    if isinstance(value, list | tuple) or hasattr(value, "tolist"):
        items = list(value.tolist() if hasattr(value, "tolist") else value)
        return [str(v) for v in items]
    return [str(value)]


def reads(*, gold: str | None = None, output: str = "text"
          ) -> Callable[[Callable[..., EvaluationResult]], Callable[..., EvaluationResult]]:
    """A check's ``evaluate`` under the input rule: an empty gold answer is the row's
    `DatasetError`, an empty output fails without a look. The method gets the gold answer
    as ``gold``: ``"texts"`` (`gold_texts`) or ``"value"`` (a non-empty value, as given);
    the output as ``output``: ``"text"`` (`as_text`) or ``"value"``."""
    def wrap(method: Callable[..., EvaluationResult]) -> Callable[..., EvaluationResult]:
        names = list(inspect.signature(method).parameters)[1:]

        @functools.wraps(method)
        def checked(self: Any, *args: Any, **kwargs: Any) -> EvaluationResult:
            given = {**dict(zip(names, args, strict=False)), **kwargs}
            if gold is not None:  # first: a row that cannot be judged is no fail
                given[GOLD] = _gold(given.get(GOLD), gold, self.factory)
            if blank(got := given.get(OUTPUT)):
                return verdict(False, EMPTY_OUTPUT)
            given[OUTPUT] = as_text(got) if output == "text" else as_value(got)
            return method(self, **given)

        return checked

    return wrap


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


def _gold(value: Any, kind: str, owner: str) -> Any:
    if kind == "texts":
        return gold_texts(value, owner)
    if blank(value):
        raise empty_gold(owner)
    return as_value(value)


#: The output only (the SQL checks): an empty output fails, the method gets its text.
needs_output = reads()


def no_output(output: Any) -> EvaluationResult | None:
    """A fail for a task that gave no output (empty by the input rule), else None."""
    if blank(output):
        return verdict(False, EMPTY_OUTPUT)
    return None


def relative_closeness(a: float, b: float) -> float:
    """1 - |a - b| / (|a| + |b|), 1 when both are 0 (autoevals' ``NumericDiff``; scaled
    first so that the largest floats do not overflow)."""
    if a == 0 and b == 0:
        return 1.0
    scale = max(abs(a), abs(b))
    a, b = a / scale, b / scale
    return 1 - abs(a - b) / (abs(a) + abs(b))


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
