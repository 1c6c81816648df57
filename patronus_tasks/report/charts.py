"""An experiment's charts as PNG bytes: pass rates with their intervals, score
distributions, a run against the previous one, a series night by night.

Drawn with matplotlib's object API (a `Figure` and its Agg canvas): no display, no pyplot
and no global backend switched under a user's notebook; imported only when a chart is
drawn, so a run that makes none never pays for it.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from patronus_tasks.record.records import STATUS_OK
from patronus_tasks.results.compare import Comparison, EvaluatorComparison
from patronus_tasks.results.summary import EvaluatorStats, Summary
from patronus_tasks.results.verdict import Rule

if TYPE_CHECKING:  # matplotlib is imported only when a chart is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PASS, FAIL, NEUTRAL = "#2a9d8f", "#e76f51", "#8d99ae"
#: Text, axes and whiskers: a grey that reads on Prefect's dark theme and on a light page
#: alike (the charts have no background of their own: a white one glared in the dark UI).
INK = "#8a8f98"
DPI = 100
#: Evaluators drawn at most in one chart (the rest are in the tables).
MOST = 24


@dataclass(frozen=True)
class Bar:
    """One evaluator's figure: a rate (or mean score), its 95% interval, and its words."""

    label: str
    value: float
    low: float
    high: float
    text: str
    is_rate: bool = True


@dataclass(frozen=True)
class Night:
    """One run of a series: when, each evaluator's pass rate (or mean), what regressed."""

    label: str
    values: dict[str, float | None]
    regressed: list[str] = field(default_factory=list)


