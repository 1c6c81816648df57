"""Summaries of an experiment's records: per (link, evaluator) statistics, calls, tokens and
cost per step and model, repeats, dataset-level metrics; as data and text.

What every reader shows (the CLI's ``show``, the Prefect artifacts and final state, the
HTML report) comes from here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from patronus_tasks.exceptions import UNSCORED_ERRORS
from patronus_tasks.record.manifest import MetricValue, UsageTotal
from patronus_tasks.record.records import STATUS_ERROR, STATUS_OK, STATUS_SKIPPED
from patronus_tasks.results.repeats import RepeatStats, repeat_stats
from patronus_tasks.results.usage import (
    USAGE_COLUMNS,
    format_usage,
    total_cost,
    usage_headline,
    usage_totals,
)
from patronus_tasks.results.weights import mean_weighted_score

_HIST_BINS = 5


@dataclass(frozen=True)
class EvaluatorStats:
    """Statistics of one evaluator in one chain link.

    ``pass_rate`` counts errors as not passed: passed / (verdicts + errors), leaving out
    the *unscored* errors (a judge that gave no verdict: `JudgeError`), which are counted
    apart (``unscored``, part of ``errors``). It is None when the evaluator gave no
    pass/fail verdicts (a score-only one), 0 when every row it judged was an error;
    score statistics likewise for scores.
    """

    link_index: int
    evaluator: str
    count: int
    passed: int
    verdicts: int
    errors: int
    skipped: int
    pass_rate: float | None
    scores: dict[str, float] = field(default_factory=dict)
    histogram: list[tuple[float, float, int]] = field(default_factory=list)
    repeats: RepeatStats | None = None  # with ``repeats=N``: over each row's runs
    unscored: int = 0  # errors with no verdict (a judge that failed to give one)
    #: An evaluator giving text only (no verdict, no score): its most frequent texts and
    #: their counts, and how many different texts in all (a "PASS" returned as text, say).
    texts: list[tuple[str, int]] = field(default_factory=list)
    text_kinds: int = 0

    @property
    def judged(self) -> int:
        """What the pass rate divides by: verdicts and errors, not the unscored."""
        return self.verdicts + self.errors - self.unscored


@dataclass(frozen=True)
class ErrorKind:
    """Rows that failed the same way: one step, one error type, one message's first line."""

    step: str  # "task 'answer'" or "evaluator 'exact'"
    error_type: str
    message: str
    count: int
    first_sid: str

    def format(self) -> str:
        return (f"  {self.count} x {self.step}: {self.error_type}: {self.message}"
                f"  (first: sid {self.first_sid})")


#: Texts a text-only evaluator's summary shows, most frequent first.
SHOWN_TEXTS = 5
#: Error kinds a summary shows, most frequent first; the rest are counted.
SHOWN_ERROR_KINDS = 5
_MESSAGE_CHARS = 160


