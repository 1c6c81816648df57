"""Dataset-level evaluators (metrics): functions of all of an experiment's results.

An evaluator judges one row; a metric judges the whole run: precision, recall and F1 of a
classifier, accuracy per category, anything that is not a mean of per-row verdicts. It
runs once, after the rows, and asks by name for any of:

- ``results``: the records as a DataFrame (every column of the results file, the
  dataset's too: one row per sample, link, evaluator and repeat);
- ``outputs``, ``gold_answers``, ``inputs``, ``sids``: lists with one item per run of a
  row (a sample; with repeats, each repeat), aligned: the output of its last task (None
  when that failed or was skipped), its ``evaluated_model_gold_answer`` and
  ``evaluated_model_input``, its sample id.

It returns a number (the metric's value, named after it), a dict of names to numbers
(several values: ``{"precision": ..., "recall": ...}``), or None (nothing to say). A
metric that raises, or returns anything else, is recorded as that metric's error: the
experiment and its other metrics go on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, overload

from patronus_tasks.define.params import inspect_params
from patronus_tasks.exceptions import ConfigError

METRIC_PARAMS = ("gold_answers", "inputs", "outputs", "results", "sids")
F = TypeVar("F", bound=Callable[..., Any])


class Metric:
    """A dataset-level evaluator: a function of the whole results (see the module)."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        self.fn, self.name = fn, name or getattr(fn, "__name__", type(self).__name__)
        self.params = inspect_params(fn, METRIC_PARAMS, f"metric {self.name!r}").names

    def __call__(self, **values: Any) -> Any:
        return self.fn(**{name: values[name] for name in self.params})

    def __repr__(self) -> str:
        return f"<Metric {self.name!r}>"


@overload
def metric(fn: F, /) -> Metric: ...
@overload
def metric(*, name: str | None = None) -> Callable[[F], Metric]: ...
def metric(fn: Callable[..., Any] | None = None, /, *,
           name: str | None = None) -> Metric | Callable[[F], Metric]:
    """Make a function a `Metric`: ``@metric`` or ``@metric(name=...)``."""
    if fn is not None:
        return Metric(fn, name)
    return lambda f: Metric(f, name)


def check_metrics(values: Sequence[Any] | Metric | None) -> tuple[Metric, ...]:
    """The experiment's ``metrics=``: `Metric`s (plain functions are made ones), each name once."""
    given = [values] if isinstance(values, Metric) or callable(values) else list(values or [])
    found = tuple(v if isinstance(v, Metric) else Metric(v) if callable(v) else _not_one(v)
                  for v in given)
    names = [str(m.name) for m in found]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ConfigError(f"metrics named {dups} appear more than once; give each a name= .")
    return found


def _not_one(value: Any) -> Metric:
    raise ConfigError(f"metrics: {value!r} is not a metric; pass functions of the results "
                      "(see patronus_tasks.metrics) or @metric ones.")
