"""A sweep's cost against quality: each variant a point, the Pareto front joined, the
baseline ringed. PNG bytes, drawn with matplotlib's object API (`report.charts`)."""

from __future__ import annotations

import math

import pandas as pd

from patronus_tasks.report.charts import NEUTRAL, PASS, _figure, _short, _style, png
from patronus_tasks.sweep.matrix import pareto_front, variant_quality

#: What the x axis is, in order of preference: the first with a known figure.
COSTS = (("cost_usd", "cost (USD)"), ("tokens_in", "input tokens"),
         ("latency_p50_s", "task latency p50 (s)"))
LABEL_CHARS = 28


def cost_axis(matrix: pd.DataFrame) -> tuple[str, str] | None:
    """The matrix column the chart's x axis shows: the cost, else tokens, else latency."""
    for column, label in COSTS:
        values = pd.to_numeric(matrix[column], errors="coerce")
        if values.notna().any() and (values > 0).any():
            return column, label
    return None


def pareto_chart(matrix: pd.DataFrame, baseline: str, quality: str | None = None) -> bytes | None:
    """Quality (the mean pass rate) against cost; None when there is nothing to place."""
    axis = cost_axis(matrix)
    if matrix.empty or axis is None:
        return None
    column, label = axis
    q = variant_quality(matrix, quality)
    c = matrix.groupby("variant", sort=False)[column].mean()
    front = set(pareto_front(matrix, quality, column)["variant"])
    fig = _figure(7.5, 4.2)
    ax = fig.add_subplot()
    _style(ax)
    placed = [(v, float(c[v]), float(q[v])) for v in q.index
              if not (math.isnan(float(c[v])) or math.isnan(float(q[v])))]
    if not placed:
        return None
    line = sorted((x, y) for v, x, y in placed if v in front)
    ax.plot([x for x, _ in line], [y for _, y in line], color=PASS, lw=1, zorder=1)
    for v, x, y in placed:
        ax.scatter([x], [y], s=60 if v == baseline else 36, zorder=2,
                   color=PASS if v in front else NEUTRAL,
                   edgecolors="black" if v == baseline else "none")
        ax.annotate(_short(v, LABEL_CHARS) + (" (baseline)" if v == baseline else ""), (x, y),
                    textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel(label, fontsize=9)
    ax.set_ylabel("quality (mean pass rate)" if quality is None else f"quality ({quality})",
                  fontsize=9)
    ax.set_title("Cost against quality: the Pareto front in green", fontsize=10)
    return png(fig)