@dataclass(frozen=True)
class Summary:
    """An experiment's per-evaluator statistics and error counts."""

    evaluators: list[EvaluatorStats]
    samples: int
    task_errors: int
    evaluator_errors: int
    skipped_tasks: int
    location: str | None = None
    task_errors_by_link: dict[int, int] = field(default_factory=dict)
    skipped_tasks_by_link: dict[int, int] = field(default_factory=dict)
    usage: list[UsageTotal] = field(default_factory=list)  # per step and model
    metrics: list[MetricValue] = field(default_factory=list)  # dataset-level
    runs: int = 0  # runs of rows: samples times repeats
    #: With weighted evaluators (``weight=``): the mean of the rows' weighted scores
    #: (`results.weights`), over how many rows, and how many had none (a weighted
    #: evaluator without a score).
    weighted_score: float | None = None
    weighted_rows: int = 0
    unweighted_rows: int = 0
    #: What the errors were, most frequent first (as many as `SHOWN_ERROR_KINDS`), and
    #: how many kinds there were in all: the console says why, not only how many.
    error_kinds: list[ErrorKind] = field(default_factory=list)
    error_kind_count: int = 0

    @property
    def cost_usd(self) -> float | None:
        """What the calls made cost, where their price is known."""
        return total_cost(self.usage)

    @property
    def links(self) -> int:
        """How many chain links the summary covers."""
        seen = {s.link_index for s in self.evaluators} | set(self.task_errors_by_link)
        return len(seen | set(self.skipped_tasks_by_link))

    def not_judged(self, s: EvaluatorStats) -> int:
        """Rows ``s``'s evaluator never judged: their task failed (in its link, or an
        earlier one: the chain stopped there)."""
        return sum(n for link, n in self.task_errors_by_link.items() if link <= s.link_index)

    def passed(self, s: EvaluatorStats) -> str:
        """``s``'s pass rate as every view says it (`passed_said`)."""
        return passed_said(s, self.not_judged(s))

    def headlines(self) -> list[str]:
        """Each evaluator's pass rate (or mean score), then the error counts."""
        many = self.links > 1
        parts = [_headline(s, many, self.not_judged(s)) for s in self.evaluators]
        parts += [_metric_headline(m) for m in self.metrics]
        if self.weighted_score is not None or self.unweighted_rows:
            parts.append(_weighted_headline(self))
        parts.append(f"task errors {self.task_errors}, evaluator errors {self.evaluator_errors}"
                     + (f", skipped rows {self.skipped_tasks}" if self.skipped_tasks else ""))
        usage = usage_headline(self.usage)
        return parts + ([usage] if usage else [])

    def headline(self) -> str:
        """`headlines` in one line."""
        runs = f" x {self.runs // self.samples} repeats" if self.samples and self.runs > self.samples else ""
        return f"{self.samples} rows{runs}: " + "; ".join(self.headlines())

    def format(self, title: str = "", histograms: bool = True) -> str:
        """The summary as plain text, one block per (link, evaluator) in chain order."""
        lines = [title] if title else []
        for stats in self.evaluators:
            lines.extend(_format_stats(stats, histograms, self.not_judged(stats)))
        lines.extend(_format_metrics(self.metrics))
        if self.weighted_score is not None or self.unweighted_rows:
            lines.append(_weighted_headline(self).capitalize())
        lines.extend(format_usage(self.usage))
        lines.append(
            f"Samples: {self.samples}   Task errors: {self.task_errors}   "
            f"Evaluator errors: {self.evaluator_errors}   Skipped tasks: {self.skipped_tasks}"
        )
        lines.extend(self._error_lines())
        if self.location:
            lines.append(f"Results: {self.location}")
        return "\n".join(lines)

    def _error_lines(self) -> list[str]:
        if not self.error_kinds:
            return []
        more = self.error_kind_count - len(self.error_kinds)
        return (["Errors, most frequent first (each row's in the error_type, error_message "
                 "and error_traceback columns):"] + [k.format() for k in self.error_kinds]
                + ([f"  and {more} more kinds"] if more > 0 else []))


def _weighted_headline(s: Summary) -> str:
    said = f"weighted score {_fmt(s.weighted_score)} over {s.weighted_rows} rows"
    return said + (f" ({s.unweighted_rows} without: a weighted evaluator gave no score)"
                   if s.unweighted_rows else "")


def passed_said(s: EvaluatorStats, task_failed: int = 0) -> str:
    """An evaluator's pass rate, said one way in every view: ``11 of 20 rows passed
    (55.0%)``; when rows errored, over what and why: ``3 of 9 judged rows passed (33.3%);
    1 row's task failed`` (a row whose task failed is not judged; an evaluation that
    errored is judged, not passed; `compare` sets runs side by side on the same basis).
    Empty for an evaluator with no verdicts."""
    if s.pass_rate is None:
        return ""
    rows, why = _over(s, task_failed)
    return "; ".join([f"{s.passed} of {s.judged} {rows} passed ({s.pass_rate:.1%})", *why])


