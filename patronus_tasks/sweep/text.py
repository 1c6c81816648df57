"""The matrix as people read it: rows of text for the console, and the cells the
Markdown artifact and the HTML report share (each at most 9 columns wide)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from patronus_tasks.results.verdict import ALPHA


def _known(value: Any) -> bool:
    return not (value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)))


def rate(value: Any) -> str:
    return f"{float(value):.1%}" if _known(value) else ""


def number(value: Any) -> str:
    return f"{float(value):.3g}" if _known(value) else ""


def pass_cell(r: Any) -> str:
    """``72.0% [58%, 83%]``, or the mean score for an evaluator with no verdicts."""
    if _known(r.pass_rate):
        return f"{r.pass_rate:.1%} [{r.ci_low:.0%}, {r.ci_high:.0%}]"
    return f"mean {number(r.mean_score)}" if _known(r.mean_score) else ""


def errors_cell(r: Any) -> str:
    return f"{r.errors}" + (f" ({r.unscored} unscored)" if r.unscored else "")


def cost_cell(r: Any) -> str:
    if _known(r.cost_usd):
        return f"${r.cost_usd:.4g}"
    return f"{int(r.tokens_in):,} tok" if r.tokens_in else ""


def latency_cell(r: Any) -> str:
    if not _known(r.latency_p50_s):
        return ""
    return f"{r.latency_p50_s:.2g} / {r.latency_p95_s:.2g}"


def moved_cell(r: Any) -> str:
    return "" if not _known(r.worse) else f"{int(r.worse)} / {int(r.better)}"


def p_cell(r: Any) -> str:
    if not _known(r.p_value):
        return ""
    mark = " *" if r.p_adjusted < ALPHA else ""
    return f"{r.p_value:.2g} ({r.p_adjusted:.2g}){mark}"


def cells(r: Any, with_evaluator: bool) -> dict[str, str]:
    """One matrix row as table cells (9 with the evaluator, 8 without)."""
    head = {"variant": str(r.variant)}
    if with_evaluator:
        head["evaluator"] = str(r.evaluator) + (f" [link {r.link}]" if r.link else "")
    return {**head, "pass rate [95%]": pass_cell(r), "errors": errors_cell(r),
            "cost": cost_cell(r), "p50 / p95 s": latency_cell(r),
            "worse / better": moved_cell(r), "p (Holm)": p_cell(r), "verdict": str(r.verdict)}


def by_evaluator(matrix: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The matrix split by (link, evaluator), in its order."""
    keys = list(dict.fromkeys(zip(matrix["link"], matrix["evaluator"], strict=True)))
    return [(str(name) + (f" [link {link}]" if link else ""),
             matrix[(matrix["link"] == link) & (matrix["evaluator"] == name)])
            for link, name in keys]


def matrix_text(matrix: pd.DataFrame) -> list[str]:
    """The matrix as aligned text, one table per evaluator."""
    lines: list[str] = []
    for name, part in by_evaluator(matrix):
        rows = [cells(r, False) for r in part.itertuples()]
        head = list(rows[0])
        widths = [max(len(h), *(len(row[h]) for row in rows)) for h in head]
        lines += [f"{name}:", "  " + "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
        lines += ["  " + "  ".join(row[h].ljust(w) for h, w in zip(head, widths, strict=True))
                  for row in rows]
        lines.append("")
    return [*lines, f"p: {_tests(matrix)}; in brackets adjusted for {_compared(matrix)} "
                    f"comparisons (Holm), * below {ALPHA}. Worse: the pass rate fell by 5 points "
                    "or more, or more rows got worse than better."]


def _tests(matrix: pd.DataFrame) -> str:
    used = [t for t in dict.fromkeys(matrix["test"]) if t]
    return ", ".join(used) or "none (nothing compared)"


def _compared(matrix: pd.DataFrame) -> int:
    return int(matrix["p_value"].notna().sum())
