"""Quality gates: minimum pass rates per evaluator and minimum values of dataset-level
metrics, shared by the API and the command line."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.results.summary import Summary


def parse_thresholds(items: Iterable[str], option: str = "--min-pass-rate",
                     rates: bool = True) -> dict[str, float]:
    """``["judge=0.9", ...]`` as ``{"judge": 0.9}``; a `ConfigError` says what is wrong
    (``rates``: each between 0 and 1)."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        try:
            rate = float(value)
        except ValueError:
            rate = math.nan
        if not sep or not name or math.isnan(rate) or (rates and not 0 <= rate <= 1):
            what = ("EVALUATOR=RATE with RATE between 0 and 1, e.g. is-on-point=0.9" if rates
                    else "METRIC=VALUE, e.g. f1=0.8")
            raise ConfigError(f"{option} {item!r}: write {what}")
        out[name] = rate
    return out


def check_thresholds(values: Mapping[str, float] | None, option: str,
                     rates: bool = True) -> dict[str, float]:
    """``{name: minimum}`` checked: numbers (``rates``: between 0 and 1)."""
    found = dict(values or {})
    bad = {k: v for k, v in found.items() if isinstance(v, bool) or not isinstance(v, int | float)
           or math.isnan(v) or (rates and not 0 <= v <= 1)}
    if bad:
        raise ConfigError(f"{option}: {bad} are not {'rates from 0 to 1' if rates else 'numbers'}; "
                          f"write {option}={{'name': 0.8}}.")
    return {str(k): float(v) for k, v in found.items()}


def failed_gates(summary: Summary, min_pass_rates: Mapping[str, float]) -> list[str]:
    """One message per evaluator whose pass rate is below its threshold (errors count)."""
    messages = []
    for name, threshold in min_pass_rates.items():
        stats = [s for s in summary.evaluators if s.evaluator == name]
        if not stats:
            known = ", ".join(sorted({s.evaluator for s in summary.evaluators})) or "none"
            messages.append(f"{name}: no such evaluator in this experiment (evaluators: {known})")
        for s in stats:
            rate = s.pass_rate if s.pass_rate is not None else 0.0
            if s.pass_rate is None or rate < threshold:
                shown = "no pass/fail verdicts" if s.pass_rate is None else f"{rate:.1%}"
                messages.append(f"{name} [link {s.link_index}]: pass rate {shown} is below "
                                f"{threshold:.1%}")
    return messages


def failed_metric_gates(summary: Summary, min_metrics: Mapping[str, float]) -> list[str]:
    """One message per metric value below its minimum (an errored or empty one too)."""
    values = {m.name: m for m in summary.metrics}
    messages = []
    for name, minimum in min_metrics.items():
        found = values.get(name)
        if found is None:
            known = ", ".join(sorted(values)) or "none"
            messages.append(f"{name}: no such metric in this experiment (metrics: {known})")
        elif found.error is not None:
            messages.append(f"{name}: the metric failed ({found.error}), so it is not >= {minimum:g}")
        elif found.value is None or found.value < minimum:
            shown = "no value" if found.value is None else f"{found.value:.4g}"
            messages.append(f"{name}: {shown} is below {minimum:g}")
    return messages


def check_fail_on_error(value: int | float | None) -> None:
    """A `ConfigError` unless ``value`` is None, a count >= 0 or a fraction in [0, 1]."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 \
            or (isinstance(value, float) and value > 1):
        raise ConfigError(f"fail_on_error must be a row count (int >= 0) or a fraction "
                          f"(float from 0 to 1), not {value!r}.")


def error_gate(errored_rows: int, rows: int, fail_on_error: int | float | None) -> list[str]:
    """A message when more rows errored than ``fail_on_error`` allows (a count or fraction)."""
    if fail_on_error is None:
        return []
    if isinstance(fail_on_error, float):
        share = errored_rows / rows if rows else 0.0
        if share > fail_on_error:
            return [f"{errored_rows} of {rows} rows errored ({share:.1%}), "
                    f"more than fail_on_error={fail_on_error:.1%}"]
        return []
    if errored_rows > fail_on_error:
        return [f"{errored_rows} rows errored, more than fail_on_error={fail_on_error}"]
    return []