def judged_said(s: EvaluatorStats, task_failed: int = 0) -> str:
    """What a pass rate is over, beside it: ``3/9``, or where rows errored ``3 of 9 judged
    rows; 1 row's task failed`` (`passed_said` without the rate)."""
    rows, why = _over(s, task_failed)
    return "; ".join([f"{s.passed} of {s.judged} {rows}", *why]) if why else f"{s.passed}/{s.judged}"


def _over(s: EvaluatorStats, task_failed: int) -> tuple[str, list[str]]:
    """What a pass rate is over (``rows``, or ``judged rows`` when some errored) and why."""
    errored = s.errors - s.unscored
    why = [f"{task_failed} row's task failed" if task_failed == 1
           else f"{task_failed} rows' tasks failed"] if task_failed else []
    why += [f"{errored} evaluation{'' if errored == 1 else 's'} errored (not passed)"] if errored else []
    return ("judged rows" if why or s.unscored else "rows"), why


def _headline(s: EvaluatorStats, with_link: bool, task_failed: int = 0) -> str:
    name = f"{s.evaluator} [link {s.link_index}]" if with_link else s.evaluator
    if s.pass_rate is not None:
        more = f", {s.repeats.headline()}" if s.repeats is not None else ""
        more += f", {s.unscored} unscored" if s.unscored else ""
        return f"{name} {passed_said(s, task_failed)}{more}"
    if "mean" in s.scores:
        return f"{name} mean {s.scores['mean']:.3g}"
    return f"{name} {s.count} results"


def _histogram(scores: np.ndarray) -> list[tuple[float, float, int]]:
    lo, hi = (0.0, 1.0) if scores.min() >= 0 and scores.max() <= 1 else (scores.min(), scores.max())
    if hi == lo:
        return [(float(lo), float(hi), len(scores))]
    # Edges rounded: linspace's 0.6000000000000001 put a score of 0.6 in 0.4-0.6 (the
    # HTML report's chart, binning the decimal edges, put it in 0.6-0.8).
    edges = np.round(np.linspace(lo, hi, _HIST_BINS + 1), 12)
    counts, edges = np.histogram(scores, bins=edges)
    return [(float(edges[i]), float(edges[i + 1]), int(c)) for i, c in enumerate(counts)]


def _score_stats(scores: np.ndarray) -> dict[str, float]:
    if len(scores) == 0:
        return {}
    q1, med, q3 = np.quantile(scores, [0.25, 0.5, 0.75])
    return {"mean": float(scores.mean()), "min": float(scores.min()), "25%": float(q1),
            "50%": float(med), "75%": float(q3), "max": float(scores.max())}


def unscored_mask(df: pd.DataFrame) -> pd.Series:
    """The records of evaluations that gave no verdict (a judge's `JudgeError`)."""
    if "error_type" not in df.columns:
        return pd.Series(False, index=df.index)
    return (df["status"] == STATUS_ERROR) & df["error_type"].isin(UNSCORED_ERRORS)


def _evaluator_stats(link: int, name: str, group: pd.DataFrame) -> EvaluatorStats:
    status = group["status"]
    ok = group[status == STATUS_OK]
    verdicts = ok["pass"].dropna().astype(bool)
    errors = int((status == STATUS_ERROR).sum())
    unscored = unscored_mask(group)
    scores = ok["score"].dropna().to_numpy(dtype=float)
    denominator = len(verdicts) + errors - int(unscored.sum())
    return EvaluatorStats(
        link_index=link, evaluator=name, count=len(ok), passed=int(verdicts.sum()),
        verdicts=len(verdicts), errors=errors, skipped=int((status == STATUS_SKIPPED).sum()),
        # Every judged row an error: 0 passed (as `compare` counts it), not "no verdicts".
        pass_rate=(int(verdicts.sum()) / denominator)
        if denominator and (len(verdicts) or ok.empty) else None,
        scores=_score_stats(scores),
        histogram=_histogram(scores) if len(scores) else [],
        repeats=repeat_stats(group[~unscored]) if len(verdicts) or errors else None,
        unscored=int(unscored.sum()),
        **(_texts(ok) if not len(verdicts) and not len(scores) else {}),
    )


