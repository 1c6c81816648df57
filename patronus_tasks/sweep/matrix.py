"""The matrix of a sweep (or of any runs set side by side): per variant and evaluator,
its figures and, against the baseline, which rows got worse or better and whether by
more than chance.

Each variant is compared with the baseline row by row (`results.compare`): McNemar's
exact test on the rows whose verdict flipped (an evaluator with scores and no verdicts:
a paired bootstrap of the mean score's difference, seeded; with repeats run differently,
of the rows' pass shares), its p adjusted for the number of comparisons by Holm's
step-down method (over every variant and evaluator compared), and a verdict by the
package's own rule (`results.verdict.Rule`: worse when the pass rate fell by 5 points or
more rows got worse than better). The pass rate is the summary's (errors count as not
passed, unscored ones are left out) with Wilson's 95% interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.report.charts import wilson
from patronus_tasks.results.compare import Comparison, EvaluatorComparison, compare_experiments
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.summary import EvaluatorStats, Summary
from patronus_tasks.results.verdict import ALPHA, Rule

#: The matrix's columns, in order.
COLUMNS = ("variant", "evaluator", "link", "is_baseline", "rows", "passed", "pass_rate",
           "ci_low", "ci_high", "mean_score", "unscored", "errors", "tokens_in", "tokens_out",
           "cost_usd", "latency_p50_s", "latency_p95_s", "worse", "better", "p_value", "test",
           "p_adjusted", "verdict")
MCNEMAR = "McNemar exact"
BOOTSTRAP_SCORES = "paired bootstrap (mean score)"
BOOTSTRAP_SHARES = "paired bootstrap (rows' pass shares)"


@dataclass(frozen=True)
class Facts:
    """What one variant's records say, whatever it is compared with."""

    summary: Summary
    tokens_in: int
    tokens_out: int
    latency: dict[str, tuple[float, float]]  # evaluator (or "" for the task) -> p50, p95


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (each at most 1, never below an
    adjusted smaller one)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _quantiles(seconds: pd.Series) -> tuple[float, float]:
    values = pd.to_numeric(seconds, errors="coerce").dropna()
    if values.empty:
        return math.nan, math.nan
    return float(values.quantile(0.5)), float(values.quantile(0.95))


def facts_of(experiment: Experiment) -> Facts:
    """The variant's summary, tokens and latencies (its task's per row, else each
    evaluator's own)."""
    df = experiment.to_dataframe()
    summary = experiment.summary(df)
    latency: dict[str, tuple[float, float]] = {}
    if "task_duration_s" in df.columns and df["task_name"].notna().any():
        tasks = df[df["task_name"].notna()].drop_duplicates(["sid", "repeat", "link_index"])
        latency[""] = _quantiles(tasks["task_duration_s"])
    if "evaluation_duration_s" in df.columns:
        for name, g in df[df["evaluator_name"].notna()].groupby("evaluator_name"):
            latency[str(name)] = _quantiles(g["evaluation_duration_s"])
    return Facts(summary, sum(u.input_tokens for u in summary.usage),
                 sum(u.output_tokens for u in summary.usage), latency)


def _p(e: EvaluatorComparison) -> tuple[float | None, str]:
    if e.mcnemar_p is not None:
        return e.mcnemar_p, MCNEMAR
    if e.pass_p is not None:
        return e.pass_p, BOOTSTRAP_SHARES
    if e.score_p is not None and e.pass_diff is None:
        return e.score_p, BOOTSTRAP_SCORES
    return None, ""


def _row(label: str, s: EvaluatorStats, facts: Facts, baseline: bool) -> dict[str, object]:
    low, high = wilson(s.passed, s.judged) if s.pass_rate is not None else (math.nan, math.nan)
    p50, p95 = facts.latency.get("", facts.latency.get(s.evaluator, (math.nan, math.nan)))
    cost = facts.summary.cost_usd
    return {"variant": label, "evaluator": s.evaluator, "link": s.link_index,
            "is_baseline": baseline, "rows": s.judged, "passed": s.passed,
            "pass_rate": math.nan if s.pass_rate is None else s.pass_rate, "ci_low": low,
            "ci_high": high, "mean_score": s.scores.get("mean", math.nan),
            "unscored": s.unscored, "errors": s.errors, "tokens_in": facts.tokens_in,
            "tokens_out": facts.tokens_out, "cost_usd": math.nan if cost is None else cost,
            "latency_p50_s": p50, "latency_p95_s": p95, "worse": math.nan, "better": math.nan,
            "p_value": math.nan, "test": "", "p_adjusted": math.nan,
            "verdict": "baseline" if baseline else "not compared"}


def _compared(row: dict[str, object], e: EvaluatorComparison, rule: Rule) -> dict[str, object]:
    p, test = _p(e)
    return {**row, "worse": len(e.regressed), "better": len(e.improved),
            "p_value": math.nan if p is None else p, "test": test, "verdict": rule.movement(e)}


def compare_all(experiments: Mapping[str, Experiment], baseline: str
                ) -> dict[str, Comparison]:
    """Each variant but the baseline against the baseline."""
    base = experiments[baseline]
    return {label: compare_experiments(base, e) for label, e in experiments.items()
            if label != baseline}