def wilson(passed: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's score interval of a proportion (sound at 0 or 100%, unlike the normal one)."""
    if n == 0:
        return 0.0, 1.0
    p = passed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _name(s: EvaluatorStats, many_links: bool) -> str:
    return f"{s.evaluator} [link {s.link_index}]" if many_links else s.evaluator


def _mean_interval(scores: pd.Series) -> tuple[float, float]:
    n, mean = len(scores), float(scores.mean())
    half = 1.96 * float(scores.std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
    return mean - half, mean + half


def bars(summary: Summary, df: pd.DataFrame) -> list[Bar]:
    """Each evaluator's pass rate with Wilson's interval; its mean score with a normal
    interval when it gives scores only."""
    many = summary.links > 1
    out = []
    for s in summary.evaluators:
        if s.pass_rate is not None:
            n = s.judged
            lo, hi = wilson(s.passed, n)
            out.append(Bar(_name(s, many), s.pass_rate, lo, hi, summary.passed(s)))
        elif "mean" in s.scores:
            scores = _scores(df, s)
            lo, hi = _mean_interval(scores)
            out.append(Bar(_name(s, many), s.scores["mean"], lo, hi,
                           f"mean {s.scores['mean']:.3g} (n={len(scores)})", is_rate=False))
    return out[:MOST]


def _scores(df: pd.DataFrame, s: EvaluatorStats) -> pd.Series:
    mine = df[(df["evaluator_name"] == s.evaluator) & (df["link_index"] == s.link_index)
              & (df["status"] == STATUS_OK)]
    return mine["score"].dropna().astype(float)


def _figure(width: float, height: float, constrained: bool = True) -> Figure:
    """A figure; laid out by matplotlib's constrained layout unless margins are given
    (`_margins`): that layout, and the second draw it needs, cost a third of the charts
    every run draws (pass rates 0.13 -> 0.10 s, scores 0.23 -> 0.16 s, warm, measured
    here); the rarer charts (against the previous run, the series) keep it."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained" if constrained else None)


def _text_inches(texts: Sequence[str], size: float = 9) -> float:
    """About how wide the longest of ``texts`` is at ``size`` points (DejaVu Sans's
    characters average ~0.6 of their size; wide ones are rare in names)."""
    return max((len(t) for t in texts), default=0) * 0.62 * size / 72


def _short(name: str, most: int) -> str:
    """``name``, cut to ``most`` characters with "…" (a label must leave the chart room)."""
    return name if len(name) <= most else name[:most - 1] + "…"


def _margins(fig: Figure, left: float, right: float, top: float, bottom: float,
             **space: float) -> None:
    """Margins in inches (what the labels around the axes need, at most 40% of the width
    each), as matplotlib's fractions."""
    width, height = fig.get_size_inches()
    left, right = min(left, 0.4 * width), min(right, 0.4 * width)
    fig.subplots_adjust(left=left / width, right=1 - right / width, top=1 - top / height,
                        bottom=bottom / height, **space)


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes, on no background (`INK`)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", transparent=True)
    return buf.getvalue()


def _style(ax: Axes) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color(INK)
    ax.tick_params(labelsize=9, colors=INK, labelcolor=INK)
    for text in (ax.xaxis.label, ax.yaxis.label):
        text.set_color(INK)
    legend = ax.get_legend()
    for said in legend.get_texts() if legend is not None else ():
        said.set_color(INK)


def rates_chart(items: Sequence[Bar], title: str = "Pass rate per evaluator (95% interval)") -> bytes | None:
    """Horizontal bars, one per evaluator, with the interval and the figure written out."""
    if not items:
        return None
    labels = [_short(b.label, 40) for b in items]
    left, right = 0.25 + _text_inches(labels), 0.35 + _text_inches([b.text for b in items])
    # Wide enough for the words on both sides and 4 inches of bars between them.
    fig = _figure(max(8.0, left + right + 4), 0.9 + 0.45 * len(items), constrained=False)
    _margins(fig, left=left, right=right, top=0.4, bottom=0.4)
    ax = fig.add_subplot()
    ys = list(range(len(items)))[::-1]
    colours = [PASS if b.is_rate else NEUTRAL for b in items]
    ax.barh(ys, [b.value for b in items], color=colours, height=0.6)
    ax.errorbar([b.value for b in items], ys, fmt="none", ecolor=INK, capsize=3,
                xerr=[[max(0.0, b.value - b.low) for b in items],  # floats: 1 - 0.9999...
                      [max(0.0, b.high - b.value) for b in items]])
    for y, b in zip(ys, items, strict=True):
        ax.text(1.02, y, b.text, va="center", fontsize=9, color=INK,
                transform=ax.get_yaxis_transform())
    ax.set_yticks(ys, labels)
    ax.set_xlim(0, max(1.0, *(b.high for b in items)))
    ax.xaxis.set_major_formatter(_percent if all(b.is_rate for b in items) else _plain)
    ax.set_title(title, fontsize=11, loc="left", color=INK)
    _style(ax)
    return png(fig)


def _percent(value: float, _pos: float) -> str:
    return f"{value:.0%}"


def _plain(value: float, _pos: float) -> str:
    return f"{value:g}"


def _score_groups(df: pd.DataFrame, summary: Summary) -> list[tuple[str, pd.DataFrame]]:
    many = summary.links > 1
    groups = []
    for s in summary.evaluators:
        mine = df[(df["evaluator_name"] == s.evaluator) & (df["link_index"] == s.link_index)
                  & (df["status"] == STATUS_OK) & df["score"].notna()]
        if len(mine):
            groups.append((_name(s, many), mine))
    return groups[:MOST]


def scores_chart(df: pd.DataFrame, summary: Summary) -> bytes | None:
    """A histogram of each evaluator's scores, passes and non-passes stacked apart."""
    groups = _score_groups(df, summary)
    if not groups:
        return None
    cols = min(3, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig = _figure(3.2 * cols, 2.4 * rows, constrained=False)
    _margins(fig, left=0.6, right=0.15, top=0.7, bottom=0.35, wspace=0.3, hspace=0.55)
    for i, (name, g) in enumerate(groups):
        ax = fig.add_subplot(rows, cols, i + 1)
        _histogram(ax, g)
        ax.set_title(_short(name, 32), fontsize=10, loc="left", color=INK)
        _style(ax)
    fig.suptitle("Score distribution per evaluator", fontsize=11, x=0.01, ha="left", color=INK)
    return png(fig)


def _histogram(ax: Axes, g: pd.DataFrame) -> None:
    scores = g["score"].astype(float)
    lo, hi = (0.0, 1.0) if scores.min() >= 0 and scores.max() <= 1 else (scores.min(), scores.max())
    edges = [lo + (hi - lo) * k / 10 for k in range(11)] if hi > lo else 10
    verdict = g["pass"]
    parts = [(scores[verdict == True], PASS, "passed"),  # noqa: E712
             (scores[verdict == False], FAIL, "not passed"),  # noqa: E712
             (scores[verdict.isna()], NEUTRAL, "score only")]
    parts = [p for p in parts if len(p[0])]
    ax.hist([p[0] for p in parts], bins=edges, stacked=True, color=[p[1] for p in parts],
            label=[p[2] for p in parts])
    ax.set_ylabel("rows", fontsize=9)
    if len(parts) > 1:
        ax.legend(fontsize=8, frameon=False)


def _change(e: EvaluatorComparison) -> tuple[float, float, bool] | None:
    if e.pass_rate_a is not None and e.pass_rate_b is not None:
        return e.pass_rate_a, e.pass_rate_b, True
    if e.mean_a is not None and e.mean_b is not None:
        return e.mean_a, e.mean_b, False
    return None


def _change_text(e: EvaluatorComparison, is_rate: bool, rule: Rule) -> str:
    """The counts first, then the change, then the p-value: ``worse · 3 worse / 0 better
    rows · -33.3 points · p=0.25``."""
    parts = [rule.movement(e), f"{len(e.regressed)} worse / {len(e.improved)} better rows"]
    if is_rate and e.pass_diff is not None:
        shown = e.mcnemar_p if e.mcnemar_p is not None else e.pass_p
        parts.append(f"{e.pass_diff * 100:+.1f} points")
    else:
        shown = e.score_p
        parts.append(f"mean {e.mean_diff or 0:+.3g}")
    if shown is not None:
        parts.append(f"p={shown:.2g}")
    return " · ".join(parts)


def comparison_chart(comparison: Comparison, rule: Rule | None = None,
                     title: str = "Against the previous run") -> bytes | None:
    """Each evaluator from the previous run's figure (hollow) to this run's (filled): red
    when it got worse, green when better (`results.verdict.Rule`), grey when the same."""
    rule = rule or Rule()
    items = [(e, c) for e in comparison.evaluators if (c := _change(e)) is not None][:MOST]
    if not items:
        return None
    many = len({e.link_index for e, _ in items}) > 1
    fig = _figure(8, 1.0 + 0.7 * len(items))
    ax = fig.add_subplot()
    for y, (e, (a, b, is_rate)) in zip(range(len(items))[::-1], items, strict=True):
        colour = {"worse": FAIL, "better": PASS}.get(rule.movement(e), NEUTRAL)
        ax.annotate("", xy=(b, y), xytext=(a, y),
                    arrowprops={"arrowstyle": "->", "color": colour, "lw": 2})
        ax.plot([a], [y], "o", mfc="none", mec=colour, mew=2, ms=8)
        ax.plot([b], [y], "o", color=colour, ms=8)
        ax.text(min(a, b), y + 0.18, _change_text(e, is_rate, rule), va="bottom", fontsize=9,
                color=colour if colour != NEUTRAL else INK)
    ax.set_yticks(range(len(items))[::-1], [_label(e, many) for e, _ in items])
    ax.set_ylim(-0.5, len(items) - 0.2)
    ends = [v for _, c in items for v in c[:2]]
    if min(ends) >= 0 and max(ends) <= 1:
        ax.set_xlim(0, 1)
    if all(c[2] for _, c in items):  # pass rates: the axis in percent, as the other charts
        ax.xaxis.set_major_formatter(_percent)
    ax.set_title(f"{title}: before (hollow) → this run (filled); red: worse, green: better",
                 fontsize=11, loc="left", color=INK)
    _style(ax)
    return png(fig)


def _label(e: EvaluatorComparison, many: bool) -> str:
    return f"{e.evaluator} [link {e.link_index}]" if many else e.evaluator


#: Distinct colours for the series' lines (matplotlib's tab10 without its red, kept for
#: "worse"; then tab20's lighter tones).
LINE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94",
                "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")


def history_chart(nights: Sequence[Night]) -> bytes | None:
    """Each evaluator's pass rate (or mean) night by night (`history_figure`), as PNG."""
    fig = history_figure(nights)
    return None if fig is None else png(fig)


def history_figure(nights: Sequence[Night]) -> Figure | None:
    """Each evaluator's pass rate (or mean) night by night, oldest first, one colour and
    one legend entry per line; a night in which an evaluator got worse is marked with a
    red ring and a shaded band."""
    names = [n for n in dict.fromkeys(n for night in nights for n in night.values)
             if any(night.values.get(n) is not None for night in nights)][:MOST]
    if len(nights) < 1 or not names:
        return None
    fig = _figure(9, 3.6)
    ax = fig.add_subplot()
    xs = list(range(len(nights)))
    for i, name in enumerate(names):
        ys = [night.values.get(name) for night in nights]
        colour = LINE_COLOURS[i % len(LINE_COLOURS)]
        ax.plot(xs, [math.nan if y is None else y for y in ys], marker="o", ms=4, label=name,
                color=colour)
        bad = [(x, y) for x, y, night in zip(xs, ys, nights, strict=True)
               if name in night.regressed and y is not None]
        if bad:
            ax.plot([x for x, _ in bad], [y for _, y in bad], "o", ms=12, mfc="none", mec=FAIL,
                    mew=2, color=FAIL)
    for x, night in zip(xs, nights, strict=True):
        if night.regressed:
            ax.axvspan(x - 0.4, x + 0.4, color=FAIL, alpha=0.12, lw=0)
    _history_axes(ax, nights, len(names))
    return fig


def night_labels(labels: Sequence[str]) -> list[str]:
    """Labels that tell runs apart: ``MM-DD HH:MM``, with the seconds when two runs share a
    minute, numbered when they share a second."""
    short = [label[:11] for label in labels]
    if len(set(short)) == len(short):
        return short
    full = list(labels)
    return full if len(set(full)) == len(full) else [f"{label} #{i + 1}" for i, label in enumerate(full)]


def _history_axes(ax: Axes, nights: Sequence[Night], lines: int) -> None:
    ys = (pd.to_numeric(pd.Series(line.get_ydata()), errors="coerce") for line in ax.get_lines())
    values = [float(v) for y in ys for v in y.dropna()]
    if values and min(values) >= 0 and max(values) <= 1:
        ax.set_ylim(-0.02, 1.05)  # rates on their whole scale: a zoomed axis overstates a wobble
        ax.yaxis.set_major_formatter(_percent)
    step = max(1, len(nights) // 12)  # at most ~12 dates under the axis
    ticks = list(range(0, len(nights), step))
    labels = night_labels([night.label for night in nights])
    ax.set_xticks(ticks, [labels[i] for i in ticks], rotation=30, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(nights) - 0.4)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("Pass rate (or mean score) per run, oldest first; red: got worse",
                 fontsize=11, loc="left", color=INK)
    _style(ax)


def draw(name: str, summary: Summary, df: pd.DataFrame,
         comparison: Comparison | None = None, rule: Rule | None = None) -> bytes | None:
    """One of a run's charts by name: ``rates``, ``scores`` or ``comparison``."""
    if name == "rates":
        return rates_chart(bars(summary, df))
    if name == "scores":
        return scores_chart(df, summary)
    if name == "comparison":
        return comparison_chart(comparison, rule) if comparison is not None else None
    raise ValueError(f"no chart {name!r}: rates, scores or comparison")