def _texts(ok: pd.DataFrame) -> dict[str, Any]:
    if "text_output" not in ok.columns:
        return {}
    counts = ok["text_output"].dropna().astype(str).value_counts()
    return {"texts": [(str(t), int(n)) for t, n in counts.head(SHOWN_TEXTS).items()],
            "text_kinds": len(counts)}


#: The record columns `summarize` reads.
SUMMARY_COLUMNS = ("sid", "repeat", "link_index", "task_name", "evaluator_name", "status",
                   "error_stage", "error_type", "error_message", "pass", "text_output", "score",
                   "weight", *USAGE_COLUMNS)


def summarize(df: pd.DataFrame, order: Sequence[tuple[int, str]] = (),
              location: str | None = None,
              metrics: Sequence[MetricValue] = (),
              usage: Sequence[UsageTotal] | None = None) -> Summary:
    """Summarise records; ``order`` lists (link, evaluator) pairs in chain order;
    ``metrics``: the experiment's dataset-level metrics (computed after its rows);
    ``usage``: its `usage_totals`, when its manifest has them (else counted here)."""
    if "repeat" not in df.columns:
        df = df.assign(repeat=None)
    evals = df[df["evaluator_name"].notna()]
    groups = {key: g for key, g in evals.groupby(["link_index", "evaluator_name"], sort=True)}
    keys = [k for k in order if k in groups] + sorted(set(groups) - set(order))
    tasks = df[df["task_name"].notna()].drop_duplicates(["sid", "repeat", "link_index"])
    task_errors = tasks[tasks["error_stage"] == "task"]
    skipped = tasks[(tasks["status"] == STATUS_SKIPPED) & tasks["evaluator_name"].isna()]
    weighted, weighted_rows, unweighted_rows = mean_weighted_score(df)
    return Summary(
        evaluators=[_evaluator_stats(int(k[0]), str(k[1]), groups[k]) for k in keys],
        samples=int(df["sid"].nunique()),
        task_errors=len(task_errors),
        evaluator_errors=int((evals["status"] == STATUS_ERROR).sum()),
        skipped_tasks=len(skipped),
        location=location,
        task_errors_by_link=_per_link(task_errors),
        skipped_tasks_by_link=_per_link(skipped),
        usage=list(usage) if usage is not None else usage_totals(df),
        metrics=list(metrics),
        runs=int((~df.duplicated(["sid", "repeat"])).sum()),  # no copy of the records
        weighted_score=weighted, weighted_rows=weighted_rows, unweighted_rows=unweighted_rows,
        **_error_kinds(task_errors, evals[evals["status"] == STATUS_ERROR]),
    )


def _error_kinds(task_errors: pd.DataFrame, evaluator_errors: pd.DataFrame) -> dict[str, Any]:
    """Errors grouped by step, type and their message's first line, most frequent first."""
    kinds: dict[tuple[str, str, str], list[Any]] = {}
    for kind, frame in (("task", task_errors), ("evaluator", evaluator_errors)):
        if frame.empty:
            continue
        names = frame["task_name" if kind == "task" else "evaluator_name"]
        messages = frame.get("error_message", pd.Series(None, index=frame.index))
        for name, etype, message, sid in zip(names, frame["error_type"], messages, frame["sid"],
                                             strict=True):
            key = (f"{kind} {name!r}", str(etype), _first_line(message))
            kinds.setdefault(key, [0, str(sid)])[0] += 1
    ordered = sorted(kinds.items(), key=lambda kv: -kv[1][0])  # stable: first seen first
    return {"error_kinds": [ErrorKind(*key, count, sid)
                            for key, (count, sid) in ordered[:SHOWN_ERROR_KINDS]],
            "error_kind_count": len(kinds)}