def build_matrix(experiments: Mapping[str, Experiment], baseline: str,
                 rule: Rule | None = None,
                 comparisons: Mapping[str, Comparison] | None = None,
                 facts: Mapping[str, Facts] | None = None) -> pd.DataFrame:
    """The matrix, long form: one row per variant and evaluator (`COLUMNS`); with no
    ``baseline`` among them (it failed), nothing compared."""
    rule = rule or Rule()
    if comparisons is None:
        comparisons = compare_all(experiments, baseline) if baseline in experiments else {}
    rows: list[dict[str, object]] = []
    for label, experiment in experiments.items():
        known = facts[label] if facts is not None and label in facts else facts_of(experiment)
        against = comparisons.get(label)
        by_key = {(e.link_index, e.evaluator): e for e in against.evaluators} if against else {}
        for s in known.summary.evaluators:
            row = _row(label, s, known, label == baseline)
            found = by_key.get((s.link_index, s.evaluator))
            rows.append(_compared(row, found, rule) if found is not None else row)
    return _adjusted(pd.DataFrame(rows, columns=list(COLUMNS)))


def _adjusted(matrix: pd.DataFrame) -> pd.DataFrame:
    tested = matrix["p_value"].notna()
    if tested.any():
        matrix.loc[tested, "p_adjusted"] = holm(matrix.loc[tested, "p_value"].astype(float).tolist())
    for column in ("worse", "better"):
        matrix[column] = matrix[column].astype("Int64")
    return matrix


def variant_quality(matrix: pd.DataFrame, quality: str | None = None) -> pd.Series:
    """Each variant's quality: the mean of its evaluators' pass rates (with none, of their
    mean scores), or (``quality``) one evaluator's pass rate (else its mean score), or a
    column of the matrix averaged over the variant's rows."""
    if quality is None:
        rates = matrix.groupby("variant", sort=False)["pass_rate"].mean()
        scores = matrix.groupby("variant", sort=False)["mean_score"].mean()
        return rates.where(rates.notna(), scores)
    if quality in matrix.columns:
        return matrix.groupby("variant", sort=False)[quality].mean()
    rows = matrix[matrix["evaluator"] == quality]
    if rows.empty:
        raise ConfigError(f"quality {quality!r} is neither an evaluator of the sweep "
                          f"({', '.join(dict.fromkeys(matrix['evaluator']))}) nor a column of "
                          "its matrix.")
    rates = rows.groupby("variant", sort=False)["pass_rate"].mean()
    return rates.where(rates.notna(), rows.groupby("variant", sort=False)["mean_score"].mean())


def pareto_front(matrix: pd.DataFrame, quality: str | None = None,
                 cost: str = "cost_usd") -> pd.DataFrame:
    """The variants no other beats on both quality and cost (at least as good on both,
    better on one), cheapest first; an unknown cost counts as the highest."""
    if cost not in matrix.columns:
        raise ConfigError(f"cost {cost!r} is not a column of the matrix: one of "
                          f"{', '.join(c for c in COLUMNS if matrix[c].dtype.kind == 'f')}.")
    table = pd.DataFrame({"quality": variant_quality(matrix, quality),
                          cost: matrix.groupby("variant", sort=False)[cost].mean()})
    q = table["quality"].fillna(-np.inf).to_numpy()
    c = table[cost].fillna(np.inf).to_numpy()
    beaten = [bool(((q >= q[i]) & (c <= c[i]) & ((q > q[i]) | (c < c[i]))).any())
              for i in range(len(table))]
    front = table[[not b for b in beaten]].rename_axis("variant").reset_index()
    return front.sort_values([cost, "quality"], ascending=[True, False], na_position="last",
                             ignore_index=True)


@dataclass(frozen=True)
class Best:
    """The best variant, and how it stands against the baseline."""

    label: str
    quality: float
    baseline: str
    beyond_chance: bool  # better than the baseline on some evaluator, Holm-adjusted p < ALPHA
    worse_beyond_chance: bool
    p_adjusted: float | None  # the smallest adjusted p of its evaluators where it is better

    def headline(self) -> str:
        shown = "" if math.isnan(self.quality) else f" (quality {self.quality:.1%})"
        if self.label == self.baseline:
            return f"best: {self.label}{shown}, the baseline: no variant beats it"
        if self.beyond_chance:
            return (f"best: {self.label}{shown}, better than the baseline {self.baseline} beyond "
                    f"chance (Holm-adjusted p={self.p_adjusted:.2g})")
        p = "" if self.p_adjusted is None else f"; Holm-adjusted p={self.p_adjusted:.2g}"
        return (f"best: {self.label}{shown}, not better than the baseline {self.baseline} "
                f"beyond chance{p}")


def best_of(matrix: pd.DataFrame, baseline: str, quality: str | None = None) -> Best | None:
    """The variant of highest quality (a tie goes to the baseline, then the first)."""
    if matrix.empty:
        return None
    q = variant_quality(matrix, quality).fillna(-np.inf)
    top = q[q == q.max()]
    label = baseline if baseline in top.index else str(top.index[0])
    rows = matrix[matrix["variant"] == label]
    better = rows[(rows["verdict"] == "better") & rows["p_adjusted"].notna()]
    worse = rows[(rows["verdict"] == "worse") & (rows["p_adjusted"] < ALPHA)]
    p = float(better["p_adjusted"].min()) if len(better) else None
    value = float(q[label]) if np.isfinite(q[label]) else math.nan
    return Best(label, value, baseline, p is not None and p < ALPHA and worse.empty,
                not worse.empty, p)
