"""Dataset-level metrics computed from an experiment's records, and metrics to use as they
are (`accuracy_by`, `precision_recall_f1`); see `define.metrics` for writing one."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from patronus_tasks.define.metrics import Metric
from patronus_tasks.record.manifest import MetricValue
from patronus_tasks.record.records import STATUS_ERROR, STATUS_SKIPPED


def _aligned(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run of a row (sample, repeat): its dataset columns and the output of
    the last task it reached."""
    keys = ["sid", "repeat"]
    runs = df.sort_values("link_index", kind="stable")
    tasks = runs[runs["task_name"].notna()].drop_duplicates(keys, keep="last")
    first = runs.drop_duplicates(keys, keep="first").drop(columns=["task_output"])
    return first.merge(tasks[[*keys, "task_output"]], on=keys, how="left")


def _column(frame: pd.DataFrame, name: str) -> list[Any]:
    if name not in frame.columns:
        return [None] * len(frame)
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else v
            for v in frame[name].astype(object).tolist()]


def metric_inputs(df: pd.DataFrame) -> dict[str, Any]:
    """What a metric may ask for (`define.metrics`), from the records."""
    units = _aligned(df) if len(df) else df.assign(task_output=None)
    return {"results": df, "outputs": _column(units, "task_output"),
            "gold_answers": _column(units, "evaluated_model_gold_answer"),
            "inputs": _column(units, "evaluated_model_input"), "sids": _column(units, "sid")}


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool | numbers.Real):
        number = float(value)
        if math.isfinite(number):
            return number
    raise TypeError(f"a metric's value must be a finite number or None, not {value!r}")


def _values(metric: Metric, out: Any) -> list[MetricValue]:
    if isinstance(out, dict):
        return [MetricValue(name=str(k), metric=metric.name, value=_number(v)) for k, v in out.items()]
    return [MetricValue(name=metric.name, metric=metric.name, value=_number(out))]


def evaluate_metrics(metrics: Sequence[Metric], df: pd.DataFrame) -> list[MetricValue]:
    """Each metric's values over the records ``df``; one that fails gives its error instead
    (the others go on)."""
    inputs, found, seen = metric_inputs(df), [], set[str]()
    for metric in metrics:
        try:
            values = _values(metric, metric(**inputs))
            clash = sorted(v.name for v in values if v.name in seen)
            if clash:
                raise ValueError(f"gives {clash}, which another metric gave already; rename one")
        except Exception as exc:
            values = [MetricValue(name=metric.name, metric=metric.name,
                                  error=f"{type(exc).__name__}: {exc}")]
        seen.update(v.name for v in values)
        found += values
    return found


# Metrics to use as they are ---------------------------------------------------------


def _verdicts(results: pd.DataFrame, evaluator: str | None) -> pd.DataFrame:
    """The records of ``evaluator`` (or the one evaluator giving verdicts), with ``passed``
    (an error counts as not passed, a task's error too: its row was not answered)."""
    evals = results[results["evaluator_name"].notna()]
    with_verdicts = sorted(evals.loc[evals["pass"].notna(), "evaluator_name"].unique())
    if evaluator is None:
        if len(with_verdicts) != 1:
            raise ValueError(f"say which evaluator (evaluator=): verdicts come from {with_verdicts}")
        evaluator = str(with_verdicts[0])
    mine = evals[(evals["evaluator_name"] == evaluator) & (evals["status"] != STATUS_SKIPPED)]
    if mine.empty:
        raise ValueError(f"no verdicts of evaluator {evaluator!r}")
    before = results["link_index"] <= mine["link_index"].max()
    unanswered = results[(results["error_stage"] == "task") & before]
    both = pd.concat([mine, unanswered], ignore_index=True)
    return both.assign(passed=both["pass"].astype("boolean").fillna(False).astype(bool)
                       & (both["status"] != STATUS_ERROR))


def accuracy_by(column: str, evaluator: str | None = None) -> Metric:
    """The pass rate of ``evaluator`` (default: the only one giving verdicts) for each value
    of the dataset's ``column``: ``accuracy[<column>=<value>]``; errors (the task's too)
    count as not passed, skipped rows are left out."""
    def accuracy(results: pd.DataFrame) -> dict[str, float]:
        if column not in results.columns:
            raise ValueError(f"the results have no column {column!r}")
        mine = _verdicts(results, evaluator)
        rates = mine.groupby(mine[column].astype(str), sort=True)["passed"].mean()
        return {f"accuracy[{column}={value}]": float(rate) for value, rate in rates.items()}

    return Metric(accuracy, f"accuracy_by_{column}")


def _f1(precision: float | None, recall: float | None) -> float | None:
    if precision is None or recall is None:
        return None
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def precision_recall_f1(positive: Any, *, normalise: Callable[[Any], Any] | None = None,
                        name: str = "precision_recall_f1") -> Metric:
    """Precision, recall and F1 of a classifier for the label ``positive``: each output and
    gold answer compared as ``normalise`` makes them (default: stripped, lower case). A
    missing output (its task failed or was skipped) is a negative. None where undefined
    (no positive said, or none true)."""
    norm = normalise or (lambda v: None if v is None else str(v).strip().lower())
    label = norm(positive)

    def prf(outputs: list[Any], gold_answers: list[Any]) -> dict[str, float | None]:
        said = [norm(o) == label for o in outputs]
        truth = [norm(g) == label for g in gold_answers]
        hits = sum(s and t for s, t in zip(said, truth, strict=True))
        precision = hits / sum(said) if sum(said) else None
        recall = hits / sum(truth) if sum(truth) else None
        return {"precision": precision, "recall": recall, "f1": _f1(precision, recall)}

    return Metric(prf, name)