def cut_text(text: str, chars: int = 40) -> str:
    one = " ".join(text.split())
    return repr(one if len(one) <= chars else one[:chars - 3] + "...")


def _first_line(message: Any) -> str:
    text = str(message).strip().split("\n", 1)[0] if isinstance(message, str) else "(no message)"
    return text if len(text) <= _MESSAGE_CHARS else text[:_MESSAGE_CHARS - 3] + "..."


def _per_link(records: pd.DataFrame) -> dict[int, int]:
    return {int(k): int(v) for k, v in records["link_index"].value_counts().items()}


def _fmt(value: float | None, pct: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.1%}" if pct else f"{value:.3f}"


def _format_stats(s: EvaluatorStats, histograms: bool = True, task_failed: int = 0) -> list[str]:
    head = f"{s.evaluator} [link {s.link_index}]"
    lines = ["", head, "-" * len(head)]
    lines.append(f"Count     : {s.count}")
    lines.append(f"Pass rate : {_fmt(s.pass_rate, pct=True)}"
                 + (f"  ({judged_said(s, task_failed)})" if s.pass_rate is not None else ""))
    for key in ("mean", "min", "25%", "50%", "75%", "max"):
        lines.append(f"{key.capitalize() if key[0].isalpha() else key:<10}: {_fmt(s.scores.get(key))}")
    unscored = f" ({s.unscored} unscored: no verdict, out of the pass rate)" if s.unscored else ""
    lines.append(f"Errors    : {s.errors}{unscored}   Skipped: {s.skipped}")
    if s.texts:  # no verdict, no score: what it said (a "PASS" returned as text is no pass)
        more = s.text_kinds - len(s.texts)
        lines.append("Texts     : " + ", ".join(f"{cut_text(t)} {n}" for t, n in s.texts)
                     + (f" (and {more} more)" if more > 0 else ""))
    lines.extend(_format_repeats(s.repeats))
    if s.histogram and histograms:
        top = max(c for _, _, c in s.histogram) or 1
        lines.append("Score range        Count  Histogram")
        for lo, hi, count in s.histogram:
            bar = "#" * round(20 * count / top)
            lines.append(f"{lo:6.2f} - {hi:6.2f}  {count:6d}  {bar}")
    return lines


def _format_repeats(r: RepeatStats | None) -> list[str]:
    if r is None:
        return []
    interval = "" if r.interval is None else f"  [{r.interval[0]:.1%}, {r.interval[1]:.1%}]"
    flips = ", ".join(r.flipping[:10]) + (f" (+{len(r.flipping) - 10} more)" if len(r.flipping) > 10 else "")
    return [f"Repeats   : {r.k} runs of {r.rows} rows; mean pass rate {r.mean_pass_rate:.1%}{interval}",
            f"{f'pass@{r.k}':<10}: {r.pass_at_k:.1%}   pass^{r.k}: {r.pass_hat_k:.1%}",
            f"Flipping  : {len(r.flipping)} rows" + (f" ({flips})" if flips else "")]


def metric_text(m: MetricValue) -> str:
    """A metric's value as shown (its error when it failed)."""
    if m.error is not None:
        return f"error: {m.error}"
    return "-" if m.value is None else f"{m.value:.4g}"


def _metric_headline(m: MetricValue) -> str:
    return f"{m.name} {metric_text(m)}"


def _format_metrics(metrics: Sequence[MetricValue]) -> list[str]:
    if not metrics:
        return []
    width = max(len(m.name) for m in metrics)
    return ["", "Metrics (dataset-level)", "-----------------------",
            *(f"{m.name:<{width}} : {metric_text(m)}" for m in metrics)]
